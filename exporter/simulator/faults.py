"""Injected faults and intentional waste, resolved onto rows, with their ground truth.

What each fault looks like in the signals (what a detector should find):

* ``thermal_straggler`` (one GPU, ``extra_celsius``): the GPU runs hotter than its
  neighbours (failing fan / paste). Above 85 C it throttles: ``sw_thermal`` (and, far
  above, ``hw_thermal``/``hw_slowdown``) clock events, SM clock well below max, the die
  pinned at ~86-90 C. In a training gang it is the slowest member: it keeps computing
  (SM activity stays high, cycle-counted) while its peers wait at the barrier: their GPU
  util stays ~97% but SM and tensor activity fall by the same factor.
  Ground truth: ``thermal`` + ``straggler`` (when in a training gang).
* ``power_cap`` (one GPU, ``limit_watts``): the enforced power limit drops; power flat at
  the cap, ``sw_power_cap`` active, lower SM clock; gang peers wait as above.
  Ground truth: ``degraded_gpu`` + ``straggler`` (when in a training gang).
* ``input_starved`` (one node of a training job, ``starve`` = data wait per step in units
  of compute time): every GPU of that node has true idle gaps, so GPU util drops too
  (unlike a compute straggler); the peers on other nodes wait at the barrier (high util,
  low SM). Ground truth: ``straggler`` with ``gpu`` None.
* ``pcie_downgrade`` (one GPU, ``gen``, ``width``): current PCIe generation/width below
  max while busy, replay counter grows, PCIe throughput drops. Ground truth: ``degraded_gpu``.
* ``nvlink_errors`` (one GPU, ``crc_per_second``, ``links_down``): NVLink CRC flit/data,
  replay and recovery counters grow; ``links_down`` links report state=down and NVLink
  traffic shrinks in proportion. Ground truth: ``degraded_gpu``.
* ``xid`` (one GPU, ``code``):
  79 fallen off the bus: the XID counter ticks, 30 s later every series of the GPU is
  NaN (absent) while the node's other GPUs go on; gang peers hang in NCCL (util ~97%,
  SM ~5%). 48 double-bit ECC: uncorrectable ECC +1 (volatile and aggregate), an
  uncorrectable remapped row, ``row_remap_pending`` 1; the process on it dies (util 0)
  and gang peers hang. 94/95 contained/uncontained ECC: as 48 (94 kills only the
  process on that GPU, 95 needs a GPU reset). 63 row-remap event: correctable ECC grow,
  a correctable remapped row, remap pending; the job continues. 64 row-remap failure:
  ``row_remap_failure`` 1. Ground truth: ``gpu_fault`` (63: ``degraded_gpu``).
* ``rack_cooling`` (a rack, ``nodes`` = how many of its nodes, 0 = all;
  ``ramp_celsius`` over ``ramp_seconds``): inlet temperature ramps up on those nodes, all
  their GPUs warm together; busy ones eventually cross 85 C and throttle (thermal clock
  events, lower clock, gang peers elsewhere wait). Ground truth: ``thermal`` per node.

Waste patterns from workloads (ground truth, no fault needed): ``memory_bound`` jobs
(GPU util ~95%, SM ~20%, DRAM ~75%) -> ``idle_masking`` per GPU; ``idle_allocated``
(allocated to a pod, util ~0) -> ``idle_allocated`` per GPU; a training job whose nodes
span sites (WAN, communication-bound: low SM/tensor, long barrier waits) -> ``topology``
per node.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from exporter.simulator.scenario import FaultSpec, Scenario, ScenarioError
from exporter.simulator.topology import Layout

#: Seconds from the XID 79 event until the GPU's telemetry disappears.
LOST_AFTER = 30.0
GPU_FAULTS = ("thermal_straggler", "power_cap", "pcie_downgrade", "nvlink_errors", "xid")
KILLING_XIDS = (48, 94, 95)


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


def _resolve(sc: Scenario, lay: Layout, f: FaultSpec) -> tuple[np.ndarray, str | None, str, str | None]:
    """Target -> (rows, job, hostname, gpu)."""
    t = f.target
    host_arr, gpu_arr = lay.gpus.hostname, lay.gpus.gpu

    def err(msg: str) -> ScenarioError:
        return ScenarioError(f"{sc.path}: {f.where}.target: {msg}")

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


def _rec(kind: str, host: str, gpu: str | None, job: str | None, s: float, e: float, cause: str) -> dict:
    return {"kind": kind, "hostname": host, "gpu": gpu, "job": job, "start": s, "end": e, "cause": cause}


def ground_truth(sc: Scenario, lay: Layout, faults: list[Fault], t0: float) -> list[dict]:
    """One record per injected problem and per intentional waste pattern (absolute times)."""
    out: list[dict] = []
    jobs = {j.name: j for j in lay.jobs}

    def gang(job: str | None) -> bool:
        return job is not None and jobs[job].kind == "training" and len(jobs[job].rows) > 1

    def window(f: Fault, job: str | None) -> tuple[float, float]:
        s, e = f.start, f.end
        if job is not None:
            s, e = max(s, jobs[job].start), min(e, jobs[job].end)
        return t0 + s, t0 + max(e, s)

    for f in faults:
        p = f.params
        s, e = t0 + f.start, t0 + f.end
        if f.kind == "thermal_straggler":
            out.append(_rec("thermal", f.hostname, f.gpu, f.job, s, e,
                            f"GPU runs {p['extra_celsius']:g} C hotter than its neighbours and thermally throttles"))
            if gang(f.job):
                ws, we = window(f, f.job)
                out.append(_rec("straggler", f.hostname, f.gpu, f.job, ws, we,
                                "thermally throttled GPU slows its training gang; peers wait at the barrier"))
        elif f.kind == "power_cap":
            out.append(_rec("degraded_gpu", f.hostname, f.gpu, f.job, s, e,
                            f"power limit lowered to {p['limit_watts']:g} W: sw_power_cap throttling"))
            if gang(f.job):
                ws, we = window(f, f.job)
                out.append(_rec("straggler", f.hostname, f.gpu, f.job, ws, we,
                                "power-capped GPU slows its training gang; peers wait at the barrier"))
        elif f.kind == "input_starved":
            ws, we = window(f, f.job)
            out.append(_rec("straggler", f.hostname, None, f.job, ws, we,
                            "node starved for input data: its GPUs idle between steps and the gang waits for it"))
        elif f.kind == "pcie_downgrade":
            out.append(_rec("degraded_gpu", f.hostname, f.gpu, f.job, s, e,
                            f"PCIe link trained down to gen{p['gen']:g} x{p['width']:g} with replays"))
        elif f.kind == "nvlink_errors":
            down = int(p["links_down"])
            out.append(_rec("degraded_gpu", f.hostname, f.gpu, f.job, s, e,
                            "NVLink CRC errors growing" + (f", {down} link(s) down" if down else "")))
        elif f.kind == "xid":
            cause = {
                48: "XID 48: double-bit ECC error, row remap pending, process killed",
                63: "XID 63: row remapping event recorded, remap pending",
                64: "XID 64: row remapping failed, GPU should be replaced",
                79: "XID 79: GPU has fallen off the bus, telemetry lost",
                94: "XID 94: contained ECC error, process killed, remap pending",
                95: "XID 95: uncontained ECC error, GPU needs a reset",
            }[f.code]
            out.append(_rec("degraded_gpu" if f.code == 63 else "gpu_fault", f.hostname, f.gpu, f.job, s, e, cause))
        elif f.kind == "rack_cooling":
            for host in f.hostname.split(","):
                out.append(_rec("thermal", host, None, None, s, e,
                                f"rack cooling failure: inlet temperature ramps up by {p['ramp_celsius']:g} C"))
    host_arr, gpu_arr = lay.gpus.hostname, lay.gpus.gpu
    for job in lay.jobs:
        s, e = t0 + job.start, t0 + job.end
        if job.kind in ("memory_bound", "idle_allocated"):
            kind = "idle_masking" if job.kind == "memory_bound" else "idle_allocated"
            cause = ("memory-bound job: GPU util ~95% but SM activity ~20%" if kind == "idle_masking"
                     else "GPU allocated to a pod that does not use it")
            for host, gpu in dict.fromkeys(zip(host_arr[job.rows], gpu_arr[job.rows], strict=True)):
                out.append(_rec(kind, str(host), str(gpu), job.name, s, e, cause))
        if job.kind == "training" and len(set(lay.gpus.site[job.rows])) > 1:
            for host in dict.fromkeys(host_arr[job.rows]):
                out.append(_rec("topology", str(host), None, job.name, s, e,
                                "training gang split across sites: all-reduce over the WAN, GPUs wait at barriers"))
    return out
