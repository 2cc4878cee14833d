"""Scenario files: a YAML description of a simulated cluster, validated on load.

A scenario says how big the cluster is (topology), what runs on it (workloads, plus an
optional ``fill`` that spreads a workload mix over the nodes nobody named), and which
problems are injected (faults). Times are relative to the scenario start and accept
``90``, ``"45s"``, ``"30m"``, ``"1h30m"``. Every error names the file and the key so a
typo in a fixture is a one-line fix, not a stack trace.

Top-level keys::

    name, description, seed, duration, start (ISO-8601, default 2026-01-05T00:00:00Z)
    topology: {sites: [dc1, dc2] | 2, racks_per_site, nodes_per_rack, gpus_per_node, model: H100 | [H100, L40S]}
    workloads: [{name, kind, namespace, container, nodes | gpus | instances, mig_profile,
                 sites, model, start, end, load, burst}]
    fill: {training, inference, unallocated (fractions of the remaining free nodes), gang_nodes, namespace}
    faults: [{kind, target: {job, rank | node_rank} | {hostname, gpu} | {rack, nodes}, start, end, ...params}]
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from exporter.timeparse import parse_duration, parse_time

#: fixtures/scenarios of the repository (the package is installed editable from it).
SCENARIO_DIR: Path = Path(__file__).resolve().parents[2] / "fixtures" / "scenarios"

DEFAULT_START = "2026-01-05T00:00:00Z"

WORKLOAD_KINDS = ("training", "inference", "memory_bound", "idle_allocated")
#: How the holders of a shared GPU use it (WorkloadSpec.sharing).
SHARING_MODES = ("time-slicing", "mps")
FAULT_KINDS = (
    "thermal_straggler", "power_cap", "input_starved", "pcie_downgrade", "nvlink_errors", "xid", "rack_cooling",
    "slow_gpu", "thermal_degradation", "power_inefficiency", "hbm_hot",
)
XID_CODES = (48, 63, 64, 79, 94, 95)
MIG_PROFILES = {"1g.10gb": 7, "2g.20gb": 3, "3g.40gb": 2, "4g.40gb": 1, "7g.80gb": 1}
GPU_MODELS = ("H100", "A100", "L40S")
FILL_KINDS = ("training", "inference", "unallocated")

#: Parameters each fault kind accepts (besides kind/target/start/end) with their defaults.
FAULT_PARAMS: dict[str, dict[str, float]] = {
    # slowdown > 0: the gang's step time is slowed by exactly this fraction (0.1 = 10%); the
    # temperature excess / power limit are then derived from it and extra_celsius / limit_watts ignored.
    "thermal_straggler": {"extra_celsius": 40.0, "slowdown": 0.0},
    "power_cap": {"limit_watts": 250.0, "slowdown": 0.0},
    "input_starved": {"starve": 0.8},
    "pcie_downgrade": {"gen": 3.0, "width": 8.0, "replays_per_second": 0.2},
    "nvlink_errors": {"crc_per_second": 2.0, "links_down": 0.0},
    "xid": {"code": 79.0, "events": 1.0},
    "rack_cooling": {"ramp_celsius": 45.0, "ramp_seconds": 3600.0, "nodes": 0.0},
    "slow_gpu": {"slowdown": 0.2, "extra_work": 0.0},
    "thermal_degradation": {"extra_celsius": 12.0},
    "power_inefficiency": {"extra_fraction": 0.25},
    "hbm_hot": {"extra_celsius": 10.0},
}

#: Quiet partial failures (issue 12) and healthy chip-to-chip variation: see simulator.faults.
PARTIAL_FAULT_PARAMS: dict[str, dict[str, float]] = {
    "ecc_storm": {"start_per_second": 0.02, "peak_per_second": 3.0, "ramp_seconds": 3600.0},
    "nvlink_crc_rising": {"start_per_second": 0.1, "peak_per_second": 20.0, "ramp_seconds": 2400.0},
    "power_deficit": {"deficit_fraction": 0.25},
    "power_spread": {"spread": 0.2},
}
FAULT_KINDS = (*FAULT_KINDS, *PARTIAL_FAULT_PARAMS)
FAULT_PARAMS.update(PARTIAL_FAULT_PARAMS)

#: Quiet stragglers (issue 12) and the healthy job variations they must be told from: see simulator.faults.
STRAGGLER_FAULT_PARAMS: dict[str, dict[str, float]] = {
    "intermittent_straggler": {"slowdown": 0.15, "period": 600.0, "duty": 0.3, "extra_work": 0.0},
    "chip_spread": {"spread": 0.04},
    "startup": {"seconds": 300.0},
}
FAULT_KINDS = (*FAULT_KINDS, *STRAGGLER_FAULT_PARAMS)
FAULT_PARAMS.update(STRAGGLER_FAULT_PARAMS)


class ScenarioError(ValueError):
    """A scenario file (or override) that does not describe a usable cluster."""


@dataclass(frozen=True)
class TopologySpec:
    sites: tuple[str, ...] = ("dc1",)
    racks_per_site: int = 1
    nodes_per_rack: int = 2
    gpus_per_node: int = 8
    #: GPU model per rack, cycled over the racks in order.
    models: tuple[str, ...] = ("H100",)


@dataclass(frozen=True)
class WorkloadSpec:
    name: str
    kind: str
    namespace: str = "default"
    container: str = ""
    nodes: int = 0
    gpus: int = 0
    instances: int = 0
    mig_profile: str = ""
    sites: tuple[str, ...] = ()
    model: str = ""
    start: float = 0.0
    end: float | None = None
    #: Mean inference load 0..1 (inference only).
    load: float = 0.4
    #: Share of 5-minute windows with a load burst (+0.35), inference only.
    burst: float = 0.08
    #: Several pods sharing each of the workload's GPUs (Kubernetes time-slicing or MPS): (pod-name prefix, share
    #: of the GPU's activity) per holder, each its own workload; shares below 1 leave the rest to processes of no
    #: known pod (published as the holder with empty labels). Empty: the GPUs are not shared.
    sharers: tuple[tuple[str, float], ...] = ()
    #: "time-slicing" (the holders' kernels take turns) or "mps" (they run at once: per-process utilization adds
    #: up to more than the GPU's).
    sharing: str = "time-slicing"


@dataclass(frozen=True)
class FillSpec:
    fractions: dict[str, float] = field(default_factory=dict)
    gang_nodes: int = 2
    namespace: str = "research"


@dataclass(frozen=True)
class FaultSpec:
    kind: str
    target: dict[str, Any]
    start: float
    end: float | None
    params: dict[str, float]
    where: str = ""  # "faults[3]", for error messages


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    duration: float
    seed: int
    start: float
    topology: TopologySpec
    workloads: tuple[WorkloadSpec, ...] = ()
    fill: FillSpec | None = None
    faults: tuple[FaultSpec, ...] = ()
    path: str = ""
    #: Ingestion mess the scenario's history is written with (``history.Mess`` keyword arguments:
    #: node gaps, exporter restarts, repeated samples, HA replicas); empty: clean telemetry.
    mess: dict[str, Any] = field(default_factory=dict)


# Parsing helpers ----------------------------------------------------------------------
class _Ctx:
    """Carries the file name into every error message."""

    def __init__(self, path: str):
        self.path = path

    def err(self, key: str, msg: str) -> ScenarioError:
        return ScenarioError(f"{self.path}: {key}: {msg}")

    def mapping(self, value: Any, key: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.err(key, f"expected a mapping, got {type(value).__name__}")
        unknown = sorted(set(value) - set(allowed))
        if unknown:
            raise self.err(f"{key}.{unknown[0]}" if key else unknown[0],
                           f"unknown key (allowed: {', '.join(allowed)})")
        return value

    def int_(self, value: Any, key: str, minimum: int = 0) -> int:
        if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
            raise self.err(key, f"expected an integer >= {minimum}, got {value!r}")
        return value

    def num(self, value: Any, key: str, lo: float = float("-inf"), hi: float = float("inf")) -> float:
        if isinstance(value, bool) or not isinstance(value, int | float) or not lo <= value <= hi:
            raise self.err(key, f"expected a number in [{lo}, {hi}], got {value!r}")
        return float(value)

    def str_(self, value: Any, key: str, choices: tuple[str, ...] | None = None) -> str:
        if not isinstance(value, str) or not value:
            raise self.err(key, f"expected a non-empty string, got {value!r}")
        if choices is not None and value not in choices:
            raise self.err(key, f"unknown value {value!r} (expected one of: {', '.join(choices)})")
        return value

    def dur(self, value: Any, key: str) -> float:
        try:
            d = parse_duration(value)
        except ValueError as e:
            raise self.err(key, str(e)) from None
        if d < 0:
            raise self.err(key, "must not be negative")
        return d

    def str_list(self, value: Any, key: str, choices: tuple[str, ...] | None = None) -> tuple[str, ...]:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not value:
            raise self.err(key, f"expected a string or a non-empty list of strings, got {value!r}")
        return tuple(self.str_(v, f"{key}[{i}]", choices) for i, v in enumerate(value))


def _topology(ctx: _Ctx, raw: Any) -> TopologySpec:
    raw = ctx.mapping(raw, "topology", ("sites", "racks_per_site", "nodes_per_rack", "gpus_per_node", "model"))
    sites: tuple[str, ...] = ("dc1",)
    if "sites" in raw:
        v = raw["sites"]
        if isinstance(v, int) and not isinstance(v, bool):
            sites = tuple(f"dc{i + 1}" for i in range(ctx.int_(v, "topology.sites", 1)))
        else:
            sites = ctx.str_list(v, "topology.sites")
            if len(set(sites)) != len(sites):
                raise ctx.err("topology.sites", "site names must be unique")
    gpus = ctx.int_(raw.get("gpus_per_node", 8), "topology.gpus_per_node", 1)
    if gpus > 8:
        raise ctx.err("topology.gpus_per_node", "at most 8 GPUs per node")
    return TopologySpec(
        sites=sites,
        racks_per_site=ctx.int_(raw.get("racks_per_site", 1), "topology.racks_per_site", 1),
        nodes_per_rack=ctx.int_(raw.get("nodes_per_rack", 2), "topology.nodes_per_rack", 1),
        gpus_per_node=gpus,
        models=ctx.str_list(raw.get("model", "H100"), "topology.model", GPU_MODELS),
    )


_WL_KEYS = ("name", "kind", "namespace", "container", "nodes", "gpus", "instances", "mig_profile", "sites",
            "model", "start", "end", "load", "burst", "sharers", "sharing")


def _workload(ctx: _Ctx, raw: Any, i: int, topo: TopologySpec) -> WorkloadSpec:
    key = f"workloads[{i}]"
    raw = ctx.mapping(raw, key, _WL_KEYS)
    for req in ("name", "kind"):
        if req not in raw:
            raise ctx.err(f"{key}.{req}", "required")
    kind = ctx.str_(raw["kind"], f"{key}.kind", WORKLOAD_KINDS)
    wl = WorkloadSpec(
        name=ctx.str_(raw["name"], f"{key}.name"),
        kind=kind,
        namespace=ctx.str_(raw.get("namespace", "default"), f"{key}.namespace"),
        container=ctx.str_(raw["container"], f"{key}.container") if "container" in raw else "",
        nodes=ctx.int_(raw.get("nodes", 0), f"{key}.nodes"),
        gpus=ctx.int_(raw.get("gpus", 0), f"{key}.gpus"),
        instances=ctx.int_(raw.get("instances", 0), f"{key}.instances"),
        mig_profile=ctx.str_(raw["mig_profile"], f"{key}.mig_profile", tuple(MIG_PROFILES))
        if "mig_profile" in raw else "",
        sites=ctx.str_list(raw["sites"], f"{key}.sites", topo.sites) if "sites" in raw else (),
        model=ctx.str_(raw["model"], f"{key}.model", GPU_MODELS) if "model" in raw else "",
        start=ctx.dur(raw.get("start", 0), f"{key}.start"),
        end=ctx.dur(raw["end"], f"{key}.end") if raw.get("end") is not None else None,
        load=ctx.num(raw.get("load", 0.4), f"{key}.load", 0.0, 1.0),
        burst=ctx.num(raw.get("burst", 0.08), f"{key}.burst", 0.0, 1.0),
        sharers=_sharers(ctx, raw.get("sharers"), f"{key}.sharers"),
        sharing=ctx.str_(raw.get("sharing", "time-slicing"), f"{key}.sharing", SHARING_MODES),
    )
    if wl.sharers and (wl.kind == "training" or wl.mig_profile):
        raise ctx.err(f"{key}.sharers", "only inference, memory_bound and idle_allocated workloads on whole GPUs share")
    sizes = [k for k in ("nodes", "gpus", "instances") if getattr(wl, k)]
    if len(sizes) != 1:
        raise ctx.err(key, "give exactly one of nodes, gpus, instances (> 0)")
    if (wl.instances > 0) != bool(wl.mig_profile):
        raise ctx.err(f"{key}.instances", "instances and mig_profile go together (MIG slices)")
    if wl.end is not None and wl.end <= wl.start:
        raise ctx.err(f"{key}.end", "must be after start")
    return wl


def _sharers(ctx: _Ctx, raw: Any, key: str) -> tuple[tuple[str, float], ...]:
    """``{pod-name prefix: share}``: shares in (0, 1] that add up to at most 1."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        raise ctx.err(key, f"expected a mapping of pod-name prefix to share, got {type(raw).__name__}")
    out = tuple((ctx.str_(k, f"{key} key"), ctx.num(v, f"{key}.{k}", 0.0, 1.0)) for k, v in raw.items())
    if len(out) < 2 or any(w <= 0 for _, w in out) or sum(w for _, w in out) > 1.0 + 1e-9:
        raise ctx.err(key, "give two or more holders with shares > 0 that add up to at most 1")
    return out


