"""Sharding: N analyzer replicas over one Prometheus-compatible endpoint whose results union to
exactly the unsharded analysis (``analyze --shard i/n``, ``serve --shard i/n``).

The rule. A shard owns whole **hosts**, grouped into *units*: the connected components of hosts
linked by sharing a workload at any time of the window. So every member of a workload is in one
shard (stragglers, idle masking and topology compare a job's members), a GPU that moved between
jobs keeps both jobs together, a host with GPUs of several jobs keeps them together (thermal,
degraded_gpu and gpu_fault compare a GPU with its node), and a host that held no workload is a
unit of its own ("unallocated GPUs split by host"). Units are placed in *pieces*, whole racks where
they can be (``assign``: units linked by sharing a rack, cut in rack order where jobs chain too many
racks together), balanced by GPUs within a few %, each piece on its first shard by rendezvous hashing
that has room: sha256, never Python's per-process ``hash()``, so every replica computes the same owners.

Why read-only context too. Some comparisons reach outside any unit, to the whole fleet of a GPU
model: thermal's thermal resistance per model and its racks-versus-other-racks (and, without rack
labels, nodes-versus-fleet) references, degraded_gpu's robust fits and medians per model, topology's
healthy-training activity per model and "NVLink is in use", and the straggler's per-model maximum SM
clock where none is reported. They come from the fleet's reference hosts (analyzer.data.reference: a
stable sample of at most 64 hosts per model, whole racks, the same in every shard and in the unsharded
analysis), so a shard reads those hosts' families (``CONTEXT_SIGNALS``, plus the info series) whatever
it owns; and thermal compares a node with the other nodes of its rack and judges a rack on all its
nodes, so a shard reads the other nodes of its own nodes' racks too (only the racks at a piece's cut, where
they are known), with the few families thermal reads there (``RACK_SIGNALS``).
It runs the detectors on owned + context and keeps only the findings it
owns: a finding naming a host (GPU, node or node-of-a-job findings) belongs to that host's shard; a
job-level finding to its job's shard; a rack-level finding to the shard of the rack's smallest node;
anything else to shard 0. Scores and the GPU-hour partition are computed on the owned rows only, so
every GPU-hour is counted by exactly one shard. Per shard that is ~1/n of an unsharded read, plus the
reference sample (bounded, whatever the fleet's size) and the thermal families of its cut racks' other nodes.

Discovery (Prometheus) is an index lookup, no samples: the host label values of every family the
analysis reads, and the series (label sets) of the families that carry the GPU and its workload
(memory used on every GPU and MIG instance, in both dialects; truegpu's allocation info, GPU info for the
models and node info for the racks, which rank the reference sample). Workloads
are named as normalize names them (``_workloads`` mirrors its precedence; after loading,
``ShardFleet`` checks that no workload spans two shards and fails loudly if one does, and
``reference_read`` that the sample read is the one the whole fleet gives: where it is not, a rack
coming up with no data yet, the shard reads further down the ranking). Then up to three reads:
the owned hosts with every family, the reference sample's other hosts with the context families, the
racks' other nodes with the rack families, merged row-wise into one fleet on one grid. serve's ticks
keep each of those reads' window between ticks (``KeptReads``): a tick loads only its new steps.

Merging the shards' outputs: findings and the job tables are disjoint (union); GPU-hours (every
part of the partition, fleet and namespace, and the score tables' hours) add up, e.g.
``sum without (instance, pod) (truegpu_analyzer_fleet_gpu_seconds)``; a fleet-level ratio is the
shard's own (weighted by its hours).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import numpy as np
import pandas as pd

from analyzer.data import dialects as D
from analyzer.data import reference
from analyzer.data.frame import Fleet, device_order, empty_frame, merged_accounting
from analyzer.data.hosts import exporter_pods, map_exporter_pods, pod_info, query_pod_info
from analyzer.data.ingest import LabelSets, PrometheusClient
from analyzer.data.ingest.prometheus import Matcher, MatcherValue, selector
from analyzer.data.load import NoTelemetry, load_prometheus
from analyzer.data.reference import ranked_units, sample, stable_hash
from analyzer.data.window import WindowLoader
from analyzer.findings import Finding
from exporter import schema as S
from exporter.attribution.jobs import KNOWN_JOB_LABELS, derive_job, sanitized_job_labels

#: Signals of every GPU that the fleet-wide references read (see the module docstring), and why.
CONTEXT_SIGNALS: dict[str, str] = {
    "temp": "thermal: resistance per model, node/rack/fleet references; degraded_gpu: temperature ~ power fit",
    "mem_temp": "thermal: HBM at its limit in a rack's nodes; degraded_gpu: HBM ~ die fit",
    "power": "thermal: power-corrected temperature; degraded_gpu: power ~ activity fit per model",
    "power_limit": "degraded_gpu: power limit against the model's median",
    "thermal_throttle": "thermal: nodes of a rack at the limit; degraded_gpu: throttled windows left out",
    "power_throttle": "degraded_gpu: power-capped windows left out",
    "gpu_util": "degraded_gpu: activity of the fit; topology: healthy training and who communicates",
    "gr_active": "the same, on MIG instances and where GPU util is missing",
    "sm_active": "degraded_gpu: activity of the fit; topology: healthy-training activity per model",
    "tensor_active": "degraded_gpu: activity of the fit; topology: its activity where SM is missing",
    "dram_active": "degraded_gpu: power and HBM fits",
    "sm_clock": "degraded_gpu: clock ratio vs the model's median; straggler, degraded_gpu: per-model max clock "
                "where none is reported (analyzer.detectors.clock_max)",
    "sm_clock_max": "degraded_gpu: clock ratio vs the model's median",
    "nvlink_bps": "topology: whether NVLink is used anywhere, and who communicates",
}
#: Signals of the other nodes of a shard's racks that thermal reads (a rack's level and findings, a node's rack
#: peers, the GPU findings a rack finding folds in). A subset of CONTEXT_SIGNALS.
RACK_SIGNALS: tuple[str, ...] = ("temp", "mem_temp", "power", "thermal_throttle", "sm_clock", "sm_clock_max")
#: ... and of their clock-event reasons (one series each in truegpu's data) only the thermal ones; a series
#: without the label (dcgm-exporter's bitmask, every other family) still matches.
_THERMAL_ONLY: dict[str, MatcherValue] = {S.CLOCK_EVENT_ACTIVE.labels[0]: [*S.THERMAL_REASONS, ""]}
#: Families that name every GPU and MIG instance, and its workload, in both dialects (discovery).
_CARRIERS: tuple[str, ...] = (
    *sorted({n for n, srcs in D.SOURCES.items() if any(s.signal.name == "mem_used" for s in srcs)}),
    S.GPU_ALLOCATION_INFO.name,
)
#: Families naming every GPU's model and every node's rack (truegpu; dcgm-exporter's carriers name the model).
_PLACES: tuple[str, ...] = (S.GPU_INFO.name, S.NODE_INFO.name)
_HOST_LABELS = D.LABEL_ALIASES["hostname"]
_JOB_LABELS = tuple(zip(KNOWN_JOB_LABELS * 2, sanitized_job_labels(), strict=True))
_ORDINAL = re.compile(r"^(?:.+-)?(\d+)$")
#: Prometheus evaluates a point this long before the end of its row (as analyzer.data.load).
_EDGE = 0.001


def context_names(signals: Iterable[str] = tuple(CONTEXT_SIGNALS)) -> frozenset[str]:
    """Input names (both dialects, every spelling) feeding ``signals`` (CONTEXT_SIGNALS), plus the info series."""
    signals = set(signals)
    feeding = {n for n, srcs in D.SOURCES.items() if any(s.signal.name in signals for s in srcs)}
    # A shared GPU's holders matter to the shard that owns it only (its scores and costs), never as a reference.
    return frozenset(feeding | {m.name for m in D.INFO_METRICS if m not in D.SHARE_METRICS})


# The rule ------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Shard:
    """Shard ``index`` of ``count`` (0-based)."""

    index: int
    count: int

    @classmethod
    def parse(cls, text: str) -> Shard:
        """``I/N``; I may be a StatefulSet pod name ending in its ordinal (``truegpu-analyzer-2/4``)."""
        head, sep, tail = str(text).rpartition("/")
        m = _ORDINAL.match(head.strip())
        if not sep or not m or not tail.strip().isdigit():
            raise ValueError(f"--shard {text!r}: expected I/N, e.g. 0/4 or POD-NAME-2/4 (the pod's ordinal)")
        index, count = int(m.group(1)), int(tail)
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"--shard {text!r}: the shard index must be 0 to N-1 and N at least 1")
        return cls(index, count)

    def __str__(self) -> str:
        return f"{self.index}/{self.count}"


def shard_of(key: str, count: int) -> int:
    """A node's shard where the assignment has none (a host discovery did not see): ``stable_hash``, the same
    in every process and on every machine."""
    return stable_hash(key) % count


def units(nodes: Iterable[str], workloads: Iterable[Iterable[str]]) -> dict[str, str]:
    """node -> unit key (the smallest node of its unit): connected components of the nodes linked by
    sharing a workload (each item of ``workloads`` is the nodes one workload touched)."""
    parent = {n: n for n in nodes}

    def root(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for group in workloads:
        members = sorted(set(group))
        for other in members[1:]:
            a, b = root(members[0]), root(other)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {n: root(n) for n in parent}


#: A shard takes at most this share more than its fair share of GPUs before a piece goes to its next choice.
SLACK = 0.05
#: Pieces are at most about this share of a shard's fair share of GPUs (a larger block is cut).
PIECE_SHARE = 0.5


def assign(unit: Mapping[str, str], racks: Mapping[str, str], gpus: Mapping[str, int], count: int) -> dict[str, int]:
    """node -> shard. Shards are filled with *pieces*: whole racks with the units on them (units linked by
    sharing a rack, ``racks``: node -> rack, "" unknown), so a shard owns whole racks and reads no other
    rack's nodes for thermal. Where jobs spanning racks chain more racks together than ``PIECE_SHARE`` of a
    shard's share of GPUs (``gpus``: node -> GPUs, at least 1 counted), the block is cut, units whole, in
    rack order: only the racks at a cut are read by two shards. Pieces go largest first (then in
    ``stable_hash`` order), each to the first shard of its own hash order (rendezvous) that stays within
    ``SLACK`` over the fair share, else to the least loaded: shards differ by a few % at most, and a piece
    that changes moves the pieces after it only where their first choice filled up (serve's replicas
    reload what moved)."""
    nodes = sorted(unit)
    members: dict[str, list[str]] = {}
    same_rack: dict[str, list[str]] = {}
    for n in nodes:
        members.setdefault(unit[n], []).append(n)
        if racks.get(n):
            same_rack.setdefault(racks[n], []).append(n)
    size = {k: sum(max(1, int(gpus.get(n, 0))) for n in ns) for k, ns in members.items()}
    fair = sum(size.values()) / count
    blocks: dict[str, set[str]] = {}  # block -> its units
    for n, b in units(nodes, [*members.values(), *same_rack.values()]).items():
        blocks.setdefault(b, set()).add(unit[n])
    pieces: list[tuple[int, str, list[str]]] = []  # (GPUs, key, nodes)
    for block in blocks.values():
        piece, w = [], 0
        for key in sorted(block, key=lambda k: (min(racks.get(n, "") for n in members[k]), k)):
            piece += members[key]
            w += size[key]
            if w >= PIECE_SHARE * fair:
                pieces.append((w, min(piece), piece))
                piece, w = [], 0
        if piece:
            pieces.append((w, min(piece), piece))
    load, cap, out = [0] * count, (1 + SLACK) * fair, {}
    for w, key, piece in sorted(pieces, key=lambda p: (-p[0], stable_hash(p[1]), p[1])):
        order = sorted(range(count), key=lambda s: stable_hash(f"{key}/{s}"))
        to = next((s for s in order if load[s] + w <= cap), min(order, key=lambda s: load[s]))
        load[to] += w
        out.update(dict.fromkeys(piece, to))
    return out


@dataclass(frozen=True)
class Ownership:
    """Which shard owns each node (``owners``: node -> shard, from :func:`assign`)."""

    shard: Shard
    owners: Mapping[str, int]

    @classmethod
    def of(cls, shard: Shard, unit: Mapping[str, str], racks: Mapping[str, str], gpus: Mapping[str, int]) -> Ownership:
        return cls(shard, assign(unit, racks, gpus, shard.count))

    def owner(self, node: str) -> int:
        return self.owners[node] if node in self.owners else shard_of(node, self.shard.count)

    def owns(self, node: str) -> bool:
        return node in self.owners and self.owners[node] == self.shard.index

    @cached_property
    def nodes(self) -> frozenset[str]:
        """The nodes this shard owns."""
        return frozenset(n for n, s in self.owners.items() if s == self.shard.index)


def ownership_from_fleet(fleet: Fleet, shard: Shard) -> Ownership:
    """The rule applied to a loaded fleet (files: read whole, then filtered): workloads, racks, GPUs from its frame."""
    f = fleet.frame
    pairs = _pairs(f, "job", "hostname")
    groups = pairs.groupby("job", sort=False)["hostname"].agg(list) if len(pairs) else []
    racks = _pairs(f, "hostname", "rack")
    gpus = _pairs(f, "hostname", "gpu").groupby("hostname")["gpu"].size() if "gpu" in f.columns else {}
    return Ownership.of(shard, units(_values(f, "hostname"), groups), dict(zip(racks["hostname"], racks["rack"],
                        strict=True)), dict(gpus))


# A shard's fleet -------------------------------------------------------------------------------
@dataclass
class ShardFleet(Fleet):
    """The owned rows of a shard (what scores, the partition, /metrics and the API read) and, in
    ``whole``, owned + read-only context (what the detectors read: analyzer.pipeline.detect keeps
    the findings ``owns``)."""

    whole: Fleet | None = None
    ownership: Ownership | None = None
    #: What a reader should know: shard, its nodes and GPUs, the nodes read as context.
    about: dict[str, Any] = field(default_factory=dict)

    def owns(self, f: Finding) -> bool:
        own = self.ownership
        if f.hostname is not None:
            return own.owns(f.hostname)
        if f.job is not None and f.job in self._job_node:
            return own.owns(self._job_node[f.job])
        if f.rack is not None and f.rack in self._rack_node:
            return own.owns(self._rack_node[f.rack])
        return own.shard.index == 0

    @cached_property
    def _job_node(self) -> dict[str, str]:
        pairs = _pairs(self.whole.frame, "job", "hostname")
        return pairs.groupby("job", sort=False)["hostname"].min().to_dict() if len(pairs) else {}

    @cached_property
    def _rack_node(self) -> dict[str, str]:
        pairs = _pairs(self.whole.frame, "rack", "hostname")
        pairs = pairs[(pairs["rack"] != "") & pairs["hostname"].isin(list(self.ownership.owners))]
        return pairs.groupby("rack", sort=False)["hostname"].min().to_dict() if len(pairs) else {}

    @classmethod
    def of(cls, owned: Fleet, whole: Fleet, ownership: Ownership, about: dict[str, Any]) -> ShardFleet:
        """The shard of ``whole`` whose owned rows are ``owned``; fails when a workload spans two shards."""
        pairs = _pairs(whole.frame, "job", "hostname")
        if len(pairs):
            owners = pairs.assign(owner=[ownership.owner(h) for h in pairs["hostname"]])
            split = owners.groupby("job")["owner"].nunique()
            if (split > 1).any():
                job = str(split.index[split > 1][0])
                hosts = sorted(owners.loc[owners["job"] == job, "hostname"])
                raise ValueError(f"sharding: workload {job!r} spans hosts of several shards ({', '.join(hosts[:5])}): "
                                 "discovery did not link them, so the shards would not add up; please report it")
        return cls(frame=owned.frame, step=whole.step, start=whole.start, end=whole.end, events=owned.events,
                   topology=owned.topology, shares=owned.shares, dialect=whole.dialect, missing=dict(whole.missing),
                   notes=whole.notes,
                   whole=whole, ownership=ownership, about=about)


def shard_fleet(fleet: Fleet, shard: Shard) -> ShardFleet:
    """Shard ``shard`` of a fleet read whole (files): the context is the whole fleet."""
    own = ownership_from_fleet(fleet, shard)
    f = fleet.frame
    host = f["hostname"].astype(str).to_numpy() if len(f) else np.zeros(0, dtype=object)
    mine = np.isin(host, list(own.nodes))
    frame = f[mine].reset_index(drop=True)
    for c in frame.columns:
        if isinstance(frame[c].dtype, pd.CategoricalDtype):
            frame[c] = frame[c].cat.remove_unused_categories()

    def hosted(table: pd.DataFrame) -> pd.DataFrame:
        return table[table["hostname"].astype(str).isin(list(own.nodes))].reset_index(drop=True)

    owned = Fleet(frame=frame, step=fleet.step, start=fleet.start, end=fleet.end, events=hosted(fleet.events),
                  topology=hosted(fleet.topology), accounting=fleet.accounting, shares=hosted(fleet.shares))
    return ShardFleet.of(owned, fleet, own, _about(own, frame, context_nodes=len(set(host)) - len(own.nodes)))


# Discovery (Prometheus) ---------------------------------------------------------------------------
@dataclass(frozen=True)
class Discovery:
    """What exists in a window: host label spellings in use, each node's raw host values, its unit."""

    host_labels: tuple[str, ...]
    raw: Mapping[str, tuple[str, ...]]
    unit: Mapping[str, str]
    #: node -> its GPUs' models ("" where none is named) and its rack ("" unknown), as normalize reads them.
    models: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    racks: Mapping[str, str] = field(default_factory=dict)
    #: node -> GPUs discovery saw on it (what a shard's share is counted in).
    gpus: Mapping[str, int] = field(default_factory=dict)

    @cached_property
    def unplaced(self) -> frozenset[str]:
        """Nodes whose GPUs discovery saw no model of (no memory-used or GPU info series): read as reference
        candidates whatever their rank."""
        return frozenset(n for n in self.unit if not self.models.get(n))

    @cached_property
    def ranked(self) -> pd.DataFrame:
        """The nodes as analyzer.data.reference ranks them."""
        pairs = [(n, m) for n, ms in self.models.items() for m in ms]
        return ranked_units(np.array([n for n, _ in pairs], dtype=object), np.array([m for _, m in pairs],
                            dtype=object), np.array([self.racks.get(n, "") for n, _ in pairs], dtype=object))

    def matchers(self, nodes: Iterable[str]) -> dict[str, MatcherValue]:
        """Label matchers selecting the series of ``nodes`` (every host spelling in use: a series must
        name one of them, or lack the spelling)."""
        values = sorted({raw for n in nodes for raw in self.raw[n]})
        blank = [""] if len(self.host_labels) > 1 else []
        return {label: values + blank for label in self.host_labels}


