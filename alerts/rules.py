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

Each group is built by one function named after it, from keyword-only :class:`Record`/:class:`Alert`
definitions: ``truegpu_recording``, ``truegpu_hardware``, ``truegpu_exporter``; ``dcgm_recording``,
``dcgm_hardware``, ``dcgm_exporter``; ``analyzer_findings``, ``analyzer_health``. A hardware group is
its areas in order -- ``<dialect>_xid``, ``_memory``, ``_thermal``, ``_links``, ``_presence`` -- and both
dialects build each alert with one shared builder (:func:`xid_alerts`, :func:`uncorrectable_ecc`, ...)
from a :class:`PerGpu` (how that dialect's series name a GPU), so the two say the same thing.

Every metric name comes from :mod:`exporter.schema` or :mod:`analyzer.output_schema`; the
recording-rule names below are the public constants dashboards import. Durations (``for:``,
rate windows, staleness thresholds) pass through :class:`Timing` so that the end-to-end test
runs these very rules with ``scale=0.01``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from analyzer import output_schema as O
from analyzer.analysis.xid import CATALOGUE
from analyzer.detectors import Paging, kinds, load_detectors
from analyzer.site import THRESHOLDS, Selectors, Thresholds
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

# XID classes (analyzer.analysis.xid is the catalogue: severity per code) -------------------------------
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
#: kube-state-metrics names (exporter.schema): the node GPU capacity series, its resource and node label.
KUBE_NODE_CAPACITY, KUBE_GPU_RESOURCE, KUBE_NODE_LABEL = S.KUBE_NODE_CAPACITY, S.KUBE_GPU_RESOURCE, S.KUBE_POD_INFO_NODE
EXPORTER_DOWN = "TruegpuExporterDown"
DCGM_EXPORTER_DOWN = "DcgmExporterDown"
ANALYZER_DOWN = "TruegpuAnalyzerDown"
ANALYZER_STATE = "TruegpuAnalyzerStateNotSaved"
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
                     "TruegpuCollectionStale", "TruegpuCollectionSlow", "TruegpuAnalyzerDown", ANALYZER_STATE),
                    "fleet"),
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


@dataclass(frozen=True, kw_only=True)
class Record:
    """A recording rule; ``record`` is one of the public names above (dashboards read them)."""

    record: str
    expr: str
    labels: dict[str, str] = field(default_factory=dict)

    def to_dict(self, links: Links) -> dict[str, Any]:
        out: dict[str, Any] = {"record": self.record, "expr": self.expr}
        if self.labels:
            out["labels"] = dict(self.labels)
        return out


@dataclass(frozen=True, kw_only=True)
class Alert:
    """An alerting rule. Keyword-only: its texts, severity and team are all strings, and a swap of two
    of them would still build."""

    alert: str
    expr: str
    for_: str
    severity: str
    team: str
    summary: str
    description: str
    labels: dict[str, str] = field(default_factory=dict)
    #: ``keep_firing_for`` ("": none): how long it fires on after its condition stops holding.
    keep_firing_for: str = ""
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
        keep = {"keep_firing_for": self.keep_firing_for} if self.keep_firing_for else {}
        return {
            "alert": self.alert,
            "expr": self.expr,
            "for": self.for_,
            **keep,
            "labels": {"severity": self.severity, "team": self.team, **self.labels},
            "annotations": annotations,
        }


@dataclass(frozen=True, kw_only=True)
class Group:
    """One named rule group (Prometheus evaluates a group's rules in order)."""

    name: str
    rules: tuple[Record | Alert, ...]

    def to_dict(self, links: Links) -> dict[str, Any]:
        return {"name": self.name, "rules": [r.to_dict(links) for r in self.rules]}


