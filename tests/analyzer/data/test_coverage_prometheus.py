"""Hours without data are unknown on every path a user takes: `truegpu report` over a real
Prometheus, `serve`'s API over a fixed past range, and the daily rollups in a real PostgreSQL.

A real Prometheus holds one hour of a simulated fleet; the reports ask for the hour before it,
that hour and the hour after (2/3 of the window empty). The empty 2/3 must be unknown (within
one step), and unallocated must match the report over the data alone.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest
import requests

from analyzer.finops.catalog import default_catalog
from analyzer.finops.rollups import RollupWriter
from analyzer.finops.store import open_store
from analyzer.service import AnalyzerService, prometheus_loader
from analyzer.service.app import create_app
from analyzer.service.settings import ApiSettings
from exporter.simulator import Cluster, load_scenario
from exporter.simulator.history import write_history
from tests.analyzer.service.kit import served
from tests.pgserver import create_database, postgres_server
from tests.realprom import backfilled_prometheus
from truegpu.cli import main

STEP = 60.0
HOUR = 3600.0
TOKEN = "t0ken-for-tests"


@pytest.fixture(scope="module")
def prom(tmp_path_factory, promtool, prometheus_bin):
    cluster = Cluster(load_scenario("idle-waste"))
    tmp = tmp_path_factory.mktemp("cov-prom")
    path = tmp / "hour.om"
    write_history(path, cluster, cluster.start, cluster.start + HOUR + STEP, STEP)
    with backfilled_prometheus(tmp, [path], promtool, prometheus_bin) as url:
        yield url, cluster.start, len(cluster.gpus.uuid)


def _report(capsys, url: str, start: float, end: float) -> dict:
    assert main(["report", "--quiet", "--prometheus", url, "--start", str(start), "--end", str(end),
                 "--step", "60s", "--format", "json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_report_two_thirds_empty_is_unknown_not_unallocated(prom, capsys) -> None:
    url, t0, n_gpus = prom
    data = _report(capsys, url, t0, t0 + HOUR)["totals"]
    doc = _report(capsys, url, t0 - HOUR, t0 + 2 * HOUR)
    padded, one_step = doc["totals"], n_gpus * STEP / HOUR + 1e-9  # + float rounding: exactly one step
    assert data["gpu_hours"] == pytest.approx(n_gpus)
    assert padded["gpu_hours"] == pytest.approx(3 * data["gpu_hours"])
    assert padded["unallocated_gpu_hours"] == pytest.approx(data["unallocated_gpu_hours"], abs=one_step)
    assert padded["unknown_gpu_hours"] == pytest.approx(data["unknown_gpu_hours"] + 2 * n_gpus, abs=one_step)
    assert doc["coverage"]["ratio"] == pytest.approx(1 / 3, abs=0.02)
    assert any("of this window has data" in n for n in doc["notes"])


def test_report_window_and_range_do_not_mix(prom, capsys) -> None:
    url, t0, _ = prom
    assert main(["report", "--prometheus", url, "--window", "1h", "--start", str(t0), "--end", str(t0 + HOUR)]) == 2
    assert "give --window or both --start and --end" in capsys.readouterr().err


def test_serve_fixed_range_api_counts_empty_hours_as_unknown(prom) -> None:
    url, t0, n_gpus = prom
    service = AnalyzerService(prometheus_loader(url, STEP), url=url, step=STEP, fixed=(t0 - HOUR, t0 + 2 * HOUR))
    assert service.window_at(t0 + 100 * HOUR) == (t0 - HOUR, t0 + 2 * HOUR)
    assert service.run_once() is True
    with served(create_app(service, ApiSettings(token=TOKEN, catalog=default_catalog()))) as base:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        fleet = requests.get(f"{base}/api/scores?level=fleet", headers=headers, timeout=30).json()["rows"][0]
        health = requests.get(f"{base}/healthz", timeout=30).json()
    assert fleet["gpu_hours"] == pytest.approx(3 * n_gpus)
    assert fleet["unknown_gpu_hours"] >= 2 * n_gpus - n_gpus * STEP / HOUR
    assert health["status"] == "ok" and health["stale"] is False  # a fixed range never goes stale
    assert health["window"] == {"start": _iso(t0 - HOUR), "end": _iso(t0 + 2 * HOUR)}


def test_rollup_day_in_postgresql_holds_the_empty_hours_as_unknown(prom) -> None:
    url, t0, n_gpus = prom
    day = t0 - t0 % 86400
    with postgres_server() as server:
        store = create_database(server, "coverage")
        writer = RollupWriter(prometheus_loader(url, STEP), store, default_catalog(), group_bys=["node"])
        writer.write(day, day + 86400)
        with open_store(store) as s:
            rows = s.read(_date(day), _date(day), "node")
    gpu_hours, unknown = rows["gpu_hours"].sum(), rows["unknown_gpu_hours"].sum()
    assert gpu_hours == pytest.approx(24 * n_gpus)
    # 23 of the day's 24 hours have no data: unknown, not unallocated capacity.
    assert unknown >= 23 * n_gpus - n_gpus * STEP / HOUR - 1e-6  # (float sums of 24 hourly pieces)
    assert rows["unallocated_gpu_hours"].sum() < n_gpus


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _date(t: float):
    return datetime.fromtimestamp(t, UTC).date()
