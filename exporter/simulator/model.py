"""The cluster model: deterministic, vectorized telemetry for every GPU at any virtual time.

All state is a closed-form function of (seed, row, time), so the same model feeds the
live exporter (one node, one instant), history files (all nodes, a time range) and
in-memory tables for tests, and sampling t twice, in any order, gives the same value.

* Gauges: per-row levels from the workload (see ``_eval``) plus hash-based noise keyed by
  (row, whole virtual second): no random state is carried between calls.
* Counters (energy, NVLink/PCIe bytes): base + the integral of the noise-free rate,
  precomputed once on a 30 s grid (trapezoid cumulative sums) and interpolated, so they
  are monotonic, deterministic at any time and energy ~ integral of power. Error
  counters (XID, ECC, remapped rows, NVLink errors, PCIe replays) are step/ramp closed
  forms of the fault windows.
* Synchronous training gangs: each member needs ``1/clock_factor`` compute units (+ data
  wait when input-starved) per step; the step lasts the slowest member's time plus
  communication. Members wait at the barrier inside NCCL: GPU util stays high, SM and
  tensor activity fall in proportion. What each activity counts decides who leads: SM activity
  counts kernel time (the slowest member leads by its slowness, whatever the cause), tensor
  activity busy cycles at the member's own clock (a lower clock leads, a stall does not), memory
  traffic bytes per step (equal across the gang unless a member gets more work). A dead/lost
  member hangs its peers (util ~97%, SM ~5%).
* Healthy levels are calibrated to the AcmeTrace quantiles (busy: util ~0.97, SM ~0.6,
  tensor ~0.2; GPU temperature median ~40 C / p90 ~60 C; power median ~100 W / p90 ~400 W
  on H100 with ~30% idle GPUs). See ``faults`` for what each injected fault looks like.

``sample()`` returns one (T, N) float array per signal. Keys: ``metric.name`` for
families without labels beyond the GPU identity, else ``metric.name{label=value,...}``
with labels in the metric's order, e.g. ``truegpu_temperature_celsius{sensor=memory}``,
``truegpu_ecc_errors_total{type=uncorrectable,scope=volatile}``; build them with
``sample_key()``. ``truegpu_gpu_allocation_info`` is 1 while a job holds the row, NaN
otherwise (its labels: ``Cluster.allocation_labels``). Identity/topology/node info live
in ``series()`` only. NaN = absent: every signal of a GPU lost to XID 79, NVLink signals
of PCIe-only GPUs (L40S), memory temperature of GDDR GPUs, and GPU/memory utilization of
MIG instances (NVML does not support them in MIG mode). Device-level signals (power,
temperature, clocks, PCIe/NVLink, errors) of a MIG GPU repeat on each of its instance
rows in ``sample()`` and appear once per physical GPU (without MIG labels) in ``series()``.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator
from dataclasses import dataclass, field, replace

import numpy as np

from exporter import schema as S
from exporter.schema import Metric
from exporter.simulator.faults import (
    JOB_VARIATIONS,
    KILLING_XIDS,
    LOST_AFTER,
    NVLINK_COMM,
    NVLINK_SPEEDUP,
    PARTIAL_FAULTS,
    PCIE_ONLY_COMM,
    PCIE_XFER_MULTI_NODE,
    PCIE_XFER_SINGLE_NODE,
    SPREAD_KINDS,
    Fault,
    compile_faults,
    ground_truth,
    growth_count,
    per_gpu_uniform,
    spell_on,
)
from exporter.simulator.scenario import XID_CODES, Scenario
from exporter.simulator.topology import (
    GIB,
    KIND_CODES,
    KIND_IDLE,
    KIND_IDLE_ALLOCATED,
    KIND_INFERENCE,
    KIND_MEMORY_BOUND,
    KIND_TRAINING,
    MODEL_KEYS,
    MODELS,
    GpuTable,
    Job,
    build_layout,
    closest_link,
)

GRID_DT = 30.0
THROTTLE_C = 85.0  # die temperature where the GPU starts to throttle (sw_thermal)
HW_THROTTLE_C = 97.0  # unthrottled temperature where hw_thermal / hw_slowdown kick in
_BIG = 1e6
#: Per-metric label combinations of sample() keys (beyond the GPU identity).
_STATES_PCIE = ({"state": "current"}, {"state": "max"})
_KEY_LABELS: dict[Metric, tuple[dict[str, str], ...]] = {
    S.TEMPERATURE: ({"sensor": "gpu"}, {"sensor": "memory"}),
    S.CLOCK_EVENT_ACTIVE: tuple({"reason": r} for r in S.CLOCK_EVENT_REASONS.values()),
    S.NVLINK_BYTES: tuple({"direction": d} for d in S.DIRECTIONS),
    S.PCIE_BYTES: tuple({"direction": d} for d in S.DIRECTIONS),
    S.PCIE_LINK_GENERATION: _STATES_PCIE,
    S.PCIE_LINK_WIDTH: _STATES_PCIE,
    S.XID_ERRORS: tuple({"xid": str(c)} for c in XID_CODES),
    S.ECC_ERRORS: tuple({"type": t, "scope": s} for t in S.ECC_TYPES for s in S.ECC_SCOPES),
    S.REMAPPED_ROWS: tuple({"type": t} for t in S.ECC_TYPES),
    S.NVLINK_ERRORS: tuple({"type": t} for t in S.NVLINK_ERROR_TYPES),
    S.NVLINK_LINKS: ({"state": "up"}, {"state": "down"}),
}
_INFO = (S.GPU_INFO, S.GPU_TOPOLOGY_INFO, S.NODE_INFO)
#: Per-holder families of shared GPUs (series() only, from Cluster.sharer_series).
_SHARER_METRICS = (S.SHARER_UTILIZATION, S.SHARER_MEMORY_USED)
#: How much more than the GPU's utilization the MPS clients' per-process utilizations add up to (their kernels
#: overlap); time-sliced holders take turns (1).
MPS_OVERLAP = 1.3
#: Families measured per MIG instance; every other per-GPU family is device-level.
INSTANCE_METRICS = frozenset({
    S.GPU_UTILIZATION, S.MEMORY_UTILIZATION, S.SM_ACTIVE, S.SM_OCCUPANCY, S.TENSOR_ACTIVE, S.DRAM_ACTIVE,
    S.GRAPHICS_ENGINE_ACTIVE, S.MEMORY_USED, S.MEMORY_TOTAL, S.GPU_ALLOCATION_INFO,
})


def sample_key(metric: Metric, **labels: str) -> str:
    """Key of one signal in ``Cluster.sample()``'s table, e.g. ``name{sensor=gpu}``."""
    if not labels:
        return metric.name
    return metric.name + "{" + ",".join(f"{k}={labels[k]}" for k in metric.labels if k in labels) + "}"


#: Families sample() produces (info families come from series() only).
PRODUCED = frozenset({
    S.GPU_UTILIZATION, S.MEMORY_UTILIZATION, S.SM_ACTIVE, S.SM_OCCUPANCY, S.TENSOR_ACTIVE, S.DRAM_ACTIVE,
    S.GRAPHICS_ENGINE_ACTIVE, S.MEMORY_USED, S.MEMORY_TOTAL, S.POWER, S.POWER_LIMIT, S.ENERGY, S.TEMPERATURE,
    S.SM_CLOCK, S.SM_CLOCK_MAX, S.MEMORY_CLOCK, S.CLOCK_EVENT_ACTIVE, S.NVLINK_BYTES, S.PCIE_BYTES,
    S.PCIE_LINK_GENERATION, S.PCIE_LINK_WIDTH, S.PCIE_REPLAYS, S.XID_ERRORS, S.ECC_ERRORS, S.REMAPPED_ROWS,
    S.ROW_REMAP_PENDING, S.ROW_REMAP_FAILURE, S.NVLINK_ERRORS, S.NVLINK_LINKS, S.GPU_ALLOCATION_INFO,
    S.GPM_SUPPORTED,
})
#: (metric, extra labels, key) of every sample() signal, in schema.METRICS order.
SAMPLE_SIGNALS: tuple[tuple[Metric, dict[str, str], str], ...] = tuple(
    (m, lbl, sample_key(m, **lbl))
    for m in S.METRICS
    if m in PRODUCED
    for lbl in _KEY_LABELS.get(m, ({},))
)


