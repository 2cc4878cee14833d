"""thermal: throttle episodes, hot at the same load, rising trends with an ETA, rack/node fold-in;
and the quality bar on every simulator scenario in both dialects."""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np
import pytest

from analyzer.analysis.evaluate import evaluate_scenarios
from analyzer.data.frame import Fleet
from analyzer.detectors import run_detectors
from analyzer.detectors.thermal import Thermal
from analyzer.findings import THERMAL, Finding
from exporter.simulator.scenario import list_scenarios
from tests.fleets import STEP, T0, timeline

#: H100 thermal resistance used to build consistent hand-made GPUs: temp = inlet + R x power.
R = 0.09
INLET = 24.0


def temp_at(power: float, extra: float = 0.0) -> float:
    return INLET + R * power + extra


def gpu(host: str, idx: int, steps: int, power: float | Sequence[float] = 400.0, extra: float | Sequence[float] = 0.0,
        *, throttle: Sequence[float] | float | None = 0.0, rack: str = "dc1-r1", **more: object) -> dict:
    """One GPU: power and extra heat (scalar or per step); temperature follows the physics."""
    p = np.broadcast_to(np.asarray(power, float), (steps,))
    x = np.broadcast_to(np.asarray(extra, float), (steps,))
    # a little sensor noise, deterministic per GPU, so nothing is exactly equal
    noise = np.random.default_rng(zlib.crc32(f"{host}/{idx}".encode())).uniform(-0.5, 0.5, steps)
    d = {"hostname": host, "gpu": idx, "rack": rack, "power": list(p), "temp": list(temp_at(p, x) + noise), **more}
    if throttle is not None:
        d["thermal_throttle"] = list(np.broadcast_to(np.asarray(throttle, float), (steps,)))
    return d


def fleet(devices: list[dict], steps: int, step: float = STEP) -> Fleet:
    fl = timeline(devices, steps, step)
    racks = {d["hostname"]: d.get("rack", "dc1-r1") for d in devices}
    fl.frame["rack"] = fl.frame["hostname"].astype(str).map(racks).astype("category")
    return fl


def node(host: str, steps: int, n: int = 4, **kw: object) -> list[dict]:
    return [gpu(host, i, steps, **kw) for i in range(n)]  # type: ignore[arg-type]


def only(findings: list[Finding]) -> Finding:
    assert len(findings) == 1, [f.summary for f in findings]
    return findings[0]


# throttle episodes ------------------------------------------------------------------------------
def test_throttle_shorter_than_60s_is_ignored_longer_is_reported() -> None:
    steps, step = 80, 15.0
    short = np.zeros(steps)
    short[20:23] = 1  # 45 s
    long_ = np.zeros(steps)
    long_[40:44] = 1  # 60 s
    devs = [gpu("node-a", 0, steps, throttle=short), gpu("node-a", 1, steps, throttle=long_),
            *[gpu("node-a", i, steps) for i in (2, 3)]]
    f = only(Thermal().detect(fleet(devs, steps, step)))
    assert (f.kind, f.hostname, f.gpu, f.severity) == (THERMAL, "node-a", 1, "critical")
    assert (f.start, f.end) == (T0 + 40 * step, T0 + 44 * step)
    assert f.evidence["throttled_minutes"] == pytest.approx(1.0)
    assert "thermally throttled" in f.summary and "fans" in f.summary
    f.to_json()


def test_throttled_hot_gpu_reports_excess_over_peers_and_lost_clock() -> None:
    steps = 60
    thr = np.r_[np.zeros(10), np.ones(40), np.zeros(10)]
    extra = np.r_[np.zeros(10), np.full(40, 30.0), np.zeros(10)]
    clk = np.where(thr == 1, 1.2e9, 1.98e9)
    devs = [gpu("node-a", 0, steps, power=np.where(thr == 1, 300.0, 400.0), extra=extra, throttle=thr,
                sm_clock=list(clk), sm_clock_max=1.98e9),
            *[gpu("node-a", i, steps, sm_clock=1.98e9, sm_clock_max=1.98e9) for i in (1, 2, 3)]]
    f = only(Thermal().detect(fleet(devs, steps)))
    assert f.gpu == 0 and f.start == T0 + 10 * STEP and f.end == T0 + 50 * STEP
    assert f.evidence["excess_over_peers_c"] > 15  # no power spread to learn R from: raw difference (21 C)
    assert f.evidence["sm_clock_ratio_while_throttled"] == pytest.approx(1.2 / 1.98, abs=0.01)
    assert "above its peers at the same power" in f.summary and "SM clock at 61% of max" in f.summary


