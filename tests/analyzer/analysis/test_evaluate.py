"""Matching findings to ground truth, and the quality bar of the idle detectors on every scenario."""

from __future__ import annotations

import dataclasses

import pytest

from analyzer.analysis.evaluate import (
    DEFAULT_KINDS,
    evaluate,
    evaluate_scenarios,
    fleet_gpu_hours,
    format_table,
    matches,
    pooled,
)
from analyzer.findings import GPU_FAULT, IDLE_ALLOCATED, IDLE_MASKING, STRAGGLER, THERMAL, Finding
from exporter.simulator.scenario import list_scenarios
from tests.fleets import T0, timeline

H = 3600.0
WINDOW = (T0, T0 + 4 * H)


def finding(kind: str = IDLE_MASKING, host: str = "n1", gpu: int | None = 0, start: float = 0.0,
            end: float | None = H, job: str | None = "j", instance: str | None = None) -> Finding:
    return Finding(kind=kind, severity="info", summary="s", start=T0 + start,
                   end=None if end is None else T0 + end, score=0.5, hostname=host, gpu=gpu, job=job,
                   gpu_instance=instance)


def truth(kind: str = IDLE_MASKING, host: str | None = "n1", gpu: str | None = "0", start: float = 0.0,
          end: float | None = H, job: str | None = "j") -> dict:
    return {"kind": kind, "hostname": host, "gpu": gpu, "job": job, "start": T0 + start,
            "end": None if end is None else T0 + end, "cause": "c"}


def scores(findings: list[Finding], truths: list[dict], kinds: tuple[str, ...] = (IDLE_MASKING,)) -> dict:
    return evaluate(findings, truths, kinds, window=WINDOW)["kinds"]


# matching rules ----------------------------------------------------------------------------
def test_same_kind_entity_and_overlap_match() -> None:
    assert matches(finding(), truth(), WINDOW[1])
    assert not matches(finding(kind=IDLE_ALLOCATED), truth(), WINDOW[1])
    assert not matches(finding(gpu=1), truth(), WINDOW[1])
    assert not matches(finding(host="n2"), truth(), WINDOW[1])
    assert not matches(finding(start=H, end=2 * H), truth(end=H), WINDOW[1])  # touching is not overlapping
    assert matches(finding(start=H - 60, end=2 * H), truth(end=H), WINDOW[1])


def test_open_ends_extend_to_the_window_end() -> None:
    assert matches(finding(start=3 * H, end=None), truth(start=0, end=None), WINDOW[1])
    assert matches(finding(start=3 * H, end=3.5 * H), truth(start=0, end=None), WINDOW[1])
    assert matches(finding(start=0, end=None), truth(start=3 * H, end=3.5 * H), WINDOW[1])
    assert not matches(finding(start=0, end=H), truth(start=3 * H, end=None), WINDOW[1])


def test_node_level_and_job_level_truth() -> None:
    node = truth(kind=THERMAL, gpu=None, job=None)
    assert matches(finding(kind=THERMAL, gpu=5), node, WINDOW[1])
    assert matches(finding(kind=THERMAL, gpu=None), node, WINDOW[1])
    assert not matches(finding(kind=THERMAL, host="n2"), node, WINDOW[1])
    job = truth(kind=STRAGGLER, host=None, gpu=None, job="train")
    assert matches(finding(kind=STRAGGLER, host="anywhere", job="train"), job, WINDOW[1])
    assert not matches(finding(kind=STRAGGLER, job="other"), job, WINDOW[1])


def test_precision_recall_f1_and_onset() -> None:
    truths = [truth(gpu="0"), truth(gpu="1", start=H, end=2 * H), truth(gpu="2")]
    found = [finding(gpu=0, start=120), finding(gpu=1, start=H + 300, end=2 * H), finding(gpu=3)]
    k = scores(found, truths)[IDLE_MASKING]
    assert (k["tp"], k["fp"], k["detected"], k["missed"]) == (2, 1, 2, 1)
    assert k["precision"] == pytest.approx(2 / 3) and k["recall"] == pytest.approx(2 / 3)
    assert k["f1"] == pytest.approx(2 / 3)
    assert k["onset_median_s"] == pytest.approx(210) and k["onset_max_s"] == pytest.approx(300)
    assert k["missed_truth"][0]["gpu"] == "2" and k["false_findings"][0]["gpu"] == 3
    assert k["coverage_mean"] == pytest.approx(((H - 120) / H + (H - 300) / H) / 2)


