"""The one GPU-hour partition: every GPU-hour of a window is exactly one part.

Every number that says where GPU-hours went (cost reports, analyze, the HTML report, the
API, the rollups, the overview page and the published series) comes from ``row_parts``.
Per row (``w = step * gpu_share / 3600`` GPU-hours), the fractions add up to 1:

* rows without data (analyzer.data.coverage; a partly covered edge row for its uncovered share):
  ``unknown``, whoever held the GPU; allocated rows whose effective utilization is unknown:
  ``unknown`` (never 0, never waste); rows with data and no workload: ``unallocated``;
* allocated and measured, with ``eff`` = effective utilization and ``act = eff / clock_ratio``
  (SM activity before clock scaling):

  - ``effective`` = ``eff``: real SM work;
  - idle rows (``busy < IDLE_UTIL``: nothing launched): the rest is ``idle_allocated``;
  - ``act - eff`` (cycles lost to lower clocks): ``power_capped`` where the clocks were held
    by a power cap (site policy, not the owner's waste), else ``throttled`` (thermal or
    hardware slowdown: recoverable by fixing cooling or hardware);
  - of ``1 - act``, in this order so nothing counts twice: ``straggler`` (the straggler
    findings' lost GPU-hours, spread over the waiting peers), ``masked`` (GPU util no SM
    backs, only on the rows the idle_masking detector flags: its definition, reused),
    ``bandwidth_bound`` (DRAM busy at ``DRAM_CEILING`` or more: memory-bandwidth-bound work
    such as LLM decode is real work), then by the workload's class (analyzer.site):
    ``headroom`` up to ``1 - floor`` (the gap normal for healthy work of the class) and
    ``underused`` below the floor; a workload of no known class: ``unclassified``.
* a shared GPU (time-slicing, MPS: analyzer.analysis.shares): its holders split the row's parts by what
  each used; the activity no holder's process explains is ``shared_unattributed`` (with the row's
  unknown and unallocated shares kept as such), never spread over the holders. Rows are split where
  GPU-hours are summed (:func:`part_hours`, the cost report), so the totals hold it too.

Recoverable waste (``WASTE``) is what the owner can get back; ``NORMAL`` parts are not waste.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analyzer import output_schema as O
from analyzer.analysis.rows import IDLE_UTIL, allocated_rows
from analyzer.analysis.scores import Scores
from analyzer.analysis.shares import split
from analyzer.findings import IDLE_MASKING, STRAGGLER, Finding
from analyzer.site import UNCLASSIFIED, SiteConfig, default_site

if TYPE_CHECKING:
    from analyzer.data.frame import Fleet

#: The parts, in report order; recoverable waste; unused but normal (the published contract's names).
PARTS, WASTE, NORMAL = O.PARTS, O.WASTE_PARTS, O.NORMAL_PARTS
#: What the hours of ``attainable`` are: work plus the gaps normal for the workload.
ATTAINABLE: tuple[str, ...] = ("effective", *NORMAL)
#: The lever that recovers each waste part (the report's ranked savings say it).
LEVERS: dict[str, str] = {
    "idle_allocated": "release the idle GPUs (stop idle notebooks, scale idle deployments down)",
    "masked": "profile the kernels and batch more, fuse kernels or raise arithmetic intensity",
    "straggler": "fix the slow member (cooling, input pipeline, hardware) that the job waits for",
    "throttled": "fix cooling or the hardware slowing the clocks",
    "underused": "right-size: fewer GPUs, a smaller MIG profile, larger batches or a faster data loader",
}
#: DRAM activity at which the remaining gap is memory-bandwidth-bound work, not a shortfall:
#: HBM sustains ~80-90 % of its peak bandwidth in practice, so 0.8 is "at the ceiling".
DRAM_CEILING = 0.8
#: Clocks held by a power cap count as power_capped where at least half the row was capped.
POWER_CAPPED_MIN = 0.5


def per_category(series: pd.Series, fn: Any, missing: Any) -> np.ndarray:
    """``fn(value)`` per row, evaluated once per category; ``missing`` where the value is NaN."""
    s = series if isinstance(series.dtype, pd.CategoricalDtype) else series.astype("category")
    mapped = np.array([fn(str(c)) for c in s.cat.categories] + [missing], dtype=object)
    return mapped[s.cat.codes.to_numpy()]


def row_classes(fleet: Fleet, site: SiteConfig) -> tuple[np.ndarray, np.ndarray]:
    """Per row: the workload class name (UNCLASSIFIED where none matches) and its floor (NaN there)."""
    fr = fleet.frame
    n = len(fr)
    name = np.full(n, UNCLASSIFIED, dtype=object)
    floor = np.full(n, np.nan)
    todo = np.ones(n, bool)
    models = fr["model"] if "model" in fr.columns else pd.Series([""] * n, index=fr.index)
    for cls in site.workload_classes:
        hit = np.zeros(n, bool)
        for column in cls.match:
            if column in fr.columns:
                hit |= per_category(fr[column], lambda v, c=cls, col=column: c.matches(col, v), False).astype(bool)
        hit &= todo
        if hit.any():
            name[hit] = cls.name
            # evaluated per model category over all rows (cheap), then taken where the class matched
            floor[hit] = per_category(models, cls.floor_for, cls.floor).astype(np.float64)[hit]
            todo &= ~hit
    return name, floor


def _eq(fr: pd.DataFrame, col: str, value: Any) -> np.ndarray:
    if col not in fr.columns:
        return np.zeros(len(fr), bool)
    return np.array((fr[col] == str(value)).to_numpy(dtype=bool, na_value=False))


def _device_rows(fr: pd.DataFrame, f: Finding) -> np.ndarray:
    """Rows of the finding's host, GPU and MIG instance (as far as the finding names them)."""
    rows = _eq(fr, "hostname", f.hostname)
    if f.gpu is not None:
        rows &= _eq(fr, "gpu", f.gpu)
        if f.gpu_instance:
            rows &= _eq(fr, "gpu_instance", f.gpu_instance)
    return rows


