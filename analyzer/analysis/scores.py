"""Effective-utilization scores: how much of each GPU really worked, per row and per level.

Why not GPU utilization? ``gpu_util`` (nvidia-smi GPU-Util, DCGM_FI_DEV_GPU_UTIL) is the
fraction of time *any* kernel was resident. A memory-bound kernel that keeps 5% of the SMs
busy, or an NCCL kernel spinning at a barrier, reports 100%. SM activity (the fraction of
cycles an SM has a warp resident, averaged over SMs) is the honest numerator. Calibration
(AcmeTrace, two production LLM clusters): busy GPUs report ~95% GPU util with ~60% SM
activity and ~20% tensor activity, so even healthy training "masks" ~35 points.

Per-row formulas (``row_scores``):

* ``clock_ratio = clip(sm_clock / sm_clock_max, 0, 1)``: SM activity is counted in *cycles*;
  a GPU throttled to 60% clock with 100% SM activity does 60% of the work it could. NaN
  when either clock is unknown (the ratio is then taken as 1 in the products below: we
  cannot see throttling, and we never invent a loss we did not measure).
* ``effective_util = clip(sm_active * clock_ratio, 0, 1)``, ``confidence = "high"``.
  MIG instance rows carry their own instance-level sm_active; their clocks are the parent
  GPU's (one clock per physical GPU), which is exactly the scaling they need.
* Fallback when SM activity is unknown (dcgm-exporter's default counter list does not
  collect DCGM_FI_PROF_SM_ACTIVE): ``effective_util = clip(max(K * busy, tensor_active) *
  clock_ratio, 0, 1)`` with ``K = FALLBACK_SM_PER_UTIL = 0.63`` (= 0.60 SM / 0.95 util of the
  calibration) and ``busy`` = the kernel-resident fraction (gpu_util, or gr_active on MIG
  instances and when gpu_util is missing). Tensor activity is a hard lower bound (tensor
  cycles are SM cycles). ``confidence = "low"``: this estimate cannot see idle masking,
  which is the very thing SM activity exists to reveal (it over-scores memory-bound and
  barrier-waiting jobs). With neither SM activity nor a busy proxy, tensor activity alone
  is used as a lower bound (still "low"). With nothing, effective_util and confidence are
  NaN: unknown, never 0.
* ``effective_tensor = clip(tensor_active * clock_ratio, 0, 1)`` (no fallback).
* ``masking_gap = gpu_util - sm_active``: the utilization the dashboard shows that no SM
  backs. NaN on MIG instance rows (nvidia-smi reports no per-instance GPU-Util; a parent
  value repeated there would compare a whole GPU against a slice) and whenever a side is
  unknown.

Aggregates (``aggregate``) are time-weighted: each row is the interval ``[t, t + step)`` of
``gpu_share`` of a GPU, i.e. ``w = step * gpu_share / 3600`` GPU-hours. Means are
``sum(w * x) / sum(w)`` over rows where ``x`` is known; the hours of rows with unknown
effective utilization are reported as ``unknown_gpu_hours``, never counted as 0.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analysis.bottleneck import bottlenecks
from analyzer.analysis.rows import CONFIDENCE, FALLBACK_SM_PER_UTIL, IDLE_UTIL, allocated_rows, mig_rows
from analyzer.analysis.shares import split
from analyzer.data.coverage import Coverage, coverage, coverage_unknown, observed_share
from analyzer.data.frame import Fleet
from analyzer.data.signals import ALLOCATION_COLUMNS

#: Named aggregation levels -> grouping columns. "gpu" is a device: a whole GPU or a MIG instance.
LEVELS: dict[str, tuple[str, ...]] = {
    "gpu": ("uuid", "gpu_instance"),
    "node": ("hostname",),
    "job": ("job",),
    "namespace": ("namespace",),
    "model": ("model",),
    "fleet": (),
}
#: Columns of every aggregate table after the grouping keys.
AGG_COLUMNS: tuple[str, ...] = (
    "gpu_hours", "allocated_gpu_hours", "unallocated_gpu_hours", "reported_util", "effective_util",
    "effective_tensor", "masking_gap", "effective_gpu_hours", "allocated_effective_gpu_hours",
    "unused_gpu_hours", "idle_gpu_hours", "unknown_gpu_hours", "low_confidence_share",
)
ROW_COLUMNS: tuple[str, ...] = (
    "busy", "clock_ratio", "effective_util", "effective_tensor", "masking_gap", "confidence", "observed",
)


def _col(frame: pd.DataFrame, name: str) -> np.ndarray:
    """A signal as float64 values; all-NaN when the input does not provide it (unknown)."""
    if name in frame.columns:
        return frame[name].to_numpy(dtype=np.float64, na_value=np.nan)
    return np.full(len(frame), np.nan)


def row_scores(fleet: Fleet) -> pd.DataFrame:
    """Per-row scores aligned with ``fleet.frame`` (same index); formulas in the module docstring.

    Columns: ``busy`` (kernel-resident fraction: gpu_util on whole GPUs, gr_active on MIG
    instances or when gpu_util is missing), ``clock_ratio``, ``effective_util``,
    ``effective_tensor``, ``masking_gap`` (floats, NaN = unknown), ``confidence``
    (categorical "high" | "low", NaN when nothing is known) and ``observed`` (the share of the
    row with data, 0..1: analyzer.data.coverage.observed_share).
    """
    fr = fleet.frame
    mig = mig_rows(fr)
    util, gr = _col(fr, "gpu_util"), _col(fr, "gr_active")
    sm, tensor = _col(fr, "sm_active"), _col(fr, "tensor_active")
    clk, clk_max = _col(fr, "sm_clock"), _col(fr, "sm_clock_max")
    with np.errstate(invalid="ignore", divide="ignore"):
        ratio = np.where(clk_max > 0, np.clip(clk / clk_max, 0.0, 1.0), np.nan)
    scale = np.where(np.isnan(ratio), 1.0, ratio)
    reported = np.where(mig, np.nan, util)
    # On a MIG instance only the instance's own engine activity says whether *it* is busy.
    busy = np.where(mig, gr, np.where(np.isnan(util), gr, util))

    sm_known = ~np.isnan(sm)
    estimate = np.fmax(FALLBACK_SM_PER_UTIL * busy, tensor)  # fmax: NaN only when both are NaN
    eff = np.clip(np.where(sm_known, sm, estimate) * scale, 0.0, 1.0)
    codes = np.where(sm_known, 0, np.where(np.isnan(estimate), -1, 1)).astype(np.int8)
    return pd.DataFrame(
        {
            "busy": busy,
            "clock_ratio": ratio,
            "effective_util": eff,
            "effective_tensor": np.clip(tensor * scale, 0.0, 1.0),
            "masking_gap": reported - sm,
            "confidence": pd.Categorical.from_codes(codes, dtype=CONFIDENCE),
            "observed": observed_share(fr),
        },
        index=fr.index,
    )


def _keys(by: str | Sequence[str]) -> list[str]:
    if isinstance(by, str):
        return list(LEVELS[by]) if by in LEVELS else [by]
    return list(by)


def _parts(fleet: Fleet, rows: pd.DataFrame) -> pd.DataFrame:
    """Per-row additive pieces (GPU-hours and GPU-hour-weighted sums) that every level sums.

    ``h_x`` = hours where x is known, ``s_x`` = sum of w * x; a mean is s_x / h_x.
    """
    fr = fleet.frame
    cap = fr["gpu_share"].to_numpy(dtype=np.float64) * (fleet.step / 3600.0)
    # What is measured weighs the share of the row that has data (an edge row of the data counts in part).
    w = cap * rows["observed"].to_numpy(dtype=np.float64)
    reported = np.where(mig_rows(fr), np.nan, _col(fr, "gpu_util"))
    out: dict[str, np.ndarray] = {"h": cap}
    for key, x in (
        ("rep", reported),
        ("eff", rows["effective_util"].to_numpy()),
        ("ten", rows["effective_tensor"].to_numpy()),
        ("gap", rows["masking_gap"].to_numpy()),
    ):
        known = ~np.isnan(x)
        out["h_" + key] = np.where(known, w, 0.0)
        out["s_" + key] = np.where(known, w * x, 0.0)
    out["h_obs"] = w
    out["h_low"] = np.where(rows["confidence"].cat.codes.to_numpy() == 1, w, 0.0)
    out["h_idle"] = np.where(rows["busy"].to_numpy() < IDLE_UTIL, w, 0.0)  # NaN < x is False
    return pd.DataFrame(out, index=fr.index)


def _grouped(fleet: Fleet, parts: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Sums of ``parts`` per (keys..., _allocated). Rows whose allocation key is NaN drop out
    (a job table lists jobs; unallocated hours are reported at the levels that hold them)."""
    fr = fleet.frame
    alloc = allocated_rows(fr)
    dropna = any(k in ALLOCATION_COLUMNS for k in keys)
    cut = split(fleet, {c: parts[c].to_numpy() for c in parts.columns}, keys, {"_allocated": alloc}) if dropna \
        else None
    if cut is not None:  # shared GPUs: each holder's entries by what it used (analyzer.analysis.shares)
        values, by, _ = cut
        groups = [pd.Series(by[k], name=k) for k in keys]
        groups.append(pd.Series(by["_allocated"].astype(bool), name="_allocated"))
        return pd.DataFrame(values).groupby(groups, dropna=True, sort=True).sum()
    groups = [fr[k] for k in keys] + [pd.Series(alloc, index=fr.index, name="_allocated")]
    return parts.groupby(groups, observed=True, dropna=dropna, sort=True).sum()


