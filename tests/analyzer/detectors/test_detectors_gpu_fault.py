"""gpu_fault: hard hardware signals on hand-built fleets, and quality on every simulated scenario."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from analyzer.analysis.evaluate import evaluate_scenarios
from analyzer.analysis.xid import APPLICATION_XIDS, describe
from analyzer.data.frame import Fleet
from analyzer.detectors import Memory, make_detector, run_detectors
from analyzer.detectors.gpu_fault import GpuFault
from analyzer.findings import GPU_FAULT
from exporter.simulator.scenario import list_scenarios
from tests.fleets import STEP, T0, timeline

BUSY = {"gpu_util": 0.97, "sm_active": 0.6, "pcie_gen": 4.0, "pcie_gen_max": 4.0, "pcie_width": 16.0,
        "pcie_width_max": 16.0, "ecc_uncorrectable_rate": 0.0, "row_remap_pending": 0.0, "row_remap_failure": 0.0,
        "remapped_rows_rate": 0.0, "nvlink_error_rate": 0.0, "nvlink_links_down": 0.0, "pcie_replay_rate": 0.0}
IDLE = {**BUSY, "gpu_util": 0.0, "sm_active": 0.0, "pcie_gen": 1.0}
OWNER = {"job": "train", "namespace": "llm", "pod": "train-0"}


def fleet_of(*devices: dict, steps: int = 60) -> Fleet:
    return timeline([{"gpu": i, **d} for i, d in enumerate(devices)], steps)


def series(steps: int, base: dict, **changes: tuple[int, int, float | None]) -> dict:
    """``base`` as per-step lists with ``signal=(from, to, value)`` overriding steps [from, to)."""
    out = {k: [v] * steps for k, v in base.items()}
    for k, (a, b, v) in changes.items():
        out.setdefault(k, [base.get(k)] * steps)
        out[k][a:b] = [v] * (b - a)
    return out


def xid(gpu: int, step: int, code: int, host: str = "node-a") -> pd.DataFrame:
    return pd.DataFrame({"timestamp": [T0 + step * STEP + 10.0], "hostname": [host], "gpu": [str(gpu)],
                         "uuid": [f"GPU-{host}-{gpu}"], "xid": [str(code)], "count": [1.0]})


def detect(fleet: Fleet, **config: object) -> list:
    return make_detector(GPU_FAULT, config).detect(fleet)


# merging hard signals ----------------------------------------------------------------------
def test_xid48_ecc_and_pending_remap_are_one_critical_finding_with_all_evidence() -> None:
    bad = series(60, BUSY, ecc_uncorrectable_rate=(20, 21, 1 / 60), remapped_rows_rate=(20, 21, 1 / 60),
                 row_remap_pending=(21, 60, 1.0), gpu_util=(21, 60, 0.0))
    fleet = fleet_of({**bad, **OWNER}, {**BUSY, **OWNER})
    fleet.events = xid(0, 20, 48)
    [f] = detect(fleet)
    assert f.kind == GPU_FAULT and f.severity == "critical" and f.gpu == 0 and f.job == "train"
    assert f.start == T0 + 20 * STEP and f.end is None  # pending until the end: still open
    ev = f.evidence
    assert ev["attribution"] == "xid48"
    assert {"xid48", "ecc_uncorrectable", "row_remap_pending", "remapped_rows"} <= set(ev["causes"])
    assert ev["xids"][0]["code"] == 48 and ev["ecc_uncorrectable_errors"] == pytest.approx(1.0)
    assert ev["row_remap_pending"] is True
    assert "reset" in f.summary and "XID 48" in f.summary
    json.dumps(f.to_json())


def test_an_xid_that_slides_out_of_serves_window_keeps_its_finding_critical_and_its_start() -> None:
    """serve analyzes the last 30 minutes every minute: 30 minutes after an XID 95 the event left the window
    while the remap it left pending stayed, and the critical finding fell to the remap's warning (its page
    resolved, nothing was reset), its start moving with the window. The service's memory keeps both."""
    bad = series(120, BUSY, ecc_uncorrectable_rate=(20, 21, 1 / 60), row_remap_pending=(21, 120, 1.0))
    fleet = fleet_of({**bad, **OWNER}, {**BUSY, **OWNER}, steps=120)
    fleet.events = xid(0, 20, 95)
    detector, memory = make_detector(GPU_FAULT, {}), Memory()
    for cut in range(22, 121, 3):
        window = fleet.between(T0 + (cut - 30) * STEP, T0 + cut * STEP)
        [alone] = detector.detect(window)
        [f] = run_detectors(window, [GPU_FAULT], memory=memory)
        assert (f.severity, f.evidence["attribution"], f.start) == ("critical", "xid95", T0 + 20 * STEP), cut
        assert f.summary.startswith("XID 95 (uncontained ECC error)") and "since 2026-01-05T00:20:00Z" in f.summary
        if cut > 55:  # the XID has left the window: the window alone reads only the pending remap
            assert (alone.severity, alone.evidence["attribution"], alone.start) == (
                "warning", "row_remap_pending", window.start)
    # the remap applied (the GPU was reset), the finding ends: a later fault on that GPU starts afresh
    healed = series(200, BUSY, ecc_uncorrectable_rate=(20, 21, 1 / 60), row_remap_pending=(21, 120, 1.0),
                    remapped_rows_rate=(170, 171, 1 / 60))
    fleet = fleet_of(healed, steps=200)
    fleet.events = xid(0, 20, 95)
    memory = Memory()
    for cut in range(22, 201):
        found = run_detectors(fleet.between(T0 + (cut - 30) * STEP, T0 + cut * STEP), [GPU_FAULT], memory=memory)
    [f] = found
    assert (f.severity, f.evidence["attribution"], f.start) == ("warning", "remapped_rows", T0 + 170 * STEP)


