"""Who owns the hours of a shared GPU: each holder by what it used.

Several pods or jobs can hold one GPU at once (Kubernetes time-slicing or MPS replicas, Slurm jobs
sharing a GPU). The frame keeps one holder per row; ``Fleet.shares`` (from
truegpu_gpu_sharer_utilization_ratio, published only for shared GPUs) says what each holder used.
Every per-workload number (scores by job, the partition, costs, ``truegpu job``) splits a shared
row's hours with :func:`owners`, per step of a whole GPU:

* ``p_i``: holder i's utilization (the share of the step a kernel of its processes ran), ``U``: the
  GPU's (gpu_util, else GR engine activity). Holder i gets ``p_i / max(U, sum p)`` of the row: what
  it used. ``sum p`` above ``U`` is concurrent work (MPS clients run kernels at the same time), so
  the shares are then ``p_i / sum p``.
* The rest, ``1 - sum_i p_i / max(U, sum p)``, is activity no named holder's process explains (the
  exporter's holder with empty labels: a PID of another PID namespace, a process that exited; or
  ``U`` above ``sum p``): *unattributed*, its own part of the GPU-hour partition
  (``shared_unattributed``), never spread over the holders.
* A step where the GPU did nothing (``max(U, sum p)`` < IDLE_UTIL) is held idle by its named holders
  together: equal shares, nothing unattributed.

Steps of a GPU without sharer series keep the frame's holder (an unshared GPU, or a holder gone),
except steps without any telemetry after shared ones (a scrape gap, a lost GPU): those keep the last
known holders and shares, as allocations are held, so their unknown hours are the holders'. MIG
instances are not split (the exporter does not publish sharers for them).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analyzer.analysis.rows import IDLE_UTIL
from analyzer.data.frame import Fleet
from analyzer.data.signals import ALLOCATION_COLUMNS
from analyzer.findings import Finding


@dataclass(frozen=True)
class Owners:
    """The entries that replace the shared rows of a frame: one per (row, named holder) plus one per row
    with an unattributed rest."""

    #: Frame rows (positions) whose hours the entries split.
    shared: np.ndarray
    #: Per entry: its frame row (position), its share of that row, whether it is the unattributed rest.
    row: np.ndarray
    weight: np.ndarray
    unattributed: np.ndarray
    #: Per entry: namespace/pod/container/job (object arrays, NaN on the unattributed rest).
    labels: dict[str, np.ndarray]
    #: Per entry: the holder's GPU memory (NaN: unknown, and on the rest).
    memory: np.ndarray


def owners(fleet: Fleet) -> Owners | None:
    """The split of ``fleet``'s shared rows (module docstring); None when no GPU is shared."""
    return fleet.memo(("owners",), lambda: _owners(fleet))


def _owners(fleet: Fleet) -> Owners | None:
    sh, fr = fleet.shares, fleet.frame
    if not len(sh) or not len(fr):
        return None
    hosts = set(sh["hostname"].astype(str))
    whole = fr["gpu_instance"].astype(str).to_numpy() == "" if "gpu_instance" in fr.columns else np.ones(len(fr), bool)
    cand = np.flatnonzero(whole & fr["hostname"].astype(str).isin(hosts).to_numpy())
    keys = pd.DataFrame({"timestamp": fr["timestamp"].to_numpy(np.float64)[cand],
                         "hostname": fr["hostname"].astype(str).to_numpy()[cand],
                         "gpu": fr["gpu"].astype(str).to_numpy()[cand], "_row": cand})
    e = sh.astype({"hostname": str, "gpu": str}).merge(keys, on=["timestamp", "hostname", "gpu"], how="inner")
    if not len(e):
        return None
    e = pd.concat([e, _held_over_gaps(e, keys, np.isnan(_busy(fr, cand)))], ignore_index=True)
    row = e["_row"].to_numpy(np.int64)
    p = np.clip(e["utilization"].to_numpy(np.float64), 0.0, 1.0)
    named = ((e["job"].astype(str) != "") | (e["pod"].astype(str) != "")).to_numpy()
    shared, inv = np.unique(row, return_inverse=True)
    busy = _busy(fr, shared)
    total = np.bincount(inv, weights=p)
    n_named = np.bincount(inv, weights=named.astype(np.float64))
    den = np.fmax(np.nan_to_num(busy, nan=0.0), total)
    active = den >= IDLE_UTIL
    with np.errstate(invalid="ignore", divide="ignore"):
        w = np.where(active[inv], p / den[inv], np.where(n_named[inv] > 0, 1.0 / n_named[inv], 0.0))
    w = np.where(named, w, 0.0)
    rest = np.clip(1.0 - np.bincount(inv, weights=w, minlength=len(shared)), 0.0, 1.0)
    keep = named
    has_rest = rest > 1e-9
    labels = {c: np.concatenate([e[c].astype(str).to_numpy(dtype=object)[keep],
                                 np.full(int(has_rest.sum()), np.nan, dtype=object)])
              for c in ALLOCATION_COLUMNS}
    for c in ALLOCATION_COLUMNS:
        labels[c][labels[c] == ""] = np.nan
    return Owners(
        shared=shared,
        row=np.concatenate([row[keep], shared[has_rest]]),
        weight=np.concatenate([w[keep], rest[has_rest]]),
        unattributed=np.concatenate([np.zeros(int(keep.sum()), bool), np.ones(int(has_rest.sum()), bool)]),
        labels=labels,
        memory=np.concatenate([e["memory"].to_numpy(np.float64)[keep], np.full(int(has_rest.sum()), np.nan)]),
    )