def _table(sums: pd.DataFrame, keys: list[str], allocated_only: bool) -> pd.DataFrame:
    """Aggregate table from the per-(keys, allocated) sums."""
    flag = sums.index.get_level_values("_allocated")
    cols = list(sums.columns)
    if keys:
        total = sums.groupby(level=keys, observed=True, sort=True).sum()
        al = sums[flag].droplevel("_allocated").reindex(total.index, fill_value=0.0)
    else:
        total = pd.DataFrame([sums.sum()], columns=cols)
        al = pd.DataFrame([sums[flag].sum()], columns=cols)
    if allocated_only:  # only the groups that held an allocation
        total = al = al[al["h"] > 0] if keys else al
    with np.errstate(invalid="ignore", divide="ignore"):
        def mean(s: pd.DataFrame, key: str) -> pd.Series:
            return (s["s_" + key] / s["h_" + key]).where(s["h_" + key] > 0)

        out = pd.DataFrame({
            "gpu_hours": total["h"],
            "allocated_gpu_hours": al["h"],
            # Seen with no workload; hours without data are unknown, never unallocated.
            "unallocated_gpu_hours": total["h_obs"] - al["h_obs"],
            "reported_util": mean(total, "rep"),
            "effective_util": mean(total, "eff"),
            "effective_tensor": mean(total, "ten"),
            "masking_gap": mean(total, "gap"),
            "effective_gpu_hours": total["s_eff"],
            "allocated_effective_gpu_hours": al["s_eff"],
            # Allocated hours we *know* did no work (waste, headroom...: analyzer.analysis.partition splits them);
            # unknown hours are not in it, they are unknown.
            "unused_gpu_hours": al["h_eff"] - al["s_eff"],
            "idle_gpu_hours": al["h_idle"],
            # No data at all, or held by a workload whose effective utilization is unknown.
            "unknown_gpu_hours": (total["h"] - total["h_obs"]) + (al["h_obs"] - al["h_eff"]),
            "low_confidence_share": (total["h_low"] / total["h_eff"]).where(total["h_eff"] > 0),
        })
    out = out.reset_index(drop=not keys)
    return out[[*keys, *AGG_COLUMNS]]