def flagged_rows(fleet: Fleet, findings: Sequence[Finding], kind: str) -> np.ndarray:
    """Rows (device and time) inside a finding of ``kind``: the detector's own definition, reused."""
    fr = fleet.frame
    out = np.zeros(len(fr), bool)
    if not len(fr):
        return out
    ts = fr["timestamp"].to_numpy(dtype=np.float64)
    for f in findings:
        if f.kind == kind and f.hostname:
            end = fleet.end if f.end is None else float(f.end)
            out |= _device_rows(fr, f) & (ts >= float(f.start)) & (ts < end)
    return out


def _straggler_share(fleet: Fleet, findings: Sequence[Finding], w: np.ndarray, active: np.ndarray) -> tuple[
        np.ndarray, float]:
    """Per row: the fraction of its hours the straggler findings say it spent waiting (uncapped)."""
    fr = fleet.frame
    out = np.zeros(len(fr))
    claimed = 0.0
    if not len(fr) or "job" not in fr.columns:
        return out, claimed
    ts = fr["timestamp"].to_numpy(dtype=np.float64)
    for f in findings:
        lost = f.evidence.get("lost_gpu_hours") if f.evidence else None
        if f.kind != STRAGGLER or not f.job or lost is None or not math.isfinite(float(lost)) or float(lost) <= 0:
            continue
        end = fleet.end if f.end is None else float(f.end)
        peers = _eq(fr, "job", f.job) & (ts >= float(f.start)) & (ts < end) & active
        if f.namespace:
            peers &= _eq(fr, "namespace", f.namespace)
        if f.hostname:
            peers &= ~_device_rows(fr, f)
        hours = float(w[peers].sum())
        # The share of the finding's span inside this window: a finding that began before a sub-window (a
        # report over the last hour, a rollup piece) claims only that share of its lost GPU-hours here.
        span = max(end - float(f.start), 1e-9)
        inside = max(min(end, fleet.end) - max(float(f.start), fleet.start), 0.0) / span
        if hours > 0 and inside > 0:
            out[peers] += float(lost) * inside / hours
            claimed += float(lost) * inside
    return out, claimed


