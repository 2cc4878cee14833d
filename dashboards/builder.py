"""A thin adapter over grafanalib: panels with units, targets, template variables, layout, links.

Dashboards are written as lists of :class:`PanelSpec` (title, unit, queries, kind, width, and
where a series or row is a host, GPU or workload a :class:`Drill` to the dashboard about it);
:func:`dashboard` lays them out left to right on Grafana's 24-column grid, numbers them,
adds the template variables (cluster, site/rack where the exporter publishes them, host, GPU,
namespace, workload), the links to the related dashboards, the analyzer's findings as
annotations, and notes on panels that need dcgm-exporter fields outside its default counter
list or the truegpu analyzer, and returns the grafanalib Dashboard.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from grafanalib import core as g
from grafanalib._gen import DashboardEncoder

from analyzer import output_schema as out
from dashboards.queries import ANALYZER_NAMES, DCGM, RANGE, V_CLUSTER, Dialect, dcgm_fields_in, dcgm_leaf
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


@dataclass(frozen=True)
class Drill:
    """A data link from each series (or table row) to the dashboard ``key`` about it, its
    ``labels`` set as that dashboard's variables (the time range and data source kept)."""

    key: str
    labels: tuple[str, ...]
    title: str


#: Drill-downs by what a series is: a host, a GPU (to its health), a workload.
TO_NODE = Drill("node", (S.HOSTNAME,), "Node ${__field.labels.hostname}")
TO_GPU = Drill("health", (S.HOSTNAME, S.GPU), "GPU health")
TO_JOB = Drill("job", ("namespace", S.WORKLOAD), "Job")


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
    drill: tuple[Drill, ...] = ()


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


def dashboard_uid(dialect: Dialect, key: str) -> str:
    """``<dialect>-<key>``: alerts.rules.dashboard_url builds its links on these UIDs."""
    return f"{dialect.name}-{key}"


def _data_links(spec: PanelSpec, dialect: Dialect) -> list[dict]:
    """Grafana data links: a table row's values are ``__data.fields``, a series' are ``__field.labels``."""
    value = "${__data.fields.%s}" if spec.kind == "table" else "${__field.labels.%s}"
    links = []
    for d in spec.drill:
        names = [(dialect.cluster_label, "cluster")] if dialect.cluster_label else []
        names += [(label, label) for label in d.labels]
        params = "".join(f"&var-{var}={value % label}" for label, var in names)
        title = d.title if spec.kind != "table" else d.title.replace("__field.labels", "__data.fields")
        links.append({"title": title, "targetBlank": False,
                      "url": f"/d/{dashboard_uid(dialect, d.key)}?${{__url_time_range}}&${{datasource:queryparam}}"
                             + params})
    return links


def _panel(spec: PanelSpec, dialect: Dialect, pos: g.GridPos) -> g.Panel:
    links = _data_links(spec, dialect)
    common = dict(title=spec.title, dataSource=DATASOURCE, targets=_targets(spec),
                  description=_notes(spec, dialect), gridPos=pos,
                  extraJson={"fieldConfig": {"defaults": {"links": links}}} if links else None)
    if spec.kind == "stat":
        return g.Stat(format=spec.unit, reduceCalc=spec.reduce, graphMode="area", noValue="no data", **common)
    if spec.kind == "table":
        return g.Table(unit=spec.unit, filterable=True,
                       transformations=[{"id": "merge", "options": {}}], **common)
    return g.TimeSeries(unit=spec.unit, legendDisplayMode="table", legendPlacement="right",
                        legendCalcs=["mean", "max"], tooltipMode="multi", fillOpacity=10 if spec.stacked else 0,
                        stacking={"mode": "normal"} if spec.stacked else {}, **common)


def _variable(name: str, label: str, query: str, *, all_value: str | None = ALL, regex: str | None = None,
              hide: int = g.SHOW) -> g.Template:
    """A multi-value query variable with All (``all_value``: None makes All the list of its values, so
    variables it depends on narrow the panels too), refreshed on time range change."""
    t = g.Template(name=name, label=label, query=query, dataSource=DATASOURCE, includeAll=True, multi=True,
                   allValue=all_value, default="All", regex=regex, hide=hide, refresh=g.REFRESH_ON_TIME_RANGE_CHANGE)
    t._current = {"selected": True, "text": ["All"], "value": ["$__all"]}
    return t


