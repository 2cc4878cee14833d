"""The exporter's collector: fresh families from the contract, failures contained and counted.

Sources here are small test-local Source subclasses returning hand-built Readings (a
legitimate source, not a mock); exposition is checked with prometheus_client's own parser
and the real promtool.
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections.abc import Callable

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families

from exporter import schema as S
from exporter.collector import BAD_SAMPLE, OUT_OF_RANGE, SOURCE_FAILED, TruegpuCollector, build_registry
from exporter.sources.base import Reading, Source
from tests.conftest import promtool_check, sample_value

HOST = "node-a"


def gpu_labels(gpu: int, host: str = HOST) -> dict[str, str]:
    return {S.HOSTNAME: host, S.GPU: str(gpu), S.UUID: f"GPU-{host}-{gpu}"}


def full_reading(gpus: range = range(4), value: float = 0.5) -> Reading:
    """One sample of every source family of the contract per GPU (node families once)."""
    r = Reading()
    for m in S.METRICS:
        if m in S.SELF_METRICS:
            continue
        extra = {name: f"{name}-x" for name in m.labels}
        if m.scope == "node":
            r.add(m, {S.HOSTNAME: HOST, **extra}, value)
            continue
        for g in gpus:
            r.add(m, {**gpu_labels(g), **extra}, value)
    return r


class StaticSource(Source):
    """Returns whatever ``make`` builds, or raises it when it is an exception."""

    def __init__(self, name: str, make: Callable[[], Reading | Exception]) -> None:
        self.name = name  # type: ignore[misc]
        self.make = make
        self.closed = False

    def collect(self) -> Reading:
        result = self.make()
        if isinstance(result, Exception):
            raise result
        return result

    def close(self) -> None:
        self.closed = True


def scrape(registry) -> dict[str, object]:
    """Text exposition parsed back into families keyed by name."""
    return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}


def series(registry, metric: S.Metric) -> dict[tuple[tuple[str, str], ...], float]:
    fams = scrape(registry)
    fam = fams.get(metric.family_name)
    if fam is None:
        return {}
    return {tuple(sorted(s.labels.items())): s.value for s in fam.samples if s.name == metric.name}


def errors(fams: dict, source: str, kind: str) -> float | None:
    return sample_value(fams, S.EXPORTER_ERRORS, source=source, kind=kind)


def up(fams: dict, source: str) -> float | None:
    return sample_value(fams, S.SOURCE_UP, source=source)


def test_families_types_help_and_units_come_from_schema(promtool):
    registry, _ = build_registry([StaticSource("s", full_reading)])
    fams = scrape(registry)
    for m in S.METRICS:
        if m in S.SELF_METRICS:
            continue
        fam = fams[m.family_name]
        assert fam.type == m.type, m.name
        assert fam.documentation == m.help, m.name
        assert {s.name for s in fam.samples} == {m.name}, "counters must be exposed with _total"
        assert len(fam.samples) == (1 if m.scope == "node" else 4)
    om = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry).decode())}
    assert om[S.ENERGY.family_name].unit == "joules"
    assert om[S.GPU_UTILIZATION.family_name].unit == "ratio"
    text = generate_latest(registry)
    assert b"# TYPE truegpu_energy_joules_total counter" in text
    promtool_check(promtool, text)


def test_raising_source_is_contained_counted_and_cumulative(caplog):
    good = StaticSource("good", lambda: full_reading(range(2)))
    bad = StaticSource("bad", lambda: RuntimeError("endpoint down"))
    registry, _ = build_registry([bad, good])
    with caplog.at_level(logging.WARNING, logger="exporter.collector"):
        fams = scrape(registry)
    assert len(fams[S.SM_ACTIVE.name].samples) == 2  # the good source's families still served
    assert any("bad" in r.getMessage() and "endpoint down" in r.getMessage() for r in caplog.records)
    assert up(fams, "bad") == 0.0
    assert up(fams, "good") == 1.0
    assert errors(fams, "bad", SOURCE_FAILED) == 1.0
    assert errors(fams, "good", SOURCE_FAILED) == 0.0
    assert sample_value(fams, S.COLLECT_DURATION, source="bad") >= 0.0
    assert sample_value(fams, S.SOURCE_LAST_SUCCESS, source="bad") is None
    assert sample_value(fams, S.SOURCE_LAST_SUCCESS, source="good") > 1e9
    # Cumulative across scrapes.
    scrape(registry)
    assert errors(scrape(registry), "bad", SOURCE_FAILED) == 3.0


def test_source_returning_garbage_counts_as_failed():
    registry, _ = build_registry([StaticSource("odd", lambda: {"not": "a reading"})])  # type: ignore[arg-type, return-value]
    fams = scrape(registry)
    assert up(fams, "odd") == 0.0
    assert errors(fams, "odd", SOURCE_FAILED) == 1.0


def test_lost_gpu_counted_only_its_series_missing():
    def make() -> Reading:
        r = full_reading(range(8))
        # What a source does for a lost GPU: drop its samples, record the error.
        for samples in r.samples.values():
            samples[:] = [(lab, v) for lab, v in samples if lab.get(S.GPU) != "3"]
        r.fail("gpu_lost", "GPU is lost (XID 79)", gpu="3")
        return r

    registry, _ = build_registry([StaticSource("sim", make)])
    fams = scrape(registry)
    for m in (S.GPU_UTILIZATION, S.ENERGY, S.TEMPERATURE):
        assert sorted(s.labels[S.GPU] for s in fams[m.family_name].samples) == ["0", "1", "2", "4", "5", "6", "7"]
    assert up(fams, "sim") == 0.0
    assert errors(fams, "sim", "gpu_lost") == 1.0
    assert errors(fams, "sim", SOURCE_FAILED) == 0.0
    assert errors(scrape(registry), "sim", "gpu_lost") == 2.0


def test_bad_samples_dropped_counted_and_logged(caplog, promtool):
    stray = S.Metric("truegpu_not_in_contract", "gauge", "", "made up")

    def make() -> Reading:
        r = Reading()
        r.add(S.GPU_UTILIZATION, gpu_labels(0), 0.25)  # the one good sample
        r.add(S.GPU_UTILIZATION, {S.HOSTNAME: HOST}, 0.5)  # missing identity labels
        r.add(S.GPU_UTILIZATION, {**gpu_labels(1), "extra": "x"}, 0.5)  # unknown label
        r.add(S.GPU_UTILIZATION, gpu_labels(2), float("nan"))
        r.add(S.GPU_UTILIZATION, gpu_labels(3), float("inf"))
        r.add(S.GPU_UTILIZATION, {**gpu_labels(4), S.GPU: 4}, 0.5)  # type: ignore[dict-item]  # int label value
        r.add(S.GPU_UTILIZATION, gpu_labels(5), "0.5")  # type: ignore[arg-type]
        r.add(S.GPU_UTILIZATION, gpu_labels(6), None)  # type: ignore[arg-type]
        r.add(S.NODE_INFO, {S.HOSTNAME: HOST, "site": "s", "rack": "r", S.GPU_INSTANCE: "1", S.MIG_PROFILE: "1g"}, 1)
        r.add(stray, {}, 1.0)
        r.add(S.SOURCE_UP, {"source": "evil"}, 1.0)
        return r

    registry, _ = build_registry([StaticSource("s", make)])
    with caplog.at_level(logging.WARNING, logger="exporter.collector"):
        text = generate_latest(registry)
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    assert [s.value for s in fams[S.GPU_UTILIZATION.name].samples] == [0.25]
    assert S.NODE_INFO.name not in fams, "MIG labels are only allowed on GPU-scoped families"
    assert "truegpu_not_in_contract" not in fams
    assert [s.labels for s in fams[S.SOURCE_UP.name].samples] == [{"source": "s"}]
    assert errors(fams, "s", BAD_SAMPLE) == 10.0
    assert up(fams, "s") == 1.0, "bad samples are the source's bug, not a collection failure"
    messages = "\n".join(r.getMessage() for r in caplog.records)
    for needle in ("not finite", "label names", "not in the contract", "self-metric", "must be str"):
        assert needle in messages
    promtool_check(promtool, text)


def test_mig_labels_accepted_on_gpu_families():
    def make() -> Reading:
        r = Reading()
        r.add(S.SM_ACTIVE, gpu_labels(0), 0.5)
        r.add(S.SM_ACTIVE, {**gpu_labels(0), S.GPU_INSTANCE: "1", S.MIG_PROFILE: "1g.10gb"}, 0.25)
        return r

    registry, _ = build_registry([StaticSource("s", make)])
    fams = scrape(registry)
    assert len(fams[S.SM_ACTIVE.name].samples) == 2
    assert errors(fams, "s", BAD_SAMPLE) is None


def test_no_stale_label_sets_across_scrapes():
    gpus = [range(4)]
    registry, _ = build_registry([StaticSource("s", lambda: full_reading(gpus[0]))])
    assert len(series(registry, S.POWER)) == 4
    gpus[0] = range(2)
    assert sorted(dict(k)[S.GPU] for k in series(registry, S.POWER)) == ["0", "1"]
    gpus[0] = range(0)
    assert series(registry, S.POWER) == {}
    assert S.POWER.name not in scrape(registry), "a family nobody provides is absent, not 0"


def test_absent_family_is_absent_not_zero():
    def make() -> Reading:
        r = Reading()
        r.add(S.GPU_UTILIZATION, gpu_labels(0), 0.9)
        return r

    registry, _ = build_registry([StaticSource("s", make)])
    fams = scrape(registry)
    assert S.SM_ACTIVE.name not in fams
    assert set(fams) == {S.GPU_UTILIZATION.name, *(m.family_name for m in S.SELF_METRICS)} - {
        S.SOURCE_STALE.name, S.SOURCE_IGNORED_SERIES.name  # nothing stale, nothing left out
    }


def test_two_sources_same_series_first_wins_no_duplicates(promtool):
    def first() -> Reading:
        r = Reading()
        for g in range(2):
            r.add(S.TEMPERATURE, {**gpu_labels(g), "sensor": "gpu"}, 40.0)
        return r

    def second() -> Reading:
        r = Reading()
        for g in range(3):
            # Same series in a different label order, plus one the first source lacks.
            lab = {"sensor": "gpu", S.UUID: f"GPU-{HOST}-{g}", S.GPU: str(g), S.HOSTNAME: HOST}
            r.add(S.TEMPERATURE, lab, 70.0)
        r.add(S.TEMPERATURE, {**gpu_labels(0), "sensor": "memory"}, 50.0)
        return r

    registry, _ = build_registry([StaticSource("a", first), StaticSource("b", second)])
    text = generate_latest(registry)
    temps = {(s.labels[S.GPU], s.labels["sensor"]): s.value for s in scrape(registry)[S.TEMPERATURE.name].samples}
    assert temps == {("0", "gpu"): 40.0, ("1", "gpu"): 40.0, ("2", "gpu"): 70.0, ("0", "memory"): 50.0}
    assert text.count(b"# TYPE truegpu_temperature_celsius gauge") == 1
    assert errors(scrape(registry), "b", BAD_SAMPLE) is None, "a shadowed series is precedence, not an error"
    promtool_check(promtool, text)


def test_per_family_precedence_and_same_gpu_under_another_hostname(promtool):
    """NVML and DCGM together: a GPU is the same GPU by uuid even when dcgm-exporter names its
    host differently, and the configured family precedence decides who serves it."""

    def nvml() -> Reading:
        r = Reading()
        r.add(S.SM_ACTIVE, gpu_labels(0), 0.30)
        r.add(S.POWER, gpu_labels(0), 300.0)
        r.add(S.GPU_INFO, {**gpu_labels(0), "model": "H100", "driver_version": "550", "pci_bus_id": "x",
                           "numa_node": "0"}, 1.0)
        return r

    def dcgm() -> Reading:
        r = Reading()
        other = {**gpu_labels(0), S.HOSTNAME: "dcgm-exporter-pod-x7k2p"}
        r.add(S.SM_ACTIVE, other, 0.60)
        r.add(S.POWER, other, 310.0)
        r.add(S.GPU_INFO, {**other, "model": "H100", "driver_version": "550", "pci_bus_id": "x", "numa_node": ""},
              1.0)
        return r

    registry, _ = build_registry(
        [StaticSource("nvml", nvml), StaticSource("dcgm", dcgm)], precedence={S.SM_ACTIVE.name: ["dcgm"]}
    )
    fams = scrape(registry)
    assert [s.value for s in fams[S.SM_ACTIVE.name].samples] == [0.60]  # dcgm preferred for SM activity
    assert [s.value for s in fams[S.POWER.name].samples] == [300.0]  # source order elsewhere
    info = fams[S.GPU_INFO.name].samples
    assert len(info) == 1 and info[0].labels["numa_node"] == "0"  # one identity per GPU, no duplicates
    promtool_check(promtool, generate_latest(registry))


def test_precedence_naming_unknown_family_or_source_is_rejected():
    src = [StaticSource("nvml", Reading)]
    with pytest.raises(ValueError, match="unknown family"):
        build_registry(src, precedence={"truegpu_nope": ["nvml"]})
    with pytest.raises(ValueError, match="not configured: dcgm"):
        build_registry(src, precedence={S.SM_ACTIVE.name: ["dcgm", "nvml"]})


def counting_power_source(fail_every: int = 0) -> tuple[list[int], StaticSource]:
    """A source whose power value is the number of collections so far; every ``fail_every``-th
    collection also reports one gpu_lost error."""
    calls: list[int] = []

    def make() -> Reading:
        calls.append(1)
        r = Reading()
        r.add(S.POWER, gpu_labels(0), float(len(calls)))
        if fail_every and len(calls) % fail_every == 0:
            r.fail("gpu_lost", "gone", gpu="1")
        return r

    return calls, StaticSource("s", make)


def registered(collector: TruegpuCollector) -> CollectorRegistry:
    registry = CollectorRegistry(auto_describe=False)
    registry.register(collector)
    return registry


def test_scrapes_between_background_collections_share_the_latest():
    calls, source = counting_power_source()
    collector = TruegpuCollector([source], interval=3600.0)
    try:
        registry = registered(collector)
        first = series(registry, S.POWER)  # waits for the first background collection
        assert list(first.values()) == [1.0]
        for _ in range(5):
            assert series(registry, S.POWER) == first
        assert len(calls) == 1  # scrapes rendered; nothing collected again
    finally:
        collector.close()
    assert source.closed and collector._thread is not None and not collector._thread.is_alive()


def test_background_collections_keep_coming_and_count_errors_once_each():
    calls, source = counting_power_source(fail_every=1)
    collector = TruegpuCollector([source], interval=0.02)
    try:
        registry = registered(collector)
        collector.start()
        deadline = time.monotonic() + 10
        while len(calls) < 5:
            assert time.monotonic() < deadline, "background collections stalled"
            time.sleep(0.01)
        fams = scrape(registry)
        power = sample_value(fams, S.POWER, **gpu_labels(0))
        # errors_total counts collections, not scrapes: it matches the collection the value came from
        assert errors(fams, "s", "gpu_lost") == power >= 5
    finally:
        collector.close()
    stopped_at = len(calls)
    time.sleep(0.1)
    assert len(calls) == stopped_at  # close() stopped the thread


def test_scrape_never_waits_for_a_collection_in_progress():
    """A source wedged mid-collection (no deadline wrapper here) holds the background thread,
    never a scrape: scrapes keep getting the previous collection at once."""
    gate = threading.Event()
    calls: list[int] = []

    def make() -> Reading:
        calls.append(1)
        if len(calls) > 1:
            gate.wait(30)
        r = Reading()
        r.add(S.POWER, gpu_labels(0), float(len(calls)))
        return r

    collector = TruegpuCollector([StaticSource("s", make)], interval=0.01)
    try:
        registry = registered(collector)
        assert list(series(registry, S.POWER).values()) == [1.0]
        deadline = time.monotonic() + 10
        while len(calls) < 2:  # the second collection is now stuck in the source
            assert time.monotonic() < deadline
            time.sleep(0.01)
        for _ in range(3):
            t0 = time.monotonic()
            assert list(series(registry, S.POWER).values()) == [1.0]
            assert time.monotonic() - t0 < 5  # rendered, not waited for (the source is stuck for 30 s)
        gate.set()
        while list(series(registry, S.POWER).values()) == [1.0]:
            assert time.monotonic() < deadline, "the collection after the stuck one never landed"
            time.sleep(0.01)
    finally:
        gate.set()
        collector.close()


def test_collect_on_every_scrape_when_interval_is_zero():
    calls, source = counting_power_source()
    registry, collector = build_registry([source])
    assert calls == []  # nothing collects before the first scrape
    assert [list(series(registry, S.POWER).values()) for _ in range(3)] == [[1.0], [2.0], [3.0]]
    assert collector._thread is None
    with pytest.raises(ValueError, match="interval"):
        TruegpuCollector([source], interval=-1)


def test_duplicate_within_one_source_served_once():
    def make() -> Reading:
        r = Reading()
        r.add(S.POWER, gpu_labels(0), 100.0)
        r.add(S.POWER, gpu_labels(0), 200.0)
        return r

    registry, _ = build_registry([StaticSource("s", make)])
    assert list(series(registry, S.POWER).values()) == [100.0]


def test_metric_copy_is_not_the_contract(caplog):
    """Schema Metrics are singletons: a look-alike (maybe with other help or labels) is dropped."""
    copy = dataclasses.replace(S.POWER, help="something else")

    def make() -> Reading:
        r = Reading()
        r.add(copy, gpu_labels(0), 300.0)
        r.add(S.POWER, gpu_labels(1), 200.0)
        return r

    registry, _ = build_registry([StaticSource("s", make)])
    with caplog.at_level(logging.WARNING, logger="exporter.collector"):
        fams = scrape(registry)
    assert [s.value for s in fams[S.POWER.name].samples] == [200.0]
    assert fams[S.POWER.name].documentation == S.POWER.help
    assert errors(fams, "s", BAD_SAMPLE) == 1.0
    assert "not the schema's Metric" in caplog.text


def test_duplicate_source_names_rejected_and_close_reaches_all():
    a, b = StaticSource("x", Reading), StaticSource("x", Reading)
    with pytest.raises(ValueError, match="unique"):
        build_registry([a, b])

    class Boom(StaticSource):
        def close(self) -> None:
            raise RuntimeError("close failed")

    c = StaticSource("c", Reading)
    _, collector = build_registry([Boom("boom", Reading), c])
    collector.close()
    assert c.closed


def test_no_default_process_collectors():
    registry, _ = build_registry([StaticSource("s", Reading)])
    names = set(scrape(registry))
    assert not any(n.startswith(("process_", "python_")) for n in names), names


def test_malformed_reading_does_not_fail_the_scrape():
    def make() -> Reading:
        r = Reading()
        r.add(S.POWER, gpu_labels(0), 100.0)
        r.samples[S.TEMPERATURE] = [("not", "pairs", "at all")]  # type: ignore[list-item]
        r.samples[S.MEMORY_USED] = 42  # type: ignore[assignment]
        return r

    def worse() -> Reading:
        r = Reading()
        r.errors = None  # type: ignore[assignment]
        return r

    registry, _ = build_registry([StaticSource("s", make), StaticSource("w", worse)])
    fams = scrape(registry)
    assert sample_value(fams, S.POWER, **gpu_labels(0)) == 100.0
    assert S.TEMPERATURE.name not in fams and S.MEMORY_USED.name not in fams
    assert errors(fams, "s", BAD_SAMPLE) == 2.0
    assert errors(fams, "w", BAD_SAMPLE) == 1.0


# The real simulated source -------------------------------------------------------------------
def test_simulated_node_served_whole_and_valid(promtool):
    from exporter.sources.simulated import SimulatedSource

    source = SimulatedSource("healthy-fleet", seed=3, clock=lambda: 0.0)
    host = sorted({lab[S.HOSTNAME] for lab, _ in source.collect().samples[S.GPU_INFO]})[0]
    node = SimulatedSource("healthy-fleet", hostnames=[host], seed=3, clock=lambda: 0.0)
    reading = node.collect()
    registry, collector = build_registry([node])
    text = generate_latest(registry)
    promtool_check(promtool, text)
    fams = {f.name: f for f in text_string_to_metric_families(text.decode())}
    served = {(s.name, tuple(sorted(s.labels.items()))) for f in fams.values() for s in f.samples}
    expected = {(m.name, tuple(sorted(lab.items()))) for m, samples in reading.samples.items() for lab, _ in samples}
    assert expected <= served, "every sample of the simulator is a valid contract sample and is served"
    assert collector.last["simulated"] == (True, len(expected))
    assert errors(fams, "simulated", BAD_SAMPLE) is None
    assert {s.labels[S.HOSTNAME] for s in fams[S.GPU_UTILIZATION.name].samples} == {host}
    assert len(fams[S.GPU_UTILIZATION.name].samples) == 8


def test_simulated_gpu_lost_mid_run_disappears():
    from exporter.sources.simulated import SimulatedSource

    now = [0.0]
    # xid-faults loses one GPU (XID 79) at 1h; start 30 s before it.
    source = SimulatedSource("xid-faults", start=3570, seed=1, clock=lambda: now[0])
    registry, _ = build_registry([source])

    def gpus(fams: dict) -> set[tuple[str, str]]:
        return {(s.labels[S.HOSTNAME], s.labels[S.GPU]) for s in fams[S.POWER.name].samples}

    before = scrape(registry)
    assert up(before, "simulated") == 1.0
    now[0] = 60.0
    after = scrape(registry)
    lost = gpus(before) - gpus(after)
    assert len(lost) == 1
    assert gpus(after) < gpus(before)
    assert up(after, "simulated") == 0.0
    assert errors(after, "simulated", "gpu_lost") == 1.0
    (host, gpu), = lost
    for fam in after.values():
        for s in fam.samples:
            assert (s.labels.get(S.HOSTNAME), s.labels.get(S.GPU)) != (host, gpu) or fam.name in (
                S.GPU_ALLOCATION_INFO.name,  # the scheduler still thinks the job holds it
                S.GPU_TOPOLOGY_INFO.name,
            ), (fam.name, s.labels)


def test_stale_and_last_success_come_from_sources_that_know_them():
    """A source serving old values (the deadline wrapper) says so; the collector publishes it."""

    class Lagging(StaticSource):
        stale = True
        last_success = 1_700_000_000.0

    registry, _ = build_registry([Lagging("slow", lambda: full_reading(range(1))), StaticSource("s", Reading)])
    fams = scrape(registry)
    assert sample_value(fams, S.SOURCE_STALE, source="slow") == 1.0
    assert sample_value(fams, S.SOURCE_STALE, source="s") is None, "sources that cannot be stale do not claim 0"
    assert sample_value(fams, S.SOURCE_LAST_SUCCESS, source="slow") == 1_700_000_000.0
    assert sample_value(fams, S.SOURCE_LAST_SUCCESS, source="s") > 1_700_000_000.0
    assert sample_value(fams, S.POWER, **gpu_labels(0)) == 0.5


def test_out_of_range_values_dropped_and_counted_per_contract(caplog):
    def make() -> Reading:
        r = Reading()
        r.add(S.GPU_UTILIZATION, gpu_labels(0), 0.5)
        r.add(S.GPU_UTILIZATION, gpu_labels(1), 42949672.95)  # dcgm's 4294967295 % as a ratio
        r.add(S.SM_ACTIVE, gpu_labels(0), 5.0)  # a ratio of 5
        r.add(S.SM_ACTIVE, gpu_labels(1), 1.01)  # rounding overshoot: within the tolerance
        r.add(S.TEMPERATURE, {**gpu_labels(0), "sensor": "gpu"}, 2.1e9)
        r.add(S.POWER, gpu_labels(0), -3.0)
        r.add(S.ENERGY, gpu_labels(0), 1e12)  # counters have no upper bound
        return r

    registry, _ = build_registry([StaticSource("s", make)])
    with caplog.at_level(logging.WARNING, logger="exporter.collector"):
        fams = scrape(registry)
    assert [s.value for s in fams[S.GPU_UTILIZATION.name].samples] == [0.5]
    assert [s.value for s in fams[S.SM_ACTIVE.name].samples] == [1.01]
    assert S.TEMPERATURE.name not in fams and S.POWER.name not in fams
    assert [s.value for s in fams[S.ENERGY.family_name].samples if s.name == S.ENERGY.name] == [1e12]
    assert errors(fams, "s", OUT_OF_RANGE) == 4.0
    assert errors(fams, "s", BAD_SAMPLE) is None
    assert "outside the valid range [0, 1.02]" in caplog.text
