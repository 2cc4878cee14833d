"""Property tests (hypothesis, a fixed number of examples each) over every edge where outside data
comes in: OpenMetrics files through `truegpu analyze`, Prometheus API answers through the client,
and dcgm-exporter pages through the dcgm source and the collector.

Every bad input ends in a typed error naming where (exit code 2 on the CLI), or is dropped and
counted; no output ever holds a non-finite number or a value outside the metric contract's range.
"""

from __future__ import annotations

import json
import math
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client.parser import text_string_to_metric_families

from analyzer.data.ingest import PrometheusClient, PrometheusError
from exporter import schema as S
from exporter.collector import build_registry
from exporter.sources.dcgm import DcgmSource
from tests.httpstub import Endpoint
from truegpu.cli import main

T0 = 1_700_000_000
# capsys is read (and so cleared) on every example.
EXAMPLES = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

_NAMES = [S.GPU_UTILIZATION.name, S.SM_ACTIVE.name, S.TEMPERATURE.name, S.POWER.name, S.ENERGY.name,
          S.SM_CLOCK.name, S.SM_CLOCK_MAX.name, S.GPU_ALLOCATION_INFO.name, S.XID_ERRORS.name,
          S.GPU_UTILIZATION.dcgm[0].field, S.SM_ACTIVE.dcgm[0].field, "DCGM_FI_DEV_GPU_TEMP",
          "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS", "node_cpu_seconds_total"]
_LABELS = ['hostname="n1",gpu="0",uuid="GPU-0"', 'hostname="n1",gpu="1",uuid="GPU-1"',
           'gpu="0",UUID="GPU-0",Hostname="n1"', 'hostname="n1",gpu="0",uuid="GPU-0",sensor="gpu"', 'gpu="x"',
           'hostname="n1",gpu="0",uuid="GPU-0",pod="p",namespace="ns"', '',
           'gpu="0",uuid="GPU-0",hostname="n1",gpu_instance="1",mig_profile="1g.10gb"']
_VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "4294967295", "9223372036854775794", "2147483632", "1e308", "-1",
                     "5", "0", "1", "0.5", "97", "2100000000", "abc", "", "0x10", "1_000"]),
    st.integers(-10**20, 10**20).map(str),
)
_TIMES = st.one_of(st.integers(T0, T0 + 3600).map(str), st.sampled_from(["", "NaN", "+Inf", "-1", "x", "1e30"]))
_LINE = st.one_of(
    st.tuples(st.sampled_from(_NAMES), st.sampled_from(_LABELS), _VALUES, _TIMES).map(
        lambda t: f"{t[0]}{{{t[1]}}} {t[2]} {t[3]}".rstrip()),
    st.text(max_size=60).map(lambda s: s.replace("\n", " ")),
    st.sampled_from(["# TYPE truegpu_energy_joules counter", "# EOF", "# HELP x y", "{}", "x{", 'x{a="\\"} 1']),
)


def _strict(text: str) -> object:
    def refuse(name: str) -> None:
        raise AssertionError(f"non-strict JSON constant {name}")

    return json.loads(text, parse_constant=refuse)


@EXAMPLES
@given(lines=st.lists(_LINE, min_size=1, max_size=40), tail=st.booleans())
def test_openmetrics_file_through_analyze(capsys, lines: list[str], tail: bool) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "in.om"
        path.write_text("\n".join(lines) + ("\n# EOF\n" if tail else "\n"), encoding="utf-8")
        code = main(["analyze", "--json", "--quiet", "--input", str(path)])
    out, err = capsys.readouterr()
    assert "Traceback" not in err
    if code == 2:
        assert err.startswith("truegpu analyze: error: ") and out == ""
        return
    assert code == 0
    doc = _strict(out)
    s = doc["summary"]
    for key in ("reported_util", "effective_util", "fleet_reported_util", "fleet_effective_util", "masking_gap"):
        assert s[key] is None or -1.0 <= s[key] <= 1.0 + S.RATIO_TOLERANCE, (key, s[key])
    for key in ("gpu_hours", "unknown_gpu_hours", "unallocated_gpu_hours"):
        assert s[key] is None or s[key] >= 0.0


_JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_PAIR = st.one_of(
    st.tuples(st.integers(T0, T0 + 60), st.sampled_from(["1", "0.5", "NaN", "+Inf", "x", ""])).map(list),
    _JSON,
)
_SERIES = st.one_of(
    st.fixed_dictionaries({"metric": st.one_of(st.just({"gpu": "0", "uuid": "G"}), _JSON),
                           "values": st.one_of(st.lists(_PAIR, max_size=4), _JSON)}),
    _JSON,
)
_ANSWER = st.one_of(
    st.fixed_dictionaries({"status": st.sampled_from(["success", "error"]),
                           "data": st.one_of(
                               st.fixed_dictionaries({"resultType": st.sampled_from(["matrix", "vector"]),
                                                      "result": st.one_of(st.lists(_SERIES, max_size=4), _JSON)}),
                               _JSON),
                           "warnings": st.one_of(st.none(), st.lists(st.text(max_size=5), max_size=2), _JSON)}),
    _JSON,
).map(lambda doc: json.dumps(doc).encode())


@pytest.fixture(scope="module")
def endpoint() -> Iterator[Endpoint]:
    ep = Endpoint()
    ep.content_type = "application/json"
    yield ep
    ep.close()


@EXAMPLES
@given(body=st.one_of(_ANSWER, st.binary(max_size=40)), status=st.sampled_from([200, 400, 422, 500, 503]))
def test_prometheus_answers_parse_or_raise_one_typed_error(endpoint: Endpoint, body: bytes, status: int) -> None:
    endpoint.serve(body, status)
    with PrometheusClient(f"http://127.0.0.1:{endpoint.port}", timeout=2, retries=0) as client:
        try:
            result = client.query_range("up", T0, T0 + 60, 15)
        except PrometheusError as exc:
            assert str(exc).startswith("Prometheus") or "gave up" in str(exc)
            return
    assert status < 500
    for labels, ts, vs in result.series:
        assert all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items())
        assert len(ts) == len(vs) and all(math.isfinite(t) for t in ts)


def test_prometheus_answer_over_the_size_cap_is_refused(endpoint: Endpoint) -> None:
    endpoint.serve(b'{"status":"success","data":{"resultType":"matrix","result":[' + b" " * 4096 + b"]}}")
    client = PrometheusClient(f"http://127.0.0.1:{endpoint.port}", timeout=2, retries=0, max_response_bytes=1024)
    with client, pytest.raises(PrometheusError, match=r"answered more than 0 MiB.*narrow the query: --matcher"):
        client.query_range("up", T0, T0 + 60, 15)


_DCGM_FIELDS = [S.GPU_UTILIZATION.dcgm[0].field, S.SM_ACTIVE.dcgm[0].field, "DCGM_FI_DEV_GPU_TEMP",
                "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_XID_ERRORS",
                "DCGM_FI_DEV_CLOCKS_EVENT_REASONS", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_PCIE_LINK_GEN",
                "DCGM_FI_PROF_PCIE_TX_BYTES", "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_UNKNOWN"]
_DCGM_LABELS = ['gpu="0",UUID="GPU-a",device="nvidia0",modelName="NVIDIA H100",Hostname="n1"',
                'gpu="1",UUID="GPU-b",device="nvidia1",modelName="NVIDIA H100",hostname="n1"', 'gpu="2"', '']
_DCGM_LINE = st.one_of(
    st.tuples(st.sampled_from(_DCGM_FIELDS), st.sampled_from(_DCGM_LABELS), _VALUES).map(
        lambda t: f"{t[0]}{{{t[1]}}} {t[2]}"),
    st.text(max_size=40).map(lambda s: s.replace("\n", " ")),
)


@pytest.fixture(scope="module")
def dcgm_endpoint() -> Iterator[Endpoint]:
    ep = Endpoint()
    yield ep
    ep.close()


@EXAMPLES
@given(lines=st.lists(_DCGM_LINE, min_size=1, max_size=30))
def test_dcgm_pages_never_publish_an_invalid_value(dcgm_endpoint: Endpoint, lines: list[str]) -> None:
    dcgm_endpoint.serve("\n".join(lines) + "\n")
    source = DcgmSource(dcgm_endpoint.url, timeout=2.0, retries=0)  # type: ignore[arg-type]
    registry, collector = build_registry([source])
    try:
        text = collector_text(registry)
    finally:
        collector.close()
    for family in text_string_to_metric_families(text):
        metric = S.BY_NAME.get(family.name) or S.BY_NAME.get(family.name + "_total")
        for sample in family.samples:
            assert math.isfinite(sample.value), sample
            if metric is not None and sample.name in (metric.name, metric.family_name):
                lo, hi = metric.valid_range
                assert lo <= sample.value <= hi, sample


def collector_text(registry) -> str:
    from prometheus_client import generate_latest

    return generate_latest(registry).decode()