def _held_over_gaps(e: pd.DataFrame, keys: pd.DataFrame, unknown: np.ndarray) -> pd.DataFrame:
    """The holders of a shared GPU's last step with sharer rows, carried over the steps after it with no telemetry
    (a scrape gap, a lost GPU) until the GPU reports again, as allocations are held: the unknown hours of a
    shared GPU are its holders', in their last known shares, not the one holder allocation info names."""
    k = keys.assign(_has=keys["_row"].isin(e["_row"]).to_numpy(), _unknown=unknown)
    k = k.sort_values(["hostname", "gpu", "timestamp"])
    src = k["_row"].where(k["_has"], np.where(k["_unknown"], np.nan, -1.0))  # -1: a known step ends the carry
    src = src.groupby([k["hostname"], k["gpu"]], sort=False).ffill()
    carry = ~k["_has"] & k["_unknown"] & (src >= 0)
    if not carry.any():
        return e.iloc[:0]
    to = pd.DataFrame({"_src": src[carry].astype(np.int64).to_numpy(), "_to": k.loc[carry, "_row"].to_numpy(),
                       "_t": k.loc[carry, "timestamp"].to_numpy()})
    out = e.merge(to, left_on="_row", right_on="_src")
    return out.assign(_row=out["_to"], timestamp=out["_t"])[e.columns]


def _busy(fr: pd.DataFrame, rows: np.ndarray) -> np.ndarray:
    """The GPU's busy share on ``rows``: gpu_util, else GR engine activity; NaN where neither is known."""
    out = np.full(len(rows), np.nan)
    for col in ("gr_active", "gpu_util"):  # the later wins where known
        if col in fr.columns:
            v = fr[col].to_numpy(dtype=np.float64, na_value=np.nan)[rows]
            out = np.where(np.isnan(v), out, v)
    return out


def split(fleet: Fleet, values: Mapping[str, np.ndarray], columns: Sequence[str] = (),
          extra: Mapping[str, np.ndarray] | None = None
          ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray] | None:
    """Per-row ``values`` and grouping keys (the frame's ``columns`` and ``extra`` arrays over its rows) with every
    shared row replaced by its owners' entries: values times the entry's share, allocation keys
    (ALLOCATION_COLUMNS) the entry's, other keys the row's. Third: which entries are an unattributed rest (their
    allocation keys are NaN). None when no GPU is shared (use the rows as they are): then no key is built."""
    own = owners(fleet)
    if own is None:
        return None
    fr = fleet.frame
    keys = {**{c: fr[c].to_numpy(dtype=object) for c in columns if c in fr.columns}, **(extra or {})}
    mine = np.ones(len(fr), bool)
    mine[own.shared] = False
    out_v = {k: np.concatenate([np.asarray(v)[mine], np.asarray(v)[own.row] * own.weight]) for k, v in values.items()}
    out_k = {k: np.concatenate([np.asarray(v, dtype=object)[mine],
                                own.labels[k] if k in own.labels else np.asarray(v, dtype=object)[own.row]])
             for k, v in keys.items()}
    rest = np.concatenate([np.zeros(int(mine.sum()), bool), own.unattributed])
    return out_v, out_k, rest