@dataclass(frozen=True, kw_only=True)
class RuleFile:
    """One generated rule file: its groups, and the header comment written above them."""

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
        groups = tuple(replace(g, rules=tuple(replace(r, expr=keep_cluster(r.expr, cluster_label)) for r in g.rules))
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
    """A grouping's label list (``a, b``), in the one style :func:`keep_cluster` reads."""
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
    """A regex alternation (``a|b``) for a ``=~`` matcher."""
    return "|".join(str(v) for v in values)


def any_of(names: Sequence[str]) -> str:
    """One selector over several metric names (dcgm-exporter's current and deprecated field)."""
    return names[0] if len(names) == 1 else "{" + f'__name__=~"{alternatives(names)}"' + "}"


def number(x: float) -> str:
    """A PromQL number literal: ``1000000`` rather than ``1e+06``."""
    return str(int(x)) if float(x).is_integer() else repr(float(x))


def scaled(expr: str, factor: float) -> str:
    """``expr`` in base units (dcgm-exporter's percent and MHz carry a scale in the contract)."""
    return expr if factor == 1 else f"({expr} * {number(factor)})"


GPU_BY = by(S.GPU_LABELS)
GPU_INSTANCE_BY = by((*S.GPU_LABELS, S.GPU_INSTANCE))
NAMESPACE, WORKLOAD = "namespace", S.WORKLOAD
assert NAMESPACE in S.GPU_ALLOCATION_INFO.labels and WORKLOAD in S.GPU_ALLOCATION_INFO.labels
assert NAMESPACE in O.FINDING_LABELS and WORKLOAD in O.FINDING_LABELS
SCRAPE_JOB, INSTANCE = S.SCRAPE_JOB, S.INSTANCE
THERMAL = alternatives(S.THERMAL_REASONS)

GPU_REF = "GPU {{ $labels.gpu }} ({{ $labels.uuid }}) on {{ $labels.hostname }}"
DCGM_GPU_REF = "GPU {{ $labels.gpu }} ({{ $labels.UUID }}) on {{ $labels.hostname }}"
SHORT_REF = "GPU {{ $labels.gpu }} of {{ $labels.hostname }}"
#: PCIe link properties GpuPcieLinkDowngraded compares with their maximum, and its ``link`` label for each.
PCIE_LINKS: tuple[tuple[S.Metric, str], ...] = ((S.PCIE_LINK_GENERATION, "generation"), (S.PCIE_LINK_WIDTH, "width"))


def with_owner(expr: str, key: str = GPU_BY, holders: str = S.GPU_ALLOCATION_INFO.name,
               owner: str = f"{NAMESPACE}, {WORKLOAD}") -> str:
    """A per-GPU alert with who holds the GPU (``owner`` labels of the ``holders`` series, e.g. the
    ``namespace``/``workload`` of truegpu_gpu_allocation_info), so routing can send it to the
    workload's owners; GPUs nobody holds keep their labels as they are. One holder per GPU (a
    shared or MIG-split GPU: any one of them)."""
    holder = f"topk by ({key}) (1, group by ({key}, {owner}) ({holders}))"  # value 1: $value stays the alert's
    return (f"({expr}) * on ({key}) group_left ({owner}) {holder} "
            f"or (({expr}) unless on ({key}) {holder})")


# Per-GPU hardware alerts, both dialects -------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class PerGpu:
    """How one dialect's per-GPU alerts group, name and label a GPU, and who holds it: the alert
    builders below take one, so both dialects' alerts say the same thing from different series."""

    #: The labels of one GPU (every per-GPU aggregation groups and joins on them).
    key: str
    #: The GPU as a description names it.
    ref: str
    #: A series naming who holds each GPU, and the labels that say who (:func:`with_owner`).
    holders: str
    owner: str
    #: Labels every alert of the dialect carries.
    labels: dict[str, str] = field(default_factory=dict)

    def owned(self, *alerts: Alert) -> tuple[Alert, ...]:
        """``alerts`` carrying who holds the GPU, so routing can send them to its owners."""
        return tuple(replace(a, expr=with_owner(a.expr, self.key, self.holders, self.owner)) for a in alerts)


#: truegpu's own series: the allocation info names each GPU's workload.
TRUEGPU_GPUS = PerGpu(key=GPU_BY, ref=GPU_REF, holders=S.GPU_ALLOCATION_INFO.name, owner=f"{NAMESPACE}, {WORKLOAD}")

#: GpuXidError per XID class (analyzer.analysis.xid's severities): the summary's name for it and what it means.
_XID_CLASSES = (
    ("critical", "Critical XID", "the GPU cannot be trusted until it is drained and reset."),
    ("warning", "XID", "a driver or hardware error, see the runbook's XID table."),
    ("info", "Application XID",
     "usually the job's own bug (illegal memory access, kernel exception); the GPU itself is fine."),
)


def xid_alerts(on: PerGpu, *, critical: str, warning: str, info: str, code: str, events: str,
               labels: dict[str, str] | None = None, fields: tuple[str, ...] = ()) -> tuple[Alert, ...]:
    """GpuXidError once per XID class (``critical``/``warning``/``info``: each class's expression), at
    once (``for: 0s``): an XID is an event. ``code`` names the XID, ``events`` says what was seen."""
    exprs = {"critical": critical, "warning": warning, "info": info}
    return tuple(
        Alert(alert="GpuXidError", expr=exprs[severity], for_="0s", severity=severity, team="training",
              summary=f"{name} {code} on {SHORT_REF}", description=f"{on.ref} reported {events}: {meaning}",
              labels=dict(on.labels if labels is None else labels), dcgm_fields=fields)
        for severity, name, meaning in _XID_CLASSES
    )


def uncorrectable_ecc(on: PerGpu, expr: str, window: str, fields: tuple[str, ...] = ()) -> Alert:
    """GpuUncorrectableEcc: ``expr`` counts the GPU's uncorrectable errors (or remapped rows) in ``window``."""
    return Alert(alert="GpuUncorrectableEcc", expr=expr, for_="0s", severity="critical", team="training",
                 summary="Uncorrectable ECC error on " + SHORT_REF,
                 description=f"{on.ref} had {{{{ printf \"%.0f\" $value }}}} uncorrectable memory error(s) in the "
                             f"last {window}: drain the GPU and reset it to apply the row remap.",
                 labels=dict(on.labels), dcgm_fields=fields)


def row_remap_failure(on: PerGpu, failed: str, fields: tuple[str, ...] = ()) -> Alert:
    """GpuRowRemapFailure: ``failed`` is 1 once the GPU has no spare rows left."""
    return Alert(alert="GpuRowRemapFailure", expr=f"{failed} == 1", for_="0s", severity="critical", team="training",
                 summary="Row remapping failed on " + SHORT_REF,
                 description=f"{on.ref} has no spare HBM rows left to remap memory errors: drain it and RMA it.",
                 labels=dict(on.labels), dcgm_fields=fields)


def recovery_action(on: PerGpu, code: str, fields: tuple[str, ...] = ()) -> Alert:
    """GpuRecoveryActionRequired: the driver says the GPU needs a reset, reboot or drain (``code``: the
    recovery-action code, non-zero)."""
    codes = ", ".join(f"{c} {a.replace('_', ' ')}" for c, a in S.GPU_RECOVERY_ACTIONS.items() if c)
    return Alert(alert=RECOVERY_ACTION, expr=f"{code} > 0", for_="0s", severity="critical", team="training",
                 summary="GPU recovery action {{ $value }} required on " + SHORT_REF,
                 description=f"{on.ref} needs recovery action {{{{ $value }}}} ({codes}): drain its work and do "
                             "what the code says; the GPU cannot be trusted until then.",
                 labels=dict(on.labels), dcgm_fields=fields)


def thermal_alerts(t: Timing, th: Thresholds, on: PerGpu, *, clock: str, clock_text: str, thermal_reason: str,
                   reasons: str, gpu_temp: str, memory_temp: str, fields: tuple[str, ...] = ()) -> tuple[Alert, Alert]:
    """GpuThermalThrottling (critical: what the thermal detector calls "at the limit") and
    GpuNearThermalLimit (warning), on the site's shared thresholds and hold times.

    At the limit: a thermal clock-event reason, or -- where throttle reasons are not collected
    (``reasons`` absent; dcgm-exporter's default counters omit them) -- the die or HBM at its
    slowdown point, as the detector reads it. ``gpu_temp``/``memory_temp`` are per-GPU (``on.key``).
    A GPU is near the limit whenever it is hot and not throttling (one alert or the other)."""
    key = on.key
    gpu_limit, memory_limit = number(th.gpu_temp_limit_celsius), number(th.memory_temp_limit_celsius)
    hot = f"{gpu_temp} >= {gpu_limit} or {memory_temp} >= {memory_limit}"
    at_limit = f"{thermal_reason} or (({hot}) unless on ({key}) {reasons})"
    throttling = f"{clock} and on ({key}) ({at_limit})"
    near = " or ".join(f'label_replace({expr} > {number(limit)}, "sensor", "{sensor}", "", "")'
                       for sensor, expr, limit in (("gpu", gpu_temp, th.gpu_temp_near_celsius),
                                                   ("memory", memory_temp, th.memory_temp_near_celsius)))
    limit_for, warn_for = t.hold(th.thermal_limit_for_seconds), t.hold(th.thermal_warn_for_seconds)
    return (
        Alert(alert="GpuThermalThrottling", expr=throttling, for_=limit_for, severity="critical", team="sre",
              summary="Thermal throttling on " + SHORT_REF,
              description=f"{on.ref} has been slowed down for heat for {limit_for} (a thermal clock-event reason, or "
                          f"where those are not collected the die at {gpu_limit} C or HBM at {memory_limit} C or "
                          f"more); its SM clock is at {clock_text}.",
              labels=dict(on.labels), dcgm_fields=fields),
        Alert(alert="GpuNearThermalLimit", expr=f"({near}) unless on ({key}) ({throttling})", for_=warn_for,
              severity="warning", team="facilities",
              summary="GPU {{ $labels.sensor }} temperature near its limit on " + SHORT_REF,
              description=f"{on.ref}: {{{{ $labels.sensor }}}} temperature {{{{ $value }}}} C for {warn_for}, close "
                          "to thermal slowdown; check airflow and inlet temperature of the rack.",
              labels=dict(on.labels), dcgm_fields=fields),
    )


def nvlink_errors(t: Timing, on: PerGpu, increase: str, window: str, fields: tuple[str, ...] = ()) -> Alert:
    """GpuNvlinkErrors: ``increase`` (per link and error type, within ``window``) keeps growing."""
    return Alert(alert="GpuNvlinkErrors", expr=f"sum by ({on.key}) ({increase}) > 0", for_=t.hold(600),
                 severity="warning", team="training", summary="NVLink errors on " + SHORT_REF,
                 description=f"{on.ref} keeps logging NVLink errors ({{{{ $value | humanize }}}} in the last "
                             f"{window}): collectives over this GPU slow down or fail.",
                 labels=dict(on.labels), dcgm_fields=fields)


def pcie_link_downgraded(t: Timing, th: Thresholds, on: PerGpu, *, current: Callable[[S.Metric], str],
                         maximum: Callable[[S.Metric], str], utilization: str,
                         fields: tuple[str, ...] = ()) -> Alert:
    """GpuPcieLinkDowngraded: a link property (``current``/``maximum`` series of each of
    :data:`PCIE_LINKS`) below its maximum while the GPU is busy (``utilization``, a ratio): an idle
    GPU lowers its link to save power."""
    key = on.key
    below = " or ".join(f'label_replace(max by ({key}) ({current(m)}) < max by ({key}) ({maximum(m)}), '
                        f'"link", "{what}", "", "")' for m, what in PCIE_LINKS)
    busy = f"max by ({key}) ({utilization}) > {number(th.busy_utilization)}"
    return Alert(alert="GpuPcieLinkDowngraded", expr=f"({below}) and on ({key}) ({busy})", for_=t.hold(600),
                 severity="warning", team="training", summary="PCIe link downgraded on busy " + SHORT_REF,
                 description=f"{on.ref} runs its PCIe link at {{{{ $labels.link }}}} {{{{ $value }}}}, below its "
                             "maximum, while busy: host-device transfers are slower.",
                 labels=dict(on.labels), dcgm_fields=fields)


def fell_off_bus(t: Timing, on: PerGpu, *, seen: str, now: str, node_up: str,
                 fields: tuple[str, ...] = ()) -> Alert:
    """GpuFellOffBus: a GPU ``seen`` (a range function over the lookback) that is not reporting ``now``,
    on a node still up (``node_up``, by ``hostname``): a whole node or exporter gone is not this."""
    return Alert(alert=FELL_OFF_BUS,
                 expr=f"max by ({on.key}) ({seen}) unless on ({on.key}) {now} and on ({S.HOSTNAME}) {node_up}",
                 for_=t.hold(60), severity="critical", team="training", summary=SHORT_REF + " fell off the bus",
                 description=f"{on.ref} stopped reporting while its node's exporter is up: the GPU is lost (XID 79 "
                             "or similar); drain the node and reset or reseat the GPU.",
                 labels=dict(on.labels), dcgm_fields=fields)


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
    return Alert(alert=GPU_MISSING, expr=expr, for_=t.hold(900), severity="critical", team="training",
                 summary="{{ $value }} GPU(s) missing on {{ $labels.hostname }}",
                 description="Kubernetes counts more GPUs on {{ $labels.hostname }} than report from it for "
                             f"{t.hold(900)} ({{{{ $value }}}} missing): a GPU lost before Prometheus saw it, or long "
                             "ago (nvidia-smi on the node lists what the driver sees); drain the node and reset or "
                             "reseat it.",
                 labels=dialect or {}, dcgm_fields=fields)


def exporter_down(t: Timing, job: str, presence: str, alert: str, norm: Callable[[str], str] = lambda e: e,
                  labels: dict[str, str] | None = None) -> Alert:
    """``up == 0`` for the job, carrying ``hostname`` remembered from the target's last hour of data.

    ``presence`` is a selector (already matching ``job``) of a series every target sends; ``norm``
    brings its labels to ``hostname`` (dcgm-exporter's spellings)."""
    up = f"{sel(UP, job=job)} == 0"
    hosts = f"max by ({SCRAPE_JOB}, {INSTANCE}, {S.HOSTNAME}) ({norm(f'last_over_time({presence}[{t.window(3600)}])')})"
    expr = f"{hosts} * on ({SCRAPE_JOB}, {INSTANCE}) group_left () ({up}) or on ({SCRAPE_JOB}, {INSTANCE}) {up}"
    return Alert(alert=alert, expr=expr, for_=t.hold(300), severity="warning", team="sre",
                 summary="Exporter {{ $labels.instance }} is down",
                 description=f"Prometheus cannot scrape {{{{ $labels.instance }}}} (job {{{{ $labels.job }}}}"
                             f"{{{{ with $labels.hostname }}}}, host {{{{ . }}}}{{{{ end }}}}) for {t.hold(300)}: "
                             "the GPUs there are unobserved.",
                 labels=labels or {})


# truegpu dialect ------------------------------------------------------------------------------
def truegpu_recording() -> Group:
    """Effective utilization and masking gap per GPU (MIG instance), node, workload and fleet."""
    sm_active = S.SM_ACTIVE.name
    alloc = S.GPU_ALLOCATION_INFO.name
    whole = {S.GPU_INSTANCE: ""}  # whole GPUs only: MIG instances publish no GPU utilization
    alloc_by = by((*S.GPU_LABELS, S.GPU_INSTANCE, NAMESPACE, WORKLOAD))
    all_, allocated = {ALLOCATION_LABEL: ALLOCATION_ALL}, {ALLOCATION_LABEL: ALLOCATION_ALLOCATED}

    # A shared GPU's holders (time-slicing, MPS) are its sharer series: allocation info names one of them. The
    # holder with empty labels (processes of no known pod) is nobody's workload.
    holders = f'{alloc} or ({S.SHARER_UTILIZATION.name}{{{WORKLOAD}!=""}} >= bool 0)'

    def per_workload(per_gpu: str) -> str:
        return (f"avg by ({NAMESPACE}, {WORKLOAD}) (max by ({alloc_by}) ({holders}) "
                f"* on ({GPU_INSTANCE_BY}) group_left () {per_gpu})")

    return Group(name="truegpu-recording", rules=(
        Record(record=GPU_SM_CLOCK_RATIO,
               expr=f"clamp_max(max by ({GPU_BY}) ({S.SM_CLOCK.name}) / max by ({GPU_BY}) ({S.SM_CLOCK_MAX.name}), 1)"),
        Record(record=GPU_EFFECTIVE_UTILIZATION,
               expr=f"{sm_active} * on ({GPU_BY}) group_left () {GPU_SM_CLOCK_RATIO}"),
        Record(record=GPU_MASKING_GAP,
               expr=f"{sel(S.GPU_UTILIZATION.name, **whole)} - on ({GPU_BY}) {sel(sm_active, **whole)}"),
        Record(record=NODE_EFFECTIVE_UTILIZATION, expr=f"avg by ({S.HOSTNAME}) ({GPU_EFFECTIVE_UTILIZATION})"),
        Record(record=NODE_MASKING_GAP, expr=f"avg by ({S.HOSTNAME}) ({GPU_MASKING_GAP})"),
        Record(record=WORKLOAD_EFFECTIVE_UTILIZATION, expr=per_workload(GPU_EFFECTIVE_UTILIZATION)),
        Record(record=WORKLOAD_MASKING_GAP, expr=per_workload(GPU_MASKING_GAP)),
        Record(record=FLEET_EFFECTIVE_UTILIZATION, expr=f"avg ({GPU_EFFECTIVE_UTILIZATION})", labels=all_),
        Record(record=FLEET_EFFECTIVE_UTILIZATION,
               expr=f"avg ({GPU_EFFECTIVE_UTILIZATION} and on ({GPU_INSTANCE_BY}) {alloc})", labels=allocated),
        Record(record=FLEET_MASKING_GAP, expr=f"avg ({GPU_MASKING_GAP})", labels=dict(all_)),
        Record(record=FLEET_MASKING_GAP, expr=f"avg ({GPU_MASKING_GAP} and on ({GPU_BY}) {alloc})",
               labels=dict(allocated)),
    ))


def _new_counter_events(selector: str, window: str) -> str:
    """Events of a counter within ``window``, also when its series first appears with them."""
    return f"increase({selector}[{window}]) > 0 or max without () ({selector} > 0 unless {selector} offset {window})"


def truegpu_xid(t: Timing) -> tuple[Alert, ...]:
    """GpuXidError from the exporter's per-code XID counters: new events within the window, by class."""
    w10 = t.window(600)
    crit, info = alternatives(CRITICAL_XIDS), alternatives(INFO_XIDS)

    def events(codes: str) -> str:
        return _new_counter_events(sel(S.XID_ERRORS.name, xid=codes), w10)

    return TRUEGPU_GPUS.owned(*xid_alerts(
        TRUEGPU_GPUS, critical=events("=~" + crit), warning=events(f"!~{crit}|{info}"), info=events("=~" + info),
        code="{{ $labels.xid }}",
        events="{{ printf \"%.0f\" $value }} XID {{ $labels.xid }} event(s) in the last " + w10,
    ))


def truegpu_memory(t: Timing) -> tuple[Alert, ...]:
    """HBM and driver state: uncorrectable ECC errors, row-remap failure, a recovery action required."""
    w10 = t.window(600)
    ecc = sel(S.ECC_ERRORS.name, type="uncorrectable", scope="volatile")
    rows = sel(S.REMAPPED_ROWS.name, type="uncorrectable")
    errors = " or ".join(f"sum by ({GPU_BY}) (increase({s}[{w10}])) > 0" for s in (ecc, rows))
    return TRUEGPU_GPUS.owned(
        uncorrectable_ecc(TRUEGPU_GPUS, errors, w10),
        row_remap_failure(TRUEGPU_GPUS, S.ROW_REMAP_FAILURE.name),
        recovery_action(TRUEGPU_GPUS, S.GPU_RECOVERY_ACTION.name),
    )


def truegpu_thermal(t: Timing, th: Thresholds) -> tuple[Alert, ...]:
    """Thermal throttling from the clock-event reasons (temperatures where those are missing), and near the limit."""
    temp = S.TEMPERATURE.name
    clock_event = sel(S.CLOCK_EVENT_ACTIVE.name, reason="=~" + THERMAL)
    return TRUEGPU_GPUS.owned(*thermal_alerts(
        t, th, TRUEGPU_GPUS, clock=GPU_SM_CLOCK_RATIO, clock_text="{{ $value | humanizePercentage }} of maximum",
        thermal_reason=f"max by ({GPU_BY}) ({clock_event}) > 0", reasons=sel(S.CLOCK_EVENT_ACTIVE.name),
        gpu_temp=f"max by ({GPU_BY}) ({sel(temp, sensor='gpu')})",
        memory_temp=f"max by ({GPU_BY}) ({sel(temp, sensor='memory')})",
    ))


def truegpu_links(t: Timing, th: Thresholds) -> tuple[Alert, ...]:
    """Interconnect: NVLink errors that keep growing, a PCIe link below its maximum while busy."""
    w10 = t.window(600)
    return TRUEGPU_GPUS.owned(
        nvlink_errors(t, TRUEGPU_GPUS, f"increase({S.NVLINK_ERRORS.name}[{w10}])", w10),
        pcie_link_downgraded(t, th, TRUEGPU_GPUS, current=lambda m: sel(m.name, state="current"),
                             maximum=lambda m: sel(m.name, state="max"), utilization=S.GPU_UTILIZATION.name),
    )


def truegpu_presence(t: Timing) -> tuple[Alert, ...]:
    """A GPU lost: one that stopped reporting (GpuFellOffBus), or fewer than Kubernetes counts (GpuMissing)."""
    info = S.GPU_INFO.name
    lost = fell_off_bus(t, TRUEGPU_GPUS, seen=f"max_over_time({info}[{t.window(FELL_OFF_BUS_LOOKBACK)}])", now=info,
                        node_up=S.NODE_INFO.name)
    return (*TRUEGPU_GPUS.owned(lost), gpu_missing(t, S.MEMORY_USED.name, S.GPU_INSTANCE))


def truegpu_hardware(t: Timing, th: Thresholds = THRESHOLDS) -> Group:
    """Per-GPU hardware alerts over truegpu's exporter metrics (:data:`HARDWARE_ALERTS` and GpuMissing)."""
    return Group(name="truegpu-hardware", rules=(
        *truegpu_xid(t), *truegpu_memory(t), *truegpu_thermal(t, th), *truegpu_links(t, th), *truegpu_presence(t),
    ))


def collection_health(t: Timing, exporter_job: str) -> tuple[Alert, ...]:
    """The exporter is up but a source is not: failing (some GPU or the endpoint unreadable), serving
    stale values (collections overrun the deadline), or slow. Carry the node from truegpu_node_info."""
    def on_node(expr: str) -> str:
        node = f"max by ({SCRAPE_JOB}, {INSTANCE}, {S.HOSTNAME}) ({sel(S.NODE_INFO.name, job=exporter_job)})"
        return (f"({expr}) * on ({SCRAPE_JOB}, {INSTANCE}) group_left ({S.HOSTNAME}) {node} "
                f"or on ({SCRAPE_JOB}, {INSTANCE}, source) ({expr})")

    def per_source(metric: S.Metric, condition: str) -> str:
        by_source = f"{SCRAPE_JOB}, {INSTANCE}, source"  # the exporter's node, where it publishes truegpu_node_info
        return on_node(f"max by ({by_source}) ({sel(metric.name, job=exporter_job)}) {condition}")

    where = "source {{ $labels.source }} of the exporter on {{ $labels.hostname }} ({{ $labels.instance }})"
    slow = SLOW_SHARE_OF_DEADLINE * DEFAULT_DEADLINE
    return (
        Alert(alert=COLLECTION_FAILING, expr=per_source(S.SOURCE_UP, "== 0"), for_=t.hold(900), severity="warning",
              team="sre", summary="GPU telemetry collection failing on {{ $labels.hostname }}",
              description=f"The {where} has not collected everything for {t.hold(900)} (a lost GPU, NVML errors, or "
                          "dcgm-exporter unreachable): truegpu_exporter_errors_total says which; those GPUs are "
                          "unknown."),
        Alert(alert=COLLECTION_STALE, expr=per_source(S.SOURCE_STALE, "== 1"), for_=t.hold(300), severity="warning",
              team="sre", summary="GPU telemetry stale on {{ $labels.hostname }}",
              description=f"The {where} overruns its deadline and serves its last good values for {t.hold(300)}: "
                          "the data is old (a hung NVML call or a slow dcgm-exporter)."),
        Alert(alert=COLLECTION_SLOW, expr=per_source(S.COLLECT_DURATION, f"> {slow:g}"), for_=t.hold(900),
              severity="info", team="sre", summary="GPU telemetry collection slow on {{ $labels.hostname }}",
              description=f"The {where} takes {{{{ $value | humanizeDuration }}}} per collection for {t.hold(900)}, "
                          f"more than half of its {DEFAULT_DEADLINE:g} s deadline."),
    )


def truegpu_exporter(t: Timing, exporter_job: str = EXPORTER_JOB) -> Group:
    """The exporter's own health: down, or up with a source failing, stale or slow."""
    presence = sel(S.NODE_INFO.name, job=exporter_job)
    return Group(name="truegpu-exporter", rules=(
        exporter_down(t, exporter_job, presence, EXPORTER_DOWN), *collection_health(t, exporter_job)))


def truegpu_file(t: Timing, exporter_job: str = EXPORTER_JOB, th: Thresholds = THRESHOLDS) -> RuleFile:
    """``truegpu.yaml``: the rules over truegpu's own exporter metrics."""
    return RuleFile(name="truegpu.yaml", header="truegpu exporter metrics (truegpu_*)",
                    groups=(truegpu_recording(), truegpu_hardware(t, th), truegpu_exporter(t, exporter_job)))


# dcgm-exporter dialect ---------------------------------------------------------------------
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


def _dcgm(field_name: str, **matchers: str) -> str:
    """A normalized dcgm series."""
    return dcgm_norm(dcgm_sel(field_name, **matchers))


def _dcgm_range(fn: str, field_name: str, window: str) -> str:
    """``fn(field[window])``, normalized (label_replace cannot take a range vector)."""
    return dcgm_norm(f"{fn}({dcgm_sel(field_name)}[{window}])")


DCGM_GPU_BY = by((S.HOSTNAME, S.GPU, DCGM_UUID_LABEL))
#: DCGM blank/not-supported markers are "unknown", never a value: comparisons keep what is below them.
DCGM_OK = f"< {DCGM_SENTINEL_MIN}"
#: dcgm-exporter's series, normalized. Aggregated per-GPU alerts lose its pod labels: they join the pod
#: holding the GPU back from the memory series it attributes (per-series alerts keep their own).
DCGM_GPUS = PerGpu(key=DCGM_GPU_BY, ref=DCGM_GPU_REF, labels={"dialect": "dcgm"},
                   holders=_dcgm(S.MEMORY_USED.dcgm_field().field, namespace="!="), owner="namespace, pod")


def dcgm_recording() -> Group:
    """The truegpu recording rules' GPU, node and fleet levels from dcgm-exporter fields (no workload
    level: dcgm-exporter has no allocation series)."""
    host, g = S.HOSTNAME, DCGM_GPU_BY
    sm_active = S.SM_ACTIVE.dcgm_field().field
    clock, clock_max = S.SM_CLOCK.dcgm_field(), S.SM_CLOCK_MAX.dcgm_field()
    util = S.GPU_UTILIZATION.dcgm_field()
    whole = {"GPU_I_ID": ""}
    return Group(name="dcgm-recording", rules=(
        Record(record=DCGM_GPU_SM_CLOCK_RATIO,
               expr=f"clamp_max({scaled(f'max by ({g}) ({_dcgm(clock.field)})', clock.scale / clock_max.scale)}"
                    f" / max by ({g}) ({_dcgm(clock_max.field)}), 1)"),
        Record(record=DCGM_GPU_EFFECTIVE_UTILIZATION,
               expr=f"{_dcgm(sm_active)} * on ({g}) group_left () {DCGM_GPU_SM_CLOCK_RATIO}"),
        Record(record=DCGM_GPU_MASKING_GAP,
               expr=f"{scaled(_dcgm(util.field, **whole), util.scale)} - on ({g}) {_dcgm(sm_active, **whole)}"),
        Record(record=DCGM_NODE_EFFECTIVE_UTILIZATION, expr=f"avg by ({host}) ({DCGM_GPU_EFFECTIVE_UTILIZATION})"),
        Record(record=DCGM_NODE_MASKING_GAP, expr=f"avg by ({host}) ({DCGM_GPU_MASKING_GAP})"),
        Record(record=DCGM_FLEET_EFFECTIVE_UTILIZATION, expr=f"avg ({DCGM_GPU_EFFECTIVE_UTILIZATION})"),
        Record(record=DCGM_FLEET_MASKING_GAP, expr=f"avg ({DCGM_GPU_MASKING_GAP})"),
    ))


def dcgm_xid(t: Timing) -> tuple[Alert, ...]:
    """GpuXidError twice per class: from a change of the last-XID gauge (default counters), and from the
    XID count collector where a GPU's dcgm-exporter runs it (it sees a repeated XID; the gauge then
    stays quiet for that GPU). The collector's alerts carry ``xid_source`` to tell them apart."""
    g, w10 = DCGM_GPU_BY, t.window(600)
    xid_field = S.XID_ERRORS.dcgm_field().field
    xid = dcgm_sel(xid_field)
    counted = f"max by ({g}) ({dcgm_norm(dcgm_sel(S.DCGM_XID_COUNT))})"

    def of_class(codes: Sequence[int]) -> str:
        return " or ".join(f"{xid} == {c}" for c in codes)

    def changed(expr: str) -> str:
        """Matches on whole label sets of one series only, so it is normalized once, outside."""
        return dcgm_norm(f"({expr}) unless ({xid} offset {w10} == {xid})") + f" unless on ({g}) {counted}"

    def count(codes: str) -> str:
        window = dcgm_norm(f"max_over_time({dcgm_sel(S.DCGM_XID_COUNT, xid=codes)}[{w10}])")
        return f"max by ({g}, xid) ({window}) > 0"

    crit, info = alternatives(CRITICAL_XIDS), alternatives(INFO_XIDS)
    gauge = xid_alerts(
        DCGM_GPUS, critical=changed(of_class(CRITICAL_XIDS)), info=changed(of_class(INFO_XIDS)),
        warning=changed(f"{xid} > 0 {DCGM_OK} unless ({of_class(CRITICAL_XIDS)} or {of_class(INFO_XIDS)})"),
        code="{{ $value }}", fields=(xid_field,),
        events="XID {{ $value }} (the last XID the GPU reported changed within the last " + w10 + ")")
    collector = xid_alerts(
        DCGM_GPUS, critical=count("=~" + crit), warning=count(f"!~{crit}|{info}"), info=count("=~" + info),
        code="{{ $labels.xid }}", labels={**DCGM_GPUS.labels, "xid_source": "count_collector"},
        fields=(S.DCGM_XID_COUNT,),
        events="{{ $value }} XID {{ $labels.xid }} event(s) within dcgm-exporter's XID count window in the last "
               + w10)
    return (*gauge, *DCGM_GPUS.owned(*collector))


def dcgm_memory(t: Timing) -> tuple[Alert, ...]:
    """HBM and driver state: uncorrectable ECC errors, row-remap failure, a recovery action required."""
    g, w10 = DCGM_GPU_BY, t.window(600)
    dbe = S.ECC_ERRORS.dcgm_field(type="uncorrectable", scope="volatile").field
    rows = S.REMAPPED_ROWS.dcgm_field(type="uncorrectable").field
    failure, recovery = S.ROW_REMAP_FAILURE.dcgm_field().field, S.GPU_RECOVERY_ACTION.dcgm_field().field
    errors = " or ".join(f"max by ({g}) ({_dcgm_range('increase', f, w10)}) > 0" for f in (dbe, rows))
    return (
        *DCGM_GPUS.owned(uncorrectable_ecc(DCGM_GPUS, errors, w10, (dbe, rows))),
        row_remap_failure(DCGM_GPUS, _dcgm(failure), (failure,)),
        recovery_action(DCGM_GPUS, f"{_dcgm(recovery)} {DCGM_OK}", (recovery,)),
    )


def dcgm_thermal(t: Timing, th: Thresholds) -> tuple[Alert, ...]:
    """Thermal throttling from the clock-event reason bitmask (temperatures where it is not collected)."""
    g = DCGM_GPU_BY
    clock = S.SM_CLOCK.dcgm_field()
    mask = dcgm_norm(dcgm_sel(*(f.field for f in S.CLOCK_EVENT_ACTIVE.dcgm)))
    bits = [bit for bit, name in S.CLOCK_EVENT_REASONS.items() if name in S.THERMAL_REASONS]
    thermal_bits = " + ".join(f"floor({mask} / {bit}) % 2" for bit in bits)
    gpu_temp, memory_temp = (f"max by ({g}) ({_dcgm(S.TEMPERATURE.dcgm_field(sensor=sensor).field)}) {DCGM_OK}"
                             for sensor in ("gpu", "memory"))
    return DCGM_GPUS.owned(*thermal_alerts(
        t, th, DCGM_GPUS, clock=scaled(f"max by ({g}) ({_dcgm(clock.field)})", clock.scale),
        clock_text="{{ $value | humanize }}Hz",
        thermal_reason=f"max by ({g}) ({thermal_bits} and {mask} {DCGM_OK}) > 0", reasons=f"{mask} {DCGM_OK}",
        gpu_temp=gpu_temp, memory_temp=memory_temp,
        fields=(clock.field, *(f.field for f in S.TEMPERATURE.dcgm)),
    ))


def dcgm_links(t: Timing, th: Thresholds) -> tuple[Alert, ...]:
    """Interconnect: NVLink errors that keep growing, a PCIe link below its maximum while busy."""
    w10 = t.window(600)
    nvlink = tuple(f.field for f in S.NVLINK_ERRORS.dcgm)
    util = S.GPU_UTILIZATION.dcgm_field()
    pcie = tuple(m.dcgm_field(state=state).field for m, _ in PCIE_LINKS for state in ("current", "max"))
    return DCGM_GPUS.owned(
        nvlink_errors(t, DCGM_GPUS, dcgm_norm(f"increase({dcgm_sel(*nvlink)}[{w10}])"), w10, nvlink),
        pcie_link_downgraded(t, th, DCGM_GPUS, current=lambda m: _dcgm(m.dcgm_field(state="current").field),
                             maximum=lambda m: f"{_dcgm(m.dcgm_field(state='max').field)} {DCGM_OK}",
                             utilization=scaled(_dcgm(util.field), util.scale), fields=(*pcie, util.field)),
    )


def dcgm_presence(t: Timing) -> tuple[Alert, ...]:
    """A GPU lost: one that stopped reporting while its node (a known, non-empty host) still reports
    (GpuFellOffBus), or fewer than Kubernetes counts (GpuMissing)."""
    host = S.HOSTNAME
    gpu_temp, fb_used = S.TEMPERATURE.dcgm_field(sensor="gpu").field, S.MEMORY_USED.dcgm_field().field
    named = " or ".join(dcgm_sel(gpu_temp, **{label: "!="}) for label in (host, DCGM_OLD_HOST_LABEL))
    lost = fell_off_bus(t, DCGM_GPUS, seen=_dcgm_range("max_over_time", gpu_temp, t.window(FELL_OFF_BUS_LOOKBACK)),
                        now=_dcgm(gpu_temp), node_up=f"(count by ({host}) ({dcgm_norm(named)}))", fields=(gpu_temp,))
    return (*DCGM_GPUS.owned(lost), gpu_missing(t, _dcgm(fb_used), "GPU_I_ID", dict(DCGM_GPUS.labels), (fb_used,)))


def dcgm_hardware(t: Timing, th: Thresholds = THRESHOLDS) -> Group:
    """truegpu-hardware's alerts over dcgm-exporter fields, with ``dialect="dcgm"``."""
    return Group(name="dcgm-hardware", rules=(
        *dcgm_xid(t), *dcgm_memory(t), *dcgm_thermal(t, th), *dcgm_links(t, th), *dcgm_presence(t),
    ))


def dcgm_exporter(t: Timing, dcgm_job: str = DCGM_JOB) -> Group:
    """dcgm-exporter's own health: its scrape target down."""
    presence = dcgm_sel(S.TEMPERATURE.dcgm_field(sensor="gpu").field, job=dcgm_job)
    return Group(name="dcgm-exporter", rules=(
        exporter_down(t, dcgm_job, presence, DCGM_EXPORTER_DOWN, dcgm_norm, dict(DCGM_GPUS.labels)),))


def dcgm_header(alerts: Iterable[Alert]) -> str:
    """``dcgm.yaml``'s comment: what effective utilization and each alert need beyond the default counters."""
    needs = [f"{a.alert} ({a.labels.get('severity', a.severity)}): {', '.join(a.non_default_fields)}"
             for a in alerts if a.non_default_fields]
    return (
        "NVIDIA dcgm-exporter metrics (DCGM_FI_* or the 1.x dcgm_fi_* names; host label Hostname or hostname,\n"
        "both read as hostname).\n"
        f"Effective utilization needs {S.SM_ACTIVE.dcgm_field().field} and {S.SM_CLOCK_MAX.dcgm_field().field}, "
        "not in dcgm-exporter's default counters.\n"
        "Alerts needing counters beyond dcgm-exporter's default list (add them to its counters CSV):\n"
        + "\n".join(f"  {n}" for n in dict.fromkeys(needs))
    )


def dcgm_file(t: Timing, dcgm_job: str = DCGM_JOB, th: Thresholds = THRESHOLDS) -> RuleFile:
    """``dcgm.yaml``: the rules over plain dcgm-exporter data, every series normalized (:func:`dcgm_norm`)."""
    groups = (dcgm_recording(), dcgm_hardware(t, th), dcgm_exporter(t, dcgm_job))
    alerts = [r for g in groups for r in g.rules if isinstance(r, Alert)]
    return RuleFile(name="dcgm.yaml", header=dcgm_header(alerts), groups=groups, dialect="dcgm")


# Analyzer findings and health -----------------------------------------------------------------
def _finding(kind: str, **extra: str) -> str:
    m = {"kind": kind, **extra}
    return f"{sel(O.FINDING_SCORE.name, **m)} and {sel(O.FINDING_ACTIVE.name, **m)} == 1"


def analyzer_findings(t: Timing) -> Group:
    """Alerts on the analyzer's open findings, one per kind the detector registry pages on
    (analyzer.detectors: each detector's ``paging``): a fixed severity tickets (FinOps waste); else the
    finding's own severity: what the analyzer calls critical pages, never a ticket, and what it calls
    info (an early suspected straggler, a placement to review) is logged, never a ticket: as a warning,
    a suspect held for the rule's ``for:`` ticketed the team though its finding never reached warning."""
    where = ("GPU {{ $labels.gpu }} on {{ $labels.hostname }} (workload {{ $labels.namespace }}/"
             "{{ $labels.workload }})")
    score = "score {{ $value | humanizePercentage }}"
    rules: list[Alert] = []
    for kind in kinds():
        p: Paging | None = load_detectors()[kind].paging
        if p is None:
            continue
        common = {"alert": p.alert, "for_": t.hold(p.hold_s), "keep_firing_for": t.hold(p.keep_s) if p.keep_s else "",
                  "team": p.team,
                  "summary": (p.summary or f"{p.alert.removeprefix('Gpu')}: ") + SHORT_REF,
                  "description": f"{where} {p.says.format(score=score)}"}
        if p.severity is not None:
            rules.append(Alert(expr=_finding(kind), severity=p.severity, **common))
        else:
            rules += [Alert(expr=_finding(kind, severity=severity), severity=severity, **common)
                      for severity in SEVERITIES]
    return Group(name="truegpu-findings", rules=tuple(rules))


def analyzer_health(t: Timing, analyzer_job: str = ANALYZER_JOB) -> Group:
    """The analyzer down (not scraped) or stuck (no successful analysis for too long); its --state-file not
    written (a restart would lose the finding ids and the evidence carried past the window)."""
    stale = t.seconds(ANALYZER_STALE_SECONDS)
    hold = t.hold(900)

    def writes(result: str) -> str:
        return f"max without (result) (increase({sel(O.ANALYZER_STATE_WRITES.name, job=analyzer_job, result=result)}" \
               f"[{hold}]))"

    return Group(name="truegpu-analyzer", rules=(
        Alert(alert=ANALYZER_DOWN, expr=f"{sel(UP, job=analyzer_job)} == 0", for_=t.hold(300), severity="warning",
              team="sre", summary="truegpu analyzer {{ $labels.instance }} is down",
              description=f"Prometheus cannot scrape the analyzer {{{{ $labels.instance }}}} for {t.hold(300)}: "
                          "findings (stragglers, idle GPUs) are not being raised.",
              labels={"reason": "down"}),
        Alert(alert=ANALYZER_DOWN, expr=f"time() - {sel(O.ANALYZER_LAST_SUCCESS.name, job=analyzer_job)} > {stale:g}",
              for_=t.hold(300), severity="warning", team="sre",
              summary="truegpu analyzer {{ $labels.instance }} is stuck",
              description="The analyzer {{ $labels.instance }} last finished an analysis "
                          "{{ $value | humanizeDuration }} ago: findings are stale.",
              labels={"reason": "stale"}),
        # Every write of the last 15 minutes failed (a full or read-only volume); the analysis itself goes on.
        Alert(alert=ANALYZER_STATE, expr=f"{writes('error')} > 0 unless on (job, instance) {writes('ok')} > 0",
              for_=t.hold(300), severity="info", team="sre",
              summary="truegpu analyzer {{ $labels.instance }} cannot save its state",
              description=f"Every write of the analyzer's --state-file for {hold} failed: a restart would give "
                          "ongoing problems new ids and lose the evidence carried past the window (see its log)."),
    ))


def analyzer_file(t: Timing, analyzer_job: str = ANALYZER_JOB) -> RuleFile:
    """``analyzer.yaml``: alerts on the analyzer's published findings and on its health."""
    return RuleFile(name="analyzer.yaml",
                    header="truegpu analyzer findings (truegpu_finding_active) and analyzer health",
                    groups=(analyzer_findings(t), analyzer_health(t, analyzer_job)))


def rule_files(timing: Timing | None = None, selectors: Selectors = SELECTORS,
               thresholds: Thresholds = THRESHOLDS) -> list[RuleFile]:
    """The three rule files for a site's selectors (job names, cluster label) and thresholds."""
    t = timing or Timing()
    files = [truegpu_file(t, selectors.exporter_job, thresholds), dcgm_file(t, selectors.dcgm_job, thresholds),
             analyzer_file(t, selectors.analyzer_job)]
    return [f.keeping(selectors.cluster_label) for f in files]


def alert_names() -> list[str]:
    """Every alert name, once, in file order."""
    return list(dict.fromkeys(a.alert for f in rule_files() for a in f.alerts()))


def record_names() -> list[str]:
    """Every recording-rule name, once, in file order."""
    return list(dict.fromkeys(r.record for f in rule_files() for r in f.records()))
