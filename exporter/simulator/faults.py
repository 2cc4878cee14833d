"""Injected faults and intentional waste, resolved onto rows, with their ground truth.

Ground-truth records follow the detectors' taxonomy. Every record has ``kind``
(straggler, gpu_fault, degraded_gpu, thermal, topology, idle_masking, idle_allocated),
``hostname``, ``gpu`` (None = the whole node), ``job``, ``start``/``end`` (absolute
seconds), ``cause`` (one sentence) and ``attribution``, a machine-readable token; straggler records
also carry ``slowdown``, the gang's step-time slowdown at its worst (a fraction, below):

* straggler: ``thermal`` | ``power`` | ``pcie`` | ``nvlink`` | ``input`` | ``unknown``
* gpu_fault: ``xid48`` ``xid63`` ``xid64`` ``xid79`` ``xid94`` ``xid95`` | ``pcie_downgrade`` | ``nvlink``
  | ``ecc_storm``
* degraded_gpu: ``power_cap`` | ``thermal_degradation`` | ``power_inefficiency`` | ``hbm_hot``
  | ``power_deficit``
* thermal: ``gpu_cooling`` (one GPU) | ``rack_cooling`` (one record per node of the rack)
* topology: ``wan`` | ``mig`` | ``numa`` | ``no_nvlink`` (one record per node of the job, ``job`` set)
* idle_masking: ``memory_bound``; idle_allocated: ``unused_allocation``

Straggler truth is computed, not assumed: for each fault that can slow a synchronous
training gang (thermal_straggler, power_cap, slow_gpu, input_starved, pcie_downgrade,
nvlink_errors, rack_cooling), the model evaluates the gang's noise-free step time with
that fault alone against the healthy step (``Cluster._fault_slowdown``) on a 30 s grid; the
straggler record covers the span where the step is >= ``STRAGGLER_MIN_SLOWDOWN`` (5%)
slower (the issue's hardest case is 10%). Below that, the fault still has its own record.

What each fault looks like in the signals (what a detector should find):

* ``thermal_straggler`` (one GPU, ``extra_celsius`` or ``slowdown``): the GPU runs hotter than
  its neighbours (failing fan). Above 85 C it throttles: ``sw_thermal`` (and, far above,
  ``hw_thermal``/``hw_slowdown``) clock events, SM clock below max, the die pinned at
  ~86-90 C. In a training gang it is the slowest member: it keeps computing (SM activity
  stays high, cycle-counted) while its peers wait at the barrier: their GPU util stays ~97%
  but SM and tensor activity fall by the same factor. ``slowdown`` (e.g. 0.1) sets the
  gang's step-time slowdown exactly; the temperature excess is derived from it.
  Ground truth: ``thermal``/gpu_cooling + ``straggler``/thermal (in a gang).
* ``power_cap`` (one GPU, ``limit_watts`` or ``slowdown``): the enforced power limit drops
  below its peers'; power flat at the cap, ``sw_power_cap`` active, lower SM clock (clock vs
  throttle state: the GPU is not hot, its limit is low); gang peers wait as above.
  Ground truth: ``degraded_gpu``/power_cap + ``straggler``/power (in a gang).
* ``slow_gpu`` (one GPU, ``slowdown``, ``extra_work`` 0): a member computes slower with no visible
  reason (full clock, no clock event, normal temperature and power): peers wait at the barrier.
  ``extra_work`` is the share of its extra time that is extra work (data imbalance: more tokens,
  its tensor work and memory traffic per step grow with it); the rest stalls (a weak GPU/HBM: the
  same work per step in more cycles, so only SM activity, which counts cycles with warps resident,
  shows the member busier; tensor activity and memory traffic, the same work over the same step,
  stay with its peers'). With ``extra_work`` 0 a stalling member is invisible where SM activity is
  not collected (dcgm-exporter's default counters): its truth says so (``needs``).
  Ground truth: ``straggler``/unknown.
* ``intermittent_straggler`` (one GPU, ``slowdown`` 0.15, ``period`` 600 s, ``duty`` 0.3): the
  member is slow only in recurring spells: the first ``duty x period`` seconds of every
  ``period`` from ``start`` it computes like a ``slow_gpu`` (``extra_work`` 0) that slows the gang by ``slowdown``
  (same clock, no clock event), in between it is healthy. Each spell its peers wait at the
  barrier (SM and tensor activity down, util ~97%) while it is the busiest member; a spell
  of 3 minutes is shorter than any one-episode persistence rule, only the recurrence tells.
  Ground truth: ``straggler``/unknown from the first spell's start to the last spell's end
  (the span it recurs over; ``_straggler_span`` of the spells' slowdown).
* ``chip_spread`` (a training job, ``spread`` 0.04; healthy variation, *no* ground truth):
  chip-to-chip spread of healthy GPUs of one model under the same power cap: each member
  reaches a fixed clock factor ``1 - spread x u`` (``u`` uniform in [0, 1) per GPU from the
  seed), so the slowest chip really sets the gang's step, a little. ``spread`` is at most
  0.05, which slows the gang < 5% (``STRAGGLER_MIN_SLOWDOWN``): variation a detector must
  tolerate, not a straggler.
* ``startup`` (a training job, ``seconds`` 300; healthy, *no* ground truth): the job's start-up
  phase: from ``start`` every member loads its data/checkpoint for ``seconds x u`` (``u`` per
  GPU from the seed) with no kernel running (util 0), while the members that finished wait at
  the first barrier inside NCCL (util ~97%, SM ~5%, no tensor work), as a hung gang looks;
  then the gang steps normally. The last member to load is not a straggler.
* ``input_starved`` (one node of a training job, ``starve`` = data wait per step in units
  of compute time): every GPU of that node has true idle gaps, so GPU util drops too
  (unlike a compute straggler); the peers on other nodes wait at the barrier (high util,
  low SM). Ground truth: ``straggler``/input with ``gpu`` None.
* ``pcie_downgrade`` (one GPU, ``gen``, ``width``): current PCIe generation/width below max
  while busy, replay counter grows, PCIe throughput drops. In a training gang, the member's
  host<->device copies and GPUDirect RDMA traffic to the NIC cross the slower link: per step it
  idles ``xfer * (bandwidth ratio - 1)`` extra (xfer: ``PCIE_XFER_SINGLE_NODE`` 0.01 /
  ``PCIE_XFER_MULTI_NODE`` 0.03 of the compute time at full link speed), so its GPU util
  dips a little and its peers wait at the barrier: H100 gen3 x8 (1/8 of gen5 x16) slows a
  2-node gang ~18%, a single-node one ~6%. Ground truth: ``gpu_fault``/pcie_downgrade
  (+ ``straggler``/pcie where the gang is >= 5% slower).
* ``nvlink_errors`` (one GPU, ``crc_per_second``, ``links_down``): NVLink CRC flit/data,
  replay and recovery counters grow; ``links_down`` links report state=down and NVLink
  traffic shrinks in proportion. CRC replays cost microseconds (no slowdown); links down cut
  the GPU's NVLink bandwidth and the gang's all-reduce runs at its slowest member's
  bandwidth: all members spend ``NVLINK_COMM * (links / up - 1)`` longer in the collective
  (2 of 18 down: ~1%, no straggler truth; 12 of 18 down: ~14%). Ground truth:
  ``gpu_fault``/nvlink (+ ``straggler``/nvlink where the gang is >= 5% slower).
* ``xid`` (one GPU, ``code``):
  79 fallen off the bus: the XID counter ticks, 30 s later every series of the GPU is
  NaN (absent) while the node's other GPUs go on; gang peers hang in NCCL (util ~97%,
  SM ~5%). 48 double-bit ECC: uncorrectable ECC +1 (volatile and aggregate), an
  uncorrectable remapped row, ``row_remap_pending`` 1; the process on it dies (util 0)
  and gang peers hang. 94/95 contained/uncontained ECC: as 48 (94 kills only the
  process on that GPU, 95 needs a GPU reset). 63 row-remap event: correctable ECC grow,
  a correctable remapped row, remap pending; the job continues. 64 row-remap failure:
  ``row_remap_failure`` 1. Ground truth: ``gpu_fault``/xidNN (all codes: hard signals).
* ``rack_cooling`` (a rack, ``nodes`` = how many of its nodes, 0 = all;
  ``ramp_celsius`` over ``ramp_seconds``): inlet temperature ramps up on those nodes, all
  their GPUs warm together; busy ones eventually cross 85 C and throttle (thermal clock
  events, lower clock, gang peers elsewhere wait). Ground truth: ``thermal``/rack_cooling
  per node; a gang with members both inside and outside the hot nodes also gets
  ``straggler``/thermal per hot node (gpu None) while it is >= 5% slower. A gang entirely
  inside the hot nodes is slowed as a whole: that is the rack's thermal finding, no straggler.

Soft degradations (``degraded_gpu``; no clock event, no XID, no error counter, normal
clocks and util: only a relation between signals is off, found against peers running the
same job):

* ``thermal_degradation`` (one GPU, ``extra_celsius`` 12): dried thermal paste / a weak
  fan: the die-to-inlet thermal resistance rises so the GPU runs ``extra_celsius`` hotter at
  60% of its power limit (scales with power: ~+13 C in training, ~+2 C idle); it stays below
  the 85 C throttle point in the bundled scenarios. Relation: temperature vs power.
* ``power_inefficiency`` (one GPU, ``extra_fraction`` 0.25): the dynamic power (above idle)
  is 25% higher for the same SM/tensor/DRAM activity and clock (leaky silicon, VRM losses);
  energy and temperature follow. Relation: power vs SM activity.
* ``hbm_hot`` (one HBM GPU, ``extra_celsius`` 10): memory temperature ``extra_celsius``
  above what the die temperature and DRAM activity predict. Relation: memory temperature
  vs GPU temperature (HBM otherwise reads ~26 + 0.6 x die + 6 x DRAM activity).

Quiet partial failures (no XID, nothing crosses a hard limit at first):

* ``ecc_storm`` (one GPU, ``start_per_second`` 0.02, ``peak_per_second`` 3, ``ramp_seconds``
  3600): correctable (single-bit) ECC errors, volatile and aggregate, at a rate that leaves
  the healthy background (~0/s) at ``start_per_second`` and grows exponentially to
  ``peak_per_second`` over ``ramp_seconds`` (then stays there): HBM cells degrading. No XID,
  no uncorrectable error, the job runs on. Ground truth: ``gpu_fault``/ecc_storm from the
  fault's start (the rate has left normal there).
* ``nvlink_crc_rising`` (one NVLink GPU, same growth parameters, defaults ``start_per_second``
  0.1, ``peak_per_second`` 20, ``ramp_seconds`` 2400): NVLink CRC/replay/recovery counters grow
  at a rate that keeps rising (a marginal link getting worse); no link goes down, so no
  slowdown. Ground truth: ``gpu_fault``/nvlink from the fault's start.
* ``power_deficit`` (one GPU, ``deficit_fraction`` 0.25): the GPU draws ``deficit_fraction``
  less power than its model predicts for its activity at full clock (a failing VRM or power
  sensor, a power-delivery limit nobody configured); util, SM/tensor activity and clocks stay
  those of its peers, the die runs cooler with the lower power. Ground truth:
  ``degraded_gpu``/power_deficit.
* ``power_spread`` (a whole job ``{job}`` or node ``{hostname}``, ``spread`` 0.2): healthy
  chip-to-chip variation, *not* a fault (no ground truth): each GPU's dynamic power is scaled
  by its own factor, uniform in 1 +/- ``spread``/2 (seeded per GPU), as leakage differs from
  chip to chip; fleet studies report spreads up to ~20% across one model. Detectors must not
  flag these GPUs.

Waste patterns and placement mistakes from workloads (ground truth, no fault needed):
``memory_bound`` jobs (GPU util ~95%, SM ~20%, DRAM ~75%; power per SM activity and HBM
temperature high for the *whole job*: a workload difference, not a degraded GPU) ->
``idle_masking`` per GPU; ``idle_allocated`` (allocated to a pod, util ~0) ->
``idle_allocated`` per GPU; training jobs placed badly -> ``topology`` per node of the job:
``wan`` (nodes span sites: all-reduce over the WAN, comm-bound: low SM/tensor, long barrier
waits), ``mig`` (a data-parallel gang on MIG slices: no NVLink P2P between instances),
``numa`` (a gang's GPUs on one node span both NUMA nodes although they would fit in one:
labels only, ``numa_node`` of ``gpu_info``), ``no_nvlink`` (a gang on PCIe-only GPUs such as
L40S: ``PCIE_ONLY_COMM`` more all-reduce time per step, SM/tensor lower, topology links
``pcie_switch``/``numa``/``system``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from exporter.simulator.scenario import FaultSpec, Scenario, ScenarioError
from exporter.simulator.topology import MODEL_KEYS, MODELS, Job, Layout

#: Seconds from the XID 79 event until the GPU's telemetry disappears.
LOST_AFTER = 30.0
GPU_FAULTS = ("thermal_straggler", "power_cap", "pcie_downgrade", "nvlink_errors", "xid", "slow_gpu",
              "thermal_degradation", "power_inefficiency", "hbm_hot", "intermittent_straggler")
#: Healthy variation injected like a fault on a whole training job: shapes signals, no ground truth.
JOB_VARIATIONS = ("chip_spread", "startup")
#: A fault makes its gang member a straggler while the gang's step is at least this much slower.
STRAGGLER_MIN_SLOWDOWN = 0.05
#: Host<->device (and GPUDirect RDMA) transfer time per step at full PCIe speed, in compute units.
PCIE_XFER_SINGLE_NODE = 0.01
PCIE_XFER_MULTI_NODE = 0.03
#: NVLink part of a gang's all-reduce per step (compute units) and NVLink vs PCIe fallback bandwidth.
NVLINK_COMM = 0.08
NVLINK_SPEEDUP = 8.0
#: Extra all-reduce time per step of a gang without NVLink between its members (PCIe-only GPUs).
PCIE_ONLY_COMM = 0.3
#: Faults that can slow a training gang, and the straggler attribution they carry.
STRAGGLER_CAUSE = {"thermal_straggler": "thermal", "power_cap": "power", "slow_gpu": "unknown",
                   "input_starved": "input", "pcie_downgrade": "pcie", "nvlink_errors": "nvlink",
                   "rack_cooling": "thermal", "intermittent_straggler": "unknown"}
#: Faults that slow a member at its full clock: by stalls (only SM activity shows) unless ``extra_work``.
STALLING = ("slow_gpu", "intermittent_straggler")
KILLING_XIDS = (48, 94, 95)
#: Partial failures (issue 12) and healthy variation: their kinds, and the error-rate growth profile.
PARTIAL_FAULTS = ("ecc_storm", "nvlink_crc_rising", "power_deficit")
SPREAD_KINDS = ("power_spread",)


@dataclass
class Fault:
    kind: str
    rows: np.ndarray  # affected rows (all MIG instances of an affected GPU)
    start: float  # relative seconds
    end: float  # relative seconds
    params: dict[str, float]
    job: str | None
    hostname: str
    gpu: str | None
    spec: FaultSpec | None = None

    @property
    def code(self) -> int:
        return int(self.params.get("code", 0))


def spell_on(f: Fault, tr: np.ndarray) -> np.ndarray:
    """Where an ``intermittent_straggler`` is in a slow spell at relative times ``tr`` (bool, per time)."""
    period = max(f.params["period"], 1.0)
    return (tr >= f.start) & (tr < f.end) & (np.mod(tr - f.start, period) < f.params["duty"] * period)


def per_gpu_uniform(keys: np.ndarray) -> np.ndarray:
    """A fixed uniform in [0, 1) per row from its (seeded) noise key: which chip is slower, who loads last."""
    return ((keys >> np.uint64(11)) & np.uint64(0xFFFF)).astype(np.float64) / 65536.0


def _resolve(sc: Scenario, lay: Layout, f: FaultSpec) -> tuple[np.ndarray, str | None, str, str | None]:
    """Target -> (rows, job, hostname, gpu)."""
    t = f.target
    host_arr, gpu_arr = lay.gpus.hostname, lay.gpus.gpu

    def err(msg: str) -> ScenarioError:
        return ScenarioError(f"{sc.path}: {f.where}.target: {msg}")

    if f.kind in SPREAD_KINDS:
        return _resolve_group(sc, lay, f)
    job_name = t.get("job")
    job = None
    if job_name is not None:
        job = next((j for j in lay.jobs if j.name == job_name), None)
        if job is None:
            raise err(f"no workload named {job_name!r}")
        if not len(job.rows):
            raise err(f"workload {job_name!r} has no GPUs")
    if f.kind == "rack_cooling":
        rack = t.get("rack")
        if rack is None:
            raise err("rack_cooling needs target.rack (e.g. dc1-r1)")
        nodes = [n for n, r in zip(lay.nodes, lay.node_rack, strict=True) if r == rack]
        if not nodes:
            raise err(f"no rack {rack!r} (racks: {', '.join(sorted(set(lay.node_rack)))})")
        k = int(f.params["nodes"]) or len(nodes)
        nodes = nodes[:k]
        return np.flatnonzero(np.isin(host_arr, nodes)), None, ",".join(nodes), None
    if f.kind in JOB_VARIATIONS:
        if job is None or job.kind != "training":
            raise err(f"{f.kind} needs target.job (a training workload)")
        return job.rows, job.name, str(host_arr[job.rows[0]]), None
    if f.kind == "input_starved":
        if job is None:
            raise err("input_starved needs target.job (a training workload)")
        if job.kind != "training":
            raise err(f"input_starved needs a training workload, {job_name!r} is {job.kind}")
        hosts = list(dict.fromkeys(host_arr[job.rows]))
        nr = t.get("node_rank", 0)
        if not isinstance(nr, int) or not 0 <= nr < len(hosts):
            raise err(f"node_rank must be 0..{len(hosts) - 1}")
        rows = job.rows[host_arr[job.rows] == hosts[nr]]
        return rows, job.name, str(hosts[nr]), None
    # one GPU
    if job is not None:
        rank = t.get("rank", 0)
        if not isinstance(rank, int) or not 0 <= rank < len(job.rows):
            raise err(f"rank must be 0..{len(job.rows) - 1}")
        r = job.rows[rank]
        host, gpu = str(host_arr[r]), str(gpu_arr[r])
    else:
        if "hostname" not in t or "gpu" not in t:
            raise err("give {job, rank} or {hostname, gpu}")
        host, gpu = str(t["hostname"]), str(t["gpu"])
    rows = np.flatnonzero((host_arr == host) & (gpu_arr == gpu))
    if not len(rows):
        raise err(f"no GPU {gpu} on host {host!r}")
    jobs = {int(lay.row_job[r]) for r in rows if lay.row_job[r] >= 0}
    jname = lay.jobs[min(jobs)].name if jobs else None
    return rows, jname, host, gpu


def _resolve_group(sc: Scenario, lay: Layout, f: FaultSpec) -> tuple[np.ndarray, str | None, str, str | None]:
    """A whole workload (``{job}``) or node (``{hostname}``) -> (rows, job, hostname(s), None)."""
    t, host_arr = f.target, lay.gpus.hostname
    if "job" in t:
        job = next((j for j in lay.jobs if j.name == t["job"]), None)
        if job is None or not len(job.rows):
            raise ScenarioError(f"{sc.path}: {f.where}.target: no workload named {t['job']!r} with GPUs")
        return job.rows, job.name, ",".join(dict.fromkeys(host_arr[job.rows])), None
    if "hostname" in t and "gpu" not in t:
        rows = np.flatnonzero(host_arr == str(t["hostname"]))
        if not len(rows):
            raise ScenarioError(f"{sc.path}: {f.where}.target: no host {t['hostname']!r}")
        return rows, None, str(t["hostname"]), None
    raise ScenarioError(f"{sc.path}: {f.where}.target: {f.kind} needs {{job}} or {{hostname}} (no gpu)")


def growth_count(opened: np.ndarray, start: float, peak: float, ramp: float) -> np.ndarray:
    """Errors counted after ``opened`` seconds of an exponentially growing rate (the storm profile).

    The rate is ``start`` at the fault's start and grows by ``peak/start`` over ``ramp`` seconds,
    then stays at ``peak``: the closed-form integral, so the counter is exact at any time.
    """
    opened = np.asarray(opened, float)
    ramp = max(ramp, 1.0)
    growth = max(peak, start) / max(start, 1e-12)
    k = np.log(growth) / ramp
    tr = np.minimum(opened, ramp)
    ramped = start * tr if k < 1e-12 else start / k * np.expm1(k * tr)
    return ramped + max(peak, start) * np.maximum(opened - ramp, 0.0)


def _partial_truth(f: Fault, s: float, e: float) -> list[dict]:
    """Ground truth of a partial failure (none for healthy variation and for every other kind)."""
    p = f.params
    if f.kind == "ecc_storm":
        return [_rec("gpu_fault", f.hostname, f.gpu, f.job, s, e,
                     f"correctable ECC errors growing from {p['start_per_second']:g}/s to {p['peak_per_second']:g}/s "
                     "(HBM cells degrading), no XID", "ecc_storm")]
    if f.kind == "nvlink_crc_rising":
        return [_rec("gpu_fault", f.hostname, f.gpu, f.job, s, e,
                     f"NVLink CRC/replay errors rising from {p['start_per_second']:g}/s to {p['peak_per_second']:g}/s",
                     "nvlink")]
    if f.kind == "power_deficit":
        return [_rec("degraded_gpu", f.hostname, f.gpu, f.job, s, e,
                     f"GPU draws {p['deficit_fraction']:.0%} less power than its peers at the same activity and clock "
                     "(failing VRM/power sensor)", "power_deficit")]
    return []


def compile_faults(sc: Scenario, lay: Layout) -> list[Fault]:
    """Resolve every fault of the scenario onto rows (relative times, end defaults to duration)."""
    out = []
    for f in sc.faults:
        rows, job, host, gpu = _resolve(sc, lay, f)
        end = min(f.end if f.end is not None else sc.duration, sc.duration)
        if f.start >= sc.duration:
            raise ScenarioError(f"{sc.path}: {f.where}.start: after the scenario ends ({sc.duration:g} s)")
        out.append(Fault(f.kind, rows, f.start, end, dict(f.params), job, host, gpu, f))
    return out


def _rec(kind: str, host: str, gpu: str | None, job: str | None, s: float, e: float, cause: str,
         attribution: str) -> dict:
    return {"kind": kind, "hostname": host, "gpu": gpu, "job": job, "start": s, "end": e, "cause": cause,
            "attribution": attribution}


_XID_CAUSE = {
    48: "XID 48: double-bit ECC error, row remap pending, process killed",
    63: "XID 63: row remapping event recorded, remap pending",
    64: "XID 64: row remapping failed, GPU should be replaced",
    79: "XID 79: GPU has fallen off the bus, telemetry lost",
    94: "XID 94: contained ECC error, process killed, remap pending",
    95: "XID 95: uncontained ECC error, GPU needs a reset",
}
_STRAGGLER_WHY = {
    "thermal_straggler": "thermally throttled GPU",
    "power_cap": "power-capped GPU",
    "slow_gpu": "GPU computing slower for no visible reason (full clock, no throttling)",
    "input_starved": "node starved for input data: its GPUs idle between steps and it",
    "pcie_downgrade": "GPU on a downgraded PCIe link (slow host/NIC transfers)",
    "nvlink_errors": "GPU with NVLink links down (the all-reduce runs at its bandwidth)",
    "rack_cooling": "node throttled by its rack's cooling failure",
    "intermittent_straggler": "GPU slow in recurring spells (same clock, no throttling)",
}

SlowdownFn = Callable[[Fault, Job], tuple[np.ndarray, np.ndarray]]


def _straggler_rec(f: Fault, job: Job, host: str, gpu: str | None, s: float, e: float,
                   worst: float | None) -> dict:
    how = "" if worst is None else f" by up to {worst:.0%}"
    rec = {**_rec("straggler", host, gpu, job.name, s, e,
                  f"{_STRAGGLER_WHY[f.kind]} slows its training gang{how}; peers wait at the barrier",
                  STRAGGLER_CAUSE[f.kind]), "slowdown": worst}
    if f.kind in STALLING and not f.params.get("extra_work", 0.0) > 0.0:
        rec["needs"] = ["sm_active"]  # the same work per step in more cycles: only SM activity shows it
    return rec


def _straggler_span(f: Fault, job: Job, slowdown: SlowdownFn) -> tuple[float, float, float] | None:
    """(start, end, max slowdown) relative, where ``f`` alone slows ``job`` by >= the threshold."""
    t, sd = slowdown(f, job)
    ok = np.flatnonzero(sd >= STRAGGLER_MIN_SLOWDOWN)
    if not len(ok):
        return None
    end = min(f.end, job.end)
    e = float(t[ok[-1] + 1]) if ok[-1] + 1 < len(t) else end
    return float(t[ok[0]]), e, float(sd[ok].max())


def ground_truth(sc: Scenario, lay: Layout, faults: list[Fault], t0: float,
                 slowdown: SlowdownFn | None = None) -> list[dict]:
    """One record per injected problem and per intentional waste pattern (absolute times).

    ``slowdown(fault, job)`` (``Cluster._fault_slowdown``) gives the step-time slowdown a
    fault alone causes its gang; without it every gang fault is taken to make a straggler.
    """
    out: list[dict] = []
    jobs = {j.name: j for j in lay.jobs}
    host_arr, gpu_arr = lay.gpus.hostname, lay.gpus.gpu

    def gang(job: str | None) -> bool:
        return job is not None and jobs[job].kind == "training" and len(jobs[job].rows) > 1

    def straggler(f: Fault, job: Job, host: str, gpu: str | None) -> None:
        if slowdown is None:
            a, b = max(f.start, job.start), min(f.end, job.end)
            span = (a, max(a, b), None) if b > a else None  # no slowdown function: its size unknown
        else:
            span = _straggler_span(f, job, slowdown)
        if span is None:
            return
        a, b, worst = span
        out.append(_straggler_rec(f, job, host, gpu, t0 + a, t0 + b, worst))

    for f in faults:
        p = f.params
        s, e = t0 + f.start, t0 + f.end
        out.extend(_partial_truth(f, s, e))
        if f.kind == "thermal_straggler":
            out.append(_rec("thermal", f.hostname, f.gpu, f.job, s, e,
                            f"GPU runs {p['extra_celsius']:.0f} C hotter than its neighbours and thermally throttles",
                            "gpu_cooling"))
        elif f.kind == "power_cap":
            out.append(_rec("degraded_gpu", f.hostname, f.gpu, f.job, s, e,
                            f"power limit lowered to {p['limit_watts']:.0f} W (below its peers'): sw_power_cap "
                            "throttling", "power_cap"))
        elif f.kind == "pcie_downgrade":
            out.append(_rec("gpu_fault", f.hostname, f.gpu, f.job, s, e,
                            f"PCIe link trained down to gen{p['gen']:g} x{p['width']:g} with replays",
                            "pcie_downgrade"))
        elif f.kind == "nvlink_errors":
            down = int(p["links_down"])
            out.append(_rec("gpu_fault", f.hostname, f.gpu, f.job, s, e,
                            "NVLink CRC errors growing" + (f", {down} link(s) down" if down else ""), "nvlink"))
        elif f.kind == "xid":
            out.append(_rec("gpu_fault", f.hostname, f.gpu, f.job, s, e, _XID_CAUSE[f.code], f"xid{f.code}"))
        elif f.kind == "rack_cooling":
            for host in f.hostname.split(","):
                out.append(_rec("thermal", host, None, None, s, e,
                                f"rack cooling failure: inlet temperature ramps up by {p['ramp_celsius']:g} C",
                                "rack_cooling"))
        elif f.kind == "thermal_degradation":
            out.append(_rec("degraded_gpu", f.hostname, f.gpu, f.job, s, e,
                            f"GPU runs ~{p['extra_celsius']:g} C hotter than its peers at the same power "
                            "(thermal paste / fan), not throttling yet", "thermal_degradation"))
        elif f.kind == "power_inefficiency":
            out.append(_rec("degraded_gpu", f.hostname, f.gpu, f.job, s, e,
                            f"GPU draws {p['extra_fraction']:.0%} more dynamic power than its peers for the same "
                            "SM activity", "power_inefficiency"))
        elif f.kind == "hbm_hot":
            out.append(_rec("degraded_gpu", f.hostname, f.gpu, f.job, s, e,
                            f"HBM runs ~{p['extra_celsius']:g} C hotter than its peers' at the same die temperature",
                            "hbm_hot"))
        # stragglers: the fault's gang member(s) when the fault slows the gang enough
        if f.kind == "rack_cooling":
            hot = set(f.hostname.split(","))
            for job in lay.jobs:
                if job.kind != "training" or len(job.rows) < 2:
                    continue
                hosts = list(dict.fromkeys(host_arr[job.rows]))
                inside = [h for h in hosts if h in hot]
                if inside and len(inside) < len(hosts):
                    for h in inside:
                        straggler(f, job, str(h), None)
        elif f.kind == "input_starved":
            straggler(f, jobs[f.job], f.hostname, None)
        elif f.kind in STRAGGLER_CAUSE and gang(f.job):
            straggler(f, jobs[f.job], f.hostname, f.gpu)
    numa, model_links = lay.gpus.numa_node, np.array([MODELS[m].nvlink_links for m in MODEL_KEYS])[lay.row_model]
    for job in lay.jobs:
        s, e = t0 + job.start, t0 + job.end
        if job.kind in ("memory_bound", "idle_allocated"):
            kind = "idle_masking" if job.kind == "memory_bound" else "idle_allocated"
            cause = ("memory-bound job: GPU util ~95% but SM activity ~20%" if kind == "idle_masking"
                     else "GPU allocated to a pod that does not use it")
            for host, gpu in dict.fromkeys(zip(host_arr[job.rows], gpu_arr[job.rows], strict=True)):
                out.append(_rec(kind, str(host), str(gpu), job.name, s, e, cause,
                                "memory_bound" if kind == "idle_masking" else "unused_allocation"))
        if job.kind != "training" or len(job.rows) < 2:
            continue
        rows = job.rows
        hosts = list(dict.fromkeys(host_arr[rows]))
        mistakes: list[tuple[list[str], str, str]] = []
        if len(set(lay.gpus.site[rows])) > 1:
            mistakes.append((hosts, "wan", "training gang split across sites: all-reduce over the WAN, GPUs wait "
                                           "at barriers"))
        if (lay.gpus.mig_profile[rows] != "").any():
            mig_hosts = list(dict.fromkeys(host_arr[rows][lay.gpus.mig_profile[rows] != ""]))
            mistakes.append((mig_hosts, "mig", "data-parallel training on MIG slices: no NVLink peer-to-peer "
                                               "between instances, each member a fraction of a GPU"))
        if (model_links[rows] == 0).any():
            mistakes.append((hosts, "no_nvlink", "training gang on GPUs without NVLink between members: "
                                                 "all-reduce over PCIe / the CPU interconnect"))
        split = []
        for h in hosts:
            on = rows[(host_arr[rows] == h) & (lay.gpus.mig_profile[rows] == "")]
            per_node = lay.node_gpus[lay.nodes.index(str(h))]
            if len(on) and len(set(numa[on])) > 1 and len(set(gpu_arr[on])) <= per_node // 2:
                split.append(h)
        if split:
            mistakes.append((split, "numa", "training gang's GPUs span both NUMA nodes of a node although they "
                                            "fit in one"))
        for mhosts, attribution, cause in mistakes:
            for host in mhosts:
                out.append(_rec("topology", str(host), None, job.name, s, e, cause, attribution))
    return out