def _label_of(expr: str, label: str) -> tuple[str, str]:
    """(query, regex) of a variable listing ``label`` of a PromQL expression (not just a selector)."""
    return f"query_result({expr})", f'/{label}="([^"]+)"/'


def variables(dialect: Dialect) -> list[g.Template]:
    """datasource, cluster (unless the site has no cluster label), site/rack (truegpu: where
    truegpu_node_info places the nodes), hostname, gpu, namespace, workload."""
    ds = g.Template(name="datasource", label="Data source", query="prometheus", type="datasource",
                    default="Prometheus")
    d = dialect
    if d.dcgm:  # one dashboard for both host labels: the lists are normalised like the panels
        used_field = S.MEMORY_USED.dcgm[0].field
        used = dcgm_leaf([used_field], d.cluster_matcher())
        used_in_ns = dcgm_leaf([used_field], [*d.cluster_matcher(), ("namespace", "=~", "$namespace")])
        hosts = _label_of(d.values_of(S.GPU_UTILIZATION, S.HOSTNAME), S.HOSTNAME)
        gpus = _label_of(d.values_of(S.GPU_UTILIZATION, S.GPU, **{S.HOSTNAME: "=~$hostname"}), S.GPU)
        cluster_source = dcgm_leaf([used_field], [])
        variables_ = [
            _variable("hostname", "Host", hosts[0], regex=hosts[1]),
            _variable("gpu", "GPU", gpus[0], regex=gpus[1]),
            _variable("namespace", "Namespace", f"label_values({used}, namespace)"),
            _variable(S.WORKLOAD, "Pod (dcgm-exporter has no workload label)", f"label_values({used_in_ns}, pod)"),
        ]
        placement: list[g.Template] = []
    else:
        info, alloc, node = S.GPU_INFO.name, S.GPU_ALLOCATION_INFO.name, S.NODE_INFO.name
        cluster_source = info  # not filtered by $cluster: it lists the clusters
        site, rack = S.NODE_INFO.labels
        placement = [
            _variable(site, "Site", f"label_values({d.selector(node)}, {site})"),
            _variable(rack, "Rack", f"label_values({d.selector(node, (site, '=~', '$site'))}, {rack})"),
        ]
        # Nodes truegpu_node_info places outside the selected site/rack drop out; nodes it does not place stay.
        elsewhere = f"{d.selector(node, (site, '!~', '$site'))} or {d.selector(node, (rack, '!~', '$rack'))}"
        # query_result is an instant query: hosts seen anywhere in the range (one that died stays listed).
        seen = f"max_over_time({d.selector(info)}[{RANGE}])"
        hosts = _label_of(f"group by ({d.key(S.HOSTNAME)}) ({seen}) unless on ({d.key(S.HOSTNAME)}) ({elsewhere})",
                          S.HOSTNAME)
        variables_ = [
            _variable("hostname", "Host", hosts[0], regex=hosts[1], all_value=None),
            _variable("gpu", "GPU", f"label_values({d.selector(info, (S.HOSTNAME, '=~', '$hostname'))}, gpu)"),
            _variable("namespace", "Namespace", f"label_values({d.selector(alloc)}, namespace)"),
            _variable(S.WORKLOAD, "Workload",
                      f"label_values({d.selector(alloc, ('namespace', '=~', '$namespace'))}, {S.WORKLOAD})"),
        ]
    cluster = [_variable(V_CLUSTER[1:], "Cluster", f"label_values({cluster_source}, {d.cluster_label})")] \
        if d.cluster_label else []
    return [ds, *cluster, *placement, *variables_]


