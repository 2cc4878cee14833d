"""The `truegpu serve` HTTP API through the real app on a loopback uvicorn: auth, filters,
validation (422 with clear messages), 503 before the first result, stale marking after the
source goes away, cost reports from the latest results and from the rollup store, OpenAPI.

The service runs its real analysis (scores, detectors, cost) over the simulated mixed-fleet
cluster; the loop is driven with ``run_once`` so every state is deterministic.
"""

from __future__ import annotations

import base64
import csv
import io
import re
from collections.abc import Iterator
from datetime import date
from pathlib import Path

import pytest
import requests

from analyzer.findings import sort_findings
from analyzer.finops.rollups import RollupWriter
from analyzer.service import AnalyzerService
from analyzer.service.app import create_app
from analyzer.service.settings import ApiSettings
from tests.analyzer.service.kit import AUTH, NOW, TOKEN, WINDOW, Source, new_service, served


@pytest.fixture(scope="module")
def api(analyzed, catalog) -> Iterator[str]:
    service, _ = analyzed
    with served(create_app(service, ApiSettings(token=TOKEN, catalog=catalog))) as url:
        yield url


def get(url: str, path: str, headers: dict | None = AUTH, **params) -> requests.Response:
    return requests.get(url + path, params=params, headers=headers, timeout=60)


# -- auth ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("path", ["/api/findings", "/api/scores", "/api/reports/cost"])
def test_api_needs_the_bearer_token(api, path):
    missing = get(api, path, headers=None)
    assert missing.status_code == 401
    assert missing.headers["WWW-Authenticate"].startswith("Bearer ")
    assert "missing token" in missing.json()["detail"]
    for bad in (f"Bearer {TOKEN}x", f"Bearer {TOKEN[:-1]}", "Bearer ", "Token abc", "Bearer " + "x" * 5000):
        r = get(api, path, headers={"Authorization": bad})
        assert r.status_code == 401, bad
        assert r.headers["WWW-Authenticate"].startswith("Bearer ")
    basic = base64.b64encode(f"u:{TOKEN}".encode()).decode()
    assert get(api, path, headers={"Authorization": f"Basic {basic}"}).status_code == 401  # API: bearer only
    assert get(api, path).status_code == 200
    assert get(api, path, headers={"authorization": f"bearer {TOKEN}"}).status_code == 200  # scheme: any case


def test_overview_takes_basic_auth_for_browsers(api):
    r = get(api, "/", headers=None)
    assert r.status_code == 401 and r.headers["WWW-Authenticate"].startswith("Basic ")
    basic = base64.b64encode(f"anyone:{TOKEN}".encode()).decode()
    assert get(api, "/", headers={"Authorization": f"Basic {basic}"}).status_code == 200
    wrong = base64.b64encode(b"anyone:nope").decode()
    assert get(api, "/", headers={"Authorization": f"Basic {wrong}"}).status_code == 401
    assert get(api, "/", headers={"Authorization": "Basic !!notbase64"}).status_code == 401
    assert get(api, "/").status_code == 200


def test_metrics_and_healthz_open_by_default_docs_open(api):
    assert get(api, "/metrics", headers=None).status_code == 200
    assert get(api, "/healthz", headers=None).json()["status"] == "ok"
    spec = get(api, "/openapi.json", headers=None).json()
    docs = get(api, "/docs", headers=None)
    assert docs.status_code == 200 and "cdn" not in docs.text.lower()
    # Swagger UI comes from the swagger-ui-bundle package: /docs works with no internet.
    for asset in ("swagger-ui-bundle.js", "swagger-ui.css"):
        assert f"/docs/assets/{asset}" in docs.text
        r = get(api, f"/docs/assets/{asset}", headers=None)
        assert r.status_code == 200 and len(r.content) > 10_000, asset
    assert {"/api/findings", "/api/scores", "/api/reports/cost"} <= set(spec["paths"])
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"
    findings = spec["paths"]["/api/findings"]["get"]
    assert findings["security"] == [{"HTTPBearer": []}]
    assert findings["responses"]["200"]["content"]["application/json"]["schema"]["$ref"].endswith("/FindingsOut")
    assert {"401", "422", "503"} <= set(findings["responses"])
    level = next(p for p in spec["paths"]["/api/scores"]["get"]["parameters"] if p["name"] == "level")
    assert level["schema"]["enum"] == ["gpu", "node", "workload", "namespace", "model", "fleet"]
    cost = spec["paths"]["/api/reports/cost"]["get"]["responses"]["200"]["content"]
    assert {"application/json", "text/csv", "text/html"} <= set(cost)


