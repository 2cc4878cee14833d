"""The compact ingest form (analyzer.data.ingest.samples): what the readers hand to normalize instead of a
long frame. It must give exactly the Fleet the long frame gives, keep every value bit for bit while
storing float32 only where that is exact, and not depend on how samples were buffered or chunked."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.data import normalize as normalize_module
from analyzer.data.coverage import DATA_SHARE
from analyzer.data.frame import Fleet
from analyzer.data.ingest import IngestReport, Samples, read_openmetrics
from analyzer.data.ingest._common import FrameBuilder
from analyzer.data.load import load_files, metric_filter
from analyzer.data.normalize import normalize
from analyzer.data.signals import ALLOCATION_COLUMNS, DEVICE_COLUMNS, NAMES, PLACEMENT_COLUMNS
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import Mess, write_history
from exporter.simulator.model import Cluster
from exporter.simulator.scenario import load_scenario

STEP = 60.0
T0 = 1_700_000_000


@pytest.fixture(scope="module")
def messy_dcgm(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """dcgm-exporter history with every kind of mess: gaps, repeats, an HA pair, pods renamed mid-run
    (several series per timeline), XIDs."""
    cluster = Cluster(load_scenario("idle-waste"))
    path = tmp_path_factory.mktemp("dcgm") / "h.om"
    mess = Mess(node_gaps=(("dc1-r2-n02", 2100.0, 240.0),), repeat_every=3,
                replicas=("prometheus-k8s-0", "prometheus-k8s-1"),
                pod_restarts=(("embed-batch-mbt9x", 5400.0), ("nb-carol-4tfwd", 5400.0)))  # fmt: skip
    write_history(path, cluster, cluster.start, cluster.start + cluster.duration, STEP, dialect="dcgm",
                  dcgm_options=DcgmOptions(counters="all"), mess=mess)
    return path


@pytest.fixture(scope="module")
def truegpu(tmp_path_factory: pytest.TempPathFactory) -> Path:
    cluster = Cluster(load_scenario("mixed-fleet"))
    path = tmp_path_factory.mktemp("truegpu") / "h.om"
    write_history(path, cluster, cluster.start + 5100, cluster.start + 6900, 15.0)
    return path


def assert_same_fleet(got: Fleet, want: Fleet) -> None:
    pd.testing.assert_frame_equal(got.frame, want.frame)
    pd.testing.assert_frame_equal(got.events, want.events)
    pd.testing.assert_frame_equal(got.topology, want.topology)
    assert (got.step, got.start, got.end, got.dialect) == (want.step, want.start, want.end, want.dialect)
    assert got.notes == want.notes and got.missing == want.missing


@pytest.mark.parametrize("name", ["messy_dcgm", "truegpu"])
def test_compact_and_long_frame_input_give_the_same_fleet(name, request):
    path = request.getfixturevalue(name)
    samples, report = read_openmetrics(path, compact=True)
    long, long_report = read_openmetrics(path)
    assert report == long_report
    want = normalize(long, report=long_report)
    assert_same_fleet(normalize(samples, report=report), want)
    needed, needed_report = read_openmetrics(path, compact=True, metric_filter=metric_filter())
    assert_same_fleet(load_files(path), normalize(needed, report=needed_report))
    leading = ["timestamp", *DEVICE_COLUMNS, *PLACEMENT_COLUMNS, "gpu_share", *ALLOCATION_COLUMNS, DATA_SHARE]
    assert list(want.frame.columns) == leading + [n for n in NAMES if n in want.frame.columns]
    if name == "messy_dcgm":  # the mess is there, and said
        assert report.duplicates and report.replicas and any("HA Prometheus" in n for n in want.notes)


def test_long_frame_round_trips_through_samples(messy_dcgm):
    samples, _ = read_openmetrics(messy_dcgm, compact=True)
    again = Samples.from_frame(samples.frame())
    pd.testing.assert_frame_equal(again.series, samples.series)
    assert [b.metric for b in again.blocks] == [b.metric for b in samples.blocks]
    for a, b in zip(again.blocks, samples.blocks, strict=True):
        assert a.first == b.first and a.val.dtype == b.val.dtype
        np.testing.assert_array_equal(a.bounds, b.bounds)
        np.testing.assert_array_equal(a.timestamps(), b.timestamps())
        np.testing.assert_array_equal(a.val, b.val)


def test_chunks_and_flushes_do_not_change_the_result(messy_dcgm, monkeypatch):
    """Tiny flushes (pieces of every group, time tables per flush) and tiny normalize chunks (timelines of
    several series merged, counters across chunk edges) give what one flush and one chunk give."""
    samples, report = read_openmetrics(messy_dcgm, compact=True)
    want = normalize(samples, report=report)
    monkeypatch.setattr(FrameBuilder, "FLUSH", 97)
    small, small_report = read_openmetrics(messy_dcgm, compact=True, chunk_bytes=32768)  # ~7,000 reads, mid-line
    assert small_report == report
    pd.testing.assert_frame_equal(small.frame(), samples.frame())
    monkeypatch.setattr(normalize_module, "_CHUNK", 50)
    got = normalize(small, report=small_report)
    pd.testing.assert_frame_equal(got.frame, want.frame, check_exact=False, rtol=1e-12)  # sums split in chunks
    pd.testing.assert_frame_equal(got.events, want.events)
    assert got.notes == want.notes and got.missing == want.missing


def test_float32_only_where_exact_and_counters_keep_every_digit(tmp_path):
    energy, util, power = "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_POWER_USAGE"
    lab = '{gpu="0",UUID="GPU-0",Hostname="n1"}'
    # mJ since boot: far above 2**24, where float32 would round to a multiple of 64 or more
    mj = [123_456_789_012 + 17 * i for i in range(5)]
    text = "".join(f"{energy}{lab} {v} {T0 + 15 * i}\n" for i, v in enumerate(mj))
    text += "".join(f"{util}{lab} {v} {T0 + 15 * i}\n" for i, v in enumerate([0, 37, 100, 99, 1]))
    text += "".join(f"{power}{lab} {v} {T0 + 15 * i}\n" for i, v in enumerate([301.27, 299.5, 0.1, 350.0, 1e-3]))
    path = tmp_path / "in.prom"
    path.write_text(text)
    samples, _ = read_openmetrics(path, compact=True)
    dtypes = {b.metric: b.val.dtype for b in samples.blocks}
    assert dtypes == {energy: np.float64, util: np.float32, power: np.float64}
    frame = samples.frame()
    got = frame.groupby("metric", observed=True)["value"].apply(list).to_dict()
    assert got[energy] == [float(v) for v in mj]  # bit for bit
    assert got[util] == [0.0, 37.0, 100.0, 99.0, 1.0]
    assert got[power] == [301.27, 299.5, 0.1, 350.0, 1e-3]
    fleet = normalize(samples)
    assert fleet.frame["power"].tolist()[:1] == [301.27]


def test_timestamps_are_indexed_where_they_repeat_and_exact_either_way():
    report = IngestReport()
    builder = FrameBuilder(report)
    times = T0 + 15.0 * np.arange(240)
    jitter = T0 + np.arange(1000) * 1.001  # all distinct
    for gpu in "0123":  # four GPUs scraped at the same times
        builder.add(np.full(240, builder.series_id("m", [("gpu", gpu)])), times, np.arange(240.0))
    builder.add(np.full(1000, builder.series_id("n", [("gpu", "0")])), jitter, np.arange(1000.0) + 0.1)
    samples = builder.samples()
    m, n = samples.blocks
    assert m.at is not None and m.at.dtype == np.uint8 and len(m.times) == 240 and m.val.dtype == np.float32
    assert n.at is None  # every time distinct: an index would cost more than it saves
    np.testing.assert_array_equal(m.timestamps(), np.tile(times, 4))
    np.testing.assert_array_equal(n.timestamps(), jitter)
    assert m.nbytes == 960 * (1 + 4) + 240 * 8 + 5 * 8  # a byte of time and a float32 a sample


def test_joined_parts_keep_one_memo_while_every_part_is_the_same_table() -> None:
    """serve reads gauges and DCGM counters apart; normalize's per-series memo of the joined Samples lives as
    long as both parts are the tables it was made for (each part's table held, so no new one takes its place)."""
    def part(metric: str, memo: dict) -> Samples:
        long = pd.DataFrame({"metric": [metric] * 2, "timestamp": [0.0, 60.0], "value": [1.0, 2.0], "gpu": ["0", "0"]})
        s = Samples.from_frame(long)
        return Samples(s.series, s.blocks, memo)

    a, b = part("a", {}), part("b", {})
    joint = Samples.concat([a, b])
    assert joint.memo is not None and Samples.concat([a, b]).memo is joint.memo
    b2 = part("b", b.memo)  # the same memo, but another table: not the same series
    assert Samples.concat([a, b2]).memo is not joint.memo
    assert Samples.concat([a, part("b", None)]).memo is None  # a part that keeps nothing: nothing kept


def test_an_infinite_dcgm_value_is_out_of_range_not_a_dcgm_marker() -> None:
    """DCGM marks blank/not-supported fields with huge finite values; +Inf is none of them: it is dropped as out
    of the contract's range and said so, not as a "DCGM blank" (the wording an operator would chase)."""
    report = IngestReport()
    builder = FrameBuilder(report)
    sid = builder.series_id("DCGM_FI_DEV_GPU_TEMP", [("gpu", "0")])
    builder.add(np.array([sid] * 3), np.array([0.0, 15.0, 30.0]), np.array([50.0, float(0x7FFFFFF0), np.inf]))
    values = builder.build()["value"].to_numpy()
    assert values[0] == 50.0 and np.isnan(values[1:]).all()
    assert report.sentinels == {"DCGM_FI_DEV_GPU_TEMP": 1} and report.out_of_range == {"DCGM_FI_DEV_GPU_TEMP": 1}