def test_contained_ecc_xid94_keeps_its_own_warning_severity() -> None:
    bad = series(60, BUSY, ecc_uncorrectable_rate=(30, 31, 1 / 60), row_remap_pending=(31, 60, 1.0))
    fleet = fleet_of(bad)
    fleet.events = xid(0, 30, 94)
    [f] = detect(fleet)
    assert f.severity == "warning" and f.evidence["attribution"] == "xid94"
    # without the XID the same counters read as an uncorrectable error: critical
    fleet.events = fleet.events.iloc[:0]
    [f] = detect(fleet)
    assert f.severity == "critical" and f.evidence["attribution"] == "ecc_uncorrectable"


def test_remap_failure_says_rma() -> None:
    [f] = detect(fleet_of(series(60, BUSY, row_remap_failure=(10, 60, 1.0))))
    assert f.severity == "critical" and "RMA" in f.summary and f.evidence["attribution"] == "row_remap_failure"


def test_hardware_xid_alone_is_held_then_closes() -> None:
    fleet = fleet_of(dict(BUSY))
    fleet.events = xid(0, 10, 95)
    [f] = detect(fleet)
    assert f.severity == "critical" and f.start == T0 + 10 * STEP
    assert f.end == pytest.approx(T0 + 10 * STEP + 600.0 + STEP)  # xid_hold_s, then the GPU reads healthy


@pytest.mark.parametrize("code", sorted(APPLICATION_XIDS))
def test_application_xids_are_info_and_say_so(code: int) -> None:
    fleet = fleet_of(dict(BUSY))
    fleet.events = xid(0, 10, code)
    [f] = detect(fleet)
    assert f.severity == "info" and "application" in f.summary and f.end == T0 + 11 * STEP
    assert describe(code).category == "application"
    assert detect(fleet, application_xids=False) == []


def test_unknown_xid_is_a_warning_pointing_to_nvidia() -> None:
    fleet = fleet_of(dict(BUSY))
    fleet.events = xid(0, 10, 999)
    [f] = detect(fleet)
    assert f.severity == "warning" and "XID table" in f.summary


# soft signals need persistence -----------------------------------------------------------------
def test_idle_gpu_with_low_pcie_gen_is_not_a_fault() -> None:
    assert detect(fleet_of(dict(IDLE), dict(IDLE))) == []


