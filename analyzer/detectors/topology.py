"""Topology: a communicating job placed so that its members talk over slow links.

A synchronous (data-parallel) training step ends with an all-reduce; the step takes as long
as the slowest link the collective crosses. Placement decides which link that is: NVLink
(~450-900 GB/s per GPU) inside an HGX node, PCIe (~32-64 GB/s) and the CPU's SMP
interconnect between GPUs without NVLink or on different CPU sockets, host memory between
MIG instances (MIG has no peer-to-peer and no NVLink), a WAN (a few GB/s, milliseconds of
latency) between sites. The job then waits at barriers: GPU util stays ~97% while SM and
tensor activity fall (the ``communication_bound`` class of analyzer.analysis.bottleneck). Nothing is
broken, so no other detector fires; the fix is to reschedule. One finding per job and
problem (``hostname`` None, ``job``/``namespace`` set: the evaluation matches it to the
per-node truth of that job), open while the placement lasts. Problems (``evidence.problem``):

- ``wan`` (warning): a training job's members sit in more than one site (``site`` label of
  the node). Cross-site all-reduce is the worst link there is; the simulator's split gang
  runs at SM ~0.37 against ~0.70 for the same gang in one site.
- ``mig`` (warning): a training job with >= 2 members of which at least one is a MIG
  instance. MIG instances cannot use NVLink nor CUDA P2P, so NCCL goes through host
  memory; and a slice of a GPU is a slice of its compute. One instance alone is fine (a
  small fine-tune on a slice has nothing to synchronize).
- ``no_nvlink`` (warning when the job is mostly communication-bound, else info): a
  training job holds >= 2 GPUs of one node and some pair of them has no NVLink
  (``Fleet.topology`` link pcie_switch/host_bridge/numa/system), while GPUs joined by
  NVLink exist in the fleet (otherwise there is nowhere better to go: not "without need").
  Without topology (dcgm-exporter), confidence "low": on a node with >= 2 GPUs of the job
  no member moves NVLink traffic (``nvlink_bps`` below ``nvlink_traffic_bps`` 1 GB/s, or
  not reported on that node at all: DCGM leaves the field blank on PCIe cards; reported there
  but unknown while the job works, as at a rate's first sample after a scrape gap, is nothing
  to judge) while some GPU of the fleet does (so the counter is collected and NVLink
  exists): a gang on NVLink moves 10-40 GB/s per GPU, so silence means PCIe-only GPUs (or
  NCCL P2P disabled: the same fix). Only samples with the member at work count (SM activity >=
  ``work_sm_min`` 0.1; where SM is not collected, as in dcgm-exporter's default counters, any
  tensor work, >= ``work_tensor_min`` 0.02: a gang slowed by PCIe still does a third to a half of
  its tensor work, a hung one none; neither collected: nothing is claimed): a gang hung in NCCL
  after a member died (SM ~0.05, no tensor work, util ~97 %) or waiting at its first barrier while
  members load (the same) moves nothing over any link, and its silence says nothing about NVLink
  (serve's window after an XID 79 or 48 would otherwise tell a healthy HGX gang it talks over
  PCIe: 3 such info findings in the replay with the default counters before tensor activity stood
  in). No sample at work: nothing is claimed. NVLink bytes not collected anywhere: nothing is
  claimed either.
- ``numa`` (info): a training job's GPUs on one node sit on >= 2 NUMA nodes although they
  fit in one, and the node's current pods could be arranged so: this job inside one NUMA
  node, every other multi-GPU pod that is inside one NUMA node still inside one, single-GPU
  pods anywhere (``_one_numa_packing``). Occupancy alone would excuse every spread: in the
  simulator (as with a scheduler without a topology-manager policy) the job and its
  single-GPU neighbours start together and the job just got the GPUs first-fit left it; a
  NUMA-aware placement would have put the neighbours around it. Half its GPUs are then
  remote from the CPU memory and NIC feeding them. A job needing more GPUs on a node than
  one NUMA node holds, or boxed in by NUMA-aligned multi-GPU neighbours, is never flagged.
  NUMA nodes come
  from a ``numa_node`` frame column when present, else from ``Fleet.topology`` (GPUs
  joined by pcie_switch/host_bridge/numa share a NUMA node; ``system`` crosses sockets),
  else, on a node whose topology is all NVLink (NVLink hides the PCIe tree), from the
  HGX/DGX board layout: the lower half of the GPU indexes on CPU socket 0, the upper half
  on socket 1 (DGX A100 and H100 both; ``assume_socket_halves``, confidence "low").
  Without topology (dcgm-exporter input) a node is taken for such a board only where its GPUs
  move NVLink traffic (``nvlink_traffic_bps``, in dcgm-exporter's default counters), its GPUs
  those the data shows on it; a node without NVLink traffic (PCIe cards, or nothing at work)
  is never guessed.

What is a training job: only members that synchronize suffer from slow links. Inference
Deployments and StatefulSets spread over nodes, sites or NUMA nodes are normal (replicas do
not talk), and sharing a workload name (``tensorflow-0..3`` -> ``tensorflow``) is no sign of
talking, so every rule requires a workload that communicates
(analyzer.detectors._peers.communicating): any pod named as a gang member (``-worker-N``,
``-master-N``, ``-launcher``, ``-chief-N``, ``-trainer-N``, ``-rank-N``, ``-ps-N``: the
Kubeflow training-operator / MPI-operator conventions), or, with confidence "low",
behaviour *and* a sign of communication: >= ``min_pods`` pods held at the same time (a pod
restarted under a new name is one member, not two), none named like a Deployment's
ReplicaSet pod (``name-<hash>-<5 chars>``), median kernel-resident time >= ``busy_min``
(0.8 = analyzer.analysis.bottleneck's BUSY_UTIL: a gang keeps every member busy), and
members moving NVLink traffic together (>= ``nvlink_traffic_bps``) or busy/wait phases in
step across members (``sync_min`` 0.5, see ``communicating``). Workloads whose members show
no such sign get no topology finding: there is no collective for a slow link to slow down.

Cost (evidence and summary): the job's SM activity (tensor activity when SM is not
collected) against the reference of healthy training on the same GPU model in the same
fleet (median of the per-job means of training jobs on whole GPUs with no topology problem;
else the same over every GPU model of the fleet, SM activity being a ratio of the chip;
else the calibrated busy SM ~0.60, AcmeTrace; ``evidence.reference_scope`` says which),
giving ``est_slowdown = 1 - job / reference`` and ``gpu_hours_at_stake = gpu_hours *
est_slowdown``; ``communication_share`` is the share of its GPU-hours classified
communication_bound (analyzer.analysis.bottleneck.classify).

Placement is structural, yet a placement that lasts less than ``min_duration_s`` (5 min)
is a pod restarting or a job being torn down, not worth a ticket; gaps of up to
``max_gap_steps`` missing steps, or up to ``max_unknown_s`` (300 s, analyzer.analysis.episodes'
MAX_UNKNOWN_S: a few failed scrapes) whatever the step, do not end a placement.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analysis.bottleneck import CLASSES, COMM, classify
from analyzer.analysis.episodes import MAX_UNKNOWN_S, bridge_steps, column, format_duration
from analyzer.analysis.rows import mig_rows
from analyzer.data.frame import Fleet
from analyzer.detectors import gpu_busy, register
from analyzer.detectors._peers import GANG_POD, Communication, communicating
from analyzer.findings import TOPOLOGY, Finding, Severity
from exporter import schema as S

WAN, MIG, NO_NVLINK, NUMA = "wan", "mig", "no_nvlink", "numa"
#: A Deployment's pods: <deployment>-<pod-template-hash>-<5-char suffix>.
DEPLOYMENT_POD = re.compile(r"-[a-z0-9]{6,10}-[a-z0-9]{5}$")
#: Busy SM activity of healthy training (AcmeTrace busy median), when the fleet has no reference.
REFERENCE_SM = 0.60
#: Links that keep two GPUs on one NUMA node (nvidia-smi topo: PIX/PXB, PHB, NODE); "system" is SYS.
SAME_NUMA_LINKS = frozenset({"pcie_switch", "host_bridge", "numa"})
SEVERITY: dict[str, Severity] = {WAN: "warning", MIG: "warning", NO_NVLINK: "info", NUMA: "info"}


def _gpu_index(s: pd.Series) -> np.ndarray:
    """GPU index labels as float64 (NaN when not a number); parses the categories once, not every row."""
    if isinstance(s.dtype, pd.CategoricalDtype):
        cats = pd.to_numeric(pd.Series(s.cat.categories.astype(object)), errors="coerce").to_numpy(dtype=np.float64)
        codes = s.cat.codes.to_numpy()
        return np.where(codes >= 0, cats[np.maximum(codes, 0)] if len(cats) else np.nan, np.nan)
    return pd.to_numeric(s.astype(object), errors="coerce").to_numpy(dtype=np.float64)


def _popcount(x: int) -> int:
    return bin(x).count("1")


def _components(nodes: list[int], edges: list[tuple[int, int]]) -> list[int]:
    """Connected components of GPUs as bit masks (union-find)."""
    parent = {x: x for x in nodes}

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for x, y in edges:
        if x in parent and y in parent:
            parent[root(x)] = root(y)
    groups: dict[int, int] = {}
    for x in nodes:
        groups[root(x)] = groups.get(root(x), 0) | (1 << x)
    return list(groups.values())


def _one_numa_packing(groups: list[int], k: int, others: list[int]) -> bool:
    """Could the node's current pods be arranged with this job's k GPUs on one NUMA node?

    ``groups``: GPU masks of the NUMA nodes; ``others``: GPU masks of the other pods on the
    node. A pod already inside one NUMA node with >= 2 GPUs must stay inside one (we would not
    fix one job by breaking another); single-GPU pods and pods that already span can go
    anywhere, and they fit because the node already holds them all. Exhaustive: a node has a
    handful of NUMA nodes and multi-GPU pods.
    """
    rigid = sorted((_popcount(m) for m in others if _popcount(m) >= 2 and sum(1 for g in groups if g & m) == 1),
                   reverse=True)
    caps = [_popcount(g) for g in groups]

    def place(i: int, free: list[int]) -> bool:
        if i == len(rigid):
            return True
        for b, c in enumerate(free):
            if c >= rigid[i]:
                free[b] -= rigid[i]
                if place(i + 1, free):
                    return True
                free[b] += rigid[i]
        return False

    for b, c in enumerate(caps):
        if c >= k:
            free = list(caps)
            free[b] -= k
            if place(0, free):
                return True
    return False


@register
@dataclass
class Topology:
    """Settings are documented in the module docstring, and:

    - ``comm_warning_share`` 0.5: a gang without NVLink that spends half its time or more in
      communication (the bottleneck classes) is a warning, not just info: the PCIe path is what holds it back.
    """

    kind = TOPOLOGY
    paging = None
    not_paged = ("placement advice for the next job (split across sites, MIG slices, no NVLink, NUMA): read in "
                 "reports and the API, nothing anyone should be woken for")
    busy_min: float = 0.8
    min_pods: int = 2
    min_duration_s: float = 300.0
    max_gap_steps: int = 2
    max_unknown_s: float = MAX_UNKNOWN_S
    assume_socket_halves: bool = True
    #: no_nvlink is a warning when at least this share of the job's GPU-hours is communication-bound.
    comm_warning_share: float = 0.5
    #: NVLink traffic that proves NVLink is in use (a training gang on NVLink moves ~10-40 GB/s per GPU).
    nvlink_traffic_bps: float = 1e9
    #: Busy/wait phases in step across members that count as communicating (module docstring).
    sync_min: float = 0.5
    #: SM activity of a member at work, for the NVLink-silence judgement (module docstring).
    work_sm_min: float = 0.1
    #: ... and its tensor activity where SM is not collected (any tensor work).
    work_tensor_min: float = 0.02

    def detect(self, fleet: Fleet) -> list[Finding]:
        f = fleet.frame
        if not len(f) or "job" not in f.columns or not f["job"].notna().any():
            return []
        a = self._allocated(fleet)
        training, talk = self._training_jobs(fleet, a)
        if not training:
            return []
        a = a[a["job"].isin(list(training))]
        flags = self._wan(a), self._mig(a), *self._node_rules(fleet, a)
        problems = [(p, fl) for p, fl in zip((WAN, MIG, NO_NVLINK, NUMA), flags, strict=True) if len(fl)]
        self._note(fleet)
        if not problems:
            return []
        flagged = {j for _, fl in problems for j in fl["job"].unique()}
        ref = {**self._reference(fleet, a, flagged), "talk": talk}
        out: list[Finding] = []
        for problem, fl in problems:
            for ep in self._episodes(fleet, fl):
                out.append(self._finding(fleet, a, problem, ep, training[ep["job"]], ref))
        return out

    # Rows and jobs ---------------------------------------------------------------------------
    @staticmethod
    def _allocated(fleet: Fleet) -> pd.DataFrame:
        """Allocated rows with what the rules need, as plain columns."""
        f = fleet.frame
        sel = f["job"].notna().to_numpy()
        g = _gpu_index(f["gpu"])

        def text(c: str) -> np.ndarray:
            if c not in f.columns:
                return np.full(int(sel.sum()), "", dtype=object)
            return f[c].astype(object).where(f[c].notna(), "").to_numpy()[sel]

        a = pd.DataFrame({
            "row": np.flatnonzero(sel), "timestamp": f["timestamp"].to_numpy()[sel],
            "job": f["job"].astype(object).to_numpy()[sel], "namespace": text("namespace"), "pod": text("pod"),
            "hostname": text("hostname"), "gpu": g[sel], "mig": text("mig_profile") != "", "site": text("site"),
            "model": text("model"),
            "share": f["gpu_share"].to_numpy(dtype=np.float64)[sel] if "gpu_share" in f.columns else 1.0,
            "busy": gpu_busy(fleet)[sel],
        })
        if "numa_node" in f.columns:
            a["numa_node"] = text("numa_node")
        return a

    def _training_jobs(self, fleet: Fleet, a: pd.DataFrame) -> tuple[dict[str, str], dict[str, str]]:
        """(job -> "high" (gang pod naming) or "low" (behaviour and a sign of communicating) for the
        jobs judged to be training, job -> the sign of communicating of the "low" ones)."""
        pods = a[["job", "pod"]].drop_duplicates()
        named = pods["pod"].str.contains(GANG_POD)
        deploy = pods["pod"].str.contains(DEPLOYMENT_POD)
        per_job = pd.DataFrame({"named": named.groupby(pods["job"]).any(),
                                "deploy": deploy.groupby(pods["job"]).any()})
        concurrent = a[a["pod"] != ""].groupby(["job", "timestamp"])["pod"].nunique().groupby(level="job").max()
        busy = a.groupby("job")["busy"].median()
        out = {str(j): "high" for j in per_job.index[per_job["named"]]}
        behaves = (~per_job["named"] & ~per_job["deploy"]
                   & (concurrent.reindex(per_job.index).fillna(0) >= self.min_pods)
                   & (busy.reindex(per_job.index) >= self.busy_min))
        comm = communicating(fleet, nvlink_bps=self.nvlink_traffic_bps, sync_min=self.sync_min,
                             busy_min=self.busy_min, busy=gpu_busy(fleet)) if behaves.any() else {}
        talks = {str(j): comm[str(j)] for j in per_job.index[behaves] if str(j) in comm and comm[str(j)].communicating}
        out.update({j: "low" for j in talks})
        return out, {j: self._talk(c) for j, c in talks.items()}

    # Rules: each returns the (job, timestamp) pairs where the problem holds ---------------------
    @staticmethod
    def _wan(a: pd.DataFrame) -> pd.DataFrame:
        known = a[a["site"] != ""]
        n = known.groupby(["job", "timestamp"])["site"].nunique()
        return n[n > 1].reset_index()[["job", "timestamp"]]

    @staticmethod
    def _mig(a: pd.DataFrame) -> pd.DataFrame:
        g = a.groupby(["job", "timestamp"]).agg(members=("mig", "size"), mig=("mig", "sum"))
        return g[(g["members"] >= 2) & (g["mig"] >= 1)].reset_index()[["job", "timestamp"]]

    def _node_rules(self, fleet: Fleet, a: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
        """no_nvlink and numa: per (job, node, time) GPU masks judged once per distinct placement."""
        empty = pd.DataFrame(columns=["job", "timestamp"])
        topo = fleet.topology
        whole = a[~a["mig"] & np.isfinite(a["gpu"])]
        nvl = column(fleet, "nvlink_bps")
        ref = nvl[fleet.reference_rows()]  # "in use in the fleet": on its reference hosts (analyzer.data.reference)
        nvlink_used = bool(np.nanmax(ref, initial=0.0) >= self.nvlink_traffic_bps) if np.isfinite(ref).any() else False
        if not len(whole):
            return empty, empty
        # Per (job, node): the most NVLink traffic any member moved while at work (NaN: none reported; absent:
        # never at work, nothing to judge).
        act, signal = self._job_sm(fleet, whole)  # tensor where SM is not collected (dcgm-exporter's defaults)
        at_work = act >= (self.work_sm_min if signal == "sm_active" else self.work_tensor_min)
        whole = whole.assign(nvl=nvl[whole["row"].to_numpy()])
        job_nvl = whole[at_work].groupby(["job", "hostname"])["nvl"].max()
        # Not reported on a node at all: its GPUs have no NVLink (DCGM leaves the field blank on PCIe cards). Reported
        # there but unknown while the job worked (a scrape gap, a rate's first sample after it): nothing to judge.
        reported = set(pd.unique(fleet.frame["hostname"][np.isfinite(nvl)]).astype(str))
        bit = np.left_shift(1, whole["gpu"].to_numpy().astype(np.int64))
        own = (whole.assign(bit=bit).drop_duplicates(["job", "hostname", "timestamp", "gpu"])
               .groupby(["job", "hostname", "timestamp"])["bit"].sum().rename("own").reset_index())
        own = own[own["own"] & (own["own"] - 1) != 0]  # >= 2 GPUs of the job on the node
        if not len(own):
            return empty, empty
        links, host_gpus = self._links(topo)
        numa = self._numa_groups(a, links, {**self._nvlink_boards(fleet, set(host_gpus)), **host_gpus})
        known = topo[topo["hostname"].astype(str).isin(list(fleet.reference_hosts()))] if len(topo) else topo
        has_nvlink = bool(len(known)) and bool((known["link"] == "nvlink").any())  # in the fleet: its reference
        combos = own[["job", "hostname", "own"]].drop_duplicates()
        no_nv, spread = [], []
        held: pd.DataFrame | None = None
        for job, host, mask in combos.itertuples(index=False):
            gpus = [i for i in range(64) if mask >> i & 1]
            pairs = links.get(host, {})
            slow = [(x, y) for i, x in enumerate(gpus) for y in gpus[i + 1:] if (x, y) in pairs]
            if has_nvlink and slow:
                no_nv.append((job, host, mask))
            elif host not in host_gpus and nvlink_used and (job, host) in job_nvl.index \
                    and not job_nvl.get((job, host), np.nan) >= self.nvlink_traffic_bps \
                    and (np.isfinite(job_nvl.get((job, host), np.nan)) or host not in reported):
                no_nv.append((job, host, mask))  # no topology: silent NVLink while others talk over it
            groups = numa.get(host)
            k = _popcount(mask)
            if not groups or sum(1 for g in groups if g & mask) < 2 or k > max(_popcount(g) for g in groups):
                continue
            if held is None:
                held = self._held_by_pod(fleet)
            times = own.loc[(own["job"] == job) & (own["hostname"] == host) & (own["own"] == mask), "timestamp"]
            near = held[(held["hostname"] == host) & (held["job"] != job) & held["timestamp"].isin(times)]
            pods = near.groupby(["job", "pod"])["bit"].agg(lambda b: int(np.bitwise_or.reduce(b.to_numpy())))
            if _one_numa_packing(groups, k, [int(m) for m in pods]):
                spread.append((job, host, mask))

        def pick(keys: list[tuple[str, str, int]]) -> pd.DataFrame:
            if not keys:
                return empty
            k = pd.DataFrame(keys, columns=["job", "hostname", "own"])
            return own.merge(k, on=["job", "hostname", "own"])[["job", "timestamp"]].drop_duplicates()

        return pick(no_nv), pick(spread)

    @staticmethod
    def _held_by_pod(fleet: Fleet) -> pd.DataFrame:
        """Allocated GPUs as (hostname, timestamp, job, pod, bit); a MIG GPU is held by each instance's pod."""
        f = fleet.frame
        g = _gpu_index(f["gpu"])
        sel = f["job"].notna().to_numpy() & np.isfinite(g)
        pod = f["pod"].astype(object).where(f["pod"].notna(), "").to_numpy() if "pod" in f.columns else \
            np.full(len(f), "", dtype=object)
        return pd.DataFrame({
            "hostname": f["hostname"].astype(object).to_numpy()[sel], "timestamp": f["timestamp"].to_numpy()[sel],
            "job": f["job"].astype(object).to_numpy()[sel], "pod": pod[sel],
            "bit": np.left_shift(1, g[sel].astype(np.int64)),
        })

    @staticmethod
    def _links(topo: pd.DataFrame) -> tuple[dict[str, dict[tuple[int, int], str]], dict[str, list[int]]]:
        """hostname -> {(gpu, peer): link} for links other than NVLink (both orders), and hostname -> GPUs.

        Only non-NVLink pairs are kept: a healthy HGX fleet is all NVLink and costs nothing here.
        """
        if not len(topo):
            return {}, {}
        host = topo["hostname"].astype(object).to_numpy()
        g, p = _gpu_index(topo["gpu"]), _gpu_index(topo["peer_gpu"])
        ok = np.isfinite(g) & np.isfinite(p)
        gpus = pd.DataFrame({"h": host[ok], "g": g[ok].astype(np.int64)}).drop_duplicates()
        host_gpus = {str(h): sorted(int(x) for x in part) for h, part in gpus.groupby("h")["g"]}
        links: dict[str, dict[tuple[int, int], str]] = {}
        link = topo["link"].astype(object).to_numpy()
        slow = ok & (link != "nvlink")
        for h, x, y, kind in zip(host[slow], g[slow].astype(np.int64), p[slow].astype(np.int64), link[slow],
                                 strict=True):
            d = links.setdefault(str(h), {})
            d[(int(x), int(y))] = d[(int(y), int(x))] = str(kind)
        return links, host_gpus

    def _nvlink_boards(self, fleet: Fleet, known: set[str]) -> dict[str, list[int]]:
        """hostname -> its whole GPUs, for nodes without topology whose GPUs moved NVLink traffic (an
        NVLink board, whose layout ``_numa_groups`` may assume); empty unless ``assume_socket_halves``."""
        nvl = column(fleet, "nvlink_bps")
        if not self.assume_socket_halves or not np.isfinite(nvl).any():
            return {}
        f = fleet.frame
        host = f["hostname"].astype("category")
        names = host.cat.categories.astype(str)
        unknown = ~np.isin(names, list(known))  # per host code: no topology
        if not unknown.any():
            return {}
        hc = host.cat.codes.to_numpy(dtype=np.int64)
        g = _gpu_index(f["gpu"])
        sel = np.isfinite(g) & (hc >= 0) & ~mig_rows(f)  # whole GPUs
        sel &= unknown[np.maximum(hc, 0)]
        talking = np.bincount(hc[sel & (nvl >= self.nvlink_traffic_bps)], minlength=len(names)) > 0
        sel &= talking[np.maximum(hc, 0)]
        pairs = np.unique(hc[sel] * 4096 + g[sel].astype(np.int64))  # (host, GPU index) pairs, whole GPUs
        out: dict[str, list[int]] = {}
        for code, gpu in zip((pairs // 4096).tolist(), (pairs % 4096).tolist(), strict=True):
            out.setdefault(str(names[code]), []).append(int(gpu))
        return out

    def _numa_groups(self, a: pd.DataFrame, links: dict[str, dict[tuple[int, int], str]],
                     host_gpus: dict[str, list[int]]) -> dict[str, list[int]]:
        """hostname -> GPU masks of its NUMA nodes (absent: unknown)."""
        out: dict[str, list[int]] = {}
        if "numa_node" in a.columns:
            for host, part in a[np.isfinite(a["gpu"]) & (a["numa_node"] != "")].groupby("hostname"):
                groups = part.drop_duplicates("gpu").groupby("numa_node")["gpu"].agg(
                    lambda s: int(np.sum(np.left_shift(1, s.to_numpy().astype(np.int64)))))
                out[str(host)] = [int(m) for m in groups]
        for host, gpus in host_gpus.items():
            if host in out:
                continue
            pairs = links.get(host)
            if not pairs:  # all NVLink: the board layout, if allowed
                if self.assume_socket_halves and len(gpus) >= 4 and len(gpus) % 2 == 0:
                    half = gpus[len(gpus) // 2]
                    out[host] = [sum(1 << x for x in gpus if x < half), sum(1 << x for x in gpus if x >= half)]
                continue
            groups = _components(gpus, [p for p, link in pairs.items() if link in SAME_NUMA_LINKS])
            if len(groups) > 1:  # NVLink pairs tell nothing about NUMA; one component = one NUMA node
                out[host] = groups
        return out

    # Episodes, evidence, findings ------------------------------------------------------------
    def _episodes(self, fleet: Fleet, flags: pd.DataFrame) -> list[dict[str, Any]]:
        """Continuous (job, time) runs of a problem, kept when they last ``min_duration_s``."""
        step = float(fleet.step)
        fl = flags.sort_values(["job", "timestamp"])
        if fl.empty:
            return []
        job, ts = fl["job"].to_numpy(), fl["timestamp"].to_numpy(dtype=np.float64)
        new = np.ones(len(fl), bool)
        gap = bridge_steps(step, self.max_gap_steps, self.max_unknown_s)  # a missing row: not flagged, or unknown
        new[1:] = (job[1:] != job[:-1]) | (ts[1:] - ts[:-1] > (gap + 1) * step + 1e-6)
        out = []
        for times, first in zip(np.split(ts, np.flatnonzero(new)[1:]), np.flatnonzero(new), strict=True):
            start, end = float(times[0]), float(times[-1]) + step
            is_open = fleet.end - end <= gap * step + 1e-6
            duration = (max(fleet.end, end) if is_open else end) - start
            if duration >= self.min_duration_s - 1e-6:
                out.append({"job": str(job[first]), "start": start, "end": None if is_open else end,
                            "duration_s": duration, "times": times})
        return out

    @staticmethod
    def _job_sm(fleet: Fleet, a: pd.DataFrame) -> tuple[np.ndarray, str]:
        """Per allocated row: SM activity, else tensor activity (with the name of what was used)."""
        sm = column(fleet, "sm_active")[a["row"].to_numpy()]
        if np.isfinite(sm).any():
            return sm, "sm_active"
        return column(fleet, "tensor_active")[a["row"].to_numpy()], "tensor_active"

    def _reference(self, fleet: Fleet, a: pd.DataFrame, flagged: set[str]) -> dict[str, Any]:
        """Per-row activity, its signal, and healthy-training activity per GPU model.

        The level is the median of per-job mean activity over training jobs on whole GPUs that
        have no topology problem: the same model, code path and fleet (its reference hosts,
        analyzer.data.reference), so the gap is placement.
        """
        act, name = self._job_sm(fleet, a)
        healthy = ~a["job"].isin(list(flagged)).to_numpy() & ~a["mig"].to_numpy() & np.isfinite(act) \
            & fleet.reference_rows()[a["row"].to_numpy()]
        levels: dict[str, float] = {}
        fleet_level = None
        if healthy.any():
            per_job = pd.DataFrame({"model": a["model"].to_numpy()[healthy], "job": a["job"].to_numpy()[healthy],
                                    "act": act[healthy]}).groupby(["model", "job"])["act"].mean()
            levels = {str(m): float(v) for m, v in per_job.groupby(level="model").median().items()}
            fleet_level = float(per_job.median())
        return {"activity": act, "signal": name, "levels": levels, "fleet": fleet_level}

    def _finding(self, fleet: Fleet, a: pd.DataFrame, problem: str, ep: dict[str, Any], confidence: str,
                 ref: dict[str, Any]) -> Finding:
        job = ep["job"]
        rows = a[(a["job"] == job) & a["timestamp"].isin(ep["times"])]
        fr = fleet.frame
        r = rows["row"].to_numpy()
        w = rows["share"].to_numpy(dtype=np.float64)
        gpu_hours = float(w.sum() * fleet.step / 3600.0)
        act_all, act_name = ref["activity"], ref["signal"]
        pos = a.index.get_indexer(rows.index)
        act = act_all[pos]

        def wmean(v: np.ndarray) -> float | None:
            ok = np.isfinite(v)
            return float(np.sum(v[ok] * w[ok]) / np.sum(w[ok])) if ok.any() and np.sum(w[ok]) > 0 else None

        job_act = wmean(act)
        ref_act, scope = ref["levels"].get(str(rows["model"].mode().iloc[0])), "same GPU model"
        if ref_act is None and ref["fleet"] is not None:
            ref_act, scope = ref["fleet"], "other GPU models of the fleet"
        if ref_act is None and act_name == "sm_active":
            ref_act, scope = REFERENCE_SM, "calibration (AcmeTrace busy SM)"
        slowdown = None if job_act is None or ref_act is None or ref_act <= 0 else \
            float(np.clip(1.0 - job_act / ref_act, 0.0, 1.0))
        cls = classify(a["busy"].to_numpy()[pos], column(fleet, "sm_active")[r], column(fleet, "dram_active")[r],
                       column(fleet, "tensor_active")[r])
        known = cls >= 0
        comm_share = float(np.sum(w[cls == CLASSES.index(COMM)]) / np.sum(w[known])) if known.any() else None
        hosts = sorted(set(rows["hostname"]))
        sites = rows[rows["site"] != ""].groupby("site")["hostname"].nunique().to_dict()
        evidence: dict[str, Any] = {
            "problem": problem, "hosts": hosts, "gpus": int(rows.drop_duplicates(["hostname", "gpu"]).shape[0]),
            "members": len(set(zip(rows["hostname"], rows["gpu"], fr["gpu_instance"].astype(str).to_numpy()[r],
                                       strict=True))),
            "pods": int(rows["pod"].nunique()), "training_evidence": "pod names" if confidence == "high"
            else f"behaviour (several pods, steadily busy) and communication ({ref['talk'].get(job, 'unknown')})",
            "minutes": ep["duration_s"] / 60.0, "gpu_hours": gpu_hours, "activity_signal": act_name,
            "job_activity": job_act, "reference_activity": ref_act, "reference_scope": scope, "est_slowdown": slowdown,
            "gpu_hours_at_stake": None if slowdown is None else gpu_hours * slowdown,
            "communication_share": comm_share,
            "nvlink_bps": wmean(column(fleet, "nvlink_bps")[r]), "pcie_bps": wmean(column(fleet, "pcie_bps")[r]),
        }
        if problem == WAN:
            evidence["hosts_per_site"] = {str(k): int(v) for k, v in sites.items()}
        if problem == MIG:
            evidence["mig_profiles"] = sorted(set(fr["mig_profile"].astype(str).to_numpy()[r]) - {""})
            evidence["physical_gpus"] = int(rows.drop_duplicates(["hostname", "gpu"]).shape[0])
            evidence["whole_gpu_equivalent"] = float(rows.drop_duplicates(
                ["hostname", "gpu", "pod"])["share"].sum())
        if problem in (NO_NVLINK, NUMA):
            evidence["per_host_gpus"] = {str(h): sorted(int(x) for x in set(p["gpu"].dropna()))
                                         for h, p in rows[~rows["mig"]].groupby("hostname")}
        severity = SEVERITY[problem]
        if problem == NO_NVLINK and comm_share is not None and comm_share >= self.comm_warning_share:
            severity = "warning"
        topo = fleet.topology
        topo = topo[topo["hostname"].astype(str).isin(list(set(rows["hostname"])))] if len(topo) else topo
        low = confidence == "low" or (problem == NUMA and not self._numa_measured(topo, a)) \
            or (problem == NO_NVLINK and not len(topo))
        ns = rows["namespace"].iloc[0] or None
        return Finding(
            kind=self.kind, severity=severity, summary=self._summary(problem, job, evidence, ep),
            start=ep["start"], end=ep["end"],
            score=slowdown if slowdown is not None else {WAN: 0.6, MIG: 0.5, NO_NVLINK: 0.4, NUMA: 0.2}[problem],
            job=job, namespace=ns, confidence="low" if low else "high", evidence=evidence,
        )

    @staticmethod
    def _talk(c: Communication) -> str:
        """The communication sign of a job judged by behaviour, for the evidence."""
        if c.evidence == "nvlink":
            return f"NVLink traffic, up to {c.nvlink_bps / 1e9:.0f} GB/s"
        return f"busy/wait phases in step, sync {c.sync:.2f}" if c.sync is not None else c.evidence

    @staticmethod
    def _numa_measured(topo: pd.DataFrame, a: pd.DataFrame) -> bool:
        """NUMA nodes read from data (a numa_node column or the job's nodes' non-NVLink topology), not the
        board layout."""
        return "numa_node" in a.columns or bool(len(topo) and (topo["link"] != "nvlink").any())

    @staticmethod
    def _summary(problem: str, job: str, ev: dict[str, Any], ep: dict[str, Any]) -> str:
        dur = format_duration(ep["duration_s"])
        cost = ""
        if ev["est_slowdown"] is not None and ev["reference_activity"] is not None:
            name = "SM" if ev["activity_signal"] == "sm_active" else "tensor"
            vs = (f" {name} activity {ev['job_activity']:.0%} vs {ev['reference_activity']:.0%} for healthy "
                  f"training ({ev['reference_scope']})")
            cost = (f"{vs}: ~{ev['est_slowdown']:.0%} slower, ~{ev['gpu_hours_at_stake']:.1f} of "
                    f"{ev['gpu_hours']:.1f} GPU-hours lost." if ev["est_slowdown"] >= 0.02 else
                    f"{vs}: no measurable slowdown yet on {ev['gpu_hours']:.1f} GPU-hours.")
        if ev["communication_share"] is not None and ev["communication_share"] >= 0.05:
            cost += f" {ev['communication_share']:.0%} of its GPU time is communication-bound."
        if problem == WAN:
            where = ", ".join(f"{s} ({n} node{'s' if n > 1 else ''})" for s, n in ev["hosts_per_site"].items())
            return (f"Training job {job} is split across sites {where} for {dur}: its all-reduce crosses the WAN."
                    f"{cost} Reschedule it within one site (topology-aware gang scheduling).")
        if problem == MIG:
            return (f"Training job {job} runs on {ev['members']} MIG instances ({', '.join(ev['mig_profiles'])}) "
                    f"of {ev['physical_gpus']} GPU(s) for {dur}: MIG instances have no NVLink or peer-to-peer, so "
                    f"gradients go through host memory.{cost} Give it ~{int(np.ceil(ev['whole_gpu_equivalent']))} "
                    f"whole GPU(s) on one NVLink node instead.")
        hosts = "; ".join(f"{h}: GPUs {','.join(map(str, g))}" for h, g in ev["per_host_gpus"].items())
        if problem == NO_NVLINK:
            return (f"Training job {job} talks over PCIe between GPUs without NVLink ({hosts}) for {dur} while "
                    f"NVLink-connected GPUs exist in the fleet.{cost} Schedule it on GPUs of one NVLink domain.")
        return (f"Training job {job} spans both NUMA nodes ({hosts}) for {dur} although its GPUs fit in one "
                f"(the node's other pods could sit around it): half its GPUs are remote from their CPU memory."
                f"{cost} Enable the kubelet topology manager (single-numa-node) or pin it to one socket.")

    @staticmethod
    def _note(fleet: Fleet) -> None:
        """Say once what cannot be checked on this input (dcgm-exporter has no topology or sites)."""
        f = fleet.frame
        gaps = []
        if not len(fleet.topology):
            gaps.append("no GPU topology (NUMA placement assumed from the HGX board layout on nodes moving NVLink "
                        "traffic only, missing NVLink judged from traffic)")
        if "site" not in f.columns or not (f["site"].astype(object).fillna("") != "").any():
            gaps.append(f"no site labels (jobs split across sites not checked: they come from truegpu's "
                        f"{S.NODE_INFO.name}, or kube-state-metrics' {S.KUBE_NODE_LABELS} with "
                        f"{S.KUBE_NODE_ZONE} allowlisted)")
        if gaps:
            note = "topology: " + "; ".join(gaps) + "; training on MIG slices is still checked"
            if note not in fleet.notes:
                fleet.notes.append(note)
