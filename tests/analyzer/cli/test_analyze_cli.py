"""`truegpu analyze` and `truegpu demo` end to end: files, a real Prometheus, bad input."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.findings import IDLE_ALLOCATED, IDLE_MASKING
from exporter.simulator import Cluster, load_scenario
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import write_history
from tests.conftest import ROOT, free_port
from tests.realprom import backfilled_prometheus
from truegpu.cli import main

TRUEGPU = str(Path(sys.executable).with_name("truegpu"))
SCENARIO = "mixed-fleet"
STEP = 60.0
SPAN = 3600.0


def truth_devices(kind: str) -> set[tuple[str, int]]:
    return {(t["hostname"], int(t["gpu"])) for t in Cluster(load_scenario(SCENARIO)).ground_truth()
            if t["kind"] == kind}


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> dict[str, Path]:
    tmp = tmp_path_factory.mktemp("history")
    cluster = Cluster(load_scenario(SCENARIO))
    files = {"truegpu": tmp / "truegpu.om", "dcgm": tmp / "dcgm.om.gz"}
    write_history(files["truegpu"], cluster, cluster.start, cluster.start + SPAN, STEP)
    write_history(files["dcgm"], cluster, cluster.start, cluster.start + SPAN, STEP, dialect="dcgm",
                  dcgm_options=DcgmOptions(counters="default"))
    return files


def analyze_json(capsys, *args: str) -> dict:
    assert main(["analyze", "--json", "--quiet", *args]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("dialect", ["truegpu", "dcgm"])
def test_analyze_files_json(history, capsys, dialect):
    out = analyze_json(capsys, "--input", str(history[dialect]))
    s = out["summary"]
    assert s["dialect"] == dialect and s["gpus"] == 64 and s["step_seconds"] == STEP
    assert s["start"] == "2026-01-05T00:00:00Z"
    assert 0 < s["effective_util"] < s["reported_util"] <= 1  # masking: effective below reported
    found = {(f["kind"], f["hostname"], f["gpu"]) for f in out["findings"]}
    for kind in (IDLE_MASKING, IDLE_ALLOCATED):
        assert {(kind, h, g) for h, g in truth_devices(kind)} <= found
    for f in out["findings"]:
        assert f["start"].endswith("Z") and (f["gpu"] is None or isinstance(f["gpu"], int))
        if f["kind"] in (IDLE_MASKING, IDLE_ALLOCATED):
            assert isinstance(f["gpu"], int) and f["end"] is None  # both problems outlast the analyzed hour
    if dialect == "dcgm":  # default dcgm-exporter counters: SM activity is not collected
        assert "DCGM_FI_PROF_SM_ACTIVE" in s["missing"]["sm_active"]
        assert {f["confidence"] for f in out["findings"] if f["kind"] == IDLE_MASKING} == {"low"}


def test_analyze_table_and_report(history, tmp_path, capsys):
    assert main(["analyze", "--input", str(history["truegpu"]), "--report", str(tmp_path / "r")]) == 0
    captured = capsys.readouterr()
    assert "reported utilization" in captured.out and "idle_masking" in captured.out
    assert "scoring" in captured.err  # progress goes to stderr, never into the table/JSON
    assert (tmp_path / "r" / "index.html").read_text().startswith("<!DOCTYPE html>")


def test_analyze_prometheus(history, tmp_path, capsys, promtool, prometheus_bin):
    cluster = Cluster(load_scenario(SCENARIO))
    with backfilled_prometheus(tmp_path, [history["truegpu"]], promtool, prometheus_bin) as url:
        out = analyze_json(capsys, "--prometheus", url, "--start", str(cluster.start),
                           "--end", str(cluster.start + SPAN), "--step", "60s")
        narrowed = analyze_json(capsys, "--prometheus", url, "--start", str(cluster.start),
                                "--end", str(cluster.start + SPAN), "--matcher", "hostname=dc1-r2-n02")
    assert out["summary"]["gpus"] == 64
    kinds = {(f["kind"], f["hostname"], f["gpu"]) for f in out["findings"]}
    assert {(IDLE_ALLOCATED, h, g) for h, g in truth_devices(IDLE_ALLOCATED)} <= kinds
    assert narrowed["summary"]["gpus"] == 8 and {f["hostname"] for f in narrowed["findings"]} == {"dc1-r2-n02"}


@pytest.mark.parametrize(
    ("args", "needle"),
    [
        (["--input", "/nonexistent/x.om"], "input file not found: /nonexistent/x.om"),
        ([], "give either --input FILE"),
        (["--prometheus", "http://127.0.0.1:{port}", "--start", "now-1h"], "127.0.0.1:{port}"),
        (["--prometheus", "localhost:9090"], "must start with http://"),
        (["--input", "x.om", "--start", "yesterday"], "bad time 'yesterday'"),
        (["--input", "{garbage}"], "no GPU telemetry in"),
    ],
)
def test_bad_input_fails_clearly(tmp_path, args, needle):
    garbage = tmp_path / "garbage.om"
    garbage.write_text("this is not\nopenmetrics\n")
    port = str(free_port())
    args = [a.format(port=port, garbage=garbage) for a in args]
    proc = subprocess.run([TRUEGPU, "analyze", "--quiet", *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert needle.format(port=port) in proc.stderr
    assert "Traceback" not in proc.stderr


def test_demo_prints_summary_findings_and_writes_report(tmp_path):
    proc = subprocess.run([TRUEGPU, "demo", "--out", str(tmp_path / "report")], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "effective" in proc.stdout and "idle_allocated" in proc.stdout and "idle_masking" in proc.stdout
    assert (tmp_path / "report" / "index.html").is_file()


def test_evaluate_cli_gates_and_json(capsys):
    args = ["evaluate", "--scenario", "idle-waste", "--dialect", "truegpu", "--kinds", "idle_masking,idle_allocated"]
    assert main([*args, "--min-precision", "0.95", "--min-recall", "0.95"]) == 0
    table = capsys.readouterr().out
    assert "idle-waste" in table and "pooled over scenarios" in table
    assert main([*args, "--json"]) == 0
    pooled = {(p["dialect"], p["kind"]): p for p in json.loads(capsys.readouterr().out)["pooled"]}
    assert pooled[("truegpu", IDLE_MASKING)]["truth"] == 8 and pooled[("truegpu", IDLE_MASKING)]["recall"] == 1.0
    # a gate nothing can pass fails the run: the exit code is what CI reads
    assert main([*args, "--min-precision", "1.01"]) == 1
    assert main(["evaluate", "--kinds", "psychic"]) == 2
    assert "unknown kind(s) psychic" in capsys.readouterr().err


@pytest.mark.parametrize("step", [15.0, 60.0])
def test_file_and_prometheus_agree_on_totals_and_open_episodes(tmp_path, capsys, promtool, prometheus_bin, step):
    """The same [start, end) read from a file and from a real Prometheus: identical totals and findings,
    and the straggler episode still going at the window's end stays open (end null) at either step."""
    cluster = Cluster(load_scenario(SCENARIO))
    t0, span = cluster.start + 5400.0, 1800.0  # inside the thermal straggler (40m .. 2h40m)
    path = tmp_path / "h.om"
    write_history(path, cluster, t0, t0 + span + step, step)
    window = ["--start", str(t0), "--end", str(t0 + span), "--step", f"{step:g}s"]
    from_file = analyze_json(capsys, "--input", str(path), *window)
    with backfilled_prometheus(tmp_path, [path], promtool, prometheus_bin) as url:
        from_prom = analyze_json(capsys, "--prometheus", url, *window)
    keys = ("gpu_hours", "allocated_gpu_hours", "effective_gpu_hours", "unused_gpu_hours", "waste_gpu_hours",
            "normal_gpu_hours", "unclassified_gpu_hours", "unknown_gpu_hours", "unallocated_gpu_hours")
    assert [from_file["summary"][k] for k in keys] == pytest.approx([from_prom["summary"][k] for k in keys])
    assert from_file["findings"] == from_prom["findings"]
    stragglers = [f for f in from_file["findings"] if f["kind"] == "straggler"]
    assert stragglers and all(f["end"] is None for f in stragglers)