def test_busy_gpu_with_downgraded_link_is_a_fault_and_a_blip_is_not() -> None:
    down = series(60, BUSY, pcie_gen=(10, 60, 3.0), pcie_width=(10, 60, 8.0))
    blip = series(60, BUSY, pcie_gen=(10, 12, 3.0))
    found = detect(fleet_of(down, blip))
    assert len(found) == 1
    f = found[0]
    assert f.gpu == 0 and f.severity == "warning" and f.evidence["attribution"] == "pcie_downgrade"
    assert f.evidence["pcie_gen_min"] == 3 and f.evidence["pcie_width_min"] == 8
    assert "gen3 x8 of gen4 x16" in f.summary and "riser" in f.summary


def test_downgrade_during_idle_phases_is_unknown_not_healthy_nor_fault() -> None:
    # busy-downgraded, idle (gen1 anyway), busy-downgraded again: idle says nothing either way
    gpu = series(60, BUSY, pcie_gen=(0, 60, 3.0), gpu_util=(20, 22, 0.0))
    [f] = detect(fleet_of(gpu))
    assert f.start == T0 and f.end is None


def test_nvlink_errors_must_be_above_the_rate_and_persist() -> None:
    steady = series(60, BUSY, nvlink_error_rate=(10, 60, 5.0))
    slow = series(60, BUSY, nvlink_error_rate=(10, 60, 0.01))  # background CRC noise
    burst = series(60, BUSY, nvlink_error_rate=(10, 12, 50.0))
    down = series(60, BUSY, nvlink_links_down=(30, 60, 2.0))
    found = {f.gpu: f for f in detect(fleet_of(steady, slow, burst, down))}
    assert set(found) == {0, 3}
    assert found[0].severity == "warning" and found[0].evidence["attribution"] == "nvlink"
    assert found[3].severity == "critical" and "2 NVLink link(s) down" in found[3].summary


def test_pcie_replays_alone_are_a_link_fault() -> None:
    [f] = detect(fleet_of(series(60, BUSY, pcie_replay_rate=(5, 60, 0.2))))
    assert f.evidence["attribution"] == "pcie_downgrade" and "replays" in f.summary


# telemetry gaps ------------------------------------------------------------------------------
def lost_gpu(steps: int, at: int) -> dict:
    return series(steps, BUSY, **{k: (at, steps, None) for k in BUSY})


def test_one_gpu_losing_telemetry_while_its_node_reports_is_a_fault() -> None:
    fleet = fleet_of(lost_gpu(60, 30), dict(BUSY), dict(BUSY))
    [f] = detect(fleet)
    assert f.gpu == 0 and f.severity == "critical" and f.start == T0 + 30 * STEP and f.end is None
    assert f.confidence == "low"  # no XID 79: could be the exporter losing the GPU
    assert f.evidence["telemetry_lost_minutes"] == pytest.approx(30.0)
    fleet.events = xid(0, 29, 79)  # the XID just before the GPU vanishes: one finding, confirmed
    [f] = detect(fleet)
    assert f.confidence == "high" and f.evidence["attribution"] == "xid79" and f.start == T0 + 29 * STEP


def test_a_short_telemetry_gap_is_not_a_fault() -> None:
    gpu = series(60, BUSY, **{k: (30, 32, None) for k in BUSY})
    assert detect(fleet_of(gpu, dict(BUSY))) == []


def test_whole_node_down_is_not_a_fault_of_each_gpu() -> None:
    # node-a goes silent entirely (node/exporter/network problem: node availability, not a GPU fault)
    silent = [{"hostname": "node-a", "gpu": g, **lost_gpu(60, 30)} for g in range(4)]
    other = [{"hostname": "node-b", "gpu": g, **BUSY} for g in range(4)]
    assert GpuFault().detect(timeline(silent + other, 60)) == []


def test_missing_rows_are_unknown_not_lost() -> None:
    fleet = timeline([{"gpu": 0, **BUSY}, {"gpu": 1, **BUSY}], 60, drop={0: range(30, 60)})
    assert detect(fleet) == []


