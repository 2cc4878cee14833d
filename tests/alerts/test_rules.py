"""Generated Prometheus rules: drift, real promtool check/test, contract names, runbooks, scaling."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

import alerts
from alerts import GENERATED, ROOT, RUNBOOKS, TESTS, committed_files, generate
from alerts.rules import SEVERITIES, TEAMS, Timing, fmt_duration, keep_cluster, record_names, rule_files
from alerts.unittests import test_files as unit_test_files
from analyzer import output_schema as O
from analyzer.site import parse_site
from exporter import schema as S

RULE_FILES = ("truegpu.yaml", "dcgm.yaml", "analyzer.yaml")


def _run(cmd: list[str], cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=120)


def _load(path: Path) -> dict:
    return yaml.safe_load(path.read_text())


def _alerts(name: str) -> list[dict]:
    return [r for g in _load(GENERATED / name)["groups"] for r in g["rules"] if "alert" in r]


def test_committed_files_match_the_generator():
    stale = [str(p) for p, text in committed_files().items() if not p.exists() or p.read_text() != text]
    assert not stale, f"regenerate with `python -m alerts`: {stale}"
    assert {p.name for p in GENERATED.glob("*.yaml")} == set(RULE_FILES)


def test_promtool_check_rules(promtool):
    out = _run([promtool, "check", "rules", *(str(GENERATED / f) for f in RULE_FILES)])
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


@pytest.mark.parametrize("test_file", sorted(unit_test_files()))
def test_promtool_unit_tests_pass(promtool, test_file):
    out = _run([promtool, "test", "rules", test_file], cwd=TESTS)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout


def test_every_alert_has_a_firing_and_a_quiet_case():
    for rule_file in RULE_FILES:
        test_file = TESTS / rule_file.replace(".yaml", "_test.yaml")
        checks = [c for t in _load(test_file)["tests"] for c in t.get("alert_rule_test", [])]
        for rule in _alerts(rule_file):
            name, severity = rule["alert"], rule["labels"]["severity"]
            mine = [c for c in checks if c["alertname"] == name]
            assert any(not c.get("exp_alerts") for c in mine), f"{rule_file} {name}: no case where it must not fire"
            fired = [a for c in mine for a in c.get("exp_alerts") or []]
            assert any(a["exp_labels"]["severity"] == severity for a in fired), \
                f"{rule_file} {name} ({severity}): no case where it fires"
            assert all(a.get("exp_annotations") for a in fired), f"{name}: firing case without annotations"


def test_recording_rules_are_all_checked_by_value():
    checked = {
        e["expr"] for f in RULE_FILES for t in _load(TESTS / f.replace(".yaml", "_test.yaml"))["tests"]
        for e in t.get("promql_expr_test", []) if e["exp_samples"]
    }
    assert set(record_names()) <= checked, set(record_names()) - checked


def _mutated_run(promtool: str, tmp_path: Path, rule_file: str, old: str, new: str,
                 test_file: str | None = None) -> subprocess.CompletedProcess:
    shutil.copytree(GENERATED, tmp_path / "generated")
    shutil.copytree(TESTS, tmp_path / "tests")
    path = tmp_path / "generated" / rule_file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return _run([promtool, "test", "rules", test_file or rule_file.replace(".yaml", "_test.yaml")],
                cwd=tmp_path / "tests")


def test_unit_tests_catch_a_pcie_alert_that_ignores_idleness(promtool, tmp_path):
    key = "cluster, hostname, gpu, uuid"
    busy = f" and on ({key}) (max by ({key}) (truegpu_gpu_utilization_ratio) > 0.2)"
    out = _mutated_run(promtool, tmp_path, "truegpu.yaml", busy, "")
    assert out.returncode != 0 and "GpuPcieLinkDowngraded" in out.stdout + out.stderr


def test_unit_tests_catch_an_application_xid_paged_as_critical(promtool, tmp_path):
    xid = '{__name__=~"DCGM_FI_DEV_XID_ERRORS|dcgm_fi_dev_xid_errors|dcgm_xid_errors"}'
    out = _mutated_run(promtool, tmp_path, "dcgm.yaml", f"{xid} == 140)", f"{xid} == 140 or {xid} == 13)")
    assert out.returncode != 0 and "GpuXidError" in out.stdout + out.stderr


@pytest.mark.parametrize("test_file", [f for f in sorted(unit_test_files()) if f.startswith("dcgm")])
def test_dcgm_fell_off_bus_needs_the_node_up_on_every_spelling(promtool, tmp_path, test_file):
    """Without "its node still reports", a node or exporter gone pages every GPU on it (the old
    ``on (Hostname)`` rule did this on hostname data): each spelling's suite must catch it."""
    text = (GENERATED / "dcgm.yaml").read_text()
    clause = text[text.index(" and on (cluster, hostname) (count by (cluster, hostname)"):]
    clause = clause[:clause.index("\n")]
    out = _mutated_run(promtool, tmp_path, "dcgm.yaml", clause, "", test_file)
    assert out.returncode != 0 and "GpuFellOffBus" in out.stdout + out.stderr


