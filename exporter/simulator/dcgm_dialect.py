"""Turn contract series into what NVIDIA dcgm-exporter would have exposed.

Most users already have dcgm-exporter data in Prometheus; the analyzer must work on it,
so the simulator can write that dialect too. Each ``DcgmField`` of the contract is
inverted: ``value`` fields divided by their scale (and rounded where DCGM reports
integers: percent, MHz, MiB, mJ, counts), ``rate`` fields turned back from our counters
into per-second rates by differencing over the sample step, the clock-event reasons
re-encoded into the DCGM bitmask, and the XID counters into the "last XID seen" gauge.

Labels follow dcgm-exporter: ``gpu``, ``UUID``, ``pci_bus_id``, ``device``,
``modelName``, ``Hostname`` (or ``hostname`` in newer releases), ``DCGM_FI_DRIVER_VERSION``,
``GPU_I_PROFILE``/``GPU_I_ID`` on MIG instances and ``container``/``namespace``/``pod``
while a pod holds the GPU. ``legacy=True`` gives the 1.x spelling: lowercase
``dcgm_fi_*`` names, ``uuid``, ``container_name``/``pod_name``/``pod_namespace``.

The allocation and identity series come last in the contract order but label every
dcgm sample, so the converter buffers its input (the whole window) before emitting.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Literal

import numpy as np

from exporter import schema
from exporter.schema import (
    DCGM_DEFAULT_FIELDS,
    DCGM_FB_FREE,
    DCGM_FB_RESERVED,
    GPU_ALLOCATION_INFO,
    GPU_INFO,
    MEMORY_TOTAL,
    MEMORY_USED,
    MIB,
    NODE_INFO,
    NVLINK_BYTES,
    DcgmField,
    Metric,
    dcgm_field,
)
from exporter.simulator.series import SeriesItem

#: A rate field dcgm-exporter nevertheless declares a counter (it goes up and down).
_RATE_DECLARED_COUNTER = dcgm_field(NVLINK_BYTES, direction="total").field
_REASON_BITS: dict[str, int] = {reason: bit for bit, reason in schema.CLOCK_EVENT_REASONS.items()}

Counters = Literal["default", "all"]


@dataclass(frozen=True)
class DcgmOptions:
    """Which dcgm-exporter the output imitates."""

    counters: Counters = "default"
    #: ``Hostname`` in older dcgm-exporter releases, ``hostname`` in newer ones.
    hostname_label: str = "Hostname"
    #: dcgm-exporter 1.x: lowercase names, ``uuid``, ``pod_name``/``pod_namespace``/``container_name``.
    legacy: bool = False
    #: Beside it, kube-state-metrics' ``kube_node_labels`` with the node's zone (the site) allowlisted, as
    #: a Kubernetes fleet has it (cloud providers label every node's zone).
    node_zones: bool = True

    def enabled(self, field: str) -> bool:
        return self.counters == "all" or field in DCGM_DEFAULT_FIELDS


@dataclass(frozen=True)
class DcgmFamily:
    """One dcgm-exporter metric family, shaped for ``history.write_openmetrics``.

    dcgm-exporter counters carry no ``_total`` suffix, which OpenMetrics demands of a
    counter; they are written as ``unknown`` so the stored series name stays the one users
    have in Prometheus. ``declared`` keeps the type dcgm-exporter announces.
    """

    name: str
    declared: str
    help: str
    unit: str = ""

    @property
    def family_name(self) -> str:
        return self.name

    @property
    def type(self) -> str:
        return "unknown" if self.declared == "counter" else self.declared


GpuKey = tuple[str, str, str]  # hostname, gpu, gpu_instance ("" on a whole GPU)


def _key(labels: Mapping[str, str]) -> GpuKey:
    return (labels.get(schema.HOSTNAME, ""), labels.get(schema.GPU, ""), labels.get(schema.GPU_INSTANCE, ""))


@dataclass
class _Allocation:
    labels: dict[str, str]
    mask: np.ndarray


class _Labeller:
    """Builds dcgm-exporter label sets and splits a GPU's values by who held it when."""

    def __init__(self, buffered: dict[Metric, list[tuple[Mapping[str, str], np.ndarray]]], opts: DcgmOptions):
        self.opts = opts
        self.info: dict[tuple[str, str], Mapping[str, str]] = {}
        for labels, _ in buffered.get(GPU_INFO, ()):
            self.info.setdefault((labels[schema.HOSTNAME], labels[schema.GPU]), labels)
        self.alloc: dict[GpuKey, list[_Allocation]] = {}
        pod_names = (
            ("pod_namespace", "pod_name", "container_name") if opts.legacy else ("namespace", "pod", "container")
        )
        for labels, values in buffered.get(GPU_ALLOCATION_INFO, ()):
            mask = values > 0.5  # NaN compares False: unallocated
            if not mask.any():
                continue
            pod = {
                name: labels.get(src, "")
                for name, src in zip(pod_names, ("namespace", "pod", "container"), strict=True)
                if labels.get(src, "")
            }
            self.alloc.setdefault(_key(labels), []).append(_Allocation(pod, mask))

    def base(self, labels: Mapping[str, str]) -> dict[str, str]:
        host, gpu = labels.get(schema.HOSTNAME, ""), labels.get(schema.GPU, "")
        info = self.info.get((host, gpu), {})
        out = {"gpu": gpu, ("uuid" if self.opts.legacy else "UUID"): labels.get(schema.UUID, "")}
        if not self.opts.legacy:
            if info.get("pci_bus_id"):
                out["pci_bus_id"] = info["pci_bus_id"]
            out["device"] = f"nvidia{gpu}"
            if info.get("model"):
                out["modelName"] = info["model"]
        out[self.opts.hostname_label] = host
        if not self.opts.legacy and info.get("driver_version"):
            out["DCGM_FI_DRIVER_VERSION"] = info["driver_version"]
        if labels.get(schema.GPU_INSTANCE):
            out["GPU_I_PROFILE"] = labels.get(schema.MIG_PROFILE, "")
            out["GPU_I_ID"] = labels[schema.GPU_INSTANCE]
        return out

    def split(self, labels: Mapping[str, str], values: np.ndarray) -> Iterator[tuple[dict[str, str], np.ndarray]]:
        """One series per holder: unallocated samples without pod labels, each pod's with its own."""
        base = self.base(labels)
        allocs = self.alloc.get(_key(labels), [])
        if not allocs:
            yield base, values
            return
        free = np.ones(values.shape, dtype=bool)
        for a in allocs:
            free &= ~a.mask
        if free.any():
            yield base, np.where(free, values, np.nan)
        for a in allocs:
            yield {**base, **a.labels}, np.where(a.mask, values, np.nan)