# unknown telemetry ---------------------------------------------------------------------------
def test_missing_counters_are_unknown_and_said_so() -> None:
    fleet = fleet_of({"gpu_util": 0.97}, {"gpu_util": 0.97})
    assert detect(fleet) == []
    assert any("gpu_fault" in n and "unknown, not absent" in n for n in fleet.notes)
    detect(fleet)
    assert sum("gpu_fault" in n for n in fleet.notes) == 1


def test_nan_counters_are_not_errors() -> None:
    gpu = series(60, BUSY, ecc_uncorrectable_rate=(0, 60, None), row_remap_pending=(0, 60, None))
    assert detect(fleet_of(gpu)) == []


# MIG ---------------------------------------------------------------------------------------
def test_fault_on_a_mig_gpu_is_one_finding_for_the_physical_gpu() -> None:
    bad = series(60, BUSY, row_remap_failure=(10, 60, 1.0))
    devs = [{"gpu": 0, "gpu_instance": str(i), "mig_profile": "3g.40gb", "uuid": "GPU-x", **bad,
             "gpu_util": None, "gr_active": 0.9} for i in (1, 2)]
    [f] = GpuFault().detect(timeline([*devs, {"gpu": 1, **BUSY}], 60))
    assert f.gpu == 0 and f.gpu_instance is None


def test_mig_gpu_is_busy_when_any_instance_is() -> None:
    idle_inst = {**BUSY, "pcie_gen": 3.0, "gpu_util": None, "gr_active": 0.0}
    busy_inst = {**idle_inst, "gr_active": 0.8}
    devs = [{"gpu": 0, "gpu_instance": "1", "mig_profile": "3g.40gb", "uuid": "GPU-x", **idle_inst},
            {"gpu": 0, "gpu_instance": "2", "mig_profile": "3g.40gb", "uuid": "GPU-x", **busy_inst}]
    [f] = GpuFault().detect(timeline(devs, 60))
    assert f.evidence["attribution"] == "pcie_downgrade"


# every built-in scenario ---------------------------------------------------------------------
def _assert_quality(results: list[dict]) -> None:
    bad = []
    for r in results:
        k = r["kinds"][GPU_FAULT]
        if k["precision"] < 0.95 or k["recall"] < 0.95:
            bad.append((r["scenario"], r["dialect"], k["precision"], k["recall"], k["false_findings"],
                        k["missed_truth"]))
        if k["truth"]:
            assert k["onset_median_s"] is not None and abs(k["onset_max_s"]) <= 2 * r["step"], r["scenario"]
        if r["scenario"] == "healthy-fleet":
            assert k["findings"] == 0
    assert not bad, bad


def test_quality_on_every_scenario_truegpu() -> None:
    _assert_quality(evaluate_scenarios(list_scenarios(), dialect="truegpu", step=60, kinds=[GPU_FAULT]))


def test_quality_on_every_scenario_dcgm_all_counters() -> None:
    _assert_quality(evaluate_scenarios(list_scenarios(), dialect="dcgm", step=60, kinds=[GPU_FAULT],
                                       dcgm_counters="all"))


def test_dcgm_default_counters_still_see_xids_remaps_lost_gpus_and_pcie_replays() -> None:
    """dcgm-exporter's defaults lack ECC, NVLink error and PCIe link-state fields.

    Still found: every XID fault (XID gauge, remapped rows, remap failure), a GPU that falls
    off the bus, a PCIe link fault through its replay counter. Not found: NVLink CRC errors and
    links down (no field at all in the defaults): unknown, said in the notes, never "healthy".
    """
    results = {r["scenario"]: r for r in evaluate_scenarios(
        ["xid-faults", "pcie-downgrade", "nvlink-errors", "healthy-fleet"], dialect="dcgm", step=60,
        kinds=[GPU_FAULT], dcgm_counters="default")}
    for name in ("xid-faults", "pcie-downgrade"):
        k = results[name]["kinds"][GPU_FAULT]
        assert k["precision"] == 1.0 and k["recall"] == 1.0, (name, k)
    nv = results["nvlink-errors"]
    assert nv["kinds"][GPU_FAULT]["findings"] == 0
    assert any("gpu_fault" in n and "nvlink_error_rate" in n for n in nv["notes"])
    assert results["healthy-fleet"]["kinds"][GPU_FAULT]["findings"] == 0


