"""Prometheus recording and alerting rules, generated from the metric contracts.

Three rule files, each a list of groups:

* ``truegpu.yaml`` -- recording rules (effective utilization, masking gap at GPU/node/job/fleet
  level) and hardware/exporter alerts over truegpu's own exporter metrics;
* ``dcgm.yaml`` -- the same recording rules and hardware alerts over plain NVIDIA
  dcgm-exporter data (``DCGM_FI_*`` fields or the 1.x ``dcgm_fi_*`` names; ``gpu``/``UUID``
  labels and the host in ``Hostname`` or ``hostname``): every series is normalized to
  ``hostname``/``UUID`` before it is grouped or matched, so rules, routing and inhibition
  treat every exporter release (and truegpu's own dialect) alike;
* ``analyzer.yaml`` -- alerts on the analyzer's published findings and on the analyzer's health.

Every metric name comes from :mod:`exporter.schema` or :mod:`analyzer.output_schema`; the
recording-rule names below are the public constants dashboards import. Durations (``for:``,
rate windows, staleness thresholds) pass through :class:`Timing` so that the end-to-end test
runs these very rules with ``scale=0.01``.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from analyzer import findings as F
from analyzer import output_schema as O
from analyzer.site import THRESHOLDS, Selectors, Thresholds
from analyzer.xid import CATALOGUE
from exporter import schema as S
from exporter.sources import DEFAULT_DEADLINE

SEVERITIES = ("critical", "warning", "info")
TEAMS = ("training", "sre", "facilities", "finops")

#: Where ``runbook_url`` annotations point; ``docs/runbooks/<alertname>.md`` in this repository.
RUNBOOK_BASE_URL = "https://github.com/truegpu/truegpu/blob/main/docs/runbooks"
#: Where ``dashboard_url`` annotations point: the compose stack's Grafana (a site config sets its own).
DASHBOARD_BASE_URL = "http://localhost:3000"
#: The built-in selectors and thresholds (analyzer.site: a site config overrides them).
SELECTORS = Selectors()
#: Prometheus scrape job names the health alerts select (deploy/prometheus.yml).
EXPORTER_JOB, ANALYZER_JOB, DCGM_JOB = SELECTORS.exporter_job, SELECTORS.analyzer_job, SELECTORS.dcgm_job
#: dcgm-exporter's host label in older releases (newer ones write ``hostname``): rules read both.
DCGM_OLD_HOST_LABEL = "Hostname"
#: dcgm-exporter's GPU UUID label, and its 1.x spelling.
DCGM_UUID_LABEL, DCGM_OLD_UUID_LABEL = "UUID", "uuid"
#: How far back GpuFellOffBus remembers a GPU (seconds): a GPU lost longer ago (or before
#: Prometheus first scraped it) is GpuMissing's, from the node's GPU capacity.
FELL_OFF_BUS_LOOKBACK = 6 * 3600
#: Prometheus' own scrape-health series (not a contract metric: Prometheus writes it).
UP = "up"

# Recording rules (public: dashboards import these) ------------------------------------------
GPU_SM_CLOCK_RATIO = "gpu:truegpu_sm_clock:ratio"
GPU_EFFECTIVE_UTILIZATION = "gpu:truegpu_effective_utilization:ratio"
GPU_MASKING_GAP = "gpu:truegpu_masking_gap:ratio"
NODE_EFFECTIVE_UTILIZATION = "node:truegpu_effective_utilization:avg"
NODE_MASKING_GAP = "node:truegpu_masking_gap:avg"
WORKLOAD_EFFECTIVE_UTILIZATION = "workload:truegpu_effective_utilization:avg"
WORKLOAD_MASKING_GAP = "workload:truegpu_masking_gap:avg"
FLEET_EFFECTIVE_UTILIZATION = "fleet:truegpu_effective_utilization:avg"
FLEET_MASKING_GAP = "fleet:truegpu_masking_gap:avg"
DCGM_GPU_SM_CLOCK_RATIO = "gpu:dcgm_sm_clock:ratio"
DCGM_GPU_EFFECTIVE_UTILIZATION = "gpu:dcgm_effective_utilization:ratio"
DCGM_GPU_MASKING_GAP = "gpu:dcgm_masking_gap:ratio"
DCGM_NODE_EFFECTIVE_UTILIZATION = "node:dcgm_effective_utilization:avg"
DCGM_NODE_MASKING_GAP = "node:dcgm_masking_gap:avg"
DCGM_FLEET_EFFECTIVE_UTILIZATION = "fleet:dcgm_effective_utilization:avg"
DCGM_FLEET_MASKING_GAP = "fleet:dcgm_masking_gap:avg"
#: Fleet series carry ``allocation`` = these values, as the analyzer's fleet gauges do.
ALLOCATION_LABEL = "allocation"
ALLOCATION_ALL = "all"
ALLOCATION_ALLOCATED = "allocated"

# Thresholds (analyzer.site.Thresholds: shared with the detectors) ---------------------------
#: The analyzer's last success older than this (seconds, before scaling) means it is stuck.
ANALYZER_STALE_SECONDS = 900
#: DCGM blank/not-supported markers start here; comparisons exclude them (treated as missing).
DCGM_SENTINEL_MIN = int(S.DCGM_SENTINEL_RANGES[0][0])

# XID classes (analyzer.xid is the catalogue: severity per code) -------------------------------
CRITICAL_XIDS: tuple[int, ...] = tuple(sorted(c for c, x in CATALOGUE.items() if x.severity == "critical"))
INFO_XIDS: tuple[int, ...] = tuple(sorted(c for c, x in CATALOGUE.items() if x.severity == "info"))

#: Alerts that a fallen-off GPU or a down exporter makes meaningless (inhibition targets).
GPU_SYMPTOM_ALERTS = (
    "GpuStraggler", "GpuDegraded", "GpuIdleMasking", "GpuIdleAllocated", "GpuThermalThrottling",
    "GpuNearThermalLimit", "GpuThermal", "GpuPcieLinkDowngraded", "GpuNvlinkErrors",
)
FELL_OFF_BUS = "GpuFellOffBus"
RECOVERY_ACTION = "GpuRecoveryActionRequired"
#: Alerts about one GPU's hardware (they carry who holds the GPU: routing can send them to its owners).
HARDWARE_ALERTS = (
    "GpuXidError", "GpuUncorrectableEcc", "GpuRowRemapFailure", RECOVERY_ACTION, "GpuThermalThrottling",
    "GpuNearThermalLimit",
    "GpuNvlinkErrors", "GpuPcieLinkDowngraded", FELL_OFF_BUS,
)
GPU_MISSING = "GpuMissing"
#: kube-state-metrics' GPU capacity of a node (the device plugin's ``nvidia.com/gpu``), keyed by ``node``.
KUBE_NODE_CAPACITY = "kube_node_status_capacity"
KUBE_GPU_RESOURCE = "nvidia_com_gpu"
KUBE_NODE_LABEL = "node"
EXPORTER_DOWN = "TruegpuExporterDown"
DCGM_EXPORTER_DOWN = "DcgmExporterDown"
ANALYZER_DOWN = "TruegpuAnalyzerDown"
COLLECTION_FAILING = "TruegpuCollectionFailing"
COLLECTION_STALE = "TruegpuCollectionStale"
COLLECTION_SLOW = "TruegpuCollectionSlow"
#: A source whose collection takes more than this share of the exporter's deadline is slow:
#: one bad scrape more and the exporter serves stale values.
SLOW_SHARE_OF_DEADLINE = 0.5

#: dcgm-exporter fields enabled by its default counter list (default-counters.csv); an alert
#: using any other field needs that field added to the exporter's counters file.
DCGM_DEFAULT_FIELDS: frozenset[str] = frozenset({
    S.SM_CLOCK.dcgm[0].field, S.GPU_UTILIZATION.dcgm[0].field, S.XID_ERRORS.dcgm[0].field,
    *(f.field for f in S.TEMPERATURE.dcgm), *(f.field for f in S.REMAPPED_ROWS.dcgm),
    S.ROW_REMAP_FAILURE.dcgm[0].field, S.PCIE_REPLAYS.dcgm[0].field, S.MEMORY_USED.dcgm[0].field,
})


# Durations ------------------------------------------------------------------------------------
def fmt_duration(seconds: float) -> str:
    """A Prometheus duration: the largest whole unit (``1h``, ``10m``, ``30s``, ``300ms``)."""
    ms = round(seconds * 1000)
    for unit, size in (("h", 3_600_000), ("m", 60_000), ("s", 1000)):
        if ms and ms % size == 0:
            return f"{ms // size}{unit}"
    return f"{ms}ms"


@dataclass(frozen=True)
class Timing:
    """Scales every duration of the rules (``scale=0.01`` for fast end-to-end tests).

    ``for:`` durations never go below ``min_for`` (unless 0), rate windows and lookbacks
    never below ``min_window``: a window must hold at least two scrapes, so keep the scrape
    interval at most half of ``min_window`` when scaling down.
    """

    scale: float = 1.0
    min_for: float = 1.0
    min_window: float = 5.0

    def __post_init__(self) -> None:
        if not self.scale > 0:
            raise ValueError(f"scale must be positive, got {self.scale}")

    def hold(self, seconds: float) -> str:
        return "0s" if seconds == 0 else fmt_duration(max(seconds * self.scale, self.min_for))

    def window(self, seconds: float) -> str:
        return fmt_duration(max(seconds * self.scale, self.min_window))

    def seconds(self, seconds: float) -> float:
        """A threshold in seconds, scaled like a window (for ``time() - ts > x``)."""
        return round(max(seconds * self.scale, self.min_window), 3)


# Rule model -----------------------------------------------------------------------------------
@dataclass(frozen=True)
class Links:
    """Where the annotations point: runbooks (``<runbook_base>/<alert>.md``) and Grafana
    (``<dashboard_base>/d/<dialect>-<dashboard>?var-...``, the generated dashboards' UIDs)."""

    runbook_base: str = RUNBOOK_BASE_URL
    dashboard_base: str = DASHBOARD_BASE_URL
    dialect: str = "truegpu"
    #: The alert label that fills the dashboards' ``cluster`` variable ("" for none).
    cluster_label: str = SELECTORS.cluster_label


#: Dashboard (dashboards/<key>.py) an alert opens on, and the variables it fills from the alert's labels.
DASHBOARD_OF: dict[str, str] = {
    **dict.fromkeys(("GpuXidError", "GpuUncorrectableEcc", "GpuRowRemapFailure", RECOVERY_ACTION, "GpuNvlinkErrors",
                     "GpuPcieLinkDowngraded", "GpuFellOffBus", "GpuMissing", "GpuDegraded", "GpuFault"), "health"),
    **dict.fromkeys(("GpuThermalThrottling", "GpuNearThermalLimit", "GpuThermal"), "thermal"),
    **dict.fromkeys(("GpuStraggler",), "job"),
    **dict.fromkeys(("GpuIdleMasking", "GpuIdleAllocated"), "finops"),
    **dict.fromkeys(("TruegpuExporterDown", "DcgmExporterDown", "TruegpuCollectionFailing",
                     "TruegpuCollectionStale", "TruegpuCollectionSlow", "TruegpuAnalyzerDown"), "fleet"),
}
#: The generated dashboards' cluster variable (filled from the site's cluster label).
CLUSTER_VARIABLE = "cluster"
_DASHBOARD_VARS: dict[str, tuple[str, ...]] = {
    "health": ("hostname", "gpu"), "thermal": ("hostname", "gpu"), "job": ("namespace", "workload"),
    "finops": ("namespace",), "fleet": ("hostname",),
}


def dashboard_url(alert: str, links: Links) -> str:
    """The alert's dashboard with its variables set from the alert's labels (those it has)."""
    key = DASHBOARD_OF[alert]
    fills = [(CLUSTER_VARIABLE, links.cluster_label)] if links.cluster_label else []
    fills += [(v, v) for v in _DASHBOARD_VARS[key]]
    params = "".join(f"{{{{ with $labels.{label} }}}}&var-{v}={{{{ . }}}}{{{{ end }}}}" for v, label in fills)
    return f"{links.dashboard_base}/d/{links.dialect}-{key}?orgId=1{params}"


@dataclass(frozen=True)
class Record:
    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self, links: Links) -> dict[str, Any]:
        out: dict[str, Any] = {"record": self.record, "expr": self.expr}
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


