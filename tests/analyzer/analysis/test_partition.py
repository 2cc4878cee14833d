"""The one GPU-hour partition: recoverable waste apart from the normal headroom of healthy work.

Judged on the demo fleet's ground truth (the simulator knows which workloads are healthy training
and inference, which GPUs are idle, memory-bound, throttled or waiting for a straggler), on
hand-built rows for each part, and on the site config that names workload classes.
"""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.analysis.partition import (
    NORMAL,
    PARTS,
    WASTE,
    attach,
    flagged_rows,
    row_classes,
    row_parts,
)
from analyzer.analysis.scores import compute_scores, fleet_summary
from analyzer.data.simulated import fleet_from_cluster
from analyzer.detectors import run_detectors
from analyzer.findings import IDLE_MASKING
from analyzer.finops.catalog import default_catalog
from analyzer.finops.costs import cost_report
from analyzer.site import UNCLASSIFIED, default_site, load_site, parse_site
from exporter.simulator import Cluster, load_scenario
from tests import fleets
from truegpu.cli import main as cli_main

START = 1_767_571_200.0
MAX_CLK = 1.98e9


@pytest.fixture(scope="module")
def demo():
    cluster = Cluster(load_scenario("mixed-fleet"))
    fleet = fleet_from_cluster(cluster, step=60.0)
    scores = compute_scores(fleet)
    findings = run_detectors(fleet)
    parts, alloc, _ = row_parts(fleet, scores, findings)
    return cluster, fleet, scores, findings, parts, alloc


def _share(parts: dict, rows: np.ndarray, names: tuple[str, ...]) -> float:
    """Share of the rows' hours (all rows weigh the same here: whole GPUs, one step) in ``names``."""
    assert rows.any()
    return float(sum(parts[n][rows].sum() for n in names) / rows.sum())


def _truth_rows(fleet, truth: dict) -> np.ndarray:
    fr = fleet.frame
    ts = fr["timestamp"].to_numpy()
    rows = (fr["hostname"].astype(str) == truth["hostname"]).to_numpy() & (ts >= truth["start"]) & (ts < truth["end"])
    if truth["gpu"] is not None:
        rows &= (fr["gpu"].astype(str) == truth["gpu"]).to_numpy()
    return rows


def test_parts_add_up_to_every_row(demo):
    parts = demo[4]
    total = sum(parts[p] for p in PARTS)
    np.testing.assert_allclose(total, 1.0, atol=1e-9)
    assert all((parts[p] >= -1e-12).all() for p in PARTS)
    assert set(WASTE) | set(NORMAL) | {"effective", "unclassified", "shared_unattributed", "unknown",
                                       "unallocated"} == set(PARTS)


def test_demo_healthy_training_and_inference_gap_is_headroom_not_waste(demo):
    cluster, fleet, _, _, parts, _ = demo
    fr = fleet.frame
    touched = np.zeros(len(fr), bool)
    for t in cluster.ground_truth():
        touched |= _truth_rows(fleet, t)
        if t["kind"] == "straggler":  # the whole gang waits while a straggler holds it back
            ts = fr["timestamp"].to_numpy()
            touched |= (fr["job"].astype(str) == t["job"]).to_numpy() & (ts >= t["start"]) & (ts < t["end"])
    kinds = {w.name: w.kind for w in cluster.scenario.workloads}
    job = fr["job"].astype(str).to_numpy()
    for kind in ("training", "inference"):
        healthy = np.isin(job, [j for j, k in kinds.items() if k == kind]) & ~touched & (parts["unknown"] < 1e-9)
        assert _share(parts, healthy, WASTE) < 0.02, kind  # no recoverable waste in healthy work
        assert _share(parts, healthy, ("headroom",)) > 0.3, kind  # its gap is the class's normal headroom
        assert _share(parts, healthy, ("unclassified",)) == 0.0, kind


def test_demo_waste_sits_where_the_ground_truth_puts_it(demo):
    cluster, fleet, _, _, parts, _ = demo
    fr = fleet.frame
    by_kind: dict[str, list[dict]] = {}
    for t in cluster.ground_truth():
        by_kind.setdefault(t["kind"], []).append(t)
    # the memory-bound job: its masked hours are recoverable waste
    masked = np.any([_truth_rows(fleet, t) for t in by_kind["idle_masking"]], axis=0)
    assert _share(parts, masked, ("masked",)) > 0.6
    # the idle notebooks: all of it
    idle = np.any([_truth_rows(fleet, t) for t in by_kind["idle_allocated"]], axis=0)
    assert _share(parts, idle, ("idle_allocated",)) > 0.95
    ts = fr["timestamp"].to_numpy()
    for t in by_kind["straggler"]:
        peers = ((fr["job"].astype(str) == t["job"]).to_numpy() & (ts >= t["start"]) & (ts < t["end"])
                 & ~_truth_rows(fleet, t))
        assert _share(parts, peers, ("straggler",)) > 0.1, t["job"]  # the straggler's peers wait
    hot = _truth_rows(fleet, by_kind["thermal"][0])
    assert _share(parts, hot, ("throttled",)) > 0.2  # the throttled GPU's lost clocks
    assert _share(parts, hot, ("power_capped",)) == 0.0  # heat is recoverable, not site policy