def _fill(ctx: _Ctx, raw: Any) -> FillSpec | None:
    if raw is None:
        return None
    raw = ctx.mapping(raw, "fill", (*FILL_KINDS, "gang_nodes", "namespace"))
    fr = {k: ctx.num(raw[k], f"fill.{k}", 0.0, 1.0) for k in FILL_KINDS if k in raw}
    if sum(fr.values()) > 1.0 + 1e-9:
        raise ctx.err("fill", "fractions add up to more than 1")
    return FillSpec(fr, ctx.int_(raw.get("gang_nodes", 2), "fill.gang_nodes", 1),
                    ctx.str_(raw.get("namespace", "research"), "fill.namespace"))


_TARGET_KEYS = ("job", "rank", "node_rank", "hostname", "gpu", "rack")


def _fault(ctx: _Ctx, raw: Any, i: int) -> FaultSpec:
    key = f"faults[{i}]"
    if not isinstance(raw, dict):
        raise ctx.err(key, "expected a mapping")
    if "kind" not in raw:
        raise ctx.err(f"{key}.kind", "required")
    kind = ctx.str_(raw["kind"], f"{key}.kind", FAULT_KINDS)
    defaults = FAULT_PARAMS[kind]
    raw = ctx.mapping(raw, key, ("kind", "target", "start", "end", *defaults))
    if "target" not in raw:
        raise ctx.err(f"{key}.target", "required")
    target = ctx.mapping(raw["target"], f"{key}.target", _TARGET_KEYS)
    if not target:
        raise ctx.err(f"{key}.target", "empty target")
    params = {k: ctx.num(raw.get(k, d), f"{key}.{k}", 0.0) for k, d in defaults.items()}
    if "slowdown" in params and params["slowdown"] > 4.0:
        raise ctx.err(f"{key}.slowdown", "at most 4 (the slowest clock is 40% of max)")
    if kind == "xid" and int(params["code"]) not in XID_CODES:
        raise ctx.err(f"{key}.code", f"unsupported XID {params['code']:g} (supported: {XID_CODES})")
    if not 0.0 <= params.get("extra_work", 0.0) <= 1.0:
        raise ctx.err(f"{key}.extra_work", "must be in [0, 1]: the share of the extra time that is extra work")
    if kind in PARTIAL_FAULT_PARAMS:
        _check_partial(ctx, key, params)
    if kind in STRAGGLER_FAULT_PARAMS:
        _check_straggler(ctx, key, kind, params)
    start = ctx.dur(raw.get("start", 0), f"{key}.start")
    end = ctx.dur(raw["end"], f"{key}.end") if raw.get("end") is not None else None
    if end is not None and end <= start:
        raise ctx.err(f"{key}.end", "must be after start")
    return FaultSpec(kind, dict(target), start, end, params, key)