def test_a_problem_the_input_cannot_show_is_unobservable_not_missed() -> None:
    """An ECC storm where no ECC counter is collected is counted apart with the input's reason; the same
    storm where the counter is collected, or a truth with no evidence rule, is missed as before."""
    fleet = timeline([{"hostname": "n1", "gpu": "0", "sm_active": 0.5}], steps=4 * 60)
    storm = {**truth(kind=GPU_FAULT), "attribution": "ecc_storm"}
    other = {**truth(kind=GPU_FAULT, gpu="1"), "attribution": "xid79"}
    blind = dataclasses.replace(fleet, missing={"ecc_correctable_rate": "ecc_correctable_rate unknown: not collected"})
    k = evaluate([], [storm, other], (GPU_FAULT,), blind)["kinds"][GPU_FAULT]
    assert (k["truth"], k["missed"], k["unobservable"], k["recall"]) == (1, 1, 1, 0.0)
    assert k["unobservable_truth"][0]["unobservable"] == "ecc_correctable_rate unknown: not collected"
    k = evaluate([finding(kind=GPU_FAULT)], [storm], (GPU_FAULT,), blind)["kinds"][GPU_FAULT]
    assert (k["tp"], k["fp"], k["truth"], k["unobservable"]) == (1, 0, 0, 1)  # still a true finding
    k = evaluate([], [storm], (GPU_FAULT,), fleet)["kinds"][GPU_FAULT]
    assert (k["truth"], k["missed"], k["unobservable"]) == (1, 1, 0)
    assert pooled([{"dialect": "dcgm", "kinds": {GPU_FAULT: k}}])[("dcgm", GPU_FAULT)]["unobservable"] == 0
    from analyzer.analysis.evaluate import pooled_replay, replay

    res = replay(blind, [storm, other], [GPU_FAULT], interval=H, window=H)
    k = res["kinds"][GPU_FAULT]
    assert (k["truth"], k["missed"], k["unobservable"], k["ttd_p95_s"]) == (1, 1, 1, None)
    assert [p["attribution"] for p in k["unobservable_problems"]] == ["ecc_storm"]
    assert pooled_replay([{**res, "dialect": "dcgm"}])[("dcgm", GPU_FAULT)]["unobservable"] == 1


def test_several_findings_on_one_truth_all_count_and_fragmentation_is_reported() -> None:
    truths = [truth(gpu="0")]
    mig = [finding(instance="1"), finding(instance="2")]  # two MIG instances of the truth's GPU
    k = scores(mig, truths)[IDLE_MASKING]
    assert (k["tp"], k["fp"], k["detected"], k["fragmented"]) == (2, 0, 1, 0)
    split = [finding(start=0, end=1200), finding(start=1800, end=H)]
    k = scores(split, truths)[IDLE_MASKING]
    assert (k["tp"], k["detected"], k["fragmented"]) == (2, 1, 1)


def test_empty_cases_and_other_kinds_are_ignored() -> None:
    k = scores([], [])[IDLE_MASKING]
    assert (k["precision"], k["recall"], k["f1"]) == (1.0, 1.0, 1.0)
    k = scores([], [truth()])[IDLE_MASKING]
    assert (k["precision"], k["recall"]) == (1.0, 0.0)
    k = scores([finding()], [])[IDLE_MASKING]
    assert (k["precision"], k["recall"]) == (0.0, 1.0)
    k = scores([finding(kind=THERMAL)], [truth(kind=THERMAL)])[IDLE_MASKING]
    assert (k["findings"], k["truth"]) == (0, 0)


def test_truth_is_clipped_to_the_window() -> None:
    outside = truth(start=-2 * H, end=-H)
    k = scores([], [outside])[IDLE_MASKING]
    assert k["truth"] == 0
    early = truth(start=-H, end=H)
    k = scores([finding(start=0)], [early])[IDLE_MASKING]
    assert k["onset_max_s"] == 0.0  # measured from the window start, not before it


