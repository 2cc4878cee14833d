"""`truegpu report` end to end: a simulated history file in, FOCUS CSV / JSON / HTML out, clear errors."""

from __future__ import annotations

import csv
import io
import json
import subprocess
import sys
from pathlib import Path

import pytest

from analyzer.cli import report as report_cli
from analyzer.finops import costs, outputs
from exporter.simulator import Cluster, load_scenario
from exporter.simulator.history import write_history
from truegpu.cli import main

TRUEGPU = str(Path(sys.executable).with_name("truegpu"))
SCENARIO = "mixed-fleet"
STEP = 60.0
SPAN = 3600.0


@pytest.fixture(scope="module")
def history(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("history") / "truegpu.om"
    cluster = Cluster(load_scenario(SCENARIO))
    write_history(path, cluster, cluster.start, cluster.start + SPAN, STEP)
    return path


def report(capsys, *args: str) -> tuple[int, str, str]:
    rc = main(["report", "--quiet", *args])
    cap = capsys.readouterr()
    return rc, cap.out, cap.err


def test_csv_to_stdout_by_namespace(history, capsys):
    rc, out, err = report(capsys, "--input", str(history))
    assert rc == 0, err
    rows = list(csv.DictReader(io.StringIO(out)))
    assert list(rows[0]) == list(outputs.FOCUS_COLUMNS)
    groups = {r["x_Group"] for r in rows}
    assert {"llm", "serving", "batch", "notebooks", costs.UNALLOCATED} <= groups
    assert {r["x_GroupBy"] for r in rows} == {"namespace"}
    assert {r["BillingPeriodStart"] for r in rows} == {"2026-01-05T00:00:00Z"}
    assert {r["BillingPeriodEnd"] for r in rows} == {"2026-01-05T01:00:00Z"}  # window = the data
    total = sum(float(r["BilledCost"]) for r in rows)
    hours = sum(float(r["ConsumedQuantity"]) for r in rows)
    assert hours == pytest.approx(64.0, abs=1.5)  # 64 GPUs x 1 h (a GPU falls off the bus)
    assert 0 < total < 64 * 3.0
    nb = [r for r in rows if r["x_Group"] == "notebooks"]
    assert sum(float(r["x_WasteIdleAllocatedCost"]) for r in nb) > 0.9 * sum(float(r["BilledCost"]) for r in nb)


def test_json_and_html_files(history, capsys, tmp_path):
    out = tmp_path / "r.json"
    rc, stdout, err = report(capsys, "--input", str(history), "--format", "json", "--group-by", "workload",
                             "--out", str(out))
    assert rc == 0, err
    assert stdout == ""
    doc = json.loads(out.read_text())
    assert doc["group_by"] == "workload" and doc["schema"] == outputs.JSON_SCHEMA
    back = outputs.from_json(doc)
    assert back.totals["cost"] == pytest.approx(doc["totals"]["cost"])
    jobs = {g["group"] for g in doc["groups"]}
    assert {"embed-batch", "nb-alice", "pretrain-7b"} <= jobs
    # a directory for csv/json: the file goes inside it
    rc, _, err = report(capsys, "--input", str(history), "--out", str(tmp_path))
    assert rc == 0, err
    assert (tmp_path / "cost-report.csv").read_text().startswith("BillingAccountId,")
    rc, _, err = report(capsys, "--input", str(history), "--format", "html", "--group-by", "model",
                        "--out", str(tmp_path / "html"))
    assert rc == 0, err
    page = (tmp_path / "html" / outputs.HTML_NAME).read_text()
    assert "<svg" in page and "<script" not in page and "NVIDIA L40S" in page


def test_team_map_cluster_and_custom_prices(history, capsys, tmp_path):
    teams = tmp_path / "teams.yaml"
    teams.write_text("llm: research\nserving: product\n")
    rc, out, err = report(capsys, "--input", str(history), "--group-by", "team", "--team-map", str(teams),
                          "--format", "json")
    assert rc == 0, err
    groups = {g["group"] for g in json.loads(out)["groups"]}
    assert groups == {"research", "product", costs.UNMAPPED, costs.UNALLOCATED}
    rc, out, err = report(capsys, "--input", str(history), "--format", "json", "--cluster", "onprem-example")
    assert rc == 0, err
    onprem = json.loads(out)
    assert onprem["cluster"] == "onprem-example"
    rc, out, _ = report(capsys, "--input", str(history), "--format", "json")
    assert onprem["totals"]["cost"] < json.loads(out)["totals"]["cost"]
    # a catalog without the L40S: its hours are unpriced, said on stderr, and never billed as $0
    prices = tmp_path / "prices.yaml"
    prices.write_text("currency: EUR\nmodels:\n  - {key: H100, match: H100, price_per_gpu_hour: 2.5}\n")
    rc, out, err = report(capsys, "--input", str(history), "--prices", str(prices))
    assert rc == 0
    assert "NVIDIA L40S" in err and "unpriced" in err
    rows = list(csv.DictReader(io.StringIO(out)))
    l40s = [r for r in rows if r["x_GpuModel"] == "NVIDIA L40S"]
    assert l40s and all(r["BilledCost"] == "" and float(r["x_UnpricedGpuHours"]) > 0 for r in l40s)
    assert {r["BillingCurrency"] for r in rows} == {"EUR"}


def test_demo(capsys):
    rc, out, err = report(capsys, "--demo", "--format", "json", "--group-by", "workload")
    assert rc == 0, err
    doc = json.loads(out)
    assert doc["end_unix"] - doc["start_unix"] == 4 * 3600
    by = {g["group"]: g for g in doc["groups"]}
    assert by["embed-batch"]["masked_cost"] > 0.5 * by["embed-batch"]["cost"]
    assert by["pretrain-7b"]["straggler_cost"] > 0


@pytest.mark.parametrize("args, message", [
    ([], "exactly one of --prometheus URL, --input FILE"),
    (["--demo", "--prometheus", "http://127.0.0.1:1"], "exactly one of"),
    (["--demo", "--format", "html"], "--format html needs --out DIR"),
    (["--demo", "--window", "7d"], "--window applies to --prometheus"),
    (["--input", "/nonexistent/x.om"], "input file not found"),
    (["--demo", "--prices", "/nonexistent/p.yaml"], "cannot read price catalog"),
    (["--demo", "--cluster", "nope"], "no cluster 'nope'"),
    (["--demo", "--team-map", "/nonexistent/t.yaml"], "cannot read team map"),
])
def test_errors(capsys, args, message):
    rc, out, err = report(capsys, *args)
    assert rc == 2 and out == ""
    assert err.startswith("truegpu report: error:") and message in err


def test_html_out_must_be_a_directory(capsys, tmp_path):
    f = tmp_path / "file"
    f.write_text("x")
    rc, _, err = report(capsys, "--demo", "--format", "html", "--out", str(f))
    assert rc == 2 and "needs a directory" in err


@pytest.mark.parametrize("args", [["--group-by", "pod"], ["--format", "xml"], ["--window", "soon"],
                                  ["--team-label", "hostname"]])
def test_bad_values_are_argparse_errors(capsys, args):
    with pytest.raises(SystemExit) as exc:
        main(["report", "--demo", *args])
    assert exc.value.code == 2
    assert "truegpu report: error: argument" in capsys.readouterr().err


def test_unreachable_prometheus_is_a_clean_error(capsys):
    rc, _, err = report(capsys, "--prometheus", "http://127.0.0.1:9", "--window", "1h", "--timeout", "2")
    assert rc == 2 and err.startswith("truegpu report: error:")


def test_choices_match_the_library():
    assert report_cli.GROUP_BY_CHOICES == costs.GROUP_BY


def test_console_script_lists_and_runs_report(tmp_path):
    help_text = subprocess.run([TRUEGPU, "--help"], capture_output=True, text=True, check=True).stdout
    assert "report" in help_text
    # registering the command loads no pandas (the exporter shares the console script)
    code = ("import sys, argparse; from analyzer.cli import report as report_cli; "
            "report_cli.register(argparse.ArgumentParser().add_subparsers()); print('pandas' in sys.modules)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() \
        == "False"