def test_unit_tests_catch_a_fell_off_bus_alert_for_a_whole_node(promtool, tmp_path):
    out = _mutated_run(promtool, tmp_path, "truegpu.yaml", " and on (cluster, hostname) truegpu_node_info", "")
    assert out.returncode != 0 and "GpuFellOffBus" in out.stdout + out.stderr


def test_alert_severities_follow_the_analyzer_findings():
    """Every finding kind with an alert has one per severity of its findings: a problem the analyzer calls
    critical is never a ticket-only warning, nor one it calls info (a suspect) a ticket."""
    kinds: dict[str, set[str]] = {}
    for rule in _alerts("analyzer.yaml"):
        match = re.search(r'kind="([a-z_]+)", severity(!?=)"([a-z]+)"', rule["expr"])
        if match:
            kind, op, severity = match.groups()
            kinds.setdefault(kind, set()).add(f"{op}{severity}->{rule['labels']['severity']}")
    assert set(kinds) == {"straggler", "degraded_gpu", "gpu_fault", "thermal"}
    assert all(v == {"=critical->critical", "=warning->warning", "=info->info"} for v in kinds.values()), kinds


def test_alerts_have_routing_labels_annotations_and_runbooks():
    dashboard_uids = {p.stem for p in (ROOT / "dashboards" / "generated").glob("*.json")}
    names = set()
    for rule_file in RULE_FILES:
        for rule in _alerts(rule_file):
            names.add(rule["alert"])
            assert rule["labels"]["severity"] in SEVERITIES
            assert rule["labels"]["team"] in TEAMS
            ann = rule["annotations"]
            assert {"summary", "description", "runbook_url"} <= set(ann), rule["alert"]
            assert "$labels" in ann["summary"] + ann["description"], rule["alert"]
            assert ann["runbook_url"].endswith(f"/{rule['alert']}.md")
            # every alert opens a generated dashboard of its own dialect, on the alert's host/GPU/workload
            uid = re.search(r"/d/([a-z-]+)\?", ann["dashboard_url"]).group(1)
            assert uid in dashboard_uids and uid.startswith("dcgm-" if rule_file == "dcgm.yaml" else "truegpu-"), \
                (rule["alert"], uid)
    required = {"GpuIdleMasking", "GpuIdleAllocated", "GpuStraggler", "GpuDegraded", "GpuXidError",
                "GpuUncorrectableEcc", "GpuRowRemapFailure", "GpuThermalThrottling", "GpuNearThermalLimit",
                "GpuNvlinkErrors", "GpuPcieLinkDowngraded", "GpuFellOffBus", "TruegpuExporterDown",
                "TruegpuAnalyzerDown"}
    assert required <= names, required - names
    for name in names:
        runbook = RUNBOOKS / f"{name}.md"
        assert runbook.exists(), f"missing runbook {runbook}"
        text = runbook.read_text()
        assert text.startswith(f"# {name}") and "```promql" in text and "**Do.**" in text, name
        assert f"({name}.md)" in (RUNBOOKS / "README.md").read_text(), f"{name} not in the runbook index"


def test_hardware_alerts_exist_in_both_dialects():
    truegpu = {r["alert"] for g in _load(GENERATED / "truegpu.yaml")["groups"] if g["name"] == "truegpu-hardware"
               for r in g["rules"]}  # the exporter's own health alerts are truegpu's alone
    dcgm = {r["alert"] for r in _alerts("dcgm.yaml")}
    assert truegpu <= dcgm, truegpu - dcgm
    assert all(r["labels"].get("dialect") == "dcgm" for r in _alerts("dcgm.yaml") if r["alert"] in truegpu)


def test_dcgm_alerts_say_which_need_non_default_counters():
    needs = {r["alert"] for r in _alerts("dcgm.yaml") if "dcgm_counters" in r["annotations"]}
    # GpuThermalThrottling reads the throttle reasons where collected and the default temperatures otherwise;
    # GpuXidError: the XID count collector variant (the last-XID gauge is default)
    assert needs == {"GpuUncorrectableEcc", "GpuNvlinkErrors", "GpuPcieLinkDowngraded", "GpuXidError",
                     "GpuRecoveryActionRequired"}
    header = (GENERATED / "dcgm.yaml").read_text().split("groups:")[0]
    assert "DCGM_FI_PROF_SM_ACTIVE" in header and "GpuNvlinkErrors" in header


def test_every_metric_name_comes_from_a_contract():
    known = {m.name for m in S.METRICS} | {m.name for m in O.METRICS} | set(record_names())
    known |= {f.field for m in S.METRICS for f in m.dcgm}
    for rule_file in RULE_FILES:
        for g in _load(GENERATED / rule_file)["groups"]:
            for rule in g["rules"]:
                for name in re.findall(r"\b(?:truegpu_[a-z_]+|DCGM_FI_[A-Z_]+|[a-z]+:[a-z_]+:[a-z_]+)", rule["expr"]):
                    assert name in known, f"{rule_file}: {name} is no contract metric or recording rule"


