"""What holds each job or GPU back, per time window: one class with the evidence behind it.

Classes and thresholds, each justified by the calibration (AcmeTrace: busy GPUs report ~95%
GPU util with ~60% SM activity and ~20% tensor activity; idle GPUs report ~0):

* ``idle``: busy < IDLE_UTIL (0.05). Nothing is launched; an allocated idle GPU is pure waste.
* ``input_bound``: IDLE_UTIL <= busy < BUSY_UTIL (0.80). Busy GPUs sit at ~95% kernel-resident
  time; below 80% the GPU has nothing queued a fifth of the time or more: its data loader,
  storage or request stream cannot keep it fed (SM activity in the busy part stays normal).
  Lightly loaded inference lands here too: it waits for requests, which is the same thing.
* ``compute_bound``: busy >= BUSY_UTIL and sm_active >= COMPUTE_SM (0.45 = 3/4 of the
  calibrated busy ~0.60): the SMs do hold warps most of the time, so the GPU is the limit.
* ``memory_bound``: busy and sm_active < COMPUTE_SM with dram_active >= MEMORY_DRAM (0.50): the
  HBM interface is active more than half the cycles (healthy training runs ~0.3) while most
  SMs are empty: kernels stall on memory bandwidth ("95% util, 20% SM").
* ``communication_bound``: busy and sm_active < COMPUTE_SM with DRAM quiet: kernels are resident
  but neither SMs nor memory work: NCCL kernels spinning at a barrier or moving data over
  NVLink/PCIe/network (a gang split over a WAN, or peers waiting for a slow member).
  nvlink_bps / pcie_bps are reported as evidence.

``busy`` is the kernel-resident fraction (gpu_util; gr_active on MIG instances, see
analyzer.analysis.scores). Without SM activity (dcgm-exporter defaults) a busy GPU is memory_bound if
dram_active >= MEMORY_DRAM with tensor_active < 0.10, compute_bound if tensor_active >= 0.15
(~3/4 of the calibrated busy tensor level), else unknown (NaN); such windows have
``confidence = "low"``.

A job's class per window comes from its members' classes, weighted by GPU-hours: the
majority class, except that when at least INPUT_SHARE (10%) of the job's GPU-hours are
input-bound the job is ``input_bound``: in a synchronous gang the starved members set the
pace and the others wait at the barrier (they look communication-bound, but the cause is
the input pipeline).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from analyzer.analysis.rows import FALLBACK_SM_PER_UTIL, HIGH, IDLE_UTIL, LOW, allocated_rows
from analyzer.data.frame import Fleet

BUSY_UTIL = 0.80
COMPUTE_SM = 0.45
MEMORY_DRAM = 0.50
#: Without SM activity: tensor activity that still proves compute, and that rules it out.
COMPUTE_TENSOR, LOW_TENSOR = 0.15, 0.10
INPUT_SHARE = 0.10

IDLE, INPUT, COMPUTE, MEMORY, COMM = "idle", "input_bound", "compute_bound", "memory_bound", "communication_bound"
CLASSES: tuple[str, ...] = (COMPUTE, MEMORY, COMM, INPUT, IDLE)
CLASS_DTYPE = pd.CategoricalDtype(list(CLASSES))
DEVICE_KEYS: tuple[str, ...] = ("uuid", "gpu_instance")
#: Evidence: window means of these signals (NaN where unknown).
EVIDENCE: tuple[str, ...] = (
    "gpu_util", "sm_active", "tensor_active", "dram_active", "nvlink_bps", "pcie_bps", "power",
)


def classify(busy: np.ndarray, sm: np.ndarray, dram: np.ndarray, tensor: np.ndarray) -> np.ndarray:
    """Class code per element (index into CLASSES, -1 = unknown) from window means."""
    sm_idle = sm < IDLE_UTIL * FALLBACK_SM_PER_UTIL
    conds = [
        busy < IDLE_UTIL,
        busy < BUSY_UTIL,
        # busy >= BUSY_UTIL from here on, or busy unknown
        sm >= COMPUTE_SM,
        ~np.isnan(busy) & (sm < COMPUTE_SM) & (dram >= MEMORY_DRAM),
        ~np.isnan(busy) & (sm < COMPUTE_SM),
        # no SM activity: the low-confidence rules
        ~np.isnan(busy) & np.isnan(sm) & (dram >= MEMORY_DRAM) & (tensor < LOW_TENSOR),
        ~np.isnan(busy) & np.isnan(sm) & (tensor >= COMPUTE_TENSOR),
        np.isnan(busy) & sm_idle,
    ]
    idx = CLASSES.index
    choices = [idx(IDLE), idx(INPUT), idx(COMPUTE), idx(MEMORY), idx(COMM), idx(MEMORY), idx(COMPUTE), idx(IDLE)]
    return np.select(conds, choices, default=-1).astype(np.int8)


def _device_windows(fleet: Fleet, rows: pd.DataFrame, keys: list[str], window: float) -> pd.DataFrame:
    """Means of the evidence per (keys, window) plus GPU-hours, allocated share and SM coverage."""
    fr = fleet.frame
    n = len(fr)
    data: dict[str, object] = {}
    for s in EVIDENCE:
        data[s] = fr[s].to_numpy(np.float64) if s in fr.columns else np.full(n, np.nan)
    data["busy"] = rows["busy"].to_numpy()
    data["effective_util"] = rows["effective_util"].to_numpy()
    h = fr["gpu_share"].to_numpy(np.float64) * (fleet.step / 3600.0)
    data["gpu_hours"] = h
    data["allocated_share"] = allocated_rows(fr).astype(np.float64)
    vals = pd.DataFrame(data, index=fr.index)
    win = pd.Series(np.floor((fr["timestamp"].to_numpy() - fleet.start) / window).astype(np.int64),
                    index=fr.index, name="window")
    gb = vals.groupby([fr[k] for k in keys] + [win], observed=True, dropna=True, sort=True)
    out = gb.mean()
    out["gpu_hours"] = gb["gpu_hours"].sum()
    return out


def _finish(out: pd.DataFrame, fleet: Fleet, window: float) -> pd.DataFrame:
    out = out.reset_index()
    out.insert(out.columns.get_loc("window") + 1, "window_start", fleet.start + out["window"].to_numpy() * window)
    out.insert(out.columns.get_loc("window_start") + 1, "window_end", out["window_start"] + window)
    return out.drop(columns="window")


def bottlenecks(
    fleet: Fleet, rows: pd.DataFrame, by: Sequence[str] = ("job",), window: float = 300.0
) -> pd.DataFrame:
    """Bottleneck class per group (``("job",)`` or a device ``("uuid", "gpu_instance")``) and window.

    Windows are ``[start + k*window, start + (k+1)*window)``. Columns: the keys (device rows
    also carry hostname and gpu), ``window_start``, ``window_end``, ``bottleneck`` (one of
    CLASSES, NaN = unknown), ``confidence`` ("high" when SM activity was known), ``gpu_hours``,
    the evidence means (EVIDENCE, ``busy``, ``effective_util``), ``allocated_share``; job rows
    add ``members`` (devices) and ``share_<class>`` (GPU-hour share of members in each class).
    Device-level signals (power, NVLink, PCIe) on MIG instances are the parent GPU's.
    """
    by = list(by)
    device_level = set(DEVICE_KEYS) <= set(by)
    ident = [k for k in ("hostname", "gpu") if k in fleet.frame.columns and k not in by]
    keys = (ident + by) if device_level else by + [k for k in DEVICE_KEYS if k not in by]
    dev = _device_windows(fleet, rows, keys, window)
    codes = classify(dev["busy"].to_numpy(), dev["sm_active"].to_numpy(), dev["dram_active"].to_numpy(),
                     dev["tensor_active"].to_numpy())
    if device_level:
        dev.insert(0, "bottleneck", pd.Categorical.from_codes(codes, dtype=CLASS_DTYPE))
        dev.insert(1, "confidence", np.where(dev["sm_active"].notna(), HIGH, LOW))
        cols = ["bottleneck", "confidence", "gpu_hours", *EVIDENCE, "busy", "effective_util", "allocated_share"]
        return _finish(dev[cols], fleet, window)

    # Members -> group: GPU-hour-weighted means over members where a value is known.
    h = dev["gpu_hours"].to_numpy()
    group_keys = [*by, "window"]
    idx = dev.index.droplevel([k for k in dev.index.names if k not in group_keys])
    evid = [*EVIDENCE, "busy", "effective_util", "allocated_share"]
    x = dev[evid].to_numpy()
    known = ~np.isnan(x)
    parts = pd.DataFrame(np.where(known, x * h[:, None], 0.0), columns=evid, index=idx)
    for i, c in enumerate(evid):
        parts["_h_" + c] = np.where(known[:, i], h, 0.0)
    parts["gpu_hours"] = h
    parts["members"] = 1.0
    parts["_sm_hours"] = np.where(dev["sm_active"].notna(), h, 0.0)
    for k, name in enumerate(CLASSES):
        parts["share_" + name] = np.where(codes == k, h, 0.0)
    s = parts.groupby(level=group_keys, sort=True).sum()
    out = pd.DataFrame(index=s.index)
    hrs = s["gpu_hours"]
    shares = pd.DataFrame({"share_" + c: s["share_" + c] / hrs for c in CLASSES})
    classified = shares.sum(axis=1).to_numpy() > 0
    major = np.where(classified, shares.to_numpy().argmax(axis=1), -1)
    gated = (shares["share_" + INPUT] >= INPUT_SHARE) & (shares["share_" + IDLE] < 0.5)
    major = np.where(gated.to_numpy(), CLASSES.index(INPUT), major)
    out["bottleneck"] = pd.Categorical.from_codes(major.astype(np.int8), dtype=CLASS_DTYPE)
    out["confidence"] = np.where(s["_sm_hours"] >= 0.5 * hrs, HIGH, LOW)
    out["gpu_hours"] = hrs
    out["members"] = s["members"].astype(np.int64)
    with np.errstate(invalid="ignore", divide="ignore"):
        for c in evid:
            out[c] = (s[c] / s["_h_" + c]).where(s["_h_" + c] > 0)
    out = pd.concat([out, shares], axis=1)
    return _finish(out, fleet, window)