def test_protect_metrics_disabled_api_and_no_auth(analyzed, catalog):
    service, _ = analyzed
    with served(create_app(service, ApiSettings(token=TOKEN, protect_metrics=True, protect_healthz=True))) as url:
        for path in ("/metrics", "/healthz", "/readyz"):
            r = get(url, path, headers=None)
            assert r.status_code == 401 and "WWW-Authenticate" in r.headers
            assert get(url, path).status_code == 200
    with served(create_app(service)) as url:  # no token, no --no-auth: the API is off, never open
        for path in ("/api/findings", "/"):
            r = get(url, path)
            assert r.status_code == 403 and "--api-token-file" in r.json()["detail"]
        assert get(url, "/metrics", headers=None).status_code == 200
    with served(create_app(service, ApiSettings(no_auth=True, catalog=catalog))) as url:
        assert get(url, "/api/findings", headers=None).status_code == 200
        assert get(url, "/", headers=None).status_code == 200
    for bad in (dict(no_auth=True, token=TOKEN), dict(protect_metrics=True), dict(token="")):
        with pytest.raises(ValueError):
            ApiSettings(**bad)


# -- findings ------------------------------------------------------------------------------------------------
def test_findings_all_and_filtered(api, analyzed):
    service, _ = analyzed
    analysis = service.snapshot().analysis
    body = get(api, "/api/findings").json()
    expected = sort_findings(list(analysis.findings))
    assert body["total"] == body["count"] == len(expected) > 0
    assert [(f["kind"], f["hostname"], f["gpu"]) for f in body["findings"]] == \
        [(f.kind, f.hostname, f.gpu) for f in expected]
    assert body["stale"] is False and body["last_error"] is None
    assert body["as_of"].endswith("Z") and body["window"] == {"start": "2023-11-15T00:30:00Z",
                                                              "end": "2023-11-15T01:00:00Z"}
    one = body["findings"][0]
    assert set(one) >= {"kind", "severity", "summary", "start", "end", "score", "hostname", "gpu", "evidence"}

    masking = get(api, "/api/findings", kind="idle_masking").json()["findings"]
    assert masking and {f["kind"] for f in masking} == {"idle_masking"}
    assert {(f["namespace"], f["workload"]) for f in masking} == {("batch", "embed-batch")}
    by_ns = get(api, "/api/findings", namespace="notebooks").json()["findings"]
    assert by_ns and {f["namespace"] for f in by_ns} == {"notebooks"}
    by_job = get(api, "/api/findings", workload="nb-alice", severity=by_ns[0]["severity"]).json()["findings"]
    assert by_job and all(f["workload"] == "nb-alice" and f["severity"] == by_ns[0]["severity"] for f in by_job)
    assert "job" not in by_job[0] and get(api, "/api/findings").json()["schema_version"] == 2
    assert get(api, "/api/findings", job="nb-alice").status_code == 422  # the old name is refused, not ignored
    host = one["hostname"]
    assert all(f["hostname"] == host for f in get(api, "/api/findings", hostname=host).json()["findings"])
    open_ = get(api, "/api/findings", open_only="true").json()
    assert open_["total"] == len(analysis.open_findings) and all(f["end"] is None for f in open_["findings"])
    limited = get(api, "/api/findings", limit=2).json()
    assert limited["count"] == 2 and limited["total"] == len(expected)
    assert limited["findings"] == body["findings"][:2]
    none = get(api, "/api/findings", namespace='no"such\\ns{x=~".*"}').json()  # hostile text: a plain filter
    assert none["total"] == 0 and none["findings"] == []