def test_recording_rule_names_follow_level_metric_operations():
    for name in record_names():
        level, metric, ops = name.split(":")
        assert level in {"gpu", "node", "workload", "fleet"} and metric.startswith(("truegpu_", "dcgm_")) and ops, name


def test_durations():
    assert [fmt_duration(s) for s in (0.3, 6, 60, 90, 600, 3600, 5400)] == \
        ["300ms", "6s", "1m", "90s", "10m", "1h", "90m"]
    t = Timing(0.01)
    assert (t.hold(600), t.hold(60), t.hold(0), t.window(600), t.window(3600)) == ("6s", "1s", "0s", "6s", "36s")
    with pytest.raises(ValueError):
        Timing(0)


def test_scaled_rules_are_the_same_rules_faster(promtool, tmp_path):
    paths = generate(tmp_path, scale=0.01, webhook_urls={"*": "http://127.0.0.1:9/hook"})
    assert [p.name for p in paths] == [*RULE_FILES, "alertmanager.yml"]
    out = _run([promtool, "check", "rules", *(str(p) for p in paths[:-1])])
    assert out.returncode == 0, out.stdout + out.stderr
    fast = {(r["alert"], r["labels"]["severity"]): r for r in
            (r for g in _load(tmp_path / "truegpu.yaml")["groups"] for r in g["rules"] if "alert" in r)}
    assert fast["GpuThermalThrottling", "critical"]["for"] == "1s"
    assert fast["GpuNearThermalLimit", "warning"]["for"] == "3s"
    assert fast["GpuFellOffBus", "critical"]["for"] == "1s"
    assert "[6s]" in fast["GpuXidError", "critical"]["expr"]
    assert "[216s]" in fast["GpuFellOffBus", "critical"]["expr"]  # 6 h lookback
    analyzer = [r for g in _load(tmp_path / "analyzer.yaml")["groups"] for r in g["rules"]]
    assert any(r["expr"].endswith("> 9") for r in analyzer if r["alert"] == "TruegpuAnalyzerDown")
    # apart from durations, the scaled files are the committed ones
    dur = re.compile(r"\b\d+(?:ms|s|m|h)\b|> 9(?:00)?$", re.M)
    for name in RULE_FILES:
        assert dur.sub("D", (tmp_path / name).read_text()) == dur.sub("D", (GENERATED / name).read_text())


def test_generate_for_a_site(tmp_path):
    site = parse_site({"selectors": {"exporter_job": "gpu-exporter", "dcgm_job": "dcgm"},
                       "alerting": {"runbook_base": "https://rb"}})
    generate(tmp_path, site=site)
    text = (tmp_path / "truegpu.yaml").read_text()
    assert 'up{job="gpu-exporter"}' in text and "https://rb/GpuFellOffBus.md" in text
    assert 'up{job="dcgm"}' in (tmp_path / "dcgm.yaml").read_text()
    assert alerts.generate is generate


def test_clusters_case_fails_on_rules_that_drop_the_cluster_label(promtool, tmp_path):
    """The committed two-cluster promtool case can fail: on rules generated without a cluster label
    (``cluster_label: ""``) node and fleet series merge across clusters and GpuMissing is hidden."""
    generate(tmp_path / "generated", site=parse_site({"selectors": {"cluster_label": ""}}))
    suite = yaml.safe_load((TESTS / "truegpu_test.yaml").read_text())
    suite["tests"] = [t for t in suite["tests"] if t["name"].startswith("Two clusters")]
    assert len(suite["tests"]) == 1
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "t.yaml").write_text(yaml.safe_dump(suite))
    out = _run([promtool, "test", "rules", "t.yaml"], cwd=tmp_path / "tests")
    assert out.returncode != 0 and "GpuMissing" in out.stdout + out.stderr
    assert "node:truegpu_effective_utilization:avg" in out.stdout + out.stderr


def test_keep_cluster_puts_the_label_in_every_grouping():
    expr = 'avg (x) + max by (a) (y) * on (a, b) group_left (c) z or count by () (w) unless on (d) max without () (v)'
    assert keep_cluster(expr, "k") == ("avg by (k) (x) + max by (k, a) (y) * on (k, a, b) group_left (c) z "
                                       "or count by (k) (w) unless on (k, d) max without () (v)")
    assert keep_cluster(expr, "") == expr
    # every generated expression is in the style keep_cluster relies on (one space before a grouping)
    for rf in rule_files():
        for r in [*rf.alerts(), *rf.records()]:
            assert not re.search(r"\b(by|on|without|ignoring)\(|\b(sum|avg|min|max|count)\(", r.expr), r.expr


def test_rule_files_are_built_from_the_same_code():
    names = [f.name for f in rule_files()]
    assert names == list(RULE_FILES)
