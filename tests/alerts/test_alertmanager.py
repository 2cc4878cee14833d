"""Generated Alertmanager config: amtool checks, route tests, and a real Alertmanager on loopback."""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import ClassVar

import pytest
import requests
import yaml

from alerts import ALERTMANAGER_YML, generate
from alerts.alertmanager import RECEIVERS, webhook_url_map
from tests.conftest import find_binary, free_port
from tests.realprom import running


def _amtool(amtool: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([amtool, *args], capture_output=True, text=True, timeout=60)


def test_amtool_check_config(amtool):
    out = _amtool(amtool, "check-config", str(ALERTMANAGER_YML))
    assert out.returncode == 0, out.stdout + out.stderr
    assert "SUCCESS" in out.stdout and f"{len(RECEIVERS)} receivers" in out.stdout


ROUTES = [
    ({"alertname": "GpuStraggler", "severity": "critical", "team": "training", "workload": "train"}, "training-page"),
    ({"alertname": "GpuStraggler", "severity": "warning", "team": "training", "workload": "train"},
     "training-ticket"),
    # the analyzer's thermal and fault findings page when it calls them critical
    ({"alertname": "GpuThermal", "severity": "critical", "team": "sre"}, "facilities-ticket,sre-page"),
    ({"alertname": "GpuThermal", "severity": "warning", "team": "sre"}, "facilities-ticket,sre-ticket"),
    ({"alertname": "GpuFault", "severity": "critical", "team": "training"}, "training-page"),
    ({"alertname": "GpuXidError", "severity": "critical", "team": "training", "hostname": "n1"}, "training-page"),
    ({"alertname": "GpuXidError", "severity": "info", "team": "training", "hostname": "n1"}, "info-log"),
    ({"alertname": "GpuFellOffBus", "severity": "critical", "team": "training"}, "training-page"),
    ({"alertname": "GpuPcieLinkDowngraded", "severity": "warning", "team": "training"}, "training-ticket"),
    ({"alertname": "GpuThermalThrottling", "severity": "warning", "team": "sre"}, "facilities-ticket,sre-ticket"),
    ({"alertname": "GpuNearThermalLimit", "severity": "warning", "team": "facilities"}, "facilities-ticket"),
    ({"alertname": "GpuIdleMasking", "severity": "warning", "team": "finops", "workload": "train"}, "finops-ticket"),
    ({"alertname": "GpuIdleAllocated", "severity": "warning", "team": "finops"}, "finops-ticket"),
    ({"alertname": "TruegpuExporterDown", "severity": "warning", "team": "sre"}, "sre-ticket"),
    ({"alertname": "TruegpuAnalyzerDown", "severity": "warning", "team": "sre"}, "sre-ticket"),
    ({"alertname": "SomethingElse", "severity": "critical", "team": "sre"}, "sre-page"),
    ({"alertname": "Unlabelled"}, "sre-ticket"),
]


@pytest.mark.parametrize(("labels", "receivers"), ROUTES, ids=[f"{r[0]['alertname']}-{r[1]}" for r in ROUTES])
def test_routes(amtool, labels, receivers):
    args = [f"{k}={v}" for k, v in labels.items()]
    out = _amtool(amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_YML}",
                  f"--verify.receivers={receivers}", *args)
    assert out.returncode == 0, out.stdout + out.stderr


def test_route_test_can_fail(amtool):
    out = _amtool(amtool, "config", "routes", "test", f"--config.file={ALERTMANAGER_YML}",
                  "--verify.receivers=training-page", "alertname=GpuIdleMasking", "team=finops", "severity=warning")
    assert out.returncode != 0


def test_webhook_urls_override():
    urls = webhook_url_map({"*": "http://a/x", "finops-ticket": "http://b/y"})
    assert urls["finops-ticket"] == "http://b/y" and urls["training-page"] == "http://a/x"
    assert webhook_url_map()["sre-page"].endswith("/sre-page")
    with pytest.raises(ValueError, match="unknown receivers"):
        webhook_url_map({"pager": "http://c"})