def test_serve_runs_report_a_gpu_throttling_for_hours_as_such_not_for_the_windows_30_minutes() -> None:
    """serve analyzes the last 30 minutes every minute: a GPU throttling for 90 minutes read "thermally throttled
    for 30 min", its start moving with the window. The runs carry the episode (``EarlierRuns``)."""
    steps = 130
    thr = np.r_[np.zeros(10), np.ones(100), np.zeros(20)]
    devs = [gpu("node-a", 0, steps, power=np.where(thr == 1, 300.0, 400.0), extra=30.0 * thr, throttle=thr),
            *[gpu("node-a", i, steps) for i in (1, 2, 3)]]
    fl, det, memory = fleet(devs, steps), Thermal(), {}
    for cut in range(31, steps + 1):
        window = fl.between(T0 + (cut - 30) * STEP, T0 + cut * STEP)
        found = det.detect(window, memory)
        if cut == 100:
            f = only(found)
            assert (f.start, f.end, f.evidence["throttled_minutes"]) == (T0 + 10 * STEP, None, 90.0)
            assert "thermally throttled for 1.5 h" in f.summary
            assert only(det.detect(window)).evidence["throttled_minutes"] == 30.0  # the window alone
    f = only(found)  # ended: the whole episode, as a whole-history analysis gives it
    whole = only(det.detect(fl))
    assert (f.start, f.end, f.evidence["throttled_minutes"]) == (whole.start, whole.end, 100.0)
    assert f.summary == whole.summary


def test_without_throttle_reasons_the_die_at_the_slowdown_point_counts_with_low_confidence() -> None:
    """dcgm-exporter's default counters omit clock-event reasons; temperature is still there."""
    steps = 30
    extra = np.r_[np.zeros(10), np.full(10, 30.0), np.zeros(10)]
    devs = [gpu("node-a", 0, steps, extra=extra, throttle=None), *node("node-a", steps, throttle=None)[1:]]
    fl = fleet(devs, steps)
    assert "thermal_throttle" not in fl.frame.columns
    f = only(Thermal().detect(fl))
    assert f.gpu == 0 and f.confidence == "low"
    assert "throttle reasons not collected" in f.summary


def test_unknown_telemetry_is_unknown_not_a_finding() -> None:
    steps = 20
    devs = [{"hostname": "node-a", "gpu": i, "gpu_util": 0.9} for i in range(4)]
    assert Thermal().detect(timeline(devs, steps)) == []


# hot at the same load vs hot because busy --------------------------------------------------------
def test_hot_because_busy_is_not_a_finding() -> None:
    steps = 40
    busy = gpu("node-a", 0, steps, power=650.0)  # 24 + 0.09 * 650 = 82.5 C: above warn_c, but busy
    devs = [busy, *[gpu("node-a", i, steps, power=p) for i, p in ((1, 70.0), (2, 120.0), (3, 250.0))]]
    assert Thermal().detect(fleet(devs, steps)) == []


def test_hot_at_the_same_load_near_the_slowdown_point_is_a_warning() -> None:
    steps = 40
    devs = [gpu("node-a", 0, steps, power=550.0, extra=12.0),
            *[gpu("node-a", i, steps, power=550.0) for i in (1, 2, 3)]]
    # 24 + 49.5 + 12 = 85.5 C would already throttle; keep it just under with a cooler inlet
    devs[0]["temp"] = [t - 4.0 for t in devs[0]["temp"]]  # 81.5 C: within 8 C of 87 C, 8 C above peers
    f = only(Thermal().detect(fleet(devs, steps)))
    assert (f.gpu, f.severity) == (0, "warning")
    assert f.evidence["excess_over_peers_c"] == pytest.approx(8.0, abs=1.0)
    assert "above its peers at the same power" in f.summary and "before it throttles" in f.summary


def test_hot_at_the_same_load_far_below_the_limit_is_left_to_degraded_gpu() -> None:
    """Dried paste 12 C hotter at 55 C: a maintenance item for degraded_gpu, not a thermal page."""
    steps = 60
    extra = np.r_[np.zeros(20), np.full(40, 12.0)]  # a step, not a ramp
    devs = [gpu("node-a", 0, steps, extra=extra), *[gpu("node-a", i, steps) for i in (1, 2, 3)]]
    assert Thermal().detect(fleet(devs, steps)) == []