def _check_partial(ctx: _Ctx, key: str, params: dict[str, float]) -> None:
    """Ranges of the partial-failure parameters (a growth that shrinks, a deficit of 100% are typos)."""
    if "peak_per_second" in params and params["peak_per_second"] < params["start_per_second"]:
        raise ctx.err(f"{key}.peak_per_second", "must be >= start_per_second (the rate grows)")
    if params.get("start_per_second", 1.0) <= 0:
        raise ctx.err(f"{key}.start_per_second", "must be > 0")
    if not params.get("deficit_fraction", 0.5) < 0.9:
        raise ctx.err(f"{key}.deficit_fraction", "must be < 0.9 (a GPU drawing nothing is a lost GPU)")
    if not params.get("spread", 0.0) < 1.0:
        raise ctx.err(f"{key}.spread", "must be < 1")


def _check_straggler(ctx: _Ctx, key: str, kind: str, params: dict[str, float]) -> None:
    """Ranges of the quiet-straggler parameters (spells that never end, a spread that is a straggler)."""
    if kind == "intermittent_straggler":
        if not 0.0 < params["duty"] < 1.0:
            raise ctx.err(f"{key}.duty", "must be in (0, 1): the share of each period spent slow")
        if params["period"] < 60.0:
            raise ctx.err(f"{key}.period", "must be >= 60 s (spells shorter than a scrape are not seen)")
        if params["slowdown"] <= 0.0:
            raise ctx.err(f"{key}.slowdown", "must be > 0")
    if kind == "chip_spread" and params["spread"] > 0.05:
        raise ctx.err(f"{key}.spread", "at most 0.05 (more slows the gang >= 5%: a straggler, not spread)")


