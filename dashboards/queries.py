"""PromQL built from the metric contract, in two dialects: truegpu's exporter and plain dcgm-exporter.

Every expression a dashboard uses comes from a :class:`Dialect`, which turns a contract
``Metric`` into a selector in base units with the contract's label names, so the panels
above it are written once:

* ``truegpu``: ``truegpu_*`` series; the namespace/workload variables join
  ``truegpu_gpu_allocation_info`` (``* on(hostname, gpu, uuid, gpu_instance)
  group_left(namespace, pod, workload)``).
* ``dcgm``: the ``DCGM_FI_*`` fields of ``Metric.dcgm`` under every name a dcgm-exporter release
  gave them (``alerts.rules.dcgm_sel``), with their scale applied (percent -> /100, MHz -> *1e6,
  MiB -> bytes, mJ -> J), contract labels set with ``label_replace`` (``sensor``, ``direction``,
  ``type``, ``state``), every leaf normalised by ``alerts.rules.dcgm_norm`` (``Hostname`` ->
  ``hostname``, 1.x ``uuid`` -> ``UUID``; the host variable is matched under either label), MIG
  ``GPU_I_ID``/``GPU_I_PROFILE`` -> ``gpu_instance``/``mig_profile``, and the pod labels
  dcgm-exporter puts on every sample in place of the allocation join. dcgm-exporter has no
  workload label: there the ``workload`` variable lists pods and ``workload`` is copied from ``pod``.

Both dialects take the site's cluster label (``analyzer.site``: ``selectors.cluster_label``):
every selector matches ``<cluster_label>=~"$cluster"`` and every grouping and join keeps the
label (:meth:`Dialect.key`), so no panel mixes two clusters' hosts. Where the label is absent
(one Prometheus per cluster) the results are the same as without it; ``""`` leaves it out.

Rates differ too: dcgm-exporter's byte "counters" are already per-second rates
(``kind="rate"``: averaged, never ``rate()``d), clock-event reasons are a bitmask
(decoded with ``floor(x / bit) % 2``) and XIDs are a "last XID code" gauge.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from alerts.rules import DCGM_OLD_HOST_LABEL, dcgm_norm, dcgm_sel
from analyzer import output_schema as out
from analyzer.site import Selectors
from exporter import schema as S
from exporter.schema import DcgmField, Metric

# Grafana variable references ---------------------------------------------------------
V_HOST = "$hostname"
V_GPU = "$gpu"
V_NAMESPACE = "$namespace"
V_WORKLOAD = "$workload"
V_CLUSTER = "$cluster"
#: The cluster label of the committed dashboards (a site config names its own).
DEFAULT_CLUSTER_LABEL = Selectors().cluster_label
RANGE = "$__range"
RATE = "$__rate_interval"
#: Resolution of GPU-hour subqueries: one sample per 5 minutes, i.e. 12 per hour.
HOUR_STEP = "5m"
STEPS_PER_HOUR = 12

TRUEGPU = "truegpu"
DCGM = "dcgm"

ALLOC_LABELS = f"namespace, pod, {S.WORKLOAD}"

_DCGM_NAME = re.compile(r"\bDCGM_FI_(?:DEV|PROF)_[A-Z0-9_]+\b")


def dcgm_fields_in(expr: str) -> set[str]:
    """The dcgm-exporter field names an expression reads."""
    return set(_DCGM_NAME.findall(expr))


def _matchers(pairs: list[tuple[str, str, str]]) -> str:
    return "{" + ", ".join(f'{k}{op}"{v}"' for k, op, v in pairs) + "}" if pairs else ""


def _label_set(expr: str, label: str, value: str) -> str:
    """Set a constant label on every element of ``expr``."""
    return f'label_replace({expr}, "{label}", "{value}", "__name__", ".*")'


def _label_copy(expr: str, dst: str, src: str) -> str:
    return f'label_replace({expr}, "{dst}", "$1", "{src}", "(.*)")'


@dataclass(frozen=True)
class Dialect:
    """Builds contract expressions for one kind of data."""

    name: str
    #: The label telling clusters apart ("" = none): kept in every grouping, matched to ``$cluster``.
    cluster_label: str = DEFAULT_CLUSTER_LABEL

    @property
    def dcgm(self) -> bool:
        return self.name == DCGM

    def key(self, *labels: str) -> str:
        """A grouping/join label list that keeps the cluster label first: ``by (cluster, ...)``."""
        return ", ".join([self.cluster_label, *labels] if self.cluster_label else labels)

    @property
    def gpu_key(self) -> str:
        """Identity of one GPU or MIG instance across dialects (after normalisation)."""
        return self.key(S.HOSTNAME, S.GPU)

    def agg(self, op: str, expr: str, *labels: str) -> str:
        """``op by (cluster, labels) (expr)``: an aggregation that never mixes clusters."""
        by = self.key(*labels)
        return f"{op} by ({by}) ({expr})" if by else f"{op}({expr})"

    def cluster_matcher(self) -> list[tuple[str, str, str]]:
        return [(self.cluster_label, "=~", V_CLUSTER)] if self.cluster_label else []

    def selector(self, name: str, *pairs: tuple[str, str, str]) -> str:
        """``name{cluster=~"$cluster", ...}``: a selector of a series outside the contract's scopes."""
        return name + _matchers([*self.cluster_matcher(), *pairs])

    def supports(self, metric: Metric) -> bool:
        return not self.dcgm or bool(metric.dcgm)

    # selectors ------------------------------------------------------------------------
    def _filters(self, metric: Metric, alloc: bool, match: dict[str, str]) -> list[tuple[str, str, str]]:
        pairs = self.cluster_matcher()
        if metric.scope in ("gpu", "node"):
            pairs.append((S.HOSTNAME, "=~", V_HOST))
        if metric.scope == "gpu":
            pairs.append((S.GPU, "=~", V_GPU))
        if self.dcgm and alloc:
            pairs += [("namespace", "!=", ""), ("namespace", "=~", V_NAMESPACE), ("pod", "=~", V_WORKLOAD)]
        for k, v in match.items():
            op, val = (v[:2], v[2:]) if v[:2] in ("=~", "!=", "!~") else ("=", v)
            if self.dcgm and k == S.GPU_INSTANCE:
                k = "GPU_I_ID"
            pairs.append((k, op, val))
        return pairs

    def _dcgm_fields(self, metric: Metric, field_labels: dict[str, str]) -> dict[tuple, list[DcgmField]]:
        """Fields of ``metric`` whose contract labels agree with ``field_labels``, grouped by label set."""
        if not metric.dcgm:
            raise ValueError(f"{metric.name} has no dcgm-exporter field")
        groups: dict[tuple, list[DcgmField]] = {}
        for f in metric.dcgm_fields(**field_labels):
            groups.setdefault(f.labels, []).append(f)
        if not groups:
            raise ValueError(f"{metric.name} has no dcgm-exporter field with {field_labels}")
        return groups

    def _split(self, metric: Metric, match: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
        """(contract labels that pick dcgm fields, the rest as matchers)."""
        if not self.dcgm:
            return {}, match
        field_keys = {k for f in metric.dcgm for k, _ in f.labels}
        return ({k: v for k, v in match.items() if k in field_keys},
                {k: v for k, v in match.items() if k not in field_keys})

    def _dcgm(self, metric: Metric, form: str, window: str, alloc: bool, mig: bool, match: dict[str, str]) -> str:
        field_labels, rest = self._split(metric, match)
        parts = []
        pairs = self._filters(metric, alloc, rest)
        for labels, fields in self._dcgm_fields(metric, field_labels).items():
            alts = []
            for f in fields:
                if f.kind in ("bitmask", "last"):
                    raise ValueError(f"{f.field} is a {f.kind} field: use the dialect's dedicated helper")
                if form == "value":
                    e = dcgm_leaf([f.field], pairs)
                elif f.kind == "rate":  # already a per-second rate: never rate() it
                    if form != "rate":
                        raise ValueError(f"{f.field} is a rate; increase() over it is not supported")
                    e = dcgm_leaf([f.field], pairs, lambda sel: f"avg_over_time({sel}[{window}])")
                else:
                    e = dcgm_leaf([f.field], pairs, lambda sel: f"{form}({sel}[{window}])")
                if f.scale != 1.0:
                    e = f"{e} * {f.scale:g}"
                alts.append(e)
            e = " or ".join(alts) if len(alts) == 1 else "(" + " or ".join(alts) + ")"
            for k, v in labels:  # the field's contract labels (sensor, direction, ...) are not on the series
                e = _label_set(e, k, v)
            parts.append(e)
        expr = parts[0] if len(parts) == 1 else "(" + " or ".join(parts) + ")"
        return self._normalise(expr, alloc, mig)

    def _normalise(self, expr: str, alloc: bool, mig: bool) -> str:
        expr = dcgm_norm(expr)
        if mig:
            expr = _label_copy(_label_copy(expr, S.GPU_INSTANCE, "GPU_I_ID"), S.MIG_PROFILE, "GPU_I_PROFILE")
        if alloc:
            expr = _label_copy(expr, S.WORKLOAD, "pod")
        return expr

    def _alloc_join(self, expr: str) -> str:
        info = self.selector(S.GPU_ALLOCATION_INFO.name, ("namespace", "=~", V_NAMESPACE),
                             (S.WORKLOAD, "=~", V_WORKLOAD))
        on = self.key(S.HOSTNAME, S.GPU, S.UUID, S.GPU_INSTANCE)
        return f"({expr}) * on({on}) group_left({ALLOC_LABELS}) {info}"

    def _truegpu(self, metric: Metric, form: str, window: str, alloc: bool, match: dict[str, str]) -> str:
        sel = metric.name + _matchers(self._filters(metric, alloc, match))
        e = sel if form == "value" else f"{form}({sel}[{window}])"
        return self._alloc_join(e) if alloc else e

    def sel(self, metric: Metric, *, alloc: bool = False, mig: bool = False, **match: str) -> str:
        """A gauge in base units. ``alloc``: only allocated GPUs, filtered by $namespace/$workload, with
        namespace/pod/workload labels. ``mig``: dcgm MIG labels renamed to the contract's."""
        if self.dcgm:
            return self._dcgm(metric, "value", "", alloc, mig, match)
        return self._truegpu(metric, "value", "", alloc, match)

    def rate(self, metric: Metric, window: str = RATE, *, alloc: bool = False, mig: bool = False,
             **match: str) -> str:
        """Per-second rate of a counter (dcgm rate fields: their average)."""
        if self.dcgm:
            return self._dcgm(metric, "rate", window, alloc, mig, match)
        return self._truegpu(metric, "rate", window, alloc, match)

    def increase(self, metric: Metric, window: str = RANGE, *, alloc: bool = False, **match: str) -> str:
        if self.dcgm:
            return self._dcgm(metric, "increase", window, alloc, False, match)
        return self._truegpu(metric, "increase", window, alloc, match)

    def throughput(self, metric: Metric, by: str, window: str = RATE) -> str:
        """Bytes/s summed over directions (``by``: a full :meth:`key`). dcgm: TX+RX fields, else the
        TX+RX total field."""
        if not self.dcgm:
            return f"sum by ({by}) ({self.rate(metric, window)})"
        directional = f"sum by ({by}) ({self._dcgm_dirs(metric, window)})"
        totals = [f for f in metric.dcgm if ("direction", "total") in f.labels]
        if not totals:
            return directional
        return f"{directional} or sum by ({by}) ({self.rate(metric, window, direction='total')})"

    def _dcgm_dirs(self, metric: Metric, window: str) -> str:
        return " or ".join(self.rate(metric, window, direction=d) for d in S.DIRECTIONS)

    def memory_total(self) -> str:
        """Device memory installed; dcgm: FB_TOTAL, else FB_USED + DCGM_FB_FREE + DCGM_FB_RESERVED (the defaults)."""
        if not self.dcgm:
            return self.sel(S.MEMORY_TOTAL)
        from exporter.schema import DCGM_FB_FREE, DCGM_FB_RESERVED

        pairs = self._filters(S.MEMORY_USED, False, {})
        used, free, reserved = (dcgm_leaf([f], pairs) for f in (S.MEMORY_USED.dcgm[0].field, DCGM_FB_FREE,
                                                                   DCGM_FB_RESERVED))
        total = S.MEMORY_TOTAL.dcgm[0]
        expr = f"({dcgm_leaf([total.field], pairs)} or ({used} + {free} + {reserved})) * {total.scale:g}"
        return self._normalise(expr, False, False)

    # clock events ---------------------------------------------------------------------
    def clock_events(self, reasons: tuple[str, ...]) -> str:
        """0/1 per GPU and ``reason`` for the given clock-event (throttle) reasons."""
        if not self.dcgm:
            rx = "|".join(reasons)
            return self.sel(S.CLOCK_EVENT_ACTIVE, reason=f"=~{rx}")
        bits = {name: bit for bit, name in S.CLOCK_EVENT_REASONS.items()}
        fields = [f.field for f in S.CLOCK_EVENT_ACTIVE.dcgm if f.kind == "bitmask"]
        mask = dcgm_leaf(fields, self._filters(S.CLOCK_EVENT_ACTIVE, False, {}))
        parts = [_label_set(f"floor({mask} / {bits[r]}) % 2", "reason", r) for r in reasons]
        return self._normalise("(" + " or ".join(parts) + ")" if len(parts) > 1 else parts[0], False, False)

    # derived quantities -----------------------------------------------------------------
    def clock_ratio(self) -> str:
        """SM clock / max SM clock per GPU (1 = no capacity lost to throttling)."""
        return self.agg("max", f"clamp_max({self.sel(S.SM_CLOCK)} / {self.sel(S.SM_CLOCK_MAX)}, 1)", S.HOSTNAME, S.GPU)

    def effective(self, *, alloc: bool = False, mig: bool = False, **match: str) -> str:
        """Effective utilization: SM active x (SM clock / max SM clock), per GPU or MIG instance."""
        sm = self.sel(S.SM_ACTIVE, alloc=alloc, mig=mig, **match)
        return f"{sm} * on({self.gpu_key}) group_left() {self.clock_ratio()}"

    def masking_gap(self, *by: str) -> str:
        """Reported GPU utilization minus SM activity (per GPU, or per ``by`` labels): time a kernel was
        resident but SMs idled."""
        by = by or (S.HOSTNAME, S.GPU)
        return f"{self.agg('avg', self.sel(S.GPU_UTILIZATION), *by)} - {self.agg('avg', self.sel(S.SM_ACTIVE), *by)}"

    def allocated(self) -> str:
        """1 per allocated GPU (or MIG instance) with namespace and workload labels, filtered by the variables."""
        if not self.dcgm:
            return S.GPU_ALLOCATION_INFO.name + _matchers(
                [*self._filters(S.GPU_ALLOCATION_INFO, False, {}),
                 ("namespace", "=~", V_NAMESPACE), (S.WORKLOAD, "=~", V_WORKLOAD)])
        # Memory used is a default field and is reported per MIG instance.
        return self.agg("count", self.sel(S.MEMORY_USED, alloc=True),
                        S.HOSTNAME, S.GPU, "GPU_I_ID", "namespace", S.WORKLOAD, "modelName")

    def _with_model(self, expr: str) -> str:
        """``expr`` (per GPU) with the GPU model as label ``model``: from gpu_info, or dcgm's modelName."""
        if self.dcgm:
            return f'label_replace({expr}, "model", "$1", "modelName", "(.*)")'
        info = self.agg("max", S.GPU_INFO.name + _matchers(self._filters(S.GPU_INFO, False, {})),
                        S.HOSTNAME, S.GPU, "model")
        return f"{expr} * on({self.gpu_key}) group_left(model) {info}"

    def allocated_cost(self, by: str) -> str:
        """Allocated GPU-hours over the dashboard range times the catalog price of each GPU's model
        (the analyzer's truegpu_gpu_hourly_cost); models the catalog does not price drop out, never $0."""
        price = self.agg("max", self.analyzer(out.GPU_HOURLY_COST), "model", "currency")
        priced = f"{self._with_model(self.allocated())} * on({self.key('model')}) group_left(currency) {price}"
        return self.gpu_hours(priced, by)

    def gpu_hours(self, expr: str, by: str) -> str:
        """GPU-hours of a 0..1-per-GPU expression over the dashboard range, per cluster and ``by``."""
        return f"{self.agg('sum', f'sum_over_time(({expr})[{RANGE}:{HOUR_STEP}])', by)} / {STEPS_PER_HOUR}"

    def coverage(self) -> str:
        """Share of the GPUs seen in the dashboard range that report data now (missing = unknown, never 0)."""
        seen = self.sel(S.MEMORY_USED)  # a default dcgm-exporter field, present on every GPU and MIG instance
        return f"{self.agg('count', seen)} / {self.agg('count', f'max_over_time(({seen})[{RANGE}:{HOUR_STEP}])')}"

    def allocated_gpu_hours(self, by: str) -> str:
        return self.gpu_hours(self.allocated(), by)

    def effective_gpu_hours(self, by: str) -> str:
        return self.gpu_hours(self.effective(alloc=True), by)

    def xid(self, window: str = RANGE) -> tuple[str, str]:
        """(expression, what it means). truegpu: XID events per code; dcgm: last XID code seen."""
        pairs = self._filters(S.XID_ERRORS, False, {})
        if not self.dcgm:
            events = f"increase({S.XID_ERRORS.name}{_matchers(pairs)}[{window}])"
            return f"{self.agg('sum', events, S.HOSTNAME, S.GPU, 'xid')} > 0", "events"
        last = self._normalise(dcgm_leaf([S.XID_ERRORS.dcgm[0].field], pairs), False, False)
        return self.agg("max", last, S.HOSTNAME, S.GPU), "code"

    def values_of(self, metric: Metric, label: str, **match: str) -> str:
        """One series per (cluster, ``label``) seen in the dashboard range of a dcgm ``metric``, normalised like
        the panels and filtered by the cluster and ``match`` only: what a variable listing ``label`` queries
        (``query_result``, an instant query: hence over the range), so it lists hosts under either host label."""
        pairs = self.cluster_matcher() + [(k, v[:2], v[2:]) for k, v in match.items()]
        seen = dcgm_leaf([metric.dcgm[0].field], pairs, lambda sel: f"max_over_time({sel}[{RANGE}])")
        return self.agg("group", self._normalise(seen, False, False), label)

    # identity -----------------------------------------------------------------------------
    def gpu_identity(self) -> str:
        """One row per GPU with its model (and driver where known)."""
        if not self.dcgm:
            return S.GPU_INFO.name + _matchers(self._filters(S.GPU_INFO, False, {}))
        return self.agg("group", self.sel(S.MEMORY_USED), S.HOSTNAME, S.GPU, "modelName", "DCGM_FI_DRIVER_VERSION")

    # analyzer output --------------------------------------------------------------------------
    def analyzer(self, metric: Metric, **match: str) -> str:
        """An analyzer series (same in both variants), filtered by the variables it carries."""
        labels = metric.labels
        pairs = self.cluster_matcher()
        if S.HOSTNAME in labels:
            pairs.append((S.HOSTNAME, "=~", V_HOST))
        if S.GPU in labels:
            pairs.append((S.GPU, "=~", V_GPU))
        if "namespace" in labels:
            pairs.append(("namespace", "=~", V_NAMESPACE))
        if S.WORKLOAD in labels and not self.dcgm:  # dcgm variant's $workload lists pods
            pairs.append((S.WORKLOAD, "=~", V_WORKLOAD))
        for k, v in match.items():
            op, val = (v[:2], v[2:]) if v[:2] in ("=~", "!=", "!~") else ("=", v)
            pairs.append((k, op, val))
        return metric.name + _matchers(pairs)


def dcgm_leaf(fields: Sequence[str], pairs: list[tuple[str, str, str]],
               form: Callable[[str], str] = lambda sel: sel) -> str:
    """``form(selector)`` over dcgm-exporter ``fields`` under all their spellings (``dcgm_sel``) with the
    matchers ``pairs``. A host matcher is tried on both host labels (``Hostname`` in older releases), the
    two or-ed, since label_replace cannot run before a selector matches: normalise with ``dcgm_norm``.
    Several fields (a current and a deprecated name) are or-ed too: the first one present wins, as one
    selector over both would hold two series per GPU once their names are dropped."""
    if len(fields) > 1:
        return "(" + " or ".join(dcgm_leaf([f], pairs, form) for f in fields) + ")"

    def selector(ps: list[tuple[str, str, str]]) -> str:
        return dcgm_sel(*fields)[:-1] + "".join(f', {k}{op}"{v}"' for k, op, v in ps) + "}"

    if all(k != S.HOSTNAME for k, _, _ in pairs):
        return form(selector(pairs))
    alts = [form(selector([(label if k == S.HOSTNAME else k, op, v) for k, op, v in pairs]))
            for label in (DCGM_OLD_HOST_LABEL, S.HOSTNAME)]
    return "(" + " or ".join(alts) + ")"


def dialects(cluster_label: str = DEFAULT_CLUSTER_LABEL) -> tuple[Dialect, Dialect]:
    """Both dialects for a site's cluster label."""
    return Dialect(TRUEGPU, cluster_label), Dialect(DCGM, cluster_label)


DIALECTS = dialects()

#: Analyzer metric names, for the "needs the analyzer" note on panels.
ANALYZER_NAMES = frozenset(m.name for m in out.METRICS)
