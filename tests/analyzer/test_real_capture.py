"""A real H200, read through `truegpu exporter --source nvml` (bench/real_gpu/capture.sh, 2026-11-28):
the analyzer on telemetry no simulator wrote.

Phases (bench/real_gpu/phases.py): 20 s idle, 60 s of bf16 matmuls (the card at its 700 W cap,
SW power cap clocking it to ~1.45 GHz of 1.98), 320 s of one thread spinning in one kernel
(NVML: 100 % utilization; GPM: SM activity 1/132), 20 s idle. No scheduler ran, so the GPU
is unallocated: the numbers below are the whole-fleet ones.
"""

from __future__ import annotations

import gzip
import json

import numpy as np
import pytest

from analyzer.analysis.scores import row_scores
from analyzer.data.load import load_files
from tests.conftest import ROOT
from tests.realprom import backfilled_prometheus
from truegpu.cli import main

CAPTURE = ROOT / "tests" / "fixtures" / "real" / "h200_nvml_phases.om.gz"
SMS = 132  # an H200's SMs: one busy SM is 1/132 of the chip


def analyze_json(capsys, *args: str) -> dict:
    assert main(["analyze", "--json", "--quiet", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.fixture(scope="module")
def scored():
    fleet = load_files(CAPTURE)
    return fleet, row_scores(fleet)


def test_the_capture_analyzes_with_no_false_finding_and_every_gap_named(capsys):
    out = analyze_json(capsys, "--input", str(CAPTURE))
    s = out["summary"]
    assert (s["gpus"], s["step_seconds"], s["dialect"], s["coverage"]["ratio"]) == (1, 5.0, "truegpu", 1.0)
    # A card at its power cap under a full matmul is working as designed: no thermal, degraded or fault page.
    assert out["findings"] == []
    # Reported 89 % (utilization counts the spin as busy); the work done was a ninth of that.
    assert 0.85 <= s["fleet_reported_util"] <= 0.93
    assert 0.08 <= s["fleet_effective_util"] <= 0.13
    # No scheduler: every GPU-hour is unallocated, none is lost to "unknown".
    assert s["parts"]["unallocated"] == pytest.approx(s["gpu_hours"]) and s["unknown_gpu_hours"] == 0
    # This VM's H200 has no NVLink: unknown and said so, never a zero that reads as "links down".
    assert {"nvlink_bps", "nvlink_links_down", "nvlink_error_rate"} <= set(s["missing"])
    assert any("no peer baseline" in n for n in s["input_notes"])  # one GPU: degraded_gpu gives no verdict


def test_utilization_hides_a_spinning_kernel_that_sm_activity_shows(scored):
    fleet, r = scored
    f = fleet.frame
    spin = (f["gpu_util"] >= 0.99).to_numpy() & (f["tensor_active"] == 0).to_numpy()
    assert spin.sum() * fleet.step >= 300  # the 320 s phase (less its edges)
    sm = f["sm_active"].to_numpy()[spin]
    np.testing.assert_allclose(sm, 1 / SMS, rtol=0.01)  # one SM of 132
    np.testing.assert_allclose(r["effective_util"].to_numpy()[spin], 1 / SMS, rtol=0.01)  # at full clock
    assert (r["masking_gap"].to_numpy()[spin] > 0.99).all()


def test_a_power_capped_matmul_is_busy_but_clocked_down(scored):
    fleet, r = scored
    f = fleet.frame
    mm = (f["tensor_active"] > 0.5).to_numpy()
    assert mm.sum() * fleet.step >= 50
    assert (f["power"].to_numpy()[mm] >= 0.97 * f["power_limit"].to_numpy()[mm]).all()
    assert (f["power_throttle"].to_numpy()[mm] == 1).all()
    # SM activity ~0.96, but at ~1.45 of 1.98 GHz: effective work ~0.7 of the chip, not 0.96.
    assert (f["sm_active"].to_numpy()[mm] > 0.94).all()
    assert (r["clock_ratio"].to_numpy()[mm] < 0.8).all()
    assert 0.65 <= float(np.mean(r["effective_util"].to_numpy()[mm])) <= 0.76


def test_the_capture_backfilled_into_prometheus_reads_the_same(tmp_path, capsys, promtool, prometheus_bin):
    """Real scrape times (5 s apart, a few ms late each) through Prometheus' lookback give the file's numbers."""
    from_file = analyze_json(capsys, "--input", str(CAPTURE))["summary"]
    plain = tmp_path / "capture.om"
    plain.write_bytes(gzip.decompress(CAPTURE.read_bytes()))
    window = ["--start", str(from_file["coverage"]["data_start"]), "--end", str(from_file["coverage"]["data_end"]),
              "--step", "5s"]
    with backfilled_prometheus(tmp_path, [plain], promtool, prometheus_bin) as url:
        out = analyze_json(capsys, "--prometheus", url, *window)
    s = out["summary"]
    assert out["findings"] == [] and s["gpus"] == 1 and s["coverage"]["ratio"] == 1.0
    for key in ("fleet_reported_util", "fleet_effective_util", "gpu_hours"):
        assert s[key] == pytest.approx(from_file[key], rel=1e-9), key