SITE = """
selectors:
  cluster_label: k8s_cluster
  exporter_job: gpu-exporter
thresholds:
  gpu_temp_limit_celsius: 83
  thermal_limit_for_seconds: 120
alerting:
  runbook_base: https://wiki.example/gpu-runbooks
  dashboard_base: https://grafana.example
  receivers:
    "*": https://alerts.example/hook
    serving-oncall: https://pager.example/serving
  owners:
    - {namespace: "serving|inference-.*", receiver: serving-oncall}
"""


def test_site_config_routes_hardware_alerts_to_the_gpus_owner(amtool, tmp_path):
    """``python -m alerts --site``: the site's job names, cluster label, thresholds, runbook and
    dashboard URLs and receivers, and an inference service's hardware alert routed to its own
    on-call (real amtool), everything else as before."""
    from alerts.__main__ import main

    site = tmp_path / "site.yaml"
    site.write_text(SITE)
    assert main(["--site", str(site), "--out", str(tmp_path / "out")]) == 0
    am = tmp_path / "out" / "alertmanager.yml"
    assert _amtool(amtool, "check-config", str(am)).returncode == 0
    for labels, receiver in (
        (["alertname=GpuPcieLinkDowngraded", "namespace=serving", "team=training", "severity=warning"],
         "serving-oncall"),
        (["alertname=GpuXidError", "namespace=inference-eu", "team=training", "severity=critical"], "serving-oncall"),
        (["alertname=GpuPcieLinkDowngraded", "namespace=llm", "team=training", "severity=warning"],
         "training-ticket"),
        (["alertname=GpuStraggler", "namespace=serving", "team=training", "severity=critical"], "training-page"),
    ):
        out = _amtool(amtool, "config", "routes", "test", f"--config.file={am}", f"--verify.receivers={receiver}",
                      *labels)
        assert out.returncode == 0, (labels, out.stdout + out.stderr)
    cfg = yaml.safe_load(am.read_text())
    urls = {r["name"]: r["webhook_configs"][0]["url"] for r in cfg["receivers"]}
    assert urls["serving-oncall"] == "https://pager.example/serving" and urls["sre-page"] == "https://alerts.example/hook"
    rules = (tmp_path / "out" / "truegpu.yaml").read_text()
    assert 'up{job="gpu-exporter"}' in rules and "https://wiki.example/gpu-runbooks/GpuXidError.md" in rules
    assert "by (cluster" not in rules and "max by (k8s_cluster, hostname, gpu, uuid)" in rules
    throttling = next(r for g in yaml.safe_load(rules)["groups"] for r in g["rules"]
                      if r.get("alert") == "GpuThermalThrottling")
    assert throttling["for"] == "2m" and '{sensor="gpu"}) >= 83' in throttling["expr"]
    assert throttling["annotations"]["dashboard_url"].startswith(
        "https://grafana.example/d/truegpu-thermal?orgId=1{{ with $labels.k8s_cluster }}&var-cluster={{ . }}{{ end }}")
    assert cfg["route"]["group_by"] == ["alertname", "k8s_cluster", "workload", "hostname"]
    assert all(rule["equal"][0] in ("k8s_cluster", "alertname") and "k8s_cluster" in rule["equal"]
               for rule in cfg["inhibit_rules"])
    bad = tmp_path / "bad.yaml"
    bad.write_text(SITE.replace("receiver: serving-oncall", "receiver: nobody"))
    assert main(["--site", str(bad), "--out", str(tmp_path / "x")]) == 2


def test_hardware_alerts_are_the_per_gpu_hardware_group():
    from alerts.rules import HARDWARE_ALERTS, Timing, truegpu_hardware

    names = {r.alert for r in truegpu_hardware(Timing()).rules} - {"GpuMissing"}
    assert names == set(HARDWARE_ALERTS)


class _Hook(BaseHTTPRequestHandler):
    received: ClassVar[list[dict]] = []

    def do_POST(self) -> None:
        body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
        type(self).received.append(json.loads(body))
        self.send_response(200)
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