@pytest.mark.parametrize(("params", "words"), [
    ({"kind": "bogus"}, ["kind", "idle_masking", "bogus"]),
    ({"severity": "high"}, ["severity", "critical", "warning", "info"]),
    ({"limit": "0"}, ["limit", "greater than or equal to 1"]),
    ({"limit": "many"}, ["limit", "integer"]),
    ({"open_only": "perhaps"}, ["open_only", "boolean"]),
    ({"hostname": "a\x01b"}, ["hostname", "pattern"]),
    ({"workload": ""}, ["workload", "at least 1 character"]),
    ({"sev": "critical"}, ["unknown query parameter", "sev", "severity"]),
])
def test_findings_validation_errors_are_422_with_a_clear_message(api, params, words):
    r = get(api, "/api/findings", **params)
    assert r.status_code == 422, r.text
    body = r.json()
    assert body["message"].startswith("invalid request: ") and body["detail"]
    for word in words:
        assert word in body["message"], (word, body["message"])


# -- scores --------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("level", ["gpu", "node", "workload", "namespace", "model", "fleet"])
def test_scores_per_level(api, analyzed, level):
    from analyzer.analysis.scores import LEVELS

    scores = analyzed[0].snapshot().analysis.scores
    internal = {"workload": "job"}.get(level, level)  # the frame's column for the workload is "job"
    for allocated_only, tables in ((False, scores.levels), (True, scores.allocated)):
        body = get(api, "/api/scores", level=level, allocated_only=str(allocated_only).lower()).json()
        assert body["level"] == level and body["allocated_only"] is allocated_only
        table = tables[internal]
        assert body["count"] == len(body["rows"]) == len(table)
        keys = {{"job": "workload"}.get(k, k) for k in LEVELS[internal]}
        for row, rec in zip(body["rows"], table.to_dict("records"), strict=True):
            assert keys <= set(row) and not ({"uuid", "hostname", "workload", "namespace", "model"} - keys) & set(row)
            assert row["gpu_hours"] == pytest.approx(rec["gpu_hours"])
            assert row["effective_util"] == pytest.approx(rec["effective_util"], nan_ok=True) or \
                row["effective_util"] is None


def test_scores_fleet_matches_fleet_summary_and_validation(api, analyzed):
    from analyzer.analysis.scores import fleet_summary

    summary = fleet_summary(analyzed[0].snapshot().analysis.scores)
    row = get(api, "/api/scores", allocated_only="true").json()["rows"][0]
    assert row["effective_util"] == pytest.approx(summary["effective_util"])
    assert row["reported_util"] == pytest.approx(summary["reported_util"])
    r = get(api, "/api/scores", level="rack")
    assert r.status_code == 422
    assert "level" in r.json()["message"] and "'fleet'" in r.json()["message"]


# -- 503, stale, recovery --------------------------------------------------------------------------------------
def test_503_before_the_first_result_then_stale_then_fresh(cluster, catalog):
    service, source = new_service(cluster)
    with served(create_app(service, ApiSettings(token=TOKEN, catalog=catalog))) as url:
        for path in ("/api/findings", "/api/scores", "/api/reports/cost"):
            r = get(url, path)
            assert r.status_code == 503, path
            assert "no analysis results yet" in r.json()["detail"] and int(r.headers["Retry-After"]) >= 1
        source.down = True
        assert service.run_once() is False
        r = get(url, "/api/findings")
        assert r.status_code == 503 and "prom.test:9090" in r.json()["last_error"]
        page = get(url, "/")
        assert page.status_code == 503 and "No results yet" in page.text
        # Liveness stays 200 (a slow first run must not get the pod killed); readiness waits.
        health = get(url, "/healthz")
        assert health.status_code == 200 and health.json()["status"] == "starting"
        ready = get(url, "/readyz")
        assert ready.status_code == 503 and ready.json()["status"] == "starting"

        source.down = False
        assert service.run_once() is True
        fresh = get(url, "/api/findings")
        assert fresh.status_code == 200 and fresh.json()["stale"] is False
        assert get(url, "/readyz").status_code == 200 and get(url, "/healthz").json()["status"] == "ok"
        assert fresh.headers["X-Truegpu-Stale"] == "false"
        as_of = fresh.json()["as_of"]

        source.down = True  # Prometheus goes away: the last good results, marked stale
        assert service.run_once() is False
        for path in ("/api/findings", "/api/scores", "/api/reports/cost"):
            r = get(url, path)
            assert r.status_code == 200, path
            body = r.json()
            assert body["stale"] is True and "prom.test:9090" in body["last_error"] and body["as_of"] == as_of
            assert r.headers["X-Truegpu-Stale"] == "true" and r.headers["X-Truegpu-As-Of"] == as_of
            assert "110" in r.headers["Warning"]
        assert fresh.json()["findings"] == get(url, "/api/findings").json()["findings"]
        assert "Stale:" in get(url, "/").text

        source.down = False  # and recovers by itself
        assert service.run_once() is True
        assert get(url, "/api/findings").json()["stale"] is False


