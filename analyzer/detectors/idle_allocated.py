"""Idle but allocated: a pod/job holds a GPU (or MIG instance) and does not use it.

The GPU is unavailable to every other job and does no work: forgotten notebooks, a
service scaled for a peak that never comes, a job stuck before its first kernel.
Unallocated idle GPUs are spare capacity, not this finding (rows without a job are
False). Thresholds (configurable fields):

- ``util_max`` 0.05 and ``sm_max`` 0.05, each applied where the signal is known (MIG
  instances report no GPU util; DCGM's GR engine activity stands in, see ``gpu_busy``;
  one of the two signals must be known): an idle GPU reports
  0, and 5% leaves room for monitoring/housekeeping kernels; the lightest real load in
  the simulator (inference at its diurnal minimum) stays >= 0.12 util and >= 0.09 SM.
- Fallback when neither is known: tensor activity <= ``fallback_tensor_max`` 0.01 and
  DRAM activity <= ``fallback_dram_max`` 0.05, confidence "low" (idle DRAM reads ~0.002;
  real kernels move memory). It cannot tell a spinning (hung) kernel from an idle GPU.
- ``min_duration_s`` 1800 (30 min): shorter idle stretches are start-up, checkpointing or
  a user between two runs; holding a GPU idle for half an hour is a decision to act on. The
  timer runs on through a bridged scrape gap (up to ``max_unknown_s`` of it counts; the gap's
  hours stay unknown): serve analyzes 30 minutes, so a 2-minute gap anywhere in them left 28 known
  minutes, withdrew the finding for half an hour and brought it back under a new id.
- A GPU that went idle because an XID killed its process is a fault (gpu_fault), not the
  owner's waste: an episode that starts within ``fault_window_s`` 600 s of an XID event
  on the same physical GPU is dropped, and so is one on a GPU that shows a row remap pending for
  most of the episode: it awaits the reset a memory fault (XID 48/94/95, an uncorrectable ECC
  error) left it needing, which gpu_fault reports ("schedule a GPU reset"). ``serve`` sees this
  one: 30 minutes after the XID killed the process the event has left its window, the pending
  remap has not. dcgm-exporter's default counters carry no remap-pending field; there its last-XID
  gauge (``last_xid``) stands in: still showing such an XID for most of the episode, the GPU has not
  been reset since (``nvidia-smi -r`` needs every process off the GPU, DCGM's too, and a restarted
  exporter shows no XID until the next one). A pod that got the GPU without a reset and sits idle
  is then missed until the exporter restarts; a reset GPU handed out again is not.

In ``serve`` an episode that opens the window and continues one the previous run showed keeps its start,
duration and idle GPU-hours (``EarlierRuns``, ``carried_totals``): a notebook idle for hours reads so, and its
score grows with them, as in a whole-history analysis, not "idle for 30 min" for ever.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzer.analysis.episodes import (
    MAX_UNKNOWN_S,
    EarlierRuns,
    Episodes,
    carried_totals,
    column,
    find_episodes,
    format_duration,
)
from analyzer.analysis.xid import RESET_PENDING_XIDS
from analyzer.data.frame import Fleet
from analyzer.detectors import Paging, gpu_busy, register
from analyzer.findings import IDLE_ALLOCATED, Finding


@register
@dataclass
class IdleAllocated:
    """Settings: see the module docstring; ``max_gap_steps``/``max_unknown_steps``/``max_unknown_s`` as in
    analyzer.analysis.episodes (one healthy scrape does not split a problem; scrape gaps of up to
    ``max_unknown_s`` 300 s, whatever the step, neither split it nor restart its timer, and are not
    counted as its evidence)."""

    kind = IDLE_ALLOCATED
    paging = Paging(alert="GpuIdleAllocated", team="finops", severity="warning", hold_s=1800.0,
                    summary="Allocated GPU idle: ",
                    says="is allocated but idle ({score}): release it or fix the job's input pipeline.")
    util_max: float = 0.05
    sm_max: float = 0.05
    fallback_tensor_max: float = 0.01
    fallback_dram_max: float = 0.05
    min_duration_s: float = 1800.0
    fault_window_s: float = 600.0
    max_gap_steps: int = 2
    max_unknown_steps: int = 2
    max_unknown_s: float = MAX_UNKNOWN_S
    remembers = True  #: a service's runs carry each held GPU's episode (``continued``): its start and idle hours

    def condition(self, fleet: Fleet) -> tuple[np.ndarray, np.ndarray]:
        """Per row: 1/0/NaN idle-while-allocated, and whether the fallback proxy decided it."""
        u, sm = gpu_busy(fleet), column(fleet, "sm_active")  # util, or GR engine activity (MIG)
        ten, dram = column(fleet, "tensor_active"), column(fleet, "dram_active")
        u_known, sm_known = ~np.isnan(u), ~np.isnan(sm)
        primary = (~u_known | (u <= self.util_max)) & (~sm_known | (sm <= self.sm_max))
        fallback = (ten <= self.fallback_tensor_max) & (dram <= self.fallback_dram_max)
        use_fb = ~u_known & ~sm_known & ~np.isnan(ten) & ~np.isnan(dram)
        cond = np.full(len(u), np.nan)
        known = u_known | sm_known
        cond[known] = primary[known]
        cond[use_fb] = fallback[use_fb]
        if "job" in fleet.frame.columns:
            cond[fleet.frame["job"].isna().to_numpy()] = 0.0  # unallocated: capacity, not waste by an owner
        else:
            cond[:] = 0.0
        return cond, use_fb

    def _after_fault(self, fleet: Fleet, eps: Episodes) -> np.ndarray:
        """Episodes starting within fault_window_s of an XID on the same physical GPU."""
        ev, t = fleet.events, eps.table
        out = np.zeros(len(t), bool)
        if ev is None or not len(ev) or not len(t):
            return out
        times = pd.DataFrame({"hostname": ev["hostname"].astype(str), "gpu": ev["gpu"].astype(str),
                              "t": ev["timestamp"].astype(float)})
        by_gpu = {k: np.sort(g["t"].to_numpy()) for k, g in times.groupby(["hostname", "gpu"], sort=False)}
        for i, (host, gpu, start) in enumerate(zip(t["hostname"], t["gpu"], t["start"], strict=True)):
            ts = by_gpu.get((str(host), str(gpu)))
            if ts is not None:
                out[i] = bool(np.any(np.abs(ts - start) <= self.fault_window_s))
        return out

    def detect(self, fleet: Fleet, memory: dict | None = None) -> list[Finding]:
        """Findings of the data; ``memory``: the service's part for this kind (earlier runs' episodes)."""
        cond, use_fb = self.condition(fleet)
        eps = find_episodes(fleet, cond, max_gap_steps=self.max_gap_steps, max_unknown_steps=self.max_unknown_steps,
                            max_unknown_s=self.max_unknown_s, timer_unknown_s=self.max_unknown_s,
                            min_duration_s=self.min_duration_s)
        if not len(eps):
            return []
        last_xid = column(fleet, "last_xid")
        awaiting = np.where(np.isnan(last_xid), np.nan, np.isin(last_xid, sorted(RESET_PENDING_XIDS)))
        fault = (self._after_fault(fleet, eps) | (eps.mean(column(fleet, "row_remap_pending")) >= 0.5)
                 | (eps.mean(awaiting) >= 0.5))
        u, gr, sm = (eps.mean(column(fleet, s)) for s in ("gpu_util", "gr_active", "sm_active"))
        low = eps.mean(use_fb.astype(np.float64)) > 0.5
        out = []
        gap = max(self.max_gap_steps * fleet.step, self.max_unknown_s)
        runs = EarlierRuns(memory)
        for i, ep in enumerate(eps.table.itertuples(index=False)):
            if fault[i]:
                continue
            ep, totals = carried_totals(runs, ep, fleet, gap, hours=float(ep.gpu_hours))
            hours = totals["hours"]
            evidence = {
                "gpu_hours_idle": hours, "minutes": float(ep.duration_s) / 60.0,
                "gpu_util": float(u[i]), "gr_active": float(gr[i]), "sm_active": float(sm[i]),
                "gpu_share": float(ep.gpu_share),
                "pod": ep.pod, "namespace": ep.namespace, "job": ep.job,
                "signal": "tensor_active+dram_active" if low[i] else "gpu_util+sm_active",
            }
            out.append(Finding(
                kind=self.kind, severity="warning", summary=self._summary(ep, hours),
                start=float(ep.start), end=None if ep.open else float(ep.end),
                # Saturates with the waste: a GPU-workday (8 GPU-hours) held idle scores ~0.63, a week ~1.
                score=float(1.0 - np.exp(-hours / 8.0)),
                hostname=ep.hostname, gpu=int(ep.gpu) if ep.gpu and str(ep.gpu).isdigit() else None, uuid=ep.uuid,
                gpu_instance=ep.gpu_instance or None, job=ep.job, namespace=ep.namespace, pod=ep.pod,
                rack=ep.rack or None, confidence="low" if low[i] else "high", evidence=evidence,
            ))
        return out

    @staticmethod
    def _summary(ep: object, hours: float) -> str:
        owner = f"pod {ep.namespace}/{ep.pod}" if ep.pod else f"job {ep.job}"
        if ep.pod and ep.job:
            owner += f" (job {ep.job})"
        what = f"MIG instance {ep.gpu_instance} ({ep.mig_profile}) of GPU" if ep.gpu_instance else "GPU"
        still = "has held" if ep.open else "held"
        return (f"{owner} {still} {what} {ep.hostname}/{ep.gpu} idle for {format_duration(float(ep.duration_s))} "
                f"({hours:.1f} GPU-hours): release it (stop the notebook, scale the deployment down) so other "
                f"jobs can use it.")