def test_evaluate_replay_cli_reports_time_to_detect(capsys):
    args = ["evaluate", "--replay", "--scenario", "thermal-straggler", "--dialect", "truegpu", "--kinds", "thermal",
            "--interval", "5m"]
    assert main(args) == 0
    table = capsys.readouterr().out
    assert "ttd p95 s" in table and "a run every 300s over the last 1800s" in table
    assert main([*args, "--json", "--seeds", "2"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(r["scenario"], r["cuts"]) for r in doc["results"]] == [("thermal-straggler", 36)] * 2
    assert doc["results"][0]["seed"] != doc["results"][1]["seed"]
    (thermal,) = doc["pooled"]
    assert thermal["truth"] == 2 and 0 < thermal["ttd_p95_s"] <= 300  # found by the first run after the onset
    assert main(["evaluate", "--window", "10m"]) == 2
    assert "--interval and --window go with --replay" in capsys.readouterr().err


def test_evaluate_dcgm_counters_choose_the_fields_the_dcgm_history_carries(capsys):
    """NVLink error counters are not in dcgm-exporter's default set: with it the NVLink fault is unobservable,
    counted apart with the counters to enable (and the result says which counter set it was judged on), with
    every field it is found; replay passes it too."""
    args = ["evaluate", "--scenario", "nvlink-errors", "--dialect", "dcgm", "--kinds", "gpu_fault", "--json"]
    counts = {}
    for counters in ("all", "default"):
        assert main([*args, "--dcgm-counters", counters]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert [r["dcgm_counters"] for r in doc["results"]] == [counters]
        counts[counters] = tuple(doc["pooled"][0][k] for k in ("truth", "detected", "unobservable"))
    assert counts == {"all": (1, 1, 0), "default": (0, 0, 1)}
    (why,) = [t["unobservable"] for t in doc["results"][0]["kinds"]["gpu_fault"]["unobservable_truth"]]
    assert "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL" in why and "commented out in the default list" in why
    assert main([*args[:-1], "--dcgm-counters", "default"]) == 0
    assert "0/0 problems found; 1 more the input cannot show" in capsys.readouterr().out
    assert main([*args, "--dcgm-counters", "default", "--replay", "--interval", "30m"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["results"][0]["dcgm_counters"] == "default"
    assert (doc["pooled"][0]["detected"], doc["pooled"][0]["unobservable"]) == (0, 1)
    with pytest.raises(SystemExit):
        main([*args, "--dcgm-counters", "some"])
    assert "invalid choice" in capsys.readouterr().err


def test_evaluate_help_documents_the_dcgm_counter_set(capsys):
    with pytest.raises(SystemExit):
        main(["evaluate", "--help"])
    assert "--dcgm-counters {all,default}" in capsys.readouterr().out