def test_false_findings_per_thousand_gpu_hours() -> None:
    fleet = timeline([{"gpu": 0}, {"gpu": 1, "gpu_instance": "1", "mig_profile": "1g.10gb"}], 60)
    assert fleet_gpu_hours(fleet) == pytest.approx(1 + 1 / 7)
    res = evaluate([finding(host="node-a", gpu=0, start=0, end=600)], [], DEFAULT_KINDS, fleet)
    assert res["kinds"][IDLE_MASKING]["false_per_1000_gpu_hours"] == pytest.approx(1000 / (1 + 1 / 7))
    assert res["kinds"][IDLE_ALLOCATED]["false_per_1000_gpu_hours"] == 0.0
    with pytest.raises(ValueError):
        evaluate([], [], DEFAULT_KINDS)


# the quality bar on every simulator scenario --------------------------------------------------
def _assert_quality(results: list[dict]) -> None:
    for r in results:
        for kind, k in r["kinds"].items():
            where = f"{r['scenario']} ({r['dialect']}) {kind}: {k['false_findings'][:3]} {k['missed_truth'][:3]}"
            assert k["precision"] >= 0.99, where
            assert k["recall"] >= 0.99, where
            if r["scenario"] == "healthy-fleet":
                assert k["findings"] == 0, where


@pytest.fixture(scope="module")
def truegpu_results() -> list[dict]:
    return evaluate_scenarios(list_scenarios(), dialect="truegpu", step=60)


def test_quality_bar_truegpu_dialect(truegpu_results: list[dict]) -> None:
    assert {r["scenario"] for r in truegpu_results} == set(list_scenarios())
    _assert_quality(truegpu_results)
    # The bar is not met vacuously: the waste scenarios have truth of both kinds and it is found.
    found = {(r["scenario"], kind): k["detected"] for r in truegpu_results for kind, k in r["kinds"].items()}
    assert found[("idle-waste", IDLE_MASKING)] == 8 and found[("idle-waste", IDLE_ALLOCATED)] == 6
    assert found[("mixed-fleet", IDLE_MASKING)] == 4 and found[("mig-training", IDLE_ALLOCATED)] == 1


def test_quality_bar_dcgm_dialect_all_counters() -> None:
    _assert_quality(evaluate_scenarios(list_scenarios(), dialect="dcgm", step=60, dcgm_counters="all"))


def test_dcgm_default_counters_fall_back_to_low_confidence_and_still_meet_the_bar() -> None:
    """dcgm-exporter's default counters lack SM activity: masking is found by the proxy."""
    results = evaluate_scenarios(["idle-waste", "mixed-fleet", "mig-training", "xid-faults", "rack-cooling"],
                                 dialect="dcgm", step=60, dcgm_counters="default")
    _assert_quality(results)
    masking = results[0]["kinds"][IDLE_MASKING]
    assert masking["detected"] == 8 and masking["confidence"] == {"high": 0, "low": 8}
    assert results[0]["kinds"][IDLE_ALLOCATED]["confidence"] == {"high": 6, "low": 0}  # util is a default counter


def test_table_lists_every_scenario_and_kind(truegpu_results: list[dict]) -> None:
    table = format_table(truegpu_results)
    lines = table.splitlines()
    assert len(lines) == 2 + len(truegpu_results) * len(DEFAULT_KINDS)
    assert "prec" in lines[0] and "idle-waste" in table and "idle_allocated" in table


def test_coarser_findings_match_node_truth_they_contain():
    from analyzer.analysis.evaluate import matches
    from analyzer.findings import THERMAL, TOPOLOGY, Finding

    node_truth = {"kind": THERMAL, "hostname": "r1-n2", "gpu": None, "job": None, "start": 0.0, "end": None}
    rack_finding = Finding(THERMAL, "warning", "rack r1 is hot", 10.0, None, 0.9, rack="r1")
    racks = {"r1-n2": "r1", "r2-n1": "r2"}
    assert matches(rack_finding, node_truth, 100.0, racks)
    assert not matches(rack_finding, {**node_truth, "hostname": "r2-n1"}, 100.0, racks)
    job_truth = {"kind": TOPOLOGY, "hostname": "dc1-n1", "gpu": None, "job": "llm", "start": 0.0, "end": None}
    job_finding = Finding(TOPOLOGY, "warning", "job llm spans two sites", 0.0, None, 0.5, job="llm")
    assert matches(job_finding, job_truth, 100.0, racks)
    assert not matches(job_finding, {**job_truth, "job": "other"}, 100.0, racks)
    gpu_truth = {**node_truth, "gpu": "3"}
    assert not matches(rack_finding, gpu_truth, 100.0, racks)  # a GPU problem needs the GPU named


