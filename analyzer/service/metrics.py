"""prometheus_client collector over the analyzer service's latest results (analyzer/output_schema.py).

Like the exporter's collector it builds brand-new families on every scrape from one
snapshot, so the series are exactly the latest analysis: one finding series per OPEN
finding (a finding that ended is gone from the next scrape), the job and fleet utilization
of the last window, and the loop's health. Unknown values are left out, never written as 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import CollectorRegistry

from analyzer import output_schema as O
from analyzer.service.fmt import label_value
from exporter.schema import WORKLOAD
from exporter.schema import Metric as SchemaMetric

if TYPE_CHECKING:
    from analyzer.findings import Finding
    from analyzer.finops.catalog import Catalog
    from analyzer.service.loop import Analysis, Snapshot


def _gauge(m: SchemaMetric, labels: tuple[str, ...] | None = None) -> GaugeMetricFamily:
    unit = m.unit if m.unit and m.name.endswith("_" + m.unit) else ""
    return GaugeMetricFamily(m.name, m.help, labels=m.labels if labels is None else labels, unit=unit)


def _by_result(metric: SchemaMetric, ok: int, error: int) -> CounterMetricFamily:
    """A counter of ``metric`` with its ``result`` label ok and error."""
    family = CounterMetricFamily(metric.family_name, metric.help, labels=metric.labels)
    family.add_metric(("ok",), float(ok))
    family.add_metric(("error",), float(error))
    return family


def finding_labels(f: Finding) -> tuple[str, ...]:
    """Label values of a finding series, in FINDING_LABELS order ("" where not applicable)."""
    values = {
        "kind": f.kind, "severity": f.severity, "hostname": f.hostname, "gpu": f.gpu,
        "gpu_instance": f.gpu_instance, "rack": f.rack, "namespace": f.namespace, WORKLOAD: f.job,
    }
    return tuple(label_value(values[name]) for name in O.FINDING_LABELS)


def open_finding_series(findings: tuple[Finding, ...] | list[Finding]) -> dict[tuple[str, ...], tuple[float, float]]:
    """labels -> (score, start) per open finding; findings that map to the same series merge
    (highest score, earliest start), so the exposition never holds a duplicate series."""
    out: dict[tuple[str, ...], tuple[float, float]] = {}
    for f in findings:
        if f.end is not None:
            continue
        key = finding_labels(f)
        score, start = float(f.score), float(f.start)
        if key in out:
            s0, t0 = out[key]
            score, start = max(score, s0), min(start, t0)
        out[key] = (score, start)
    return out


class ServiceCollector:
    """Reads ``snapshot()`` once per scrape and yields the analyzer's families (and, with a price
    catalog, the price of each GPU model in the latest analysis)."""

    def __init__(self, snapshot: Callable[[], Snapshot], catalog: Catalog | None = None) -> None:
        self.snapshot = snapshot
        self.catalog = catalog

    def describe(self) -> list[Metric]:  # no collect() at registration time
        return []

    def collect(self) -> Iterator[Metric]:
        snap = self.snapshot()
        a, h = snap.analysis, snap.health

        active, score, started = _gauge(O.FINDING_ACTIVE), _gauge(O.FINDING_SCORE), _gauge(O.FINDING_STARTED)
        if a is not None:
            for labels, (s, t) in sorted(open_finding_series(a.findings).items()):
                active.add_metric(labels, 1.0)
                score.add_metric(labels, s)
                started.add_metric(labels, t)
        yield active
        yield score
        yield started

        job_eff, job_rep, job_gpus = (_gauge(O.JOB_EFFECTIVE_UTILIZATION), _gauge(O.JOB_REPORTED_UTILIZATION),
                                      _gauge(O.JOB_ALLOCATED_GPUS))
        fleet_eff, fleet_rep = _gauge(O.FLEET_EFFECTIVE_UTILIZATION), _gauge(O.FLEET_REPORTED_UTILIZATION)
        if a is not None:
            seen: set[tuple[str, str]] = set()
            for j in a.jobs:
                key = (j.namespace, j.job)
                if key in seen:
                    continue
                seen.add(key)
                for fam, value in ((job_eff, j.effective_util), (job_rep, j.reported_util),
                                   (job_gpus, j.allocated_gpus)):
                    if value is not None:
                        fam.add_metric(key, value)
            for fam, values in ((fleet_eff, a.fleet_effective), (fleet_rep, a.fleet_reported)):
                for allocation in ("allocated", "all"):
                    value = values.get(allocation)
                    if value is not None:
                        fam.add_metric((allocation,), value)
        yield from (job_eff, job_rep, job_gpus, fleet_eff, fleet_rep)
        fleet_parts, ns_parts = _gauge(O.FLEET_GPU_SECONDS), _gauge(O.NAMESPACE_GPU_SECONDS)
        if a is not None:
            for part, hours in a.fleet_parts.items():
                fleet_parts.add_metric((part,), hours * 3600.0)
            for (ns, part), hours in sorted(a.namespace_parts.items()):
                ns_parts.add_metric((ns, part), hours * 3600.0)
        yield fleet_parts
        yield ns_parts
        yield self._prices(a)

        # Before the first success the timestamp is 0, so `time() - last_success > N` alerts fire.
        last = _gauge(O.ANALYZER_LAST_SUCCESS)
        last.add_metric((), h.last_success or 0.0)
        yield last
        duration = _gauge(O.ANALYZER_RUN_DURATION)
        if h.last_duration is not None:
            duration.add_metric((), h.last_duration)
        yield duration
        yield _by_result(O.ANALYZER_RUNS, h.runs_ok, h.runs_error)
        if h.state_file is not None:
            yield _by_result(O.ANALYZER_STATE_WRITES, h.state_writes_ok, h.state_writes_error)


    def _prices(self, a: Analysis | None) -> GaugeMetricFamily:
        prices = _gauge(O.GPU_HOURLY_COST)
        if self.catalog is None or a is None or a.fleet is None or "model" not in a.fleet.frame.columns:
            return prices
        for model in sorted({str(m) for m in a.fleet.frame["model"].unique() if isinstance(m, str) and m}):
            entry = self.catalog.lookup(model)
            if entry is not None:
                prices.add_metric((model, entry.key, self.catalog.currency), entry.price_per_gpu_hour)
        return prices


def build_registry(snapshot: Callable[[], Snapshot], catalog: Catalog | None = None) -> CollectorRegistry:
    """A registry holding only the service collector (no process/platform collectors)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ServiceCollector(snapshot, catalog))
    return registry


__all__ = ["ServiceCollector", "build_registry", "finding_labels", "open_finding_series"]