_TOP_KEYS = ("name", "description", "seed", "duration", "start", "topology", "workloads", "fill", "faults", "mess")
_MESS_KEYS = ("node_gaps", "exporter_restarts", "repeat_every", "replicas", "slow_scrapes", "scrape_jitter_ms",
              "scrape_jobs", "pod_restarts")
_OVERRIDES = ("duration", "seed", "start", "sites", "racks", "racks_per_site", "nodes_per_rack", "gpus_per_node",
              "model")


def parse_scenario(data: Any, path: str = "<scenario>", **overrides: Any) -> Scenario:
    """Validate a parsed YAML document (and overrides) into a Scenario."""
    ctx = _Ctx(path)
    data = ctx.mapping(data, "", _TOP_KEYS)
    for req in ("name", "duration"):
        if req not in data:
            raise ctx.err(req, "required")
    for k in overrides:
        if k not in _OVERRIDES:
            raise ScenarioError(f"{path}: override {k!r}: unknown (allowed: {', '.join(_OVERRIDES)})")
    topo = _topology(ctx, data.get("topology"))
    o = {k: v for k, v in overrides.items() if v is not None}
    if "racks" in o:
        o["racks_per_site"] = o.pop("racks")
    if "sites" in o:
        v = o.pop("sites")
        sites = tuple(f"dc{i + 1}" for i in range(int(v))) if isinstance(v, int) else tuple(v)
        topo = replace(topo, sites=sites)
    for k in ("racks_per_site", "nodes_per_rack", "gpus_per_node"):
        if k in o:
            topo = replace(topo, **{k: ctx.int_(o.pop(k), f"override {k}", 1)})
    if "model" in o:
        topo = replace(topo, models=ctx.str_list(o.pop("model"), "override model", GPU_MODELS))
    duration = ctx.dur(o.get("duration", data["duration"]), "duration")
    if duration <= 0:
        raise ctx.err("duration", "must be > 0")
    try:
        start = parse_time(o.get("start", data.get("start", DEFAULT_START)))
    except ValueError as e:
        raise ctx.err("start", str(e)) from None
    workloads = data.get("workloads") or []
    faults = data.get("faults") or []
    if not isinstance(workloads, list):
        raise ctx.err("workloads", "expected a list")
    if not isinstance(faults, list):
        raise ctx.err("faults", "expected a list")
    wls = tuple(_workload(ctx, w, i, topo) for i, w in enumerate(workloads))
    names = [w.name for w in wls]
    dup = next((n for n in names if names.count(n) > 1), None)
    if dup:
        raise ctx.err("workloads", f"duplicate workload name {dup!r}")
    return Scenario(
        name=ctx.str_(data["name"], "name"),
        description=str(data.get("description", "")).strip(),
        duration=duration,
        seed=ctx.int_(o.get("seed", data.get("seed", 0)), "seed"),
        start=start,
        topology=topo,
        workloads=wls,
        fill=_fill(ctx, data.get("fill")),
        faults=tuple(_fault(ctx, f, i) for i, f in enumerate(faults)),
        path=path,
        mess=_mess(ctx, data.get("mess"), names),
    )