@contextmanager
def _webhook() -> Iterator[tuple[str, list[dict]]]:
    received: ClassVar[list[dict]] = []
    handler = type("Hook", (_Hook,), {"received": received})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/hook", received
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def _alertmanager(config: Path, tmp: Path) -> Iterator[str]:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [find_binary("alertmanager"), f"--config.file={config}", f"--storage.path={tmp / 'am-data'}",
            f"--web.listen-address=127.0.0.1:{port}", "--cluster.listen-address="]
    with running(argv, tmp / "alertmanager.log", f"{url}/-/ready", timeout=30):
        yield url


def _alert(name: str, severity: str, team: str, **labels: str) -> dict:
    now = datetime.now(UTC)
    return {"labels": {"alertname": name, "severity": severity, "team": team, **labels},
            "annotations": {"summary": name},
            "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat()}


def test_real_alertmanager_loads_the_committed_config(tmp_path):
    with _alertmanager(ALERTMANAGER_YML, tmp_path) as url:
        status = requests.get(f"{url}/api/v2/status", timeout=5).json()
        loaded = yaml.safe_load(status["config"]["original"])
        assert [r["name"] for r in loaded["receivers"]] == list(RECEIVERS)
        assert status["cluster"]["status"] == "disabled"


def test_real_alertmanager_routes_and_inhibits(tmp_path):
    with _webhook() as (hook, received):
        generate(tmp_path / "cfg", scale=0.01, webhook_urls={"*": hook})
        with _alertmanager(tmp_path / "cfg" / "alertmanager.yml", tmp_path) as url:
            status = requests.get(f"{url}/api/v2/status", timeout=5).json()
            assert hook in status["config"]["original"]
            gpu3 = {"hostname": "n1", "gpu": "3"}
            alerts = [
                _alert("GpuFellOffBus", "critical", "training", **gpu3),
                _alert("GpuStraggler", "warning", "training", **gpu3, job="train"),    # muted: the GPU is gone
                _alert("GpuStraggler", "warning", "training", hostname="n1", gpu="4", job="train"),
                _alert("GpuXidError", "critical", "training", hostname="n2", gpu="0", xid="48"),
                _alert("GpuXidError", "warning", "training", hostname="n2", gpu="0", xid="63"),  # muted by critical
                _alert("GpuIdleMasking", "warning", "finops", hostname="n5", gpu="1", job="notebook"),
            ]
            assert requests.post(f"{url}/api/v2/alerts", json=alerts, timeout=5).status_code == 200

            def state() -> dict[tuple[str, str, str], str]:
                got = requests.get(f"{url}/api/v2/alerts", timeout=5).json()
                return {(a["labels"]["alertname"], a["labels"]["hostname"], a["labels"].get("xid", a["labels"]["gpu"])):
                        a["status"]["state"] for a in got}

            deadline = time.monotonic() + 20
            want_sent = {("training-page", "GpuFellOffBus"), ("training-ticket", "GpuStraggler"),
                         ("training-page", "GpuXidError"), ("finops-ticket", "GpuIdleMasking")}
            while time.monotonic() < deadline:
                sent = {(p["receiver"], a["labels"]["alertname"]) for p in received for a in p["alerts"]}
                if want_sent <= sent and len(state()) == len(alerts):
                    break
                time.sleep(0.2)
            st = state()
            assert st[("GpuStraggler", "n1", "3")] == "suppressed"
            assert st[("GpuXidError", "n2", "63")] == "suppressed"
            assert st[("GpuStraggler", "n1", "4")] == "active"
            assert st[("GpuFellOffBus", "n1", "3")] == "active"
            sent_alerts = [(p["receiver"], a["labels"]) for p in received for a in p["alerts"]]
            assert want_sent <= {(r, lab["alertname"]) for r, lab in sent_alerts}
            assert not [lab for _, lab in sent_alerts if lab.get("gpu") == "3" and lab["alertname"] == "GpuStraggler"]
            assert not [lab for _, lab in sent_alerts if lab.get("xid") == "63"]
