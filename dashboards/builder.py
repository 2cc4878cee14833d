"""A thin adapter over grafanalib: panels with units, targets, template variables, layout.

Dashboards are written as lists of :class:`PanelSpec` (title, unit, queries, kind, width);
:func:`dashboard` lays them out left to right on Grafana's 24-column grid, numbers them,
adds the template variables and notes on panels that need dcgm-exporter fields outside
its default counter list or the truegpu analyzer, and returns the grafanalib Dashboard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from dashboards.queries import ANALYZER_NAMES, DCGM, V_HOSTLABEL, Dialect, dcgm_fields_in
from exporter import schema as S

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
ALL = ".*"
#: Grafana dashboard JSON schema the panels are written for (timeseries/stat/table with fieldConfig).
SCHEMA_VERSION = 37

# Grafana unit ids ----------------------------------------------------------------------------
RATIO = "percentunit"
BYTES = "bytes"
BYTES_PER_SECOND = "Bps"
WATTS = "watt"
CELSIUS = "celsius"
HERTZ = "hertz"
COUNT = "short"
PER_SECOND = "cps"
SECONDS = "s"
NONE = "none"
GPU_HOURS = "suffix: GPU-h"
#: Money in the price catalog's currency (the series' ``currency`` label says which).
COST = "none"

#: Contract unit -> Grafana unit for a gauge shown as it is.
UNIT_OF = {"ratio": RATIO, "bytes": BYTES, "watts": WATTS, "celsius": CELSIUS, "hertz": HERTZ,
           "seconds": SECONDS, "joules": "joule", "": COUNT}
#: Contract unit -> Grafana unit of its per-second rate.
RATE_UNIT_OF = {"bytes": BYTES_PER_SECOND, "joules": WATTS, "": PER_SECOND}


def unit(metric: S.Metric) -> str:
    return UNIT_OF[metric.unit]


def rate_unit(metric: S.Metric) -> str:
    return RATE_UNIT_OF[metric.unit]


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    instant: bool = False


@dataclass
class PanelSpec:
    title: str
    unit: str
    queries: list[Query]
    kind: str = "timeseries"  # timeseries | stat | table
    description: str = ""
    width: int = 12
    height: int = 8
    stacked: bool = False
    reduce: str = "mean"
    extra: dict = field(default_factory=dict)


def q(expr: str, legend: str = "", instant: bool = False) -> Query:
    return Query(expr, legend, instant)


def gpu_legend(extra: str = "") -> str:
    return "{{hostname}} gpu{{gpu}}" + (f" {extra}" if extra else "")


def _notes(spec: PanelSpec, dialect: Dialect) -> str:
    from exporter.schema import DCGM_DEFAULT_FIELDS

    text = spec.description.strip()
    exprs = [x.expr for x in spec.queries]
    notes = []
    if dialect.dcgm:
        missing = sorted(set().union(*(dcgm_fields_in(e) for e in exprs)) - DCGM_DEFAULT_FIELDS)
        if missing:
            notes.append("Needs dcgm-exporter fields that its default counter list does not collect: "
                         + ", ".join(missing) + " (enable them in the counters CSV); without them this "
                         "panel is empty, which means unknown, not zero.")
    used = {n for n in ANALYZER_NAMES if any(n in e for e in exprs)}
    if used:
        notes.append("From the truegpu analyzer (`truegpu serve` /metrics): " + ", ".join(sorted(used)) + ".")
    return "\n\n".join([text, *notes]).strip()


def _targets(spec: PanelSpec) -> list[g.Target]:
    refs = "ABCDEFGHIJKLMNOP"
    return [
        g.Target(expr=x.expr, legendFormat=x.legend, refId=refs[i], instant=x.instant, datasource=DATASOURCE,
                 format="table" if spec.kind == "table" else "time_series", intervalFactor=1, step=60)
        for i, x in enumerate(spec.queries)
    ]


def _panel(spec: PanelSpec, dialect: Dialect, pos: g.GridPos) -> g.Panel:
    common = dict(title=spec.title, dataSource=DATASOURCE, targets=_targets(spec),
                  description=_notes(spec, dialect), gridPos=pos)
    if spec.kind == "stat":
        return g.Stat(format=spec.unit, reduceCalc=spec.reduce, graphMode="area", noValue="no data", **common)
    if spec.kind == "table":
        return g.Table(unit=spec.unit, filterable=True,
                       transformations=[{"id": "merge", "options": {}}], **common)
    return g.TimeSeries(unit=spec.unit, legendDisplayMode="table", legendPlacement="right",
                        legendCalcs=["mean", "max"], tooltipMode="multi", fillOpacity=10 if spec.stacked else 0,
                        stacking={"mode": "normal"} if spec.stacked else {}, **common)


def _variable(name: str, label: str, query: str) -> g.Template:
    return g.Template(name=name, label=label, query=query,
                      dataSource=DATASOURCE, includeAll=True, multi=True, allValue=ALL, default="All",
                      refresh=g.REFRESH_ON_TIME_RANGE_CHANGE)


def variables(dialect: Dialect) -> list[g.Template]:
    ds = g.Template(name="datasource", label="Data source", query="prometheus", type="datasource",
                    default="Prometheus")
    if dialect.dcgm:
        util = S.GPU_UTILIZATION.dcgm[0].field
        used = S.MEMORY_USED.dcgm[0].field
        hostlabel = g.Template(name=V_HOSTLABEL[1:], label="Host label", query="Hostname,hostname",
                               type="custom", default="Hostname")
        return [
            ds, hostlabel,
            _variable("hostname", "Host", f"label_values({util}, {V_HOSTLABEL})"),
            _variable("gpu", "GPU", f'label_values({util}{{{V_HOSTLABEL}=~"$hostname"}}, gpu)'),
            _variable("namespace", "Namespace", f"label_values({used}, namespace)"),
            _variable(S.WORKLOAD, "Pod (dcgm-exporter has no workload label)",
                      f'label_values({used}{{namespace=~"$namespace"}}, pod)'),
        ]
    info = S.GPU_INFO.name
    alloc = S.GPU_ALLOCATION_INFO.name
    return [
        ds,
        _variable("hostname", "Host", f"label_values({info}, hostname)"),
        _variable("gpu", "GPU", f'label_values({info}{{hostname=~"$hostname"}}, gpu)'),
        _variable("namespace", "Namespace", f"label_values({alloc}, namespace)"),
        _variable(S.WORKLOAD, "Workload", f'label_values({alloc}{{namespace=~"$namespace"}}, {S.WORKLOAD})'),
    ]


def layout(specs: list[PanelSpec]) -> list[g.GridPos]:
    """Left to right, wrapping at 24 columns; a row is as tall as its tallest panel."""
    out, x, y, row_h = [], 0, 0, 0
    for s in specs:
        if x + s.width > 24:
            x, y, row_h = 0, y + row_h, 0
        out.append(g.GridPos(h=s.height, w=s.width, x=x, y=y))
        x += s.width
        row_h = max(row_h, s.height)
    return out


def dashboard(*, key: str, title: str, description: str, dialect: Dialect, specs: list[PanelSpec]) -> g.Dashboard:
    panels = [_panel(s, dialect, p) for s, p in zip(specs, layout(specs), strict=True)]
    variant = "dcgm-exporter" if dialect.name == DCGM else "truegpu exporter"
    return g.Dashboard(
        title=f"truegpu / {title} ({variant})",
        uid=f"{dialect.name}-{key}",
        description=description,
        tags=["truegpu", dialect.name, key],
        panels=panels,
        templating=g.Templating(list=variables(dialect)),
        time=g.Time("now-6h", "now"),
        refresh="1m",
        timezone="utc",
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        schemaVersion=SCHEMA_VERSION,
    ).auto_panel_ids()


def to_json(dash: g.Dashboard) -> str:
    return json.dumps(dash.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"