# trends --------------------------------------------------------------------------------------------
def test_rising_gpu_gets_an_eta_to_the_slowdown_point() -> None:
    steps = 60
    ramp = np.r_[np.zeros(20), 0.5 * np.arange(40)]  # +0.5 C/min from minute 20
    devs = [gpu("node-a", 0, steps, extra=ramp), *[gpu("node-a", i, steps) for i in (1, 2, 3)]]
    f = only(Thermal().detect(fleet(devs, steps)))
    assert f.gpu == 0
    ev = f.evidence
    assert ev["slope_c_per_min"] == pytest.approx(0.5, abs=0.1)
    onset_temp = temp_at(400.0) + 0.5 * (f.start - (T0 + 20 * STEP)) / 60.0
    assert ev["eta_to_slowdown_min"] == pytest.approx((87.0 - onset_temp) / 0.5, rel=0.25)
    assert ev["eta_to_slowdown_min"] <= 30
    assert "C/min" in f.summary and "87 C slowdown point in ~" in f.summary
    # found well before it gets to the limit: warn_c is 79 C, this one starts at 60 C
    assert f.start < T0 + (20 + (79.0 - temp_at(400.0)) / 0.5) * STEP


# rack and node fold-in -----------------------------------------------------------------------------
def _rack_fleet(hot_nodes: int, steps: int = 120, nodes: int = 3) -> Fleet:
    ramp = np.r_[np.zeros(30), np.minimum(0.6 * np.arange(steps - 30), 40.0)]
    temp_pre = temp_at(400.0) + ramp
    thr = (temp_pre > 85.0).astype(float)
    devs = []
    for r, rack in enumerate(("dc1-r1", "dc1-r2")):
        for n in range(nodes):
            host = f"{rack}-n{n + 1:02d}"
            hot = r == 0 and n < hot_nodes
            for i in range(4):
                d = gpu(host, i, steps, extra=ramp if hot else 0.0, throttle=thr if hot else 0.0, rack=rack)
                if hot:  # pinned at the slowdown point while throttling
                    d["temp"] = list(np.where(thr == 1, 87.0, d["temp"]))
                devs.append(d)
    return fleet(devs, steps)


def test_a_rack_cooling_failure_is_one_rack_finding_with_the_gpus_folded_in() -> None:
    f = only(Thermal().detect(_rack_fleet(hot_nodes=3)))
    assert (f.hostname, f.gpu, f.rack, f.severity) == (None, None, "dc1-r1", "critical")
    ev = f.evidence
    assert ev["nodes"] == ["dc1-r1-n01", "dc1-r1-n02", "dc1-r1-n03"]
    assert len(ev["gpus_folded"]) == 12
    assert ev["slope_c_per_min"] == pytest.approx(0.6, abs=0.15) and ev["eta_to_slowdown_min"] > 0
    assert f.summary.startswith("rack dc1-r1: the GPUs of 3 nodes")
    assert "above the other racks at the same power" in f.summary and "rising" in f.summary
    assert "check the rack's cooling" in f.summary
    assert f.start < T0 + 60 * STEP  # found while ramping, before throttling (minute ~70)
    # It starts where the ramp left the rack's usual level (minute 30), not where it became urgent.
    assert f.start == pytest.approx(T0 + 30 * STEP, abs=3 * STEP)
    assert ev["urgent_from"] > f.start + 5 * STEP


def test_two_hot_nodes_of_a_big_rack_are_one_rack_finding() -> None:
    f = only(Thermal().detect(_rack_fleet(hot_nodes=2, nodes=6)))
    assert f.rack == "dc1-r1" and f.hostname is None
    assert f.evidence["nodes"] == ["dc1-r1-n01", "dc1-r1-n02"]


def test_one_hot_node_is_a_node_finding() -> None:
    f = only(Thermal().detect(_rack_fleet(hot_nodes=1)))
    assert (f.hostname, f.gpu, f.rack) == ("dc1-r1-n01", None, "dc1-r1")
    assert len(f.evidence["gpus_folded"]) == 4
    assert "node dc1-r1-n01" in f.summary and "fans" in f.summary