def test_a_sub_window_claims_only_its_share_of_a_stragglers_lost_hours(demo):
    """A report over part of a straggler's span (the API's last hour, a rollup piece) gets the part of its lost
    GPU-hours that falls inside, not all of them: the windows of a day add up to the day."""
    _, fleet, _, findings, _, _ = demo
    f = max((f for f in findings if f.kind == "straggler" and f.end is not None), key=lambda f: f.end - f.start)
    whole = row_parts(fleet, compute_scores(fleet), [f])[2]
    mid = (f.start + f.end) / 2
    halves = [fleet.between(fleet.start, mid), fleet.between(mid, fleet.end)]
    claimed = [row_parts(h, compute_scores(h), [f])[2] for h in halves]
    assert whole == pytest.approx(f.evidence["lost_gpu_hours"]) and whole > 0
    assert claimed == pytest.approx([whole / 2, whole / 2], rel=0.02)


def test_masked_comes_only_from_what_the_idle_masking_detector_flags(demo):
    _, fleet, scores, findings, parts, _ = demo
    flagged = flagged_rows(fleet, findings, IDLE_MASKING)
    assert flagged.any() and (parts["masked"][~flagged] == 0).all()
    assert (parts["masked"][flagged] > 0).mean() > 0.95
    without = [f for f in findings if f.kind != IDLE_MASKING]
    again, _, _ = row_parts(fleet, scores, without)
    assert (again["masked"] == 0).all()
    # the cost report uses the same rows: its masked hours are the partition's
    report = cost_report(fleet, scores, findings, default_catalog())
    w = fleet.frame["gpu_share"].to_numpy() * fleet.step / 3600
    assert report.totals["masked_gpu_hours"] == pytest.approx(float((parts["masked"] * w).sum()))


def test_summary_and_job_table_carry_the_split(demo):
    _, fleet, scores, findings, parts, _ = demo
    attach(scores, fleet, findings)
    s = fleet_summary(scores)
    w = fleet.frame["gpu_share"].to_numpy() * fleet.step / 3600
    assert s["waste_gpu_hours"] == pytest.approx(float(sum((parts[p] * w).sum() for p in WASTE)))
    assert s["waste_gpu_hours"] + s["normal_gpu_hours"] + s["unclassified_gpu_hours"] == pytest.approx(
        s["unused_gpu_hours"])
    # healthy LLM training is not the money pit: far less waste than headroom in the llm namespace
    ns = scores.partition.namespace
    assert ns.loc["llm", "waste_gpu_hours"] < 0.5 * ns.loc["llm", "normal_gpu_hours"]
    assert ns.loc["notebooks", "waste_gpu_hours"] == pytest.approx(8.0)


# -- hand-built rows ---------------------------------------------------------------------------------

def _fleet(devices: list[dict]):
    return fleets.make_fleet(devices, 1, 3600.0, START, model="NVIDIA H100 80GB HBM3")


def _gpu(util=1.0, sm=0.5, clk=MAX_CLK, **kw) -> dict:
    return {"gpu_util": util, "sm_active": sm, "sm_clock": clk, "sm_clock_max": MAX_CLK, "gr_active": util, **kw}


def _parts_of(devices: list[dict], site=None) -> dict[str, np.ndarray]:
    fleet = _fleet(devices)
    parts, _, _ = row_parts(fleet, compute_scores(fleet), [], site)
    return parts


def test_class_floors_split_headroom_from_underuse():
    rows = [_gpu(sm=0.2, util=0.6, namespace="x", job="llm-train"),    # training, below its 0.45 floor
            _gpu(sm=0.6, util=0.95, namespace="x", job="llm-train"),   # training, healthy
            _gpu(sm=0.2, util=0.6, namespace="web", job="chat-serve"),  # inference: 0.2 is healthy
            _gpu(sm=0.2, util=0.6, namespace="x", job="mystery")]       # no known class
    p = _parts_of(rows)
    assert p["underused"][0] == pytest.approx(0.45 - 0.2) and p["headroom"][0] == pytest.approx(0.55)
    assert p["underused"][1] == 0.0 and p["headroom"][1] == pytest.approx(0.4)
    assert p["underused"][2] == 0.0 and p["headroom"][2] == pytest.approx(0.8)
    # unknown class: the gap is unclassified, never silently headroom or waste
    assert p["unclassified"][3] == pytest.approx(0.8)
    assert p["headroom"][3] == 0.0 and sum(p[w][3] for w in WASTE) == 0.0
    # a site config names the class (and a per-model floor): the same row becomes headroom + underuse
    site = parse_site({"workload_classes": [
        {"name": "batch", "match": {"workload": "myst*"}, "floor": {"default": 0.1, "*H100*": 0.3}}]})
    q = _parts_of(rows, site)
    assert q["underused"][3] == pytest.approx(0.1) and q["headroom"][3] == pytest.approx(0.7)
    assert q["unclassified"][3] == 0.0


