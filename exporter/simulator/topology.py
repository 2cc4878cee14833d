"""Cluster layout: GPU models, sites -> racks -> nodes -> GPUs (-> MIG instances), and job placement.

One *row* is one schedulable device: a whole GPU, or one MIG instance of a GPU in MIG
mode. Every per-row property is a numpy array of length N so the model can evaluate
all rows at once. Hostnames read ``<site>-r<rack>-n<node>`` (``dc1-r1-n02``); racks
``<site>-r<rack>``. GPUs 0-3 sit on NUMA node 0, 4-7 on NUMA node 1, and each pair of
GPUs shares a PCIe switch. H100/A100 SXM nodes join all their GPUs in one NVLink domain;
L40S is PCIe only.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np

from exporter.simulator.scenario import MIG_PROFILES, Scenario, ScenarioError, WorkloadSpec

MIB = 1024 * 1024
GIB = 1024 * MIB


@dataclass(frozen=True)
class GpuModel:
    """Real limits of one GPU model (what NVML reports for it)."""

    key: str
    name: str
    memory_bytes: float
    power_limit: float
    idle_power: float
    max_sm_clock: float
    idle_sm_clock: float
    memory_clock: float
    pcie_gen: int
    pcie_width: int
    nvlink_links: int
    #: Kelvin per watt from inlet air to die, tuned so a fleet lands on the acme temperatures.
    thermal_r: float
    hbm: bool
    #: NVML GPM profiling (Hopper and newer); elsewhere profiling comes from DCGM only.
    gpm: bool


MODELS: dict[str, GpuModel] = {
    "H100": GpuModel("H100", "NVIDIA H100 80GB HBM3", 81559 * MIB, 700.0, 66.0, 1980e6, 345e6, 2619e6, 5, 16, 18,
                     0.088, True, True),
    "A100": GpuModel("A100", "NVIDIA A100-SXM4-80GB", 81920 * MIB, 400.0, 56.0, 1410e6, 210e6, 1593e6, 4, 16, 12,
                     0.125, True, False),
    "L40S": GpuModel("L40S", "NVIDIA L40S", 46068 * MIB, 350.0, 34.0, 2520e6, 210e6, 9001e6, 4, 16, 0,
                     0.13, False, False),
}
MODEL_KEYS = tuple(MODELS)
#: PCI bus numbers of GPU 0..7 on a DGX-like board.
_PCI_BUS = (0x18, 0x2A, 0x3A, 0x5D, 0x9A, 0xAB, 0xBA, 0xDB)
DRIVER_VERSION = "550.127.05"

KIND_IDLE, KIND_TRAINING, KIND_INFERENCE, KIND_MEMORY_BOUND, KIND_IDLE_ALLOCATED = range(5)
KIND_CODES = {"training": KIND_TRAINING, "inference": KIND_INFERENCE, "memory_bound": KIND_MEMORY_BOUND,
              "idle_allocated": KIND_IDLE_ALLOCATED}
_CONTAINERS = {"training": "pytorch", "inference": "server", "memory_bound": "worker", "idle_allocated": "notebook"}


@dataclass
class GpuTable:
    """Columnar identity of every row (GPU or MIG instance); all arrays have length N.

    ``gpu_instance``/``mig_profile`` are "" for whole GPUs. ``device_row`` marks the one
    row per physical GPU that carries device-level series (power, temperature, clocks,
    errors, topology); MIG instances of the same GPU share those values.
    """

    hostname: np.ndarray
    gpu: np.ndarray
    uuid: np.ndarray
    model: np.ndarray
    site: np.ndarray
    rack: np.ndarray
    numa_node: np.ndarray
    pci_bus_id: np.ndarray
    driver_version: np.ndarray
    gpu_instance: np.ndarray
    mig_profile: np.ndarray
    device_row: np.ndarray

    def __len__(self) -> int:
        return len(self.hostname)


@dataclass
class Job:
    name: str
    kind: str
    namespace: str
    container: str
    start: float
    end: float
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    load: float = 0.4
    sites: tuple[str, ...] = ()
    burst: float = 0.08
    sharers: tuple[tuple[str, float], ...] = ()
    sharing: str = "time-slicing"


@dataclass
class Layout:
    """Everything static about the cluster: rows, nodes, jobs and per-row assignment."""

    gpus: GpuTable
    nodes: list[str]
    node_site: list[str]
    node_rack: list[str]
    node_model: list[str]
    row_node: np.ndarray  # node index per row
    row_phys: np.ndarray  # physical GPU index per row (MIG instances share it)
    row_gpu_index: np.ndarray  # int GPU index on its node
    row_model: np.ndarray  # index into MODEL_KEYS
    row_slice: np.ndarray  # fraction of the GPU this row holds (1 for whole GPUs)
    row_job: np.ndarray  # job index or -1
    row_pod: np.ndarray
    jobs: list[Job]
    node_gpus: list[int]


def _uuid(seed: int, host: str, gpu: int) -> str:
    h = hashlib.sha256(f"{seed}/{host}/{gpu}".encode()).hexdigest()
    return f"GPU-{h[:8]}-{h[8:12]}-{h[12:16]}-{h[16:20]}-{h[20:32]}"


def _pod_suffix(seed: int, name: str, i: int) -> str:
    h = hashlib.sha256(f"{seed}/{name}/{i}".encode()).hexdigest()
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    n = int(h, 16)
    out = []
    for _ in range(5):
        n, r = divmod(n, len(alphabet))
        out.append(alphabet[r])
    return "".join(out)


class _Placer:
    """First-fit placement of workloads on physical GPUs, in scenario order."""

    def __init__(self, sc: Scenario):
        t = sc.topology
        self.nodes: list[str] = []
        self.node_site: list[str] = []
        self.node_rack: list[str] = []
        self.node_model: list[str] = []
        r = 0
        for site in t.sites:
            for rack in range(1, t.racks_per_site + 1):
                model = t.models[r % len(t.models)]
                r += 1
                for n in range(1, t.nodes_per_rack + 1):
                    self.nodes.append(f"{site}-r{rack}-n{n:02d}")
                    self.node_site.append(site)
                    self.node_rack.append(f"{site}-r{rack}")
                    self.node_model.append(model)
        self.g = t.gpus_per_node
        # (node, gpu) -> (job index, pod, mig_profile)
        self.owner: dict[tuple[int, int], tuple[int, str, str]] = {}
        # MIG GPUs: (node, gpu) -> list of (job index or -1, pod) per instance
        self.mig: dict[tuple[int, int], tuple[str, list[tuple[int, str]]]] = {}
        self.path = sc.path

    def free(self, n: int) -> list[int]:
        return [g for g in range(self.g) if (n, g) not in self.owner and (n, g) not in self.mig]

    def eligible(self, wl: WorkloadSpec, n: int) -> bool:
        if wl.model and self.node_model[n] != wl.model:
            return False
        if wl.mig_profile and self.node_model[n] == "L40S":
            return False
        return not wl.sites or self.node_site[n] in wl.sites

    def err(self, wl: WorkloadSpec, what: str) -> ScenarioError:
        return ScenarioError(f"{self.path}: workloads.{wl.name}: {what}")

    def place(self, wl: WorkloadSpec, j: int, seed: int) -> None:
        if wl.nodes:
            cand = [n for n in range(len(self.nodes)) if self.eligible(wl, n) and len(self.free(n)) == self.g]
            if wl.sites and len(wl.sites) > 1:  # round-robin over the sites: a job split across them
                by_site = [[n for n in cand if self.node_site[n] == s] for s in wl.sites]
                cand = [by_site[i % len(by_site)].pop(0) for i in range(wl.nodes) if by_site[i % len(by_site)]]
            if len(cand) < wl.nodes:
                raise self.err(wl, f"needs {wl.nodes} free whole nodes, only {len(cand)} left")
            for k, n in enumerate(cand[: wl.nodes]):
                pod = self.pod_name(wl, k, seed)
                for g in range(self.g):
                    self.owner[(n, g)] = (j, pod, "")
        elif wl.gpus:
            need, k = wl.gpus, 0
            for n in range(len(self.nodes)):
                if need == 0:
                    break
                if not self.eligible(wl, n):
                    continue
                free = self.free(n)[:need]
                if not free:
                    continue
                if wl.kind == "inference":
                    for g in free:
                        self.owner[(n, g)] = (j, self.pod_name(wl, k, seed), "")
                        k += 1
                else:
                    pod = self.pod_name(wl, k, seed)
                    k += 1
                    for g in free:
                        self.owner[(n, g)] = (j, pod, "")
                need -= len(free)
            if need:
                raise self.err(wl, f"needs {wl.gpus} free GPUs, {need} short")
        else:
            per = MIG_PROFILES[wl.mig_profile]
            need, k = wl.instances, 0
            for n in range(len(self.nodes)):
                if not self.eligible(wl, n):
                    continue
                for g in self.free(n):
                    if need == 0:
                        break
                    inst = []
                    for _ in range(per):
                        if need > 0:
                            inst.append((j, self.pod_name(wl, k, seed)))
                            k += 1
                            need -= 1
                        else:
                            inst.append((-1, ""))
                    self.mig[(n, g)] = (wl.mig_profile, inst)
            if need:
                raise self.err(wl, f"needs {wl.instances} MIG instances, {need} short")

    @staticmethod
    def pod_name(wl: WorkloadSpec, k: int, seed: int) -> str:
        if wl.kind == "training":
            return f"{wl.name}-worker-{k}"
        if wl.kind == "inference":
            return f"{wl.name}-{_pod_suffix(seed, wl.name, -1)[:4]}8c9f-{_pod_suffix(seed, wl.name, k)}"
        return f"{wl.name}-{_pod_suffix(seed, wl.name, k)}"


def build_layout(sc: Scenario, seed: int) -> Layout:
    """Place the scenario's workloads (explicit ones first, then ``fill``) and build the rows."""
    p = _Placer(sc)
    specs: list[WorkloadSpec] = list(sc.workloads)
    for j, wl in enumerate(specs):
        p.place(wl, j, seed)
    if sc.fill is not None and sc.fill.fractions:
        rng = np.random.default_rng([seed, 1])
        free_nodes = [n for n in range(len(p.nodes)) if len(p.free(n)) == p.g]
        order = [free_nodes[i] for i in rng.permutation(len(free_nodes))]
        total = len(order)
        counts = {k: round(sc.fill.fractions.get(k, 0.0) * total) for k in ("training", "inference")}
        tr = sorted(order[: counts["training"]])
        inf = sorted(order[counts["training"]: counts["training"] + counts["inference"]])
        gn = sc.fill.gang_nodes
        gangs = []  # gangs never span sites: a healthy fill has no WAN jobs
        for site in dict.fromkeys(p.node_site):
            on_site = [n for n in tr if p.node_site[n] == site]
            gangs += [on_site[i: i + gn] for i in range(0, len(on_site), gn)]
        for i, nodes in enumerate(gangs):
            wl = WorkloadSpec(name=f"train-{i:03d}", kind="training", namespace=sc.fill.namespace,
                              nodes=len(nodes))
            j = len(specs)
            specs.append(wl)
            for k, n in enumerate(nodes):
                pod = p.pod_name(wl, k, seed)
                for g in range(p.g):
                    p.owner[(n, g)] = (j, pod, "")
        for i in range(0, len(inf), 2):  # one inference service per two nodes
            nodes = inf[i: i + 2]
            load = float(rng.uniform(0.1, 0.4))
            wl = WorkloadSpec(name=f"serve-{i // 2:03d}", kind="inference", namespace="serving",
                              gpus=len(nodes) * p.g, load=load)
            j = len(specs)
            specs.append(wl)
            for k, (n, g) in enumerate((n, g) for n in nodes for g in range(p.g)):
                p.owner[(n, g)] = (j, p.pod_name(wl, k, seed), "")

    cols: dict[str, list] = {k: [] for k in (
        "hostname", "gpu", "uuid", "model", "site", "rack", "numa", "pci", "gi", "prof", "dev", "node", "phys",
        "gidx", "mkey", "slice", "job", "pod")}

    def row(n: int, g: int, phys: int, gi: str, prof: str, dev: bool, sl: float, job: int, pod: str) -> None:
        host = p.nodes[n]
        cols["hostname"].append(host)
        cols["gpu"].append(str(g))
        cols["uuid"].append(_uuid(seed, host, g))
        cols["model"].append(MODELS[p.node_model[n]].name)
        cols["site"].append(p.node_site[n])
        cols["rack"].append(p.node_rack[n])
        cols["numa"].append(str(0 if g < 4 else 1))
        cols["pci"].append(f"00000000:{_PCI_BUS[g]:02X}:00.0")
        cols["gi"].append(gi)
        cols["prof"].append(prof)
        cols["dev"].append(dev)
        cols["node"].append(n)
        cols["phys"].append(phys)
        cols["gidx"].append(g)
        cols["mkey"].append(MODEL_KEYS.index(p.node_model[n]))
        cols["slice"].append(sl)
        cols["job"].append(job)
        cols["pod"].append(pod)

    phys = 0
    for n in range(len(p.nodes)):
        for g in range(p.g):
            if (n, g) in p.mig:
                prof, inst = p.mig[(n, g)]
                sl = int(prof.split("g.")[0]) / 7.0
                for i, (j, pod) in enumerate(inst):
                    row(n, g, phys, str(i + 1), prof, i == 0, sl, j, pod)
            else:
                j, pod, _ = p.owner.get((n, g), (-1, "", ""))
                row(n, g, phys, "", "", True, 1.0, j, pod)
            phys += 1

    def arr(k: str, dtype: object = None) -> np.ndarray:
        return np.array(cols[k], dtype=dtype)

    gpus = GpuTable(
        hostname=arr("hostname"), gpu=arr("gpu"), uuid=arr("uuid"), model=arr("model"), site=arr("site"),
        rack=arr("rack"), numa_node=arr("numa"), pci_bus_id=arr("pci"),
        driver_version=np.full(len(cols["hostname"]), DRIVER_VERSION), gpu_instance=arr("gi"),
        mig_profile=arr("prof"), device_row=arr("dev", bool),
    )
    row_job = arr("job", np.int64)
    jobs = []
    for j, wl in enumerate(specs):
        end = wl.end if wl.end is not None else sc.duration
        jobs.append(Job(wl.name, wl.kind, wl.namespace, wl.container or _CONTAINERS[wl.kind], wl.start, end,
                        np.flatnonzero(row_job == j), wl.load, wl.sites, wl.burst, wl.sharers, wl.sharing))
    return Layout(gpus, p.nodes, p.node_site, p.node_rack, p.node_model, arr("node", np.int64),
                  arr("phys", np.int64), arr("gidx", np.int64), arr("mkey", np.int64), arr("slice", float),
                  row_job, arr("pod"), jobs, [p.g] * len(p.nodes))


def closest_link(model: str, a: int, b: int) -> str:
    """Closest link between GPUs a and b of one node (nvidia-smi topo -m, simplified)."""
    if MODELS[model].nvlink_links:
        return "nvlink"
    if a // 2 == b // 2:
        return "pcie_switch"
    if a // 4 == b // 4:
        return "numa"
    return "system"