# quiet partial failures (issue 12): error storms ------------------------------------------------
def ramp(steps: int, start: int, first: float, doubling_steps: float, signal: str, cap: float = 1e9) -> dict:
    """A rate leaving normal at ``start`` with ``first``/s and doubling every ``doubling_steps`` steps."""
    out = series(steps, {**BUSY, "ecc_correctable_rate": 0.0})
    k = np.arange(steps - start)
    out[signal][start:] = list(np.minimum(first * 2.0 ** (k / doubling_steps), cap))
    return out


def test_growing_correctable_ecc_storm_is_a_warning_with_its_acceleration() -> None:
    storm = ramp(90, 20, 0.02, 8, "ecc_correctable_rate", cap=3.0)
    [f] = detect(fleet_of(storm, series(90, {**BUSY, "ecc_correctable_rate": 0.0}), steps=90))
    assert f.gpu == 0 and f.severity == "warning" and f.evidence["attribution"] == "ecc_storm"
    assert f.start == T0 + 20 * STEP  # where the rate left normal
    assert f.evidence["ecc_accelerating"] and f.evidence["ecc_correctable_growth"] > 10
    assert "correctable ECC errors at up to 3/s, accelerating" in f.summary
    assert "memory cells degrading" in f.summary and "field diagnostics" in f.summary
    json.dumps(f.to_json(), allow_nan=False)


def test_ecc_bursts_and_a_background_trickle_are_not_storms() -> None:
    burst = series(60, {**BUSY, "ecc_correctable_rate": 0.0}, ecc_correctable_rate=(30, 31, 2.0))  # 120 in a scrape
    bursts = series(60, {**BUSY, "ecc_correctable_rate": 0.0})
    for at in (10, 14, 18, 40):  # a few separate scrapes with errors
        bursts["ecc_correctable_rate"][at] = 0.5
    trickle = series(60, {**BUSY, "ecc_correctable_rate": 0.0})
    trickle["ecc_correctable_rate"][::7] = [1 / 60] * len(trickle["ecc_correctable_rate"][::7])  # one error / 7 min
    assert detect(fleet_of(burst, bursts, trickle)) == []


def test_steady_sbe_storm_is_found_without_acceleration() -> None:
    [f] = detect(fleet_of(series(60, {**BUSY, "ecc_correctable_rate": 0.0}, ecc_correctable_rate=(10, 60, 0.05))))
    assert f.evidence["attribution"] == "ecc_storm" and not f.evidence["ecc_accelerating"]
    assert "accelerating" not in f.summary


def test_nvlink_errors_that_leave_normal_and_keep_rising_are_found_within_ten_minutes() -> None:
    rising = ramp(60, 20, 0.1, 5, "nvlink_error_rate")
    found = {}
    for k in range(0, 15):  # as serve sees it: data up to onset + k minutes
        found[k] = detect(fleet_of({key: v[:21 + k] for key, v in rising.items()}, steps=21 + k))
    first = min(k for k, f in found.items() if f)
    assert first <= 10, first
    [f] = found[14]
    assert f.evidence["attribution"] == "nvlink" and f.evidence["nvlink_errors_rising"]
    assert f.start == T0 + 20 * STEP and "and rising" in f.summary
    assert max(rising["nvlink_error_rate"][:21 + first]) < 1.0  # found well before the steady >= 1/s rule


def test_nvlink_rate_that_steps_up_and_stays_is_not_rising() -> None:
    for level in (0.1, 0.5):
        assert detect(fleet_of(series(60, BUSY, nvlink_error_rate=(10, 60, level)))) == [], level


def test_thresholds_are_configurable() -> None:
    gpu = series(60, BUSY, nvlink_error_rate=(10, 60, 0.5))
    assert detect(fleet_of(gpu)) == []
    assert len(detect(fleet_of(gpu), nvlink_error_rate_min=0.1)) == 1
    assert np.isfinite(GpuFault().merge_gap_s)