def _col(fr: pd.DataFrame, name: str) -> np.ndarray:
    return fr[name].to_numpy(dtype=np.float64, na_value=np.nan) if name in fr.columns else np.full(len(fr), np.nan)


def row_parts(fleet: Fleet, scores: Scores, findings: Sequence[Finding],
              site: SiteConfig | None = None) -> tuple[dict[str, np.ndarray], np.ndarray, float]:
    """Per row: the fraction of its hours in each of PARTS (they sum to 1), the allocated flag, and
    the straggler findings' claimed lost GPU-hours (before the cap by the peers' measured idle time)."""
    fr = fleet.frame
    rows = scores.rows
    if len(rows) != len(fr) or not rows.index.equals(fr.index):
        raise ValueError("scores do not belong to this fleet (compute_scores(fleet) first)")
    w = fr["gpu_share"].to_numpy(dtype=np.float64) * (fleet.step / 3600.0)
    alloc = allocated_rows(fr)
    obs = rows["observed"].to_numpy(dtype=np.float64)  # share of the row with data, 0..1
    eff = rows["effective_util"].to_numpy(dtype=np.float64)
    known = ~np.isnan(eff)
    measured = alloc & known
    idle = measured & (rows["busy"].to_numpy(dtype=np.float64) < IDLE_UTIL)  # NaN < x is False
    active = measured & ~idle
    ratio = rows["clock_ratio"].to_numpy(dtype=np.float64)
    scale = np.where(np.isnan(ratio), 1.0, ratio)
    e = np.where(known, eff, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        act = np.where(scale > 0, np.minimum(e / scale, 1.0), e)
    act = np.maximum(act, e)
    slow = np.where(active, act - e, 0.0)
    capped = (_col(fr, "power_throttle") >= POWER_CAPPED_MIN) & ~(_col(fr, "thermal_throttle") >= POWER_CAPPED_MIN)
    rest = np.where(active, 1.0 - act, 0.0)
    share, claimed = _straggler_share(fleet, findings, w * obs, active)
    straggler = np.minimum(share, rest)
    rest = rest - straggler
    gap = np.nan_to_num(rows["masking_gap"].to_numpy(dtype=np.float64), nan=0.0)
    masked_rows = active & flagged_rows(fleet, findings, IDLE_MASKING)
    masked = np.where(masked_rows, np.minimum(np.clip(gap, 0.0, None), rest), 0.0)
    rest = rest - masked
    bandwidth = np.where(~masked_rows & (_col(fr, "dram_active") >= DRAM_CEILING), rest, 0.0)
    rest = rest - bandwidth
    _, floor = row_classes(fleet, site or default_site())
    classified = ~np.isnan(floor)
    headroom = np.where(classified, np.minimum(rest, 1.0 - np.nan_to_num(floor)), 0.0)
    parts = {
        "effective": np.where(measured, e, 0.0),
        "idle_allocated": np.where(idle, 1.0 - e, 0.0),
        "masked": masked,
        "straggler": straggler,
        "throttled": np.where(capped, 0.0, slow),
        "underused": np.where(classified, rest - headroom, 0.0),
        "headroom": headroom,
        "bandwidth_bound": bandwidth,
        "power_capped": np.where(capped, slow, 0.0),
        "unclassified": np.where(classified, 0.0, rest),
        "shared_unattributed": np.zeros(len(fr)),
    }
    # The measured parts split the share of the row with data; the rest of the row is unknown.
    out = {k: v * obs for k, v in parts.items()}
    out["unknown"] = (1.0 - obs) + np.where(alloc & ~known, obs, 0.0)
    out["unallocated"] = np.where(alloc, 0.0, obs)
    return {k: out[k] for k in PARTS}, alloc, claimed


def split_parts(fleet: Fleet, values: dict[str, np.ndarray], columns: Sequence[str] = (),
                extra: dict[str, np.ndarray] | None = None, suffixes: Sequence[str] = ("_gpu_hours",)
                ) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray], np.ndarray] | None:
    """``values`` (per-row ``<part><suffix>`` columns and any others) and the keys (frame ``columns``, ``extra``)
    with the shared rows split among their holders (analyzer.analysis.shares.split); an unattributed rest keeps its
    unknown and unallocated hours and holds the rest of its share as ``shared_unattributed``. None when no GPU is
    shared."""
    cut = split(fleet, values, columns, extra)
    if cut is None:
        return None
    out, by, rest = cut
    kept = ("unknown", "unallocated", "shared_unattributed")
    for sfx in suffixes:
        moved = sum(out[p + sfx][rest] for p in PARTS if p not in kept)
        out["shared_unattributed" + sfx][rest] += moved
        for p in PARTS:
            if p not in kept:
                out[p + sfx][rest] = 0.0
    return out, by, rest


