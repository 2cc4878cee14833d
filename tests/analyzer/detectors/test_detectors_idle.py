"""idle_masking and idle_allocated on hand-built fleets, and the detector runner."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pandas as pd
import pytest

from analyzer.data.frame import Fleet
from analyzer.detectors import DETECTORS, Detector, Memory, load_detectors, make_detector, register, run_detectors
from analyzer.detectors.idle_allocated import IdleAllocated
from analyzer.detectors.idle_masking import IdleMasking
from analyzer.findings import IDLE_ALLOCATED, IDLE_MASKING, Finding
from tests.fleets import STEP, T0, timeline

COMPUTE = {"gpu_util": 0.97, "sm_active": 0.65, "tensor_active": 0.2, "dram_active": 0.32}
MEMORY_BOUND = {"gpu_util": 0.95, "sm_active": 0.2, "tensor_active": 0.02, "dram_active": 0.78}
IDLE = {"gpu_util": 0.0, "sm_active": 0.0, "tensor_active": 0.0, "dram_active": 0.002}
OWNER = {"job": "embed", "namespace": "batch", "pod": "embed-0"}


def fleet_of(*devices: dict, steps: int = 60) -> Fleet:
    return timeline([{"gpu": i, **d} for i, d in enumerate(devices)], steps)


def phases(steps: int, *parts: tuple[int, dict]) -> dict[str, list]:
    """Per-step signal lists from (length, levels) phases, the rest of the window idle-unallocated."""
    out: dict[str, list] = {k: [] for k in ("gpu_util", "sm_active", "tensor_active", "dram_active")}
    for n, levels in parts:
        for k in out:
            out[k] += [levels.get(k)] * n
    for k in out:
        out[k] += [IDLE[k]] * (steps - len(out[k]))
    return out


# idle_masking ------------------------------------------------------------------------------
def test_memory_bound_job_is_idle_masking_with_evidence_and_an_actionable_summary() -> None:
    fleet = fleet_of({**phases(60, (10, COMPUTE), (40, MEMORY_BOUND)), **OWNER})
    (f,) = IdleMasking().detect(fleet)
    assert f.kind == IDLE_MASKING and f.confidence == "high"
    assert (f.start, f.end) == (T0 + 10 * STEP, T0 + 50 * STEP)
    assert (f.hostname, f.gpu, f.job, f.namespace, f.pod) == ("node-a", 0, "embed", "batch", "embed-0")
    ev = f.evidence
    assert ev["gpu_util"] == pytest.approx(0.95) and ev["sm_active"] == pytest.approx(0.2)
    assert ev["dram_active"] == pytest.approx(0.78) and ev["minutes"] == pytest.approx(40)
    assert ev["gpu_hours"] == pytest.approx(40 / 60)
    assert ev["gpu_hours_masked"] == pytest.approx(40 / 60 * 0.75)
    assert "95% utilization" in f.summary and "20% busy" in f.summary and "memory-bound" in f.summary
    assert "profile" in f.summary
    assert 0 < f.score <= 1
    f.to_json()  # JSON-ready


@pytest.mark.parametrize("util", [0.9, 0.95, 0.99, 1.0])
@pytest.mark.parametrize("sm", [0.31, 0.45, 0.6, 0.8, 1.0])
def test_compute_bound_is_never_flagged(util: float, sm: float) -> None:
    busy = {"gpu_util": util, "sm_active": sm, "tensor_active": 0.01, "dram_active": 0.9}  # worst case for proxy
    fleet = fleet_of({**phases(60, (60, busy)), **OWNER})
    assert IdleMasking().detect(fleet) == []
    assert IdleAllocated().detect(fleet) == []


def test_low_util_is_not_masking() -> None:
    fleet = fleet_of({**phases(60, (60, {**MEMORY_BOUND, "gpu_util": 0.6})), **OWNER})
    assert IdleMasking().detect(fleet) == []


def test_short_phase_is_not_flagged_and_min_duration_is_configurable() -> None:
    fleet = fleet_of({**phases(60, (4, MEMORY_BOUND), (56, COMPUTE)), **OWNER})
    assert IdleMasking().detect(fleet) == []
    assert len(IdleMasking(min_duration_s=180).detect(fleet)) == 1


def test_thresholds_are_configurable() -> None:
    fleet = fleet_of({**phases(60, (60, MEMORY_BOUND)), **OWNER})
    assert len(IdleMasking().detect(fleet)) == 1
    assert IdleMasking(sm_max=0.15).detect(fleet) == []
    assert IdleMasking(util_min=0.97).detect(fleet) == []
    assert len(run_detectors(fleet, [IDLE_MASKING], {IDLE_MASKING: {"sm_max": 0.25}})) == 1
    assert run_detectors(fleet, [IDLE_MASKING], {IDLE_MASKING: {"sm_max": 0.15}}) == []


def test_without_sm_activity_the_fallback_has_low_confidence() -> None:
    levels = phases(60, (60, MEMORY_BOUND))
    absent = fleet_of({k: v for k, v in levels.items() if k != "sm_active"} | OWNER)
    unknown = fleet_of({**levels, "sm_active": [None] * 60, **OWNER})
    for fleet in (absent, unknown):
        (f,) = IdleMasking().detect(fleet)
        assert f.confidence == "low"
        assert f.evidence["sm_active"] is None and f.evidence["gpu_hours_masked"] is None
        assert f.evidence["signal"] == "tensor_active+dram_active"
        assert "DCGM_FI_PROF_SM_ACTIVE" in f.summary
    # The proxy does not flag compute-bound work either.
    compute = phases(60, (60, COMPUTE))
    assert IdleMasking().detect(fleet_of({k: v for k, v in compute.items() if k != "sm_active"} | OWNER)) == []


def test_unknown_util_is_never_masking() -> None:
    levels = phases(60, (60, MEMORY_BOUND))
    levels["gpu_util"] = [None] * 60
    assert IdleMasking().detect(fleet_of({**levels, **OWNER})) == []
    # ...unless DCGM's GR engine activity says a kernel was resident (MIG instances).
    assert len(IdleMasking().detect(fleet_of({**levels, "gr_active": 0.95, **OWNER}))) == 1


def test_stalled_gang_is_not_masking() -> None:
    """A collective spinning on a dead peer: util high, SM ~0.05, nothing moves."""
    stalled = {"gpu_util": 0.97, "sm_active": 0.05, "tensor_active": 0.0, "dram_active": 0.02}
    fleet = fleet_of({**phases(60, (60, stalled)), **OWNER})
    assert IdleMasking().detect(fleet) == []
    assert len(IdleMasking(stalled_sm=0.0).detect(fleet)) == 1  # the rule is what excludes it


def test_waiting_for_a_busy_peer_is_not_masking_but_a_uniformly_low_job_is() -> None:
    waiting = {"gpu_util": 0.97, "sm_active": 0.28, "tensor_active": 0.08, "dram_active": 0.15}
    straggler = {"gpu_util": 0.97, "sm_active": 0.7, "tensor_active": 0.2, "dram_active": 0.3}
    gang = {"job": "train", "namespace": "llm", "pod": "train-0"}
    fleet = fleet_of({**phases(60, (60, waiting)), **gang}, {**phases(60, (60, straggler)), **gang})
    assert IdleMasking().detect(fleet) == []
    # The same two devices in different jobs: nobody to wait for, so it is masking.
    fleet = fleet_of({**phases(60, (60, waiting)), **gang}, {**phases(60, (60, straggler)), **OWNER})
    assert [f.job for f in IdleMasking().detect(fleet)] == ["train"]


def test_open_episode_has_no_end() -> None:
    fleet = fleet_of({**phases(60, (20, COMPUTE), (40, MEMORY_BOUND)), **OWNER})
    (f,) = IdleMasking().detect(fleet)
    assert f.end is None and f.to_json()["end"] is None


# idle_allocated ----------------------------------------------------------------------------
def test_allocated_idle_gpu_is_idle_allocated() -> None:
    fleet = fleet_of({**phases(60, (10, COMPUTE), (40, IDLE), (10, COMPUTE)), **OWNER})
    (f,) = IdleAllocated().detect(fleet)
    assert f.kind == IDLE_ALLOCATED and f.confidence == "high"
    assert (f.start, f.end) == (T0 + 10 * STEP, T0 + 50 * STEP)
    assert (f.job, f.namespace, f.pod) == ("embed", "batch", "embed-0")
    assert f.evidence["gpu_hours_idle"] == pytest.approx(40 / 60)
    assert (f.evidence["pod"], f.evidence["namespace"], f.evidence["job"]) == ("embed-0", "batch", "embed")
    assert "batch/embed-0" in f.summary and "idle for 40 min" in f.summary and "release" in f.summary


@pytest.mark.parametrize("kind,levels,hours_key", [(IDLE_ALLOCATED, IDLE, "gpu_hours_idle"),
                                                    (IDLE_MASKING, MEMORY_BOUND, "gpu_hours")])
def test_serves_sliding_window_reports_the_whole_episode_not_its_last_30_minutes(kind: str, levels: dict,
                                                                                hours_key: str) -> None:
    """serve analyzes the last 30 minutes every minute: a notebook holding its GPU idle for 3 hours read "idle
    for 30 min (0.5 GPU-hours)", its start moving with the window (and its score, which grows with the hours,
    stayed at a half hour's). With the service's memory it reads as a whole-history analysis does; a GPU
    used in between starts a new episode."""
    gpu = {**phases(240, (10, COMPUTE), (190, levels), (5, COMPUTE), (35, levels)), **OWNER}
    fleet = fleet_of(gpu, steps=240)
    memory, detector = Memory(), make_detector(kind, {})
    shown = {}
    for cut in range(31, 241):  # serve running since before the episode began
        window = fleet.between(T0 + (cut - 30) * STEP, T0 + cut * STEP)
        shown[cut] = run_detectors(window, [kind], memory=memory)
        [alone] = detector.detect(window) if cut in (120, 199) else [None]
        if alone is not None:  # the window alone: its 30 minutes
            assert (alone.start, alone.evidence["minutes"]) == (window.start, 30.0)
    whole = detector.detect(fleet.between(T0, T0 + 199 * STEP))
    [f], [w] = shown[199], whole
    assert (f.start, f.evidence["minutes"]) == (w.start, w.evidence["minutes"]) == (T0 + 10 * STEP, 189.0)
    assert f.evidence[hours_key] == pytest.approx(w.evidence[hours_key]) and f.score == pytest.approx(w.score)
    assert "3.1 h" in f.summary and f.summary == w.summary
    [late] = shown[240]  # after the 5 busy minutes: a new episode
    assert late.start == T0 + 205 * STEP and late.evidence["minutes"] == 35.0


def test_unallocated_idle_gpu_is_capacity_not_a_finding() -> None:
    fleet = fleet_of(phases(60, (60, IDLE)))
    assert IdleAllocated().detect(fleet) == []
    half = ["embed"] * 20 + [None] * 40
    fleet = fleet_of({**phases(60, (60, IDLE)), "job": half, "namespace": "batch", "pod": "embed-0"})
    assert IdleAllocated().detect(fleet) == []  # only 20 min allocated
    assert len(IdleAllocated(min_duration_s=1200).detect(fleet)) == 1


def test_idle_allocated_needs_half_an_hour_and_thresholds_are_configurable() -> None:
    fleet = fleet_of({**phases(60, (25, IDLE), (35, COMPUTE)), **OWNER})
    assert IdleAllocated().detect(fleet) == []
    assert len(IdleAllocated(min_duration_s=20 * 60).detect(fleet)) == 1
    light = {"gpu_util": 0.08, "sm_active": 0.03, "tensor_active": 0.0, "dram_active": 0.01}
    fleet = fleet_of({**phases(60, (60, light)), **OWNER})
    assert IdleAllocated().detect(fleet) == []
    assert len(IdleAllocated(util_max=0.1).detect(fleet)) == 1


def test_unknown_telemetry_is_not_idle() -> None:
    fleet = fleet_of({"gpu_util": [None] * 60, "sm_active": [None] * 60, **OWNER})
    assert IdleAllocated().detect(fleet) == []
    assert IdleAllocated().detect(fleet_of(dict(OWNER))) == []  # no signal columns at all


def test_mig_instance_without_util_is_judged_by_sm_and_fallback_is_low_confidence() -> None:
    mig = {"gpu_instance": "3", "mig_profile": "1g.10gb", **OWNER}
    no_util = {**phases(60, (60, IDLE)), "gpu_util": [None] * 60}
    (f,) = IdleAllocated().detect(fleet_of({**no_util, **mig}))
    assert f.confidence == "high" and f.gpu_instance == "3"
    assert f.evidence["gpu_hours_idle"] == pytest.approx(1 / 7)
    assert "MIG instance 3" in f.summary
    only_proxy = {"tensor_active": 0.0, "dram_active": 0.002, **mig}
    (f,) = IdleAllocated().detect(fleet_of(only_proxy))
    assert f.confidence == "low"
    busy_proxy = {"tensor_active": 0.15, "dram_active": 0.3, **mig}
    assert IdleAllocated().detect(fleet_of(busy_proxy)) == []


def test_gpu_idled_by_an_xid_is_a_fault_not_waste() -> None:
    fleet = fleet_of({**phases(60, (20, COMPUTE), (40, IDLE)), **OWNER})
    assert len(IdleAllocated().detect(fleet)) == 1
    fleet.events = pd.DataFrame({"timestamp": [T0 + 19.5 * STEP], "hostname": ["node-a"], "gpu": ["0"],
                                 "uuid": ["GPU-node-a-0"], "xid": ["94"], "count": [1.0]})
    assert IdleAllocated().detect(fleet) == []
    fleet.events["gpu"] = ["1"]  # another GPU's XID changes nothing here
    assert len(IdleAllocated().detect(fleet)) == 1


def test_gpu_awaiting_a_reset_is_a_fault_not_waste_after_its_xid_left_the_window() -> None:
    # serve, 30 min after an XID 94 killed the process: the event is out of the window, the pending remap is not
    idle = {**phases(60, (60, IDLE)), **OWNER}
    assert len(IdleAllocated().detect(fleet_of(idle))) == 1
    assert IdleAllocated().detect(fleet_of({**idle, "row_remap_pending": [1.0] * 60})) == []
    # a remap pending for a few minutes of a long idle stretch does not hide the owner's waste
    assert len(IdleAllocated().detect(fleet_of({**idle, "row_remap_pending": [1.0] * 5 + [0.0] * 55}))) == 1


@pytest.mark.parametrize("shown, fault", [(94.0, True), (95.0, True), (48.0, True), (43.0, False), (0.0, False)])
def test_with_dcgm_default_counters_a_last_xid_still_shown_stands_in_for_the_pending_remap(shown: float,
                                                                                            fault: bool) -> None:
    """No remap-pending field in dcgm-exporter's default counters: its last-XID gauge still showing a memory
    fault that awaits a reset (no reset since: it would have restarted the exporter) makes the idle GPU the
    fault's; an application XID (43) or none (0) leaves the owner's waste; a gauge that turns to the code only
    near the end (a later XID, found by its event) does not hide the waste before it."""
    idle = {**phases(60, (60, IDLE)), **OWNER}
    found = IdleAllocated().detect(fleet_of({**idle, "last_xid": [shown] * 60}))
    assert (found == []) is fault
    assert len(IdleAllocated().detect(fleet_of({**idle, "last_xid": [0.0] * 50 + [shown] * 10}))) == 1


# runner ------------------------------------------------------------------------------------
def test_registry_has_both_detectors_behind_the_protocol() -> None:
    reg = load_detectors()
    assert {IDLE_MASKING, IDLE_ALLOCATED} <= set(reg)
    for kind in (IDLE_MASKING, IDLE_ALLOCATED):
        det = make_detector(kind)
        assert isinstance(det, Detector) and det.kind == kind


def test_bad_kind_or_setting_fails_loudly() -> None:
    fleet = fleet_of(dict(OWNER))
    with pytest.raises(ValueError, match="no detector"):
        run_detectors(fleet, ["nope"])
    with pytest.raises(ValueError, match="unknown setting"):
        run_detectors(fleet, [IDLE_MASKING], {IDLE_MASKING: {"sm_maxx": 0.2}})


def test_a_failing_detector_is_reported_and_the_others_still_run(monkeypatch: pytest.MonkeyPatch) -> None:
    @dataclass
    class Broken:
        kind = "broken_test_kind"

        def detect(self, fleet: Fleet) -> list[Finding]:
            raise RuntimeError("boom")

    load_detectors()
    monkeypatch.setitem(DETECTORS, "broken_test_kind", Broken)
    fleet = fleet_of({**phases(60, (60, MEMORY_BOUND)), **OWNER}, {**phases(60, (60, IDLE)), **OWNER})
    found = run_detectors(fleet, ["broken_test_kind", IDLE_MASKING, IDLE_ALLOCATED])
    assert sorted(f.kind for f in found) == [IDLE_ALLOCATED, IDLE_MASKING]
    assert any("broken_test_kind failed" in n and "boom" in n for n in fleet.notes)
    assert all(isinstance(f, Finding) for f in found)


def test_runner_default_runs_every_registered_kind() -> None:
    fleet = fleet_of({**phases(60, (60, MEMORY_BOUND)), **OWNER}, {**phases(60, (60, IDLE)), **OWNER})
    kinds = sorted({f.kind for f in run_detectors(fleet)})
    assert kinds == [IDLE_ALLOCATED, IDLE_MASKING]


def test_register_rejects_non_dataclasses_and_missing_kind() -> None:
    class NoKind:
        pass

    with pytest.raises(TypeError):
        register(NoKind)
    assert np.isfinite(IdleMasking().sm_max)