@dataclass(frozen=True)
class Alert:
    alert: str
    expr: str
    for_: str
    severity: str
    team: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)
    #: dcgm-exporter fields the rule reads (dcgm dialect only); documents non-default counters.
    dcgm_fields: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES or self.team not in TEAMS:
            raise ValueError(f"{self.alert}: bad severity/team {self.severity}/{self.team}")

    @property
    def non_default_fields(self) -> tuple[str, ...]:
        return tuple(f for f in self.dcgm_fields if f not in DCGM_DEFAULT_FIELDS)

    def to_dict(self, links: Links) -> dict[str, Any]:
        annotations = {
            "summary": self.summary,
            "description": self.description,
            "runbook_url": f"{links.runbook_base}/{self.alert}.md",
            "dashboard_url": dashboard_url(self.alert, links),
        }
        if self.non_default_fields:
            annotations["dcgm_counters"] = (
                "needs dcgm-exporter counters beyond the default list: " + ", ".join(self.non_default_fields)
            )
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            "labels": {"severity": self.severity, "team": self.team, **self.labels},
            "annotations": annotations,
        }


@dataclass(frozen=True)
class Group:
    name: str
    rules: tuple[Record | Alert, ...]

    def to_dict(self, links: Links) -> dict[str, Any]:
        return {"name": self.name, "rules": [r.to_dict(links) for r in self.rules]}