def test_power_caps_bandwidth_bound_and_heat():
    rows = [_gpu(sm=0.8, clk=MAX_CLK / 2, power_throttle=1.0, thermal_throttle=0.0, namespace="x", job="a-train"),
            _gpu(sm=0.8, clk=MAX_CLK / 2, power_throttle=0.0, thermal_throttle=1.0, namespace="x", job="a-train"),
            _gpu(sm=0.3, util=0.8, dram_active=0.9, namespace="x", job="decode-serve")]
    p = _parts_of(rows)
    assert p["power_capped"][0] == pytest.approx(0.4) and p["throttled"][0] == 0.0  # site policy
    assert p["throttled"][1] == pytest.approx(0.4) and p["power_capped"][1] == 0.0  # heat: recoverable
    assert p["bandwidth_bound"][2] == pytest.approx(0.7) and p["headroom"][2] == 0.0  # real work at the ceiling


def test_row_classes_first_match_in_order_and_built_ins():
    fleet = _fleet([_gpu(namespace="research-a", job="x"), _gpu(namespace="serving", job="y"),
                    _gpu(namespace="ops", job="z"), _gpu()])
    names, floors = row_classes(fleet, default_site())
    assert list(names) == ["training", "inference", UNCLASSIFIED, UNCLASSIFIED]
    assert floors[0] == 0.45 and floors[1] == 0.10 and np.isnan(floors[2:]).all()
    site = parse_site({"workload_classes": [{"name": "training", "match": {"namespace": ["ops"]}, "floor": 0.5}]})
    names, floors = row_classes(fleet, site)  # replaces the built-in training class
    assert list(names) == [UNCLASSIFIED, "inference", "training", UNCLASSIFIED] and floors[2] == 0.5


@pytest.mark.parametrize(("data", "message"), [
    ({"workload_clases": []}, r"unknown section\(s\) \['workload_clases'\]"),
    ({"workload_classes": {}}, "must be a list"),
    ({"workload_classes": [{"name": "a", "match": {"workload": "x"}, "floor": 1.5}]},
     r"workload_classes\[0\] \(a\).*0\.\.1"),
    ({"workload_classes": [{"name": "a", "match": {"host": "x"}, "floor": 0.5}]}, "match on"),
    ({"workload_classes": [{"name": "a", "match": {"workload": []}, "floor": 0.5}]}, "glob"),
    ({"workload_classes": [{"name": "a", "match": {"workload": "x"}, "floor": {"*": 0.5}}]}, "'default'"),
    ({"workload_classes": [{"name": UNCLASSIFIED, "match": {"workload": "x"}, "floor": 0.5}]}, "other than"),
    ({"workload_classes": [{"name": "a", "match": {"workload": "x"}, "floor": 0.5}] * 2}, "repeat"),
])
def test_site_config_errors_name_the_entry(data, message):
    with pytest.raises(ValueError, match=message):
        parse_site(data, "site.yaml")


@pytest.mark.parametrize(("alerting", "message"), [
    ("x", r"alerting: expected a mapping"),
    ({"exporter_jobs": "a"}, r"unknown key\(s\) \['exporter_jobs'\]"),
    ({"receivers": {"a": "ftp://x"}}, r"alerting.receivers.a: a webhook URL starts with http"),
    ({"receivers": {"a": "http://x"}, "owners": [{"namespace": "(", "receiver": "a"}]},
     r"owners\[0\]: namespace is not a valid regular expression"),
    ({"owners": [{"namespace": "x", "receiver": "b"}]}, r"receiver 'b' has no webhook URL"),
    ({"owners": [{"namespace": "x"}]}, r"owners\[0\]: expected"),
])
def test_site_alerting_errors_name_the_entry(alerting, message):
    with pytest.raises(ValueError, match=message):
        parse_site({"alerting": alerting}, "site.yaml")


def test_site_file_and_cli(tmp_path, capsys):
    with pytest.raises(ValueError, match="cannot read site config"):
        load_site(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("workload_classes: [\n")
    with pytest.raises(ValueError, match="not valid YAML"):
        load_site(bad)
    good = tmp_path / "site.yaml"
    good.write_text("workload_classes:\n  - {name: batch, match: {namespace: batch}, floor: 0.3}\n")
    assert load_site(good).class_names() == ["batch", "training", "inference"]
    assert cli_main(["demo", "--quiet", "--out", str(tmp_path / "r"), "--site", str(bad)]) == 2
    assert "site config" in capsys.readouterr().err
    # the memory-bound batch job, once classified, shows its leftover gap as headroom/underuse, not unclassified
    assert cli_main(["demo", "--quiet", "--json", "--out", str(tmp_path / "r"), "--site", str(good)]) == 0
    import json

    summary = json.loads(capsys.readouterr().out)["summary"]
    assert summary["unclassified_gpu_hours"] == pytest.approx(0.0, abs=0.05)
    assert summary["parts"]["masked"] > 10
