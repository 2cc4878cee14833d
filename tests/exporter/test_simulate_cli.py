"""``truegpu simulate``: files written, ground truth, summary, argument errors."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from exporter.timeparse import parse_positive_duration as parse_duration
from exporter.timeparse import parse_time
from truegpu.cli import main

SCENARIO = "mixed-fleet"


def test_parse_duration():
    assert parse_duration("90s") == 90
    assert parse_duration("15m") == 900
    assert parse_duration("2h") == 7200
    assert parse_duration("1d") == 86400
    assert parse_duration("1h30m") == 5400
    assert parse_duration("500ms") == 0.5
    assert parse_duration("30") == 30
    for bad in ("", "2x", "h", "-5m", "0s", "1h 2", "abc"):
        with pytest.raises(ValueError, match="bad duration"):
            parse_duration(bad)


def test_parse_time():
    assert parse_time("1700000000") == 1_700_000_000
    assert parse_time("2023-11-14T22:13:20Z") == 1_700_000_000
    assert parse_time("2023-11-14T22:13:20") == 1_700_000_000  # no zone: UTC
    assert parse_time("2023-11-15T00:13:20+02:00") == 1_700_000_000
    with pytest.raises(ValueError, match="bad time"):
        parse_time("yesterday")


def test_simulate_in_process(tmp_path, capsys):
    from exporter.simulator.model import Cluster
    from exporter.simulator.scenario import load_scenario

    out = tmp_path / "run"
    rc = main(
        ["simulate", "--scenario", SCENARIO, "--duration", "30m", "--step", "60s", "--seed", "11",
         "--start", "2024-05-01T00:00:00Z", "--out", str(out)]
    )  # fmt: skip
    assert rc == 0
    stdout = capsys.readouterr().out
    om = (out / "metrics.om").read_text()
    assert om.startswith("# TYPE truegpu_") and om.endswith("# EOF\n")
    start = 1_714_521_600.0
    stamps = {float(line.rsplit(" ", 1)[1]) for line in om.splitlines() if not line.startswith("#")}
    assert min(stamps) == start and max(stamps) == start + 29 * 60 and len(stamps) == 30

    meta = json.loads((out / "scenario.json").read_text())
    assert meta["name"] == SCENARIO and meta["seed"] == 11 and meta["dialect"] == "truegpu"
    assert (meta["start"], meta["duration"], meta["step"]) == (start, 1800.0, 60.0)

    truth = json.loads((out / "ground_truth.json").read_text())
    window_end = start + 1800.0
    cluster = Cluster(load_scenario(SCENARIO), seed=11, start=start)
    expected = [r for r in cluster.ground_truth() if r["start"] < window_end]
    assert len(truth) == len(expected) > 0
    for got, want in zip(truth, expected, strict=True):
        for key, value in want.items():
            if key == "end" and value is not None and value >= window_end:
                assert got["end"] is None and got["end_iso"] is None  # still open when the data ends
            elif key in ("start", "end") and value is not None:
                assert got[key] == pytest.approx(float(value))
                assert got[key + "_iso"].endswith("Z")
            else:
                assert got[key] == value

    assert "GPUs" in stdout and "allocated" in stdout and "SM active" in stdout and "tensor" in stdout
    for rec in expected:
        assert rec["kind"] in stdout


def test_summary_numbers_match_the_model(tmp_path, capsys):
    from exporter.simulator.cli import fleet_stats
    from exporter.simulator.model import Cluster
    from exporter.simulator.scenario import load_scenario

    cluster = Cluster(load_scenario(SCENARIO), seed=5)
    times = cluster.start + np.arange(0, 3600, 60.0)
    stats = fleet_stats(cluster, times)
    n = len(cluster.gpus.hostname)
    assert stats["gpus"] == n
    assert stats["nodes"] == len(set(cluster.gpus.hostname))
    assert 0.0 <= stats["allocated_share"] <= 1.0
    busy = stats["busy"]
    # GPU util overstates SM activity, which overstates tensor activity, on busy GPUs
    assert busy["gpu_util"] >= busy["sm_active"] >= busy["tensor_active"]


def test_dcgm_dialect_and_gzip(tmp_path, capsys):
    import gzip

    out = tmp_path / "dcgm"
    rc = main(["simulate", "--scenario", SCENARIO, "--duration", "10m", "--out", str(out), "--dialect", "dcgm",
               "--dcgm-counters", "all", "--gzip"])  # fmt: skip
    assert rc == 0
    with gzip.open(out / "metrics.om.gz", "rt") as f:
        text = f.read()
    assert "DCGM_FI_PROF_SM_ACTIVE{" in text and not re.search(r"^(# \w+ )?truegpu_", text, re.M)
    assert json.loads((out / "scenario.json").read_text())["dialect"] == "dcgm"


def test_list(capsys):
    from exporter.simulator.scenario import list_scenarios

    assert main(["simulate", "--list"]) == 0
    stdout = capsys.readouterr().out
    for name in list_scenarios():
        assert name in stdout
    assert SCENARIO in stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--duration", "2x"], "bad duration '2x'"),
        (["--step", "0s"], "must be greater than zero"),
        (["--start", "soon"], "bad time 'soon'"),
        (["--dialect", "nvml"], "invalid choice"),
    ],
)
def test_bad_values_exit_nonzero_with_a_clear_error(tmp_path, capsys, args, message):
    with pytest.raises(SystemExit) as exc:
        main(["simulate", "--scenario", SCENARIO, "--out", str(tmp_path), *args])
    assert exc.value.code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "metrics.om").exists()


def test_unknown_scenario_and_missing_out(tmp_path, capsys):
    assert main(["simulate", "--scenario", "no-such-scenario", "--out", str(tmp_path)]) == 2
    assert "no-such-scenario" in capsys.readouterr().err
    assert main(["simulate", "--scenario", SCENARIO]) == 2
    assert "--out" in capsys.readouterr().err


def test_subprocess(tmp_path):
    out = tmp_path / "sub"
    proc = subprocess.run(
        [sys.executable, "-m", "truegpu", "simulate", "--scenario", SCENARIO, "--duration", "5m", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stderr
    assert "GPUs" in proc.stdout
    assert {p.name for p in out.iterdir()} == {"metrics.om", "ground_truth.json", "scenario.json"}
    bad = subprocess.run(
        [sys.executable, "-m", "truegpu", "simulate", "--duration", "forever", "--out", str(out)],
        capture_output=True,
        text=True,
    )
    assert bad.returncode == 2
    assert "bad duration 'forever'" in bad.stderr


def test_the_scenario_s_mess_is_written(tmp_path, capsys):
    """A scenario's ``mess:`` (here a whole-node scrape gap) reaches the history file, as evaluate writes it."""
    scenario = tmp_path / "gap.yaml"
    scenario.write_text(
        "name: gap\ndescription: a node gap\nseed: 3\nduration: 30m\n"
        "topology: {sites: [dc1], racks_per_site: 1, nodes_per_rack: 2, model: H100}\n"
        "workloads: [{name: train, kind: training, namespace: ml, nodes: 2}]\n"
        "mess: {node_gaps: [{host: dc1-r1-n01, start: 10m, duration: 5m}]}\n")
    out = tmp_path / "out"
    assert main(["simulate", "--scenario", str(scenario), "--step", "60s", "--out", str(out)]) == 0
    capsys.readouterr()
    util = [line for line in (out / "metrics.om").read_text().splitlines()
            if line.startswith("truegpu_gpu_utilization_ratio{") and 'gpu="0"' in line]
    per_host = {h: sum(f'hostname="{h}"' in line for line in util) for h in ("dc1-r1-n01", "dc1-r1-n02")}
    assert per_host == {"dc1-r1-n01": 25, "dc1-r1-n02": 30}  # 5 of 30 one-minute scrapes missing on the gapped node