# -- cost -------------------------------------------------------------------------------------------------------
def test_cost_from_the_latest_results(api, analyzed, catalog):
    from analyzer.finops import cost_report

    a = analyzed[0].snapshot().analysis
    body = get(api, "/api/reports/cost", group_by="workload").json()
    assert body["source"] == "latest" and body["group_by"] == "workload" and body["requested_window"] == "30m"
    expected = cost_report(a.fleet, a.scores, list(a.findings), catalog, group_by="workload")
    report = body["report"]
    assert report["totals"]["cost"] == pytest.approx(expected.totals["cost"])
    # shorter than the loop's window: the last 10 minutes only
    short = get(api, "/api/reports/cost", window="10m").json()
    assert short["window"] == {"start": "2023-11-15T00:50:00Z", "end": "2023-11-15T01:00:00Z"}
    assert short["report"]["totals"]["cost"] == pytest.approx(expected.totals["cost"] / 3, rel=0.05)

    text = get(api, "/api/reports/cost", format="csv", group_by="namespace")
    assert text.status_code == 200 and text.headers["content-type"].startswith("text/csv")
    assert len(list(csv.reader(io.StringIO(text.text)))) > 1
    page = get(api, "/api/reports/cost", format="html")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<html" in page.text


def test_cost_beyond_the_window_without_a_store_is_400(api):
    r = get(api, "/api/reports/cost", window="30d")
    assert r.status_code == 400
    assert "--rollup-store" in r.json()["detail"] and "30d" in r.json()["detail"]


@pytest.mark.parametrize(("params", "word"), [
    ({"window": "yesterday"}, "window"), ({"window": "0d"}, "window"), ({"window": "5000d"}, "window"),
    ({"group_by": "pod"}, "group_by"),
    ({"format": "pdf"}, "format"), ({"window": "1d", "group": "x"}, "unknown query parameter"),
])
def test_cost_validation(api, params, word):
    r = get(api, "/api/reports/cost", **params)
    assert r.status_code == 422 and word in r.json()["message"], r.text


