"""Inputs -> Fleet in one call: OpenMetrics history files or a Prometheus-compatible API.

Both read only the families the signals need (truegpu_* and every dcgm-exporter spelling
of them, plus the info series, and kube_pod_info where the host label holds dcgm-exporter
pod names), then hand the compact Samples to ``normalize``.

Prometheus queries push the per-step aggregation to the server so a fleet-day returns one
point per series and step. Each point is evaluated one millisecond before the END of its
row's interval ``[t, t + step)`` over a window of ``step``, so it summarises exactly the
samples of that row (on Prometheus 2.x closed and 3.x left-open ranges alike):
``avg_over_time`` for gauges, ``max_over_time`` for flags, ``last_over_time`` for
counters (normalize turns consecutive values into rates, handling resets), bitmasks,
"last XID" gauges and info series. dcgm-exporter's rate fields describe the period
ending at their sample, so they are averaged over ``(t, t + step]`` instead, evaluated at
``t + step``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from analyzer.data import dialects as D
from analyzer.data.budget import check_window
from analyzer.data.frame import Fleet
from analyzer.data.hosts import exporter_pods, host_values, query_node_zones, query_pod_info
from analyzer.data.ingest import (
    IngestReport,
    LabelSets,
    MetricFilter,
    PrometheusClient,
    Samples,
    query_prometheus,
    read_openmetrics,
)
from analyzer.data.ingest.prometheus import MatcherValue
from analyzer.data.normalize import normalize
from exporter import schema as S

#: Prometheus evaluates a point this long before the end of its row (ms resolution).
_EDGE = 0.001


class NoTelemetry(ValueError):
    """The source answered but holds no GPU telemetry in the window asked (a window before the fleet existed,
    an outage): what a caller reading a long range in pieces counts as unknown, unlike a wrong URL or matcher."""


def metric_filter() -> MetricFilter:
    """The families normalize reads, in both dialects and both dcgm-exporter spellings, kube_pod_info (it
    maps dcgm-exporter pod names in the host label to nodes) and kube_node_labels (zones: analyzer.data.hosts)."""
    return MetricFilter(D.needed_names(), optional=frozenset({S.KUBE_POD_INFO, S.KUBE_NODE_LABELS}))


def load_files(
    paths: str | Path | Iterable[str | Path],
    *,
    step: float | None = None,
    job_label: str | None = None,
    start: float | None = None,
    end: float | None = None,
    default_timestamp: float | None = None,
    workers: int | None = None,
) -> Fleet:
    """Read OpenMetrics/Prometheus text files (plain or .gz) and normalize them.

    ``default_timestamp`` stamps samples written without one (a scraped ``/metrics`` page); ``workers``:
    processes reading the files (a big plain one in ranges, several at once; None: as many as this process has
    CPUs, analyzer.data.ingest.split).
    Raises ValueError naming the files when they hold no GPU telemetry.
    """
    paths = [Path(paths)] if isinstance(paths, str | Path) else [Path(p) for p in paths]
    if not paths:
        raise ValueError("load_files: no input files given")
    samples, report = read_openmetrics(paths, metric_filter=metric_filter(), default_timestamp=default_timestamp,
                                       compact=True, workers=workers)
    where = ", ".join(map(str, paths))
    if not len(samples):
        hint = f" ({report.bad_line_count} unreadable lines)" if report.bad_line_count else ""
        raise ValueError(
            f"no GPU telemetry in {where}{hint}: expected truegpu_* or dcgm-exporter DCGM_FI_* / dcgm_fi_* "
            f"samples with timestamps (pass default_timestamp for a scrape without them)"
        )
    try:
        return normalize(samples, step=step, start=start, end=end, job_label=job_label, report=report)
    except ValueError as exc:
        raise ValueError(f"{where}: {exc}") from exc


def _function(name: str) -> str:
    """The per-step range function for ``name`` (see the module docstring)."""
    sources = D.SOURCES.get(name, ())
    kinds = {s.kind for s in sources}
    if name in D.FB_PARTS or kinds & {"gauge"}:
        return "avg_over_time"
    if kinds & {"flag"}:
        return "max_over_time"
    if kinds & {"dcgm_rate"}:
        return "avg_over_time"
    return "last_over_time"  # counters, bitmasks, last-XID, info series


def _is_dcgm_rate(name: str) -> bool:
    return any(s.kind == "dcgm_rate" for s in D.SOURCES.get(name, ()))


def _merge(reports: list[IngestReport]) -> IngestReport:
    out = IngestReport()
    for r in reports:
        out.add(r)
    return out


def load_prometheus(
    url: str,
    start: float,
    end: float,
    step: float,
    *,
    matchers: Mapping[str, MatcherValue] | None = None,
    job_label: str | None = None,
    names: Iterable[str] | None = None,
    labelsets: LabelSets | None = None,
    **client_kwargs: Any,
) -> Fleet:
    """Query a Prometheus-compatible API for ``[start, end)`` every ``step`` s and normalize.

    Discovers which of the needed names exist (either dialect), then fetches them with the
    aggregation pushed down. Where the host label holds dcgm-exporter pod names, their
    kube_pod_info is fetched too (without ``matchers``: they name GPU series' labels) so
    normalize can map them to nodes. ``matchers`` narrow every selector (e.g. ``{"Hostname": [...]}``),
    ``names`` the input names read (default: every one normalize reads); ``labelsets`` kept by a caller that
    reads the same series again and again (serve's ticks);
    ``client_kwargs`` go to PrometheusClient (timeout, bearer_token, basic_auth, and max_samples /
    concurrency: each metric's query is split by host and time under the server's limit, see
    ``query_prometheus``).
    Raises ValueError naming the URL when the server has no GPU telemetry in the window.
    """
    start, end, step = float(start), float(end), float(step)
    check_window(start, end, step)  # before any query
    if labelsets is not None:
        labelsets.turn()
    with PrometheusClient(url, **client_kwargs) as client:
        wanted = D.needed_names() if names is None else D.needed_names() & set(names)
        found = client.existing_metrics(sorted(wanted), matchers, start, end + step)
        telemetry = [n for n in found if n not in {m.name for m in D.INFO_METRICS}]
        if not telemetry:
            raise NoTelemetry(
                f"no GPU telemetry at {url} between {start:.0f} and {end:.0f}"
                f"{' matching ' + str(dict(matchers)) if matchers else ''}: expected truegpu exporter metrics "
                f"(e.g. {S.GPU_UTILIZATION.name}) or dcgm-exporter metrics (e.g. {S.GPU_UTILIZATION.dcgm[0].field})"
            )
        rates = [n for n in found if _is_dcgm_rate(n)]
        rest = [n for n in found if not _is_dcgm_rate(n)]
        parts, reports = [], []
        if rest:
            samples, report = query_prometheus(
                client, rest, start + step - _EDGE, end + step - _EDGE, step, matchers,
                functions={n: _function(n) for n in rest}, window=step, compact=True, labelsets=labelsets,
                label_filters=D.LABEL_FILTERS,
            )  # fmt: skip
            parts.append(samples)
            reports.append(report)
        if rates:
            samples, report = query_prometheus(
                client, rates, start + step, end, step, matchers, functions={n: "avg_over_time" for n in rates},
                compact=True, labelsets=labelsets, label_filters=D.LABEL_FILTERS,
            )  # fmt: skip
            parts.append(samples)
            reports.append(report)
        # the host label holds dcgm-exporter pod names: fetch kube_pod_info for them (normalize maps them)
        pods = exporter_pods(name for part in parts for name in host_values(part.series))
        if pods:
            long, report = query_pod_info(client, pods, start + step - _EDGE, end + step - _EDGE, step)
            parts.append(Samples.from_frame(long))  # one series per pod: small
            reports.append(report)
        if S.NODE_INFO.name not in found:  # where nodes are: their zones, if kube-state-metrics exports them
            long, report = query_node_zones(client, start + step - _EDGE, end + step - _EDGE, step)
            parts.append(Samples.from_frame(long))  # one series per node: small
            reports.append(report)
    try:
        return normalize(Samples.concat(parts), step=step, start=start, end=end, job_label=job_label,
                         report=_merge(reports))
    except ValueError as exc:
        raise ValueError(f"{url}: {exc}") from exc


__all__ = ["load_files", "load_prometheus", "metric_filter"]