def discover(client: PrometheusClient, start: float, end: float, step: float, *,
             matchers: Mapping[str, MatcherValue] | None = None, job_label: str | None = None) -> Discovery:
    """Hosts and workloads of ``[start, end)`` from the index (label values and series; no samples)."""
    matchers = dict(matchers or {})
    lo, hi = start, end + step  # what the loads' points can reach
    needed = selector(None, {**matchers, "__name__": Matcher("=~", "|".join(sorted(D.needed_names())))})
    values: dict[str, list[str]] = {}
    for label in _HOST_LABELS:
        body = client.api(f"label/{label}/values", [("match[]", needed), ("start", repr(lo)), ("end", repr(hi))],
                          method="GET")
        found = [v for v in body.get("data") or [] if isinstance(v, str) and v]
        if found:
            values[label] = found
    series = client.series([selector(n, matchers) for n in (*_CARRIERS, *_PLACES)], lo, hi)
    hostless = [s for s in series if s.get(S.GPU) and not any(s.get(k) for k in _HOST_LABELS)]
    if hostless:
        raise ValueError(f"sharding needs a host label ({' or '.join(_HOST_LABELS)}) on every GPU series; "
                         f"{len(hostless)} series lack it, e.g. {hostless[0]} (dcgm-exporter 1.x: relabel the "
                         "instance into Hostname in Prometheus)")
    raw_hosts = sorted({v for vs in values.values() for v in vs})
    if not raw_hosts:
        raise NoTelemetry(f"no GPU telemetry at {client.url} between {start:.0f} and {end:.0f}"
                         f"{' matching ' + str(matchers) if matchers else ''}: nothing to shard")
    node = dict(zip(raw_hosts, _nodes(client, raw_hosts, lo, hi, step), strict=True))
    raw: dict[str, list[str]] = {}
    for r, n in node.items():
        raw.setdefault(n, []).append(r)
    groups: dict[str, set[str]] = {}
    models: dict[tuple[str, str], str] = {}
    racks: dict[str, str] = {}
    for s, names in zip(series, _workloads(series, job_label), strict=True):
        host = next((s[k] for k in _HOST_LABELS if s.get(k)), None)
        if host not in node:
            continue
        for name in names:
            groups.setdefault(name, set()).add(node[host])
        if s.get(S.GPU):  # a GPU's model: the first named (normalize: its own series, else its GPU's)
            got = next((s[k] for k in D.LABEL_ALIASES["model"] if s.get(k)), "")
            models[(node[host], s[S.GPU])] = models.get((node[host], s[S.GPU])) or got
        if s.get("__name__") == S.NODE_INFO.name and s.get("rack"):
            racks[node[host]] = s["rack"]
    per_node: dict[str, set[str]] = {n: set() for n in raw}
    gpus: dict[str, int] = dict.fromkeys(raw, 0)
    for (n, _), m in models.items():
        per_node[n].add(m)
        gpus[n] += 1
    return Discovery(tuple(values), {n: tuple(v) for n, v in raw.items()}, units(raw, groups.values()),
                     {n: tuple(sorted(ms)) for n, ms in per_node.items()}, racks, gpus)