def test_rollups_written_idempotently_and_served_beyond_the_window(cluster, catalog, tmp_path: Path):
    from analyzer.analysis.scores import compute_scores
    from analyzer.finops import cost_report
    from analyzer.finops.outputs import to_focus_csv
    from analyzer.finops.store import open_store

    store = str(tmp_path / "rollups.db")
    source = Source(cluster)
    writer = RollupWriter(source, store, catalog, every=3600, group_bys=("namespace", "team"))
    service = AnalyzerService(source, url="sim", interval=60, window=WINDOW, step=60, clock=lambda: NOW + 7,
                              on_result=writer)
    assert service.run_once()
    with open_store(store) as st:
        assert st.days("namespace") == [date(2023, 11, 14), date(2023, 11, 15)]  # yesterday backfilled, today
        first = st.read("2023-11-14", "2023-11-15", "namespace", per_day=True)
    writes = writer.writes
    assert service.run_once() and writer.writes == writes  # not due yet
    writer.last_end = None  # due again: rewriting the same day gives the same rows (idempotent)
    assert service.run_once()
    with open_store(store) as st:
        again = st.read("2023-11-14", "2023-11-15", "namespace", per_day=True)
    assert again.equals(first)

    with served(create_app(service, ApiSettings(token=TOKEN, catalog=catalog, store=store))) as url:
        body = get(url, "/api/reports/cost", window="2d").json()
        # Today's rollup covers up to the latest analysis, never up to tomorrow's midnight.
        assert body["source"] == "rollup" and body["window"] == {"start": "2023-11-14T00:00:00Z",
                                                                 "end": "2023-11-15T01:00:00Z"}
        fleet = source(NOW - 86400 - 3600, NOW)  # [2023-11-14T00:00, 2023-11-15T01:00)
        scores = compute_scores(fleet)
        expected = cost_report(fleet, scores, [], catalog)
        totals = body["report"]["totals"]
        assert totals["cost"] == pytest.approx(expected.totals["cost"], rel=1e-9)
        assert totals["gpu_hours"] == pytest.approx(expected.totals["gpu_hours"], rel=1e-9)
        csv_text = get(url, "/api/reports/cost", window="2d", format="csv").text
        focus = list(csv.DictReader(io.StringIO(csv_text)))
        ends = {row["ChargePeriodEnd"] for row in focus}
        assert ends and max(ends) <= "2023-11-15T01:00:00Z"
        # Rows from the store are as complete as rows from the latest results: model, SKU, list price.
        live = {(r["ChargePeriodStart"][:10], r["ResourceName"], r["SkuId"]): r for r in
                csv.DictReader(io.StringIO(to_focus_csv(expected)))}
        assert {(r["ChargePeriodStart"][:10], r["ResourceName"], r["SkuId"]) for r in focus} == set(live)
        for row in focus:
            assert row["SkuId"] and row["ListUnitPrice"] and float(row["BilledCost"]) >= 0
            match = live[(row["ChargePeriodStart"][:10], row["ResourceName"], row["SkuId"])]
            assert float(row["ListUnitPrice"]) == float(match["ListUnitPrice"])
        assert get(url, "/api/reports/cost", window="2d", format="html").status_code == 200
        assert get(url, "/api/reports/cost", window="1w", group_by="team").json()["source"] == "rollup"
        empty = get(url, "/api/reports/cost", window="2d", group_by="workload").json()  # never written: no groups
        assert empty["report"]["totals"]["cost"] == 0


def test_overview_page_shows_the_numbers(api, analyzed):
    from analyzer.analysis.scores import fleet_summary
    from analyzer.report.html import fmt_pct

    a = analyzed[0].snapshot().analysis
    page = get(api, "/").text
    summary = fleet_summary(a.scores)
    assert f'id="reported-util">{fmt_pct(summary["reported_util"])}<' in page
    assert f'id="effective-util">{fmt_pct(summary["effective_util"])}<' in page
    assert 'id="cost-total"' in page and "<script" not in page and "http://" not in page.replace(
        "http://prom.test:9090", "")
    assert page.count('<tr class="finding">') == min(10, len(a.findings))


def test_rollup_schedule_today_every_interval_closed_days_once_more_and_retries(tmp_path):
    from analyzer.finops.rollups import MAX_ROLLUP_ATTEMPTS
    from analyzer.service import Analysis

    day = 1_700_006_400.0  # 2023-11-15T00:00:00Z
    writer = RollupWriter(lambda s, e: None, str(tmp_path / "r.db"), None, every=3600)
    calls: list[tuple[float, float]] = []
    fail: set[float] = set()

    def write(start, end):
        calls.append((start, end))
        if start in fail:
            raise ConnectionError("down")
        return 1

    writer.write = write  # the schedule only; writing itself is tested above

    def run(end: float) -> list[tuple[float, float]]:
        calls.clear()
        writer(Analysis(start=end - WINDOW, end=end, step=60, finished=end, duration=0.1, findings=()))
        return list(calls)

    assert run(day + 1800) == [(day - 86400, day), (day, day + 1800)]  # yesterday (store lacks it), today
    assert run(day + 3000) == []  # not due
    assert run(day + 5400) == [(day, day + 5400)]
    fail.add(day)
    tomorrow = day + 86400
    assert run(tomorrow + 600) == [(day, tomorrow), (tomorrow, tomorrow + 600)]  # closed day: failed, retried
    assert writer.pending == [day]
    fail.clear()
    assert run(tomorrow + 600 + 3600) == [(day, tomorrow), (tomorrow, tomorrow + 4200)]
    assert writer.pending == []
    fail.add(tomorrow)
    run(tomorrow + 86400 + 60)
    for i in range(MAX_ROLLUP_ATTEMPTS):
        run(tomorrow + 86400 + 3660 * (i + 1))
    assert writer.pending == [] and writer.failures[tomorrow] == MAX_ROLLUP_ATTEMPTS  # given up, logged


