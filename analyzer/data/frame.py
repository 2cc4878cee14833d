"""The tidy frame every score and detector reads: time x device x canonical signals.

One row per (device, timestamp) where a device is a whole GPU or a MIG instance. Columns:

- ``timestamp``: float64 unix seconds, on a regular grid of ``step`` seconds (the row is
  the interval ``[timestamp, timestamp + step)``);
- identity (categoricals): hostname, gpu (index as str), uuid, gpu_instance and
  mig_profile ("" for whole GPUs), model; placement: site, rack ("" when unknown);
- ``gpu_share``: float64, the fraction of a physical GPU the device is (1 for a whole GPU,
  3/7 for a 3g MIG slice): GPU-hours and costs are weighted by it. Device-level signals
  (power, temperature, clocks, errors) on MIG instance rows repeat the parent GPU's values:
  sum them per physical GPU (uuid), never per row;
- allocation (categoricals, NaN while unallocated): namespace, pod, container, job;
- one float64 column per signal in analyzer.data.signals.NAMES that the input provides, NaN
  where unknown. A signal the input never provides is absent from the frame and named in
  ``Fleet.missing`` with the reason, so "unknown" is never confused with 0.

Rows are sorted by (hostname, gpu, gpu_instance, timestamp).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from analyzer.data.signals import ALLOCATION_COLUMNS, DEVICE_COLUMNS, NAMES, PLACEMENT_COLUMNS

#: XID events: one row per (device, timestamp, xid) with the number of events in that step.
EVENT_COLUMNS: tuple[str, ...] = ("timestamp", "hostname", "gpu", "uuid", "xid", "count")
#: Pairwise GPU links within a node (from truegpu_gpu_topology_info).
TOPOLOGY_COLUMNS: tuple[str, ...] = ("hostname", "gpu", "peer_gpu", "link")
#: Holders of shared GPUs (truegpu_gpu_sharer_utilization_ratio, _memory_used_bytes): one row per (step, whole
#: GPU, holder) with the holder's mean utilization and memory (NaN: unknown) over the step; the holder with empty
#: labels is processes none was found for. analyzer.analysis.shares turns them into each holder's share of the
#: GPU's hours.
SHARE_COLUMNS: tuple[str, ...] = ("timestamp", "hostname", "gpu", "namespace", "pod", "container", "job",
                                  "utilization", "memory")
#: Slurm accounting per workload (from truegpu_slurm_job_info): the job id, its user, account and partition.
ACCOUNTING_COLUMNS: tuple[str, ...] = ("job", "user", "account", "partition")


def merged_accounting(*tables: pd.DataFrame, jobs: Iterable[str] | None = None) -> pd.DataFrame:
    """Accounting tables (ACCOUNTING_COLUMNS) as one: a row per job, a later table's row winning, sorted by job;
    ``jobs``: only those."""
    both = pd.concat([t for t in tables if len(t)] or [tables[0].iloc[:0]], ignore_index=True)
    if jobs is not None:
        both = both[both["job"].isin(set(jobs))]
    return both.drop_duplicates("job", keep="last").sort_values("job", ignore_index=True)


@dataclass
class Fleet:
    """Normalized telemetry of a fleet over a window, whatever the input dialect was."""

    frame: pd.DataFrame
    step: float
    start: float
    end: float
    #: XID events (EVENT_COLUMNS).
    events: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(EVENT_COLUMNS)))
    #: GPU-to-GPU links (TOPOLOGY_COLUMNS); empty when the input has no topology info.
    topology: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(TOPOLOGY_COLUMNS)))
    #: Slurm accounting of the workloads (ACCOUNTING_COLUMNS, one row per job); empty where not collected.
    accounting: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(ACCOUNTING_COLUMNS)))
    #: Holders of shared GPUs per step (SHARE_COLUMNS); empty where no GPU is shared or not collected.
    shares: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(columns=list(SHARE_COLUMNS)))
    #: "truegpu" or "dcgm" (or "mixed").
    dialect: str = "truegpu"
    #: signal name -> why it is unknown (e.g. "DCGM_FI_PROF_SM_ACTIVE not collected: enable it in
    #: dcgm-exporter's counters CSV"); reported once, never treated as 0.
    missing: dict[str, str] = field(default_factory=dict)
    #: Anything else the user should know about the input (bad lines, sentinels, gaps).
    notes: list[str] = field(default_factory=list)
    #: Results derived from this fleet that several detectors need (``memo``); never copied by
    #: ``dataclasses.replace``, so a fleet with another frame starts empty.
    _memo: dict[tuple, Any] = field(default_factory=dict, init=False, repr=False, compare=False)

    def memo(self, key: tuple, make: Callable[[], Any]) -> Any:
        """``make()`` once per fleet and ``key``: who communicates, say, is asked by idle_masking and
        topology alike, and costs ~0.8 s at 10,000 GPUs."""
        if key not in self._memo:
            self._memo[key] = make()
        return self._memo[key]

    @property
    def signals(self) -> tuple[str, ...]:
        """Signals present in the frame."""
        return tuple(n for n in NAMES if n in self.frame.columns)

    def has(self, signal: str) -> bool:
        return signal in self.frame.columns and bool(self.frame[signal].notna().any())

    def between(self, start: float, end: float) -> Fleet:
        """The rows and events in ``[start, end)`` (the frame's order kept), as a loader returns that window;
        ``start`` may lie before the data, like a window over a young cluster."""
        ts = self.frame["timestamp"].to_numpy()
        frame = self.frame[(ts >= start) & (ts < end)].reset_index(drop=True)
        return replace(self, frame=frame, events=timed_between(self.events, start, end),
                       shares=timed_between(self.shares, start, end), start=float(start), end=float(end),
                       notes=list(self.notes), missing=dict(self.missing))

    def reference_rows(self) -> np.ndarray:
        """Per frame row: does its host feed the fleet-wide references (analyzer.data.reference)? Memoized."""
        return self.memo(("reference",), self._reference)[1]

    def reference_hosts(self) -> frozenset[str]:
        """The hosts feeding the fleet-wide references (analyzer.data.reference). Memoized."""
        return self.memo(("reference",), self._reference)[0]

    def placements(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Distinct (host, model, rack) of the frame's rows ("" where unknown). Memoized."""
        return self.memo(("placements",), self._placements)[:3]

    def _placements(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """(hosts, models, racks) as ``placements``, and the rows as runs: each run's index into them and its
        length. Rows come device by device, so the work is per run of rows, not per row."""
        f = self.frame
        cols = [c for c in ("hostname", "model", "rack") if c in f.columns]
        if not len(f) or not cols:
            blank = np.zeros(0, dtype=object)
            return blank, blank, blank, np.zeros(0, np.int64), np.zeros(0, np.int64)
        codes = [f[c].cat.codes.to_numpy() if isinstance(f[c].dtype, pd.CategoricalDtype) else category_codes(f[c])
                 for c in cols]
        change = np.zeros(len(f), bool)
        change[0] = True
        for c in codes:
            change[1:] |= c[1:] != c[:-1]
        starts = np.flatnonzero(change)
        key = np.zeros(len(starts), np.int64)
        for c in codes:  # one int64 key per run (codes from -1)
            at = c[starts].astype(np.int64) + 1
            key = key * (int(c.max()) + 2) + at
        _, first, inverse = np.unique(key, return_index=True, return_inverse=True)
        rows = starts[first]

        def text(c: str) -> np.ndarray:
            if c not in f.columns:
                return np.full(len(rows), "", dtype=object)
            v = f[c].iloc[rows].astype(object)
            return v.where(v.notna(), "").astype(str).to_numpy(dtype=object)

        return text("hostname"), text("model"), text("rack"), inverse.reshape(-1), np.diff(np.r_[starts, len(f)])

    def _reference(self) -> tuple[frozenset[str], np.ndarray]:
        from analyzer.data.reference import reference_hosts

        hosts, models, racks, run_of, run_len = self.memo(("placements",), self._placements)
        chosen = reference_hosts(hosts, models, racks)
        return chosen, np.repeat(np.isin(hosts, list(chosen))[run_of], run_len)

    def gpu_count(self) -> int:
        """Physical GPUs: distinct (host, gpu index), not UUIDs (a page may lack or repeat them)."""
        fr = self.frame
        return int(fr.groupby(["hostname", "gpu"], observed=True).ngroups) if len(fr) else 0


def timed_between(table: pd.DataFrame, start: float, end: float) -> pd.DataFrame:
    """The rows of a side table with a ``timestamp`` column (events, shares) in ``[start, end)``."""
    if not len(table):
        return table
    ts = table["timestamp"].to_numpy(dtype=np.float64)
    return table[(ts >= start) & (ts < end)].reset_index(drop=True)


#: A100/H100-class GPUs split into 7 compute slices; a MIG profile "Ng.XXgb" holds N of them.
MIG_COMPUTE_SLICES = 7
_MIG_SLICES = re.compile(r"^(\d+)g\.")


def optional_labels(values: Iterable[object], index: pd.Index, *, empty_is_missing: bool = False) -> pd.Series:
    """Label strings with None where missing (NaN or None; "" too with ``empty_is_missing``), of object dtype:
    pandas 3 would infer its string dtype, whose missing value is NaN (a finding on "job nan")."""
    return pd.Series([None if pd.isna(v) or (empty_is_missing and v == "") else str(v) for v in values],
                     index=index, dtype=object)


def category_codes(s: pd.Series) -> np.ndarray:
    """Integer codes of an identity column, -1 where it is missing: the categorical's own codes
    (the frame's identity columns are categoricals), else factorized."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        return s.cat.codes.to_numpy(dtype=np.int64)
    return pd.factorize(s, use_na_sentinel=True)[0].astype(np.int64)


def _label_key(values: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class, number, text) sort keys of label values: "" first, then numbers by value, then other text."""
    text = np.asarray(values, dtype=object).astype(str)
    number = pd.to_numeric(pd.Series(text), errors="coerce").to_numpy(dtype=np.float64)
    numeric = ~np.isnan(number)
    return np.where(numeric, 0, np.where(text == "", -1, 1)), np.where(numeric, number, 0.0), text


def device_order(hostname: np.ndarray, gpu: np.ndarray, gpu_instance: np.ndarray) -> np.ndarray:
    """Indices sorting devices the way frame rows are: by host, then gpu and gpu_instance numerically
    (GPU 10 after GPU 9), text after numbers, "" (a whole GPU) first."""
    keys = [k for col in (gpu_instance, gpu) for k in reversed(_label_key(col))]
    return np.lexsort((*keys, np.asarray(hostname, dtype=object).astype(str)))


#: ``gpu_instance`` of the device holding a MIG GPU's capacity no instance holds (analyzer.data.mig).
UNCARVED = "uncarved"


def instance_rows(frame: pd.DataFrame, value: str | None = None) -> np.ndarray:
    """MIG instance rows (``value`` None: a ``gpu_instance`` other than "" and UNCARVED), or the rows whose
    ``gpu_instance`` is ``value``; evaluated per category."""
    if "gpu_instance" not in frame.columns:
        return np.zeros(len(frame), bool)
    col = frame["gpu_instance"]
    if not isinstance(col.dtype, pd.CategoricalDtype):
        text = col.astype(str).to_numpy()
        return (text != "") & (text != UNCARVED) if value is None else text == value
    cats = col.cat.categories.astype(str)
    hit = (cats != "") & (cats != UNCARVED) if value is None else cats == value
    codes = col.cat.codes.to_numpy()
    return np.append(np.asarray(hit), False)[np.where(codes >= 0, codes, len(cats))]


def gpu_share(mig_profile: str) -> float:
    """Fraction of a physical GPU a device is: 1 for a whole GPU, N/7 for an Ng MIG profile."""
    m = _MIG_SLICES.match(mig_profile or "")
    return min(int(m.group(1)) / MIG_COMPUTE_SLICES, 1.0) if m else 1.0


def empty_frame() -> pd.DataFrame:
    """A frame with the fixed columns and no rows (what an input with no GPU data gives)."""
    cols = {"timestamp": pd.Series(dtype="float64")}
    for c in DEVICE_COLUMNS + PLACEMENT_COLUMNS + ALLOCATION_COLUMNS:
        cols[c] = pd.Series(dtype="category")
    cols["gpu_share"] = pd.Series(dtype="float64")
    return pd.DataFrame(cols)
