"""`truegpu serve`: the analysis loop, its /metrics and /healthz, against a real Prometheus.

The real test backfills the last 40 minutes of mixed-fleet (the cluster shifted so its data
ends now) into a real Prometheus, runs the service in-process on a loopback port, checks
/metrics with the real `promtool check metrics`, then stops Prometheus and checks that the
last good findings stay while the errors are counted. The CLI test runs `truegpu serve` as a
subprocess against a port with nothing listening and stops it with SIGTERM.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests
from prometheus_client.parser import text_string_to_metric_families

from analyzer import output_schema as O
from analyzer.findings import Finding, IdMemory
from analyzer.service import Analysis, AnalyzerService, Health, JobUtilization, Snapshot
from analyzer.service.metrics import ServiceCollector, build_registry
from exporter.simulator import Cluster, load_scenario
from exporter.simulator.history import write_history
from tests.conftest import ROOT, free_port
from tests.realprom import backfilled_prometheus

STEP = 15.0
HISTORY = 40 * 60.0
WINDOW = 30 * 60.0


# -- helpers -------------------------------------------------------------------------------
def _samples(text: str) -> list[tuple[str, dict[str, str], float]]:
    return [(s.name, s.labels, s.value) for fam in text_string_to_metric_families(text) for s in fam.samples]


def _series(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    return [(labels, v) for n, labels, v in _samples(text) if n == name]


def _value(text: str, name: str, **labels: str) -> float:
    found = [v for lab, v in _series(text, name) if all(lab.get(k) == x for k, x in labels.items())]
    assert len(found) == 1, f"{name}{labels}: {found}"
    return found[0]


def _promtool_check(promtool: str, text: str) -> None:
    check = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=60)
    assert check.returncode == 0, check.stdout + check.stderr


def _finding(kind: str = "idle_masking", gpu: int | None = 0, end: float | None = None, score: float = 0.5,
             start: float = 1000.0, **kw) -> Finding:
    base = dict(hostname="node-1", rack="r1", namespace="batch", job="embed")
    base.update(kw)
    return Finding(kind=kind, severity="info", summary="s", start=start, end=end, score=score, gpu=gpu, **base)


def _analysis(findings: list[Finding], **kw) -> Analysis:
    return Analysis(start=0.0, end=1800.0, step=60.0, finished=2000.0, duration=1.5, findings=tuple(findings), **kw)


# -- collector (unit) -------------------------------------------------------------------------
def test_collector_publishes_open_findings_only_and_drops_ended_ones(promtool):
    holder = {"snap": Snapshot(None, Health(started=0.0))}
    registry = build_registry(lambda: holder["snap"])

    from prometheus_client.exposition import generate_latest

    before = generate_latest(registry).decode()
    assert _series(before, O.FINDING_ACTIVE.name) == []
    assert _value(before, O.ANALYZER_LAST_SUCCESS.name) == 0.0  # never succeeded: alerts on age fire
    assert _value(before, O.ANALYZER_RUNS.name, result="error") == 0.0
    assert O.ANALYZER_STATE_WRITES.family_name not in before  # no --state-file: no such series
    _promtool_check(promtool, before)

    a, b = _finding(gpu=0, score=0.7), _finding(kind="idle_allocated", gpu=5, job="nb", namespace=float("nan"))
    closed = _finding(gpu=1, end=1500.0)
    holder["snap"] = Snapshot(
        _analysis([a, b, closed], jobs=(JobUtilization("batch", "embed", 0.2, 0.9, 4.0),
                                        JobUtilization("", "nb", None, 0.0, 2.0)),
                  fleet_effective={"allocated": 0.4, "all": None}, fleet_reported={"allocated": 0.8, "all": 0.6}),
        Health(started=0.0, last_success=2000.0, last_duration=1.5, runs_ok=1),
    )
    first = generate_latest(registry).decode()
    _promtool_check(promtool, first)
    active = _series(first, O.FINDING_ACTIVE.name)
    assert sorted((lab["kind"], lab["gpu"]) for lab, _ in active) == [("idle_allocated", "5"), ("idle_masking", "0")]
    assert all(v == 1.0 for _, v in active)
    assert {lab["gpu"]: lab for lab, _ in active}["5"] == {
        "kind": "idle_allocated", "severity": "info", "hostname": "node-1", "gpu": "5", "gpu_instance": "",
        "rack": "r1", "namespace": "", "workload": "nb",  # NaN namespace -> ""
    }
    assert _value(first, O.FINDING_SCORE.name, gpu="0") == pytest.approx(0.7)
    assert _value(first, O.FINDING_STARTED.name, gpu="0") == 1000.0
    assert _value(first, O.JOB_EFFECTIVE_UTILIZATION.name, workload="embed", namespace="batch") == pytest.approx(0.2)
    assert _series(first, O.JOB_EFFECTIVE_UTILIZATION.name)[0][0]["workload"] == "embed"  # unknown nb: no series
    assert _value(first, O.JOB_ALLOCATED_GPUS.name, workload="nb") == 2.0
    assert _value(first, O.FLEET_EFFECTIVE_UTILIZATION.name, allocation="allocated") == pytest.approx(0.4)
    assert [lab for lab, _ in _series(first, O.FLEET_EFFECTIVE_UTILIZATION.name)] == [{"allocation": "allocated"}]
    assert _value(first, O.ANALYZER_LAST_SUCCESS.name) == 2000.0
    assert _value(first, O.ANALYZER_RUN_DURATION.name) == 1.5

    # Next run: the idle_masking finding has ended -> its three series are gone, the other stays.
    holder["snap"] = Snapshot(_analysis([_finding(gpu=0, end=1900.0), b]),
                              Health(started=0.0, last_success=2100.0, runs_ok=2))
    second = generate_latest(registry).decode()
    for metric in (O.FINDING_ACTIVE, O.FINDING_SCORE, O.FINDING_STARTED):
        assert [lab["kind"] for lab, _ in _series(second, metric.name)] == ["idle_allocated"]
    assert _series(second, O.JOB_EFFECTIVE_UTILIZATION.name) == []


def test_collector_merges_findings_that_share_a_series():
    twins = [_finding(score=0.3, start=500.0, uuid="a"), _finding(score=0.9, start=800.0, uuid="b")]
    collector = ServiceCollector(lambda: Snapshot(_analysis(twins), Health(started=0.0)))
    fams = {f.name: f for f in collector.collect()}
    assert [s.value for s in fams[O.FINDING_ACTIVE.name].samples] == [1.0]
    assert [s.value for s in fams[O.FINDING_SCORE.name].samples] == [0.9]
    assert [s.value for s in fams[O.FINDING_STARTED.name].samples] == [500.0]


# -- loop (unit) --------------------------------------------------------------------------------
def test_loop_keeps_last_good_results_and_counts_errors():
    from analyzer.data.simulated import fleet_from_cluster

    now = 1_699_999_980.0  # a multiple of the 60 s step
    scenario = load_scenario("mixed-fleet")
    cluster = Cluster(scenario, start=now - float(scenario.duration))
    state = {"fail": False, "calls": []}

    def loader(start: float, end: float):
        state["calls"].append((start, end))
        if state["fail"]:
            raise ConnectionError("prometheus at http://prom.example:9090 is down")
        return fleet_from_cluster(cluster, start=start, end=end, step=60.0)

    service = AnalyzerService(loader, url="http://prom.example:9090", interval=60, window=WINDOW, step=60,
                              clock=lambda: now + 7)
    assert service.run_once() is True
    assert state["calls"] == [(now - WINDOW, now)]  # end aligned down to the step
    good = service.snapshot().analysis
    assert good is not None and good.open_findings
    state["fail"] = True
    assert service.run_once() is False
    snap = service.snapshot()
    assert snap.analysis is good  # last good results kept
    assert (snap.health.runs_ok, snap.health.runs_error) == (1, 1)
    health = service.health_json()
    assert "prom.example:9090" in health["last_error"] and health["stale"] is False
    assert health["last_success"] is not None


# -- the real thing --------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live_history(tmp_path_factory) -> tuple[Path, Cluster]:
    """mixed-fleet shifted so its 4 h end now; the last HISTORY seconds written as OpenMetrics."""
    tmp = tmp_path_factory.mktemp("serve")
    now = time.time()
    scenario = load_scenario("mixed-fleet")
    cluster = Cluster(scenario, start=now - float(scenario.duration))
    om = tmp / "history.om"
    start = (now - HISTORY) // STEP * STEP
    write_history(om, cluster, start, now, STEP)
    return om, cluster


@pytest.fixture
def serve_in_process() -> Iterator:
    """Run ``truegpu serve ARGS`` in a thread; yields start(argv) -> (service, base URL)."""
    from analyzer.cli import serve as serve_cli
    from truegpu.cli import build_parser

    stop = threading.Event()
    holder: dict = {}
    started = threading.Event()

    def start(argv: list[str]):
        args = build_parser(["serve", *argv]).parse_args(["serve", *argv])

        def ready(service, bound):
            holder["service"], holder["url"] = service, f"http://{bound[0]}:{bound[1]}"
            started.set()

        def target():
            holder["rc"] = serve_cli.run(args, stop=stop, ready=ready)
            started.set()

        holder["thread"] = threading.Thread(target=target, daemon=True)
        holder["thread"].start()
        assert started.wait(30), "truegpu serve did not start"
        assert "service" in holder, f"truegpu serve exited with {holder.get('rc')}"
        return holder["service"], holder["url"]

    yield start
    stop.set()
    if "thread" in holder:
        holder["thread"].join(30)
        assert not holder["thread"].is_alive(), "truegpu serve did not stop"
        assert holder["rc"] == 0


def test_serve_against_real_prometheus(tmp_path, live_history, serve_in_process, promtool, prometheus_bin):
    from analyzer.data.simulated import fleet_from_cluster
    from analyzer.detectors import run_detectors

    om, cluster = live_history
    token_file = tmp_path / "token"
    token_file.write_text("real-prom-token\n")
    auth = {"Authorization": "Bearer real-prom-token"}
    with backfilled_prometheus(tmp_path, [om], promtool, prometheus_bin) as prom_url:
        service, url = serve_in_process(["--prometheus", prom_url, "--listen", "127.0.0.1:0", "--interval", "3s",
                                         "--window", f"{WINDOW:g}s", "--timeout", "10",
                                         "--api-token-file", str(token_file),
                                         "--rollup-store", str(tmp_path / "rollups.db"),
                                         "--state-file", str(tmp_path / "state.json")])
        assert service.wait_for_run(120), "no analysis run finished"
        health = requests.get(f"{url}/healthz", timeout=10).json()
        assert health["status"] == "ok" and health["last_error"] is None, health
        assert health["stale"] is False and health["runs"]["ok"] >= 1 and health["open_findings"] > 0

        text = requests.get(f"{url}/metrics", timeout=10).text
        _promtool_check(promtool, text)
        analysis = service.snapshot().analysis
        assert analysis is not None and analysis.end - analysis.start == WINDOW

        active = [lab for lab, v in _series(text, O.FINDING_ACTIVE.name) if v == 1.0]
        assert all(set(lab) == set(O.FINDING_LABELS) for lab in active)
        masking = [lab for lab in active if lab["kind"] == "idle_masking"]
        idle = [lab for lab in active if lab["kind"] == "idle_allocated"]
        # mixed-fleet's memory-bound job masks idleness; its notebook GPUs are allocated and idle.
        assert masking and all((lab["namespace"], lab["workload"]) == ("batch", "embed-batch") for lab in masking)
        assert idle and all((lab["namespace"], lab["workload"]) == ("notebooks", "nb-alice") for lab in idle)
        for lab in masking + idle:
            assert lab["hostname"] and lab["gpu"].isdigit() and lab["rack"] and lab["hostname"].startswith(lab["rack"])
        # The same window analyzed in memory finds the same open problems on the same GPUs.
        expected = run_detectors(fleet_from_cluster(cluster, start=analysis.start, end=analysis.end, step=60.0),
                                 ["idle_masking", "idle_allocated"])

        def key(kind, host, gpu):
            return kind, host, str(gpu)

        assert {key(lab["kind"], lab["hostname"], lab["gpu"]) for lab in masking + idle} == {
            key(f.kind, f.hostname, f.gpu) for f in expected if f.end is None
        }
        for lab in masking:
            assert 0 < _value(text, O.FINDING_SCORE.name, **lab) <= 1
            assert analysis.start <= _value(text, O.FINDING_STARTED.name, **lab) < analysis.end

        for allocation in ("allocated", "all"):
            eff = _value(text, O.FLEET_EFFECTIVE_UTILIZATION.name, allocation=allocation)
            rep = _value(text, O.FLEET_REPORTED_UTILIZATION.name, allocation=allocation)
            assert 0 < eff < rep <= 1  # idle masking: reported beats effective
        assert _value(text, O.JOB_EFFECTIVE_UTILIZATION.name, namespace="batch", workload="embed-batch") < 0.5
        assert _value(text, O.JOB_REPORTED_UTILIZATION.name, namespace="batch", workload="embed-batch") > 0.8
        gpus = _value(text, O.JOB_ALLOCATED_GPUS.name, namespace="notebooks", workload="nb-alice")
        assert gpus == pytest.approx(2, 0.05)
        last_success = _value(text, O.ANALYZER_LAST_SUCCESS.name)
        assert time.time() - 120 < last_success <= time.time()
        assert _value(text, O.ANALYZER_RUN_DURATION.name) > 0
        assert _value(text, O.ANALYZER_RUNS.name, result="ok") >= 1
        assert _value(text, O.ANALYZER_STATE_WRITES.name, result="ok") >= 1  # --state-file
        assert _value(text, O.ANALYZER_STATE_WRITES.name, result="error") == 0
        # The API serves the same results (token required), fresh.
        assert requests.get(f"{url}/api/findings", timeout=10).status_code == 401
        api = requests.get(f"{url}/api/findings", params={"open_only": "true"}, headers=auth, timeout=30)
        assert api.status_code == 200 and api.json()["stale"] is False, api.text
        assert api.headers["X-Truegpu-Stale"] == "false"
        api_masking = {(f["hostname"], str(f["gpu"])) for f in api.json()["findings"] if f["kind"] == "idle_masking"}
        assert {(lab["hostname"], lab["gpu"]) for lab in masking} <= api_masking
        fleet_row = requests.get(f"{url}/api/scores", params={"allocated_only": "true"}, headers=auth,
                                 timeout=30).json()["rows"][0]
        assert fleet_row["effective_util"] == pytest.approx(
            _value(text, O.FLEET_EFFECTIVE_UTILIZATION.name, allocation="allocated"))
        cost = requests.get(f"{url}/api/reports/cost", params={"group_by": "workload"}, headers=auth, timeout=60)
        assert cost.status_code == 200 and cost.json()["report"]["totals"]["cost"] > 0, cost.text
        # --state-file: after each run it holds the ids shown, the ones a restart takes back.
        for _ in range(3):  # a run may finish between reading its ids and reading the file
            shown = {f.id for f in service.snapshot().analysis.findings}
            kept = IdMemory(WINDOW)
            assert service.state.load(kept) is not None
            if shown <= {fields["id"] for fields, _ in kept.state()[0]}:
                break
        else:
            raise AssertionError(f"the state file lacks ids of {shown}")
        ok_runs = service.snapshot().health.runs_ok
        errors_before = service.snapshot().health.runs_error

    # Prometheus is gone: the loop fails, says so, and keeps serving the last good findings.
    deadline = time.monotonic() + 60
    while service.snapshot().health.runs_error <= errors_before and time.monotonic() < deadline:
        time.sleep(0.2)
    health = requests.get(f"{url}/healthz", timeout=10).json()
    assert prom_url in health["last_error"], health
    assert health["runs"]["error"] > errors_before and health["runs"]["ok"] >= ok_runs
    after = requests.get(f"{url}/metrics", timeout=10).text
    _promtool_check(promtool, after)
    assert sorted(map(sorted, (lab.items() for lab, _ in _series(after, O.FINDING_ACTIVE.name)))) == \
        sorted(map(sorted, (lab.items() for lab, _ in _series(text, O.FINDING_ACTIVE.name))))
    assert _value(after, O.ANALYZER_LAST_SUCCESS.name) <= time.time()
    assert _value(after, O.ANALYZER_RUNS.name, result="error") > errors_before
    stale = requests.get(f"{url}/api/findings", params={"open_only": "true"}, headers=auth, timeout=30)
    assert stale.status_code == 200 and stale.headers["X-Truegpu-Stale"] == "true"
    assert stale.json()["stale"] is True and prom_url in stale.json()["last_error"]
    # The last good results: the loop (every 3 s, on a window sliding with the clock) may have run once more
    # since ``api`` was read, so its numbers may have moved on a minute; the problems are the same ids.
    from analyzer.findings import sort_findings

    last = service.snapshot().analysis
    assert [f["id"] for f in stale.json()["findings"]] == [f.id for f in sort_findings(
        [f for f in last.findings if f.end is None])]
    assert {f["id"] for f in stale.json()["findings"]} == {f["id"] for f in api.json()["findings"]}
    # The rollup store got today's (and yesterday's) cost rollups from the loop.
    from analyzer.finops.store import open_store

    with open_store(tmp_path / "rollups.db") as store:
        assert store.days("namespace")


def test_serve_shard_replica_keeps_its_reads_between_ticks(tmp_path, live_history, serve_in_process, promtool,
                                                          prometheus_bin, monkeypatch):
    """``serve --shard`` (a StatefulSet pod's name) analyzes its shard every tick through kept reads: after the first
    tick each of its reads loads only the new steps (analyzer.data.shard.KeptReads)."""
    from analyzer.data import shard

    made: list[shard.KeptReads] = []

    class Recorded(shard.KeptReads):
        def __init__(self) -> None:
            super().__init__()
            made.append(self)

    monkeypatch.setattr(shard, "KeptReads", Recorded)
    om, _cluster = live_history
    with backfilled_prometheus(tmp_path, [om], promtool, prometheus_bin) as prom_url:
        service, _url = serve_in_process(["--prometheus", prom_url, "--listen", "127.0.0.1:0", "--interval", "1s",
                                          "--window", f"{WINDOW:g}s", "--timeout", "10", "--no-auth",
                                          "--shard", "truegpu-analyzer-1/2"])
        assert service.wait_for_run(120, runs=3), "fewer than 3 analysis runs finished"
        health = service.health_json()
        assert health["last_error"] is None and health["runs"]["ok"] >= 3, health
        fleet = service.snapshot().analysis.fleet
    assert isinstance(fleet, shard.ShardFleet) and fleet.about["shard"] == "1/2" and fleet.about["nodes"] > 0
    (kept,) = made
    assert kept.windows and all(w.full_loads == 1 and w.incremental_loads >= 2 for w in kept.windows.values()), \
        [(w.full_loads, w.incremental_loads, w.last_reason) for w in kept.windows.values()]


def test_serve_cli_unreachable_prometheus_stays_up_and_stops_on_sigterm(tmp_path, promtool):
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens here
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as log_f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "truegpu", "serve", "--prometheus", dead, "--listen", f"127.0.0.1:{port}",
             "--interval", "1s", "--timeout", "1", "--no-auth"],
            cwd=ROOT, stdout=log_f, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        errors: list[float] = []
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and len(errors) < 2:
            assert proc.poll() is None, log.read_text()
            try:  # /metrics first: /healthz read after it has seen at least the runs it counts (one snapshot)
                text = requests.get(f"{url}/metrics", timeout=2).text
                health = requests.get(f"{url}/healthz", timeout=2)
            except requests.RequestException:
                time.sleep(0.2)
                continue
            # Alive (200) but never analyzed: "starting", and not ready.
            assert health.status_code == 200 and health.json()["status"] == "starting"
            assert requests.get(f"{url}/readyz", timeout=2).status_code == 503
            n = _value(text, O.ANALYZER_RUNS.name, result="error")
            if n > 0 and (not errors or n > errors[-1]):
                errors.append(n)
                _promtool_check(promtool, text)
                body = health.json()
                assert body["stale"] is True and body["last_success"] is None
                assert dead in body["last_error"]
                assert _value(text, O.ANALYZER_LAST_SUCCESS.name) == 0
                assert _series(text, O.FINDING_ACTIVE.name) == []
                api = requests.get(f"{url}/api/findings", timeout=5)  # --no-auth: open, but nothing to serve yet
                assert api.status_code == 503 and dead in api.json()["last_error"], api.text
            time.sleep(0.2)
        assert len(errors) == 2, f"runs_total{{result='error'}} did not grow: {errors}\n{log.read_text()}"
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    out = log.read_text()
    assert f"analysis of {dead} failed" in out and "Traceback" not in out
    assert "--no-auth: /api/* and / (findings, scores, COST data) are served WITHOUT authentication" in out
    assert "stopped" in out


@pytest.mark.parametrize(("extra", "message"), [
    (["--no-auth", "--api-token-file", "TOKEN"], "exclude each other"),
    (["--api-token-file", "EMPTY"], "is empty"),
    (["--api-token-file", "MISSING"], "cannot read"),
    (["--protect-metrics"], "need --api-token-file"),
    (["--prices", "MISSING"], "price catalog"),
    (["--rollup-store", "ftp://nowhere/x"], "--rollup-store"),
    (["--state-file", "MISSING/state.json"], "folder"),
])
def test_serve_rejects_bad_api_and_cost_flags(tmp_path, capsys, extra, message):
    from analyzer.cli import serve as serve_cli
    from truegpu.cli import build_parser

    (tmp_path / "TOKEN").write_text("t")
    (tmp_path / "EMPTY").write_text(" \n")
    argv = ["serve", "--prometheus", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
            *[str(tmp_path / a) if a.split("/")[0] in ("TOKEN", "EMPTY", "MISSING") else a for a in extra]]
    args = build_parser(argv).parse_args(argv)
    assert serve_cli.run(args) == 2
    err = capsys.readouterr().err
    assert err.startswith("truegpu serve: error: ") and message in err, err