def test_a_node_heating_with_half_the_fleet_starts_where_its_own_level_left_usual() -> None:
    """Without rack labels (dcgm-exporter data) nodes are compared with the fleet's other nodes. Three of six
    heat together from minute 30, two of them at the fleet's middle: while they climb through it each of the
    three is compared with a median that rises with it, so against its peers it seemed to start 8-9 minutes
    late (3-6 on rack-cooling seeds +3003, +3012 in the dcgm dialect). Its start is where its own level, or its
    excess over its peers, left usual, whichever came first."""
    steps, ramp = 120, np.r_[np.zeros(30), np.minimum(0.6 * np.arange(90), 40.0)]
    base = {"n01": -0.5, "n02": 3.0, "n03": 0.5, "n04": -3.0, "n05": 4.0, "n06": -4.0}
    devs = [gpu(f"dc1-{n}", i, steps, extra=b + (ramp if n in ("n01", "n02", "n03") else 0.0), rack="")
            for n, b in base.items() for i in range(4)]
    found = {f.hostname: f for f in Thermal().detect(fleet(devs, steps))}
    assert sorted(found) == ["dc1-n01", "dc1-n02", "dc1-n03"]
    for f in found.values():
        assert f.start == pytest.approx(T0 + 30 * STEP, abs=3 * STEP), (f.hostname, (f.start - T0) / STEP)


def test_one_throttling_gpu_in_a_warm_node_is_that_gpus_finding_not_the_nodes() -> None:
    """A node running 6 C warmer than the fleet's others (its inlet: no rack labels to compare it with) and one
    GPU of it throttling for a fan of its own. The node is hot but urgent only through that one GPU: the
    finding is the GPU's (dcgm-exporter's default counters, 10 seeds: 8 such node findings, each hiding the
    GPU's own). A second GPU near the slowdown point makes it the node's."""
    steps = 60
    hot = np.r_[np.zeros(20), np.full(40, 30.0)]
    thr = np.r_[np.zeros(20), np.ones(40)]

    def fleet_with(second: float) -> Fleet:
        devs = [gpu("dc1-n01", 0, steps, extra=6.0 + hot, throttle=thr, rack=""),
                gpu("dc1-n01", 1, steps, extra=6.0 + second * hot / 30.0, rack="")]
        devs += [gpu("dc1-n01", i, steps, extra=6.0, rack="") for i in (2, 3)]
        devs += [gpu(f"dc1-n0{n}", i, steps, rack="") for n in range(2, 7) for i in range(4)]
        return fleet(devs, steps)

    f = only(Thermal().detect(fleet_with(second=0.0)))
    assert (f.hostname, f.gpu, f.severity) == ("dc1-n01", 0, "critical"), f.summary
    f = only(Thermal().detect(fleet_with(second=15.0)))  # GPU 1 at 60 + 6 + 15 = 81 C, over warn_c 79 C
    assert (f.hostname, f.gpu) == ("dc1-n01", None), f.summary


def test_runner_finds_thermal() -> None:
    fs = run_detectors(_rack_fleet(hot_nodes=3), [THERMAL])
    assert [f.kind for f in fs] == [THERMAL]


# the quality bar on every simulator scenario ---------------------------------------------------------
NO_FINDINGS = ("healthy-fleet", "healthy-long", "noisy-neighbours")


def _assert_quality(results: list[dict]) -> None:
    for r in results:
        k = r["kinds"][THERMAL]
        where = f"{r['scenario']} ({r['dialect']}): {k['false_findings'][:3]} {k['missed_truth'][:3]}"
        assert k["precision"] >= 0.95, where
        assert k["recall"] >= 0.95, where
        if r["scenario"] in NO_FINDINGS:
            assert k["findings"] == 0, where


@pytest.fixture(scope="module")
def truegpu_results() -> list[dict]:
    return evaluate_scenarios(list_scenarios(), dialect="truegpu", step=60, kinds=[THERMAL])


def test_quality_bar_truegpu(truegpu_results: list[dict]) -> None:
    _assert_quality(truegpu_results)
    found = {r["scenario"]: r["kinds"][THERMAL]["detected"] for r in truegpu_results}
    assert found["thermal-straggler"] == 1 and found["rack-cooling"] == 3  # not met vacuously
    rack = next(r for r in truegpu_results if r["scenario"] == "rack-cooling")["kinds"][THERMAL]
    assert rack["findings"] == 1  # one rack finding for the three nodes' truth
    assert all(abs(r["kinds"][THERMAL]["onset_max_s"] or 0.0) <= 300.0 for r in truegpu_results)  # issue 12


def test_quality_bar_dcgm_all_counters() -> None:
    _assert_quality(evaluate_scenarios(list_scenarios(), dialect="dcgm", step=60, kinds=[THERMAL],
                                       dcgm_counters="all"))