def _mess(ctx: _Ctx, raw: Any, names: Sequence[str] = ()) -> dict[str, Any]:
    """``mess:`` -> history.Mess keyword arguments, times in seconds after the start::

        mess:
          node_gaps: [{host: dc1-r1-n01, start: 40m, duration: 4m}]   # no sample from that node
          exporter_restarts: [{host: dc1-r1-n02, at: 1h}]            # counters restart, a scrape lost
          repeat_every: 7                                              # every 7th sample written twice
          replicas: [prom-a, prom-b]                                   # an HA pair, not deduplicated
          slow_scrapes: [{host: dc1-r2-n01, every: 4}]                 # scraped at every 4th sample time
          scrape_jitter_ms: 5                                          # each node at its own phase, +-5 ms
          scrape_jobs: [gpu-metrics, dcgm-exporter]                    # every exporter in two scrape jobs
          pod_restarts: [{job: train-a, at: 1h10m}]                    # the job's pods recreated, new names

    ``names``: the scenario's workloads, which ``pod_restarts`` must name.
    """
    m = ctx.mapping(raw, "mess", _MESS_KEYS)
    out: dict[str, Any] = {}
    for i, g in enumerate(m.get("node_gaps") or []):
        g = ctx.mapping(g, f"mess.node_gaps[{i}]", ("host", "start", "duration"))
        out.setdefault("node_gaps", []).append((ctx.str_(g.get("host"), f"mess.node_gaps[{i}].host"),
                                               ctx.dur(g.get("start"), f"mess.node_gaps[{i}].start"),
                                               ctx.dur(g.get("duration"), f"mess.node_gaps[{i}].duration")))
    for i, r in enumerate(m.get("exporter_restarts") or []):
        r = ctx.mapping(r, f"mess.exporter_restarts[{i}]", ("host", "at"))
        out.setdefault("exporter_restarts", []).append((ctx.str_(r.get("host"), f"mess.exporter_restarts[{i}].host"),
                                                       ctx.dur(r.get("at"), f"mess.exporter_restarts[{i}].at")))
    for i, r in enumerate(m.get("slow_scrapes") or []):
        r = ctx.mapping(r, f"mess.slow_scrapes[{i}]", ("host", "every"))
        out.setdefault("slow_scrapes", []).append((ctx.str_(r.get("host"), f"mess.slow_scrapes[{i}].host"),
                                                  ctx.int_(r.get("every"), f"mess.slow_scrapes[{i}].every", 2)))
    for i, r in enumerate(m.get("pod_restarts") or []):
        r = ctx.mapping(r, f"mess.pod_restarts[{i}]", ("job", "at"))
        job = ctx.str_(r.get("job"), f"mess.pod_restarts[{i}].job")
        if job not in names:
            raise ctx.err(f"mess.pod_restarts[{i}].job", f"no workload named {job!r}")
        out.setdefault("workload_restarts", []).append((job, ctx.dur(r.get("at"), f"mess.pod_restarts[{i}].at")))
    if "repeat_every" in m:
        out["repeat_every"] = ctx.int_(m["repeat_every"], "mess.repeat_every", 2)
    if "scrape_jitter_ms" in m:
        out["scrape_jitter_ms"] = ctx.num(m["scrape_jitter_ms"], "mess.scrape_jitter_ms", 0.0, 10_000.0)
    for key in ("replicas", "scrape_jobs"):
        if key in m:
            out[key] = ctx.str_list(m[key], f"mess.{key}")
    return {k: tuple(v) if isinstance(v, list) else v for k, v in out.items()}


def list_scenarios() -> list[str]:
    """Names of the bundled scenarios (fixtures/scenarios/*.yaml), sorted."""
    return sorted(p.stem for p in SCENARIO_DIR.glob("*.yaml"))


def scenario_path(name_or_path: str) -> Path:
    """A bundled scenario name or a path to a YAML file -> the file."""
    p = Path(name_or_path)
    if p.suffix in (".yaml", ".yml") or p.exists():
        if not p.is_file():
            raise ScenarioError(f"{name_or_path}: no such scenario file")
        return p
    candidate = SCENARIO_DIR / f"{name_or_path}.yaml"
    if not candidate.is_file():
        raise ScenarioError(f"unknown scenario {name_or_path!r}; known: {', '.join(list_scenarios())}")
    return candidate


def load_scenario(name_or_path: str, **overrides: Any) -> Scenario:
    """Load and validate a scenario; overrides (duration=, seed=, start=, sites=, racks=,
    nodes_per_rack=, gpus_per_node=, model=) rescale it, e.g. for benchmarks."""
    path = scenario_path(name_or_path)
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: invalid YAML: {e}") from None
    return parse_scenario(data, str(path), **overrides)