def _nodes(client: PrometheusClient, raw: list[str], lo: float, hi: float, step: float) -> list[str]:
    """The node of each raw host value: dcgm-exporter pod names through kube_pod_info (as normalize)."""
    pods = exporter_pods(raw)
    if not pods:
        return raw
    long, _ = query_pod_info(client, pods, lo + step - _EDGE, hi - _EDGE, step)
    mapped, _ = map_exporter_pods(np.asarray(raw, dtype=object), pod_info(long))
    return [str(n) for n in mapped]


def _workloads(series: list[dict[str, str]], job_label: str | None) -> list[set[str]]:
    """Per series: the workload names normalize may give it. Mirrors analyzer.data.normalize's rule
    (an explicit ``job_label``; allocation info's workload, else exported_job, else job; dcgm-exporter's
    hpc_job; else derived from the pod with the first operator label) and gives a derived name both
    with and without the namespace's other pods as siblings, so a subset of pods derives no name
    discovery has not linked."""
    def first(s: dict[str, str], names: Iterable[str]) -> str:
        return next((s[k] for k in names if s.get(k)), "")

    pods = [first(s, D.LABEL_ALIASES["pod"]) for s in series]
    spaces = [first(s, D.LABEL_ALIASES["namespace"]) for s in series]
    siblings: dict[str, set[str]] = {}
    for ns, pod in zip(spaces, pods, strict=True):
        if pod:
            siblings.setdefault(ns, set()).add(pod)
    out = []
    for s, ns, pod in zip(series, spaces, pods, strict=True):
        name = s.get("__name__", "")
        explicit = s.get(job_label, "") if job_label else ""
        own = first(s, (S.WORKLOAD, "exported_job", "job")) if name == S.GPU_ALLOCATION_INFO.name else ""
        hpc = s.get(D.HPC_JOB_LABEL, "") if D.dialect_of(name) == "dcgm" else ""
        given = explicit or own or hpc
        if given or not pod:
            out.append({given} - {""})
            continue
        label = next(((k, s[san]) for k, san in _JOB_LABELS if s.get(san)), None)
        labels = dict([label]) if label else None
        out.append({derive_job(pod, labels, siblings=siblings.get(ns, set())), derive_job(pod, labels)})
    return out