@dataclass(frozen=True)
class RuleFile:
    name: str
    header: str
    groups: tuple[Group, ...]
    #: Which dashboards (``<dialect>-<key>``) its alerts link to.
    dialect: str = "truegpu"

    def alerts(self) -> list[Alert]:
        return [r for g in self.groups for r in g.rules if isinstance(r, Alert)]

    def records(self) -> list[Record]:
        return [r for g in self.groups for r in g.rules if isinstance(r, Record)]

    def to_dict(self, links: Links) -> dict[str, Any]:
        return {"groups": [g.to_dict(links) for g in self.groups]}

    def keeping(self, cluster_label: str) -> RuleFile:
        """Every expression keeps ``cluster_label`` (:func:`keep_cluster`)."""
        groups = tuple(Group(g.name, tuple(replace(r, expr=keep_cluster(r.expr, cluster_label)) for r in g.rules))
                       for g in self.groups)
        return replace(self, groups=groups)


_GROUPING = re.compile(r"\b(by|on) \(")
_BARE_AGGREGATION = re.compile(r"\b(sum|avg|min|max|count|group|topk|bottomk|quantile) \(")


def keep_cluster(expr: str, label: str) -> str:
    """``expr`` with ``label`` in every ``by``/``on`` grouping, and bare aggregations grouped by it: a
    multi-cluster Prometheus (Thanos, Mimir) never averages, joins or pages across clusters. Where the
    label is absent the result is the same as without it. The rules are written in one style for this
    (``agg by (...) (...)``, ``on (...)``, one space before the parenthesis); tests check each file."""
    if not label:
        return expr
    expr = _GROUPING.sub(lambda m: f"{m.group(1)} ({label}, ", expr).replace(f"({label}, )", f"({label})")
    return _BARE_AGGREGATION.sub(lambda m: f"{m.group(1)} by ({label}) (", expr)


# PromQL helpers -------------------------------------------------------------------------------
def by(labels: Iterable[str]) -> str:
    return ", ".join(labels)


def sel(name: str, **matchers: str) -> str:
    """``name{k="v", k2=~"a|b"}``: a value starting with ``=~``/``!~``/``!=`` keeps that operator."""
    if not matchers:
        return name
    parts = []
    for k, v in matchers.items():
        op = "="
        for candidate in ("=~", "!~", "!="):
            if v.startswith(candidate):
                op, v = candidate, v[len(candidate):]
                break
        parts.append(f'{k}{op}"{v}"')
    return name + "{" + ", ".join(parts) + "}"


def alternatives(values: Iterable[object]) -> str:
    return "|".join(str(v) for v in values)


def any_of(names: Sequence[str]) -> str:
    """One selector over several metric names (dcgm-exporter's current and deprecated field)."""
    return names[0] if len(names) == 1 else "{" + f'__name__=~"{alternatives(names)}"' + "}"


