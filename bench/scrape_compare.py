"""Shared pieces of the scrape benchmarks: a bare prometheus_client registry holding the same
series as a Reading (the baseline the exporter is compared with), and timing helpers."""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter import schema as S
from exporter.sources.base import Reading


def bare_registry(reading: Reading, source: str) -> CollectorRegistry:
    """A plain registry with one Gauge/Counter per family holding the reading's series (plus self-metrics)."""
    prometheus_client.disable_created_metrics()  # we do not serve _created either
    reg = CollectorRegistry(auto_describe=False)
    families: dict[S.Metric, list[tuple[dict[str, str], float]]] = {m: list(v) for m, v in reading.samples.items()}
    families[S.SOURCE_UP] = [({"source": source}, 1.0)]
    families[S.COLLECT_DURATION] = [({"source": source}, 0.001)]
    families[S.SOURCE_LAST_SUCCESS] = [({"source": source}, time.time())]
    families[S.EXPORTER_ERRORS] = [({"source": source, "kind": "source_failed"}, 0.0)]
    if reading.ignored:  # what the source read but left out, accounted for as the exporter does
        families[S.SOURCE_IGNORED_SERIES] = [({"source": source, "field": f, "reason": r}, float(n))
                                             for (f, r), n in reading.ignored.items()]
    for metric, samples in families.items():
        names = sorted({k for labels, _ in samples for k in labels})
        if metric.type == "counter":
            c = Counter(metric.family_name, metric.help, names, registry=reg)
            for labels, value in samples:
                c.labels(**{n: labels.get(n, "") for n in names}).inc(value)
        else:
            g = Gauge(metric.family_name, metric.help, names, registry=reg)
            for labels, value in samples:
                g.labels(**{n: labels.get(n, "") for n in names}).set(value)
    return reg


def series_of(body: bytes) -> set[tuple[str, tuple[tuple[str, str], ...]]]:
    return {
        (s.name, tuple(sorted((k, v) for k, v in s.labels.items() if v != "")))
        for fam in text_string_to_metric_families(body.decode())
        for s in fam.samples
    }


def median_call_us(fn: Callable[[], object], runs: int, warmup: int = 50) -> float:
    """Median wall time of ``fn()`` in microseconds after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(runs):
        t0 = time.perf_counter_ns()
        fn()
        times.append(time.perf_counter_ns() - t0)
    return statistics.median(times) / 1000


def paired_scrape_us(
    ours: CollectorRegistry, bare: CollectorRegistry, runs: int, warmup: int = 50
) -> tuple[float, float]:
    """Median full scrape (collect + render) of each registry in microseconds, calls alternating
    one by one: this VM's speed drifts by tens of percent over seconds, and alternating puts
    both sides under the same drift, where blocks of calls would not."""
    for _ in range(warmup):
        generate_latest(ours)
        generate_latest(bare)
    ours_t, bare_t = [], []
    clock = time.perf_counter_ns
    for _ in range(runs):
        t0 = clock()
        generate_latest(ours)
        t1 = clock()
        generate_latest(bare)
        bare_t.append(clock() - t1)
        ours_t.append(t1 - t0)
    return statistics.median(ours_t) / 1000, statistics.median(bare_t) / 1000
