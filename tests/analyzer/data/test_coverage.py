"""Coverage: hours without data are unknown (never unallocated), a lost GPU's hours stay with its
workload while it lives, and every output adds up to capacity and says when a window is empty."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from analyzer.analysis.scores import compute_scores, fleet_summary
from analyzer.data.coverage import coverage, hold_allocations, observed_rows
from analyzer.data.ingest import read_openmetrics
from analyzer.data.normalize import normalize
from analyzer.finops.catalog import default_catalog
from analyzer.finops.costs import COMPONENTS, cost_report
from exporter.simulator.history import write_history
from exporter.simulator.model import Cluster
from exporter.simulator.scenario import load_scenario
from tests import fleets

NAN = math.nan
H = 15.0 / 3600.0  # GPU-hours of one 15 s row


def _fleet():
    # GPU 0: unallocated, reports only in the first two of six steps.
    # GPU 1: held by job j throughout, with data throughout.
    return fleets.make_fleet([
        {"gpu_util": [0.0, 0.0, NAN, NAN, NAN, NAN], "sm_active": [0.0, 0.0, NAN, NAN, NAN, NAN]},
        {"job": "j", "namespace": "ns", "gpu_util": 0.9, "sm_active": 0.5},
    ], steps=6)


def test_hours_without_data_are_unknown_never_unallocated() -> None:
    fleet = _fleet()
    scores = compute_scores(fleet)
    f = scores.levels["fleet"].iloc[0]
    assert f["gpu_hours"] == pytest.approx(12 * H)
    assert f["unallocated_gpu_hours"] == pytest.approx(2 * H)
    assert f["unknown_gpu_hours"] == pytest.approx(4 * H)
    s = fleet_summary(scores)
    parts = s["effective_gpu_hours"] + s["unused_gpu_hours"] + s["unknown_gpu_hours"] + s["unallocated_gpu_hours"]
    assert parts == pytest.approx(s["gpu_hours"])
    assert s["coverage"]["ratio"] == pytest.approx(8 / 12)
    report = cost_report(fleet, scores, [], default_catalog())
    t = report.totals
    assert t["unknown_gpu_hours"] == pytest.approx(4 * H)
    assert t["unallocated_gpu_hours"] == pytest.approx(2 * H)
    assert sum(t[f"{c}_gpu_hours"] for c in COMPONENTS) == pytest.approx(t["gpu_hours"])
    assert sum(t[f"{c}_cost"] for c in COMPONENTS) == pytest.approx(t["cost"])


def test_lost_gpu_stays_with_its_workload_while_the_workload_lives() -> None:
    lost = [0.9, 0.9, NAN, NAN, NAN, NAN]
    fleet = fleets.make_fleet([
        # j runs on two GPUs; GPU 0 is lost after step 1, GPU 1 goes on to the end.
        {"job": ["j", "j", None, None, None, None], "gpu_util": lost, "sm_active": lost},
        {"job": "j", "gpu_util": 0.9, "sm_active": 0.5},
        # k runs on one GPU only, lost after step 1: k is gone with it.
        {"job": ["k", "k", None, None, None, None], "gpu_util": lost, "sm_active": lost},
        # m's GPU has a gap at steps 2-3 and comes back with m.
        {"job": ["m", "m", None, None, "m", "m"], "gpu_util": [0.9, 0.9, NAN, NAN, 0.9, 0.9],
         "sm_active": [0.5, 0.5, NAN, NAN, 0.5, 0.5]},
    ], steps=6)
    held = hold_allocations(fleet.frame)
    job = held["job"].astype(object).to_numpy().reshape(4, 6)
    assert list(job[0]) == ["j"] * 6
    assert [v if isinstance(v, str) else None for v in job[2]] == ["k", "k", None, None, None, None]
    assert list(job[3]) == ["m"] * 6
    fleet.frame = held
    scores = compute_scores(fleet)
    jobs = scores.levels["job"].set_index("job")
    assert jobs.loc["j", "unknown_gpu_hours"] == pytest.approx(4 * H)
    assert jobs.loc["m", "unknown_gpu_hours"] == pytest.approx(2 * H)
    f = scores.levels["fleet"].iloc[0]
    assert f["unallocated_gpu_hours"] == 0.0
    assert f["unknown_gpu_hours"] == pytest.approx(10 * H)


def test_unsorted_or_fully_observed_frames_are_left_alone() -> None:
    fleet = fleets.make_fleet([{"job": "j", "gpu_util": 0.5}], steps=3)
    assert hold_allocations(fleet.frame) is fleet.frame
    assert observed_rows(fleet.frame).all()


@pytest.fixture(scope="module")
def hour_of_data(tmp_path_factory):
    """One hour of the healthy fleet at 60 s, written and read back like a user's file."""
    cluster = Cluster(load_scenario("idle-waste"))
    start = cluster.start
    path = tmp_path_factory.mktemp("cov") / "one-hour.om"
    write_history(path, cluster, start, start + 3600 + 60, 60.0)
    long, report = read_openmetrics(path)
    return long, report, start


