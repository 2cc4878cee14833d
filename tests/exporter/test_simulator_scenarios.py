"""Scenario files: every bundled scenario loads, validation errors name file and key, ground truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.simulator import SCENARIO_DIR, Cluster, ScenarioError, list_scenarios, load_scenario
from exporter.simulator.faults import STRAGGLER_MIN_SLOWDOWN
from exporter.simulator.scenario import DEFAULT_START, parse_time

REQUIRED = {
    "healthy-fleet", "mixed-fleet", "thermal-straggler", "input-starved-node", "power-capped", "pcie-downgrade",
    "nvlink-errors", "xid-faults", "rack-cooling", "wan-split", "mig-training", "idle-waste",
    "straggler-slowdowns", "multi-fault", "noisy-neighbours", "healthy-long", "degraded-gpus", "topology-mistakes",
    "healthy-heterogeneous",
}
#: Scenarios without any ground truth (healthy; every finding on them is false).
HEALTHY = {"healthy-fleet", "noisy-neighbours", "healthy-long", "healthy-heterogeneous"}
#: The detectors' taxonomy: kind -> the attribution tokens its records may carry.
ATTRIBUTION = {
    "straggler": {"thermal", "power", "pcie", "nvlink", "input", "unknown"},
    "gpu_fault": {"xid48", "xid63", "xid64", "xid79", "xid94", "xid95", "pcie_downgrade", "nvlink"},
    "degraded_gpu": {"power_cap", "thermal_degradation", "power_inefficiency", "hbm_hot"},
    "thermal": {"gpu_cooling", "rack_cooling"},
    "topology": {"wan", "mig", "numa", "no_nvlink"},
    "idle_masking": {"memory_bound"},
    "idle_allocated": {"unused_allocation"},
}
KINDS = set(ATTRIBUTION)


def test_required_scenarios_exist_and_load():
    assert SCENARIO_DIR.is_dir()
    assert set(list_scenarios()) >= REQUIRED
    for name in list_scenarios():
        sc = load_scenario(name)
        assert sc.name == name and sc.description and sc.duration > 0
        assert sc.start == parse_time(DEFAULT_START)
        c = Cluster(sc)
        assert 16 <= len(c.gpus) <= 128, name


def test_load_by_path_and_overrides():
    sc = load_scenario(str(SCENARIO_DIR / "wan-split.yaml"), duration="30m", seed=5, start="2026-02-01T00:00:00Z")
    assert sc.duration == 1800 and sc.seed == 5 and sc.start == parse_time("2026-02-01T00:00:00+00:00")
    assert Cluster(sc, start=1000.0).start == 1000.0
    with pytest.raises(ScenarioError, match="override 'bogus'"):
        load_scenario("wan-split", bogus=1)


def test_unknown_scenario_lists_known_ones():
    with pytest.raises(ScenarioError, match="healthy-fleet"):
        load_scenario("no-such-scenario")


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.yaml"
    p.write_text(text)
    return p


BASE = "name: bad\nduration: 1h\ntopology: {nodes_per_rack: 2}\n"


@pytest.mark.parametrize(("body", "key"), [
    ("workloads:\n  - {name: a, kind: training, nodes: 1}\nfaults:\n  - {kind: meltdown, target: {job: a}}\n",
     "faults[0].kind"),
    ("workloads:\n  - {name: a, kind: training, nodes: 1}\nfaults:\n  - {kind: xid, code: 13, target: {job: a}}\n",
     "faults[0].code"),
    ("workloads:\n  - {name: a, kind: training, nodes: 1, colour: red}\n", "workloads[0].colour"),
    ("workloads:\n  - {name: a, kind: training, nodes: 3}\n", "workloads.a"),
    ("workloads:\n  - {name: a, kind: training, nodes: 1}\nfaults:\n"
     "  - {kind: thermal_straggler, target: {job: a, rank: 99}}\n", "faults[0].target"),
    ("workloads:\n  - {name: a, kind: training, nodes: 1, start: soon}\n", "workloads[0].start"),
    ("fill: {training: 0.8, inference: 0.5}\n", "fill"),
    ("colour: red\n", "colour"),
    ("mess: {node_gaps: [{host: n1, start: 10m}]}\n", "mess.node_gaps[0].duration"),
    ("mess: {repeat_every: 1}\n", "mess.repeat_every"),
    ("mess: {slow_scrapes: [{host: n1, every: 1}]}\n", "mess.slow_scrapes[0].every"),
    ("mess: {jitter: 3}\n", "mess.jitter"),
    ("workloads:\n  - {name: a, kind: training, nodes: 1}\nmess: {pod_restarts: [{job: b, at: 10m}]}\n",
     "mess.pod_restarts[0].job"),
])
def test_bad_scenarios_name_file_and_key(tmp_path, body, key):
    p = _write(tmp_path, BASE + body)
    with pytest.raises(ScenarioError) as e:
        Cluster(load_scenario(str(p)))
    msg = str(e.value)
    assert str(p) in msg and key in msg, msg


def test_bad_topology_and_duration(tmp_path):
    p = _write(tmp_path, "name: bad\nduration: forever\n")
    with pytest.raises(ScenarioError, match=r"bad\.yaml: duration"):
        load_scenario(str(p))
    p = _write(tmp_path, "name: bad\nduration: 1h\ntopology: {model: V100}\n")
    with pytest.raises(ScenarioError, match=r"topology\.model\[0\]"):
        load_scenario(str(p))
    p = _write(tmp_path, "name: bad\nduration: 1h\nworkloads: [\n")
    with pytest.raises(ScenarioError, match="invalid YAML"):
        load_scenario(str(p))


@pytest.mark.parametrize("name", sorted(HEALTHY))
def test_healthy_scenarios_have_no_ground_truth(name):
    assert Cluster(load_scenario(name)).ground_truth() == []


def test_healthy_long_is_a_day_of_48_gpus():
    c = Cluster(load_scenario("healthy-long"))
    assert c.duration == 24 * 3600 and len(c.gpus) == 48


def test_healthy_heterogeneous_is_mixed_messy_and_small():
    """Three models, jobs that start and stop, start-up phases and chip spread, and telemetry mess: a realistic
    healthy fleet for the false-finding rate, small enough (72 GPUs x 5 h) to run many seeds."""
    sc = load_scenario("healthy-heterogeneous")
    c = Cluster(sc)
    assert set(c.layout.node_model) == {"H100", "A100", "L40S"} and len(c.gpus) == 72 and c.duration == 5 * 3600
    assert {f.kind for f in sc.faults} == {"startup", "chip_spread", "power_spread"}
    assert any(w.start > 0 for w in sc.workloads) and any(w.end is not None for w in sc.workloads)
    assert set(sc.mess) == {"node_gaps", "exporter_restarts", "repeat_every", "replicas", "slow_scrapes",
                            "scrape_jitter_ms"}
    assert all(d <= 180 for _h, _s, d in sc.mess["node_gaps"])  # a few scrape intervals, not an outage


@pytest.mark.parametrize("name", sorted(REQUIRED - HEALTHY))
def test_every_fault_and_waste_pattern_has_ground_truth(name):
    sc = load_scenario(name)
    c = Cluster(sc)
    gt = c.ground_truth()
    assert gt, name
    for rec in gt:
        size = {"slowdown"} if rec["kind"] == "straggler" else set()  # what it costs its gang, a fraction
        assert set(rec) == {"kind", "hostname", "gpu", "job", "start", "end", "cause", "attribution", *size}
        assert not size or rec["slowdown"] >= STRAGGLER_MIN_SLOWDOWN, rec
        assert rec["kind"] in KINDS and rec["cause"]
        assert rec["attribution"] in ATTRIBUTION[rec["kind"]], rec
        assert c.start <= rec["start"] < rec["end"] <= c.start + c.duration
        assert rec["hostname"] in c.layout.nodes
        assert rec["gpu"] is None or rec["gpu"] in set(c.gpus.gpu[c.gpus.hostname == rec["hostname"]])
    for f in c.faults:  # each injected fault is labelled at its place and time
        assert any(r["start"] == c.start + f.start and r["hostname"] in f.hostname.split(",") for r in gt), f
    for j in c.jobs:
        if j.kind in ("memory_bound", "idle_allocated"):
            kind = "idle_masking" if j.kind == "memory_bound" else "idle_allocated"
            assert any(r["kind"] == kind and r["job"] == j.name for r in gt)


def test_expected_kinds_per_scenario():
    def kinds(name: str) -> set[str]:
        return {r["kind"] for r in Cluster(load_scenario(name)).ground_truth()}

    assert kinds("thermal-straggler") == {"thermal", "straggler"}
    assert kinds("input-starved-node") == {"straggler"}
    assert kinds("wan-split") == {"topology"}
    assert kinds("idle-waste") == {"idle_masking", "idle_allocated"}
    assert kinds("xid-faults") == {"gpu_fault"}  # XID 63 too: a hard signal
    assert kinds("pcie-downgrade") == {"gpu_fault"} and kinds("nvlink-errors") == {"gpu_fault"}
    assert kinds("power-capped") == {"degraded_gpu", "straggler"}
    assert {"thermal", "straggler", "gpu_fault", "idle_masking", "idle_allocated"} <= kinds("mixed-fleet")
    assert kinds("degraded-gpus") == {"degraded_gpu", "idle_masking"}
    assert kinds("topology-mistakes") == {"topology"}
    assert kinds("multi-fault") == {"thermal", "straggler", "gpu_fault", "degraded_gpu"}
    starved = [r for r in Cluster(load_scenario("input-starved-node")).ground_truth()]
    assert starved[0]["gpu"] is None and starved[0]["hostname"] == "dc1-r1-n03" and starved[0]["job"]


def _truth(name: str) -> list[dict]:
    return Cluster(load_scenario(name)).ground_truth()


def test_attributions_per_scenario():
    def attr(name: str, kind: str) -> list[tuple[str | None, str | None, str]]:
        return sorted((r["hostname"], r["gpu"], r["attribution"]) for r in _truth(name) if r["kind"] == kind)

    assert {a for *_, a in attr("xid-faults", "gpu_fault")} == {"xid48", "xid63", "xid64", "xid79", "xid94", "xid95"}
    assert attr("nvlink-errors", "gpu_fault") == [("dc1-r1-n01", "3", "nvlink")]
    assert attr("pcie-downgrade", "gpu_fault") == [("dc1-r1-n02", "2", "pcie_downgrade")]
    assert attr("power-capped", "straggler") == [("dc1-r1-n02", "1", "power")]
    assert attr("input-starved-node", "straggler") == [("dc1-r1-n03", None, "input")]
    assert attr("thermal-straggler", "thermal") == [("dc1-r1-n01", "5", "gpu_cooling")]
    assert {a for *_, a in attr("wan-split", "topology")} == {"wan"}
    assert attr("mig-training", "topology") == [("dc1-r1-n01", None, "mig")]
    assert attr("topology-mistakes", "topology") == [
        ("dc1-r1-n01", None, "numa"), ("dc1-r2-n01", None, "no_nvlink"), ("dc1-r3-n01", None, "mig")]
    assert {(r["job"], r["attribution"]) for r in _truth("topology-mistakes")} == {
        ("numa-split", "numa"), ("pcie-gang", "no_nvlink"), ("mig-train", "mig")}
    # 2 of 18 NVLink links down costs ~1% of a step: a gpu_fault, not a straggler
    assert attr("mixed-fleet", "straggler") == [("dc1-r1-n01", "5", "thermal"), ("dc2-r1-n02", None, "input")]
    # rack cooling: thermal per node; a gang half in the hot rack gets a node-level straggler once it throttles
    rc = _truth("rack-cooling")
    assert {(r["hostname"], r["attribution"]) for r in rc if r["kind"] == "thermal"} == {
        (f"dc1-r1-n0{i}", "rack_cooling") for i in (1, 2, 3)}
    (st,) = [r for r in rc if r["kind"] == "straggler"]
    assert (st["hostname"], st["gpu"], st["job"], st["attribution"]) == ("dc1-r1-n03", None, "train-b", "thermal")
    fault_start = next(r["start"] for r in rc if r["kind"] == "thermal")
    assert fault_start + 10 * 60 < st["start"] < fault_start + 60 * 60  # from the throttle onset, not the fault start


def test_straggler_slowdowns_and_multi_fault_truth():
    gt = _truth("straggler-slowdowns")
    st = sorted((r["job"], r["attribution"]) for r in gt if r["kind"] == "straggler")
    assert st == [("train-10", "thermal"), ("train-20", "power"), ("train-50", "thermal")]
    assert {r["job"] for r in gt if r["kind"] == "thermal"} == {"train-10", "train-50"}
    assert [r["job"] for r in gt if r["kind"] == "degraded_gpu"] == ["train-20"]
    mf = _truth("multi-fault")
    on_n01 = {(r["kind"], r["attribution"]) for r in mf if r["hostname"] == "dc1-r1-n01"}
    assert on_n01 == {("thermal", "gpu_cooling"), ("straggler", "thermal"), ("degraded_gpu", "thermal_degradation")}
    assert {r["attribution"] for r in mf if r["kind"] == "gpu_fault"} == {"xid94"}
    # the whole gangs inside the hot rack are slowed together: a cooling problem, not stragglers
    assert {r["hostname"] for r in mf if r["kind"] == "thermal" and r["gpu"] is None} == {
        "dc1-r2-n01", "dc1-r2-n02", "dc1-r2-n03"}
    assert [r["job"] for r in mf if r["kind"] == "straggler"] == ["train-a"]


def test_mess_section_is_history_mess_keywords():
    from exporter.simulator.history import Mess

    sc = load_scenario("messy-telemetry")
    mess = Mess(**sc.mess)
    assert mess.node_gaps[0] == ("dc1-r1-n01", 2700.0, 240.0) and mess.exporter_restarts == (("dc1-r1-n02", 4200.0),)
    assert mess.repeat_every == 7 and mess.replicas == ("prom-a", "prom-b")
    assert mess.slow_scrapes == (("dc1-r1-n01", 2),)
    assert load_scenario("idle-waste").mess == {}
    # A job's pods recreated under new names: the scenario names the job (its pods' names are generated).
    assert Mess(**load_scenario("restart-mess").mess).workload_restarts == (("train-h", 4800.0), ("embed-a", 3600.0))