def aggregate(
    fleet: Fleet, rows: pd.DataFrame, by: str | Sequence[str], *, allocated_only: bool = False
) -> pd.DataFrame:
    """Time-weighted scores per group: a level name of ``LEVELS`` or a list of frame columns.

    Each row weighs ``w = step * gpu_share / 3600`` GPU-hours (a 3g MIG slice for 15 s is
    3/7 * 15 / 3600). Per group (columns ``AGG_COLUMNS``):

    * ``gpu_hours`` = sum w (capacity); ``allocated_gpu_hours`` = sum w over rows with an
      allocation label; ``unallocated_gpu_hours`` = sum w over rows with data and no allocation;
    * ``reported_util``, ``effective_util``, ``effective_tensor``, ``masking_gap``: w-weighted
      means over the rows where the value is known (unknown rows are excluded, not zeroed);
    * ``effective_gpu_hours`` = sum w * effective_util (the GPU-hours of real SM work);
      ``allocated_effective_gpu_hours`` the same over allocated rows;
    * ``unused_gpu_hours`` = allocated hours with known effective_util minus the effective
      GPU-hours in them (allocated - effective, over what we can measure): recoverable waste,
      normal headroom and unclassified together (analyzer.analysis.partition tells them apart);
    * ``idle_gpu_hours`` = allocated hours whose GPU was idle (busy < IDLE_UTIL);
    * ``unknown_gpu_hours`` = hours without data, plus allocated hours whose effective_util is
      unknown (reported, never counted as 0 or as unallocated). Per group:
      ``allocated_effective + unused + unknown + unallocated = gpu_hours`` exactly;
    * ``low_confidence_share`` = share of the known hours scored by the fallback estimate.

    Rows whose allocation key (job, namespace, pod) is NaN are left out of that level's
    table: sum over jobs + unallocated = fleet. ``allocated_only`` keeps allocated rows only.
    """
    keys = _keys(by)
    return _table(_grouped(fleet, _parts(fleet, rows), keys), keys, allocated_only)