def _is_integer(metric: Metric, f: DcgmField) -> bool:
    """DCGM reports integers except power (float W) and profiling ratios."""
    if metric.unit == "watts":
        return False
    return not (f.field.startswith("DCGM_FI_PROF_") and f.kind == "value")


def _rate(counter: np.ndarray, times: np.ndarray) -> np.ndarray:
    """Per-second rate over each step; NaN at the first sample, across gaps and resets."""
    out = np.full(counter.shape, np.nan)
    if counter.size > 1:
        d = np.diff(counter) / np.diff(times)
        d[d < 0] = np.nan  # counter reset: the rate over that step is unknown
        out[1:] = d
    return out


def _matches(labels: Mapping[str, str], want: tuple[tuple[str, str], ...]) -> bool:
    return all(labels.get(k) == v for k, v in want)


def _help(metric: Metric, f: DcgmField) -> str:
    return f"{metric.help} dcgm-exporter: {_unit_note(f, metric)}."


def _unit_note(f: DcgmField, metric: Metric) -> str:
    if f.kind == "bitmask":
        return "bitmask of clock-event reasons"
    if f.kind == "last":
        return "value of the last XID error"
    if f.kind == "rate":
        return "MiB/s, TX+RX" if f.scale == MIB else "bytes/s"
    notes = {0.01: "in %", MIB: "in MiB", schema.MHZ: "in MHz", 1e-3: "in mJ"}
    return notes.get(f.scale, f"in {metric.unit}" if metric.unit else "count")