def test_dcgm_default_counters_still_find_thermal_from_temperature() -> None:
    """dcgm-exporter's default counters collect no throttle reasons but do collect temperature and
    power: throttling is inferred from the die at the slowdown point (confidence low), and the
    hot-together rules need only temperature and power. Without rack labels in dcgm data a rack
    failure is reported per node (rack-level truth is per node, so that still matches)."""
    names = ["thermal-straggler", "rack-cooling", "mixed-fleet", "multi-fault", "degraded-gpus", *NO_FINDINGS]
    results = evaluate_scenarios([n for n in names if n in list_scenarios()], dialect="dcgm", step=60,
                                 kinds=[THERMAL], dcgm_counters="default")
    _assert_quality(results)


def test_one_faulty_gpu_in_a_warm_rack_is_no_rack_finding() -> None:
    """straggler-slowdowns at seed +1019: rack dc1-r1 runs ~5 C warmer than the other and holds the injected
    throttling GPUs; the rack is not urgent through one node, so those stay GPU findings."""
    from analyzer.analysis.evaluate import named_scenario_fleet

    _, fleet = named_scenario_fleet("straggler-slowdowns", "truegpu", 60.0, seed_offset=1019)
    found = run_detectors(fleet, [THERMAL])
    assert found and all(f.gpu is not None for f in found), [f.summary for f in found]


def test_serve_runs_do_not_split_a_node_findings_tail_into_gpu_findings() -> None:
    """As rack-cooling's failed rack cools again (dcgm-exporter's default counters: nodes against the fleet),
    serve's window cuts the node episodes to their last hot minutes: too few for the node rule (5 min), enough
    for the GPU rule (60 s at the limit), so runs judged alone showed every GPU of the rack as a critical finding
    of its own, with new ids, for 4 runs after the node findings ended. The runs carry the spans their node and
    rack findings covered: a GPU finding that began inside one and has ended is that finding's, not a new one."""
    from analyzer.analysis.evaluate import named_scenario_fleet
    from analyzer.service.state import decode, encode

    _, fleet = named_scenario_fleet("rack-cooling", "dcgm", 60.0, dcgm_counters="default")
    det = Thermal()

    def runs(memory: dict | None) -> list[tuple[int, int]]:
        out = []
        for k in range(225, 246):
            part = fleet.between(fleet.start + (k - 30) * 60.0, fleet.start + k * 60.0)
            found = det.detect(part) if memory is None else det.detect(part, memory)
            out.append((sum(f.gpu is not None for f in found), sum(f.gpu is None for f in found)))
        return out

    alone = runs(None)
    assert max(g for g, _ in alone) >= 16 and alone[0] == (0, 3)  # the failure's 3 node findings, then its GPUs
    memory: dict = {}
    carried = runs(memory)
    assert carried[:11] == alone[:11] and all(g == 0 for g, _ in carried), carried
    assert decode(encode(memory)) == memory and set(memory["group_spans"]) <= {
        f"node:dc1-r1-n0{i}" for i in (1, 2, 3)}


def test_serve_runs_hold_a_ramping_nodes_warning_while_it_stays_hot() -> None:
    """Each run re-fits R and the fleet's reference, so a node's excess at one instant moves ~0.5 C from run to run
    and the ramp test fails at some samples: judged alone, rack-cooling's node dc1-r1-n02 (dcgm-exporter's default
    counters, +3000) was warned of, dropped, warned of again. Held from where its finding began while its excess
    stays over 5 C, until 10 minutes after it was last urgent: shown in every run from the first, never sooner."""
    from analyzer.analysis.evaluate import named_scenario_fleet

    _, fleet = named_scenario_fleet("rack-cooling", "dcgm", 60.0, dcgm_counters="default", seed_offset=3000)
    det = Thermal()

    def nodes(memory: dict | None) -> dict[int, set[str]]:
        out = {}
        for k in range(70, 96):
            part = fleet.between(fleet.start + (k - 30) * 60.0, fleet.start + k * 60.0)
            found = det.detect(part) if memory is None else det.detect(part, memory)
            out[k] = {f.hostname for f in found if f.gpu is None}
        return out

    alone, held = nodes(None), nodes({})
    first = min(k for k, v in alone.items() if "dc1-r1-n02" in v)
    assert any("dc1-r1-n02" not in alone[k] for k in range(first, 96)), alone  # it came and went
    assert all("dc1-r1-n02" in held[k] for k in range(first, 96)), held
    assert min(k for k, v in held.items() if v) == min(k for k, v in alone.items() if v)  # nothing found sooner