# Loading (Prometheus) ----------------------------------------------------------------------------
def load_shard(url: str, start: float, end: float, step: float, shard: Shard, *,
               matchers: Mapping[str, MatcherValue] | None = None, job_label: str | None = None,
               kept: KeptReads | None = None, **client_kwargs: Any) -> ShardFleet:
    """Shard ``shard`` of ``[start, end)``: discovery, its hosts with every family, the other hosts'
    context families, merged (load_prometheus does each read, or ``kept``'s window of it: serve's ticks;
    ``client_kwargs`` go to it)."""
    matchers = dict(matchers or {})
    clash = sorted(set(matchers) & set(_HOST_LABELS))
    if clash:
        raise ValueError(f"--matcher on the host label ({', '.join(clash)}) and --shard exclude each other")
    with PrometheusClient(url, **client_kwargs) as client:
        found = discover(client, start, end, step, matchers=matchers, job_label=job_label)
    own = Ownership.of(shard, found.unit, found.racks, found.gpus)

    def load(nodes: Iterable[str], names: Iterable[str] | None = None,
             narrow: Mapping[str, MatcherValue] | None = None) -> Fleet:
        selectors = {**matchers, **found.matchers(nodes), **(narrow or {})}

        def read(lo: float, hi: float, labelsets: LabelSets | None = None) -> Fleet:
            return load_prometheus(url, lo, hi, step, matchers=selectors, job_label=job_label, names=names,
                                   labelsets=labelsets, **client_kwargs)

        if kept is None:
            return read(start, end)
        return kept.load(repr((sorted(selectors.items()), None if names is None else sorted(names))), read, start, end)

    owned = load(sorted(own.nodes)) if own.nodes else None
    rack_names = context_names(RACK_SIGNALS) - {S.GPU_TOPOLOGY_INFO.name}  # thermal reads no topology
    margin = REFERENCE_MARGIN
    while True:
        picked, mates = context_nodes(found, own.nodes, margin)
        reads = [load(sorted(nodes), names, narrow) for nodes, names, narrow in (
            (picked, context_names(), None), (mates, rack_names, _THERMAL_ONLY)) if nodes]
        context = reads[0] if len(reads) == 1 else merge(*reads) if reads else None
        if owned is None:  # an empty shard still serves (health, no findings) on the window's grid
            owned = Fleet(frame=empty_frame(), step=float(step), start=float(start), end=context.end,
                          dialect=context.dialect)
        whole = merge(owned, context) if context is not None else owned
        if reference_read(whole, found, margin) or margin >= len(found.unit):
            break
        margin *= 4  # more discovered hosts than the margin had no data (a rack coming up): read further
    return ShardFleet.of(owned, whole, own, _about(own, owned.frame, context_nodes=len(picked) + len(mates)))


