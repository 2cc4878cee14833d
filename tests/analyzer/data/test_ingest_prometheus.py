"""Prometheus HTTP API ingest against a REAL Prometheus (backfilled with promtool) and a loopback fake.

The real server checks what only it can: chunked query_range under its 11,000-point
limit, pushed-down aggregation, PromQL escaping of hostile label values, discovery. The
tiny loopback server checks error handling, retries and the headers we send.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import numpy as np
import orjson
import pytest

from analyzer.data.ingest import MetricFilter, PrometheusClient, PrometheusError, query_prometheus, selector
from analyzer.data.ingest.prometheus import (
    Matcher,
    aggregate_query,
    chunk_windows,
    default_function,
    duration,
    promql_string,
)
from exporter import schema
from exporter.simulator.history import write_openmetrics
from tests.conftest import free_port
from tests.realprom import backfilled_prometheus

T0 = 1_699_999_980.0  # a multiple of 60
STEP = 15.0
N = 40
TIMES = T0 + STEP * np.arange(N)
END = float(TIMES[-1])
UTIL = schema.GPU_UTILIZATION
ENERGY = schema.ENERGY
ALLOC = schema.GPU_ALLOCATION_INFO
DCGM_UTIL = schema.Metric(schema.GPU_UTILIZATION.dcgm[0].field, "gauge", "", "GPU utilization (in %).")
SM_ACTIVE_FIELD = schema.SM_ACTIVE.dcgm[0].field
HOSTILE = 'a"}) or vector(1) # \\ back\nslash'
GPU = [{"hostname": "node-a", "gpu": str(g), "uuid": f"GPU-{g}"} for g in range(2)]
UTIL_VALUES = [np.round(0.3 * g + 0.01 * np.arange(N) + 0.001 * (np.arange(N) % 3), 6) for g in range(2)]
ENERGY_VALUES = 100.0 + 10.0 * np.arange(N)  # J, +10 J per 15 s
SENTINEL_AT = 5
DCGM_VALUES = np.where(np.arange(N) == SENTINEL_AT, 9223372036854775794.0, 50.0)


def _series():
    for g in range(2):
        yield UTIL, GPU[g], UTIL_VALUES[g]
    yield ENERGY, GPU[0], ENERGY_VALUES
    yield ALLOC, {**GPU[0], "namespace": "ml", "pod": HOSTILE, "container": "c", "job": "j"}, np.ones(N)
    yield ALLOC, {**GPU[1], "namespace": "ml", "pod": "a", "container": "c", "job": "j"}, np.ones(N)
    yield DCGM_UTIL, {"gpu": "0", "UUID": "GPU-0", "Hostname": "node-a"}, DCGM_VALUES


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory, promtool, prometheus_bin):
    """A real Prometheus on loopback serving the backfilled history; stopped at module end."""
    tmp = tmp_path_factory.mktemp("prom")
    om = tmp / "history.om"
    with open(om, "w", encoding="utf-8") as out:
        write_openmetrics(out, _series(), TIMES)
    with backfilled_prometheus(tmp, [om], promtool, prometheus_bin) as url:
        yield url


def _by_series(frame, label="gpu"):
    return {key: grp.sort_values("timestamp") for key, grp in frame.groupby(label, observed=True)}


def test_raw_query_range_chunked(prom_url):
    client = PrometheusClient(prom_url, max_points=7)
    frame, report = query_prometheus(client, [UTIL.name], T0, END, STEP, aggregate=False)
    assert client.requests_made == 7  # the series count, then ceil(40 / 7) chunks, one series each
    assert report.queries == {UTIL.name: UTIL.name}
    assert (report.samples, report.series) == (2 * N, 2)
    assert set(frame["metric"]) == {UTIL.name}
    assert {"hostname", "gpu", "uuid"} <= set(frame.columns)
    for g, grp in _by_series(frame).items():
        assert grp["timestamp"].tolist() == TIMES.tolist()
        assert grp["value"].tolist() == UTIL_VALUES[int(g)].tolist()
        assert set(grp["uuid"]) == {f"GPU-{g}"}


def test_gauge_average_pushed_down(prom_url):
    client = PrometheusClient(prom_url, max_points=4)
    start, step = T0 + 60, 60.0
    frame, report = query_prometheus(client, [UTIL.name], start, END, step, matchers={"hostname": "node-a"})
    assert report.queries[UTIL.name] == 'avg_over_time(truegpu_gpu_utilization_ratio{hostname="node-a"}[59999ms])'
    # the metric column holds the requested name even though the server drops __name__
    assert set(frame["metric"]) == {UTIL.name}
    points = np.arange(start, END + 1, step)
    for g, grp in _by_series(frame).items():
        assert grp["timestamp"].tolist() == points.tolist()
        want = [UTIL_VALUES[int(g)][(t - step < TIMES) & (t >= TIMES)].mean() for t in points]
        np.testing.assert_allclose(grp["value"].to_numpy(), want, rtol=1e-12)


def test_counter_increase_pushed_down(prom_url):
    client = PrometheusClient(prom_url)
    frame, report = query_prometheus(client, [ENERGY.name], T0 + 120, END, 60.0)
    assert report.queries[ENERGY.name].startswith("increase(truegpu_energy_joules_total[")
    assert len(frame) == 8 and set(frame["metric"]) == {ENERGY.name}
    # 10 J per 15 s, extrapolated over the 59.999 s window
    np.testing.assert_allclose(frame["value"].to_numpy(), 10.0 / 15.0 * 59.999, rtol=1e-9)


def test_hostile_label_value_cannot_break_out(prom_url):
    client = PrometheusClient(prom_url)
    frame, report = query_prometheus(client, [ALLOC.name], T0, END, 60.0, matchers={"pod": HOSTILE}, aggregate=False)
    assert report.series == 1 and set(frame["pod"]) == {HOSTILE}
    assert report.queries[ALLOC.name] == ALLOC.name + "{pod=" + promql_string(HOSTILE) + "}"
    # the same value as one of a list (escaped regex alternation) and via last_over_time
    frame, report = query_prometheus(
        client, [ALLOC.name], T0, END, 60.0, matchers={"pod": [HOSTILE, "a"]}, functions={ALLOC.name: "max_over_time"}
    )
    assert set(frame["pod"]) == {HOSTILE, "a"} and set(frame["value"]) == {1.0}
    frame, _ = query_prometheus(client, [ALLOC.name], T0, END, 60.0, matchers={"pod": ['a"}) or vector(1) #']})
    assert len(frame) == 0


def test_dcgm_sentinel_from_prometheus_is_nan(prom_url):
    client = PrometheusClient(prom_url)
    frame, report = query_prometheus(client, [DCGM_UTIL.name], T0, END, STEP, aggregate=False)
    values = frame["value"].to_numpy()
    assert np.isnan(values[SENTINEL_AT]) and np.all(np.delete(values, SENTINEL_AT) == 50.0)
    assert report.sentinels == {DCGM_UTIL.name: 1}
    assert set(frame["Hostname"]) == {"node-a"} and "hostname" not in frame.columns


def test_discovery_and_missing_metrics(prom_url):
    client = PrometheusClient(prom_url)
    wanted = [UTIL.name, SM_ACTIVE_FIELD, DCGM_UTIL.name, schema.SM_ACTIVE.name]
    assert client.existing_metrics(wanted, start=T0, end=END) == [UTIL.name, DCGM_UTIL.name]
    assert client.existing_metrics(wanted, matchers={"hostname": "node-a"}) == [UTIL.name]
    frame, report = query_prometheus(client, [UTIL.name, SM_ACTIVE_FIELD], T0, END, 60.0)
    assert report.missing == [SM_ACTIVE_FIELD] and set(frame["metric"]) == {UTIL.name}
    frame, report = query_prometheus(client, MetricFilter(prefixes=("truegpu_gpu_",)), T0, END, 60.0)
    assert set(frame["metric"]) == {UTIL.name, ALLOC.name}


def test_point_limit_needs_chunking(prom_url):
    unchunked = PrometheusClient(prom_url, max_points=10**6)
    with pytest.raises(PrometheusError) as err:
        unchunked.range_query(UTIL.name, T0, T0 + 11_001, 1.0)
    assert err.value.status == 400 and err.value.error_type == "bad_data" and err.value.too_big
    assert "11,000" in str(err.value) and prom_url in str(err.value)
    assert len(unchunked.query_range(UTIL.name, T0, T0 + 11_001, 1.0).series) == 2  # refused, then halved
    assert (unchunked.requests_made, unchunked.refusals) == (4, 1)
    client = PrometheusClient(prom_url)
    result = client.query_range(UTIL.name, T0, T0 + 11_001, 1.0)
    assert client.requests_made == 2 and len(result.series) == 2
    ts = result.series[0][1]
    assert ts[0] == T0 and np.all(np.diff(ts) == 1.0)  # no duplicate or missing point at the seam


def test_bad_promql_is_a_clear_error(prom_url):
    client = PrometheusClient(prom_url)
    with pytest.raises(PrometheusError, match=r"HTTP 400: bad_data: .*parse error"):
        client.query_range("rate(", T0, END, STEP)


# Loopback fake ---------------------------------------------------------------------------------
_CUT = -1  #: a scripted answer whose body is cut short (Prometheus restarted or killed while answering)


class _Fake:
    """Answers scripted (status, body) responses in turn (the last one repeats); records requests."""

    def __init__(self, responses):
        self.responses = list(responses)
        self.requests: list[tuple[str, dict[str, str], str]] = []
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def _answer(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length).decode() if length else ""
                fake.requests.append((self.path, dict(self.headers), body))
                status, payload = fake.responses.pop(0) if len(fake.responses) > 1 else fake.responses[0]
                data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                cut = status == _CUT  # the server dies mid-answer: fewer bytes than it declared
                self.send_response(200 if cut else status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data) + (100 if cut else 0)))
                self.end_headers()
                self.wfile.write(data)
                self.close_connection = cut

            do_GET = do_POST = _answer

            def log_message(self, *args):
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def fake():
    servers = []

    def start(*responses):
        servers.append(_Fake(responses))
        return servers[-1]

    yield start
    for s in servers:
        s.close()


def _matrix(values, warnings=None):
    body = {"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"__name__": "m", "gpu": "0"}, "values": values}]}}  # fmt: skip
    if warnings:
        body["warnings"] = warnings
    return body


def test_http_500_error_json_after_retries(fake):
    server = fake((500, {"status": "error", "errorType": "internal", "error": "boom"}))
    client = PrometheusClient(server.url, retries=2, backoff=0)
    with pytest.raises(PrometheusError) as err:
        client.query_range("m", 0, 10, 1)
    msg = str(err.value)
    assert "HTTP 500" in msg and "internal: boom" in msg and server.url in msg and "3 attempts" in msg
    assert len(server.requests) == 3


def test_retry_then_success_and_warnings_surface(fake):
    server = fake((503, b"overloaded"), (200, _matrix([[1, "1.5"], [2, "NaN"]], warnings=["partial response"])))
    client = PrometheusClient(server.url, retries=2, backoff=0)
    frame, report = query_prometheus(client, ["m"], 1, 2, 1, aggregate=False, plan=False)
    assert len(server.requests) == 2
    assert frame["timestamp"].tolist() == [1.0, 2.0] and frame["value"].iloc[0] == 1.5
    assert np.isnan(frame["value"].iloc[1])
    assert report.warnings == ["m: partial response"]
    path, _headers, body = server.requests[1]
    assert path == "/api/v1/query_range" and "query=m" in body and "step=1.0" in body


@pytest.mark.parametrize("compact", [True, False])  # labels decoded when read / with the rest of the answer
def test_labels_that_are_not_strings_name_the_answer(fake, compact):
    body = _matrix([[1, "1"]])
    body["data"]["result"][0]["metric"]["gpu"] = 0
    server = fake((200, orjson.dumps(body) if compact else body))
    with pytest.raises(PrometheusError) as err:
        query_prometheus(PrometheusClient(server.url), ["m"], 1, 1, 1, aggregate=False, plan=False)
    assert server.url in str(err.value) and "answer to 'm'" in str(err.value)
    assert "'metric' must map label names to strings" in str(err.value)


def test_an_answer_cut_short_is_retried_and_names_the_server(fake):
    server = fake((_CUT, _matrix([[1, "1"]])), (200, _matrix([[1, "2"]])))
    client = PrometheusClient(server.url, retries=2, backoff=0)
    frame, _ = query_prometheus(client, ["m"], 1, 1, 1, aggregate=False, plan=False)
    assert len(server.requests) == 2 and frame["value"].tolist() == [2.0]
    dead = fake((_CUT, _matrix([[1, "1"]])))
    with pytest.raises(PrometheusError, match="cannot reach Prometheus at " + dead.url) as err:
        PrometheusClient(dead.url, retries=1, backoff=0).query_range("m", 1, 1, 1)
    assert "2 attempts" in str(err.value)


def test_client_errors_are_not_retried(fake):
    server = fake((422, {"status": "error", "errorType": "execution", "error": "expanding series: boom"}))
    client = PrometheusClient(server.url, retries=3, backoff=0)
    with pytest.raises(PrometheusError, match="HTTP 422: execution: expanding series: boom") as err:
        client.query_range("m", 0, 10, 1)
    assert len(server.requests) == 1 and err.value.error == "expanding series: boom"


def test_bad_json_is_a_clear_error(fake):
    server = fake((200, b"<html>login</html>"))
    with pytest.raises(PrometheusError, match=r"invalid JSON .*<html>login"):
        PrometheusClient(server.url).query_range("m", 0, 10, 1)


def test_auth_and_custom_headers_are_sent(fake):
    server = fake((200, _matrix([[1, "1"]])))
    PrometheusClient(server.url, bearer_token="s3cret", headers={"X-Scope-OrgID": "team-a"}).query_range("m", 1, 1, 1)
    PrometheusClient(server.url, basic_auth=("user", "p:w")).query_range("m", 1, 1, 1)
    bearer, basic = server.requests[0][1], server.requests[1][1]
    assert bearer["Authorization"] == "Bearer s3cret" and bearer["X-Scope-OrgID"] == "team-a"
    assert basic["Authorization"] == "Basic " + base64.b64encode(b"user:p:w").decode()
    with pytest.raises(ValueError, match="not both"):
        PrometheusClient(server.url, bearer_token="x", basic_auth=("a", "b"))


def test_answers_are_not_compressed_from_this_machine_unless_asked(fake):
    """On loopback compression saves no network and costs both sides CPU; elsewhere gzip; a header decides."""
    server = fake((200, _matrix([[1, "1"]])), (200, _matrix([[1, "1"]])))
    PrometheusClient(server.url).query_range("m", 1, 1, 1)
    PrometheusClient(server.url, headers={"Accept-Encoding": "gzip"}).query_range("m", 1, 1, 1)
    assert server.requests[0][1]["Accept-Encoding"] == "identity"
    assert server.requests[1][1]["Accept-Encoding"] == "gzip"
    for url in ("http://localhost:9090", "http://[::1]:9090", "http://127.0.0.2"):
        assert PrometheusClient(url).session.headers["Accept-Encoding"] == "identity", url
    for url in ("http://prometheus.monitoring.svc:9090", "https://10.0.0.7", "https://mimir.example.com/prometheus"):
        assert "gzip" in PrometheusClient(url).session.headers["Accept-Encoding"], url


def test_unreachable_url_names_it():
    url = f"http://127.0.0.1:{free_port()}"
    client = PrometheusClient(url, retries=1, backoff=0, timeout=2)
    with pytest.raises(PrometheusError, match=r"cannot reach Prometheus at http://127\.0\.0\.1:\d+ .*2 attempts"):
        client.query_range("m", 0, 10, 1)
    assert client.requests_made == 2
    with pytest.raises(ValueError, match="http"):
        PrometheusClient("127.0.0.1:9090")


# PromQL building -------------------------------------------------------------------------------
def test_promql_string_escaping():
    assert promql_string("plain") == '"plain"'
    assert promql_string('a"b') == '"a\\"b"'
    assert promql_string("a\\b") == '"a\\\\b"'
    assert promql_string("a\nb\tc\rd\x01") == '"a\\nb\\tc\\rd\\x01"'
    hostile = 'a"}) or vector(1) #'
    quoted = promql_string(hostile)
    assert quoted == '"a\\"}) or vector(1) #"'
    # every quote inside is escaped: the literal ends only at the final quote
    assert quoted[1:-1].replace('\\"', "").count('"') == 0


def test_selector_and_matcher_validation():
    assert selector("m", {"a": "x", "b": Matcher("!~", "y.*"), "c": ["p.q", "r"]}) == (
        'm{a="x",b!~"y.*",c=~"p\\\\.q|r"}'
    )
    assert selector(None, {"__name__": Matcher("=~", "a|b")}) == '{__name__=~"a|b"}'
    for bad_metric in ("1abc", "m{", 'm"', "m) or vector(1)"):
        with pytest.raises(ValueError, match="invalid metric name"):
            selector(bad_metric)
    with pytest.raises(ValueError, match="invalid label name"):
        selector("m", {'a="x"} or vector(1) #': "v"})
    with pytest.raises(ValueError, match="operator"):
        selector("m", {"a": Matcher("==", "v")})
    with pytest.raises(ValueError, match="non-empty list"):
        selector("m", {"a": []})


def test_aggregation_helpers():
    assert duration(60) == "60s" and duration(59.999) == "59999ms" and duration(0.5) == "500ms"
    with pytest.raises(ValueError):
        duration(0.0001)
    assert aggregate_query("m", 30, function="max_over_time", window=120) == "max_over_time(m[120s])"
    with pytest.raises(ValueError, match="unsupported range function"):
        aggregate_query("m", 30, function="sum")
    assert default_function(schema.POWER.name) == "avg_over_time"
    assert default_function(schema.ENERGY.name) == "increase"
    assert default_function("DCGM_FI_DEV_CLOCKS_EVENT_REASONS") == "last_over_time"
    assert default_function("dcgm_fi_dev_xid_errors") == "last_over_time"
    assert default_function("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL") == "avg_over_time"  # a rate, not a counter
    assert default_function("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION") == "increase"
    assert default_function("node_cpu_seconds_total") == "increase"


def test_chunk_windows_cover_every_step_once():
    windows = chunk_windows(100.0, 100.0 + 24 * 5, 5.0, max_points=7)
    points = [t for s, e in windows for t in np.arange(s, e + 0.5, 5.0)]
    assert points == [100.0 + 5 * i for i in range(25)]
    assert all(round((e - s) / 5) + 1 <= 7 for s, e in windows)
    assert chunk_windows(0, 0, 1) == [(0, 0)]
    with pytest.raises(ValueError):
        chunk_windows(10, 0, 1)
