"""Quiet partial failures (issue 12): error storms and power deficits on their scenarios, replayed the
way ``serve`` sees them (analysis over the data up to now, every minute) to measure time to detect."""

from __future__ import annotations

import dataclasses

import pytest

from analyzer.analysis.evaluate import evaluate_scenarios, matches, named_scenario_fleet
from analyzer.detectors import make_detector
from analyzer.findings import DEGRADED_GPU, GPU_FAULT


def minutes_to_detect(scenario: str, kind: str, minutes: range, dialect: str = "truegpu") -> dict[str, int | None]:
    """Per truth record of ``kind``: the first k in ``minutes`` at which the data up to onset + k finds it."""
    cluster, fleet = named_scenario_fleet(scenario, dialect, 60.0)
    ts = fleet.frame["timestamp"].to_numpy()
    out: dict[str, int | None] = {}
    for t in (t for t in cluster.ground_truth() if t["kind"] == kind):
        out[t["attribution"] + "@" + t["hostname"]] = None
        for k in minutes:
            end = float(t["start"]) + 60.0 * k
            cut = dataclasses.replace(fleet, frame=fleet.frame[ts <= end].reset_index(drop=True), end=end + 60.0,
                                      notes=[])
            if any(matches(f, t, cut.end) for f in make_detector(kind, {}).detect(cut)):
                out[t["attribution"] + "@" + t["hostname"]] = k
                break
    return out


def test_error_storms_are_found_within_ten_minutes_of_leaving_normal() -> None:
    ttd = minutes_to_detect("error-storms", GPU_FAULT, range(0, 11, 2))
    assert len(ttd) == 2 and all(k is not None and k <= 10 for k in ttd.values()), ttd


def test_power_deficit_is_found_once_it_has_lasted_the_minimum_duration() -> None:
    ttd = minutes_to_detect("power-deficit", DEGRADED_GPU, range(25, 41, 5))
    assert len(ttd) == 2 and all(k is not None and k <= 35 for k in ttd.values()), ttd


@pytest.mark.parametrize(("scenario", "kind"), [("error-storms", GPU_FAULT), ("power-deficit", DEGRADED_GPU)])
def test_dcgm_default_counters_never_give_a_wrong_finding(scenario: str, kind: str) -> None:
    """Without ECC/NVLink error fields the storms are unknown (said in the notes), never a false finding;
    the power deficit needs only power and activity, which the defaults have."""
    [r] = evaluate_scenarios([scenario], dialect="dcgm", step=60, kinds=[kind], dcgm_counters="default")
    k = r["kinds"][kind]
    assert k["precision"] == 1.0, k["false_findings"]
    if kind == GPU_FAULT:
        assert k["findings"] == 0
        assert any("ecc_correctable_rate" in n and "nvlink_error_rate" in n for n in r["notes"])
    else:
        assert k["recall"] == 1.0