#: Hosts per model read beyond the reference sample: a few discovered hosts may have no sample in the window.
REFERENCE_MARGIN = 8


def context_nodes(found: Discovery, owned: Iterable[str], margin: int = REFERENCE_MARGIN) -> tuple[set[str], set[str]]:
    """The nodes a shard reads as context, not its own: the candidates of the fleet's reference sample
    (analyzer.data.reference, ``margin`` more hosts per model), read with every context family; and the other
    nodes of its own nodes' racks (a rack's level and a node's rack peers are all of its nodes), with the
    RACK_SIGNALS families."""
    owned = set(owned)
    picked = (set(sample(found.ranked, reference.REFERENCE_HOSTS + margin)["host"]) | found.unplaced) - owned
    mine = {found.racks[n] for n in owned if found.racks.get(n)}
    return picked, {n for n, r in found.racks.items() if r in mine} - owned - picked


def reference_read(whole: Fleet, found: Discovery, margin: int = REFERENCE_MARGIN) -> bool:
    """Is the reference sample of what a shard read the one the whole fleet gives? Not where a unit of it ranks
    past the candidates read (more than ``margin`` discovered hosts of a model had no data in the window),
    unless discovery saw no model on its hosts (they were all read)."""
    hosts, models, racks = whole.placements()
    used = sample(ranked_units(hosts, models, racks))
    last = sample(found.ranked, reference.REFERENCE_HOSTS + margin).groupby("model")["rank"].max()
    both = used.merge(last.rename("last").reset_index(), on="model", how="left")
    return not (~(both["rank"] <= both["last"]) & ~both["host"].isin(list(found.unplaced))).any()


