"""A second real engine (issue 15): the same simulated history read from a real VictoriaMetrics, from
a real Prometheus and from the file gives the same findings and GPU-hour totals, in both dialects.

The history is scraped every 30 s and analysed at 60 s, so every row aggregates several samples:
an engine that evaluates the steps at other instants (VictoriaMetrics rounds a cacheable range of
50+ points to multiples of step unless asked ``nocache``) or windows them differently moves samples
between rows, and its frame stops matching Prometheus'.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack

import numpy as np
import pytest

from analyzer.data.frame import Fleet
from analyzer.data.ingest.prometheus import PrometheusClient
from analyzer.data.load import load_files, load_prometheus
from analyzer.findings import Finding
from analyzer.pipeline import Result, analyze
from exporter import schema as S
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import Mess, write_history
from exporter.simulator.model import Cluster
from exporter.simulator.scenario import load_scenario
from tests.analyzer.data.kit import _events
from tests.realprom import backfilled_prometheus
from tests.realvm import imported_victoriametrics

SCENARIO = "multi-fault"
SCRAPE, STEP, SPAN = 30.0, 60.0, 3600.0
#: 50 min in: the thermal straggler and the hot GPU of train-a, the XID at 1h10m, rack dc1-r2's cooling from 1h.
OFFSET = 3000.0
ENGINES = ("prometheus", "victoriametrics")


@pytest.fixture(scope="module", params=["truegpu", "dcgm"])
def setup(request, tmp_path_factory, promtool, prometheus_bin, victoriametrics_bin) -> Iterator[dict]:
    """The history's window, both servers' URLs (running) and the fleet read from the file and from each."""
    dialect = request.param
    tmp = tmp_path_factory.mktemp(f"vm-{dialect}")
    cluster = Cluster(load_scenario(SCENARIO))
    start = cluster.start + OFFSET
    end = start + SPAN
    path = tmp / "history.om"
    write_history(path, cluster, start, end + STEP, SCRAPE, dialect=dialect, dcgm_options=DcgmOptions(counters="all"))
    (tmp / "prometheus").mkdir()
    (tmp / "victoriametrics").mkdir()
    with ExitStack() as servers:
        urls = {
            "prometheus": servers.enter_context(
                backfilled_prometheus(tmp / "prometheus", [path], promtool, prometheus_bin)),
            "victoriametrics": servers.enter_context(
                imported_victoriametrics(tmp / "victoriametrics", [path], victoriametrics_bin)),
        }
        fleets = {"file": load_files(path, start=start, end=end, step=STEP)}
        fleets.update((e, load_prometheus(urls[e], start, end, STEP)) for e in ENGINES)
        yield {"dialect": dialect, "start": start, "end": end, "urls": urls, "fleets": fleets}


def _entity(f: Finding) -> tuple:
    return (f.kind, f.hostname or "", -1 if f.gpu is None else f.gpu, f.uuid or "", f.gpu_instance or "",
            f.job or "", f.namespace or "", f.pod or "", f.rack or "")


def _same_time(a: float | None, b: float | None) -> bool:
    return (a is None and b is None) or (a is not None and b is not None and abs(a - b) <= STEP)


def assert_same_fleet(vm: Fleet, prom: Fleet) -> None:
    """Row for row: every signal, every device's identity and allocation, the XID events, what is missing."""
    assert vm.dialect == prom.dialect
    assert (vm.step, vm.start, vm.end) == (prom.step, prom.start, prom.end)
    a, b = vm.frame, prom.frame
    assert list(a.columns) == list(b.columns) and len(a) == len(b) > 0
    for col in a.columns:
        x, y = a[col].to_numpy(), b[col].to_numpy()
        if x.dtype.kind in "fiub":
            # VictoriaMetrics keeps ~15 significant digits: counter differences carry a tiny error, and a flat
            # counter of ~1e15 may read its last digit one higher over a step (~0.02 B/s next to GB/s rates)
            x, y = x.astype(float), y.astype(float)
            scale = float(np.nanmax(np.abs(y))) if np.isfinite(y).any() else 0.0
            np.testing.assert_allclose(x, y, rtol=1e-6, atol=1e-11 * scale, equal_nan=True, err_msg=col)
        else:
            np.testing.assert_array_equal(x.astype(str), y.astype(str), err_msg=col)
    assert _events(vm) == _events(prom)
    assert vm.missing == prom.missing