def test_window_two_thirds_empty_puts_those_hours_in_unknown(hour_of_data) -> None:
    long, report, start = hour_of_data
    data_only = normalize(long, start=start, end=start + 3600, step=60.0, report=report)
    padded = normalize(long, start=start - 3600, end=start + 7200, step=60.0, report=report)
    a, b = compute_scores(data_only), compute_scores(padded)
    ra = cost_report(data_only, a, [], default_catalog()).totals
    rb = cost_report(padded, b, [], default_catalog()).totals
    n_gpus = data_only.frame["uuid"].nunique()
    assert rb["gpu_hours"] == pytest.approx(3 * ra["gpu_hours"])
    # Within one step: the extra history sample at start+3600 gives the padded window one more row.
    one_step = n_gpus * 60 / 3600 + 1e-9  # + float rounding: the bound is exactly one step
    assert rb["unallocated_gpu_hours"] == pytest.approx(ra["unallocated_gpu_hours"], abs=one_step)
    assert rb["unknown_gpu_hours"] >= 2 * ra["gpu_hours"] - one_step
    assert b.coverage.ratio == pytest.approx(1 / 3, abs=0.02)
    message = b.coverage.message()
    assert message is not None and "of this window has data" in message
    assert "33%" in message or "34%" in message
    assert message in b.notes
    s = fleet_summary(b)
    assert s["effective_gpu_hours"] + s["unused_gpu_hours"] + s["unknown_gpu_hours"] + \
        s["unallocated_gpu_hours"] == pytest.approx(s["gpu_hours"])
    json.dumps(s, allow_nan=False)


def test_window_outside_the_data_is_all_unknown(hour_of_data) -> None:
    long, report, start = hour_of_data
    fleet = normalize(long, start=start + 86400, end=start + 90000, step=60.0, report=report)
    s = fleet_summary(compute_scores(fleet))
    assert s["unknown_gpu_hours"] == pytest.approx(s["gpu_hours"])
    assert s["unallocated_gpu_hours"] == 0.0 and s["allocated_gpu_hours"] == 0.0
    assert s["coverage"]["ratio"] == 0.0 and s["coverage"]["data_start"] is None
    assert "0% of this window has data" in s["notes"][0]


def test_coverage_of_an_empty_frame() -> None:
    fleet = fleets.make_fleet([{"gpu_util": 0.5}], steps=2)
    empty = fleet.frame.iloc[:0]
    c = coverage(empty, 15.0, np.zeros(0, bool))
    assert c.ratio is None and c.message() is None


def test_html_pages_show_coverage(hour_of_data, tmp_path) -> None:
    from analyzer.finops import outputs
    from analyzer.report import write_report
    from analyzer.report.html import fmt_pct

    long, report, start = hour_of_data
    fleet = normalize(long, start=start - 3600, end=start + 7200, step=60.0, report=report)
    scores = compute_scores(fleet)
    page = write_report(tmp_path / "r", fleet, scores, []).read_text()
    assert "Data coverage" in page and fmt_pct(scores.coverage.ratio) in page
    assert "of this window has data" in page  # the mostly-empty sentence, among the notes
    cost_page = outputs.render_html(cost_report(fleet, scores, [], default_catalog()))
    assert "data coverage " + fmt_pct(scores.coverage.ratio) in cost_page and "of this window has data" in cost_page


def test_a_coarse_step_counts_only_the_covered_part_of_the_edge_row(hour_of_data) -> None:
    """Samples every 60 s over 0..60 min (61 of them), read at a 7-minute step: 9 rows span 63 minutes,
    the last one [56, 63) holds 5 samples. 61 of the 63 minutes have data; the other 2 are unknown."""
    long, report, start = hour_of_data
    fleet = normalize(long, start=start, step=420.0, report=report)
    s = fleet_summary(compute_scores(fleet))
    n = fleet.frame["uuid"].nunique()
    assert s["gpu_hours"] == pytest.approx(n * 63 / 60)
    assert s["coverage"]["observed_gpu_hours"] == pytest.approx(n * 61 / 60)
    assert s["unknown_gpu_hours"] == pytest.approx(n * 2 / 60, abs=1e-9)
    parts = s["effective_gpu_hours"] + s["unused_gpu_hours"] + s["unknown_gpu_hours"] + s["unallocated_gpu_hours"]
    assert parts == pytest.approx(s["gpu_hours"])
    totals = cost_report(fleet, compute_scores(fleet), [], default_catalog()).totals
    assert totals["unknown_gpu_hours"] == pytest.approx(n * 2 / 60, abs=1e-9)
    assert sum(totals[f"{c}_gpu_hours"] for c in COMPONENTS) == pytest.approx(totals["gpu_hours"])
