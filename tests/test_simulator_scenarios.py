"""Scenario files: every bundled scenario loads, validation errors name file and key, ground truth."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.simulator import SCENARIO_DIR, Cluster, ScenarioError, list_scenarios, load_scenario
from exporter.simulator.scenario import DEFAULT_START, parse_time

REQUIRED = {
    "healthy-fleet", "mixed-fleet", "thermal-straggler", "input-starved-node", "power-capped", "pcie-downgrade",
    "nvlink-errors", "xid-faults", "rack-cooling", "wan-split", "mig-training", "idle-waste",
}
KINDS = {"straggler", "gpu_fault", "degraded_gpu", "thermal", "topology", "idle_masking", "idle_allocated"}


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


def test_healthy_fleet_has_no_ground_truth():
    assert Cluster(load_scenario("healthy-fleet")).ground_truth() == []


@pytest.mark.parametrize("name", sorted(REQUIRED - {"healthy-fleet"}))
def test_every_fault_and_waste_pattern_has_ground_truth(name):
    sc = load_scenario(name)
    c = Cluster(sc)
    gt = c.ground_truth()
    assert gt, name
    for rec in gt:
        assert set(rec) == {"kind", "hostname", "gpu", "job", "start", "end", "cause"}
        assert rec["kind"] in KINDS and rec["cause"]
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
    assert kinds("xid-faults") == {"gpu_fault", "degraded_gpu"}
    assert {"thermal", "straggler", "gpu_fault", "degraded_gpu", "idle_masking", "idle_allocated"} <= kinds(
        "mixed-fleet")
    starved = [r for r in Cluster(load_scenario("input-starved-node")).ground_truth()]
    assert starved[0]["gpu"] is None and starved[0]["hostname"] == "dc1-r1-n03" and starved[0]["job"]