_SAMPLE_KEYS = tuple(key for _, _, key in SAMPLE_SIGNALS)
_K_BY_LABELS = {(m.name, *lbl.values()): key for m, lbl, key in SAMPLE_SIGNALS}


def _k(metric: Metric, *values: str) -> str:
    """Key of ``metric`` with label values given in the metric's label order (checked)."""
    return _K_BY_LABELS[(metric.name, *values)]


# Deterministic noise: splitmix64 of (row key, whole second) -----------------------------
_GOLD = np.uint64(0x9E3779B97F4A7C15)


def _mix(x: np.ndarray) -> np.ndarray:
    x = x ^ (x >> np.uint64(30))
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _uniforms(h: np.ndarray) -> list[np.ndarray]:
    """Four uniforms in [0, 1) from the 16-bit quarters of a 64-bit hash."""
    return [((h >> np.uint64(s)) & np.uint64(0xFFFF)).astype(np.float32) * np.float32(1 / 65536)
            for s in (0, 16, 32, 48)]


def _hash(tsec: np.ndarray, keys: np.ndarray) -> np.ndarray:
    return _mix(tsec[:, None] * _GOLD + keys[None, :])


@dataclass
class _Ctx:
    """Static per-column parameters for one evaluated row set (cached)."""

    rows: np.ndarray
    n: int
    p: dict[str, np.ndarray]
    tc: np.ndarray  # local training columns, grouped by job
    bounds: np.ndarray
    jl: np.ndarray
    ic: np.ndarray
    mc: np.ndarray
    ac: np.ndarray
    mig: tuple[np.ndarray, np.ndarray] | None  # (group starts, group index per column)
    faults: list[tuple[Fault, np.ndarray]]
    out: np.ndarray | None  # columns of the requested rows, None = all
    grid: dict[str, np.ndarray] = field(default_factory=dict)  # counter grids of these columns


@dataclass
class _FaultEffects:
    """What the active faults do per (time, column) over one evaluation; None where no fault of that kind."""

    heat: np.ndarray | None = None  # extra die celsius
    cap: np.ndarray | None = None  # power cap, watts
    capped: np.ndarray | None = None  # where the cap bites (set by Cluster._clock_factor)
    starve: np.ndarray | None = None  # extra per-step input wait, in compute units
    dead: np.ndarray | None = None  # killed by an XID
    lost: np.ndarray | None = None  # fallen off the bus (XID 79)
    gen_cap: np.ndarray | None = None
    width_cap: np.ndarray | None = None
    down: np.ndarray | None = None  # NVLinks down
    slow: np.ndarray | None = None  # clock factor of a slow GPU
    work: np.ndarray | None = None  # work per step of a slow GPU given more (data imbalance), vs its peers'
    xcomm: np.ndarray | None = None  # extra communication per step (degraded NVLink)
    rscale: np.ndarray | None = None  # thermal resistance factor
    pscale: np.ndarray | None = None  # dynamic power factor
    memheat: np.ndarray | None = None  # extra HBM celsius
    binning: np.ndarray | None = None  # clock factor of healthy chip-to-chip spread (chip_spread)
    pdraw: np.ndarray | None = None  # power drawn vs what the activity needs (power_deficit)


@dataclass
class _Activity:
    """Per (time, column) activity the workloads produce: utilization, SM, tensor, DRAM, link rates."""

    u: np.ndarray
    sm: np.ndarray
    ten: np.ndarray
    dram: np.ndarray
    nvl: np.ndarray
    pcie: np.ndarray
    step: np.ndarray | None = None  # training step time, per training column

    @classmethod
    def zeros(cls, shape: tuple[int, int]) -> _Activity:
        return cls(*(np.zeros(shape) for _ in range(6)))

    def add_noise(self, busy: np.ndarray, n1: list[np.ndarray], n2: list[np.ndarray]) -> None:
        """Measurement noise; utilization in whole percent, as NVML reports it."""
        u = np.where(busy, np.clip(self.u + (n1[0] - 0.5) * 0.03, 0.0, 1.0), 0.0)
        self.u = np.round(u * 100.0) / 100.0
        self.sm = self.sm * (1.0 + (n1[1] - 0.5) * 0.08)
        self.ten = self.ten * (1.0 + (n1[2] - 0.5) * 0.1)
        self.dram = np.where(busy, self.dram * (1.0 + (n1[3] - 0.5) * 0.08), self.dram + n2[3] * 0.002)


def _alive(active: np.ndarray, dead: np.ndarray | None, cols: np.ndarray) -> np.ndarray:
    return active[:, cols] if dead is None else active[:, cols] & ~dead[:, cols]


def _training(act: _Activity, tr: np.ndarray, active: np.ndarray, f: np.ndarray, ctx: _Ctx, fx: _FaultEffects,
              noise: bool) -> None:
    """Synchronous gangs: the step lasts the slowest member's compute (+ input wait) plus communication."""
    p, tc = ctx.p, ctx.tc
    ft = f[:, tc] if fx.slow is None else f[:, tc] * fx.slow[:, tc]
    comp = 1.0 / ft  # kernel time per step: SM activity counts it (cycles with warps resident)
    # Tensor work is counted in cycles at the member's own clock (a lower clock: more of them busy), memory traffic
    # in bytes per step (whatever the SM clock); both grow with more work per step, never with stalls (the same
    # work in more cycles).
    work = 1.0 if fx.work is None else fx.work[:, tc]
    st = fx.starve[:, tc] if fx.starve is not None else 0.0
    ready = comp + st
    if fx.dead is not None:
        ready = np.where(fx.dead[:, tc], _BIG, ready)
    comm = p["comm"][tc]
    if fx.xcomm is not None:
        comm = comm + np.maximum.reduceat(fx.xcomm[:, tc], ctx.bounds, axis=1)[:, ctx.jl]
    step = np.maximum.reduceat(ready, ctx.bounds, axis=1)[:, ctx.jl] + comm
    wait = np.maximum(step - comm - ready, 0.0)
    inv = 1.0 / step
    smp, tp, dp = p["smp"][tc], p["tp"][tc], 0.35
    if noise:  # slow drift of the step mix, per member; memory traffic's at its own pace (a quarter period off)
        period, wander = p["period"][tc], p["wander"][tc]
        drift = 1.0 + 0.04 * np.sin(2 * np.pi * tr[:, None] / period + wander)
        smp, tp = smp * drift, tp * drift
        dp = dp * (1.0 + 0.04 * np.sin(2 * np.pi * tr[:, None] / (1.3 * period) + wander + np.pi / 2))
    on = _alive(active, fx.dead, tc)
    act.u[:, tc] = np.where(on, 0.97 * (step - st) * inv, 0.0)
    act.sm[:, tc] = np.where(on, (smp * comp + 0.05 * wait + 0.18 * comm) * inv, 0.0)
    act.ten[:, tc] = np.where(on, tp * work / f[:, tc] * inv, 0.0)
    act.dram[:, tc] = np.where(on, (dp * work + 0.02 * wait + 0.08 * comm) * inv, 0.0)
    act.nvl[:, tc] = np.where(on, p["nvl0"][tc] * inv, 0.0)
    act.pcie[:, tc] = np.where(on, p["pcie0"][tc] * inv, 0.0)
    act.step = step