def holder_view(fleet: Fleet, job: str) -> Fleet:
    """The rows where ``job`` holds the GPU, a shared GPU's rows weighted by its share (``gpu_share`` times the
    share, its own allocation labels and memory): one job's view for per-job reports. Its ``shares`` are empty
    (split)."""
    fr = fleet.frame
    mask = np.array((fr["job"] == job).to_numpy(dtype=bool, na_value=False)) if "job" in fr.columns \
        else np.zeros(len(fr), bool)
    own = owners(fleet)
    if own is None:
        return replace(fleet, frame=fr.loc[mask])
    mask[own.shared] = False
    mine = own.labels["job"] == job
    rows, inv = np.unique(own.row[mine], return_inverse=True)
    weight = np.bincount(inv, weights=own.weight[mine])
    first = np.unique(inv, return_index=True)[1]  # a job holding one GPU with two pods: its first pod's labels
    sub = fr.iloc[np.sort(np.concatenate([np.flatnonzero(mask), rows]))].copy()
    at = sub.index.get_indexer(fr.index[rows])
    share = sub["gpu_share"].to_numpy(dtype=np.float64).copy()
    share[at] *= weight
    sub["gpu_share"] = share
    if "mem_used" in sub.columns:  # its own processes' memory, not the GPU's (unknown where not reported)
        mem = sub["mem_used"].to_numpy(dtype=np.float64, na_value=np.nan).copy()
        mem[at] = np.bincount(inv, weights=np.nan_to_num(own.memory[mine], nan=0.0)) + np.where(
            np.bincount(inv, weights=np.isnan(own.memory[mine]).astype(np.float64)) > 0, np.nan, 0.0)
        sub["mem_used"] = mem
    for c in ALLOCATION_COLUMNS:
        if c in sub.columns:
            col = np.array(sub[c].astype(object).to_numpy())
            col[at] = own.labels[c][mine][first]
            sub[c] = pd.Categorical(col)
    return replace(fleet, frame=sub, shares=fleet.shares.iloc[:0])


def holder_rows(fleet: Fleet, columns: Sequence[str]) -> pd.DataFrame:
    """The frame's ``columns`` with each shared row replaced by one row per named holder (its allocation
    labels, the row's other columns; the unattributed rest dropped): who held what when, for listings and
    scopes that name workloads rather than weigh hours."""
    cut = split(fleet, {}, columns)
    if cut is None:
        return fleet.frame[[c for c in columns if c in fleet.frame.columns]]
    _, by, rest = cut
    return pd.DataFrame({c: v[~rest] for c, v in by.items()})


def name_holders(fleet: Fleet, findings: Sequence[Finding]) -> None:
    """Add ``evidence["holders"]`` to each finding on a shared GPU: every holder over the finding's span
    ("namespace/pod (workload)"). The finding's own workload is the frame's one holder; whoever acts on it
    (release an idle GPU, fix a masked one) needs all of them."""
    sh = fleet.shares
    if not len(sh) or not findings:
        return
    named = sh[(sh["job"].astype(str) != "") | (sh["pod"].astype(str) != "")]
    by_gpu = {k: g for k, g in named.groupby([named["hostname"].astype(str), named["gpu"].astype(str)], sort=False)}
    for f in findings:
        g = by_gpu.get((str(f.hostname), str(f.gpu))) if f.hostname and f.gpu is not None else None
        if g is None:
            continue
        end = fleet.end if f.end is None else f.end
        ts = g["timestamp"].to_numpy(np.float64)
        during = g[(ts >= f.start) & (ts < end)]
        cols = (during[c].astype(str) for c in ("namespace", "pod", "job"))
        holders = sorted({f"{n}/{p} ({j})" for n, p, j in zip(*cols, strict=True)})
        if len(holders) > 1:
            f.evidence["holders"] = holders


__all__ = ["Owners", "holder_rows", "holder_view", "name_holders", "owners", "split"]