class KeptReads:
    """A shard's reads kept between serve's ticks: one WindowLoader (analyzer.data.window) per read (its
    selectors and families), so while a shard's hosts stay the same a tick loads only its new steps, as
    the unsharded serve does, and each read is exactly its full load. A read whose hosts changed (a unit
    moved, a rack came up) is a new read, loaded whole; the reads a tick did not make are dropped."""

    def __init__(self) -> None:
        self.windows: dict[str, WindowLoader] = {}
        self._used: set[str] = set()

    def load(self, key: str, read: Callable[[float, float, LabelSets], Fleet], start: float, end: float) -> Fleet:
        """``read(lo, hi, labelsets)`` of ``[start, end)`` through the window kept under ``key``."""
        window = self.windows.get(key)
        if window is None:
            labelsets = LabelSets()  # the series' label sets, kept from one load to the next
            window = self.windows[key] = WindowLoader(lambda lo, hi: read(lo, hi, labelsets))
        self._used.add(key)
        return window(start, end)

    def tick(self, load: Callable[[], ShardFleet]) -> ShardFleet:
        """One tick's ``load()``; after a good one, the reads it did not make are dropped."""
        self._used = set()
        fleet = load()
        self.windows = {k: w for k, w in self.windows.items() if k in self._used}
        return fleet