def _inference(act: _Activity, t_abs: np.ndarray, active: np.ndarray, ctx: _Ctx, fx: _FaultEffects) -> None:
    """Inference: load follows the time of day, with bursts keyed by 5-minute windows."""
    p, ic = ctx.p, ctx.ic
    day = t_abs % 86400.0
    diurnal = 1.0 + 0.5 * np.sin(2 * np.pi * (day / 86400.0 - 9 / 24))
    bh = _uniforms(_hash(np.floor(t_abs / 300.0).astype(np.int64).astype(np.uint64), p["jkey"][ic]))[0]
    load = np.clip(p["load"][ic] * diurnal[:, None] + np.where(bh < p["burst"][ic], 0.35, 0.0), 0.02, 1.0)
    on = _alive(active, fx.dead, ic)
    act.u[:, ic] = np.where(on, np.minimum(0.1 + 1.05 * load, 0.99), 0.0)
    act.sm[:, ic] = np.where(on, 0.5 * load, 0.0)
    act.ten[:, ic] = np.where(on, 0.15 * load, 0.0)
    act.dram[:, ic] = np.where(on, 0.1 + 0.4 * load, 0.0)
    act.nvl[:, ic] = np.where(on, (p["links"][ic] > 0) * 15e9 * load, 0.0)
    act.pcie[:, ic] = np.where(on, 0.6e9 * load, 0.0)


def _memory_bound(act: _Activity, active: np.ndarray, ctx: _Ctx, fx: _FaultEffects) -> None:
    """Memory-bound jobs: busy by utilization, DRAM-heavy, light on SMs and tensor cores."""
    mc = ctx.mc
    on = _alive(active, fx.dead, mc)
    act.u[:, mc] = np.where(on, 0.95, 0.0)
    act.sm[:, mc] = np.where(on, 0.2, 0.0)
    act.ten[:, mc] = np.where(on, 0.02, 0.0)
    act.dram[:, mc] = np.where(on, 0.78, 0.0)
    act.pcie[:, mc] = np.where(on, 2e9, 0.0)


def _device_sum(x: np.ndarray, mig: tuple[np.ndarray, np.ndarray] | None, weight: np.ndarray) -> np.ndarray:
    """Sum of ``x * weight`` over each physical GPU's MIG instances, repeated on every instance column."""
    starts, grp = mig
    return np.add.reduceat(x * weight, starts, axis=1)[:, grp]


def _device_any(busy: np.ndarray, slices: np.ndarray, mig: tuple[np.ndarray, np.ndarray] | None) -> np.ndarray:
    """Busy per physical GPU: any of its MIG instances busy (the column itself on a whole GPU)."""
    if mig is None:
        return busy
    starts, grp = mig
    return np.add.reduceat(np.where(busy, slices, 0.0), starts, axis=1)[:, grp] > 0


