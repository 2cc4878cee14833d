"""Ingested samples (either dialect) -> the tidy Fleet every score and detector reads.

Input: the Samples of analyzer.data.ingest (a series table and per-metric sample blocks; a long
frame of ``metric``, ``timestamp``, ``value`` + one column per label is turned into Samples
first), from truegpu's exporter, from NVIDIA dcgm-exporter (current or 1.x spelling) or both,
plus kube-state-metrics' ``kube_pod_info`` where present (it maps dcgm-exporter pod names in the
host label to their nodes: analyzer.data.hosts) and ``kube_node_labels`` (a node's zone is its site
where truegpu's node info names none). Output: analyzer.data.frame.Fleet on a regular
grid of ``step`` seconds, the same frame analyzer.data.simulated.fleet_from_cluster builds
straight from the simulator.

Labels are resolved once per series; samples are read one metric at a time, in chunks of about
``_CHUNK`` samples cut between timelines, so the peak is the kept samples plus one chunk's
temporaries and the dense (device x step) results.

Resampling semantics (row ``t`` is the interval ``[t, t + step)``):

- gauges: mean of the samples with timestamp in ``[t, t + step)`` (with one sample per
  step: that sample); flags: max over the samples and the accepted label values;
- counters: per-second rate from consecutive samples of one series, each increase
  ``v[i] - v[i-1]`` (a drop is a reset: the increase is ``v[i]``) over ``ts[i] - ts[i-1]``
  belongs to the row of ``ts[i-1]``: rate = sum of increases / sum of durations; pairs
  further apart than ``max(1.5 x sample spacing, step)`` are a gap and give no rate;
- dcgm-exporter rates (PROF_*_BYTES, NVLINK_BANDWIDTH_TOTAL) describe the period ending
  at the sample, so a sample at ``ts`` belongs to row ``t`` when ``t < ts <= t + step``
  (a sample exactly at the grid start goes to row 0), averaged there;
- several series of one device for one signal are summed (rates: NVLink tx+rx), max'ed
  (flags) or averaged (gauges); ``direction="total"`` is used only where tx/rx are unknown;
- a device scraped less often than every step (fleets mix scrape intervals: a scrape job per
  node pool) has its own sample spacing (its memory-used series'): each sample stands for that
  spacing, as Prometheus' lookback has it, so its value holds over the rows up to the next
  sample (``HOLD_MAX_S`` at most) and those rows are observed, not unknown; gaps beyond the
  device's own spacing stay unknown, and its counters' rates use its own spacing for gaps.

Every device seen anywhere in the input gets a row at every grid step (like the simulator
path); a row without data is NaN, never 0. Device-level series (no gpu_instance) fill the
rows of that GPU's MIG instances where the instance has no value of its own.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import numpy as np
import pandas as pd

from analyzer.data import dialects as D
from analyzer.data.budget import BudgetError, check_rows, check_window
from analyzer.data.coverage import DATA_SHARE, HELD, hold_allocations
from analyzer.data.frame import (
    ACCOUNTING_COLUMNS,
    EVENT_COLUMNS,
    SHARE_COLUMNS,
    TOPOLOGY_COLUMNS,
    Fleet,
    gpu_share,
    merged_accounting,
)
from analyzer.data.hosts import map_exporter_pods, node_zones, pod_info
from analyzer.data.ingest import IngestReport, Samples, one_per_interval
from analyzer.data.ingest.samples import Block
from analyzer.data.mig import with_uncarved
from analyzer.data.signals import ALLOCATION_COLUMNS, SIGNALS, Signal
from exporter import schema as S
from exporter.attribution.jobs import KNOWN_JOB_LABELS, derive_job, sanitized_job_labels

_T = TypeVar("_T")
_EPS = 1e-9
#: A counter that goes down by less than this share of its value was rounded, not reset. VictoriaMetrics
#: stores values as decimals of ~15 significant digits with a scale chosen per block, so a flat counter
#: (a killed GPU's NVLink bytes, ~5e14) can read back a last digit lower across two blocks: once, in the
#: VictoriaMetrics test under the full suite's load, that read as a restart from 0 (a 7.7 TB/s spike the
#: Prometheus copy of the same history did not have). A real restart starts again from 0: a drop of ~100%.
COUNTER_ROUNDING = 1e-9
_NEEDED = D.needed_names()
#: Step used when the input has one sample time only (a scraped snapshot).
SNAPSHOT_STEP = 60.0
#: A device's samples stand for at most this long (Prometheus' default lookback): a value is never held
#: over more of a gap than a Prometheus query would show it.
HOLD_MAX_S = 300.0
#: Sample spacing within this share of a step counts as once a step (scrape jitter is a few ms).
HOLD_TOLERANCE = 0.01
#: Gaps a device needs for a spacing of its own (fewer, in a short read, may be one scrape gap): else the input's.
MIN_OWN_GAPS = 4
#: Samples read at a time (a chunk ends where a timeline does, so it may hold more).
_CHUNK = 1 << 18
#: A GPU's series under two scrape targets (the exporter in two scrape jobs: a ServiceMonitor and a static config,
#: a pod IP and a node name) are the same telemetry twice.
TARGET_LABELS = S.TARGET_LABELS


def normalize(
    long: pd.DataFrame | Samples,
    *,
    step: float | None = None,
    start: float | None = None,
    end: float | None = None,
    job_label: str | None = None,
    report: IngestReport | None = None,
) -> Fleet:
    """Map ingested samples (Samples, or a long ingest frame) of either dialect onto canonical
    signals on a regular grid.

    ``step`` defaults to the median sample spacing, ``start`` to the first sample and
    ``end`` to the end of the step holding the last sample. ``job_label`` names a label holding the job
    (e.g. ``hpc_job``, ``job_id``); otherwise the truegpu allocation's ``job``, dcgm's
    ``hpc_job`` or ``derive_job(pod)``. ``report`` (the IngestReport of the read) is
    carried into ``Fleet.notes``. Raises ValueError on input without GPU telemetry.
    """
    samples = _samples(long)
    notes = _report_notes(report)
    data = _Input(samples, job_label, pod_info(samples.frame([S.KUBE_POD_INFO])),
                  node_zones(samples.frame([S.KUBE_NODE_LABELS])))
    absent = _absent(report.missing, data.dialect) if report is not None else []
    if absent:
        # A file was read, not asked: "queried" is the Prometheus read's word.
        where = "read but absent from the files" if report.files else "queried but absent from the source"
        notes.append(f"{where}: {', '.join(absent)}")
    grid = data.grid(step, start, end, notes)
    devices = data.devices()
    check_rows(len(devices), grid.T, grid.step)
    state = _State(data, grid, devices, report)
    frame = with_uncarved(hold_allocations(state.frame()))
    events = state.events()
    shares = state.shares()
    missing = state.missing(frame)
    notes.extend(data.notes + state.notes)
    return Fleet(
        frame=frame, step=grid.step, start=grid.start, end=grid.start + grid.T * grid.step,
        events=events, topology=data.topology(), accounting=data.accounting(), shares=shares, dialect=data.dialect,
        missing=missing, notes=notes,
    )  # fmt: skip


# Input checks and notes -------------------------------------------------------------------
def _samples(data: pd.DataFrame | Samples) -> Samples:
    """The input as Samples: a long frame is converted once, so there is one path from here on."""
    if isinstance(data, Samples):
        return data
    if not isinstance(data, pd.DataFrame):
        raise TypeError(f"normalize expects Samples or the long ingest DataFrame, got {type(data).__name__}")
    lacking = [c for c in ("metric", "timestamp", "value") if c not in data.columns]
    if lacking:
        raise ValueError(
            f"normalize: input frame lacks column(s) {', '.join(lacking)}; expected the long frame of "
            f"analyzer.data.ingest (metric, timestamp, value, one column per label), got columns {list(data.columns)}"
        )
    return Samples.from_frame(data)


def _report_notes(report: IngestReport | None) -> list[str]:
    """IngestReport findings as sentences a person can act on."""
    if report is None:
        return []
    notes = []
    if report.bad_line_count:
        ex = report.bad_lines[0] if report.bad_lines else None
        first = f"; first: {ex.source}:{ex.line_number}: {ex.reason}: {ex.text!r}" if ex else ""
        notes.append(f"{report.bad_line_count} unreadable input lines skipped{first}")
    if report.sentinels:
        parts = ", ".join(f"{name} ({n})" for name, n in sorted(report.sentinels.items()))
        notes.append(
            f"{report.sentinel_count} DCGM blank/not-supported values treated as unknown (not 0): {parts}"
        )
    if report.out_of_range:
        parts = ", ".join(f"{name} ({n})" for name, n in sorted(report.out_of_range.items()))
        notes.append(
            f"{sum(report.out_of_range.values())} values outside the metric contract's valid range (or infinite) "
            f"dropped as unknown: {parts}"
        )
    if report.nans:
        parts = ", ".join(f"{name} ({n})" for name, n in sorted(report.nans.items()))
        notes.append(f"{sum(report.nans.values())} samples whose value was NaN taken as unknown: {parts}")
    if report.conflicts:
        parts = ", ".join(f"{name} ({n})" for name, n in sorted(report.conflicts.items()))
        notes.append(
            f"{sum(report.conflicts.values())} conflicting duplicate samples (one series, one time, different "
            f"values; averaged): {parts}; first: {report.conflict_example}"
        )
    if report.duplicates:
        notes.append(f"{sum(report.duplicates.values())} repeated samples (one series, one time, one value: a target "
                     f"scraped twice or an HA pair) kept once")
    if report.replicas:
        parts = ", ".join(f"{k}={'/'.join(sorted(v))}" for k, v in sorted(report.replicas.items()))
        notes.append(f"HA Prometheus replicas merged into one copy ({parts}): every GPU counted once"
                     + (f"; {report.replica_samples} samples the replicas took at their own times in the same "
                        "scrape interval dropped" if report.replica_samples else ""))
    notes.extend(f"ingest warning: {w}" for w in report.warnings)
    return notes


def _absent(missing: list[str], dialect: str) -> list[str]:
    """The input's fields that are absent, each named once: a dcgm field counts as absent only when
    none of its spellings (current, lower-case, 1.x) is there, and the other dialect's names are left
    out (a dcgm-exporter page lacks every truegpu_* name by design)."""
    gone = set(missing)
    out = set()
    for name in missing:
        of = D.dialect_of(name)
        if dialect in ("truegpu", "dcgm") and of not in (None, dialect):
            continue
        field_name = S.DCGM_1X_NAMES.get(name, name).upper() if of == "dcgm" else name
        if of != "dcgm" or gone.issuperset(S.dcgm_spellings(field_name)):
            out.add(field_name)
    return sorted(out)


# Series-level view of the input ------------------------------------------------------------
class _Grid:
    def __init__(self, start: float, step: float, T: int, spacing: float) -> None:
        self.start, self.step, self.T, self.spacing = start, step, T, spacing
        self.times = start + step * np.arange(T, dtype=np.float64)
        #: Samples come about once a step or less often: each timeline's rows count whole steps from its
        #: first sample (``rows``), so scrape jitter never moves a sample into its neighbour's row.
        self.anchored = spacing >= step * (1.0 - HOLD_TOLERANCE)

    def row(self, ts: np.ndarray) -> np.ndarray:
        """The row whose interval ``[t, t + step)`` holds each time."""
        return np.floor((ts - self.start) / self.step + _EPS).astype(np.int64)

    def row_ending(self, ts: np.ndarray) -> np.ndarray:
        """The row whose interval ``(t, t + step]`` holds each time (a time exactly at the start: row 0)."""
        be = np.ceil((ts - self.start) / self.step - _EPS).astype(np.int64) - 1
        return np.where((be < 0) & (np.abs(ts - self.start) < _EPS * max(self.step, 1.0)), 0, be)

    def rows(self, ts: np.ndarray, tl: np.ndarray, ending: bool = False) -> np.ndarray:
        """``row`` (or ``row_ending``) of each time; where the grid is ``anchored``, each timeline's first sample's
        row plus the whole steps since it, rounded (samples sorted by timeline and time; a timeline is never split
        between picks).

        Why: a scrape target's samples sit at its own phase in the step, each a few ms early or late (more for
        agents that do not align timestamps); a target whose phase is at a row boundary (the first sample of
        the input's earliest target sets the grid's start) would put half its samples in the row before, each
        leaving a row without a sample: unknown GPU-hours (~4 % of a 48-GPU history with +-3 ms of jitter) and
        a gap the detectors bridge. Counting steps is right up to half a step of jitter. A sample the rounding
        puts past the grid's last row while it lies in it stays in that row."""
        if not self.anchored or not len(ts):
            return self.row_ending(ts) if ending else self.row(ts)
        u = (ts - self.start) / self.step
        heads = np.flatnonzero(np.concatenate(([True], tl[1:] != tl[:-1])))
        u0 = u[heads]
        base = self.row_ending(ts[heads]) if ending else np.floor(u0 + _EPS)
        # base + round(u - u0), base an integer
        out = np.floor(u + np.repeat(base - u0, np.diff(np.append(heads, len(ts)))) + 0.5).astype(np.int64)
        over = np.flatnonzero(out >= self.T)
        if len(over):
            inside = (self.row_ending(ts[over]) if ending else self.row(ts[over])) < self.T
            out[over[inside]] = self.T - 1
        return out


