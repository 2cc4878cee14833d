"""Idle masking: GPU utilization says "busy" while the SMs mostly are not.

GPU utilization (nvidia-smi GPU-Util, DCGM_FI_DEV_GPU_UTIL) is the fraction of time *a*
kernel was resident, however little of the chip it used. SM activity is the fraction of
SMs with a warp resident: the work actually done. A job at 95% util and 20% SM activity
(memory-bound kernels, tiny batches) looks saturated on every dashboard while 80% of the
compute it holds sits idle. Thresholds (all configurable, see the fields):

- ``util_min`` 0.9: masking matters when util claims the GPU is (nearly) full. Busy GPUs
  report ~0.95-0.97 (AcmeTrace busy median ~95%); below 0.9 util itself already shows
  headroom, so no one is misled.
- ``sm_max`` 0.3: healthy busy GPUs show SM ~0.6 (AcmeTrace), 0.57-0.78 for compute-bound
  training in the simulator; memory-bound kernels sit near 0.2. 0.3 is half the healthy
  level and leaves 0.1 of margin above memory-bound jobs.
- ``min_duration_s`` 300 (5 min, gaps of up to 2 steps tolerated): a phase (checkpoint,
  evaluation, data reshuffle) is not a property of the job.

Not idle masking, although util is high and SM low (their owners are other detectors and
"profile your kernels" would be the wrong advice):

- *stalled* (``sm_active <= stalled_sm`` 0.1 and DRAM not above ``stalled_dram`` 0.1, or
  unknown): a kernel spins and nothing moves, the signature of a collective waiting for a
  peer that died or hung (gang members of a lost GPU: util ~0.97, SM ~0.05, DRAM ~0.02).
  Memory-bound kernels keep DRAM busy (>= 0.5) and are never "stalled".
- *waiting for a peer*: at the same instant another device of the same job has
  ``sm_active >= peer_busy_sm`` 0.5 (computing normally), unless the job's members are
  shown not to communicate (analyzer.detectors._peers.communicating: independent replicas
  sharing a workload name never wait at a barrier). Data-parallel members run the
  same kernels, so a memory-bound job is low-SM on every member; members that sit at
  SM 0.28-0.4 while one peer computes are waiting at the barrier for a straggler
  (throttled, power-capped, input-starved, WAN-split peers) and belong to the straggler
  finding.

Without SM activity (dcgm-exporter's default counters do not collect it) the detector
falls back to a memory-bound proxy, reported with confidence "low": util >= ``util_min``,
tensor-core activity <= ``fallback_tensor_max`` 0.05 and DRAM activity >=
``fallback_dram_min`` 0.5. Memory-bound kernels drive DRAM bandwidth hard (0.75-0.8 in the
simulator) and leave tensor pipes idle; compute-bound training shows tensor ~0.2 and DRAM
~0.3 (AcmeTrace), barrier waits and hangs DRAM <= 0.2. The proxy cannot see latency-bound
(small-kernel) masking, hence "low". MIG instances report no GPU util; DCGM's GR engine
activity (the same "a kernel is resident" time, per instance) stands in for it
(``gpu_busy``). Rows with neither are unknown, never flagged: no util, nothing masked.

In ``serve`` an episode that opens the window and continues one the previous run showed keeps its start,
duration and GPU-hours (``EarlierRuns``, ``carried_totals``), as a whole-history analysis reports it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzer.analysis.episodes import (
    MAX_UNKNOWN_S,
    EarlierRuns,
    carried_totals,
    column,
    find_episodes,
    format_duration,
)
from analyzer.data.frame import Fleet
from analyzer.detectors import Paging, gpu_busy, register
from analyzer.detectors._peers import communicating
from analyzer.findings import IDLE_MASKING, Finding


@register
@dataclass
class IdleMasking:
    """Settings: see the module docstring; ``max_gap_steps``/``max_unknown_steps``/``max_unknown_s`` as in
    analyzer.analysis.episodes (one healthy scrape does not split a problem; scrape gaps of up to
    ``max_unknown_s`` 300 s, whatever the step, neither split it nor restart its timer, and are not
    counted as its evidence)."""

    kind = IDLE_MASKING
    paging = Paging(alert="GpuIdleMasking", team="finops", severity="warning", hold_s=1800.0,
                    summary="GPU busy in nvidia-smi but its SMs mostly idle: ",
                    says="reports high GPU utilization while its SMs are mostly idle ({score}): the job pays for a "
                         "whole GPU and uses a fraction of it.")
    util_min: float = 0.9
    sm_max: float = 0.3
    stalled_sm: float = 0.1
    stalled_dram: float = 0.1
    peer_busy_sm: float = 0.5
    fallback_tensor_max: float = 0.05
    fallback_dram_min: float = 0.5
    min_duration_s: float = 300.0
    max_gap_steps: int = 2
    max_unknown_steps: int = 2
    max_unknown_s: float = MAX_UNKNOWN_S
    remembers = True  #: a service's runs carry each GPU's episode (``carried_totals``): its start and hours

    def condition(self, fleet: Fleet) -> tuple[np.ndarray, np.ndarray]:
        """Per row: 1/0/NaN idle masking, and whether the row was judged by the fallback proxy."""
        u, sm = gpu_busy(fleet), column(fleet, "sm_active")
        ten, dram = column(fleet, "tensor_active"), column(fleet, "dram_active")
        busy = u >= self.util_min
        # Primary: SM activity known.
        sm_known = ~np.isnan(sm)
        stalled = (sm <= self.stalled_sm) & ~(dram > self.stalled_dram)
        waiting = self._peer_busy(fleet, sm)
        primary = busy & (sm <= self.sm_max) & ~stalled & ~waiting
        # Fallback: memory-bound proxy from tensor and DRAM activity.
        fb_known = ~np.isnan(ten) & ~np.isnan(dram)
        fallback = busy & (ten <= self.fallback_tensor_max) & (dram >= self.fallback_dram_min)
        cond = np.full(len(u), np.nan)
        use_fb = ~sm_known & fb_known
        cond[sm_known] = primary[sm_known]
        cond[use_fb] = fallback[use_fb]
        cond[np.isnan(u)] = np.nan  # no util reported: nothing can be masked, and we do not know
        return cond, use_fb

    def _peer_busy(self, fleet: Fleet, sm: np.ndarray) -> np.ndarray:
        """Rows whose job has a device computing normally (SM >= peer_busy_sm) at the same time, in jobs
        whose members may talk: replicas shown not to communicate (analyzer.detectors._peers.communicating:
        a StatefulSet's independent servers) never wait for each other."""
        f = fleet.frame
        if "job" not in f.columns or not len(f):
            return np.zeros(len(f), bool)
        peak = pd.Series(sm).groupby([f["job"].to_numpy(), f["timestamp"].to_numpy()], sort=False).transform("max")
        out = (peak.to_numpy(dtype=np.float64, na_value=np.nan) >= self.peer_busy_sm) & f["job"].notna().to_numpy()
        if out.any():
            apart = [j for j, c in communicating(fleet, busy=gpu_busy(fleet)).items() if c.communicating is False]
            out &= ~f["job"].isin(apart).to_numpy()
        return out

    def detect(self, fleet: Fleet, memory: dict | None = None) -> list[Finding]:
        """Findings of the data; ``memory``: the service's part for this kind (earlier runs' episodes)."""
        cond, use_fb = self.condition(fleet)
        eps = find_episodes(fleet, cond, max_gap_steps=self.max_gap_steps, max_unknown_steps=self.max_unknown_steps,
                            max_unknown_s=self.max_unknown_s,
                            min_duration_s=self.min_duration_s)
        if not len(eps):
            return []
        means = {s: eps.mean(column(fleet, s)) for s in ("gpu_util", "gr_active", "sm_active", "tensor_active",
                                                         "dram_active")}
        busy = eps.mean(gpu_busy(fleet))
        low = eps.mean(use_fb.astype(np.float64)) > 0.5
        out = []
        gap = max(self.max_gap_steps * fleet.step, self.max_unknown_s)
        runs = EarlierRuns(memory)
        for i, ep in enumerate(eps.table.itertuples(index=False)):
            u = float(busy[i])  # GPU util, or GR engine activity where util is not reported (MIG)
            sm, ten, dram = (float(means[s][i]) for s in ("sm_active", "tensor_active", "dram_active"))
            ep, totals = carried_totals(runs, ep, fleet, gap, hours=float(ep.gpu_hours))
            hours = totals["hours"]
            # Share of the held GPU-time that util reports busy but the SMs do not use (unknown without SM).
            masked = None if low[i] else hours * max(u - sm, 0.0)
            evidence = {
                "gpu_util": float(means["gpu_util"][i]), "gr_active": float(means["gr_active"][i]),
                "sm_active": None if low[i] else sm, "tensor_active": ten, "dram_active": dram,
                "minutes": float(ep.duration_s) / 60.0, "gpu_hours": hours, "gpu_hours_masked": masked,
                "signal": "tensor_active+dram_active" if low[i] else "sm_active",
            }
            out.append(Finding(
                kind=self.kind, severity="info", summary=self._summary(ep, u, sm, ten, dram, hours, masked),
                start=float(ep.start), end=None if ep.open else float(ep.end),
                # Fraction of the reported utilization that is idle SMs; a flat 0.5 when SM is unknown.
                score=0.5 if low[i] else float(np.clip((u - sm) / max(u, 1e-9), 0.0, 1.0)),
                hostname=ep.hostname, gpu=int(ep.gpu) if ep.gpu and str(ep.gpu).isdigit() else None, uuid=ep.uuid,
                gpu_instance=ep.gpu_instance or None, job=ep.job, namespace=ep.namespace, pod=ep.pod,
                rack=ep.rack or None, confidence="low" if low[i] else "high", evidence=evidence,
            ))
        return out

    @staticmethod
    def _summary(ep: object, u: float, sm: float, ten: float, dram: float, hours: float,
                 masked: float | None) -> str:
        who = f"job {ep.job}" if getattr(ep, "job", None) else "the workload"
        dur = format_duration(float(ep.duration_s))
        if masked is None:
            return (f"GPU reports {u:.0%} utilization but tensor cores are only {ten:.0%} busy while DRAM is "
                    f"{dram:.0%} busy for {dur} ({hours:.1f} GPU-hours): {who} looks memory-bound (SM activity is "
                    f"not collected; enable DCGM_FI_PROF_SM_ACTIVE to confirm): profile it and batch more or fuse "
                    f"kernels.")
        bound = f"memory-bound (DRAM {dram:.0%} busy)" if dram >= 0.5 else "bound by small or latency-limited kernels"
        return (f"GPU reports {u:.0%} utilization but SMs are only {sm:.0%} busy for {dur}: {who} is {bound} and "
                f"~{masked:.1f} GPU-hours of compute sit idle behind the util number; profile it (Nsight Compute) "
                f"and batch more, fuse kernels or raise arithmetic intensity.")