def _group_by_gpu(
    rows: list[tuple[Mapping[str, str], np.ndarray]], label: str
) -> dict[GpuKey, tuple[Mapping[str, str], dict[str, np.ndarray]]]:
    """GPU key -> (labels of one series, {value of ``label``: values})."""
    out: dict[GpuKey, tuple[Mapping[str, str], dict[str, np.ndarray]]] = {}
    for labels, values in rows:
        entry = out.setdefault(_key(labels), (labels, {}))
        entry[1][labels.get(label, "")] = values
    return out


def _convert_field(
    metric: Metric,
    f: DcgmField,
    rows: list[tuple[Mapping[str, str], np.ndarray]],
    times: np.ndarray,
    gpus: Mapping[GpuKey, Mapping[str, str]],
) -> Iterator[tuple[Mapping[str, str], np.ndarray]]:
    """(contract labels of the GPU, dcgm values) for one field."""
    if f.kind == "bitmask":
        for labels, by_reason in _group_by_gpu(rows, "reason").values():
            stack = np.array(list(by_reason.values()))
            bits = np.array([_REASON_BITS.get(r, 0) for r in by_reason], dtype=np.float64)
            known = ~np.isnan(stack).all(axis=0)
            mask = ((np.nan_to_num(stack) > 0.5) * bits[:, None]).sum(axis=0)
            yield labels, np.where(known, mask, np.nan)
        return
    if f.kind == "last":
        by_gpu = _group_by_gpu(rows, "xid")
        for key, gpu_labels in gpus.items():
            if key not in by_gpu:
                yield gpu_labels, np.zeros(times.shape)  # dcgm-exporter reports 0 until an XID happens
                continue
            labels, by_code = by_gpu[key]
            yield labels, _last_xid(by_code)
        return
    selected = [(labels, values) for labels, values in rows if _matches(labels, f.labels)]
    if not selected:
        # A field over the sum of a label's values (NVLINK_BANDWIDTH_TOTAL = tx + rx).
        summed = [k for k, v in f.labels if v == "total"]
        if summed:
            for labels, parts in _group_by_gpu(rows, summed[0]).values():
                yield from _scaled(metric, f, labels, np.sum(list(parts.values()), axis=0), times)
        return
    for labels, values in selected:
        yield from _scaled(metric, f, labels, values, times)


def _scaled(
    metric: Metric, f: DcgmField, labels: Mapping[str, str], values: np.ndarray, times: np.ndarray
) -> Iterator[tuple[Mapping[str, str], np.ndarray]]:
    v = _rate(values, times) if f.kind == "rate" else values
    v = v / f.scale
    if _is_integer(metric, f):
        v = np.round(v)
    yield labels, v


def _last_xid(by_code: Mapping[str, np.ndarray]) -> np.ndarray:
    """Gauge holding the last XID code seen: a code's counter growing sets it (highest code wins a tie)."""
    codes = sorted(by_code, key=lambda c: int(c))
    stack = np.array([by_code[c] for c in codes])  # (C, T)
    code_vals = np.array([int(c) for c in codes], dtype=np.float64)
    filled = np.nan_to_num(stack, nan=0.0)
    grew = np.zeros(stack.shape, dtype=bool)
    grew[:, 0] = filled[:, 0] > 0  # events before the window: the code is already the last one
    grew[:, 1:] = np.diff(filled, axis=1) > 0
    event_code = np.where(grew, code_vals[:, None], 0.0).max(axis=0)  # (T,)
    has = event_code > 0
    # forward-fill the code of the latest event; 0 before the first one
    idx = np.where(has, np.arange(event_code.size), -1)
    np.maximum.accumulate(idx, out=idx)
    held = np.where(idx >= 0, event_code[np.maximum(idx, 0)], 0.0)
    known = ~np.isnan(stack).all(axis=0)
    return np.where(known, held, np.nan)


