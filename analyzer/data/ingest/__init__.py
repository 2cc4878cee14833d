"""Ingest: OpenMetrics history files and Prometheus-compatible HTTP APIs -> Samples or one long frame.

Both readers return ``(frame, IngestReport)``, or with ``compact=True`` ``(Samples, IngestReport)``:
Samples (analyzer.data.ingest.samples) hold one row per series and per-metric sample arrays, the
form normalize reads. The frame has one row per sample: ``metric`` (category, the name as
written in the input), ``timestamp`` (float64 unix seconds), ``value`` (float64; DCGM sentinel
values become NaN) and one categorical column per label name seen (NaN where a series lacks
that label). Turning these into canonical signals is the normalize step's job; a MetricFilter
keeps only the families it needs so memory stays low.
"""

from analyzer.data.ingest._common import (
    FRAME_COLUMNS,
    BadLine,
    IngestReport,
    LabelSets,
    MetricFilter,
    metric_filter,
    one_per_interval,
)
from analyzer.data.ingest.openmetrics import read_openmetrics
from analyzer.data.ingest.prometheus import (
    PrometheusClient,
    PrometheusError,
    aggregate_query,
    promql_string,
    query_prometheus,
    selector,
)
from analyzer.data.ingest.samples import Samples

__all__ = [
    "FRAME_COLUMNS",
    "BadLine",
    "IngestReport",
    "LabelSets",
    "MetricFilter",
    "PrometheusClient",
    "PrometheusError",
    "Samples",
    "aggregate_query",
    "metric_filter",
    "one_per_interval",
    "promql_string",
    "query_prometheus",
    "read_openmetrics",
    "selector",
]
