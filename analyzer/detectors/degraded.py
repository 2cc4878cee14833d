"""Degraded GPU: a GPU that still works but worse than its peers at the same load (soft anomalies).

Hard faults (XID, ECC, fallen off the bus, link errors) are ``gpu_fault``; a GPU that
thermally throttles is ``thermal``. What is left is a GPU that runs hotter, burns more
power or clocks lower than identical GPUs doing the same work: failing thermal paste or
fan, a leaky or aging part, HBM running hot, a power limit someone lowered. Raw levels
say nothing here (a busy GPU is hotter than an idle one, a memory-bound job draws power
with SMs idle), so every feature is *load-adjusted* and *peer-relative*:

Features, per physical GPU (uuid) and window (``window_s``, aggregates, never raw rows):

- ``temp_excess`` (C): residual of die temperature ~ power (robust linear fit per GPU
  model: die = inlet + R x power, on windows off the throttle), minus the median residual of the GPUs of the same
  model on the same node (they share the inlet air, which no exporter reports).
- ``mem_temp_excess`` (C): residual of HBM temperature ~ die temperature + DRAM activity,
  minus the node peers' median: HBM hotter than its own die and load explain.
- ``power_excess`` (ratio): power / power predicted from activity (GPU util or GR engine,
  SM, tensor and DRAM activity; robust linear fit per model) - 1: more watts for the
  same work; judged in busy windows only (at idle there is no work to be inefficient at).
  SM and tensor activity enter per second of work (x SM clock / max clock): they count cycles, so at a
  lower clock the same work fills more of them at less power, and a fleet with throttled GPUs (a failing
  rack) would otherwise tilt the fit and read its full-clock GPUs as drawing too much (4 false findings
  at rack-cooling seed +1006 once the simulator's memory traffic stopped growing with a lower clock).
- ``power_deficit`` (ratio): the mirror of ``power_excess``, 1 - power / predicted power,
  against the fleet-wide fit *and* the job peers (the smaller counts): a GPU drawing a fifth
  to a third less than identical GPUs doing the same work at the same util, SM activity and
  clock has a failing VRM or power sensor, or a power/clock limit set low. The fit over
  activity is the "same load band" peer group (GPUs of the model at the same load), the job
  the "same job" group. Busy windows only, and not while the GPU's own power cap binds
  (``sw_power_cap``): a GPU held at its limit draws less than its activity asks by design,
  and a limit below its peers' is ``cap_deficit``; where the clock-event reasons are not
  collected (dcgm-exporter's defaults) a capped GPU reads as a deficit, which it is.
  Healthy chips differ: leakage spreads dynamic power up to ~+/-10% within one model (fleet
  studies report ~20% spreads), so the floor is ``power_deficit`` 0.15 (the fault is 20-33%);
  a deficit that a leaky chip hides under the floor is still found as a shift below its own
  earlier level (``power_shift``, both directions).
- ``clock_deficit`` (ratio): 1 - (SM clock / max SM clock while busy) relative to the
  model's median: clocks held down without a thermal reason.
- ``cap_deficit`` (ratio): 1 - power limit / the model's median power limit: a limit
  lowered below its peers (``nvidia-smi -pl``); configuration, so not noise-gated.

Peers: besides the fleet-wide fit, each feature is compared to the GPU's node peers
(temperatures) and job peers (all features) and the *smallest* excess counts: a GPU is
off only when it is off against every peer group it has. A whole memory-bound job, or a
whole node with a warm inlet, shifts its own peers' median too and is never flagged.
Groups need ``min_peers`` GPUs (the GPU included); a GPU with no node and no job peer
group has no verdict on temperatures (inlet unknown). A GPU model with fewer than
``min_model_gpus`` GPUs gets no verdict at all (noted in ``fleet.notes``): a fleet-wide
"normal" from one or two GPUs would call their own quirks normal or abnormal at random.

Model: per GPU model a :class:`sklearn.covariance.MinCovDet` (robust location/scatter,
breakdown ~50%) on the soft features scaled by their floors; it is fitted on the fleet
itself, so up to ~half the GPUs may be bad without masking the outliers (the regressions
before it are Huber fits, the peer baselines medians, all robust the same way). "The fleet"
of the fits, medians and gate is its reference hosts (analyzer.data.reference: every host up
to 64 per model), and every GPU is judged against them. A window
counts when its robust Mahalanobis distance exceeds the chi^2 ``outlier_quantile`` *and*
a feature's excess passes its practical floor (statistically and practically off).

A GPU's own behaviour: a GPU that always ran 4 C cool and now runs 7 C hot is under the
peer floor but 11 C hotter than itself. Per GPU and feature (temperatures, power, clock) the best
single change point of its window series (max standardized mean shift, with
``baseline_windows`` before it) gives its own earlier level; windows after it count as off
when they rise ``*_shift`` over that level while above half the floor vs peers. Temperatures
are followed relative to the GPU's node (same inlet air) where it has node peers: relative to
job peers in another rack, a rack cooling failure and its recovery moved a healthy GPU's level
by 14 C (7 false findings on rack-cooling over 20 never-used seeds).

Change points in time: per GPU a one-sided CUSUM over windows of z = max(excess / floor,
shift / shift floor), counted only in windows that are off (z >= 1, level part not
ordinary by the MCD gate):
S = max(0, S + z - ``cusum_k``), alarm above ``cusum_h``. A window is degraded while the
alarm is on and the window itself is off; the run is extended back to the change point
(where S last left 0), so the finding starts when the shift started. Findings then need
``min_duration_s``.

In a service (``serve``, ``evaluate --replay``: 30-minute windows every minute) one window holds too little: the
alarm needs up to 4 windows at the floor, a finding 30 minutes, an own shift 20 minutes of level before the change.
Each run hands the state at the end of its first window (the CUSUM, where it left 0, the GPU's own earlier level
at its load) to the run that starts there (``_carried``), so the runs accumulate what a whole history holds.

Thermal throttling windows (thermal clock events, or die >= ``throttle_c``) have no
verdict here: the ``thermal`` detector owns them and the temperature there says nothing
about paste or fans. Missing signals are unknown: a feature whose signals are absent is
skipped (and named in the finding's evidence as unknown), never treated as 0.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.stats import chi2
from sklearn.covariance import MinCovDet

from analyzer.analysis.episodes import begun_earlier, column, find_episodes, format_duration
from analyzer.data.frame import Fleet
from analyzer.detectors import Paging, clock_max, gpu_busy, register
from analyzer.findings import DEGRADED_GPU, HOLD_SEVERITY_S, Finding
from analyzer.site import THRESHOLDS

#: Soft features scored by the MCD model, in order; cap_deficit is handled apart (configuration).
SOFT = ("temp_excess", "mem_temp_excess", "power_excess", "clock_deficit")
FEATURES = (*SOFT, "power_deficit", "cap_deficit")
#: Level features scored like the soft ones (gated by the MCD model, which sees power_excess in both directions).
LEVEL = (*SOFT, "power_deficit")
#: The power features: judged from ``power_busy_min`` and, where a GPU always had them, at ``static_floor``.
POWER = ("power_excess", "power_deficit")
#: The die temperature feature, whose floors scale with the window's power (``temp_load_min``).
TEMP = "temp_excess"
_ACTIVITY = ("busy", "sm_active", "tensor_active", "dram_active")
#: How far (|own - peers' median| / own power) a GPU's peers may run from its power for ``temp_load_min`` to
#: lower its floors: the linear fit's curvature between 65 W and its peers' 150-260 W read 6-7 C (multi-fault +6).
_PEER_POWER_BAND = 1.0 / 3.0
#: A warning holds in the service's next run while its score stays this high (it becomes one at 2): runs a
#: minute apart move a score by a few hundredths, and a GPU at 1.97-2.04 for an hour (degraded-gpus +8500,
#: replayed) outlasted the service's 15-minute severity hold (IdMemory): each crossing resolved the warning's
#: alert and started an info one.
_WARN_HOLD = 1.5
_MAX_FIT = 4000  # windows per model for the regressions (fixed-seed subsample): fit cost is flat in fleet size
#: The most windows a GPU's carried earlier level weighs (``_remember``): 2 hours, so it follows a GPU's slow drift
#: while a change of the last 30 minutes moves it by at most a quarter of the shift (it never takes the shifted
#: windows in anyway: they are after the change).
_BASELINE_WINDOWS = 12.0
#: Per shift feature: the load a carried earlier level must have been seen at (column, relative and absolute
#: tolerance, ``_same_load``). Each run fits temperature on power and power on activity over its own 30 minutes,
#: so its excesses are comparable with an earlier run's at the same load only: a chat service's GPU dropping
#: from ~190 W to 65 W read 6-7 C over its node peers in 30-minute windows (the fit extrapolated to idle) against
#: -1 C in the windows of its busy hours, a false 8 C shift (4 of 10 seeds of multi-fault, replayed). Die
#: temperature moves ~0.1 C per W of power (H100 at 400 W: ~40 C over the inlet): 20 % of the power is ~8 C, the
#: size of the floors. Power is a ratio to what the window's own activity asks, so load is in it already: a
#: carried power level counts within 0.25 of util. 0.1 dropped it where an inference service's util swings by more
#: from one half hour to the next: quiet-mess's GPU drawing a fifth less (13 % under the fit on a leaky chip, 17 %
#: under its own level) was withdrawn for 73 minutes (replayed, seed +1); at 0.25 every finding of 4 other seeds
#: (+8002..+8005) of the six scenarios with inference services or degraded GPUs replays the same as at 0.1.
_LOAD = {"temp_excess": ("power", 0.2, 0.0), "mem_temp_excess": ("power", 0.2, 0.0),
         "power_excess": ("busy", 0.0, 0.25), "power_deficit": ("busy", 0.0, 0.25),
         "clock_deficit": ("busy", 0.0, 0.25)}
_MAX_MCD = 500  # windows per model for MinCovDet: below 500 FastMCD needs no subset merging (~0.1 s, not 4 s)
_IRLS_ITER = 8


@register
@dataclass
class DegradedGpu:
    """Soft anomalies of one GPU vs its peers at the same load, persistent over time.

    Defaults (floors are the smallest excess worth a finding; see the module doc for the model):

    - ``window_s`` 600: 10 one-minute samples per aggregate average out meter noise (±3%
      power, ±0.8 C) while a 30-min problem still spans 3 windows.
    - ``temp_excess_c`` 8: healthy busy GPUs of one model spread ~2 C sd around their node
      peers at the same power (thermal resistance varies ~6%: ~2 C at 400 W); that is a fixed
      property of each GPU, so over 10,000 GPUs the hottest healthy one sits ~6.6 C above its
      peers (measured on healthy-fleet x 10k): 8 C clears it, 80% of a failing paste/fan (+10 C).
    - ``temp_shift_c`` 6: a GPU's own level moves by < 1 C window to window (sensor noise
      averaged over 10 samples); 6 C over its own earlier level is a change, not noise.
    - ``mem_temp_excess_c`` / ``mem_temp_shift_c`` 6: HBM follows the die within ~±0.6 C
      after the fit (10k healthy max 0.2 C): 6 C is far outside and 60% of a hot stack (+10 C).
    - ``power_excess`` 0.15: healthy chips of one model spread up to ~+/-10% in dynamic power
      (leakage, the ``power_deficit`` reason below, in both directions) on top of ~3% efficiency
      differences (1 sd) and ~1% meter noise per window: 0.12 named a healthy chip at the top of
      a +/-10% spread (healthy-heterogeneous, 1 of 20 seeds); 15% clears it and 75% of a clearly
      inefficient part (+20%).
    - ``power_shift`` 0.12: per-GPU efficiency differs ~3% (1 sd; 10k healthy busy max 9%) plus
      ~1% meter noise per window, and a GPU's own level does not spread: 12% over its own earlier
      level is ~4 sd and 60% of a part turning inefficient (+20%).
    - ``power_deficit`` 0.15: healthy chips of one model spread up to ~+/-10% in dynamic power
      (leakage; ~20% fleet-wide spreads are reported) plus ~1% meter noise per window, so the
      least-drawing healthy GPU sits < 12% under the fit; 15% clears it and a failing VRM/sensor
      or a low limit (20-33% less) passes it. ``power_shift`` applies to the deficit as well.
    - ``baseline_windows`` 2: 20 min of the GPU's own history before a change point.
    - ``busy_min`` 0.5: busy windows (util or GR engine) for clocks.
    - ``power_busy_min`` 0.2: power excess and deficit are judged on windows at least this busy. What the
      gate keeps out is idle, where the dynamic part is ~0 and the ratio reads per-GPU idle power (~4 % sd:
      12 % of 66 W is 8 W nobody should be paged for); at 0.2 an H100's activity asks ~170 W, its idle spread
      is ~1.6 % sd of that and the dynamic spread (+/-10 %) ~6 %, under the floors. At 0.5 an inference
      replica at 40 % util drawing a fifth less than the fit at the same util, SM activity and clock (a
      failing VRM, 19 % under it window after window) was never judged (a session's probe, 3 of 3 seeds).
    - ``static_floor`` 1.25: where a GPU's own history is known and its power excess or deficit never moved
      over it (its best change point shifted it less than half ``power_shift``), the level must pass 1.25x
      the floor: a difference a GPU always had is a chip's trait, and healthy chips' leakage spreads dynamic
      power +/-10 % on ~3 % efficiency differences, to the floor's edge across enough of them: over 20
      never-used seeds (+7000..+7019) of all 25 scenarios, 3 healthy GPUs at 15-17 % more power than the
      fit, each within 1 % of its own earlier level, were findings. A part that turns bad shifts (judged at
      the plain floor); one bad since before the data must be 1.25x as far out. Temperatures keep their
      floors: those already clear the hottest of 10,000 healthy GPUs.
    - ``temp_busy_min`` 0.1: temperatures are judged on windows at least this busy. An idle die sits at its
      fan curve's floor, off the line die = inlet + R x power, and a failing paste or fan shows only with heat
      flowing: an idle chat-service GPU at 65 W, its job peers at 150-260 W, read "11 C hotter than its peers
      at the same power" in serve's 30-minute windows (multi-fault, seed +1001, replayed).
    - ``temp_load_min`` 0.5: the die temperature floors (``temp_excess_c``, ``temp_shift_c``) are for a GPU at
      ~60 % of its power limit, where the healthy spread they clear was measured; that spread is one of thermal
      resistance (~6 % from chip to chip), so it shrinks with the power through the die, as a failing paste's or
      fan's excess does (R up a third: 13 C at 400 W, ~5 C at 130 W). Per window both floors scale with its power
      over 60 % of the model's limit (where the limit is not collected, the model's highest window power stands
      for it), to no less than half (4 C and 3 C: sensor offsets and the fit's residual do not shrink with power),
      and only where its node and job peers run within a third of its power: against busier peers the residual
      carries the linear fit's curvature, which does not shrink (an idle 65 W GPU among peers at 150-260 W read
      6-7 C, multi-fault +6).
      Before, an A100 inference GPU at ~40 % util (~110 W of 400 W) whose paste dried (R up ~50 %) read 4-6 C over
      its node peers: found at 0 of 10 seeds at 4 C, at 6 C only at 60 s steps (4 of 6 at 15 s); now 10 of 10 at
      both, and no healthy GPU is a finding over 20 never-used seeds of all 27 scenarios (+8300..+8319) nor at
      15 s over 5 seeds of four healthy and inference-heavy ones, both dialects.
    - ``clock_deficit`` 0.10: unthrottled busy GPUs hold max clock within ~2%; 10% lower
      without a thermal reason is power- or clock-capping. Where the max clock is not reported
      (dcgm-exporter's default counters), the highest clock of the model stands in for it
      (``analyzer.detectors.clock_max``): with no power limit either, the clock is what shows a cap.
    - ``clock_shift`` 0.05: a busy GPU's clock relative to its peers is its chip's (binning, leakage under a
      cap) and holds within ~1 % window to window; 5 % below its own earlier level at the same load is a limit
      or application clock changed under it. With dcgm-exporter's default counters (no limit, no clock-event
      reasons) a limit lowered to about what the GPU drew shows only so: restart-mess's A100 capped at ~228 W
      of 400 W, drawing ~210 W like its peers, clocks 7 % under them, under ``clock_deficit``: found at 7 of 10
      seeds before (the other three a lower cap's larger deficit), 10 of 10 with the shift.
    - ``cap_deficit`` 0.10: power limits are configuration, identical across a model;
      10% below the model median (H100: <= 630 W of 700) is a deliberate or accidental -pl.
    - ``outlier_quantile`` 0.999: chi^2 gate on the MCD distance: 1 healthy window in 1000
      passes, and must then pass a floor and persist.
    - ``cusum_k`` 0.5, ``cusum_h`` 1.5: a window off (z >= 1) adds z - 0.5, any other window
      takes 0.5 away; at the floor the alarm needs 4 windows in a row (40 min), at 1.7x the
      floor (10 C) 2 windows, and a GPU below its floors never accumulates anything.
    - ``min_duration_s`` 1800: a degraded part stays degraded; a 30-min minimum keeps a job
      phase or a transient out of the maintenance queue.
    - ``throttle_c`` 85: the die temperature where GPUs start thermal throttling (H100/A100);
      the site config's shared ``gpu_temp_limit_celsius`` (analyzer.site.Thresholds).
    - ``min_peers`` 3, ``min_model_gpus`` 8: a median of 3 still ignores one bad member; a
      fleet-wide model of fewer than 8 GPUs is not a fleet.
    - ``random_state`` 0: the seed of the fit's fixed-size subsample, so a run is reproducible.
    """

    kind = DEGRADED_GPU
    paging = Paging(alert="GpuDegraded", team="training", says="runs degraded (power cap, PCIe or NVLink) ({score}); "
                    "see the analyzer's finding for the evidence.", keep_s=HOLD_SEVERITY_S)
    remembers = True  #: a service's runs carry the CUSUM and each GPU's own earlier level (``_carried``)
    window_s: float = 600.0
    temp_excess_c: float = 8.0
    temp_shift_c: float = 6.0
    mem_temp_excess_c: float = 6.0
    mem_temp_shift_c: float = 6.0
    power_excess: float = 0.15
    power_deficit: float = 0.15
    power_shift: float = 0.12
    baseline_windows: int = 2
    clock_deficit: float = 0.10
    clock_shift: float = 0.05
    cap_deficit: float = 0.10
    outlier_quantile: float = 0.999
    cusum_k: float = 0.5
    cusum_h: float = 1.5
    min_duration_s: float = 1800.0
    throttle_c: float = THRESHOLDS.gpu_temp_limit_celsius
    busy_min: float = 0.5
    power_busy_min: float = 0.2
    static_floor: float = 1.25
    temp_busy_min: float = 0.1
    temp_load_min: float = 0.5
    min_peers: int = 3
    min_model_gpus: int = 8
    random_state: int = 0

    # ---------------------------------------------------------------------------------------
    def floors(self) -> dict[str, float]:
        return {"temp_excess": self.temp_excess_c, "mem_temp_excess": self.mem_temp_excess_c,
                "power_excess": self.power_excess, "power_deficit": self.power_deficit,
                "clock_deficit": self.clock_deficit,
                "cap_deficit": self.cap_deficit}

    def windows(self, fleet: Fleet) -> tuple[pd.DataFrame, np.ndarray]:
        """Per (GPU, window) aggregates, and each frame row's aggregate index (-1: none)."""
        f = fleet.frame
        n = len(f)
        uuid = f["uuid"].astype("category")
        ucode = uuid.cat.codes.to_numpy(dtype=np.int64)
        ts = f["timestamp"].to_numpy(dtype=np.float64)
        w = np.floor((ts - fleet.start) / self.window_s + 1e-9).astype(np.int64)
        nw = int(w.max()) + 1 if n else 0
        key = np.where(ucode >= 0, ucode * max(nw, 1) + w, -1)
        valid = key >= 0
        uniq, inv = np.unique(key[valid], return_inverse=True)
        row_win = np.full(n, -1, np.int64)
        row_win[valid] = inv
        m = len(uniq)

        def mean(values: np.ndarray, sel: np.ndarray | None = None) -> np.ndarray:
            v = values[valid]
            ok = ~np.isnan(v) if sel is None else (~np.isnan(v) & sel[valid])
            s = np.bincount(inv[ok], weights=v[ok], minlength=m)
            c = np.bincount(inv[ok], minlength=m)
            with np.errstate(invalid="ignore", divide="ignore"):
                return np.where(c > 0, s / np.maximum(c, 1), np.nan)

        # Activity of the physical GPU: MIG instances add up by their share of the GPU.
        share = f["gpu_share"].to_numpy(dtype=np.float64) if "gpu_share" in f.columns else np.ones(n)
        mig = "gpu_instance" in f.columns and bool((f["gpu_instance"].astype(str) != "").any())
        acts = {"busy": gpu_busy(fleet), **{s: column(fleet, s) for s in _ACTIVITY[1:]}}
        # SM and tensor activity count cycles: at a lower clock the same work fills more of them and draws less
        # power. Per second of work (x clock / max clock) a throttled GPU and a full-clock one doing the same
        # work ask the same watts of the power fit.
        with np.errstate(invalid="ignore", divide="ignore"):
            ratio = column(fleet, "sm_clock") / clock_max(fleet)
        per_s = np.where(np.isnan(ratio), 1.0, np.minimum(ratio, 1.0))
        for s in ("sm_active", "tensor_active"):
            acts[s] = acts[s] * per_s
        agg: dict[str, np.ndarray] = {"uuid_code": uniq // max(nw, 1), "window": uniq % max(nw, 1)}
        if mig:
            tidx = np.round((ts[valid] - fleet.start) / fleet.step).astype(np.int64)
            tkey = ucode[valid] * (np.int64(1) << 32) + tidx
            first = np.zeros(valid.sum(), bool)
            first[np.unique(tkey, return_index=True)[1]] = True
            n_ts = np.bincount(inv[first], minlength=m)
            for name, a in acts.items():
                v = a[valid] * share[valid]
                ok = ~np.isnan(v)
                s = np.bincount(inv[ok], weights=v[ok], minlength=m)
                known = np.bincount(inv[ok], minlength=m) > 0
                with np.errstate(invalid="ignore", divide="ignore"):
                    agg[name] = np.where(known, np.minimum(s / np.maximum(n_ts, 1), 1.0), np.nan)
        else:
            for name, a in acts.items():
                agg[name] = mean(a)
        for s in ("power", "temp", "mem_temp", "power_limit"):
            agg[s] = mean(column(fleet, s))
        temp = column(fleet, "temp")
        thr = column(fleet, "thermal_throttle")
        hot = np.where(np.isnan(temp), np.nan, (temp >= self.throttle_c).astype(np.float64))
        agg["throttled"] = np.fmax(mean(thr), mean(hot))
        agg["power_capped"] = mean(column(fleet, "power_throttle"))
        busy_row = gpu_busy(fleet) >= self.busy_min
        agg["clock_ratio"] = mean(ratio, busy_row)
        win = pd.DataFrame(agg)
        # Identity per GPU: first row of each uuid.
        first_row = np.unique(ucode[valid], return_index=True)
        ident = pd.DataFrame({"uuid_code": first_row[0]})
        rows = np.flatnonzero(valid)[first_row[1]]
        for c in ("hostname", "gpu", "model", "uuid"):  # the first rows only: a whole column as text is ~40 MB/M rows
            ident[c] = f[c].iloc[rows].astype(str).to_numpy() if c in f.columns else ""
        ident["reference"] = fleet.reference_rows()[rows]
        win = win.merge(ident, on="uuid_code", how="left")
        # Job per (GPU, window): any job seen there (the highest category code).
        if "job" in f.columns:
            jc = f["job"].astype("category").cat.codes.to_numpy(dtype=np.int64)[valid]
            job = np.full(m, -1, np.int64)
            np.maximum.at(job, inv, jc)
            win["job_code"] = job
        else:
            win["job_code"] = -1
        return win, row_win

    # ---------------------------------------------------------------------------------------
    def _robust_fit(self, X: np.ndarray, y: np.ndarray, fit: np.ndarray) -> np.ndarray:
        """Huber regression of y on X over the ``fit`` rows (IRLS on a fixed-seed subsample); predictions for
        every row.

        Huber weights (k = 1.345 robust sd, 95% efficiency on clean data) bound the pull of bad
        GPUs on the fit; a few iteratively reweighted least squares are milliseconds, where an
        L-BFGS HuberRegressor spends ~0.2 s per fit for the same line. The slopes are kept >= 0 (more power,
        more heat; more activity, more power): a GPU far from its model's cloud, a capped straggler doing 45 %
        more work for its gang at less power, would otherwise tilt the fit through itself and read as normal.
        """
        ok = ~np.isnan(y) & ~np.isnan(X).any(axis=1)
        pred = np.full(len(y), np.nan)
        if (ok & fit).sum() < max(10, 3 * X.shape[1]):
            return pred
        idx = np.flatnonzero(ok & fit)
        if len(idx) > _MAX_FIT:
            idx = np.sort(np.random.default_rng(self.random_state).choice(idx, _MAX_FIT, replace=False))
        A = np.column_stack([np.ones(len(idx)), X[idx]])
        b = y[idx]
        wts = np.ones(len(idx))
        coef = np.zeros(A.shape[1])
        for _ in range(_IRLS_ITER):
            sw = np.sqrt(wts)
            coef = _rising_lstsq(A * sw[:, None], b * sw)
            res = b - A @ coef
            scale = max(1.4826 * float(np.median(np.abs(res - np.median(res)))), 1e-9)
            u = np.abs(res) / (1.345 * scale)
            wts = np.where(u <= 1.0, 1.0, 1.0 / np.maximum(u, 1e-12))
        pred[ok] = np.column_stack([np.ones(int(ok.sum())), X[ok]]) @ coef
        return pred

    def features(self, fleet: Fleet) -> tuple[pd.DataFrame, np.ndarray, list[str]]:
        """Window table with load-adjusted, peer-relative features; row -> window; notes."""
        win, row_win = self.windows(fleet)
        notes: list[str] = []
        for c in FEATURES:
            win[c] = np.nan
        win["model_ok"] = False
        throttled = win["throttled"].to_numpy() > 0  # off the temperature fit, and no verdict (the thermal detector's)
        for model, idx in win.groupby("model", sort=True, observed=True).indices.items():
            sub = win.iloc[idx]
            ref = sub["reference"].to_numpy()  # fitted on the fleet's reference hosts, applied to every GPU
            n_gpu = sub.loc[ref, "uuid_code"].nunique()
            if n_gpu < self.min_model_gpus:
                notes.append(f"degraded_gpu: only {n_gpu} {model} GPU(s) (< {self.min_model_gpus}): no peer "
                             f"baseline, no verdict for them")
                continue
            win.loc[win.index[idx], "model_ok"] = True
            # Temperature ~ power (die = inlet + R * power), fitted on windows off the throttle: a throttled die
            # is pinned near its limit whatever its power, off the line. A failing rack's busy GPUs, pinned hot at
            # high power, tilted the slope from 0.088 C/W to 0.36 (rack-cooling +10600, replayed: half the
            # 30-minute window throttled), and a healthy-rack GPU drawing 12 W less than its node peers at their
            # temperature read 3-4 C hotter "at the same power" (two false findings over six seeds).
            pw = sub["power"].to_numpy()
            win.loc[win.index[idx], "temp_res"] = sub["temp"].to_numpy() - self._robust_fit(
                pw[:, None], sub["temp"].to_numpy(), ref & ~throttled[idx])
            # HBM ~ die temperature + DRAM activity.
            dram = sub["dram_active"].to_numpy()
            # Whether DRAM activity is collected, judged on the fitted (reference) rows like the activities below: a
            # shard's context nodes carry thermal's families only, and must not change the fit every GPU gets.
            X = sub[["temp"]].to_numpy() if np.isnan(dram[ref]).mean() > 0.5 else np.column_stack([sub["temp"], dram])
            win.loc[win.index[idx], "mem_res"] = sub["mem_temp"].to_numpy() - self._robust_fit(
                X, sub["mem_temp"].to_numpy(), ref)
            # Power ~ activity (the activity signals this input has).
            acts = [a for a in _ACTIVITY if sub.loc[ref, a].notna().mean() > 0.5]
            if acts:
                pred = self._robust_fit(sub[acts].to_numpy(), pw, ref)
                with np.errstate(invalid="ignore", divide="ignore"):
                    win.loc[win.index[idx], "pow_res"] = np.where(pred > 1.0, pw / pred - 1.0, np.nan)
            # Clocks and power limit vs the model's median.
            cr = sub["clock_ratio"].to_numpy()
            med_cr = np.nanmedian(cr[ref]) if np.isfinite(cr[ref]).any() else np.nan
            win.loc[win.index[idx], "clk_res"] = 1.0 - cr / med_cr
            lim = sub["power_limit"].to_numpy()
            med_lim = np.nanmedian(lim[ref]) if np.isfinite(lim[ref]).any() else np.nan
            win.loc[win.index[idx], "cap_deficit"] = 1.0 - lim / med_lim
            win.loc[win.index[idx], "peer_limit"] = med_lim
        for c in ("temp_res", "mem_res", "pow_res", "clk_res", "peer_limit"):
            if c not in win.columns:
                win[c] = np.nan
        node = self._peer_dev(win, ["hostname", "model", "window"], ["temp_res", "mem_res", "power"])
        job = self._peer_dev(win[win["job_code"] >= 0], ["job_code", "model", "window"],
                             ["temp_res", "mem_res", "pow_res", "clk_res", "power"]).reindex(win.index)
        win["temp_excess"] = np.fmin(node["temp_res"], job["temp_res"])
        win["mem_temp_excess"] = np.fmin(node["mem_res"], job["mem_res"])
        # A GPU's own temperature history is judged against its node (same inlet air): job peers in a
        # rack whose cooling failed and recovered would move its job-relative level by ten degrees.
        for c, r in (("temp_excess", "temp_res"), ("mem_temp_excess", "mem_res")):
            win[f"{c}_own"] = node[r].fillna(win[c])
        # Power and clocks: the fleet-wide fit is a valid baseline too (no inlet in it).
        win["power_excess"] = np.fmin(win["pow_res"], job["pow_res"])
        win["power_deficit"] = np.fmin(-win["pow_res"], -job["pow_res"])
        # held at its own limit: less power than the activity asks is the cap's doing (cap_deficit judges the limit)
        win.loc[win["power_capped"].to_numpy() > 0.5, "power_deficit"] = np.nan
        win["clock_deficit"] = np.fmin(win["clk_res"], job["clk_res"])
        # Thermal throttling belongs to the thermal detector: no verdict in those windows.
        win.loc[throttled, list(LEVEL)] = np.nan
        # Power efficiency is judged on working windows: at idle the dynamic part is ~0 (``power_busy_min``).
        win.loc[~(win["busy"].to_numpy() >= self.power_busy_min), list(POWER)] = np.nan
        win.loc[win["busy"].to_numpy() < self.temp_busy_min, ["temp_excess", "mem_temp_excess"]] = np.nan
        win.loc[~win["model_ok"].to_numpy(), list(FEATURES)] = np.nan
        win["temp_floor_scale"] = self._load_scale(win, node["power"].to_numpy(), job["power"].to_numpy())
        return win, row_win, notes

    def _peer_dev(self, win: pd.DataFrame, by: list[str], cols: list[str]) -> pd.DataFrame:
        """Each value minus the median of its peer group; NaN where the group has < min_peers values."""
        g = win.groupby(by, sort=False, observed=True)[cols]
        med = g.transform("median")
        cnt = g.transform("count")
        return (win[cols] - med).where(cnt >= self.min_peers)

    # ---------------------------------------------------------------------------------------
    def score_windows(self, win: pd.DataFrame) -> np.ndarray:
        """Per window z = how far past its floor the worst feature is (level or own shift); NaN unknown.

        Level: peer-relative excess / floor, counted only where the MCD gate finds the window
        outlying for its model. Shift: rise over the GPU's own baseline / shift floor (see
        ``own_shifts``), counted while the GPU is also above its peers' median.
        """
        floors = self.floors()
        load = {TEMP: win["temp_floor_scale"].to_numpy()}
        scaled = np.column_stack([win[c].to_numpy() / (floors[c] * load.get(c, 1.0)) for c in SOFT])
        gate = np.zeros(len(win), bool)
        ref = win["reference"].to_numpy()
        for _, idx in win.groupby("model", sort=True, observed=True).indices.items():
            gate[idx] = self._mcd_gate(scaled[idx], ref[idx])
        scale = {**self._static_scale(win), **load}
        level = np.column_stack([win[c].to_numpy() / (floors[c] * scale.get(c, 1.0)) for c in LEVEL])
        soft = np.where(np.isnan(level), -np.inf, level).max(axis=1)
        soft = np.where(np.isnan(level).all(axis=1), np.nan, np.where(gate, np.maximum(soft, 0.0), 0.0))
        cap = win["cap_deficit"].to_numpy() / floors["cap_deficit"]
        z = np.fmax(soft, np.maximum(cap, 0.0))
        shifts = self.shift_floors()
        for c, fl in shifts.items():
            fl = fl * load.get(c, 1.0)
            sh = win[f"{c}_shift"].to_numpy()
            above = win[c].to_numpy() >= fl / 2.0
            z = np.fmax(z, np.where(above & np.isfinite(sh), np.maximum(sh, 0.0) / fl, np.nan))
        return z

    def _load_scale(self, win: pd.DataFrame, node: np.ndarray, job: np.ndarray) -> np.ndarray:
        """Per window, what the die temperature floors are multiplied by: its power over 60 % of its model's
        power limit, within [``temp_load_min``, 1]; the model's highest window power stands in for the limit where
        the limit is not collected (dcgm-exporter's default counters). Only where its peers (``node``, ``job``: its
        power minus theirs, NaN where unknown) run at about its power: against peers at other powers its residual
        carries the linear fit's curvature, which does not shrink with power."""
        ref = win["reference"].to_numpy()
        limit = win["peer_limit"].to_numpy(dtype=np.float64, copy=True)
        power = win["power"].to_numpy(dtype=np.float64)
        for _, idx in win.groupby("model", sort=False, observed=True).indices.items():
            own = idx[ref[idx] & np.isfinite(power[idx])]
            if len(own) and not np.isfinite(limit[idx]).any():
                limit[idx] = power[own].max()
        with np.errstate(invalid="ignore", divide="ignore"):
            load = power / (0.6 * limit)
            apart = np.abs(np.column_stack([node, job])) / power[:, None]  # |own - peers' median| / own
        matched = (np.isfinite(apart).any(axis=1)) & ~(apart > _PEER_POWER_BAND).any(axis=1)
        return np.where(matched & np.isfinite(load), np.clip(load, self.temp_load_min, 1.0), 1.0)

    def _static_scale(self, win: pd.DataFrame) -> dict[str, np.ndarray]:
        """Per power feature and window, what its floor is multiplied by: ``static_floor`` where the GPU's own
        history is known (``own_shifts`` found a change point) and the feature never rose over it by half its
        shift floor, else 1."""
        gi, _, G, _ = _grid(win)
        out = {}
        for c in POWER:
            sh = win[f"{c}_shift"].to_numpy()
            known = np.bincount(gi[np.isfinite(sh)], minlength=G) > 0
            rose = np.bincount(gi[sh >= self.power_shift / 2.0], minlength=G) > 0
            out[c] = np.where((known & ~rose)[gi], self.static_floor, 1.0)
        return out

    def shift_floors(self) -> dict[str, float]:
        return {"temp_excess": self.temp_shift_c, "mem_temp_excess": self.mem_temp_shift_c,
                "power_excess": self.power_shift, "power_deficit": self.power_shift,
                "clock_deficit": self.clock_shift}

    def own_shifts(self, win: pd.DataFrame, prior: dict[str, tuple[np.ndarray, ...]] | None = None
                   ) -> dict[str, np.ndarray]:
        """Adds ``<feature>_shift``: rise over the GPU's own baseline after its best change point; returns per
        feature and GPU of ``_grid`` whether the first window lies before that change (or none was found).

        Per GPU and feature, the split of its window series that maximizes the standardized
        mean difference (after - before) x sqrt(n_before n_after / n), with at least
        ``baseline_windows`` known windows before it; the shift is each later window minus the
        mean before. ``prior`` (per feature, per GPU: sum, count and summed load of earlier windows, the
        service's runs before: ``_carried``) stands before the series as one window of that weight where the
        GPU ran at the same load then (``_LOAD``). Vectorized over GPUs; one pass per split point (windows,
        not rows).
        """
        gi, w, G, W = _grid(win)
        kept = {}
        for c in self.shift_floors():
            X = np.full((G, W + 1), np.nan)
            X[gi, w + 1] = win[_own(win, c)].to_numpy()
            n = np.isfinite(X).astype(np.float64)
            if prior is not None:
                ps, pn, pl = prior[c]
                L = np.full((G, W), np.nan)
                L[gi, w] = win[_LOAD[c][0]].to_numpy()
                with np.errstate(invalid="ignore", divide="ignore"):
                    X[:, 0] = np.where(pn > 0, ps / np.maximum(pn, 1e-9), np.nan)
                    now = np.nansum(L, axis=1) / np.isfinite(L).sum(axis=1)
                    pn = np.where(_same_load(pl / pn, now, *_LOAD[c][1:]), pn, 0.0)
                n[:, 0] = np.where(pn > 0, pn, 0.0)
            cs = np.cumsum(np.where(n > 0, X * n, 0.0), axis=1)
            cn = np.cumsum(n, axis=1)
            tot_s, tot_n = cs[:, -1:], cn[:, -1:]
            best = np.full(G, -np.inf)
            tau = np.full(G, -1)
            base = np.full(G, np.nan)
            for t in range(1, W + 1):
                nb, sb = cn[:, t - 1], cs[:, t - 1]
                na, sa = tot_n[:, 0] - nb, tot_s[:, 0] - sb
                ok = (nb >= self.baseline_windows) & (na >= 1)
                with np.errstate(invalid="ignore", divide="ignore"):
                    mb, ma = sb / nb, sa / na
                    stat = (ma - mb) * np.sqrt(nb * na / np.maximum(nb + na, 1))
                better = ok & (stat > best)
                best, tau, base = np.where(better, stat, best), np.where(better, t, tau), np.where(better, mb, base)
            cols = np.arange(W + 1)[None, :]
            shift = np.where((tau[:, None] >= 0) & (cols >= tau[:, None]), X - base[:, None], np.nan)
            win[f"{c}_shift"] = shift[gi, w + 1]
            kept[c] = (tau < 0) | (tau >= 2)
        return kept

    def _mcd_gate(self, X: np.ndarray, fit: np.ndarray) -> np.ndarray:
        """Windows whose robust Mahalanobis distance (MinCovDet on the features present, fitted on the ``fit``
        windows) is outlying."""
        out = np.zeros(len(X), bool)
        cols = [j for j in range(X.shape[1]) if np.isfinite(X[fit, j]).mean() > 0.2] if fit.any() else []
        if not cols:
            return out
        Z = X[:, cols]
        full = np.isfinite(Z).all(axis=1) & fit
        idx = np.flatnonzero(full)
        if len(idx) < max(20, 5 * len(cols)):
            return out
        if len(idx) > _MAX_MCD:
            idx = np.sort(np.random.default_rng(self.random_state).choice(idx, _MAX_MCD, replace=False))
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            mcd = MinCovDet(random_state=self.random_state).fit(Z[idx])
        # Unknown features sit at the robust centre (contribute nothing); tiny ridge for flat features.
        Zf = np.where(np.isfinite(Z), Z, mcd.location_)
        prec = np.linalg.pinv(mcd.covariance_ + np.eye(len(cols)) * 1e-4)
        d = Zf - mcd.location_
        d2 = np.einsum("ij,jk,ik->i", d, prec, d)
        return d2 > chi2.ppf(self.outlier_quantile, len(cols))

    def cusum(self, win: pd.DataFrame, z: np.ndarray, s0: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
        """Per window 1/0/NaN: degraded (CUSUM alarm on, window off, extended back to the change point), and
        the CUSUM per (GPU, window) of ``_grid``; ``s0``: per GPU, where it starts (0, or the service's runs
        before: ``_carried``)."""
        gi, w, G, nw = _grid(win)
        Z = np.full((G, nw), np.nan)
        Z[gi, w] = z
        S = np.zeros_like(Z)
        s = np.zeros(G) if s0 is None else s0.copy()
        cap = 2.0 * self.cusum_h
        for t in range(nw):
            zt = Z[:, t]
            off = np.where(np.nan_to_num(zt) >= 1.0, np.nan_to_num(zt), 0.0)  # below the floor adds nothing
            s = np.where(np.isnan(zt), s, np.clip(s + off - self.cusum_k, 0.0, cap))
            S[:, t] = s
        with np.errstate(invalid="ignore"):
            on = (self.cusum_h < S) & (Z >= 1.0)
        # Back to the change point: windows with S > 0 leading into an alarm.
        back = on.copy()
        for t in range(nw - 2, -1, -1):
            back[:, t] |= back[:, t + 1] & (S[:, t] > 0) & ~np.isnan(Z[:, t])
        cond = np.where(np.isnan(Z), np.nan, back.astype(np.float64))
        return cond[gi, w], S

    # ---------------------------------------------------------------------------------------
    def _carried(self, names: np.ndarray, fleet: Fleet, memory: dict | None) -> tuple[pd.DataFrame | None, ...]:
        """Per GPU of ``_grid`` (``names``: their uuids, in its order), what the service's runs before handed on
        (None without: a whole history, the service's first run):

        - ``cusum``: the CUSUM (``s``) and where it last left 0 (``rise``, NaN at 0) at the end of the first
          window of the run one ``window_s`` earlier. Runs ``window_s`` apart see the same windows (each
          anchored at its data's start), so each run hands its first window's state to the run that starts
          where that window ends: a chain of runs accumulates the CUSUM as one analysis of the whole history;
        - ``level``: per shift feature the GPU's own earlier level (weighted sum, weight in windows, and load;
          ``_remember``), one per GPU for every run.

        Why: the alarm needs up to 4 windows at the floor (40 min), a finding 30 min of evidence and an own
        shift 20 min of the GPU's level before it, while ``serve`` analyzes 30 minutes: a GPU off only
        against its own earlier level (multi-fault's thermal degradation, 7-8 C over its node peers and
        11 C over itself) was never reported there, and one further off only once the whole window was."""
        if memory is None:
            return None, None
        cusum, level = memory.get("cusum", {}).get(round(fleet.start)), memory.get("level")
        return (None if cusum is None else cusum.reindex(names)), (None if level is None else level.reindex(names))

    def _prior(self, level: pd.DataFrame | None) -> dict[str, tuple[np.ndarray, ...]] | None:
        if level is None:
            return None
        return {c: tuple(level[f"{c}_{k}"].fillna(0.0).to_numpy(np.float64) for k in ("sum", "n", "load"))
                for c in self.shift_floors()}

    def _remember(self, win: pd.DataFrame, names: np.ndarray, fleet: Fleet, memory: dict, S: np.ndarray,
                  s0: np.ndarray, rise0: np.ndarray, level: pd.DataFrame | None, kept: dict[str, np.ndarray]) -> None:
        """Hand this run's first window on (``_carried``): the CUSUM after it to the run that starts where it
        ends, and its level into the GPU's earlier level where it lies before the GPU's change and within half
        the shift floor of the level so far (a window of the shifted level, or half in it, is not "earlier").
        Each run adds its first window by the share of it that is new since the GPU's last addition (runs a
        minute apart: a tenth), so the level is the GPU's average over time, whichever runs saw it; it weighs
        at most ``_BASELINE_WINDOWS``. Bounded: a CUSUM state is read once, by the run starting at its time,
        older ones go, and a GPU unseen for that long leaves the level."""
        chain = memory.setdefault("cusum", {})
        for key in [k for k in chain if k <= round(fleet.start)]:
            del chain[key]
        if not S.shape[1] or fleet.end < fleet.start + self.window_s:
            return
        gi, w, G, _ = _grid(win)
        s1 = S[:, 0]
        on = s1 > 0.0
        rise = np.where(s0 > 0.0, rise0, fleet.start)
        chain[round(fleet.start + self.window_s)] = pd.DataFrame({"s": s1[on], "rise": rise[on]}, index=names[on])
        first = w == 0

        def at_first(col: str) -> np.ndarray:
            x = np.full(G, np.nan)
            x[gi[first]] = win[col].to_numpy()[first]
            return x

        last = level["t"].to_numpy(np.float64) if level is not None else np.full(G, np.nan)
        share = np.where(np.isnan(last), 1.0, np.clip((fleet.start - last) / self.window_s, 0.0, 1.0))
        out: dict[str, np.ndarray] = {"t": np.where(share > 0.0, fleet.start, last)}
        zero = (np.zeros(G),) * 3
        prior = self._prior(level) or dict.fromkeys(self.shift_floors(), zero)
        for c, (ps, pn, pl) in prior.items():
            x, load = at_first(_own(win, c)), at_first(_LOAD[c][0])
            with np.errstate(invalid="ignore", divide="ignore"):
                near = (pn <= 0.0) | (np.abs(x - ps / pn) <= self.shift_floors()[c] / 2.0)
            add = np.where(kept[c] & near & np.isfinite(x) & np.isfinite(load), share, 0.0)
            nn = pn + add
            scale = np.where(nn > _BASELINE_WINDOWS, _BASELINE_WINDOWS / np.maximum(nn, 1e-9), 1.0)
            out[f"{c}_sum"] = (ps + add * np.nan_to_num(x)) * scale
            out[f"{c}_n"] = nn * scale
            out[f"{c}_load"] = (pl + add * np.nan_to_num(load)) * scale
        now = pd.DataFrame(out, index=names)
        if level is not None:  # GPUs of earlier runs not in this one keep theirs, for as long as it weighs
            old = memory["level"]
            old = old[~old.index.isin(names) & (old["t"] > fleet.start - _BASELINE_WINDOWS * self.window_s)]
            now = pd.concat([old, now])
        memory["level"] = now

    def detect(self, fleet: Fleet, memory: dict | None = None) -> list[Finding]:
        """Findings of the data; ``memory``: the service's part for this kind (``_carried``)."""
        f = fleet.frame
        if not len(f) or "uuid" not in f.columns:
            return []
        if not any(fleet.has(s) for s in ("temp", "power", "mem_temp", "power_limit", "sm_clock")):
            return []
        win, row_win, notes = self.features(fleet)
        for note in notes:
            if note not in fleet.notes:
                fleet.notes.append(note)
        gi, w, G, _ = _grid(win)
        names = _names(win, gi, G)
        cusum, level = self._carried(names, fleet, memory)
        warned = set(memory.pop("warned", ())) if memory is not None else set()
        kept = self.own_shifts(win, self._prior(level))
        z = self.score_windows(win)
        s0 = cusum["s"].fillna(0.0).to_numpy(np.float64) if cusum is not None else np.zeros(G)
        rise0 = cusum["rise"].to_numpy(np.float64) if cusum is not None else np.full(G, np.nan)
        wcond, S = self.cusum(win, z, s0)
        if memory is not None:
            self._remember(win, names, fleet, memory, S, s0, rise0, level, kept)
        # A GPU degraded in its first window while the CUSUM carried in stood above 0: the problem began where
        # the runs before saw it rise.
        first_off = np.zeros(G, bool)
        first_off[gi[(w == 0) & (wcond == 1.0)]] = True
        since = pd.Series(np.where(first_off & (s0 > 0.0), rise0, np.nan), index=names)
        # One row per physical GPU and time carries the verdict (MIG instances repeat the device).
        inst = f["gpu_instance"].astype(str).to_numpy() if "gpu_instance" in f.columns else np.full(len(f), "")
        carrier = (row_win >= 0) & (inst == self._first_instance(f, inst))
        cond = np.full(len(f), np.nan)
        cond[carrier] = wcond[row_win[carrier]]
        steps = max(1, round(self.window_s / fleet.step))
        eps = find_episodes(fleet, cond, max_gap_steps=steps, max_unknown_steps=2 * steps,
                            min_duration_s=0.0 if since.notna().any() else self.min_duration_s, split_on=())
        if not len(eps):
            return []
        rowvals = {c: np.where(row_win >= 0, win[c].to_numpy()[np.maximum(row_win, 0)], np.nan)
                   for c in (*FEATURES, *(f"{c}_shift" for c in self.shift_floors()), "power_limit", "peer_limit",
                             "power_capped", "power", "temp", "temp_floor_scale")}
        means = {c: eps.mean(v) for c, v in rowvals.items()}
        zrow = np.where(row_win >= 0, z[np.maximum(row_win, 0)], np.nan)
        zmean = eps.mean(zrow)
        load = np.nan_to_num(means["temp_floor_scale"], nan=1.0)
        base, base_shifts = self.floors(), self.shift_floors()
        out = []
        for i, ep in enumerate(eps.table.itertuples(index=False)):
            # the temperature's floors as this episode's load set them
            floors = {**base, TEMP: base[TEMP] * load[i]}
            shifts = {**base_shifts, TEMP: base_shifts[TEMP] * load[i]}
            began = since.get(ep.uuid, np.nan) if float(ep.start) < fleet.start + self.window_s else np.nan
            before = max(float(ep.start) - began, 0.0) if np.isfinite(began) else 0.0
            ep = begun_earlier(ep, before)
            if float(ep.evidence_s) < self.min_duration_s:
                continue
            ev: dict[str, object] = {c: float(means[c][i]) for c in FEATURES}
            ev.update({f"{c}_shift": float(means[f"{c}_shift"][i]) for c in shifts})
            off = [c for c in FEATURES if (np.isfinite(means[c][i]) and means[c][i] >= floors[c])
                   or (c in shifts and np.isfinite(means[f"{c}_shift"][i]) and means[f"{c}_shift"][i] >= shifts[c])]
            if not off:  # the alarm came from windows off on different features: name the largest
                vals = {c: means[c][i] / floors[c] for c in FEATURES if np.isfinite(means[c][i])}
                off = [max(vals, key=vals.get)] if vals else []
            ev.update(
                features_off=off, unknown=[c for c in FEATURES if not np.isfinite(means[c][i])],
                power_limit_w=float(means["power_limit"][i]), peer_power_limit_w=float(means["peer_limit"][i]),
                sw_power_cap_fraction=float(means["power_capped"][i]), power_w=float(means["power"][i]),
                temp_c=float(means["temp"][i]), hours=float(ep.duration_s) / 3600.0, seen_before_s=before,
                floors={c: floors[c] for c in off},
            )
            score = float(np.clip(zmean[i] / 4.0, 0.0, 1.0)) if np.isfinite(zmean[i]) else 0.5
            warn = _WARN_HOLD if ep.uuid in warned else 2.0
            sev = "warning" if ("cap_deficit" in off or zmean[i] >= warn) else "info"
            out.append(Finding(
                kind=self.kind, severity=sev, summary=self._summary(ep, off, means, i),
                start=float(ep.start), end=None if ep.open else float(ep.end), score=score,
                hostname=ep.hostname, gpu=int(ep.gpu) if ep.gpu and str(ep.gpu).isdigit() else None, uuid=ep.uuid,
                job=ep.job, namespace=ep.namespace, pod=ep.pod, rack=ep.rack or None,
                confidence="high" if len(ev["unknown"]) <= 1 else "low", evidence=ev,
            ))
        if memory is not None:
            memory["warned"] = sorted({f.uuid for f in out if f.severity == "warning" and f.uuid})
        return out

    @staticmethod
    def _first_instance(f: pd.DataFrame, inst: np.ndarray) -> np.ndarray:
        """Per row: the smallest instance id of its GPU (uuid), so one row per GPU and time carries the verdict."""
        if not (inst != "").any():
            return inst
        first = pd.Series(inst).groupby(f["uuid"].astype(str).to_numpy(), sort=False).transform("min")
        return first.to_numpy()

    @staticmethod
    def _summary(ep: object, off: list[str], means: dict[str, np.ndarray], i: int) -> str:
        who = f"GPU {ep.hostname}/{ep.gpu}"
        dur = format_duration(float(ep.duration_s))
        parts, actions = [], []
        if "temp_excess" in off:
            parts.append(f"runs {means['temp_excess'][i]:.0f} C hotter than its peers at the same power"
                         + _since(means["temp_excess_shift"][i], "C"))
            actions.append("check thermal paste, heatsink and fans")
        if "mem_temp_excess" in off:
            parts.append(f"has HBM {means['mem_temp_excess'][i]:.0f} C hotter than its peers"
                         + _since(means["mem_temp_excess_shift"][i], "C"))
            actions.append("check memory cooling and watch ECC counters")
        if "power_excess" in off:
            parts.append(f"draws {means['power_excess'][i]:.0%} more power than peers for the same activity"
                         + _since(means["power_excess_shift"][i], "%"))
            actions.append("check for a failing VRM or leaky part")
        slow = "clock_deficit" in off and "cap_deficit" not in off  # its clock is part of what it is told
        if "power_deficit" in off:
            parts.append(f"draws {means['power_deficit'][i]:.0%} less power than peers for the same activity"
                         + ("" if slow else " and clock") + _since(means["power_deficit_shift"][i], "%", "below"))
            actions.append("suspect a failing VRM or power sensor, or a power/clock limit set low: compare "
                           "nvidia-smi -q -d POWER,CLOCK (enforced limit, application clocks) with its peers and "
                           "the BMC reading; RMA the board if power delivery is failing")
        if "cap_deficit" in off:
            lim, peer = float(means["power_limit"][i]), float(means["peer_limit"][i])
            parts.append(f"has its power limit at {lim:.0f} W, {means['cap_deficit'][i]:.0%} below its peers' "
                         f"{peer:.0f} W")
            actions.append("restore the limit (nvidia-smi -pl) and find who changed it")
        elif slow:
            parts.append(f"clocks {means['clock_deficit'][i]:.0%} below its peers while busy"
                         + _since(means["clock_deficit_shift"][i], "%", "below"))
            if "power_deficit" not in off:  # else its action already says to compare limits and clocks
                actions.append("check power limit and application clocks")
        what = "; ".join(parts) or "behaves unlike its peers"
        return f"{who} {what} for {dur}: {'; '.join(actions) or 'inspect it'}; schedule maintenance."


def _since(shift: float, unit: str, word: str = "over") -> str:
    """`` (+10 C over its own earlier level)`` when a change point was found and the shift shows at the summary's
    precision, else "" (``word``: over/below): "0 C over its own earlier level" says nothing."""
    if not np.isfinite(shift) or shift <= 0:
        return ""
    amount = f"{shift:.0f} C" if unit == "C" else f"{shift:.0%}"
    return "" if amount in ("0 C", "0%") else f" ({amount} {word} its own earlier level)"


def _rising_lstsq(A: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Least squares with column 0 free (the intercept) and the other coefficients >= 0: the most negative
    slope is dropped and the rest refitted until none is (an active set; a few columns at most)."""
    keep = np.ones(A.shape[1], bool)
    while True:
        coef = np.zeros(A.shape[1])
        coef[keep] = np.linalg.lstsq(A[:, keep], b, rcond=None)[0]
        if not (coef[1:] < 0).any():
            return coef
        keep[1 + int(np.argmin(coef[1:]))] = False


def _same_load(then: np.ndarray, now: np.ndarray, rel: float, tol: float) -> np.ndarray:
    """Loads within ``rel`` of each other (relative to the larger) or ``tol`` apart; unknown is not the same."""
    with np.errstate(invalid="ignore"):
        return np.abs(then - now) <= np.maximum(rel * np.fmax(np.abs(then), np.abs(now)), tol)


def _own(win: pd.DataFrame, c: str) -> str:
    """The column a shift feature's own level is followed in (relative to the node where it has one)."""
    return f"{c}_own" if f"{c}_own" in win.columns else c


def _names(win: pd.DataFrame, gi: np.ndarray, G: int) -> np.ndarray:
    """The uuid of each GPU of ``_grid``."""
    names = np.empty(G, object)
    names[gi] = win["uuid"].to_numpy()
    return names


def _grid(win: pd.DataFrame) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Window table -> (GPU index, window index, number of GPUs, number of windows) for (G, W) matrices."""
    gu, gi = np.unique(win["uuid_code"].to_numpy(), return_inverse=True)
    w = win["window"].to_numpy()
    return gi, w, len(gu), (int(w.max()) + 1 if len(w) else 0)


__all__ = ["FEATURES", "SOFT", "DegradedGpu"]