def _fb_fields(
    buffered: dict[Metric, list[tuple[Mapping[str, str], np.ndarray]]],
) -> Iterator[tuple[str, Mapping[str, str], np.ndarray]]:
    totals = {_key(labels): values for labels, values in buffered.get(MEMORY_TOTAL, ())}
    used_rows = buffered.get(MEMORY_USED, ())
    for labels, used in used_rows:
        total = totals.get(_key(labels))
        if total is None:
            continue
        yield DCGM_FB_FREE, labels, np.round((total - used) / MIB)
    for labels, used in used_rows:
        if _key(labels) in totals:
            yield DCGM_FB_RESERVED, labels, np.where(np.isnan(used), np.nan, 0.0)


def to_dcgm(
    series: Iterable[SeriesItem], times: np.ndarray, options: DcgmOptions | None = None
) -> Iterator[tuple[DcgmFamily, dict[str, str], np.ndarray]]:
    """Contract series (grouped by metric) -> dcgm-exporter series, grouped by family.

    Contract families without a dcgm field (NVLink link states, info series, exporter
    self-metrics) have no dcgm-exporter counterpart and are dropped; node info's site becomes
    kube-state-metrics' node zone (``options.node_zones``).
    """
    opts = options or DcgmOptions()
    times = np.asarray(times, dtype=np.float64)
    buffered: dict[Metric, list[tuple[Mapping[str, str], np.ndarray]]] = {}
    for metric, labels, values in series:
        buffered.setdefault(metric, []).append((labels, np.asarray(values, dtype=np.float64)))
    labeller = _Labeller(buffered, opts)
    # Physical GPUs (device-level identity, no MIG instance): every one reports an XID value.
    gpus: dict[GpuKey, Mapping[str, str]] = {}
    for labels, _ in buffered.get(GPU_INFO, ()):
        gpus.setdefault(_key(labels), {k: labels[k] for k in schema.GPU_LABELS if k in labels})

    def name(field: str) -> str:
        return field.lower() if opts.legacy else field

    for metric in schema.METRICS:
        rows = buffered.get(metric)
        for f in metric.dcgm:
            if rows and opts.enabled(f.field):
                declared = (
                    "counter"
                    if (metric.type == "counter" and f.kind == "value") or f.field == _RATE_DECLARED_COUNTER
                    else "gauge"
                )
                family = DcgmFamily(name(f.field), declared, _help(metric, f))
                for labels, values in _convert_field(metric, f, rows, times, gpus):
                    for out_labels, out_values in labeller.split(labels, values):
                        yield family, out_labels, out_values
        if metric is MEMORY_USED:
            # DCGM_FB_FREE / DCGM_FB_RESERVED, next to FB_USED as dcgm-exporter lists them.
            extra: dict[str, list[tuple[Mapping[str, str], np.ndarray]]] = {}
            for field, labels, values in _fb_fields(buffered):
                if opts.enabled(field):
                    extra.setdefault(field, []).append((labels, values))
            for field, items in extra.items():
                family = DcgmFamily(
                    name(field),
                    "gauge",
                    "Framebuffer memory free (DCGM_FB_FREE) or reserved (DCGM_FB_RESERVED). dcgm-exporter: in MiB.",
                )
                for labels, values in items:
                    for out_labels, out_values in labeller.split(labels, values):
                        yield family, out_labels, out_values
    if opts.node_zones:
        yield from _node_zones(buffered.get(NODE_INFO, ()))


def _node_zones(rows: Iterable[tuple[Mapping[str, str], np.ndarray]]) -> Iterator[tuple[DcgmFamily, dict[str, str],
                                                                                       np.ndarray]]:
    family = DcgmFamily(schema.KUBE_NODE_LABELS, "gauge", "kube-state-metrics: Kubernetes labels converted to "
                        "Prometheus labels (the allowlisted zone).")
    for labels, values in rows:
        if labels.get("site"):
            yield family, {schema.KUBE_NODE_LABELS_NODE: labels[schema.HOSTNAME],
                           schema.KUBE_NODE_ZONE_LABELS[0]: labels["site"]}, values


__all__ = ["DCGM_DEFAULT_FIELDS", "DcgmFamily", "DcgmOptions", "to_dcgm"]