def shard_loader(url: str, step: float, shard: Shard, *, matchers: Mapping[str, MatcherValue] | None = None,
                 job_label: str | None = None, kept: KeptReads | None = None,
                 **client_kwargs: Any) -> Callable[[float, float], ShardFleet]:
    """``serve``'s loader (analyzer.service.loop.Loader) of one shard: ``load_shard`` of each window, through
    ``kept`` reads where given (a window that slides forward: each tick loads its new steps)."""

    def load(start: float, end: float) -> ShardFleet:
        def once() -> ShardFleet:
            return load_shard(url, start, end, step, shard, matchers=matchers, job_label=job_label, kept=kept,
                              **client_kwargs)

        return kept.tick(once) if kept is not None else once()

    return load


def merge(owned: Fleet, context: Fleet) -> Fleet:
    """One fleet of two reads of one grid over disjoint hosts: rows in the frame's order (by device,
    then time), categories the sorted union (as normalize makes them); notes and missing signals are
    the owned read's (the context read lacks the other families by design)."""
    if (owned.start, owned.end, owned.step) != (context.start, context.end, context.step) and len(owned.frame):
        raise ValueError(f"sharding: the owned and context reads have different grids "
                         f"({owned.start}..{owned.end}/{owned.step} vs {context.start}..{context.end}/{context.step})")
    frame = _merged_frame(owned.frame, context.frame)
    topology = pd.concat([owned.topology, context.topology], ignore_index=True)
    topology = topology.iloc[np.argsort(topology["hostname"].astype(str).to_numpy(), kind="stable")]
    events = pd.concat([e for e in (owned.events, context.events) if len(e)] or [owned.events], ignore_index=True)
    shares = pd.concat([e for e in (owned.shares, context.shares) if len(e)] or [owned.shares], ignore_index=True)
    present = {c for c in frame.columns if frame[c].notna().any()}
    return Fleet(frame=frame, step=context.step, start=context.start, end=context.end, events=events,
                 shares=shares, topology=topology.reset_index(drop=True),
                 accounting=merged_accounting(context.accounting, owned.accounting),
                 dialect=owned.dialect if owned.dialect == context.dialect or not len(owned.frame) else "mixed",
                 missing={k: v for k, v in owned.missing.items() if k not in present}, notes=owned.notes)