def test_metrics_publish_the_catalog_price_of_each_model_in_the_fleet(api, analyzed, catalog):
    from prometheus_client.parser import text_string_to_metric_families

    from analyzer import output_schema as out

    text = get(api, "/metrics", headers=None).text
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    got = {s.labels["model"]: (s.labels["sku"], s.labels["currency"], s.value)
           for s in fams[out.GPU_HOURLY_COST.name].samples}
    models = {str(m) for m in analyzed[0].snapshot().analysis.fleet.frame["model"].unique()}
    want = {m: (e.key, catalog.currency, e.price_per_gpu_hour) for m in models
            if (e := catalog.lookup(m)) is not None}
    assert got == want and got  # every priced model, and only those (unpriced: no series, never $0)


# -- jobs ---------------------------------------------------------------------------------------------------
def test_a_job_s_report_is_the_workload_scores_and_the_cost_report(api, analyzed):
    scores = {r["workload"]: r for r in get(api, "/api/scores", level="workload", allocated_only="true")
              .json()["rows"]}
    groups = {g["group"]: g for g in get(api, "/api/reports/cost", group_by="workload").json()["report"]["groups"]}
    for name in ("embed-batch", "nb-alice", "pretrain-7b"):
        r = get(api, f"/api/jobs/{name}")
        assert r.status_code == 200, r.text
        job = r.json()["job"]
        assert job["workload"] == name and r.json()["window"] == get(api, "/api/scores").json()["window"]
        for col in ("allocated_gpu_hours", "effective_util", "reported_util", "idle_gpu_hours"):
            assert job["scores"][col] == pytest.approx(scores[name][col]), col
        for part in ("effective", "idle_allocated", "masked", "straggler", "headroom"):
            assert job["parts"][part] == pytest.approx(groups[name][f"{part}_gpu_hours"], abs=1e-9), part
        assert job["cost"]["cost"] == pytest.approx(groups[name]["cost"])
    assert get(api, "/api/jobs/nb-alice").json()["job"]["advice"][0]["kind"] == "release"
    assert get(api, "/api/jobs/embed-batch").json()["job"]["advice"][0]["kind"] == "batch"


def test_unknown_job_is_404_and_the_listing_filters(api, analyzed):
    r = get(api, "/api/jobs/no-such-job")
    assert r.status_code == 404 and "no workload, Slurm job or pod named 'no-such-job'" in r.json()["detail"]
    assert get(api, "/api/jobs/nb-alice", headers=None).status_code == 401
    every = get(api, "/api/jobs").json()
    assert every["count"] == len(every["jobs"]) == 6 and every["below"] is None
    low = get(api, "/api/jobs", below="0.3").json()
    assert {j["job"] for j in low["jobs"]} == {"nb-alice", "ranker-serve", "chat-serve", "embed-batch"}
    assert all(j["effective_util"] < 0.3 and j["last_seen"].endswith("Z") for j in low["jobs"])
    assert get(api, "/api/jobs", below="2").status_code == 422
    assert get(api, "/api/jobs", finished="true").json()["count"] == 0  # every demo job runs to the end


def test_the_job_page_for_browsers_is_linked_from_the_overview(api):
    basic = {"Authorization": "Basic " + base64.b64encode(f"me:{TOKEN}".encode()).decode()}
    page = get(api, "/jobs/nb-alice", headers=basic)
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    assert "<h1>Job nb-alice</h1>" in page.text and "Release the GPUs" in page.text
    assert get(api, "/jobs/nb-alice", headers=None).status_code == 401
    assert get(api, "/jobs/no-such-job", headers=basic).status_code == 404
    overview = get(api, "/").text
    linked = set(re.findall(r'href="/jobs/([^"]+)"', overview))
    assert linked and all(get(api, f"/jobs/{name}", headers=basic).status_code == 200 for name in linked)