def part_hours(fleet: Fleet, parts: dict[str, np.ndarray], by: str | None = None) -> pd.DataFrame:
    """GPU-hours per part (``<part>_gpu_hours`` columns), for the fleet (one row) or per ``by`` column
    (allocated rows only, the unallocated capacity is nobody's); shared GPUs split among their holders."""
    fr = fleet.frame
    w = fr["gpu_share"].to_numpy(dtype=np.float64) * (fleet.step / 3600.0)
    values = {f"{k}_gpu_hours": v * w for k, v in parts.items()}
    cut = split_parts(fleet, values, () if by is None else (by,))
    if cut is not None:
        table = pd.DataFrame(cut[0])
        if by is None:
            return pd.DataFrame([table.sum()])
        return table.groupby(pd.Series(cut[1][by], name=by), dropna=True, sort=True).sum()
    table = pd.DataFrame(values, index=fr.index)
    if by is None:
        return pd.DataFrame([table.sum()])
    return table.groupby(fr[by], observed=True, sort=True).sum()


def _totals(table: pd.DataFrame) -> pd.DataFrame:
    """Adds the waste/normal/attainable sums to a table of ``<part>_gpu_hours`` columns."""
    for name, parts in (("waste", WASTE), ("normal", NORMAL), ("attainable", ATTAINABLE)):
        table[f"{name}_gpu_hours"] = sum(table[f"{p}_gpu_hours"] for p in parts)
    return table


@dataclass
class Partition:
    """The partition's GPU-hours for the fleet and per job and namespace (allocated rows)."""

    #: "<part>_gpu_hours" for each of PARTS, plus waste/normal/attainable_gpu_hours.
    fleet: dict[str, float]
    job: pd.DataFrame
    namespace: pd.DataFrame
    #: Which of the detectors the partition reads did not run (their waste is not split out).
    notes: list[str] = field(default_factory=list)


def partition(fleet: Fleet, scores: Scores, findings: Sequence[Finding], site: SiteConfig | None = None,
              ran: Sequence[str] | None = None) -> Partition:
    """The partition's totals. ``ran``: the finding kinds that were run (default: all of them)."""
    parts, _, _ = row_parts(fleet, scores, findings, site)
    fleet_row = _totals(part_hours(fleet, parts)) if len(fleet.frame) else _totals(
        pd.DataFrame([dict.fromkeys((f"{p}_gpu_hours" for p in PARTS), 0.0)]))
    tables = {by: _totals(part_hours(fleet, parts, by)) if by in fleet.frame.columns else pd.DataFrame()
              for by in ("job", "namespace")}
    missing = [k for k in (STRAGGLER, IDLE_MASKING) if ran is not None and k not in ran]
    notes = [f"{', '.join(missing)} not run: straggler wait and masked hours are not split out of the rest"] \
        if missing else []
    return Partition({k: float(v) for k, v in fleet_row.iloc[0].items()}, tables["job"], tables["namespace"], notes)


def attach(scores: Scores, fleet: Fleet, findings: Sequence[Finding], site: SiteConfig | None = None,
           ran: Sequence[str] | None = None) -> Scores:
    """Sets ``scores.partition`` (summaries, job tables and the API read it from there) and returns scores."""
    scores.partition = partition(fleet, scores, findings, site, ran)
    return scores