def test_victoriametrics_reads_what_prometheus_reads(setup):
    prom, vm = (setup["fleets"][e] for e in ENGINES)
    assert vm.dialect == setup["dialect"] and len(vm.events)
    assert_same_fleet(vm, prom)
    # the server-side aggregations never answer NaN for a sample the history holds (it would read as input NaN)
    assert [[n for n in f.notes if "NaN" in n] for f in setup["fleets"].values()] == [[], [], []]


def assert_same_results(got: Result, want: Result, what: str) -> None:
    """Same findings (kind, entity, start and end within a step) and the same GPU-hour partition."""
    got_f, want_f = (sorted(r.findings, key=lambda f: (_entity(f), f.start)) for r in (got, want))
    assert [_entity(f) for f in got_f] == [_entity(f) for f in want_f], what
    for g, w in zip(got_f, want_f, strict=True):
        assert _same_time(g.start, w.start) and _same_time(g.end, w.end), (what, g, w)
    assert got.scores.partition.fleet == pytest.approx(want.scores.partition.fleet, rel=1e-6, abs=1e-9), what


def test_same_findings_and_totals_from_either_engine_and_the_file(setup):
    results = {name: analyze(fleet) for name, fleet in setup["fleets"].items()}
    kinds = {f.kind for f in results["file"].findings}
    assert {"straggler", "thermal", "gpu_fault"} <= kinds, kinds
    assert results["file"].scores.partition.fleet["waste_gpu_hours"] > 0
    for engine in ENGINES:
        assert_same_results(results[engine], results["file"], engine)


def test_steps_land_on_the_instants_asked_for(setup):
    """A 60-point range (over VictoriaMetrics' rounding threshold of 50) one ms before each row's end."""
    first = setup["start"] + STEP - 0.001
    name = S.GPU_UTILIZATION.name if setup["dialect"] == "truegpu" else S.GPU_UTILIZATION.dcgm[0].field
    for engine in ENGINES:
        with PrometheusClient(setup["urls"][engine]) as client:
            result = client.query_range(f"avg_over_time({name}[60s])", first, setup["end"] - 0.001, STEP)
        assert result.series, engine
        for _, ts, _ in result.series:
            np.testing.assert_allclose(ts, first + STEP * np.arange(60), rtol=0, atol=1e-6, err_msg=engine)


def test_no_data_in_the_window_is_a_clear_error(setup):
    """VictoriaMetrics indexes metric names per day: an empty window on a day with data still finds the
    names, then gets no samples; either way the error names the server and says there is no telemetry."""
    start = setup["start"] - OFFSET  # the same day, before the history
    for engine in ENGINES:
        url = setup["urls"][engine]
        with pytest.raises(ValueError, match=rf"{url}.*no GPU telemetry|no GPU telemetry at {url}"):
            load_prometheus(url, start, start + 1200.0, STEP)


def test_messy_telemetry_reads_the_same_as_prometheus(tmp_path, promtool, prometheus_bin, victoriametrics_bin):
    """Whole-node scrape gaps, an exporter restart (counters from 0), every 7th sample written twice and
    an HA pair: VictoriaMetrics reads what Prometheus reads (it needs ``-dedup.minScrapeInterval``,
    or it averages the repeated samples in), so the findings and totals are the same."""
    cluster = Cluster(load_scenario("messy-telemetry"))
    start = cluster.start + 2400.0  # 40 min: inside the straggler, before the gaps
    end = start + 2400.0
    mess = Mess(node_gaps=(("dc1-r1-n01", 300.0, 240.0), ("dc1-r2-n01", 600.0, 240.0), ("dc1-r2-n02", 1500.0, 180.0)),
                exporter_restarts=(("dc1-r1-n02", 1800.0),), repeat_every=7, replicas=("prom-a", "prom-b"))
    path = tmp_path / "history.om"
    write_history(path, cluster, start, end + STEP, SCRAPE, mess=mess)
    (tmp_path / "prometheus").mkdir()
    (tmp_path / "victoriametrics").mkdir()
    with backfilled_prometheus(tmp_path / "prometheus", [path], promtool, prometheus_bin) as url:
        prom = load_prometheus(url, start, end, STEP)
    with imported_victoriametrics(tmp_path / "victoriametrics", [path], victoriametrics_bin, dedup=True) as url:
        vm = load_prometheus(url, start, end, STEP)
    assert np.isnan(prom.frame["gpu_util"]).any()  # the gaps are unknown, not filled in
    assert_same_fleet(vm, prom)
    assert_same_results(analyze(vm), analyze(prom), "messy")