# replay: time to detect the way `serve` sees history ---------------------------------------------
def test_replay_cuts_follow_the_service_window_alignment() -> None:
    from analyzer.analysis.evaluate import replay_cuts

    assert replay_cuts(T0, T0 + 300, 60, 60) == [T0 + 60 * k for k in range(1, 6)]
    assert replay_cuts(T0, T0 + 300, 60, 30) == replay_cuts(T0, T0 + 300, 60, 60)  # no new rows: no new run
    assert replay_cuts(T0, T0 + 300, 60, 90) == [T0 + 60, T0 + 180, T0 + 240]  # 90, 180, 270 aligned down


def test_fleet_between_is_what_the_loader_returns_for_the_window() -> None:
    fleet = timeline([{"gpu": 0}], 10, 60.0)
    cut = fleet.between(T0 - 120, T0 + 180)
    assert (cut.start, cut.end) == (T0 - 120, T0 + 180)
    assert sorted(cut.frame["timestamp"]) == [T0, T0 + 60, T0 + 120]


def test_ttd_quantiles_rank_a_missed_problem_above_every_time() -> None:
    from analyzer.analysis.evaluate import ttd_quantile, ttd_summary

    assert ttd_quantile([120.0, 60.0, 180.0], 0.5) == 120.0 and ttd_quantile([120.0, 60.0, 180.0], 0.95) == 180.0
    assert ttd_quantile([60.0, None], 0.5) == 60.0 and ttd_quantile([60.0, None], 0.95) is None
    assert ttd_quantile([], 0.5) is None
    assert ttd_summary([None, 300.0]) == {"ttd_p50_s": 300.0, "ttd_p95_s": None, "ttd_max_s": 300.0}


def test_replay_measures_time_to_detect_and_reports_an_undetectable_problem_as_missed() -> None:
    """The CI subset: XIDs replayed at serve's defaults are found within the issue's 1 minute, each under
    one id all along; a problem no telemetry shows is "missed", never a number. The GPUs the XIDs left
    idle and awaiting a reset are not "idle allocated" once the event has left serve's window, and the
    last healthy minutes of the GPU that fell off the bus, at the start of a later window, are no straggler."""
    import json

    from analyzer.analysis.evaluate import named_scenario_fleet, pooled_replay, replay
    from analyzer.findings import GPU_FAULT, json_ready
    from analyzer.service.loop import DEFAULT_INTERVAL, DEFAULT_WINDOW

    cluster, fleet = named_scenario_fleet("xid-faults", "truegpu", 60.0)
    truth = cluster.ground_truth()
    invisible = {"kind": GPU_FAULT, "hostname": "dc1-r1-n01", "gpu": "6", "job": None, "start": fleet.start + 3600,
                 "end": None, "cause": "a fault no metric shows", "attribution": "invisible"}
    res = replay(fleet, [*truth, invisible], [GPU_FAULT, IDLE_ALLOCATED, STRAGGLER], interval=DEFAULT_INTERVAL,
                 window=DEFAULT_WINDOW)
    for kind in (IDLE_ALLOCATED, STRAGGLER):  # nor is the GPU that fell off the bus, seen from a later window,
        assert res["kinds"][kind]["fp"] == 0, res["kinds"][kind]["false_findings"]  # a straggler of its hung gang
    k = res["kinds"][GPU_FAULT]
    xids = [p for p in k["problems"] if p["attribution"].startswith("xid")]
    assert len(xids) == 6 and res["cuts"] == 180
    for p in xids:
        assert p["ttd_s"] is not None and 0 < p["ttd_s"] <= 60, p
        assert (p["ids"], p["withdrawn"]) == (1, 0), p  # the alert on it would not flap
    (missed,) = [p for p in k["problems"] if p["attribution"] == "invisible"]
    assert missed["ttd_s"] is None and missed["ids"] == 0
    assert (k["truth"], k["detected"], k["missed"], k["fp"], k["fp_paged"]) == (7, 6, 1, 0, 0)
    assert k["ttd_p50_s"] == 60 and k["ttd_p95_s"] is None  # the 95th percentile falls on the missed problem
    pooled = pooled_replay([{**res, "dialect": "truegpu"}])[("truegpu", GPU_FAULT)]
    assert pooled["by_attribution"]["xid79"]["ttd_p95_s"] == 60 and pooled["by_attribution"]["invisible"]["truth"] == 1
    json.dumps(json_ready(res), allow_nan=False)