def number(x: float) -> str:
    """A PromQL number literal: ``1000000`` rather than ``1e+06``."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def scaled(expr: str, factor: float) -> str:
    return expr if factor == 1 else f"({expr} * {number(factor)})"


GPU_BY = by(S.GPU_LABELS)
GPU_INSTANCE_BY = by((*S.GPU_LABELS, S.GPU_INSTANCE))
NAMESPACE, WORKLOAD = "namespace", S.WORKLOAD
assert NAMESPACE in S.GPU_ALLOCATION_INFO.labels and WORKLOAD in S.GPU_ALLOCATION_INFO.labels
assert NAMESPACE in O.FINDING_LABELS and WORKLOAD in O.FINDING_LABELS
#: Prometheus' own target label (the scrape job), never a workload.
SCRAPE_JOB = "job"
THERMAL = alternatives(S.THERMAL_REASONS)

GPU_REF = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.hostname }}"
DCGM_GPU_REF = "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.hostname }}"
SHORT_REF = "GPU {{ $labels.gpu }} of {{ $labels.hostname }}"


# truegpu dialect ------------------------------------------------------------------------------
def truegpu_recording() -> Group:
    sm_active = S.SM_ACTIVE.name
    alloc = S.GPU_ALLOCATION_INFO.name
    whole = {S.GPU_INSTANCE: ""}  # whole GPUs only: MIG instances publish no GPU utilization
    alloc_by = by((*S.GPU_LABELS, S.GPU_INSTANCE, NAMESPACE, WORKLOAD))
    rules = (
        Record(GPU_SM_CLOCK_RATIO,
               f"clamp_max(max by ({GPU_BY}) ({S.SM_CLOCK.name}) / max by ({GPU_BY}) ({S.SM_CLOCK_MAX.name}), 1)"),
        Record(GPU_EFFECTIVE_UTILIZATION, f"{sm_active} * on ({GPU_BY}) group_left () {GPU_SM_CLOCK_RATIO}"),
        Record(GPU_MASKING_GAP, f"{sel(S.GPU_UTILIZATION.name, **whole)} - on ({GPU_BY}) {sel(sm_active, **whole)}"),
        Record(NODE_EFFECTIVE_UTILIZATION, f"avg by ({S.HOSTNAME}) ({GPU_EFFECTIVE_UTILIZATION})"),
        Record(NODE_MASKING_GAP, f"avg by ({S.HOSTNAME}) ({GPU_MASKING_GAP})"),
        Record(WORKLOAD_EFFECTIVE_UTILIZATION,
               f"avg by ({NAMESPACE}, {WORKLOAD}) (max by ({alloc_by}) ({alloc}) "
               f"* on ({GPU_INSTANCE_BY}) group_left () {GPU_EFFECTIVE_UTILIZATION})"),
        Record(WORKLOAD_MASKING_GAP,
               f"avg by ({NAMESPACE}, {WORKLOAD}) (max by ({alloc_by}) ({alloc}) "
               f"* on ({GPU_INSTANCE_BY}) group_left () {GPU_MASKING_GAP})"),
        Record(FLEET_EFFECTIVE_UTILIZATION, f"avg ({GPU_EFFECTIVE_UTILIZATION})", {ALLOCATION_LABEL: ALLOCATION_ALL}),
        Record(FLEET_EFFECTIVE_UTILIZATION, f"avg ({GPU_EFFECTIVE_UTILIZATION} and on ({GPU_INSTANCE_BY}) {alloc})",
               {ALLOCATION_LABEL: ALLOCATION_ALLOCATED}),
        Record(FLEET_MASKING_GAP, f"avg ({GPU_MASKING_GAP})", {ALLOCATION_LABEL: ALLOCATION_ALL}),
        Record(FLEET_MASKING_GAP, f"avg ({GPU_MASKING_GAP} and on ({GPU_BY}) {alloc})",
               {ALLOCATION_LABEL: ALLOCATION_ALLOCATED}),
    )
    return Group("truegpu-recording", rules)


def _new_counter_events(selector: str, window: str) -> str:
    """Events of a counter within ``window``, also when its series first appears with them."""
    return f"increase({selector}[{window}]) > 0 or max without () ({selector} > 0 unless {selector} offset {window})"


def with_owner(expr: str, key: str = GPU_BY, holders: str = S.GPU_ALLOCATION_INFO.name,
               owner: str = f"{NAMESPACE}, {WORKLOAD}") -> str:
    """A per-GPU alert with who holds the GPU (``owner`` labels of the ``holders`` series, e.g. the
    ``namespace``/``workload`` of truegpu_gpu_allocation_info), so routing can send it to the
    workload's owners; GPUs nobody holds keep their labels as they are. One holder per GPU (a
    shared or MIG-split GPU: any one of them)."""
    holder = f"topk by ({key}) (1, group by ({key}, {owner}) ({holders}))"  # value 1: $value stays the alert's
    return (f"({expr}) * on ({key}) group_left ({owner}) {holder} "
            f"or (({expr}) unless on ({key}) {holder})")


def recovery_action(expr: str, ref: str, labels: dict[str, str] | None = None,
                    fields: tuple[str, ...] = ()) -> Alert:
    """GpuRecoveryActionRequired: the driver says the GPU needs a reset, reboot or drain (``expr``: the
    recovery-action code, non-zero)."""
    codes = ", ".join(f"{c} {a.replace('_', ' ')}" for c, a in S.GPU_RECOVERY_ACTIONS.items() if c)
    return Alert(RECOVERY_ACTION, f"{expr} > 0", "0s", "critical", "training",
                 "GPU recovery action {{ $value }} required on " + SHORT_REF,
                 f"{ref} needs recovery action {{{{ $value }}}} ({codes}): drain its work and do what the code "
                 "says; the GPU cannot be trusted until then.", labels or {}, fields)


def thermal_alerts(t: Timing, th: Thresholds, key: str, clock: str, thermal_reason: str, reasons: str,
                   gpu_temp: str, memory_temp: str, ref: str, clock_text: str,
                   labels: dict[str, str] | None = None, fields: tuple[str, ...] = ()) -> tuple[Alert, Alert]:
    """GpuThermalThrottling (critical: what the thermal detector calls "at the limit") and
    GpuNearThermalLimit (warning), on the site's shared thresholds and hold times.

    At the limit: a thermal clock-event reason, or -- where throttle reasons are not collected
    (``reasons`` absent; dcgm-exporter's default counters omit them) -- the die or HBM at its
    slowdown point, as the detector reads it. ``gpu_temp``/``memory_temp`` are per-GPU (``key``).
    A GPU is near the limit whenever it is hot and not throttling (one alert or the other)."""
    gpu_limit, memory_limit = number(th.gpu_temp_limit_celsius), number(th.memory_temp_limit_celsius)
    hot = f"{gpu_temp} >= {gpu_limit} or {memory_temp} >= {memory_limit}"
    at_limit = f"{thermal_reason} or (({hot}) unless on ({key}) {reasons})"
    throttling = f"{clock} and on ({key}) ({at_limit})"
    near = " or ".join(f'label_replace({expr} > {number(limit)}, "sensor", "{sensor}", "", "")'
                       for sensor, expr, limit in (("gpu", gpu_temp, th.gpu_temp_near_celsius),
                                                   ("memory", memory_temp, th.memory_temp_near_celsius)))
    limit_for, warn_for = t.hold(th.thermal_limit_for_seconds), t.hold(th.thermal_warn_for_seconds)
    return (
        Alert("GpuThermalThrottling", throttling, limit_for, "critical", "sre",
              "Thermal throttling on " + SHORT_REF,
              f"{ref} has been slowed down for heat for {limit_for} (a thermal clock-event reason, or where "
              f"those are not collected the die at {gpu_limit} C or HBM at {memory_limit} C or more); "
              f"its SM clock is at {clock_text}.",
              labels or {}, fields),
        Alert("GpuNearThermalLimit", f"({near}) unless on ({key}) ({throttling})", warn_for, "warning", "facilities",
              "GPU {{ $labels.sensor }} temperature near its limit on " + SHORT_REF,
              f"{ref}: {{{{ $labels.sensor }}}} temperature {{{{ $value }}}} C for {warn_for}, close to "
              "thermal slowdown; check airflow and inlet temperature of the rack.", labels or {}, fields),
    )


def truegpu_hardware(t: Timing, th: Thresholds = THRESHOLDS) -> Group:
    w10 = t.window(600)
    xid = S.XID_ERRORS.name
    crit, info = alternatives(CRITICAL_XIDS), alternatives(INFO_XIDS)
    xid_events = "{{ printf \"%.0f\" $value }} XID {{ $labels.xid }} event(s) in the last " + w10
    ecc = sel(S.ECC_ERRORS.name, type="uncorrectable", scope="volatile")
    rows = sel(S.REMAPPED_ROWS.name, type="uncorrectable")
    clock_event = sel(S.CLOCK_EVENT_ACTIVE.name, reason="=~" + THERMAL)
    temp = S.TEMPERATURE.name
    pcie = []
    for metric, what in ((S.PCIE_LINK_GENERATION, "generation"), (S.PCIE_LINK_WIDTH, "width")):
        cur, mx = sel(metric.name, state="current"), sel(metric.name, state="max")
        pcie.append(f'label_replace(max by ({GPU_BY}) ({cur}) < max by ({GPU_BY}) ({mx}), "link", "{what}", "", "")')
    busy = f"max by ({GPU_BY}) ({S.GPU_UTILIZATION.name}) > {number(th.busy_utilization)}"
    rules = (
        Alert("GpuXidError", f"{_new_counter_events(sel(xid, xid='=~' + crit), w10)}", "0s", "critical", "training",
              "Critical XID {{ $labels.xid }} on " + SHORT_REF,
              f"{GPU_REF} reported {xid_events}: the GPU cannot be trusted until it is drained and reset."),
        Alert("GpuXidError", f"{_new_counter_events(sel(xid, xid='!~' + crit + '|' + info), w10)}", "0s", "warning",
              "training", "XID {{ $labels.xid }} on " + SHORT_REF,
              f"{GPU_REF} reported {xid_events}: a driver or hardware error, see the runbook's XID table."),
        Alert("GpuXidError", f"{_new_counter_events(sel(xid, xid='=~' + info), w10)}", "0s", "info", "training",
              "Application XID {{ $labels.xid }} on " + SHORT_REF,
              f"{GPU_REF} reported {xid_events}: usually the job's own bug (illegal memory access, "
              "kernel exception); the GPU itself is fine."),
        Alert("GpuUncorrectableEcc",
              f"sum by ({GPU_BY}) (increase({ecc}[{w10}])) > 0 or sum by ({GPU_BY}) (increase({rows}[{w10}])) > 0",
              "0s", "critical", "training", "Uncorrectable ECC error on " + SHORT_REF,
              f"{GPU_REF} had {{{{ printf \"%.0f\" $value }}}} uncorrectable memory error(s) in the last {w10}: "
              "drain the GPU and reset it to apply the row remap."),
        Alert("GpuRowRemapFailure", f"{S.ROW_REMAP_FAILURE.name} == 1", "0s", "critical", "training",
              "Row remapping failed on " + SHORT_REF,
              f"{GPU_REF} has no spare HBM rows left to remap memory errors: drain it and RMA it."),
        recovery_action(S.GPU_RECOVERY_ACTION.name, GPU_REF),
        *thermal_alerts(t, th, GPU_BY, GPU_SM_CLOCK_RATIO, f"max by ({GPU_BY}) ({clock_event}) > 0",
                        sel(S.CLOCK_EVENT_ACTIVE.name), f"max by ({GPU_BY}) ({sel(temp, sensor='gpu')})",
                        f"max by ({GPU_BY}) ({sel(temp, sensor='memory')})", GPU_REF,
                        "{{ $value | humanizePercentage }} of maximum"),
        Alert("GpuNvlinkErrors", f"sum by ({GPU_BY}) (increase({S.NVLINK_ERRORS.name}[{w10}])) > 0", t.hold(600),
              "warning", "training", "NVLink errors on " + SHORT_REF,
              f"{GPU_REF} keeps logging NVLink errors ({{{{ $value | humanize }}}} in the last {w10}): "
              "collectives over this GPU slow down or fail."),
        Alert("GpuPcieLinkDowngraded", f"({pcie[0]} or {pcie[1]}) and on ({GPU_BY}) ({busy})", t.hold(600),
              "warning", "training", "PCIe link downgraded on busy " + SHORT_REF,
              f"{GPU_REF} runs its PCIe link at {{{{ $labels.link }}}} {{{{ $value }}}}, below its maximum, "
              "while busy: host-device transfers are slower."),
        Alert(FELL_OFF_BUS,
              f"max by ({GPU_BY}) (max_over_time({S.GPU_INFO.name}[{t.window(FELL_OFF_BUS_LOOKBACK)}])) "
              f"unless on ({GPU_BY}) {S.GPU_INFO.name} and on ({S.HOSTNAME}) {S.NODE_INFO.name}",
              t.hold(60), "critical", "training", SHORT_REF + " fell off the bus",
              f"{GPU_REF} stopped reporting while its node's exporter is up: the GPU is lost (XID 79 or "
              "similar); drain the node and reset or reseat the GPU."),
    )
    return Group("truegpu-hardware", (*(replace(a, expr=with_owner(a.expr)) for a in rules),
                                      gpu_missing(t, S.MEMORY_USED.name, S.GPU_INSTANCE)))


def gpu_missing(t: Timing, reporting: str, instance_label: str, dialect: dict[str, str] | None = None,
                fields: tuple[str, ...] = ()) -> Alert:
    """Kubernetes says a node has more GPUs than report from it (a GPU lost before Prometheus ever
    saw it, or longer ago than GpuFellOffBus remembers). ``reporting`` is a per-GPU (and per MIG
    instance: ``instance_label``) expression with ``hostname`` and ``gpu``; a node whose exporter is down
    reports nothing and is left to the exporter-down alert. MIG nodes under the device plugin's
    "single" strategy count instances as GPUs: the alert needs the capacity above both counts."""
    node = KUBE_NODE_LABEL
    cap = f"max by ({node}) ({sel(KUBE_NODE_CAPACITY, resource=KUBE_GPU_RESOURCE)})"

    def count(keys: str) -> str:
        per = f"count by ({S.HOSTNAME}, {keys}) ({reporting})"
        return f'count by ({node}) (label_replace({per}, "{node}", "$1", "{S.HOSTNAME}", "(.+)"))'

    expr = (f"({cap} - on ({node}) {count(S.GPU)} > 0) "
            f"and on ({node}) ({cap} - on ({node}) {count(by((S.GPU, instance_label)))} > 0)")
    expr = f'label_replace({expr}, "{S.HOSTNAME}", "$1", "{node}", "(.+)")'
    return Alert(GPU_MISSING, expr, t.hold(900), "critical", "training",
                 "{{ $value }} GPU(s) missing on {{ $labels.hostname }}",
                 "Kubernetes counts more GPUs on {{ $labels.hostname }} than report from it for "
                 f"{t.hold(900)} ({{{{ $value }}}} missing): a GPU lost before Prometheus saw it, or long ago "
                 "(nvidia-smi on the node lists what the driver sees); drain the node and reset or reseat it.",
                 dialect or {}, fields)


def exporter_down(t: Timing, job: str, presence: str, alert: str, norm: Any = lambda e: e,
                  labels: dict[str, str] | None = None) -> Alert:
    """``up == 0`` for the job, carrying ``hostname`` remembered from the target's last hour of data.

    ``presence`` is a selector (already matching ``job``) of a series every target sends; ``norm``
    brings its labels to ``hostname`` (dcgm-exporter's spellings)."""
    up = f"{sel(UP, job=job)} == 0"
    hosts = f"max by ({SCRAPE_JOB}, instance, {S.HOSTNAME}) ({norm(f'last_over_time({presence}[{t.window(3600)}])')})"
    expr = f"{hosts} * on ({SCRAPE_JOB}, instance) group_left () ({up}) or on ({SCRAPE_JOB}, instance) {up}"
    return Alert(alert, expr, t.hold(300), "warning", "sre", "Exporter {{ $labels.instance }} is down",
                 f"Prometheus cannot scrape {{{{ $labels.instance }}}} (job {{{{ $labels.job }}}}"
                 f"{{{{ with $labels.hostname }}}}, host {{{{ . }}}}{{{{ end }}}}) for {t.hold(300)}: "
                 "the GPUs there are unobserved.", labels or {})


def collection_health(t: Timing, exporter_job: str) -> tuple[Alert, ...]:
    """The exporter is up but a source is not: failing (some GPU or the endpoint unreadable), serving
    stale values (collections overrun the deadline), or slow. Carry the node from truegpu_node_info."""
    def on_node(expr: str) -> str:
        node = f"max by ({SCRAPE_JOB}, instance, {S.HOSTNAME}) ({sel(S.NODE_INFO.name, job=exporter_job)})"
        return (f"({expr}) * on ({SCRAPE_JOB}, instance) group_left ({S.HOSTNAME}) {node} "
                f"or on ({SCRAPE_JOB}, instance, source) ({expr})")

    where = "source {{ $labels.source }} of the exporter on {{ $labels.hostname }} ({{ $labels.instance }})"
    slow = SLOW_SHARE_OF_DEADLINE * DEFAULT_DEADLINE
    by_source = f"{SCRAPE_JOB}, instance, source"  # the exporter's node, where it publishes truegpu_node_info
    return (
        Alert(COLLECTION_FAILING,
              on_node(f"max by ({by_source}) ({sel(S.SOURCE_UP.name, job=exporter_job)}) == 0"),
              t.hold(900), "warning", "sre", "GPU telemetry collection failing on {{ $labels.hostname }}",
              f"The {where} has not collected everything for {t.hold(900)} (a lost GPU, NVML errors, or "
              "dcgm-exporter unreachable): truegpu_exporter_errors_total says which; those GPUs are unknown."),
        Alert(COLLECTION_STALE,
              on_node(f"max by ({by_source}) ({sel(S.SOURCE_STALE.name, job=exporter_job)}) == 1"),
              t.hold(300), "warning", "sre", "GPU telemetry stale on {{ $labels.hostname }}",
              f"The {where} overruns its deadline and serves its last good values for {t.hold(300)}: "
              "the data is old (a hung NVML call or a slow dcgm-exporter)."),
        Alert(COLLECTION_SLOW,
              on_node(f"max by ({by_source}) ({sel(S.COLLECT_DURATION.name, job=exporter_job)}) > {slow:g}"),
              t.hold(900), "info", "sre", "GPU telemetry collection slow on {{ $labels.hostname }}",
              f"The {where} takes {{{{ $value | humanizeDuration }}}} per collection for {t.hold(900)}, more "
              f"than half of its {DEFAULT_DEADLINE:g} s deadline."),
    )


def truegpu_file(t: Timing, exporter_job: str = EXPORTER_JOB, th: Thresholds = THRESHOLDS) -> RuleFile:
    health = Group("truegpu-exporter", (
        exporter_down(t, exporter_job, sel(S.NODE_INFO.name, job=exporter_job), EXPORTER_DOWN),
        *collection_health(t, exporter_job)))
    return RuleFile("truegpu.yaml", "truegpu exporter metrics (truegpu_*)",
                    (truegpu_recording(), truegpu_hardware(t, th), health))


# dcgm-exporter dialect ---------------------------------------------------------------------
def _field(metric: S.Metric, **labels: str) -> S.DcgmField:
    for f in metric.dcgm:
        if all(dict(f.labels).get(k) == v for k, v in labels.items()):
            return f
    raise LookupError(f"{metric.name} has no dcgm field with {labels}")


def dcgm_sel(*field_names: str, **matchers: str) -> str:
    """dcgm-exporter fields under every name a release gave them (exporter.schema.dcgm_spellings)."""
    names = alternatives(dict.fromkeys(n for f in field_names for n in S.dcgm_spellings(f)))
    return sel("", __name__="=~" + names, **matchers)


def dcgm_norm(expr: str) -> str:
    """Every dcgm-exporter spelling to one: the host label (``Hostname`` in older releases,
    ``hostname`` in newer ones) into ``hostname`` and the 1.x ``uuid`` into ``UUID``. Applied to
    every leaf, so rules group, match and page on the same labels whichever exporter wrote them."""
    host = f'label_replace({expr}, "{S.HOSTNAME}", "$1", "{DCGM_OLD_HOST_LABEL}", "(.+)")'
    return f'label_replace({host}, "{DCGM_UUID_LABEL}", "$1", "{DCGM_OLD_UUID_LABEL}", "(.+)")'


def dcgm_file(t: Timing, dcgm_job: str = DCGM_JOB, th: Thresholds = THRESHOLDS) -> RuleFile:
    host = S.HOSTNAME
    g = by((host, S.GPU, DCGM_UUID_LABEL))
    sm_active = _field(S.SM_ACTIVE).field
    clock, clock_max = _field(S.SM_CLOCK), _field(S.SM_CLOCK_MAX)
    util = _field(S.GPU_UTILIZATION)
    whole = {"GPU_I_ID": ""}

    def d(field_name: str, **matchers: str) -> str:
        """A normalized dcgm series."""
        return dcgm_norm(dcgm_sel(field_name, **matchers))

    def d_range(fn: str, field_name: str, window: str) -> str:
        """``fn(field[window])``, normalized (label_replace cannot take a range vector)."""
        return dcgm_norm(f"{fn}({dcgm_sel(field_name)}[{window}])")

    recording = Group("dcgm-recording", (
        Record(DCGM_GPU_SM_CLOCK_RATIO,
               f"clamp_max({scaled(f'max by ({g}) ({d(clock.field)})', clock.scale / clock_max.scale)}"
               f" / max by ({g}) ({d(clock_max.field)}), 1)"),
        Record(DCGM_GPU_EFFECTIVE_UTILIZATION, f"{d(sm_active)} * on ({g}) group_left () {DCGM_GPU_SM_CLOCK_RATIO}"),
        Record(DCGM_GPU_MASKING_GAP,
               f"{scaled(d(util.field, **whole), util.scale)} - on ({g}) {d(sm_active, **whole)}"),
        Record(DCGM_NODE_EFFECTIVE_UTILIZATION, f"avg by ({host}) ({DCGM_GPU_EFFECTIVE_UTILIZATION})"),
        Record(DCGM_NODE_MASKING_GAP, f"avg by ({host}) ({DCGM_GPU_MASKING_GAP})"),
        Record(DCGM_FLEET_EFFECTIVE_UTILIZATION, f"avg ({DCGM_GPU_EFFECTIVE_UTILIZATION})"),
        Record(DCGM_FLEET_MASKING_GAP, f"avg ({DCGM_GPU_MASKING_GAP})"),
    ))

    w10 = t.window(600)
    dialect = {"dialect": "dcgm"}
    xid_field = _field(S.XID_ERRORS).field
    xid = dcgm_sel(xid_field)
    ok = f"< {DCGM_SENTINEL_MIN}"  # DCGM blank markers are "unknown", never a value

    def xid_class(codes: Sequence[int]) -> str:
        return " or ".join(f"{xid} == {c}" for c in codes)

    # GPUs whose dcgm-exporter runs the XID count collector are paged from it (it sees a repeated XID);
    # the last-XID gauge pages the others.
    counted = f"max by ({g}) ({dcgm_norm(dcgm_sel(S.DCGM_XID_COUNT))})"

    def new_xid(expr: str) -> str:
        """Matches on whole label sets of one series only, so it is normalized once, outside."""
        return dcgm_norm(f"({expr}) unless ({xid} offset {w10} == {xid})") + f" unless on ({g}) {counted}"

    def counted_xid(codes: str) -> str:
        window = dcgm_norm(f"max_over_time({dcgm_sel(S.DCGM_XID_COUNT, xid=codes)}[{w10}])")
        return f"max by ({g}, xid) ({window}) > 0"

    xid_text = "XID {{ $value }} (the last XID the GPU reported changed within the last " + w10 + ")"
    count_text = ("{{ $value }} XID {{ $labels.xid }} event(s) within dcgm-exporter's XID count window in the last "
                  + w10)
    crit_codes, info_codes = alternatives(CRITICAL_XIDS), alternatives(INFO_XIDS)
    counted_by = {**dialect, "xid_source": "count_collector"}  # apart from the last-XID rules of the same class
    dbe = _field(S.ECC_ERRORS, type="uncorrectable", scope="volatile").field
    rows = _field(S.REMAPPED_ROWS, type="uncorrectable").field
    remap_failure = _field(S.ROW_REMAP_FAILURE).field
    recovery = _field(S.GPU_RECOVERY_ACTION).field
    reasons = [f.field for f in S.CLOCK_EVENT_ACTIVE.dcgm]
    bits = [bit for bit, name in S.CLOCK_EVENT_REASONS.items() if name in S.THERMAL_REASONS]
    mask = dcgm_norm(dcgm_sel(*reasons))
    thermal_bits = " + ".join(f"floor({mask} / {bit}) % 2" for bit in bits)
    throttled = f"max by ({g}) ({thermal_bits} and {mask} {ok}) > 0"
    temps = [f"max by ({g}) ({d(_field(S.TEMPERATURE, sensor=sensor).field)}) {ok}" for sensor in ("gpu", "memory")]
    nvlink = [f.field for f in S.NVLINK_ERRORS.dcgm]
    nvlink_sel = dcgm_sel(*nvlink)
    pcie, pcie_fields = [], []
    for metric, what in ((S.PCIE_LINK_GENERATION, "generation"), (S.PCIE_LINK_WIDTH, "width")):
        cur, mx = _field(metric, state="current").field, _field(metric, state="max").field
        pcie_fields += [cur, mx]
        pcie.append(f'label_replace(max by ({g}) ({d(cur)}) < max by ({g}) ({d(mx)} {ok}), "link", "{what}", "", "")')
    busy = f"max by ({g}) ({scaled(d(util.field), util.scale)}) > {number(th.busy_utilization)}"
    gpu_temp = _field(S.TEMPERATURE, sensor="gpu").field
    fb_used = _field(S.MEMORY_USED).field
    # A GPU seen within the lookback that no longer reports, on a node (a known, non-empty host) whose
    # other GPUs still report now: a whole node or exporter gone is DcgmExporterDown, never this.
    seen = f"max by ({g}) ({d_range('max_over_time', gpu_temp, t.window(FELL_OFF_BUS_LOOKBACK))})"
    named = " or ".join(dcgm_sel(gpu_temp, **{label: "!="}) for label in (host, DCGM_OLD_HOST_LABEL))
    node_up = f"count by ({host}) ({dcgm_norm(named)})"
    hardware = Group("dcgm-hardware", (
        Alert("GpuXidError", new_xid(xid_class(CRITICAL_XIDS)), "0s", "critical", "training",
              "Critical XID {{ $value }} on " + SHORT_REF,
              f"{DCGM_GPU_REF} reported {xid_text}: the GPU cannot be trusted until it is drained and reset.",
              dialect, (xid_field,)),
        Alert("GpuXidError",
              new_xid(f"{xid} > 0 {ok} unless ({xid_class(CRITICAL_XIDS)} or {xid_class(INFO_XIDS)})"),
              "0s", "warning", "training", "XID {{ $value }} on " + SHORT_REF,
              f"{DCGM_GPU_REF} reported {xid_text}: a driver or hardware error, see the runbook's XID table.",
              dialect, (xid_field,)),
        Alert("GpuXidError", new_xid(xid_class(INFO_XIDS)), "0s", "info", "training",
              "Application XID {{ $value }} on " + SHORT_REF,
              f"{DCGM_GPU_REF} reported {xid_text}: usually the job's own bug (illegal memory access, "
              "kernel exception); the GPU itself is fine.", dialect, (xid_field,)),
        Alert("GpuXidError", counted_xid("=~" + crit_codes), "0s", "critical", "training",
              "Critical XID {{ $labels.xid }} on " + SHORT_REF,
              f"{DCGM_GPU_REF} reported {count_text}: the GPU cannot be trusted until it is drained and reset.",
              counted_by, (S.DCGM_XID_COUNT,)),
        Alert("GpuXidError", counted_xid(f"!~{crit_codes}|{info_codes}"), "0s", "warning", "training",
              "XID {{ $labels.xid }} on " + SHORT_REF,
              f"{DCGM_GPU_REF} reported {count_text}: a driver or hardware error, see the runbook's XID table.",
              counted_by, (S.DCGM_XID_COUNT,)),
        Alert("GpuXidError", counted_xid("=~" + info_codes), "0s", "info", "training",
              "Application XID {{ $labels.xid }} on " + SHORT_REF,
              f"{DCGM_GPU_REF} reported {count_text}: usually the job's own bug (illegal memory access, "
              "kernel exception); the GPU itself is fine.", counted_by, (S.DCGM_XID_COUNT,)),
        Alert("GpuUncorrectableEcc",
              f"max by ({g}) ({d_range('increase', dbe, w10)}) > 0 or max by ({g}) ({d_range('increase', rows, w10)}) "
              "> 0",
              "0s", "critical", "training", "Uncorrectable ECC error on " + SHORT_REF,
              f"{DCGM_GPU_REF} had {{{{ printf \"%.0f\" $value }}}} uncorrectable memory error(s) in the last {w10}: "
              "drain the GPU and reset it to apply the row remap.", dialect, (dbe, rows)),
        Alert("GpuRowRemapFailure", f"{d(remap_failure)} == 1", "0s", "critical", "training",
              "Row remapping failed on " + SHORT_REF,
              f"{DCGM_GPU_REF} has no spare HBM rows left to remap memory errors: drain it and RMA it.",
              dialect, (remap_failure,)),
        recovery_action(f"{d(recovery)} {ok}", DCGM_GPU_REF, dialect, (recovery,)),
        *thermal_alerts(t, th, g, scaled(f"max by ({g}) ({d(clock.field)})", clock.scale), throttled,
                        f"{mask} {ok}", *temps, DCGM_GPU_REF, "{{ $value | humanize }}Hz", dialect,
                        (clock.field, *(f.field for f in S.TEMPERATURE.dcgm))),
        Alert("GpuNvlinkErrors", f"sum by ({g}) ({dcgm_norm(f'increase({nvlink_sel}[{w10}])')}) > 0", t.hold(600),
              "warning", "training", "NVLink errors on " + SHORT_REF,
              f"{DCGM_GPU_REF} keeps logging NVLink errors ({{{{ $value | humanize }}}} in the last {w10}): "
              "collectives over this GPU slow down or fail.", dialect, tuple(nvlink)),
        Alert("GpuPcieLinkDowngraded", f"({pcie[0]} or {pcie[1]}) and on ({g}) ({busy})", t.hold(600),
              "warning", "training", "PCIe link downgraded on busy " + SHORT_REF,
              f"{DCGM_GPU_REF} runs its PCIe link at {{{{ $labels.link }}}} {{{{ $value }}}}, below its maximum, "
              "while busy: host-device transfers are slower.", dialect, (*pcie_fields, util.field)),
        Alert(FELL_OFF_BUS,
              f"{seen} unless on ({g}) {d(gpu_temp)} and on ({host}) ({node_up})",
              t.hold(60), "critical", "training", SHORT_REF + " fell off the bus",
              f"{DCGM_GPU_REF} stopped reporting while its node's exporter is up: the GPU is lost (XID 79 or "
              "similar); drain the node and reset or reseat the GPU.", dialect, (gpu_temp,)),
    ))
    # Aggregated per-GPU alerts lose dcgm-exporter's pod labels: join the pod holding the GPU back
    # (from the memory series it attributes); the per-series XID/row-remap alerts keep their own.
    holders = d(fb_used, namespace="!=")
    owned = ("GpuUncorrectableEcc", "GpuThermalThrottling", "GpuNearThermalLimit", "GpuNvlinkErrors",
             "GpuPcieLinkDowngraded", "GpuFellOffBus")
    hardware = Group(hardware.name, (
        *(replace(a, expr=with_owner(a.expr, g, holders, "namespace, pod"))
          if a.alert in owned or "xid_source" in a.labels else a for a in hardware.rules),
        gpu_missing(t, d(fb_used), "GPU_I_ID", dialect, (fb_used,)),
    ))
    health = Group("dcgm-exporter", (
        exporter_down(t, dcgm_job, dcgm_sel(gpu_temp, job=dcgm_job), DCGM_EXPORTER_DOWN, dcgm_norm, dialect),))
    file = RuleFile("dcgm.yaml", "NVIDIA dcgm-exporter metrics (DCGM_FI_*)", (recording, hardware, health))
    needs = [f"{a.alert} ({a.labels.get('severity', a.severity)}): {', '.join(a.non_default_fields)}"
             for a in file.alerts() if a.non_default_fields]
    header = (
        "NVIDIA dcgm-exporter metrics (DCGM_FI_* or the 1.x dcgm_fi_* names; host label Hostname or hostname,\n"
        "both read as hostname).\n"
        f"Effective utilization needs {sm_active} and {clock_max.field}, not in dcgm-exporter's default counters.\n"
        "Alerts needing counters beyond dcgm-exporter's default list (add them to its counters CSV):\n"
        + "\n".join(f"  {n}" for n in dict.fromkeys(needs))
    )
    return RuleFile(file.name, header, file.groups, dialect="dcgm")


# Analyzer findings and health -----------------------------------------------------------------
def analyzer_file(t: Timing, analyzer_job: str = ANALYZER_JOB) -> RuleFile:
    def finding(kind: str, **extra: str) -> str:
        m = {"kind": kind, **extra}
        return f"{sel(O.FINDING_SCORE.name, **m)} and {sel(O.FINDING_ACTIVE.name, **m)} == 1"

    where = ("GPU {{ $labels.gpu }} on {{ $labels.hostname }} (workload {{ $labels.namespace }}/"
             "{{ $labels.workload }})")
    score = "score {{ $value | humanizePercentage }}"
    rules: list[Alert] = [
        Alert("GpuIdleMasking", finding(F.IDLE_MASKING), t.hold(1800), "warning", "finops",
              "GPU busy in nvidia-smi but its SMs mostly idle: " + SHORT_REF,
              f"{where} reports high GPU utilization while its SMs are mostly idle ({score}): the job pays "
              "for a whole GPU and uses a fraction of it."),
        Alert("GpuIdleAllocated", finding(F.IDLE_ALLOCATED), t.hold(1800), "warning", "finops",
              "Allocated GPU idle: " + SHORT_REF,
              f"{where} is allocated but idle ({score}): release it or fix the job's input pipeline."),
    ]
    # The alert's severity is the finding's: what the analyzer calls critical pages, never a ticket.
    for alert, kind, team, what in (
        ("GpuStraggler", F.STRAGGLER, "training", "is the straggler slowing its training gang"),
        ("GpuDegraded", F.DEGRADED_GPU, "training", "runs degraded (power cap, PCIe or NVLink)"),
        ("GpuFault", F.GPU_FAULT, "training", "has a hardware fault (XID, ECC, NVLink, PCIe, lost GPU)"),
        ("GpuThermal", F.THERMAL, "sre", "runs hot or throttles for heat (GPU, node or rack)"),
    ):
        for sev, match in (("critical", "critical"), ("warning", "!=critical")):
            rules.append(Alert(alert, finding(kind, severity=match), t.hold(300), sev, team,
                               f"{alert.removeprefix('Gpu')}: " + SHORT_REF,
                               f"{where} {what} ({score}); see the analyzer's finding for the evidence."))
    stale = t.seconds(ANALYZER_STALE_SECONDS)
    rules += [
        Alert(ANALYZER_DOWN, f"{sel(UP, job=analyzer_job)} == 0", t.hold(300), "warning", "sre",
              "truegpu analyzer {{ $labels.instance }} is down",
              f"Prometheus cannot scrape the analyzer {{{{ $labels.instance }}}} for {t.hold(300)}: findings "
              "(stragglers, idle GPUs) are not being raised.", {"reason": "down"}),
        Alert(ANALYZER_DOWN, f"time() - {sel(O.ANALYZER_LAST_SUCCESS.name, job=analyzer_job)} > {stale:g}",
              t.hold(300), "warning", "sre", "truegpu analyzer {{ $labels.instance }} is stuck",
              "The analyzer {{ $labels.instance }} last finished an analysis {{ $value | humanizeDuration }} "
              "ago: findings are stale.", {"reason": "stale"}),
    ]
    groups = (Group("truegpu-findings", tuple(rules[:-2])), Group("truegpu-analyzer", tuple(rules[-2:])))
    return RuleFile("analyzer.yaml", "truegpu analyzer findings (truegpu_finding_active) and analyzer health", groups)


def rule_files(timing: Timing | None = None, selectors: Selectors = SELECTORS,
               thresholds: Thresholds = THRESHOLDS) -> list[RuleFile]:
    """The three rule files for a site's selectors (job names, cluster label) and thresholds."""
    t = timing or Timing()
    files = [truegpu_file(t, selectors.exporter_job, thresholds), dcgm_file(t, selectors.dcgm_job, thresholds),
             analyzer_file(t, selectors.analyzer_job)]
    return [f.keeping(selectors.cluster_label) for f in files]


def alert_names() -> list[str]:
    return list(dict.fromkeys(a.alert for f in rule_files() for a in f.alerts()))


def record_names() -> list[str]:
    return list(dict.fromkeys(r.record for f in rule_files() for r in f.records()))