def _links(act: _Activity, busy_dev: np.ndarray, p: dict[str, np.ndarray],
           fx: _FaultEffects) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(PCIe generation, PCIe width, NVLinks up); a downgraded PCIe link or NVLinks down slow the traffic."""
    gen_max, width_max, links = p["gen"], p["width"], p["links"]
    gen_cur = np.where(busy_dev, gen_max, 1.0)
    width_cur = np.broadcast_to(width_max, act.u.shape)
    if fx.gen_cap is not None:
        gen_cur = np.minimum(gen_cur, fx.gen_cap)
        width_cur = np.minimum(width_cur, fx.width_cap)
        act.pcie = act.pcie * np.minimum(1.0, 2.0 ** (gen_cur - gen_max) * width_cur / width_max * 2.0)
    act.pcie = act.pcie + 2e5  # housekeeping traffic on every GPU
    up = links if fx.down is None else np.maximum(links - fx.down, 0.0)
    if fx.down is not None:
        act.nvl = act.nvl * np.where(links > 0, up / np.maximum(links, 1), 0.0)
    return gen_cur, width_cur, up


def _power(act: _Activity, f: np.ndarray, p: dict[str, np.ndarray], mig: tuple[np.ndarray, np.ndarray] | None,
           fx: _FaultEffects, n2: list[np.ndarray] | None) -> tuple[np.ndarray, np.ndarray]:
    """(power draw, power limit): the dynamic part follows SM/tensor (scaled by clock) and DRAM activity."""
    idle, limit = p["idle"], p["limit"]
    act_p = 0.08 * act.u + (0.5 * act.sm + 0.7 * act.ten) * f + 0.3 * act.dram
    if mig is not None:
        act_p = _device_sum(act_p, mig, p["slice"])
    power = idle + (limit - idle) * 0.8 * np.minimum(act_p, 1.0) * p["eff"]
    if fx.pscale is not None:
        power = idle + (power - idle) * fx.pscale
    if fx.pdraw is not None:
        power = power * fx.pdraw
    if n2 is not None:
        power = power * (1.0 + (n2[0] - 0.5) * 0.06)
    plimit = limit if fx.cap is None else fx.cap
    if fx.cap is not None:
        power = np.minimum(power, plimit * 0.99)
    return power, plimit


def _thermals(power: np.ndarray, temp_pre: np.ndarray, r_th: np.ndarray, f: np.ndarray, busy_dev: np.ndarray,
              dram: np.ndarray, n2: list[np.ndarray], p: dict[str, np.ndarray],
              mig: tuple[np.ndarray, np.ndarray] | None, fx: _FaultEffects) -> dict[str, np.ndarray]:
    """Die and HBM temperatures, SM clock and throttle flags (noisy levels only)."""
    temp = p["inlet"] + r_th * power
    if fx.heat is not None:
        temp = temp + fx.heat
    thr = temp_pre > THROTTLE_C
    temp = np.where(thr, THROTTLE_C + 1.0 + 0.12 * (temp_pre - THROTTLE_C), temp) + (n2[1] - 0.5) * 1.6
    clk = np.where(busy_dev, p["maxclk"] * f * (1.0 - 0.02 * n2[2]), p["idleclk"])
    # HBM warms with the die and with DRAM traffic (device-level: a MIG GPU's instances add up)
    dram_dev = _device_sum(dram, mig, p["slice"]) if mig is not None else dram
    memtemp = 26.0 + 0.6 * temp + 6.0 * np.minimum(dram_dev, 1.0) + (n2[3] - 0.5) * 1.2
    if fx.memheat is not None:
        memtemp = memtemp + fx.memheat
    return {"temp": temp, "memtemp": np.where(p["hbm"], memtemp, np.nan), "clk": np.round(clk / 1e6) * 1e6,
            "thr": thr, "hw": temp_pre > HW_THROTTLE_C}


def _partial_effects(fx: _FaultEffects, f: Fault, cols: np.ndarray, oc: np.ndarray, p: dict[str, np.ndarray],
                     mat: Callable[..., np.ndarray]) -> None:
    """Gauge effects of the partial failures and of healthy chip spread (see ``faults``)."""
    fp = f.params
    if f.kind == "power_deficit":
        fx.pdraw = mat(1.0) if fx.pdraw is None else fx.pdraw
        fx.pdraw[:, cols] *= np.where(oc, 1.0 - fp["deficit_fraction"], 1.0)
    elif f.kind == "power_spread":  # per physical GPU (dkey), uniform in 1 +/- spread/2
        u = (p["dkey"][cols] >> np.uint64(11)).astype(np.float64) / float(1 << 53)
        fx.pscale = mat(1.0) if fx.pscale is None else fx.pscale
        fx.pscale[:, cols] *= np.where(oc, 1.0 + (u - 0.5) * fp["spread"], 1.0)


def _storm_count(fp: dict[str, float], opened: np.ndarray, scale: float = 1.0) -> np.ndarray:
    """(T, 1) errors counted by ``opened`` seconds into a growing storm (whole errors)."""
    c = growth_count(opened, fp["start_per_second"] * scale, fp["peak_per_second"] * scale, fp["ramp_seconds"])
    return np.floor(c)[:, None]


def _slow_member(fx: _FaultEffects, f: Fault, cols: np.ndarray, on: np.ndarray, fac: np.ndarray | float,
                 shape: tuple[int, int]) -> None:
    """A member slow at its full clock (factor ``fac`` where ``on``), and its extra work per step
    (``extra_work``: the share of its extra time that is data imbalance, not stalls)."""
    fx.slow = np.ones(shape) if fx.slow is None else fx.slow
    fx.slow[:, cols] *= np.where(on, fac, 1.0)
    share = f.params.get("extra_work", 0.0)
    if share > 0.0:
        fx.work = np.ones(shape) if fx.work is None else fx.work
        fx.work[:, cols] *= np.where(on, 1.0 + share * (1.0 / fac - 1.0), 1.0)


def _straggler_effects(fx: _FaultEffects, f: Fault, cols: np.ndarray, tr: np.ndarray,
                       p: dict[str, np.ndarray]) -> None:
    """Quiet stragglers and the healthy job variations they must be told from (see ``faults``):
    slow spells at the same clock, a fixed clock factor per chip, the start-up loading phase."""
    fp, shape = f.params, (len(tr), len(p["key"]))
    on = ((tr >= f.start) & (tr < f.end))[:, None]
    if f.kind == "intermittent_straggler":  # like slow_gpu, during the spells only
        fac = 1.0 / (1.0 + fp["slowdown"] * (1.0 + p["comm"][cols]))
        _slow_member(fx, f, cols, spell_on(f, tr)[:, None], fac[None, :], shape)
    elif f.kind == "chip_spread":
        fx.binning = np.ones(shape) if fx.binning is None else fx.binning
        fx.binning[:, cols] *= np.where(on, 1.0 - fp["spread"] * per_gpu_uniform(p["key"][cols])[None, :], 1.0)
    elif f.kind == "startup":  # loading: no kernel (util 0); the loaded members wait at the first barrier
        done = f.start + fp["seconds"] * per_gpu_uniform(p["key"][cols])[None, :]
        fx.dead = np.zeros(shape, bool) if fx.dead is None else fx.dead
        fx.dead[:, cols] |= on & (tr[:, None] < done)


class Cluster:
    """A simulated cluster built from a scenario: topology, workloads, faults, ground truth."""

    def __init__(self, scenario: Scenario, seed: int | None = None, start: float | None = None):
        self.scenario = scenario
        self.seed = scenario.seed if seed is None else int(seed)
        self.start = scenario.start if start is None else float(start)
        self.duration = float(scenario.duration)
        lay = build_layout(scenario, self.seed)
        self.layout = lay
        self.gpus: GpuTable = lay.gpus
        self.jobs: list[Job] = lay.jobs
        self.faults = compile_faults(scenario, lay)
        self._init_params()
        self._ctx_cache: dict[bytes, _Ctx] = {}
        self._grid: dict[str, np.ndarray] | None = None

    # Static parameters -----------------------------------------------------------------
    def _init_params(self) -> None:
        lay, n = self.layout, len(self.gpus)
        rng = np.random.default_rng([self.seed, 7])
        m = lay.row_model
        spec = [MODELS[k] for k in MODEL_KEYS]

        def per_model(attr: str) -> np.ndarray:
            return np.array([getattr(s, attr) for s in spec], float)[m]

        phys, node = lay.row_phys, lay.row_node
        nphys, nnode = int(phys.max()) + 1 if n else 0, len(lay.nodes)
        racks = sorted(set(lay.node_rack))
        rack_off = rng.normal(0, 1.5, len(racks))
        node_inlet = 21.5 + rack_off[[racks.index(r) for r in lay.node_rack]] + rng.normal(0, 1.0, nnode)
        gpu_r = rng.normal(1.0, 0.06, nphys)
        gpu_idle = rng.normal(1.0, 0.04, nphys)
        gpu_eff = rng.normal(1.0, 0.03, nphys)
        kind = np.array([KIND_CODES[j.kind] for j in self.jobs] + [KIND_IDLE], np.int64)[lay.row_job]
        js = np.array([j.start for j in self.jobs] + [np.inf])[lay.row_job]
        je = np.array([j.end for j in self.jobs] + [np.inf])[lay.row_job]
        nj = len(self.jobs)
        job_smp = rng.uniform(0.66, 0.78, nj + 1)
        job_tp = rng.uniform(0.19, 0.26, nj + 1)
        job_mem = rng.uniform(0.7, 0.92, nj + 1)
        job_nodes = np.array([len(set(node[j.rows])) for j in self.jobs] + [1])
        job_sites = np.array([len(set(self.gpus.site[j.rows])) for j in self.jobs] + [1])
        # communication time per step, in units of one member's compute time; a gang without
        # NVLink between its members (PCIe-only GPUs) all-reduces over PCIe / the CPU interconnect.
        links_row = per_model("nvlink_links")
        job_pcie_only = np.array([len(j.rows) > 1 and bool((links_row[j.rows] == 0).any()) for j in self.jobs]
                                 + [False])
        comm = np.where(job_sites > 1, 1.8, np.where(job_nodes > 1, 0.14, 0.08)) + np.where(
            job_pcie_only, PCIE_ONLY_COMM, 0.0)
        mem_total = per_model("memory_bytes")
        mig = self.gpus.mig_profile != ""
        if mig.any():
            gb = np.array([float(p.split(".")[1].removesuffix("gb")) if p else 0.0 for p in self.gpus.mig_profile])
            mem_total = np.where(mig, gb * GIB * 0.975, mem_total)
        mem_frac = np.select(
            [kind == KIND_TRAINING, kind == KIND_INFERENCE, kind == KIND_MEMORY_BOUND, kind == KIND_IDLE_ALLOCATED],
            [job_mem[lay.row_job], np.full(n, 0.9), np.full(n, 0.6), rng.uniform(0.01, 0.3, n)], 0.0)
        nomfrac = np.array([0.0, 0.6, 0.25, 0.4, 0.01])[kind]
        key = _mix((np.arange(n, dtype=np.uint64) + np.uint64(1)) * _GOLD + np.uint64(self.seed))
        dkey = _mix((phys.astype(np.uint64) + np.uint64(1)) * _GOLD + np.uint64(self.seed * 7 + 3))
        jkey = _mix(lay.row_job.astype(np.uint64) * _GOLD + np.uint64(self.seed * 31 + 5))
        row_job = lay.row_job
        self.p: dict[str, np.ndarray] = {
            "kind": kind, "js": js, "je": je,
            "idle": per_model("idle_power") * gpu_idle[phys], "limit": per_model("power_limit"),
            "r": per_model("thermal_r") * gpu_r[phys], "inlet": node_inlet[node], "eff": gpu_eff[phys],
            "maxclk": per_model("max_sm_clock"), "idleclk": per_model("idle_sm_clock"),
            "memclk": per_model("memory_clock"), "memtot": mem_total, "memfrac": mem_frac,
            "gen": per_model("pcie_gen"), "width": per_model("pcie_width"), "links": per_model("nvlink_links"),
            "hbm": np.array([s.hbm for s in spec])[m], "gpm": per_model("gpm"),
            "nomfrac": nomfrac, "key": key, "dkey": dkey,
            "jkey": jkey,
            "job": row_job, "slice": lay.row_slice, "phys": phys,
            "smp": job_smp[row_job], "tp": job_tp[row_job], "comm": comm[row_job],
            "nvl0": np.where(per_model("nvlink_links") > 0, 150e9 * 0.14, 0.0),
            "pcie0": np.where(job_nodes[row_job] > 1, 12e9 * 0.14, 1.5e9),
            "load": np.array([j.load for j in self.jobs] + [0.0])[row_job] * rng.uniform(0.9, 1.1, n),
            "burst": np.array([j.burst for j in self.jobs] + [0.0])[row_job],
            "xfer": np.where(job_nodes[row_job] > 1, PCIE_XFER_MULTI_NODE, PCIE_XFER_SINGLE_NODE),
            "wander": rng.uniform(0, 2 * np.pi, n), "period": rng.uniform(900, 2400, n),
            "e_base": rng.uniform(2e8, 5e9, nphys)[phys], "nvl_base": rng.uniform(1e12, 1e15, nphys)[phys],
            "pcie_base": rng.uniform(1e11, 1e14, nphys)[phys],
            "ecc_agg": np.where(rng.random(nphys) < 0.2, rng.integers(1, 40, nphys), 0)[phys].astype(float),
        }
        self._derive_slowdown_params()
        self._alloc_labels = [
            None if j < 0 else {"namespace": self.jobs[j].namespace, "pod": str(lay.row_pod[r]),
                                "container": self.jobs[j].container, S.WORKLOAD: self.jobs[j].name}
            for r, j in enumerate(row_job)
        ]
        self._sharing = self._shared_rows()
        for r, (holders, _) in self._sharing.items():
            # One holder in truegpu_gpu_allocation_info, as the exporter (rules joining on it count a GPU once);
            # the sharer series name them all.
            self._alloc_labels[r] = holders[0][0]

    def _shared_rows(self) -> dict[int, tuple[list[tuple[dict[str, str], float]], float]]:
        """Rows of shared GPUs -> (each holder's allocation labels and share, the holders' overlap): a holder is
        its own workload, its pod named like the workload's with its prefix; a rest below 1 is the holder with
        empty labels. MPS clients run at once: their utilizations add up to ``MPS_OVERLAP`` x the GPU's."""
        out = {}
        for job in self.jobs:
            if not job.sharers:
                continue
            rest = 1.0 - sum(w for _, w in job.sharers)
            for r in job.rows:
                pod = str(self.layout.row_pod[r])[len(job.name):]
                holders = [({"namespace": job.namespace, "pod": name + pod, "container": job.container,
                             S.WORKLOAD: name}, w) for name, w in job.sharers]
                if rest > 1e-9:
                    holders.append(({"namespace": "", "pod": "", "container": "", S.WORKLOAD: ""}, rest))
                out[int(r)] = (holders, MPS_OVERLAP if job.sharing == "mps" else 1.0)
        return out

    def sharer_series(self, data: dict[str, np.ndarray], rows: np.ndarray
                      ) -> Iterator[tuple[int, dict[str, str], np.ndarray, np.ndarray]]:
        """Per holder of each shared row (column ``c`` of ``sample()``'s ``data`` over ``rows``): (c, its allocation
        labels, its utilization, its memory) over time, NaN while the GPU is not held: what the exporter publishes
        as truegpu_gpu_sharer_utilization_ratio and truegpu_gpu_sharer_memory_used_bytes."""
        for c, r in enumerate(rows):
            spec = self._sharing.get(int(r))
            if spec is None:
                continue
            held = ~np.isnan(data[S.GPU_ALLOCATION_INFO.name][:, c])
            u, mem = data[_k(S.GPU_UTILIZATION)][:, c], data[_k(S.MEMORY_USED)][:, c]
            for labels, w in spec[0]:
                yield (c, labels, np.where(held, np.minimum(u * w * spec[1], 1.0), np.nan),
                       np.where(held, mem * w, np.nan))

    def _derive_slowdown_params(self) -> None:
        """Faults given as a gang slowdown: derive the clock factor and, from it, the physical cause.

        A member computing at clock factor f makes the step ``1/f + comm`` instead of ``1 + comm``
        (its peers wait), so a slowdown s needs ``f = 1 / (1 + s (1 + comm))``. Thermal: the die
        temperature the throttle curve maps to f (``extra_celsius`` above this GPU's busy
        temperature); power: the limit the power-cap curve maps to f (``limit_watts``); slow_gpu:
        the factor itself (``factor``), with no clock change.
        """
        p = self.p
        for f in self.faults:
            s = f.params.get("slowdown", 0.0)
            if f.kind not in ("thermal_straggler", "power_cap", "slow_gpu") or s <= 0:
                continue
            r = int(f.rows[0])
            fac = 1.0 / (1.0 + s * (1.0 + p["comm"][r]))
            f.params["factor"] = fac
            idle, limit = p["idle"][r], p["limit"][r]
            pnom = idle + (limit - idle) * p["nomfrac"][r]
            if f.kind == "thermal_straggler":
                need = THROTTLE_C + (1.0 - fac) / 0.025
                f.params["extra_celsius"] = float(max(need - (p["inlet"][r] + p["r"][r] * pnom), 0.0))
            elif f.kind == "power_cap":
                f.params["limit_watts"] = float(idle + (pnom - idle) * fac ** (1.0 / 0.7))

    def _fault_slowdown(self, fault: Fault, job: Job) -> tuple[np.ndarray, np.ndarray]:
        """Noise-free step-time slowdown of training ``job`` caused by ``fault`` alone, on top of the job's
        healthy variation (chip spread, start-up): a slow member that is the fastest chip of its gang slows
        the gang less than its nominal ``slowdown``, and the truth says by how much it really does.

        Returns (relative times on a GRID_DT grid over the fault's window within the job,
        slowdown = step / healthy step - 1). Ground truth labels stragglers with it.
        """
        a, b = max(fault.start, job.start), min(fault.end, job.end)
        t = np.arange(a, b, GRID_DT) if b > a else np.zeros(0)
        if not len(t) or not len(job.rows):
            return t, np.zeros(len(t))
        ctx = self._ctx(np.sort(job.rows))
        variation = [(f, c) for f, c in ctx.faults if f.kind in JOB_VARIATIONS and f is not fault]
        with_f = replace(ctx, faults=variation + [(f, c) for f, c in ctx.faults if f is fault], grid={})
        healthy = replace(ctx, faults=variation, grid={})
        s1 = self._levels(t, with_f, noise=False)["step"]
        s0 = self._levels(t, healthy, noise=False)["step"]
        return t, s1[:, 0] / s0[:, 0] - 1.0

    @property
    def allocation_labels(self) -> list[dict[str, str] | None]:
        """Per row: namespace/pod/container/job of the job holding it (None if never allocated)."""
        return self._alloc_labels

    def ground_truth(self) -> list[dict]:
        """Every injected problem and intentional waste pattern (see ``faults``), absolute times."""
        return ground_truth(self.scenario, self.layout, self.faults, self.start, self._fault_slowdown)

    def rows_for(self, hostnames: Collection[str] | None) -> np.ndarray:
        """Row indices of the given hosts (all rows for None); unknown hosts raise KeyError."""
        if hostnames is None:
            return np.arange(len(self.gpus))
        hosts = set(hostnames)
        unknown = hosts - set(self.layout.nodes)
        if unknown:
            raise KeyError(f"unknown hostname(s) {sorted(unknown)}; nodes: {', '.join(self.layout.nodes[:8])}...")
        return np.flatnonzero(np.isin(self.gpus.hostname, list(hosts)))

    # Evaluation context ----------------------------------------------------------------
    def _ctx(self, rows: np.ndarray) -> _Ctx:
        ck = rows.tobytes()
        ctx = self._ctx_cache.get(ck)
        if ctx is not None:
            return ctx
        p = self.p
        n_all = len(self.gpus)
        jobs = np.unique(p["job"][rows][p["kind"][rows] == KIND_TRAINING])
        if len(rows) == n_all:
            ext, out = rows, None
        else:
            extra = [self.jobs[j].rows for j in jobs]
            ext = np.unique(np.concatenate([rows, *extra])) if extra else rows
            out = None if len(ext) == len(rows) else np.searchsorted(ext, rows)
        pe = {k: v[ext] for k, v in p.items()}
        kind = pe["kind"]
        tc = np.flatnonzero(kind == KIND_TRAINING)
        tc = tc[np.argsort(pe["job"][tc], kind="stable")]
        jt = pe["job"][tc]
        newg = np.r_[True, jt[1:] != jt[:-1]] if len(tc) else np.zeros(0, bool)
        bounds = np.flatnonzero(newg)
        jl = np.cumsum(newg) - 1
        mig = None
        if (pe["slice"] < 1).any():
            ph = pe["phys"]
            g = np.r_[True, ph[1:] != ph[:-1]]
            mig = (np.flatnonzero(g), np.cumsum(g) - 1)
        pos = np.full(n_all, -1)
        pos[ext] = np.arange(len(ext))
        faults = []
        for f in self.faults:
            cols = pos[f.rows]
            cols = cols[cols >= 0]
            if len(cols):
                faults.append((f, cols))
        ctx = _Ctx(ext, len(ext), pe, tc, bounds, jl, np.flatnonzero(kind == KIND_INFERENCE),
                   np.flatnonzero(kind == KIND_MEMORY_BOUND), np.flatnonzero(kind == KIND_IDLE_ALLOCATED),
                   mig, faults, out)
        if len(self._ctx_cache) > 256:
            self._ctx_cache.clear()
        self._ctx_cache[ck] = ctx
        return ctx

    # Core model --------------------------------------------------------------------------
    def _levels(self, tr: np.ndarray, ctx: _Ctx, noise: bool) -> dict[str, np.ndarray]:
        """Noise-free or noisy levels of every gauge at relative times ``tr`` for ctx's columns.

        Steps: what the faults do (``_fault_effects``), the clock factor heat and power caps leave
        (``_clock_factor``), what the workloads run (``_activity``), measurement noise, link state,
        power, and (noisy only) temperatures and clocks.
        """
        p = ctx.p
        t2 = tr[:, None]
        active = (t2 >= p["js"]) & (t2 < p["je"])
        fx = self._fault_effects(tr, ctx)
        f, temp_pre, r_th = self._clock_factor(active, ctx, fx)
        act = self._activity(tr, active, f, ctx, fx, noise)
        busy = act.u > 0.02
        busy_dev = _device_any(busy, p["slice"], ctx.mig)
        n2 = None
        if noise:
            n1, n2 = self._noise(tr, p)
            act.add_noise(busy, n1, n2)
        gen_cur, width_cur, up = _links(act, busy_dev, p, fx)
        power, plimit = _power(act, f, p, ctx.mig, fx, n2)
        lv = {"active": active, "u": act.u, "sm": act.sm, "ten": act.ten, "dram": act.dram, "nvl": act.nvl,
              "pcie": act.pcie, "power": power, "lost": fx.lost, "dead": fx.dead, "step": act.step}
        if n2 is None:
            return lv
        lv.update(_thermals(power, temp_pre, r_th, f, busy_dev, act.dram, n2, p, ctx.mig, fx))
        lv.update(busy=busy_dev, capped=fx.capped, plimit=plimit, gen_cur=gen_cur, width_cur=width_cur, up=up,
                  down=fx.down, occ=act.sm * 0.5)
        return lv

    @staticmethod
    def _fault_effects(tr: np.ndarray, ctx: _Ctx) -> _FaultEffects:
        """Per (time, column): what each active fault adds, scales or caps (None where no fault of that kind)."""
        p, T, n = ctx.p, len(tr), ctx.n
        fx = _FaultEffects()

        def mat(fill: float = 0.0) -> np.ndarray:
            return np.full((T, n), fill)

        for f, cols in ctx.faults:
            on = (tr >= f.start) & (tr < f.end)
            if not on.any():
                continue
            fp, oc = f.params, on[:, None]
            if f.kind == "thermal_straggler":
                fx.heat = mat() if fx.heat is None else fx.heat
                fx.heat[:, cols] += np.where(oc, fp["extra_celsius"], 0.0)
            elif f.kind == "rack_cooling":
                fx.heat = mat() if fx.heat is None else fx.heat
                ramp = np.clip((tr - f.start) / max(fp["ramp_seconds"], 1.0), 0, 1) * fp["ramp_celsius"] * on
                fx.heat[:, cols] += ramp[:, None]
            elif f.kind == "slow_gpu":
                _slow_member(fx, f, cols, oc, fp.get("factor", 1.0), (T, n))
            elif f.kind in ("intermittent_straggler", "chip_spread", "startup"):
                _straggler_effects(fx, f, cols, tr, p)
            elif f.kind == "thermal_degradation":  # higher thermal resistance: +extra at 60% of the limit
                fx.rscale = mat(1.0) if fx.rscale is None else fx.rscale
                rs = 1.0 + fp["extra_celsius"] / (p["r"][cols] * 0.6 * p["limit"][cols])
                fx.rscale[:, cols] = np.where(oc, fx.rscale[:, cols] * rs, fx.rscale[:, cols])
            elif f.kind == "power_inefficiency":
                fx.pscale = mat(1.0) if fx.pscale is None else fx.pscale
                fx.pscale[:, cols] *= np.where(oc, 1.0 + fp["extra_fraction"], 1.0)
            elif f.kind == "hbm_hot":
                fx.memheat = mat() if fx.memheat is None else fx.memheat
                fx.memheat[:, cols] += np.where(oc, fp["extra_celsius"], 0.0)
            elif f.kind in PARTIAL_FAULTS or f.kind in SPREAD_KINDS:
                _partial_effects(fx, f, cols, oc, p, mat)
            elif f.kind == "power_cap":
                fx.cap = np.broadcast_to(p["limit"], (T, n)).copy() if fx.cap is None else fx.cap
                fx.cap[:, cols] = np.where(oc, np.minimum(fx.cap[:, cols], fp["limit_watts"]), fx.cap[:, cols])
            elif f.kind == "input_starved":
                fx.starve = mat() if fx.starve is None else fx.starve
                fx.starve[:, cols] += np.where(oc, fp["starve"], 0.0)
            elif f.kind == "pcie_downgrade":
                fx.gen_cap = mat(np.inf) if fx.gen_cap is None else fx.gen_cap
                fx.width_cap = mat(np.inf) if fx.width_cap is None else fx.width_cap
                fx.gen_cap[:, cols] = np.where(oc, np.minimum(fx.gen_cap[:, cols], fp["gen"]), fx.gen_cap[:, cols])
                fx.width_cap[:, cols] = np.where(oc, np.minimum(fx.width_cap[:, cols], fp["width"]),
                                                 fx.width_cap[:, cols])
                # host<->device copies (and GPUDirect RDMA to the NIC) of a gang member crawl over the
                # slower link: the member idles (no kernel runs) while its peers wait at the barrier
                g_max, w_max = p["gen"][cols], p["width"][cols]
                ratio = 2.0 ** (g_max - np.minimum(fp["gen"], g_max)) * w_max / np.clip(fp["width"], 1.0, w_max)
                fx.starve = mat() if fx.starve is None else fx.starve
                fx.starve[:, cols] += np.where(oc, p["xfer"][cols] * (ratio - 1.0), 0.0)
            elif f.kind == "nvlink_errors":
                fx.down = mat() if fx.down is None else fx.down
                fx.down[:, cols] += np.where(oc, fp["links_down"], 0.0)
                links = p["links"][cols]
                if fp["links_down"] > 0 and (links > 0).any():
                    # the gang's all-reduce runs at its slowest GPU's NVLink bandwidth
                    up = np.maximum(links - fp["links_down"], links / NVLINK_SPEEDUP)
                    extra = np.where(links > 0, NVLINK_COMM * (links / np.maximum(up, 1e-9) - 1.0), 0.0)
                    fx.xcomm = mat() if fx.xcomm is None else fx.xcomm
                    fx.xcomm[:, cols] = np.maximum(fx.xcomm[:, cols], np.where(oc, extra, 0.0))
            elif f.kind == "xid" and (f.code in KILLING_XIDS or f.code == 79):
                fx.dead = np.zeros((T, n), bool) if fx.dead is None else fx.dead
                fx.dead[:, cols] |= oc
                if f.code == 79:
                    fx.lost = np.zeros((T, n), bool) if fx.lost is None else fx.lost
                    fx.lost[:, cols] |= (oc & (tr >= f.start + LOST_AFTER)[:, None])
        return fx

    @staticmethod
    def _clock_factor(active: np.ndarray, ctx: _Ctx, fx: _FaultEffects) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(clock factor f, die temperature before throttling, thermal resistance): heat and power caps throttle.

        Sets ``fx.capped`` where a power cap bites.
        """
        p = ctx.p
        idle, limit = p["idle"], p["limit"]
        dyn = p["nomfrac"] if fx.pscale is None else p["nomfrac"] * fx.pscale
        pnom = np.where(active, idle + (limit - idle) * dyn, idle)
        if ctx.mig is not None:  # a MIG GPU heats and throttles as one device
            starts, grp = ctx.mig
            pnom = idle + np.add.reduceat((pnom - idle) * p["slice"], starts, axis=1)[:, grp]
        r_th = p["r"] if fx.rscale is None else p["r"] * fx.rscale
        temp_pre = p["inlet"] + r_th * pnom
        if fx.heat is not None:
            temp_pre = temp_pre + fx.heat
        f = np.clip(1.0 - 0.025 * (temp_pre - THROTTLE_C), 0.4, 1.0)
        if fx.binning is not None:  # healthy chip-to-chip spread: some chips reach a lower clock
            f = f * fx.binning
        cap = fx.cap
        if cap is not None:
            fx.capped = pnom > cap
            f = f * np.where(fx.capped, np.clip(((cap - idle) / np.maximum(pnom - idle, 1.0)) ** 0.7, 0.4, 1.0), 1.0)
        return f, temp_pre, r_th

    def _activity(self, tr: np.ndarray, active: np.ndarray, f: np.ndarray, ctx: _Ctx, fx: _FaultEffects,
                  noise: bool) -> _Activity:
        """What each workload kind keeps its columns doing (noise-free, but for the training step-mix drift)."""
        act = _Activity.zeros((len(tr), ctx.n))
        if len(ctx.tc):
            _training(act, tr, active, f, ctx, fx, noise)
        if len(ctx.ic):
            _inference(act, tr + self.start, active, ctx, fx)
        if len(ctx.mc):
            _memory_bound(act, active, ctx, fx)
        return act

    @staticmethod
    def _noise(tr: np.ndarray, p: dict[str, np.ndarray]) -> tuple[list[np.ndarray], list[np.ndarray]]:
        """Uniform draws keyed by (whole virtual second, row) and by (second, physical GPU)."""
        tsec = np.floor(tr + 1e-9).astype(np.int64).astype(np.uint64)
        n1 = _uniforms(_hash(tsec, p["key"]))
        n2 = _uniforms(_hash(tsec, p["dkey"]))  # device-level: shared by a GPU's MIG instances
        return n1, n2

    # Counters -----------------------------------------------------------------------------
    def _grid_cum(self) -> dict[str, np.ndarray]:
        """Cumulative integrals of noise-free power and link rates on a GRID_DT grid (all rows)."""
        if self._grid is None:
            g = int(np.ceil(self.duration / GRID_DT)) + 2
            tg = np.arange(g) * GRID_DT
            ctx = self._ctx(np.arange(len(self.gpus)))
            lv = self._levels(tg, ctx, noise=False)
            self._grid = {}
            for k in ("power", "nvl", "pcie"):
                r = lv[k]
                cum = np.zeros_like(r)
                cum[1:] = np.cumsum((r[1:] + r[:-1]) * (GRID_DT / 2), axis=0)
                self._grid[k] = cum
        return self._grid

    def _integral(self, name: str, trm: np.ndarray, k: np.ndarray, ctx: _Ctx) -> np.ndarray:
        c = ctx.grid.get(name)
        if c is None:
            cum = self._grid_cum()[name]
            c = ctx.grid[name] = cum[:, ctx.rows] if ctx.n != cum.shape[1] else cum
        g = c.shape[0]
        x = np.maximum(trm, 0.0) / GRID_DT
        i = np.minimum(x.astype(np.int64), g - 2)
        fr = (x - i)[:, None]
        val = c[i] + (c[i + 1] - c[i]) * fr
        if k.any():
            xd = self.duration / GRID_DT
            idd = min(int(xd), g - 2)
            full = c[idd] + (c[idd + 1] - c[idd]) * (xd - idd)
            val = val + k[:, None] * full
        return val

    @staticmethod
    def _ramp(trm: np.ndarray, k: np.ndarray, s: float, e: float, duration: float) -> np.ndarray:
        """Seconds a window [s, e) has been open by relative time trm (plus k full cycles)."""
        return np.clip(trm - s, 0.0, e - s) + k * max(min(e, duration) - s, 0.0)

    # Public sampling --------------------------------------------------------------------
    def sample(self, times: np.ndarray, rows: np.ndarray | None = None, *, wrap: bool = False) -> dict[str, np.ndarray]:
        """One (T, N) array per signal (keys: SAMPLE_SIGNALS) at absolute unix ``times``.

        ``rows`` restricts the columns (row indices, e.g. ``rows_for(hosts)``); gang-mates
        on other nodes are evaluated internally so barrier effects stay right. ``wrap``
        loops the scenario past its end (gauges repeat, counters keep growing).
        """
        times = np.atleast_1d(np.asarray(times, float))
        tr = times - self.start
        k = np.zeros(len(tr))
        if wrap:
            k = np.floor(tr / self.duration)
            tr = tr - k * self.duration
        rows = np.arange(len(self.gpus)) if rows is None else np.asarray(rows, np.int64)
        ctx = self._ctx(rows)
        lv = self._levels(tr, ctx, noise=True)
        out = self._assemble(tr, k, ctx, lv)
        if ctx.out is not None:
            out = {key: v[:, ctx.out] for key, v in out.items()}
        return out

    def _assemble(self, trm: np.ndarray, k: np.ndarray, ctx: _Ctx, lv: dict) -> dict[str, np.ndarray]:
        p, T, n = ctx.p, len(trm), ctx.n
        o: dict[str, np.ndarray] = {}
        zeros = np.zeros((T, n))

        def full(v: np.ndarray | float) -> np.ndarray:
            return np.array(np.broadcast_to(v, (T, n)), dtype=float)

        mig_inst = p["slice"] < 1
        u, sm, dram = lv["u"], lv["sm"], lv["dram"]
        o[_k(S.GPU_UTILIZATION)] = np.where(mig_inst, np.nan, u) if mig_inst.any() else u
        memu = np.minimum(dram * 0.9, 1.0)
        o[_k(S.MEMORY_UTILIZATION)] = np.where(mig_inst, np.nan, memu) if mig_inst.any() else memu
        o[_k(S.SM_ACTIVE)] = sm
        o[_k(S.SM_OCCUPANCY)] = lv["occ"]
        o[_k(S.TENSOR_ACTIVE)] = lv["ten"]
        o[_k(S.DRAM_ACTIVE)] = dram
        o[_k(S.GRAPHICS_ENGINE_ACTIVE)] = np.where(lv["busy"], np.minimum(u * 0.99 + sm * 0.01, 1.0), 0.0)
        o[_k(S.MEMORY_USED)] = np.where(lv["active"], p["memtot"] * p["memfrac"], 0.0) + np.where(
            mig_inst, 0.0, 5 * 2**20)
        o[_k(S.MEMORY_TOTAL)] = full(p["memtot"])
        o[_k(S.POWER)] = lv["power"]
        o[_k(S.POWER_LIMIT)] = full(lv["plimit"])
        o[_k(S.ENERGY)] = p["e_base"] + self._integral("power", trm, k, ctx)
        o[_k(S.TEMPERATURE, "gpu")] = lv["temp"]
        o[_k(S.TEMPERATURE, "memory")] = lv["memtemp"]
        o[_k(S.SM_CLOCK)] = lv["clk"]
        o[_k(S.SM_CLOCK_MAX)] = full(p["maxclk"])
        o[_k(S.MEMORY_CLOCK)] = full(p["memclk"])
        reasons = {
            "idle": ~lv["busy"], "sw_power_cap": lv["capped"] if lv["capped"] is not None else None,
            "sw_thermal": lv["thr"], "hw_thermal": lv["hw"], "hw_slowdown": lv["hw"],
        }
        for r in S.CLOCK_EVENT_REASONS.values():
            v = reasons.get(r)
            o[_k(S.CLOCK_EVENT_ACTIVE, r)] = zeros.copy() if v is None else v.astype(float)
        nvlink = p["links"] > 0
        nv = self._integral("nvl", trm, k, ctx)
        pc = self._integral("pcie", trm, k, ctx)
        if ctx.mig is not None:
            # Links belong to the physical GPU: its counters carry all its instances' traffic,
            # the same on every instance row (as device-level series are everywhere else).
            starts, grp = ctx.mig
            nv = np.add.reduceat(nv, starts, axis=1)[:, grp]
            pc = np.add.reduceat(pc, starts, axis=1)[:, grp]
        o[_k(S.NVLINK_BYTES, "tx")] = np.where(nvlink, p["nvl_base"] + nv, np.nan)
        o[_k(S.NVLINK_BYTES, "rx")] = np.where(nvlink, p["nvl_base"] * 1.01 + nv * 0.985, np.nan)
        o[_k(S.PCIE_BYTES, "tx")] = p["pcie_base"] + pc
        o[_k(S.PCIE_BYTES, "rx")] = p["pcie_base"] * 1.3 + pc * 1.3
        o[_k(S.PCIE_LINK_GENERATION, "current")] = full(lv["gen_cur"])
        o[_k(S.PCIE_LINK_GENERATION, "max")] = full(p["gen"])
        o[_k(S.PCIE_LINK_WIDTH, "current")] = full(lv["width_cur"])
        o[_k(S.PCIE_LINK_WIDTH, "max")] = full(p["width"])
        # error counters: closed forms of the fault windows
        xid = {c: zeros.copy() for c in XID_CODES}
        ecc_cv, ecc_uv = zeros.copy(), zeros.copy()
        rr_c, rr_u, pending, failure = zeros.copy(), zeros.copy(), zeros.copy(), zeros.copy()
        nvle = {t: zeros.copy() for t in S.NVLINK_ERROR_TYPES}
        replays = zeros.copy()
        D = self.duration
        for f, fc in ctx.faults:
            fp = f.params
            opened = self._ramp(trm, k, f.start, f.end, D)  # (T,)
            if f.kind == "xid":
                hit = trm >= f.start
                events = (hit + k).astype(float) * fp["events"] if k.any() else hit * fp["events"]
                xid[f.code][:, fc] += events[:, None]
                on = ((trm >= f.start) & (trm < f.end))[:, None].astype(float)
                if f.code in KILLING_XIDS:
                    ecc_uv[:, fc] += events[:, None]
                    rr_u[:, fc] += events[:, None]
                    pending[:, fc] = np.maximum(pending[:, fc], on)
                elif f.code == 63:
                    ecc_cv[:, fc] += np.floor(0.05 * opened)[:, None] + events[:, None]
                    rr_c[:, fc] += events[:, None]
                    pending[:, fc] = np.maximum(pending[:, fc], on)
                elif f.code == 64:
                    ecc_uv[:, fc] += events[:, None]
                    failure[:, fc] = np.maximum(failure[:, fc], on)
            elif f.kind == "nvlink_errors":
                rate = fp["crc_per_second"]
                for t, share in zip(S.NVLINK_ERROR_TYPES, (1.0, 0.2, 0.1, 0.01), strict=True):
                    nvle[t][:, fc] += np.floor(rate * share * opened)[:, None]
            elif f.kind == "pcie_downgrade":
                replays[:, fc] += np.floor(fp["replays_per_second"] * opened)[:, None]
            elif f.kind == "ecc_storm":
                ecc_cv[:, fc] += _storm_count(fp, opened)
            elif f.kind == "nvlink_crc_rising":
                for t, share in zip(S.NVLINK_ERROR_TYPES, (1.0, 0.2, 0.1, 0.01), strict=True):
                    nvle[t][:, fc] += np.floor(_storm_count(fp, opened, scale=share))
        for c in XID_CODES:
            o[_k(S.XID_ERRORS, str(c))] = xid[c]
        o[_k(S.ECC_ERRORS, "correctable", "volatile")] = ecc_cv
        o[_k(S.ECC_ERRORS, "correctable", "aggregate")] = ecc_cv + p["ecc_agg"]
        o[_k(S.ECC_ERRORS, "uncorrectable", "volatile")] = ecc_uv
        o[_k(S.ECC_ERRORS, "uncorrectable", "aggregate")] = ecc_uv.copy()
        o[_k(S.REMAPPED_ROWS, "correctable")] = rr_c
        o[_k(S.REMAPPED_ROWS, "uncorrectable")] = rr_u
        o[_k(S.ROW_REMAP_PENDING)] = pending
        o[_k(S.ROW_REMAP_FAILURE)] = failure
        for t in S.NVLINK_ERROR_TYPES:
            o[_k(S.NVLINK_ERRORS, t)] = np.where(nvlink, nvle[t], np.nan)
        o[_k(S.NVLINK_LINKS, "up")] = np.where(nvlink, full(lv["up"]), np.nan)
        o[_k(S.NVLINK_LINKS, "down")] = np.where(nvlink, zeros if lv["down"] is None else lv["down"], np.nan)
        o[_k(S.GPU_ALLOCATION_INFO)] = np.where(lv["active"], 1.0, np.nan)
        o[_k(S.PCIE_REPLAYS)] = replays
        # Profiling families stay on every model: a real node pairs NVML with dcgm-exporter,
        # which profiles A100/L40S too; gpm_supported says what NVML alone could do.
        o[_k(S.GPM_SUPPORTED)] = full(p["gpm"])
        lost = lv["lost"]
        if lost is not None and lost.any():
            for v in o.values():
                v[lost] = np.nan
        return {key: o[key] for key in _SAMPLE_KEYS}

    def series(self, times: np.ndarray, hostnames: Collection[str] | None = None
               ) -> Iterator[tuple[Metric, dict[str, str], np.ndarray]]:
        """Every contract series (gauges, counters, info), grouped by metric in schema order.

        Labels are exactly ``metric.all_labels`` (+ gpu_instance/mig_profile on MIG instance
        rows of instance-level families); values align with ``times``, NaN = no sample.
        """
        times = np.atleast_1d(np.asarray(times, float))
        rows = self.rows_for(hostnames)
        data = self.sample(times, rows)
        g = self.gpus
        dev = g.device_row[rows]
        base = [{S.HOSTNAME: str(g.hostname[r]), S.GPU: str(g.gpu[r]), S.UUID: str(g.uuid[r])} for r in rows]
        inst = [dict(b, **{S.GPU_INSTANCE: str(g.gpu_instance[r]), S.MIG_PROFILE: str(g.mig_profile[r])})
                if g.mig_profile[r] else b for b, r in zip(base, rows, strict=True)]
        present = np.where(np.isnan(data[S.POWER.name]), np.nan, 1.0)
        by_metric: dict[Metric, list[tuple[dict[str, str], str]]] = {}
        for m, lbl, key in SAMPLE_SIGNALS:
            by_metric.setdefault(m, []).append((lbl, key))
        for m in S.METRICS:
            if m not in PRODUCED and m not in _INFO and m not in _SHARER_METRICS:
                continue
            if m is S.NODE_INFO:
                nodes = list(dict.fromkeys(g.hostname[rows]))
                for host in nodes:
                    i = self.layout.nodes.index(host)
                    yield m, {S.HOSTNAME: host, "site": self.layout.node_site[i], "rack": self.layout.node_rack[i]}, \
                        np.ones(len(times))
            elif m is S.GPU_INFO:
                for c, r in enumerate(rows):
                    if dev[c]:
                        yield m, dict(base[c], model=str(g.model[r]), driver_version=str(g.driver_version[r]),
                                      pci_bus_id=str(g.pci_bus_id[r]), numa_node=str(g.numa_node[r])), present[:, c]
            elif m is S.GPU_TOPOLOGY_INFO:
                for c, r in enumerate(rows):
                    if not dev[c]:
                        continue
                    gi = int(g.gpu[r])
                    model = MODEL_KEYS[self.layout.row_model[r]]
                    for peer in range(self.layout.node_gpus[self.layout.row_node[r]]):
                        if peer != gi:
                            yield m, dict(base[c], peer_gpu=str(peer), link=closest_link(model, gi, peer)), \
                                present[:, c]
            elif m is S.GPU_ALLOCATION_INFO:
                for c, r in enumerate(rows):
                    al = self._alloc_labels[r]
                    if al is not None:
                        yield m, dict(inst[c], **al), data[S.GPU_ALLOCATION_INFO.name][:, c]
            elif m in _SHARER_METRICS:
                for c, labels, util, mem in self.sharer_series(data, rows):
                    yield m, dict(base[c], **labels), util if m is S.SHARER_UTILIZATION else mem
            else:
                per_inst = m in INSTANCE_METRICS
                for c in range(len(rows)):
                    if not per_inst and not dev[c]:
                        continue
                    for lbl, key in by_metric[m]:
                        yield m, dict(inst[c] if per_inst else base[c], **lbl), data[key][:, c]