def _merged_frame(a: pd.DataFrame, b: pd.DataFrame) -> pd.DataFrame:
    if not len(a):
        return b
    cols = list(dict.fromkeys([*a.columns, *b.columns]))
    parts = [f.reindex(columns=cols) for f in (a, b)]
    for c in cols:
        sources = [f[c] for f in (a, b) if c in f.columns]
        if any(isinstance(s.dtype, pd.CategoricalDtype) for s in sources):
            cats = np.unique(np.concatenate([np.asarray(s.astype("category").cat.categories.astype(str), dtype=str)
                                             for s in sources]))
            for p, f in zip(parts, (a, b), strict=True):
                p[c] = pd.Categorical(f[c] if c in f.columns else np.full(len(f), np.nan), categories=cats)
    frame = pd.concat(parts, ignore_index=True)
    # rows are device-major: order the devices (each a run of rows) and keep each run's time order
    dev = [frame[c].astype(str).to_numpy() for c in ("hostname", "gpu", "gpu_instance")]
    starts = np.flatnonzero(np.r_[True, (dev[0][1:] != dev[0][:-1]) | (dev[1][1:] != dev[1][:-1])
                                  | (dev[2][1:] != dev[2][:-1])])
    ends = np.r_[starts[1:], len(frame)]
    order = device_order(*(d[starts] for d in dev))
    rows = np.concatenate([np.arange(starts[i], ends[i]) for i in order])
    return frame.iloc[rows].reset_index(drop=True)


# Helpers -----------------------------------------------------------------------------------------
def _values(frame: pd.DataFrame, col: str) -> list[str]:
    if col not in frame.columns or not len(frame):
        return []
    return sorted(str(v) for v in frame[col].dropna().unique())


def _pairs(frame: pd.DataFrame, a: str, b: str) -> pd.DataFrame:
    """Distinct (a, b) pairs of two columns where both are known, as strings."""
    if a not in frame.columns or b not in frame.columns or not len(frame):
        return pd.DataFrame({a: pd.Series(dtype=object), b: pd.Series(dtype=object)})
    pairs = frame[[a, b]].dropna().drop_duplicates()
    return pd.DataFrame({c: pairs[c].astype(str).to_numpy(dtype=object) for c in (a, b)})


def _about(own: Ownership, frame: pd.DataFrame, context_nodes: int) -> dict[str, Any]:
    gpus = int(frame.groupby(["hostname", "gpu"], observed=True).ngroups) if len(frame) else 0
    return {"shard": str(own.shard), "index": own.shard.index, "count": own.shard.count,
            "nodes": len(own.nodes), "gpus": gpus, "context_nodes": context_nodes}


__all__ = ["CONTEXT_SIGNALS", "PIECE_SHARE", "SLACK", "Discovery", "KeptReads", "Ownership", "Shard", "ShardFleet",
           "assign", "context_names", "discover", "load_shard", "merge", "ownership_from_fleet", "shard_fleet",
           "shard_loader", "shard_of", "units"]
