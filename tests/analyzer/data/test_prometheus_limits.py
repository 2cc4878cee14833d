"""Reading Prometheus within its limits: the planner, the retry on "too many samples", parallel
requests and the fast matrix decoder, against a REAL Prometheus started with a tiny
``--query.max-samples`` (500: every metric of the scenario is refused whole by it).

Whatever the split, the order of answers or the decoder, the result must be exactly the same
frame as one unsplit read from a stock server, and match the file it was backfilled from.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import orjson
import pandas as pd
import pytest
import requests

from analyzer.data import dialects as D
from analyzer.data.ingest import LabelSets, PrometheusClient, PrometheusError, query_prometheus
from analyzer.data.ingest import matrix as mx
from analyzer.data.ingest import prometheus as prometheus_ingest
from analyzer.data.ingest.plan import Shard, chunk_windows, cost, halve_window, plan
from analyzer.data.load import load_files, load_prometheus
from analyzer.data.normalize import normalize
from exporter import schema as S
from exporter.simulator.history import write_history
from tests.analyzer.data.kit import STEP, assert_matches, cluster, window
from tests.realprom import backfilled_prometheus
from truegpu.cli import main

SCENARIO = "xid-faults"
LIMIT = 500
#: 32 GPUs on 4 hosts: 288 series (72 a host) x 31 steps is ~9,000 samples, refused under LIMIT.
BIG = S.CLOCK_EVENT_ACTIVE.name


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("limits")
    start, end = window(SCENARIO)
    path = tmp / "history.om"
    write_history(path, cluster(SCENARIO), start, end + STEP, STEP)
    return path


@pytest.fixture(scope="module")
def stock_url(tmp_path_factory, history, promtool, prometheus_bin):
    with backfilled_prometheus(tmp_path_factory.mktemp("stock"), [history], promtool, prometheus_bin) as url:
        yield url


@pytest.fixture(scope="module")
def tight_url(tmp_path_factory, history, promtool, prometheus_bin):
    """The same history behind a server that refuses any query holding more than LIMIT samples."""
    tmp = tmp_path_factory.mktemp("tight")
    with backfilled_prometheus(tmp, [history], promtool, prometheus_bin, [f"--query.max-samples={LIMIT}"]) as url:
        yield url


def _read(url: str, **client) -> tuple[pd.DataFrame, PrometheusClient, list[str]]:
    """The long frame of every metric the analysis reads, the client that read it and the metrics."""
    start, end = window(SCENARIO)
    with PrometheusClient(url, **client) as c:
        names = c.existing_metrics(sorted(D.needed_names()), start=start, end=end)
        frame, _report = query_prometheus(c, names, start, end, STEP)
    return frame, c, names


def _frame(url: str, **client) -> tuple[pd.DataFrame, PrometheusClient]:
    frame, c, _names = _read(url, **client)
    return frame, c


def test_the_tight_server_refuses_a_whole_metric(tight_url):
    start, end = window(SCENARIO)
    with pytest.raises(PrometheusError) as err:
        PrometheusClient(tight_url).range_query(f"max_over_time({BIG}[1m])", start, end, STEP)
    assert err.value.status == 422 and err.value.too_big and "too many samples" in str(err.value)


def test_real_answers_take_the_fast_way(stock_url):
    start, end = window(SCENARIO)
    resp = requests.post(f"{stock_url}/api/v1/query_range", data={
        "query": f"max_over_time({BIG}[1m])", "start": start, "end": end, "step": STEP}, timeout=30)
    cut = mx.cut(resp.content)
    assert cut is not None and len(cut.spans) == 288
    got = mx.decode(resp.content, cut, orjson.loads(cut.skeleton))
    want = mx.decode(resp.content, None, orjson.loads(resp.content))
    np.testing.assert_array_equal(got.values, want.values)
    assert got.labels == want.labels and got.counts.tolist() == want.counts.tolist()


def test_planned_under_the_limit_gives_the_stock_frame_without_a_refusal(stock_url, tight_url):
    want, stock, names = _read(stock_url)
    got, tight = _frame(tight_url, max_samples=LIMIT)
    pd.testing.assert_frame_equal(got, want)
    assert tight.refusals == 0 and stock.refusals == 0
    # stock: the series count showed every metric small, so no lookup: names, count, one request a metric
    assert stock.requests_made == 2 + len(names)
    assert tight.requests_made > 2 * stock.requests_made  # split by host and by time


def test_a_read_that_remembers_the_last_gives_the_same_frame_without_counting(stock_url, tight_url):
    """serve reads the same series every tick: the next read takes their label sets and each metric's series
    from the last one (no count request) and gives the frame a fresh read gives, planned under a tight limit.
    (Metrics without points are left out: their series are not known, so they are counted every time.)"""
    want, _stock, names = _read(stock_url)
    start, end = window(SCENARIO)
    with PrometheusClient(stock_url) as c:
        names = [n for n in names if n not in query_prometheus(c, names, start, end, STEP)[1].missing]
    for url, client in ((stock_url, {}), (tight_url, {"max_samples": LIMIT})):
        labelsets, made, numbered, looked_up = LabelSets(), [], [], []
        get = labelsets.get
        for _ in range(3):
            labelsets.turn()
            calls = []
            labelsets.get = lambda raw, calls=calls, get=get: calls.append(raw) or get(raw)
            with PrometheusClient(url, **client) as c:
                frame, _report = query_prometheus(c, names, start, end, STEP, labelsets=labelsets)
            pd.testing.assert_frame_equal(frame, want)
            assert c.refusals == 0
            made.append(c.requests_made)
            numbered.append(labelsets.space.group.n)
            looked_up.append(len(calls))
        # no count; under the tight limit the plan may differ too (the count at ``end`` misses series that ended)
        assert made[1] == made[2] == made[0] - 1 if url == stock_url else made[1] == made[2] < made[0], made
        assert numbered[0] == numbered[1] == numbered[2] > 0  # the series kept their numbers: none were added
        # One answer a metric naming the same series as the last read: its ordering and numbering are taken
        # as they were (split by time, under the tight limit, a series comes twice: worked out each read).
        assert looked_up[0] > 0 and (looked_up[1:] == [0, 0] if url == stock_url else looked_up[1] > 0)
    # Compact reads of the same series hand out the same series table, and what normalize works out from it
    # (its per-series tables) is kept with it: the next read's Fleet is the one worked out from scratch.
    samples = []
    for _ in range(2):
        labelsets.turn()
        with PrometheusClient(stock_url) as c:
            samples.append(query_prometheus(c, names, start, end, STEP, labelsets=labelsets, compact=True)[0])
        fleet = normalize(samples[-1], step=STEP, start=start, end=end)
    assert samples[1].series is samples[0].series and samples[1].memo is samples[0].memo and samples[0].memo
    fresh = normalize(dataclasses.replace(samples[1], memo=None), step=STEP, start=start, end=end)
    pd.testing.assert_frame_equal(fleet.frame, fresh.frame)
    assert fleet.notes == fresh.notes and fleet.dialect == fresh.dialect
    # The numbering starts over once it holds more than twice the series the last read used (plus a spare).
    labelsets, kept = LabelSets(), []
    labelsets.spare = 0
    for metrics in (names, names[:1], names):
        space = labelsets.space
        labelsets.turn()
        kept.append(labelsets.space is space)
        with PrometheusClient(stock_url) as c:
            frame, _report = query_prometheus(c, metrics, start, end, STEP, labelsets=labelsets)
    assert kept == [True, True, False]  # the second read used a few series of the first's many
    pd.testing.assert_frame_equal(frame, want)


def test_label_sets_not_named_by_the_last_two_reads_are_forgotten():
    labelsets = LabelSets()
    gpu, pod = (("gpu", "0"), ("Hostname", "n1"), ("replica", "a")), (("pod", "p-0"), ("uuid", ""))
    kept, gone = labelsets.get(gpu), labelsets.get(pod)
    assert kept.key == (("Hostname", "n1"), ("gpu", "0")) and kept.replicas == (("replica", "a"),)
    assert gone.pairs == (("pod", "p-0"),)  # an empty value is no label
    labelsets.turn()  # a read that names only the GPU
    assert labelsets.get(gpu) is kept
    labelsets.turn()
    assert labelsets.get(gpu) is kept  # named by the last read: kept
    assert labelsets.get(pod) is not gone and labelsets.get(pod) == gone  # named by neither: worked out anew


def test_refusals_are_halved_until_they_pass(stock_url, tight_url):
    want, _ = _frame(stock_url)
    got, client = _frame(tight_url)  # told nothing: assumes 50 M, learns from the 422s
    pd.testing.assert_frame_equal(got, want)
    assert client.refusals > 0


def test_parallel_requests_give_the_same_frame(tight_url):
    one, _ = _frame(tight_url, max_samples=LIMIT, concurrency=1)
    many, _ = _frame(tight_url, max_samples=LIMIT, concurrency=8)
    pd.testing.assert_frame_equal(many, one)


def test_a_metric_added_a_few_points_at_a_time_gives_the_same_frame(tight_url, monkeypatch):
    """A metric's answers go to the builder in chunks of series (never copied whole): chunks cutting through
    answers split by host and time give the frame one chunk gives."""
    whole, _ = _frame(tight_url, max_samples=LIMIT)
    monkeypatch.setattr(prometheus_ingest, "_ADD_CHUNK", 7)
    cut, _ = _frame(tight_url, max_samples=LIMIT)
    pd.testing.assert_frame_equal(cut, whole)


def test_load_prometheus_under_a_tight_limit_is_the_stock_and_the_file_fleet(history, stock_url, tight_url):
    start, end = window(SCENARIO)
    want = load_prometheus(stock_url, start, end, STEP)
    for kwargs in ({"max_samples": LIMIT}, {"concurrency": 1}, {}):
        got = load_prometheus(tight_url, start, end, STEP, **kwargs)
        pd.testing.assert_frame_equal(got.frame, want.frame)
    assert_matches(want, load_files(history, start=start, end=end))


def test_the_cli_passes_max_samples_and_concurrency(tight_url, capsys):
    start, end = window(SCENARIO)
    args = ["analyze", "--json", "--quiet", "--prometheus", tight_url, "--start", str(start), "--end", str(end),
            "--step", "60s", "--max-samples", str(LIMIT), "--concurrency", "2"]
    assert main(args) == 0
    assert json.loads(capsys.readouterr().out)["summary"]["gpus"] == 32
    with pytest.raises(SystemExit):
        main([*args[:-4], "--max-samples", "0"])
    assert "at least 1" in capsys.readouterr().err


def test_refused_at_one_step_names_url_query_and_limit(tight_url):
    start, _ = window(SCENARIO)
    everything = '{__name__=~"truegpu_.+"}'  # ~2,000 series: over LIMIT even at one step
    client = PrometheusClient(tight_url, max_samples=LIMIT)
    with pytest.raises(PrometheusError) as err:
        client.query_range(everything, start, start + 3 * STEP, STEP)
    msg = str(err.value)
    assert tight_url in msg and repr(everything) in msg and f"max_samples={LIMIT}" in msg
    assert "too many samples" in msg and err.value.status == 422
    assert client.refusals == 3  # 4 steps, 2 steps, then one step: refused each time


# The planner -----------------------------------------------------------------------------------
def _hosts(n_hosts: int, per_host: int, unlabelled: int = 0) -> list[dict[str, str]]:
    series = [{"hostname": f"h{h:03d}", "gpu": str(g)} for h in range(n_hosts) for g in range(per_host)]
    return series + [{"gpu": str(g)} for g in range(unlabelled)]


def _selected(shard: Shard, series: list[dict[str, str]]) -> list[dict[str, str]]:
    """What the shard's matcher selects on the server: its hosts, or what is not one of the others'."""
    if shard.label is None:
        return series
    if shard.rest:
        return [s for s in series if s.get(shard.label, "") not in shard.others]
    return [s for s in series if s.get(shard.label) in shard.hosts]


@pytest.mark.parametrize(("budget", "unlabelled"), [(10**9, 0), (5000, 3), (700, 0), (100, 5), (1, 0)])
def test_plan_covers_every_series_once_under_the_budget(budget, unlabelled):
    series = [*_hosts(37, 8, unlabelled), {"hostname": "late-host", "gpu": "0"}]  # not in the lookup
    looked_up = series[:-1]
    p = plan(looked_up, 0.0, 299 * 60.0, 60.0, budget, max_points=120)
    chosen = [id(s) for shard in p.shards for s in _selected(shard, series)]
    assert sorted(chosen) == sorted(map(id, series))  # a partition, the unseen host included
    steps = [round((e - s) / 60.0) + 1 for s, e in p.windows]
    assert max(steps) <= 120 and p.windows == tuple(chunk_windows(0.0, 299 * 60.0, 60.0, max(steps)))
    for shard in p.shards:
        n = len(_selected(shard, looked_up))
        assert cost(n, max(steps)) <= budget or (n <= 8 and max(steps) == 1)  # one host is the floor
    if budget == 10**9:
        assert (len(p.shards), len(p.windows)) == (1, 3)


def test_plan_without_a_host_label_splits_by_time():
    p = plan([{"gpu": str(g)} for g in range(50)], 0.0, 99 * 60.0, 60.0, 1000)
    assert p.shards == (Shard(),) and len(p.windows) == 6 and p.peak <= 1000


def test_halves_partition_a_shard():
    series = _hosts(5, 2, unlabelled=2)
    rest = Shard("hostname", ("h002", "h003", "h004"), (2, 2, 2), others=("h000", "h001"))
    first, second = rest.halves()
    assert not first.rest and second.rest and second.others == ("h000", "h001", *first.hosts)
    assert sorted(map(id, _selected(first, series) + _selected(second, series))) == \
        sorted(map(id, _selected(rest, series)))
    assert Shard("hostname", ("h000",), (2,)).halves() is None
    assert halve_window(0.0, 60.0, 15.0) == ((0.0, 15.0), (30.0, 60.0))
    assert halve_window(0.0, 0.0, 15.0) is None


# The decoder -----------------------------------------------------------------------------------
def _both_ways(content: bytes) -> tuple[mx.Matrix | str, mx.Matrix | str]:
    """(fast, general) decoding of one answer; an error as its message."""
    out = []
    for fast in (True, False):
        cut = mx.cut(content) if fast else None
        try:
            body = orjson.loads(cut.skeleton if cut else content)
            out.append(mx.decode(content, cut, body))
        except ValueError as exc:
            out.append(str(exc))
    return out[0], out[1]


def _answer(series: list[tuple[dict, list]]) -> bytes:
    result = [{"metric": labels, "values": values} for labels, values in series]
    return orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": result}})


def test_fast_decoder_is_exact_and_the_same_as_the_general_one():
    rng = np.random.default_rng(5)
    values = np.concatenate([rng.random(300), rng.random(100) * 1e12, -rng.random(100) * 1e-9,
                             [np.nan, np.inf, -np.inf, 0.0, 9223372036854775794.0]])
    text = ["NaN" if np.isnan(v) else ("+Inf" if v == np.inf else "-Inf" if v == -np.inf else repr(float(v)))
            for v in values]
    ts = 1_700_000_000 + 15 * np.arange(len(values))
    pairs = [[int(t) if i % 2 else float(t) + 0.5, v] for i, (t, v) in enumerate(zip(ts, text, strict=True))]
    content = _answer([({"gpu": "0", "x": 'a"]],[1,"2"]'}, pairs[:200]), ({"gpu": "1"}, []),
                       ({"gpu": "2"}, pairs[200:])])
    assert mx.cut(content) is not None
    fast, general = _both_ways(content)
    assert fast.labels == general.labels and fast.counts.tolist() == [200, 0, len(values) - 200]
    np.testing.assert_array_equal(fast.values, values)
    np.testing.assert_array_equal(fast.timestamps, general.timestamps)
    np.testing.assert_array_equal(fast.values, general.values)


@pytest.mark.parametrize("values", [
    [[1, "1"], [2]], [[1, "1", 3], [2, "2"]], [[1, "x"]], [[1, ""]], [[1, "nan"]], [["t", "1"]],
    [[1, "2]"]], [[1, "1,5"]], [[1, {"a": 1}]], [[None, "1"]],
])  # fmt: skip
def test_fast_decoder_falls_back_on_anything_unusual(values):
    fast, general = _both_ways(_answer([({"gpu": "0"}, values)]))
    if isinstance(general, str):
        assert fast == general and general.startswith("malformed answer")
    else:
        np.testing.assert_array_equal(fast.values, general.values)
        np.testing.assert_array_equal(fast.timestamps, general.timestamps)


@pytest.mark.parametrize("series", [
    {"values": [[1, "1"]], "metric": {"gpu": "0"}},  # points first
    {"metric": {"gpu": "0"}, "extra": {"a": "b"}, "values": [[1, "1"]]},  # another key in between
    {"metric": {"gpu": "0"}, "values": [[1, "1"]], "histograms": []},  # another key after
    {"metric": {"gpu": "x},"}, "values": [[1, "1"]]},  # a label value that ends like another key's start
])  # fmt: skip
def test_series_not_exactly_labels_then_points_take_the_general_way(series):
    content = orjson.dumps({"status": "success", "data": {"resultType": "matrix", "result": [series]}})
    assert mx.cut(content) is None
    fast, general = _both_ways(content)
    assert fast.labels == general.labels == [series["metric"]] and fast.values.tolist() == [1.0]


def test_labels_are_decoded_when_asked_with_the_general_way_s_error():
    fast, general = _both_ways(_answer([({"gpu": "0"}, [[1, "1"]]), ({"gpu": 1}, [[1, "2"]])]))
    assert general == "malformed answer: data.result[1]: 'metric' must map label names to strings"
    assert fast.values.tolist() == [1.0, 2.0] and fast.raw_labels == [b'{"gpu":"0"}', b'{"gpu":1}']
    with pytest.raises(ValueError, match=r"^malformed answer: data.result\[1\]: 'metric' must map label names"):
        _ = fast.labels


def test_pretty_printed_answers_take_the_general_way():
    content = json.dumps({"status": "success", "data": {"resultType": "matrix", "result": [
        {"metric": {"gpu": "0"}, "values": [[1, "0.5"], [2, "NaN"]]}]}}, indent=2).encode()  # fmt: skip
    assert mx.cut(content) is None
    fast, _ = _both_ways(content)
    assert fast.values[0] == 0.5 and np.isnan(fast.values[1])
