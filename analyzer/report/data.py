"""The numbers behind the report's charts and tables, vectorized over the tidy frame.

Same weighting as analyzer.analysis.scores: a row weighs ``gpu_share`` GPUs over ``step`` seconds;
a mean is taken over the rows where the value is known (unknown rows are left out, never
counted as 0).
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from analyzer.analysis.rows import IDLE_UTIL, allocated_rows, mig_rows
from analyzer.analysis.scores import Scores
from analyzer.analysis.shares import holder_rows
from analyzer.data.frame import UNCARVED, Fleet, instance_rows

#: Most points a time-series chart draws; longer windows are averaged into wider buckets.
MAX_POINTS = 720
SERIES_COLUMNS = ("timestamp", "width", "reported_util", "effective_util", "masking_gap", "allocated_gpus")


def _signal(frame: pd.DataFrame, name: str) -> np.ndarray:
    if name in frame.columns:
        return frame[name].to_numpy(dtype=np.float64, na_value=np.nan)
    return np.full(len(frame), np.nan)


def timeseries(fleet: Fleet, scores: Scores, max_points: int = MAX_POINTS) -> pd.DataFrame:
    """Per time bucket over allocated devices: GPU-weighted mean reported util (gpu_util on
    whole GPUs), effective util, masking gap, and the mean number of allocated GPUs.

    Buckets are ``k`` steps wide (k = 1 unless the window holds more than ``max_points``
    steps); ``timestamp`` is the bucket start and ``width`` its length in seconds. A bucket
    where a value is unknown on every allocated device holds NaN.
    """
    fr = fleet.frame
    alloc = allocated_rows(fr)
    if not alloc.any() or fleet.step <= 0:
        return pd.DataFrame({c: pd.Series(dtype="float64") for c in SERIES_COLUMNS})
    steps = max(1, math.ceil((fleet.end - fleet.start) / fleet.step))
    k = max(1, math.ceil(steps / max_points))
    width = k * fleet.step
    ts = fr["timestamp"].to_numpy(np.float64)[alloc]
    bucket = fleet.start + np.floor((ts - fleet.start) / width) * width
    w = fr["gpu_share"].to_numpy(np.float64)[alloc]
    values = {
        "reported_util": np.where(mig_rows(fr), np.nan, _signal(fr, "gpu_util"))[alloc],
        "effective_util": scores.rows["effective_util"].to_numpy(np.float64)[alloc],
        "masking_gap": scores.rows["masking_gap"].to_numpy(np.float64)[alloc],
    }
    parts: dict[str, np.ndarray] = {"gpus": w}
    for key, x in values.items():
        known = ~np.isnan(x)
        parts["h_" + key] = np.where(known, w, 0.0)
        parts["s_" + key] = np.where(known, w * x, 0.0)
    sums = pd.DataFrame(parts).groupby(bucket, sort=True).sum()
    out = pd.DataFrame({"timestamp": sums.index.to_numpy(np.float64), "width": width})
    with np.errstate(invalid="ignore", divide="ignore"):
        for key in values:
            h = sums["h_" + key].to_numpy()
            out[key] = np.where(h > 0, sums["s_" + key].to_numpy() / np.where(h > 0, h, 1.0), np.nan)
    out["allocated_gpus"] = sums["gpus"].to_numpy() / k
    return out


def util_histogram(fleet: Fleet, scores: Scores, bins: int = 20) -> tuple[np.ndarray, np.ndarray, float, float]:
    """GPU-hours of allocated, busy devices (busy >= IDLE_UTIL) per effective-utilization bin.

    Returns (edges over [0, 1], GPU-hours per bin, total GPU-hours counted, their
    GPU-hour-weighted mean effective utilization or NaN). Rows with unknown effective
    utilization are not counted.
    """
    fr = fleet.frame
    eff = scores.rows["effective_util"].to_numpy(np.float64)
    busy = scores.rows["busy"].to_numpy(np.float64)
    keep = allocated_rows(fr) & (busy >= IDLE_UTIL) & ~np.isnan(eff)
    w = fr["gpu_share"].to_numpy(np.float64)[keep] * (fleet.step / 3600.0)
    heights, edges = np.histogram(eff[keep], bins=bins, range=(0.0, 1.0), weights=w)
    total = float(w.sum())
    mean = float(np.dot(w, eff[keep]) / total) if total > 0 else float("nan")
    return edges, heights, total, mean


def job_bottlenecks(scores: Scores) -> pd.DataFrame:
    """Dominant bottleneck class per job over the window: the class holding most GPU-hours.

    Columns: job, bottleneck, bottleneck_share (of the job's classified GPU-hours),
    bottleneck_confidence ("low" when most of those hours were classified without SM activity).
    """
    cols = ["job", "bottleneck", "bottleneck_share", "bottleneck_confidence"]
    bn = scores.bottlenecks.get("job")
    if bn is None or bn.empty or "bottleneck" not in bn.columns:
        return pd.DataFrame(columns=cols)
    bn = bn[bn["bottleneck"].notna()]
    if bn.empty:
        return pd.DataFrame(columns=cols)
    job = bn["job"].astype(str)
    cls = bn["bottleneck"].astype(str)
    hours = bn["gpu_hours"].astype(np.float64)
    per = hours.groupby([job, cls], sort=True).sum()
    total = per.groupby(level=0).sum()
    top = per.groupby(level=0).idxmax()
    low = hours.where(bn["confidence"].astype(str) == "low", 0.0).groupby(job).sum()
    out = pd.DataFrame({
        "job": total.index.to_numpy(),
        "bottleneck": [c for _, c in top.to_numpy()],
        "bottleneck_share": per.loc[list(top.to_numpy())].to_numpy() / total.to_numpy(),
        "bottleneck_confidence": np.where(low.reindex(total.index).to_numpy() > 0.5 * total.to_numpy(), "low", "high"),
    })
    return out


def namespace_pairs(frame: pd.DataFrame) -> pd.DataFrame:
    """The distinct (job, namespace) pairs of the frame's rows, as text, sorted."""
    if "job" not in frame.columns or "namespace" not in frame.columns:
        return pd.DataFrame({"job": pd.Series(dtype=object), "namespace": pd.Series(dtype=object)})
    pairs = frame.groupby(["job", "namespace"], observed=True, sort=True).size()
    pairs = pairs[pairs > 0].reset_index()
    return pd.DataFrame({"job": pairs["job"].astype(str).to_numpy(object),
                         "namespace": pairs["namespace"].astype(str).to_numpy(object)})


def job_namespaces(frame: pd.DataFrame) -> pd.Series:
    """job -> its namespaces, joined with ", " (most jobs have one)."""
    pairs = namespace_pairs(frame)
    return pairs.groupby("job", sort=True)["namespace"].agg(", ".join)


def job_table(fleet: Fleet, scores: Scores) -> pd.DataFrame:
    """One row per job (allocated hours only), worst first (most recoverable waste), with its
    namespace(s), dominant bottleneck class and its part of the GPU-hour partition."""
    jobs = scores.allocated.get("job")
    if jobs is None or jobs.empty:
        return pd.DataFrame(columns=["job", "namespace", "bottleneck", "bottleneck_share", "bottleneck_confidence"])
    jobs = jobs.copy()
    jobs["job"] = jobs["job"].astype(str)
    jobs["namespace"] = jobs["job"].map(job_namespaces(holder_rows(fleet, ("job", "namespace")))).fillna("")
    jobs = jobs.merge(job_bottlenecks(scores), on="job", how="left")
    split = ["waste_gpu_hours", "normal_gpu_hours", "unclassified_gpu_hours"]
    part = scores.partition.job if scores.partition is not None else pd.DataFrame()
    if part.empty:  # not split (no findings yet): unknown, never 0
        for c in split:
            jobs[c] = np.nan
    else:
        part = part[split].reset_index()
        part["job"] = part["job"].astype(str)
        jobs = jobs.merge(part, on="job", how="left")
    return jobs.sort_values(["waste_gpu_hours", "unused_gpu_hours", "allocated_gpu_hours", "job"],
                            ascending=[False, False, False, True], na_position="last", ignore_index=True)


def fleet_shape(fleet: Fleet) -> dict[str, object]:
    """Counts for the header: physical GPUs, devices (GPUs + MIG instances), nodes, models, sites."""
    fr = fleet.frame

    def distinct(col: str) -> int:
        return int(fr[col].nunique(dropna=True)) if col in fr.columns else 0

    models: dict[str, int] = {}
    if "model" in fr.columns and len(fr):
        per_gpu = fr.groupby(["hostname", "gpu"], observed=True, sort=False)["model"].first()
        models = {str(k): int(v) for k, v in per_gpu.astype(str).value_counts().sort_index().items()}
    real = fr.loc[~instance_rows(fr, UNCARVED)]  # a MIG GPU's uncarved capacity is no device
    devices = int(real.groupby(["hostname", "gpu", "gpu_instance"], observed=True).ngroups) if len(fr) else 0
    sites = sorted(str(s) for s in fr["site"].dropna().unique() if str(s)) if "site" in fr.columns else []
    return {
        "gpus": fleet.gpu_count(), "devices": devices, "nodes": distinct("hostname"),
        "models": models, "sites": sites,
    }