def dashboard_links(dialect: Dialect, keys: tuple[str, ...], titles: dict[str, str]) -> list[g.DashboardLink]:
    """Links to the related dashboards of the same dialect, keeping the time range and the variables,
    and a drop-down of every truegpu dashboard of the dialect."""
    links = [g.DashboardLink(type="link", title=titles[k], uri=f"/d/{dashboard_uid(dialect, k)}", icon="dashboard",
                             keepTime=True, includeVars=True, tooltip=f"{titles[k]}, same time range and variables")
             for k in keys]
    links.append(g.DashboardLink(type="dashboards", title="truegpu dashboards", tags=["truegpu", dialect.name],
                                 asDropdown=True, keepTime=True, includeVars=True))
    return links


#: The analyzer's base URL as a browser reaches it (a textbox variable: set it to your ingress); the default is
#: ``kubectl -n truegpu port-forward svc/truegpu-analyzer 9836``'s.
ANALYZER_URL_VARIABLE, ANALYZER_URL_DEFAULT = "analyzer_url", "http://localhost:9836"


def analyzer_links(paths: tuple[tuple[str, str], ...]) -> tuple[list[g.Template], list[g.DashboardLink]]:
    """(the analyzer URL variable, links) for pages of the analyzer: (title, path under its base URL)."""
    if not paths:
        return [], []
    var = g.Template(name=ANALYZER_URL_VARIABLE, label="truegpu analyzer URL", query=ANALYZER_URL_DEFAULT,
                     type="textbox", default=ANALYZER_URL_DEFAULT, hide=g.SHOW)
    links = [g.DashboardLink(type="link", title=title, uri=f"${{{ANALYZER_URL_VARIABLE}}}{path}", icon="doc",
                             targetBlank=True, tooltip=f"{title}: the truegpu analyzer's page")
             for title, path in paths]
    return [var], links


def findings_annotation(dialect: Dialect, kinds: tuple[str, ...]) -> dict:
    """The analyzer's open findings of ``kinds`` (analyzer.findings constants) as Grafana annotations,
    filtered by the dashboard's variables: a region per finding while truegpu_finding_active is 1."""
    expr = dialect.analyzer(out.FINDING_ACTIVE, kind="=~" + "|".join(kinds))
    return {
        "name": "Findings: " + ", ".join(kinds),
        "datasource": DATASOURCE,
        "enable": True,
        "hide": False,
        "iconColor": "red",
        "expr": expr,
        "step": "60s",
        "titleFormat": "{{kind}} ({{severity}})",
        "textFormat": "{{hostname}} gpu {{gpu}} {{gpu_instance}} {{rack}} {{namespace}}/{{workload}}",
        "tagKeys": "kind,severity,hostname,gpu,namespace,workload",
        "useValueForTime": False,
    }


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


def dashboard(*, key: str, title: str, description: str, dialect: Dialect, specs: list[PanelSpec],
              links: tuple[str, ...] = (), titles: dict[str, str] | None = None,
              findings: tuple[str, ...] = (), pages: tuple[tuple[str, str], ...] = ()) -> g.Dashboard:
    """One dashboard: ``links`` are the keys of related dashboards (``titles``: key -> title), ``findings``
    the analyzer finding kinds shown as annotations, ``pages`` links to the analyzer's pages (``analyzer_links``)."""
    panels = [_panel(s, dialect, p) for s, p in zip(specs, layout(specs), strict=True)]
    page_vars, page_links = analyzer_links(pages)
    variant = "dcgm-exporter" if dialect.name == DCGM else "truegpu exporter"
    return g.Dashboard(
        title=f"truegpu / {title} ({variant})",
        uid=dashboard_uid(dialect, key),
        description=description,
        tags=["truegpu", dialect.name, key],
        panels=panels,
        links=dashboard_links(dialect, links, titles or {}) + page_links,
        annotations=g.Annotations(list=[findings_annotation(dialect, findings)] if findings else []),
        templating=g.Templating(list=variables(dialect) + page_vars),
        time=g.Time("now-6h", "now"),
        refresh="1m",
        timezone="utc",
        graphTooltip=g.GRAPH_TOOLTIP_MODE_SHARED_CROSSHAIR,
        schemaVersion=SCHEMA_VERSION,
    ).auto_panel_ids()


def to_json(dash: g.Dashboard) -> str:
    return json.dumps(dash.to_json_data(), cls=DashboardEncoder, sort_keys=True, indent=2) + "\n"