@dataclass
class _Picked:
    """Samples of some series sorted by (timeline, time): series id, time, value (float64) and timeline
    per sample, and (once known) their source device and rows on the grid."""

    sid: np.ndarray
    ts: np.ndarray
    val: np.ndarray
    tl: np.ndarray
    #: Per series, its source device (_Input.series_own); None before devices are known.
    own: np.ndarray | None
    grid: _Grid | None

    @cached_property
    def src(self) -> np.ndarray:
        return self.own[self.sid]

    @cached_property
    def bf(self) -> np.ndarray:
        return self.grid.rows(self.ts, self.tl)

    @cached_property
    def be(self) -> np.ndarray:
        return self.grid.rows(self.ts, self.tl, ending=True)


class _Input:
    """A series table with canonical labels and timelines (metric, device, contract labels), and the
    needed metrics' sample blocks, read through ``picks``."""

    def __init__(self, samples: Samples, job_label: str | None, pods: pd.DataFrame, zones: dict[str, str]) -> None:
        """``pods``: kube_pod_info rows (analyzer.data.hosts.pod_info) naming dcgm-exporter pods' nodes;
        ``zones``: node -> zone (kube_node_labels), a node's site where node info names none."""
        self.job_label = job_label
        self.zones = zones
        blocks = [b for b in samples.blocks if b.metric in _NEEDED]
        if not blocks:
            found = ", ".join(sorted(b.metric for b in samples.blocks)[:10]) or "nothing"
            raise ValueError(
                "no GPU telemetry in the input: expected truegpu exporter metrics (truegpu_*, e.g. "
                f"{S.GPU_UTILIZATION.name}) or dcgm-exporter metrics (DCGM_FI_* / dcgm_fi_*, e.g. "
                f"{S.GPU_UTILIZATION.dcgm[0].field}); found: {found}"
            )
        if not all(np.isfinite(b.times).all() for b in blocks):
            raise ValueError("normalize: input has non-finite timestamps; expected unix seconds")
        #: (block, id of its first series here): series are renumbered over the kept blocks.
        self.blocks: list[tuple[Block, int]] = []
        for b in blocks:
            self.blocks.append((b, self.blocks[-1][1] + self.blocks[-1][0].n_series if self.blocks else 0))
        self.g: _Grid | None = None
        self.series_own: np.ndarray | None = None  # set by devices()
        # What depends on the series alone is kept with their table where the reader hands it out again
        # (serve's ticks: ~630 k series at 10,000 GPUs, a second of each tick worked out anew).
        key = (tuple((b.metric, b.first, b.n_series) for b in blocks), job_label,
               tuple(pods.itertuples(index=False, name=None)))
        kept = samples.memo.get(_Input) if samples.memo is not None else None
        if kept is not None and kept[0] == key:
            self.__dict__.update(kept[1])
            self.notes = list(self.notes)
        else:
            before = set(vars(self))
            self._per_series(samples, blocks, pods)
            if samples.memo is not None:
                samples.memo[_Input] = (key, {k: v for k, v in vars(self).items() if k not in before})
        self.ts_min = min(float(b.times.min()) for b in blocks)
        #: Samples of a second scrape target ``picks`` dropped (``_one_target``; grid counts its one pass).
        self.other_target_samples = 0

    def _per_series(self, samples: Samples, blocks: list[Block], pods: pd.DataFrame) -> None:
        """The series' tables: their labels, canonical labels, devices' keys, timelines, metric and dialect."""
        rows = np.concatenate([np.arange(b.first, b.first + b.n_series) for b in blocks])
        series = samples.series.iloc[rows] if len(rows) < len(samples.series) else samples.series
        table = {"metric": series["metric"].to_numpy(dtype=object)}
        for name in samples.label_names:
            v = series[name].to_numpy(dtype=object)
            table[name] = np.where(pd.isna(v), "", v).astype(object)
        self.table = table
        self.n_series = len(rows)
        self.metric = table["metric"]
        #: Per series, its metric as a code into ``metric_names`` (``of_metric`` compares codes, not strings).
        self.metric_code, names = pd.factorize(self.metric)
        self.metric_names = pd.Index(names)
        self._canonical(pods)
        # timeline: series of one device and one contract label combination, whatever its
        # attribution labels (dcgm-exporter splits a GPU's series by pod; err_code changes)
        parts = [table["metric"], self.own_key] + [table.get(lab, _blank(self.n_series)) for lab in D.SIGNAL_LABELS]
        self.tl_series = pd.factorize(pd.Series(["\x00".join(p) for p in zip(*parts, strict=True)]))[0]
        self.n_tl = int(self.tl_series.max()) + 1 if len(self.tl_series) else 0
        # a representative series per timeline (same metric, device and contract labels)
        self.tl_rep = np.zeros(self.n_tl, dtype=np.int64)
        self.tl_rep[self.tl_series[::-1]] = np.arange(self.n_series)[::-1]
        self._targets()
        #: What later steps work out from the series alone (``once``): kept with this table.
        self.series_memo: dict[object, object] = {}
        self.dialect_of_series = np.array([D.dialect_of(m) or "" for m in names], dtype=object)[self.metric_code]
        used = {d for d in self.dialect_of_series if d}
        self.dialect = "mixed" if len(used) > 1 else (used.pop() if used else "truegpu")

    def once(self, key: object, make: Callable[[], _T]) -> _T:
        """``make()`` worked out once per series table: serve's ticks hand the same table out again, and
        comparing ~630 k series' label strings for each signal cost a second of each tick at 10,000 GPUs."""
        if key not in self.series_memo:
            self.series_memo[key] = make()
        return self.series_memo[key]

    def of_metric(self, *names: str) -> np.ndarray:
        """Per series, whether its metric is one of ``names``."""
        at = self.metric_names.get_indexer(list(names))
        return np.isin(self.metric_code, at[at >= 0])

    def series_mask(self, key: object, make: Callable[[], np.ndarray]) -> np.ndarray:
        """A fresh copy of the boolean series mask ``make()``, kept (``once``) as the positions it holds: a
        signal holds a few % of the series, and ~50 masks of 630 k series would keep 30 MB."""
        at = self.once(key, lambda: np.flatnonzero(make()).astype(np.int32))
        mask = np.zeros(self.n_series, dtype=bool)
        mask[at] = True
        return mask

    def _targets(self) -> None:
        """``series_target``: each series' scrape target (TARGET_LABELS, a code); ``tl_copies``: how many targets a
        telemetry timeline's series came from, or None where every one has one. Info series are left alone: in
        data from before the workload label's rename ``job`` names the workload, two of them on a shared GPU."""
        names = [k for k in TARGET_LABELS if k in self.table and k != self.job_label]
        self.series_target = code = np.zeros(self.n_series, dtype=np.int64)
        self.tl_copies = None
        if not names or self.n_tl == self.n_series:  # every timeline one series (the common case): no copies
            return
        for k in names:
            c, uniq = pd.factorize(self.table[k])
            code = code * (len(uniq) + 1) + c
        self.series_target = code
        telemetry = ~self.of_metric(*_INFO_NAMES)
        width = int(code.max()) + 1
        pairs = np.unique(self.tl_series[telemetry].astype(np.int64) * width + code[telemetry])
        copies = np.bincount(pairs // width, minlength=self.n_tl)
        if (copies >= 2).any():
            self.tl_copies = copies

    def _one_target(self, sid: np.ndarray, tls: np.ndarray, ts: np.ndarray) -> np.ndarray | None:
        """Keep mask of a chunk's samples (sorted by timeline, time) with one copy of a GPU scraped by two targets,
        or None (nothing to drop). Copies at one instant (a Prometheus answer's steps): the lowest target's. Each
        target at its own phase (a file of raw scrapes): one sample per scrape interval (``one_per_interval``, the
        interval a target's own spacing), or the step read as the phases' distance, rates from a counter's
        stale copy alternated 0 and twice the rate, and a growing ECC storm was lost."""
        multi = self.tl_copies[tls] >= 2
        if not multi.any():
            return None
        ms = np.rint(ts * 1000.0)
        head = np.concatenate(([True], (tls[1:] != tls[:-1]) | (ms[1:] != ms[:-1])))
        group = np.cumsum(head) - 1
        target = self.series_target[sid]
        keep = ~multi | (target == np.minimum.reduceat(target, np.flatnonzero(head))[group])
        at = np.flatnonzero(keep & multi)
        s, t, g = tls[at], ts[at], target[at]
        by_target = np.lexsort((t, g, s))
        same = (s[by_target][1:] == s[by_target][:-1]) & (g[by_target][1:] == g[by_target][:-1])
        spacing = pd.Series(np.diff(t[by_target])[same]).groupby(s[by_target][1:][same]).median()
        keep[at] = one_per_interval(s, t, spacing.reindex(s).to_numpy())
        return None if keep.all() else keep

    def picks(self, series_mask: np.ndarray, *, known: bool = True) -> Iterator[_Picked]:
        """The samples of the series in ``series_mask`` sorted by (timeline, time), a metric at a time in
        chunks of about _CHUNK samples cut between timelines; ``known``: only the samples of device series
        that hold a value. A timeline's series are merged by time (ties in series order)."""
        if known:
            series_mask = series_mask & (self.series_own >= 0)
        for b, off in self.blocks:
            local = np.flatnonzero(series_mask[off:off + b.n_series])
            if not len(local):
                continue
            tl = self.tl_series[off + local]
            merged = bool((np.diff(tl) <= 0).any())  # a timeline of several series
            if merged:
                order = np.lexsort((local, tl))
                local, tl = local[order], tl[order]
            lo, hi = b.bounds[local], b.bounds[local + 1]
            size = hi - lo
            before = np.cumsum(size) - size
            heads = np.flatnonzero(np.concatenate(([True], tl[1:] != tl[:-1])))
            targets = np.arange(_CHUNK, int(before[-1] + size[-1]), _CHUNK)
            cuts = np.unique(np.concatenate(([0], heads[np.searchsorted(before[heads], targets, "right") - 1],
                                             [len(local)])))
            for j0, j1 in zip(cuts[:-1].tolist(), cuts[1:].tolist(), strict=True):
                if (lo[j0 + 1:j1] == hi[j0:j1 - 1]).all():
                    at: slice | np.ndarray = slice(int(lo[j0]), int(hi[j1 - 1]))
                else:
                    n = size[j0:j1]
                    at = np.repeat(lo[j0:j1] - (np.cumsum(n) - n), n) + np.arange(int(n.sum()))
                sid = np.repeat(off + local[j0:j1], size[j0:j1])
                ts, val = b.timestamps(at), np.asarray(b.val[at], dtype=np.float64)
                tls = self.tl_series[sid]
                if merged and (tl[j0 + 1:j1] == tl[j0:j1 - 1]).any():
                    order = np.lexsort((ts, tls))
                    sid, ts, val, tls = sid[order], ts[order], val[order], tls[order]
                    one = self._one_target(sid, tls, ts) if self.tl_copies is not None else None
                    if one is not None:
                        self.other_target_samples += int(np.count_nonzero(~one))
                        sid, ts, val, tls = sid[one], ts[one], val[one], tls[one]
                if known:
                    ok = ~np.isnan(val)
                    if not ok.all():
                        sid, ts, val, tls = sid[ok], ts[ok], val[ok], tls[ok]
                yield _Picked(sid, ts, val, tls, self.series_own, self.g)

    def _canonical(self, pods: pd.DataFrame) -> None:
        t, n = self.table, self.n_series
        self.notes: list[str] = []

        def pick(names: tuple[str, ...]) -> np.ndarray:
            out = _blank(n)
            for name in reversed(names):
                if name in t:
                    v = t[name]
                    out = np.where(v != "", v, out)
            return out

        self.lab = {canon: pick(names) for canon, names in D.LABEL_ALIASES.items()}
        host = self.lab["hostname"]
        if S.INSTANCE in t:
            # dcgm-exporter 1.x has no host label; Prometheus' target label tells hosts apart
            inst_host = np.array([v.rsplit(":", 1)[0] if v else "" for v in t[S.INSTANCE]], dtype=object)
            from_instance = (host == "") & (inst_host != "")
            host = np.where(host != "", host, inst_host)
            host = self._one_host_per_uuid(host, from_instance)
        # dcgm-exporter pod names in the host label -> their nodes (kube_pod_info), so a roll joins
        host, host_notes = map_exporter_pods(host, pods)
        self.lab["hostname"] = host
        self.notes.extend(host_notes)
        self.has_gpu = self.lab["gpu"] != ""
        g, i = self.lab["gpu"], self.lab["gpu_instance"]
        self.own_key = np.array([f"{a}\x00{b}\x00{c}" for a, b, c in zip(host, g, i, strict=True)], dtype=object)
        self.par_key = np.array([f"{a}\x00{b}\x00" for a, b in zip(host, g, strict=True)], dtype=object)
        if self.has_gpu.any() and (host[self.has_gpu] == "").any():
            self.notes.append(
                "some series carry no hostname/Hostname label (dcgm-exporter 1.x): their GPUs are told apart by "
                "gpu index only, so read one host's data at a time or keep Prometheus' instance label"
            )

    def _one_host_per_uuid(self, host: np.ndarray, from_instance: np.ndarray) -> np.ndarray:
        """A GPU whose host is known only from ``instance`` keeps one host whatever target scraped it.

        The same exporter scraped by two jobs (a ServiceMonitor and a static config, the pod IP and the
        node name) gives two ``instance`` values for one GPU; its UUID is the same, so those series get
        the host of a series with an explicit host label when there is one, else the first instance
        host: one device, not two (said once in the notes)."""
        uuid = self.lab["uuid"]
        sel = from_instance & (uuid != "")
        if not sel.any():
            return host
        known = uuid != ""
        cand = pd.DataFrame({"uuid": uuid[known], "inst": from_instance[known], "host": host[known]})
        first = cand.sort_values(["uuid", "inst", "host"], kind="stable").drop_duplicates("uuid")
        canon = dict(zip(first["uuid"], first["host"], strict=True))
        fixed = host.copy()
        fixed[sel] = [canon[u] for u in uuid[sel]]
        n = int(pd.Series(uuid[sel][fixed[sel] != host[sel]]).nunique())
        if n:
            self.notes.append(f"{n} GPU(s) scraped under more than one instance (two scrape jobs): told apart "
                              "by UUID and counted once")
        return fixed

    def grid(self, step: float | None, start: float | None, end: float | None, notes: list[str]) -> _Grid:
        telemetry = ~self.of_metric(*_INFO_NAMES)
        if not telemetry.any():
            telemetry[:] = True
        spacings, counts = [], []
        self.other_target_samples = 0
        for p in self.picks(telemetry, known=False):
            d = np.diff(p.ts)
            d = d[(p.tl[1:] == p.tl[:-1]) & (d > 0)]
            if len(d) and d.min() == d.max():  # the common case, without counting distinct values
                spacings.append(d[:1].copy())  # not a view: it would keep the chunk's diffs
                counts.append(np.array([len(d)]))
            elif len(d):
                vc = pd.Series(d).value_counts(sort=False)
                spacings.append(vc.index.to_numpy(dtype=np.float64))
                counts.append(vc.to_numpy())
        spacing = _median(spacings, counts)
        if self.other_target_samples:
            notes.append(f"{self.other_target_samples} samples of GPUs scraped by more than one target "
                         f"({'/'.join(TARGET_LABELS)}) dropped: one copy per scrape interval, not twice the counters")
        if step is None:
            if math.isnan(spacing):
                step = SNAPSHOT_STEP
                notes.append(f"one sample time only: step set to {SNAPSHOT_STEP:g} s (rates from counters unknown)")
            else:  # scrape intervals are whole seconds: jitter the median kept is not part of it
                step = float(_snap(np.float64(spacing), 1.0))
        step = float(step)
        if not math.isfinite(step) or step <= 0:
            raise BudgetError(f"step must be a positive number of seconds, not {step!r}")
        kept = [b for b, off in self.blocks if telemetry[off]]
        start = min(float(b.times.min()) for b in kept) if start is None else float(start)
        if end is None:  # the end of the step holding the last sample
            last = max(float(b.times.max()) for b in kept)
            end = start + (math.floor((last - start) / step + _EPS) + 1) * step
        T = check_window(start, float(end), step)
        self.g = _Grid(start, step, T, spacing if not math.isnan(spacing) else step)
        return self.g

    def devices(self) -> pd.DataFrame:
        """Frame rows: MIG instances of GPUs that have them, else whole GPUs; sorted."""
        gpu = self.has_gpu
        own, par = self.own_key[gpu], self.par_key[gpu]
        inst = self.lab["gpu_instance"][gpu]
        keys = pd.Index(pd.unique(np.concatenate([own, par])))
        self.src_keys = keys
        self.series_own = np.full(self.n_series, -1, dtype=np.int64)
        self.series_par = np.full(self.n_series, -1, dtype=np.int64)
        self.series_own[gpu] = keys.get_indexer(own)
        self.series_par[gpu] = keys.get_indexer(par)
        mig_parents = set(par[inst != ""])
        rows = sorted(set(own[inst != ""]) | {p for p in set(par) if p not in mig_parents}, key=_device_sort_key)
        host, g, i = (np.array(x, dtype=object) for x in zip(*(r.split("\x00") for r in rows), strict=True)) if rows \
            else (np.array([], dtype=object),) * 3
        row_own = keys.get_indexer(rows)
        row_par = keys.get_indexer(np.array([f"{a}\x00{b}\x00" for a, b in zip(host, g, strict=True)], dtype=object))
        return pd.DataFrame({"hostname": host, "gpu": g, "gpu_instance": i, "own": row_own, "par": row_par})

    def topology(self) -> pd.DataFrame:
        sel = self.of_metric(S.GPU_TOPOLOGY_INFO.name) & self.has_gpu
        if not sel.any():
            return pd.DataFrame(columns=list(TOPOLOGY_COLUMNS))
        t, blank = self.table, _blank(self.n_series)
        out = pd.DataFrame({
            "hostname": self.lab["hostname"][sel], "gpu": self.lab["gpu"][sel],
            "peer_gpu": t.get("peer_gpu", blank)[sel], "link": t.get("link", blank)[sel],
        }).drop_duplicates(ignore_index=True)  # fmt: skip
        order = np.lexsort((_num(out["peer_gpu"]), _num(out["gpu"]), out["hostname"].to_numpy(dtype=str)))
        return out.iloc[order].reset_index(drop=True)


    def accounting(self) -> pd.DataFrame:
        """Slurm accounting per workload (ACCOUNTING_COLUMNS); a job's last series in input order wins."""
        sel = self.of_metric(S.SLURM_JOB_INFO.name)
        if not sel.any():
            return pd.DataFrame(columns=list(ACCOUNTING_COLUMNS))
        t, blank = self.table, _blank(self.n_series)
        job = _workload_label(t, self.n_series)
        out = pd.DataFrame({"job": job[sel], **{c: t.get(c, blank)[sel] for c in ACCOUNTING_COLUMNS[1:]}})
        return merged_accounting(out[out["job"] != ""])


def _workload_label(table: dict[str, np.ndarray], n: int) -> np.ndarray:
    """Per series, the workload its labels name: ``workload``, or ``job`` in data from before the rename
    (``exported_job`` where Prometheus renamed it because it clashed with the scrape job); "" where none."""
    out = _blank(n)
    for name in ("job", "exported_job", S.WORKLOAD):
        value = table.get(name, _blank(n))
        out = np.where(value != "", value, out)
    return out


_INFO_NAMES = frozenset(m.name for m in D.INFO_METRICS)
#: The series that measure how much of a row's step has samples (analyzer.data.coverage.DATA_SHARE).
_SHARE_NAMES = frozenset({S.MEMORY_USED.name, *(n for f in S.MEMORY_USED.dcgm for n in f.spellings)})


def _blank(n: int) -> np.ndarray:
    return np.full(n, "", dtype=object)


def _snap(spacing: np.ndarray, unit: float) -> np.ndarray:
    """Sample spacings within ``HOLD_TOLERANCE`` of a whole number (>= 1) of ``unit`` as that multiple: a scrape
    interval with its timestamps' jitter taken out."""
    k = np.round(spacing / unit)
    return np.where((k >= 1) & (np.abs(spacing - k * unit) <= HOLD_TOLERANCE * spacing), k * unit, spacing)


def _median(values: list[np.ndarray], counts: list[np.ndarray]) -> float:
    """np.median of the multiset ``values`` (each repeated ``counts`` times), NaN when empty."""
    if not values:
        return float("nan")
    uniq, inv = np.unique(np.concatenate(values), return_inverse=True)
    cum = np.cumsum(np.bincount(inv.reshape(-1), weights=np.concatenate(counts)).astype(np.int64))
    n = int(cum[-1])

    def nth(k: int) -> float:
        return float(uniq[np.searchsorted(cum, k, side="right")])

    return nth(n // 2) if n % 2 else float(np.mean([nth(n // 2 - 1), nth(n // 2)]))


def _num(values: pd.Series | np.ndarray) -> np.ndarray:
    return pd.to_numeric(pd.Series(np.asarray(values, dtype=object)), errors="coerce").fillna(1e18).to_numpy()


def _device_sort_key(key: str) -> tuple:
    host, gpu, inst = key.split("\x00")

    def n(x: str) -> tuple[int, float, str]:
        try:
            return (0, float(x), x)
        except ValueError:
            return (1 if x else -1, 0.0, x)

    return (host, n(gpu), n(inst))


_Value = Callable[[_Picked], np.ndarray]


class _Dense:
    """(source device x row) sums and counts, accumulated a chunk of samples at a time."""

    def __init__(self, n_src: int, T: int) -> None:
        self.shape = (n_src, T)
        self.sums = np.zeros(n_src * T)
        self.cnt = np.zeros(n_src * T, dtype=np.int64)

    def add(self, flat: np.ndarray, values: np.ndarray) -> None:
        self.sums += np.bincount(flat, weights=values, minlength=len(self.sums))
        self.cnt += np.bincount(flat, minlength=len(self.sums))

    def mean(self) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.cnt > 0, self.sums / np.maximum(self.cnt, 1), np.nan).reshape(self.shape)

    def total(self) -> np.ndarray:
        return np.where(self.cnt > 0, self.sums, np.nan).reshape(self.shape)


def _runs(key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Start index and value of each run of equal values in a sorted key."""
    if not len(key):
        return np.zeros(0, dtype=np.int64), key
    starts = np.flatnonzero(np.concatenate(([True], key[1:] != key[:-1])))
    return starts, key[starts]


def _held(x: np.ndarray, rows: np.ndarray, backward: bool = False, missing: float = np.nan) -> np.ndarray:
    """``x`` (device x step) with each device's missing cells (NaN, or ``missing``) taken from its last value
    at most ``rows[device]`` steps before (after, ``backward``: values describing the period that ends at
    their sample)."""
    sel = np.flatnonzero(rows > 0)
    if not len(sel):
        return x
    sub = x[sel][:, ::-1] if backward else x[sel]
    gone = np.isnan(sub) if np.isnan(missing) else sub == missing
    at = np.arange(sub.shape[1])
    last = np.maximum.accumulate(np.where(gone, -1, at), axis=1)
    fill = gone & (last >= 0) & (at - last <= rows[sel][:, None])
    sub = np.where(fill, np.take_along_axis(sub, np.maximum(last, 0), axis=1), sub)
    out = x.copy()
    out[sel] = sub[:, ::-1] if backward else sub
    return out


# Signals --------------------------------------------------------------------------------------
class _State:
    """Computes dense (source device x step) matrices per signal, then lays out the frame."""

    def __init__(self, data: _Input, grid: _Grid, devices: pd.DataFrame, report: IngestReport | None) -> None:
        self.d, self.g, self.dev = data, grid, devices
        self.n_src = len(data.src_keys)
        self.notes: list[str] = []
        self.present: set[str] = set()
        self.resets = 0
        self.increase: set[str] = set()
        if report is not None:
            self.increase = {n for n, q in report.queries.items() if q.startswith(("increase(", "rate("))}
            self.rate_queries = {n for n, q in report.queries.items() if q.startswith("rate(")}
        else:
            self.rate_queries: set[str] = set()
        self.metric_idx = pd.Index(pd.unique(data.metric))

    @cached_property
    def _memory_samples(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """One read of the memory-used samples (on every GPU and MIG instance in both dialects): per (source
        device x row) their count and the count of series present (``data_share``), and per source device its
        own sample spacing, their median gap; the input's where it has fewer than ``MIN_OWN_GAPS`` gaps."""
        d, T = self.d, self.g.T
        n = self.n_src * T
        samples, series = np.zeros(n), np.zeros(n)
        spacing = np.full(self.n_src, self.g.spacing)
        srcs, gaps = [], []
        for p in d.picks(d.of_metric(*_SHARE_NAMES)):  # a series is never split between chunks
            keep = (p.bf >= 0) & (p.bf < T)
            b = p.bf[keep]
            samples += np.bincount(p.src[keep] * T + b, minlength=n)
            pairs = np.unique(p.sid[keep] * T + b)  # (series, row) present
            series += np.bincount(d.series_own[pairs // T] * T + pairs % T, minlength=n)
            dt = np.diff(p.ts)
            ok = (p.tl[1:] == p.tl[:-1]) & (dt > 0) & (p.src[1:] >= 0)
            srcs.append(p.src[1:][ok])
            gaps.append(dt[ok])
        if sum(map(len, srcs)):
            by = pd.Series(np.concatenate(gaps)).groupby(np.concatenate(srcs))
            med = by.median()[by.size() >= MIN_OWN_GAPS]
            spacing[med.index.to_numpy(dtype=np.int64)] = med.to_numpy(dtype=np.float64)
        # A median gap within the tolerance of whole steps is that many steps: scrape jitter, not a slower
        # scrape job (14.994 s on a 15 s grid read as 0.04 % of every row unobserved).
        return samples, series, _snap(spacing, self.g.step)

    @property
    def src_spacing(self) -> np.ndarray:
        """Per source device, its own sample spacing (``_memory_samples``)."""
        return self._memory_samples[2]

    @cached_property
    def hold(self) -> np.ndarray:
        """Per source device, how many rows after its sample that sample stands for: 3 for a device scraped
        every 60 s on a 15 s grid; 0 where samples come once a step or more often."""
        ratio = np.minimum(self.src_spacing, HOLD_MAX_S) / self.g.step
        return np.maximum(np.ceil(ratio - HOLD_TOLERANCE) - 1, 0).astype(np.int64)

    def _label_mask(self, signal: Signal) -> tuple[np.ndarray, np.ndarray]:
        """(series feeding ``signal`` as truegpu primary, as truegpu fallback ``total``)."""
        t, n = self.d.table, self.d.n_series

        def ok() -> np.ndarray:
            mask = self.d.of_metric(signal.metric.name)
            for label, accepted in signal.labels:
                mask &= np.isin(t.get(label, _blank(n)), list(accepted))
            return mask

        def total() -> np.ndarray:
            out = np.zeros(n, dtype=bool)
            for label, _ in signal.labels:
                out |= t.get(label, _blank(n)) == "total"
            return out
        key = (signal.metric.name, signal.labels)
        feeds = self.d.series_mask(("feeds", *key), ok)
        fallback = self.d.series_mask(("total", *key), lambda: feeds & total())
        return feeds & ~fallback, fallback

    # per-kind aggregation into dense (n_src, T) arrays, a chunk of samples at a time
    def _mean(self, picks: Iterable[_Picked], value: _Value) -> np.ndarray:
        dense = _Dense(self.n_src, self.g.T)
        for p in picks:
            ok = (p.bf >= 0) & (p.bf < self.g.T)
            dense.add(p.src[ok] * self.g.T + p.bf[ok], value(p)[ok])
        return dense.mean()

    def _max(self, picks: Iterable[_Picked], value: _Value) -> np.ndarray:
        T = self.g.T
        out = np.full(self.n_src * T, -np.inf)
        for p in picks:
            ok = (p.bf >= 0) & (p.bf < T)
            np.maximum.at(out, p.src[ok] * T + p.bf[ok], value(p)[ok])
        out[np.isneginf(out)] = np.nan
        return out.reshape(self.n_src, T)

    def _tl_add(self, dense: _Dense, tl: np.ndarray, bucket: np.ndarray, rate: np.ndarray) -> None:
        """Add per-timeline values to their device's (src, bucket) sum."""
        T = self.g.T
        ok = (bucket >= 0) & (bucket < T) & np.isfinite(rate)
        src = self.d.series_own[self.d.tl_rep[tl[ok]]]
        dense.add(src * T + bucket[ok], rate[ok])

    def _counter_rate(self, picks: Iterable[_Picked], value: _Value) -> np.ndarray:
        T = self.g.T
        dense = _Dense(self.n_src, T)
        for p in picks:
            if len(p.ts) < 2:
                continue
            max_gap = np.maximum(1.5 * self.src_spacing[p.src[:-1]], self.g.step) + _EPS
            values, tl = value(p), p.tl
            dt = p.ts[1:] - p.ts[:-1]
            inc = values[1:] - values[:-1]
            same = tl[1:] == tl[:-1]
            down = same & (inc < 0)
            rounded = down & (-inc <= COUNTER_ROUNDING * np.abs(values[:-1]))
            reset = down & ~rounded
            self.resets += int(reset.sum())
            inc = np.where(reset, values[1:], np.where(rounded, 0.0, inc))
            ok = same & (dt > 0) & (dt <= max_gap) & (p.src[:-1] >= 0)
            b = p.bf[:-1][ok]
            inside = (b >= 0) & (b < T)
            key = tl[:-1][ok][inside] * T + b[inside]
            starts, ukey = _runs(key)
            if not len(starts):
                continue
            inc_sum = np.add.reduceat(inc[ok][inside], starts)
            dt_sum = np.add.reduceat(dt[ok][inside], starts)
            self._tl_add(dense, ukey // T, ukey % T, inc_sum / dt_sum)
        return dense.total()

    def _tl_mean_sum(self, picks: Iterable[_Picked], value: _Value) -> np.ndarray:
        """Mean per (timeline, row ending at the sample), summed over the timelines of a device (rates:
        tx + rx)."""
        T = self.g.T
        dense = _Dense(self.n_src, T)
        for p in picks:
            inside = (p.be >= 0) & (p.be < T)
            key = p.tl[inside] * T + p.be[inside]
            order = np.argsort(key, kind="stable")
            key, v = key[order], value(p)[inside][order]
            starts, ukey = _runs(key)
            if not len(starts):
                continue
            counts = np.diff(np.append(starts, len(key)))
            self._tl_add(dense, ukey // T, ukey % T, np.add.reduceat(v, starts) / counts)
        return dense.total()

    def _group(self, kind: str, series_mask: np.ndarray, factors: tuple[float, float], bits: int,
               name: str) -> np.ndarray | None:
        dense = self._group_rows(kind, series_mask, factors, bits, name)
        if dense is None:
            return None
        # Rates read back from Prometheus and dcgm-exporter's rates describe the period ending at their sample.
        return _held(dense, self.hold, backward=kind == "dcgm_rate" or (name in self.increase and kind == "counter"))

    def _group_rows(self, kind: str, series_mask: np.ndarray, factors: tuple[float, float], bits: int,
                    name: str) -> np.ndarray | None:
        if not series_mask.any():
            return None
        picks = self.d.picks(series_mask)

        def scaled(p: _Picked) -> np.ndarray:
            return p.val * factors[0] / factors[1]

        if name in self.increase and kind == "counter":
            if name in self.rate_queries:
                return self._tl_mean_sum(picks, scaled)
            return self._tl_mean_sum(picks, lambda p: scaled(p) / self.g.step)
        if kind == "gauge":
            return self._mean(picks, scaled)
        if kind in ("flag", "last"):
            return self._max(picks, scaled)
        if kind == "bitmask":
            return self._max(picks, lambda p: ((np.nan_to_num(p.val).astype(np.int64) & bits) != 0).astype(np.float64))
        if kind == "dcgm_rate":
            return self._tl_mean_sum(picks, scaled)
        return self._counter_rate(picks, scaled)

    def signal(self, signal: Signal) -> np.ndarray | None:
        """Dense (n_src, T) values of ``signal``: truegpu first, dcgm where truegpu is unknown."""
        by_dialect: dict[str, tuple[list[np.ndarray], list[np.ndarray]]] = {}
        for name, sources in D.SOURCES.items():
            for src in sources:
                if src.signal is not signal or name not in self.metric_idx:
                    continue
                if src.dialect == "truegpu":
                    primary, fallback = self._label_mask(signal)
                    groups = [(primary, False), (fallback, True)]
                else:
                    groups = [(self.d.of_metric(name), src.fallback)]
                for mask, is_fallback in groups:
                    arr = self._group(src.kind, mask, (src.scale, src.div), src.bits, name)
                    if arr is not None:
                        by_dialect.setdefault(src.dialect, ([], []))[1 if is_fallback else 0].append(arr)
        if signal.name == "mem_total":
            fb = self._fb_total()
            if fb is not None:
                by_dialect.setdefault("dcgm", ([], []))[1].append(fb)
        if not by_dialect:
            return None
        out = None
        for dialect in ("truegpu", "dcgm"):
            if dialect not in by_dialect:
                continue
            primary, fallback = by_dialect[dialect]
            value = _combine(signal, primary)
            if fallback:
                fb_value = _combine(signal, fallback)
                value = fb_value if value is None else np.where(np.isnan(value), fb_value, value)
            out = value if out is None else np.where(np.isnan(out), value, out)
        return out

    def _fb_total(self) -> np.ndarray | None:
        """dcgm memory total from FB_USED + FB_FREE (+ FB_RESERVED where collected), MiB."""
        parts = {}
        for name, base in D.FB_PARTS.items():
            if name in self.metric_idx:
                mask = self.d.of_metric(name)
                arr = self._group("gauge", mask, (S.MIB, 1.0), 0, name)
                parts[base] = arr if base not in parts else np.where(np.isnan(parts[base]), arr, parts[base])
        used, free, reserved = parts.get(D.FB_USED), parts.get(D.DCGM_FB_FREE), parts.get(D.DCGM_FB_RESERVED)
        if used is None or free is None:
            return None
        total = used + free
        return total if reserved is None else total + np.nan_to_num(reserved)

    def _check_uuids(self, values: dict[str, np.ndarray]) -> None:
        """A page without UUIDs, or repeating one, still counts every GPU (by host and index): said once."""
        whole = values["gpu_instance"] == ""
        pairs = pd.DataFrame({"gpu": values["hostname"] + "/" + values["gpu"], "uuid": values["uuid"]})[whole]
        pairs = pairs.drop_duplicates()
        missing = int((pairs["uuid"] == "").sum())
        shared = pairs[pairs["uuid"] != ""].groupby("uuid")["gpu"].nunique()
        shared = shared[shared > 1]
        if missing:
            self.notes.append(f"{missing} GPU(s) carry no UUID label: told apart by host and gpu index")
        if len(shared):
            self.notes.append(f"{len(shared)} UUID(s) appear on more than one GPU (e.g. {shared.index[0]}): "
                                "told apart by host and gpu index")

    def _rows(self, dense: np.ndarray, out: np.ndarray) -> None:
        """Write the frame column of a (source device x step) array into ``out``: a MIG instance without a
        value of its own takes its GPU's."""
        own = dense[self.dev["own"].to_numpy()].reshape(-1)
        par = dense[self.dev["par"].to_numpy()].reshape(-1)
        np.copyto(out, np.where(np.isnan(own), par, own))

    # frame --------------------------------------------------------------------------------
    def frame(self) -> pd.DataFrame:
        d, T, dev = self.d, self.g.T, self.dev
        n = len(dev)
        if n == 0:
            raise ValueError("no GPU telemetry in the input: no series carries a gpu label")
        # the float columns are written into one (column x row) block the frame is built on, not copied
        floats = np.empty((3 + len(SIGNALS), n * T))
        names = ["timestamp", "gpu_share", DATA_SHARE]
        cats: list[tuple[int, str, pd.Categorical]] = []  # (position in the frame, name, column)
        floats[0] = np.tile(self.g.times, n)
        own, par = dev["own"].to_numpy(), dev["par"].to_numpy()
        uuid = self._per_src(d.lab["uuid"])
        model = self._per_src(d.lab["model"])
        prof = self._per_src(d.lab["mig_profile"])
        values = {
            "hostname": dev["hostname"].to_numpy(dtype=object), "gpu": dev["gpu"].to_numpy(dtype=object),
            "uuid": np.where(uuid[own] != "", uuid[own], uuid[par]),
            "gpu_instance": dev["gpu_instance"].to_numpy(dtype=object), "mig_profile": prof[own],
            "model": np.where(model[own] != "", model[own], model[par]),
        }  # fmt: skip
        self._check_uuids(values)
        site, rack = self._placement(values["hostname"])
        values["site"], values["rack"] = site, rack
        for name, v in values.items():
            uniq, codes = np.unique(v.astype(str), return_inverse=True)
            cats.append((1 + len(cats), name, pd.Categorical.from_codes(np.repeat(codes, T), uniq)))
        profiles = pd.unique(prof[own])
        share = dict(zip(profiles, (gpu_share(p) for p in profiles), strict=True))
        floats[1] = np.repeat(np.array([share[p] for p in prof[own]], dtype=np.float64), T)
        after = 2 + len(cats)  # timestamp, the device columns, gpu_share
        cats += [(after + k, name, col) for k, (name, col) in enumerate(self._allocation().items())]
        share = self.data_share()
        self._rows(share, floats[2])
        for signal in SIGNALS:
            dense = self.signal(signal)
            if dense is not None:
                self.present.add(signal.name)
                self._rows(dense, floats[len(names)])
                names.append(signal.name)
        if self.resets:
            self.notes.append(f"{self.resets} counter resets (a drop in a counter) read as restarts from 0")
        frame = pd.DataFrame(floats[:len(names)].T, columns=names, copy=False)
        for at, name, col in cats:
            frame.insert(at, name, col)
        if self.hold.any():  # rows of a slowly scraped device without a sample of their own
            held = np.empty(n * T)
            self._rows((np.isnan(share) & (self.hold[:, None] > 0)).astype(np.float64), held)
            frame[HELD] = held
        return frame

    def data_share(self) -> np.ndarray:
        """(n_src, T): the share of each row's step that samples cover, from memory used (on every GPU and
        MIG instance in both dialects): samples per series x the device's sample spacing / step, at most 1; NaN where
        the device has no such sample in the row (a row with other data then counts whole). Exact across
        series that change labels mid-window (a new pod): samples are divided by the series present."""
        samples, series, spacing = self._memory_samples
        with np.errstate(invalid="ignore", divide="ignore"):
            share = np.where(series > 0, np.minimum(1.0, samples / series * np.repeat(spacing, self.g.T) / self.g.step),
                             np.nan)
        return share.reshape(self.n_src, self.g.T)

    def _per_src(self, labels: np.ndarray) -> np.ndarray:
        """First non-empty label value per source device."""
        out = _blank(self.n_src)
        ok = (self.d.series_own >= 0) & (labels != "")
        src, vals = self.d.series_own[ok][::-1], labels[ok][::-1]
        out[src] = vals  # last write wins: the first series in input order
        return out

    def _placement(self, hosts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        t = self.d.table
        sel = self.d.of_metric(S.NODE_INFO.name)
        n = self.d.n_series
        site = dict(zip(self.d.lab["hostname"][sel], t.get("site", _blank(n))[sel], strict=True))
        rack = dict(zip(self.d.lab["hostname"][sel], t.get("rack", _blank(n))[sel], strict=True))
        zones = self.d.zones
        return (np.array([site.get(h) or zones.get(h, "") for h in hosts], dtype=object),
                np.array([rack.get(h, "") for h in hosts], dtype=object))

    def _allocation(self) -> dict[str, pd.Categorical]:
        """namespace/pod/container/job per row from allocation info or dcgm pod labels."""
        d, T = self.d, self.g.T
        alloc_info, alloc_id, uniq_tuples = d.once("allocation", self._allocation_series)
        dense = np.full(self.n_src * T, -1, dtype=np.int64)
        for p in d.picks((alloc_id >= 0) & (d.series_own >= 0), known=False):
            use = ~alloc_info[p.sid] | (p.val > 0.5)
            b = p.bf[use]
            inside = (b >= 0) & (b < T)
            np.maximum.at(dense, p.src[use][inside] * T + b[inside], alloc_id[p.sid[use][inside]])
        dense = _held(dense.reshape(self.n_src, T), self.hold, missing=-1)
        own = dense[self.dev["own"].to_numpy()]
        par = dense[self.dev["par"].to_numpy()]
        per_row = np.where(own >= 0, own, par).reshape(-1)
        parts = [p.split("\x00") for p in uniq_tuples] or [["", "", "", ""]]
        out = {}
        for k, col in enumerate(ALLOCATION_COLUMNS):
            vals = np.array([p[k] for p in parts], dtype=object)
            cats = sorted({v for v in vals if v})
            index = {c: i for i, c in enumerate(cats)}
            code_of = np.array([index.get(v, -1) for v in vals], dtype=np.int64)
            codes = np.where(per_row >= 0, code_of[np.maximum(per_row, 0)], -1) if len(uniq_tuples) else \
                np.full(len(per_row), -1)
            out[col] = pd.Categorical.from_codes(codes, cats)
        return out

    def _allocation_series(self) -> tuple[np.ndarray, np.ndarray, pd.Index]:
        """Per series, whether it is allocation info and which (namespace, pod, container, job) it carries (an
        index into the unique tuples, -1: none): from the labels alone."""
        d = self.d
        lab, t, n = d.lab, d.table, d.n_series
        job_label = d.job_label
        explicit = t.get(job_label, _blank(n)) if job_label else _blank(n)
        hpc = t.get(D.HPC_JOB_LABEL, _blank(n))
        alloc_info = d.of_metric(S.GPU_ALLOCATION_INFO.name)
        # The workload holding the GPU: ``workload``, or ``job`` in data from before the rename
        # (``exported_job`` where Prometheus renamed it because it clashed with the scrape job).
        own_job = _workload_label(t, n)
        is_dcgm = d.dialect_of_series == "dcgm"
        dcgm_rate = d.of_metric(*[s.name for ss in D.SOURCES.values() for s in ss if s.kind == "dcgm_rate"])
        pods = lab["pod"]
        job = np.where(explicit != "", explicit, "")
        job = np.where((job == "") & alloc_info, own_job, job)
        job = np.where((job == "") & is_dcgm, hpc, job)
        carries = (alloc_info | (is_dcgm & ~dcgm_rate)) & ((pods != "") | (job != ""))
        derive = carries & (job == "") & (pods != "")
        if derive.any():
            job = job.copy()
            job[derive] = self._derive_jobs(lab["namespace"][derive], pods[derive], derive)
        tuples = np.array([f"{a}\x00{b}\x00{c}\x00{j}" for a, b, c, j in
                           zip(lab["namespace"], pods, lab["container"], job, strict=True)], dtype=object)
        alloc_id = np.full(n, -1, dtype=np.int64)
        uniq_tuples = pd.Index(pd.unique(tuples[carries]))
        alloc_id[carries] = uniq_tuples.get_indexer(tuples[carries])
        return alloc_info, alloc_id, uniq_tuples

    def _derive_jobs(self, namespaces: np.ndarray, pods: np.ndarray, sel: np.ndarray) -> list[str]:
        """Workloads of dcgm-exporter pods: a training operator's label where dcgm-exporter (pod labels)
        or the query carried one (sanitized names, exporter.attribution.jobs.sanitized_job_labels), else
        the pod name with its namespace's other pods as siblings (StatefulSet ordinals: derive_job)."""
        t = self.d.table
        names = [(k, san) for k, san in zip(KNOWN_JOB_LABELS * 2, sanitized_job_labels(), strict=True) if san in t]
        label_of = _blank(len(pods))
        value_of = _blank(len(pods))
        for k, san in reversed(names):  # the first known label wins
            v = t[san][sel]
            label_of = np.where(v != "", k, label_of)
            value_of = np.where(v != "", v, value_of)
        siblings = pd.Series(pods).groupby(namespaces).agg(lambda p: frozenset(p)).to_dict()
        keys = list(zip(namespaces, pods, label_of, value_of, strict=True))
        derived = {key: derive_job(key[1], {key[2]: key[3]} if key[2] else None, siblings=siblings[key[0]])
                   for key in dict.fromkeys(keys)}
        return [derived[key] for key in keys]

    # events, shares and missing -------------------------------------------------------------
    def shares(self) -> pd.DataFrame:
        """Each holder's mean utilization and memory per step of the shared GPUs (SHARE_COLUMNS,
        analyzer.analysis.shares)."""
        keys = list(SHARE_COLUMNS[:-2])
        util = self._holder_means(S.SHARER_UTILIZATION, "utilization")
        if util is None:
            return pd.DataFrame(columns=list(SHARE_COLUMNS))
        mem = self._holder_means(S.SHARER_MEMORY_USED, "memory")
        out = util.assign(memory=np.nan) if mem is None else util.merge(mem, on=keys, how="left")
        return out[list(SHARE_COLUMNS)]

    def _holder_means(self, metric: S.Metric, name: str) -> pd.DataFrame | None:
        """A per-holder family's mean per (step, GPU, holder); None when the input has none."""
        d, T = self.d, self.g.T
        sel = d.of_metric(metric.name)
        if not sel.any():
            return None
        keys, vals = [], []
        for p in d.picks(sel):
            b = p.bf
            inside = (b >= 0) & (b < T)
            keys.append(p.sid[inside].astype(np.int64) * T + b[inside])
            vals.append(p.val[inside])
        found, inv = np.unique(np.concatenate(keys), return_inverse=True)
        mean = np.bincount(inv, weights=np.concatenate(vals)) / np.bincount(inv)
        sid, b = found // T, found % T
        job = _workload_label(d.table, d.n_series)
        out = pd.DataFrame({
            "timestamp": self.g.times[b], "hostname": d.lab["hostname"][sid], "gpu": d.lab["gpu"][sid],
            **{c: d.lab[c][sid] for c in ("namespace", "pod", "container")}, "job": job[sid], name: mean,
        })  # fmt: skip
        # The same holder scraped twice (an HA pair, two scrape jobs): one row, the later series' value.
        return out.drop_duplicates(list(SHARE_COLUMNS[:-2]), keep="last").reset_index(drop=True)

    def events(self) -> pd.DataFrame:
        d, T = self.d, self.g.T
        parts = []
        xids = d.table.get("xid", _blank(d.n_series))
        for p in d.picks(d.of_metric(S.XID_ERRORS.name)):
            v = p.val
            if S.XID_ERRORS.name in self.increase:
                b, cnt, ok = p.be, np.round(v), v > 0.5
                parts.append((p.sid[ok], b[ok], cnt[ok], xids[p.sid[ok]]))
            else:
                tl = p.tl
                same = tl[1:] == tl[:-1]
                inc = np.where(v[1:] < v[:-1], v[1:], v[1:] - v[:-1])
                ok = same & (inc > 0)
                first = np.concatenate(([True], ~same))
                # a series born later than the data's start was born by its first event
                late = first & (p.ts > d.ts_min + 1.5 * self.src_spacing[p.src]) & (v > 0)
                sel = np.concatenate([p.sid[:-1][ok], p.sid[late]])
                b = np.concatenate([p.bf[:-1][ok], p.bf[late] - 1])
                cnt = np.concatenate([inc[ok], v[late]])
                parts.append((sel, b, cnt, xids[sel]))
        gpu_key = np.char.add(np.char.add(d.lab["hostname"].astype(str), "\x00"), d.lab["gpu"].astype(str))
        counted = np.zeros(d.n_series, bool)  # series of GPUs whose XIDs the count collector reports
        xc = d.of_metric(*D.XID_DCGM_COUNT)
        if xc.any():
            # XIDs within dcgm-exporter's sliding window: each rise is that many new XIDs (it sees repeats)
            seen, already = [np.zeros(0, dtype=np.int64)], [np.zeros(0, dtype=np.int64)]
            for p in d.picks(xc):
                v, tl = p.val, p.tl
                same = tl[1:] == tl[:-1]
                ok = same & (v[1:] > v[:-1])
                sel = p.sid[:-1][ok]  # as for the last-XID gauge: in the step before the sample that shows it
                parts.append((sel, p.bf[:-1][ok], (v[1:] - v[:-1])[ok], xids[sel]))
                seen.append(np.unique(p.sid))
                already.append(p.sid[np.concatenate(([True], ~same)) & (v > 0)])
            counted = np.isin(gpu_key, gpu_key[np.concatenate(seen)])
            s = np.concatenate(already)
            if len(s):
                self.notes.append(
                    "XIDs already in dcgm-exporter's count window at the first sample (time unknown, not counted "
                    "as events): " + ", ".join(sorted({f"{h}/{g} XID {x}" for h, g, x in zip(
                        d.lab["hostname"][s], d.lab["gpu"][s], xids[s], strict=True)})))
        dc = d.of_metric(*D.XID_DCGM) & ~counted
        if dc.any() and not xc.any():
            self.notes.append(
                "XIDs come from dcgm-exporter's last-XID gauge: the same XID repeating is not seen; enable its XID "
                f"count collector ({S.DCGM_XID_COUNT}) to count every XID"
            )
        already_at: set[str] = set()
        for p in d.picks(dc):
            v, tl = p.val, p.tl
            same = tl[1:] == tl[:-1]
            ok = same & (v[1:] != v[:-1]) & (v[1:] > 0)
            sel = p.sid[:-1][ok]
            codes = np.array([str(int(x)) for x in v[1:][ok]], dtype=object)
            first = np.concatenate(([True], ~same)) & (v > 0)
            s = p.sid[first]
            already_at |= {f"{h}/{g} XID {int(x)}" for h, g, x in
                           zip(d.lab["hostname"][s], d.lab["gpu"][s], v[first], strict=True)}
            parts.append((sel, p.bf[:-1][ok], np.ones(len(sel)), codes))
        if already_at:
            self.notes.append(
                "last XID already non-zero at the first sample (time unknown, not counted as an event): "
                + ", ".join(sorted(already_at))
            )
        rows = []
        for sel, b, cnt, xid in parts:
            inside = (b >= 0) & (b < T)
            if not inside.any():
                continue
            s = sel[inside]
            rows.append(pd.DataFrame({
                "timestamp": self.g.times[b[inside]], "hostname": d.lab["hostname"][s], "gpu": d.lab["gpu"][s],
                "uuid": d.lab["uuid"][s], "xid": np.asarray(xid)[inside], "count": cnt[inside].astype(np.float64),
            }))  # fmt: skip
        if not rows:
            return pd.DataFrame(columns=list(EVENT_COLUMNS))
        ev = pd.concat(rows, ignore_index=True)
        # dcgm-exporter repeats the last XID on every MIG instance: one event per GPU
        ev = ev.groupby(["timestamp", "hostname", "gpu", "uuid", "xid"], as_index=False, sort=False)["count"].max()
        order = np.lexsort((_num(ev["gpu"]), ev["hostname"].to_numpy(dtype=str), ev["timestamp"].to_numpy()))
        return ev.iloc[order].reset_index(drop=True)[list(EVENT_COLUMNS)]

    def missing(self, frame: pd.DataFrame) -> dict[str, str]:
        used = [x for x in ("truegpu", "dcgm") if x in set(self.d.dialect_of_series)]
        all_mig = bool(len(frame)) and bool((frame["gpu_instance"].astype(str) != "").all())
        out = {}
        for signal in SIGNALS:
            if not signal.in_truegpu and "dcgm" not in used:
                continue  # a state only dcgm-exporter's gauge has
            if all_mig and signal.name in _NOT_ON_MIG and signal.name not in self.present:
                out[signal.name] = f"{signal.name} unknown: {_NOT_ON_MIG[signal.name]}"
            elif signal.name not in self.present:
                out[signal.name] = "; ".join(D.missing_reason(signal, x) for x in used)
            elif not frame[signal.name].notna().any():
                out[signal.name] = (
                    f"{signal.name} unknown: no usable value in the input (DCGM not-supported markers, lost GPUs, "
                    "or counters with fewer than two samples per series)"
                )
        return out


#: Signals NVIDIA does not report for MIG instances: on MIG-only input, no counters CSV can add them.
_NOT_ON_MIG = {
    "gpu_util": "NVIDIA does not report GPU utilization for MIG instances (every GPU here is in MIG mode); "
                "busy time comes from DCGM_FI_PROF_GR_ENGINE_ACTIVE per instance instead",
    "mem_util": "NVIDIA does not report memory-copy utilization for MIG instances (every GPU here is in MIG "
                "mode); DCGM_FI_PROF_DRAM_ACTIVE measures memory traffic per instance",
}


def _combine(signal: Signal, arrays: list[np.ndarray]) -> np.ndarray | None:
    """Several series of one signal and device: rates summed, flags max'ed, gauges averaged."""
    if not arrays:
        return None
    if len(arrays) == 1:
        return arrays[0]
    stack = np.stack(arrays)
    known = ~np.isnan(stack).all(axis=0)
    with np.errstate(invalid="ignore"):
        if signal.kind == "flag":
            value = np.nanmax(np.where(np.isnan(stack), -np.inf, stack), axis=0)
        elif signal.kind == "rate":
            value = np.nansum(stack, axis=0)
        else:
            value = np.nansum(stack, axis=0) / np.maximum((~np.isnan(stack)).sum(axis=0), 1)
    return np.where(known, value, np.nan)


__all__ = ["SNAPSHOT_STEP", "normalize"]