@dataclass
class Scores:
    """Everything ``compute_scores`` derives from one Fleet."""

    rows: pd.DataFrame
    #: level name -> aggregate over all GPUs (LEVELS).
    levels: dict[str, pd.DataFrame]
    #: level name -> aggregate over allocated rows only.
    allocated: dict[str, pd.DataFrame]
    #: "job" and "gpu" -> bottleneck class per window (analyzer.analysis.bottleneck).
    bottlenecks: dict[str, pd.DataFrame] = field(default_factory=dict)
    step: float = 0.0
    start: float = 0.0
    end: float = 0.0
    #: Why a score is weaker than it could be (e.g. SM activity not collected).
    notes: list[str] = field(default_factory=list)
    #: How much of the window has data (analyzer.data.coverage).
    coverage: Coverage = field(default_factory=coverage_unknown)
    #: The GPU-hour partition (analyzer.analysis.partition.attach, once the findings are known); None before.
    partition: Any = None


def compute_scores(fleet: Fleet, *, window: float = 300.0) -> Scores:
    """Row scores, every level's aggregates (all GPUs and allocated only) and bottlenecks."""
    rows = row_scores(fleet)
    parts = _parts(fleet, rows)
    levels, allocated = {}, {}
    for name, cols in LEVELS.items():
        keys = list(cols)
        sums = _grouped(fleet, parts, keys)
        levels[name] = _table(sums, keys, allocated_only=False)
        allocated[name] = _table(sums, keys, allocated_only=True)
    del parts
    cov = coverage(fleet.frame, fleet.step, rows["observed"].to_numpy(dtype=np.float64))
    notes = [m for m in (cov.message(),) if m]
    if not fleet.has("sm_active"):
        why = fleet.missing.get("sm_active", "SM activity is not in the input")
        notes.append(
            f"{why}: effective utilization is estimated as {FALLBACK_SM_PER_UTIL} x busy time (GPU util; "
            "GR engine activity on MIG instances) with low confidence; idle masking cannot be measured without it"
        )
    unclocked = [n for n, c in (("the SM clock", "sm_clock"), ("the max SM clock", "sm_clock_max")) if not fleet.has(c)]
    if unclocked:  # say which: dcgm-exporter's default counters carry the SM clock but not its max
        notes.append(f"{' and '.join(unclocked)} not collected: throttling cannot be counted as lost capacity")
    return Scores(
        rows=rows, levels=levels, allocated=allocated,
        bottlenecks={
            "job": bottlenecks(fleet, rows, by=("job",), window=window),
            "gpu": bottlenecks(fleet, rows, by=("uuid", "gpu_instance"), window=window),
        },
        step=fleet.step, start=fleet.start, end=fleet.end, notes=notes, coverage=cov,
    )


def _partition_summary(partition: Any) -> dict[str, Any]:
    """waste/normal/unclassified GPU-hours and every part, from the attached partition (None = not split)."""
    if partition is None:
        return {"waste_gpu_hours": None, "normal_gpu_hours": None, "unclassified_gpu_hours": None, "parts": None}
    f = partition.fleet
    return {
        "waste_gpu_hours": f["waste_gpu_hours"], "normal_gpu_hours": f["normal_gpu_hours"],
        "unclassified_gpu_hours": f["unclassified_gpu_hours"],
        "parts": {k.removesuffix("_gpu_hours"): v for k, v in f.items()},
    }


def fleet_summary(scores: Scores) -> dict[str, Any]:
    """The headline numbers the CLI prints: reported vs effective utilization and GPU-hours.

    ``reported_util``/``effective_util``/``masking_gap`` are over allocated GPUs (what the
    jobs got out of what they hold); ``fleet_*`` the same over every GPU, idle capacity included.
    """
    a = scores.allocated["fleet"].iloc[0]
    f = scores.levels["fleet"].iloc[0]

    def num(v: Any) -> float | None:
        v = float(v)
        return None if np.isnan(v) else v

    return {
        "start": scores.start,
        "end": scores.end,
        "reported_util": num(a["reported_util"]),
        "effective_util": num(a["effective_util"]),
        "effective_tensor": num(a["effective_tensor"]),
        "masking_gap": num(a["masking_gap"]),
        "fleet_reported_util": num(f["reported_util"]),
        "fleet_effective_util": num(f["effective_util"]),
        "gpu_hours": num(f["gpu_hours"]),
        "allocated_gpu_hours": num(f["allocated_gpu_hours"]),
        "effective_gpu_hours": num(f["allocated_effective_gpu_hours"]),
        "unused_gpu_hours": num(f["unused_gpu_hours"]),
        **_partition_summary(scores.partition),
        "idle_gpu_hours": num(f["idle_gpu_hours"]),
        "unallocated_gpu_hours": num(f["unallocated_gpu_hours"]),
        "unknown_gpu_hours": num(f["unknown_gpu_hours"]),
        "low_confidence_share": num(f["low_confidence_share"]),
        "coverage": scores.coverage.as_dict(),
        "notes": list(scores.notes) + (list(scores.partition.notes) if scores.partition is not None else []),
    }