def test_replay_gives_straggler_times_to_detect_per_slowdown_band_of_the_targets() -> None:
    """Issue 12's targets are per size (>= 20 % within 5 minutes, >= 10 % within 10): the pooled replay
    and its table give the time to detect per band of the truth's slowdown; truth without one stays out."""
    from analyzer.analysis.evaluate import format_replay, pooled_replay

    problems = [{"slowdown": s, "ttd_s": t, "attribution": "unknown"}
                for s, t in ((0.25, 120.0), (0.2, 180.0), (0.12, 540.0), (0.1, None), (0.06, 900.0), (None, 60.0))]
    kind = {"findings": 5, "tp": 5, "fp_paged": 0, "truth": 6, "detected": 5, "unobservable": 0, "ids_max": 1,
            "withdrawn": 2, "downgraded": 1, "problems": problems}
    res = [{"dialect": "truegpu", "kinds": {STRAGGLER: kind}}]
    assert (pooled_replay(res)[("truegpu", STRAGGLER)]["withdrawn"], pooled_replay(res)[("truegpu", STRAGGLER)][
        "downgraded"]) == (2, 1)
    bands = pooled_replay(res)[("truegpu", STRAGGLER)]["by_slowdown"]
    assert {b: (v["truth"], v["ttd_p50_s"], v["ttd_max_s"]) for b, v in bands.items()} == {
        "slowdown >= 20%": (2, 120.0, 180.0), "slowdown 10-20%": (2, 540.0, 540.0), "slowdown < 10%": (1, 900.0, 900.0)}
    assert bands["slowdown 10-20%"]["ttd_p95_s"] is None  # its p95 falls on the missed one
    lines = format_replay(res).splitlines()
    assert [ln.split()[:3] for ln in lines if "slowdown" in ln] == [
        ["slowdown", ">=", "20%"], ["slowdown", "10-20%", "2"], ["slowdown", "<", "10%"]]


@pytest.mark.parametrize("dialect", ["truegpu", "dcgm"])
def test_messy_telemetry_keeps_each_problem_one_finding(dialect: str) -> None:
    """Whole-node scrape gaps, an exporter restart, repeated samples and an HA pair (the scenario's
    ``mess:``, written into the history both dialects are read from): every problem is found once,
    with its true start, and nothing else is."""
    (res,) = evaluate_scenarios(["messy-telemetry"], dialect=dialect, step=60,
                                kinds=["straggler", "thermal", "idle_masking", "idle_allocated"])
    for kind, k in res["kinds"].items():
        assert (k["precision"], k["recall"], k["fragmented"]) == (1.0, 1.0, 0), (kind, k)
        assert k["findings"] == k["truth"], (kind, k)
        assert k["onset_max_s"] is None or abs(k["onset_max_s"]) <= 60, (kind, k)


def test_replay_counts_the_false_findings_that_paged_apart_from_withdrawn_suspicions() -> None:
    """An early "suspected" finding at info that is withdrawn never paged anyone; one that reached warning did."""
    from analyzer.analysis.evaluate import _replay_counts, _Seen

    def seen(true: bool, severity: str) -> _Seen:
        f = Finding(kind="straggler", severity=severity, summary="s", start=0.0, end=None, score=0.5)
        return _Seen("straggler", 60.0, f, true=true, severity_max=severity)

    k = _replay_counts([], [seen(True, "critical"), seen(False, "info"), seen(False, "warning"),
                            seen(False, "critical")], 1000.0)
    assert (k["tp"], k["fp"], k["fp_paged"]) == (1, 3, 2)
