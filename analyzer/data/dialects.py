"""Where each canonical signal comes from in each input dialect, and what to say when it is absent.

Derived from the metric contract (exporter/schema.py) and analyzer.data.signals, never typed by
hand: a truegpu source is the signal's Metric name with its label filter; a dcgm-exporter
source is each DcgmField of that Metric whose contract labels pass the filter, in both the
current upper-case and the 1.x lower-case spelling.

Source kinds (how normalize turns samples into the signal):

- ``gauge``: value x scale, averaged over the step;
- ``counter``: monotonic counter (reset = a drop), turned into a per-second rate per step;
- ``flag``: 0/1 value, max over the label values and the step;
- ``dcgm_rate``: already a per-second rate over the period ending at the sample (x scale);
- ``bitmask``: DCGM clock-event bitmask; the signal is 1 when any of ``bits`` is set.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from analyzer.data.signals import SIGNALS, Signal
from exporter import schema as S
from exporter.schema import DCGM_DEFAULT_FIELDS, DCGM_FB_FREE, DCGM_FB_RESERVED

SourceKind = Literal["gauge", "counter", "flag", "dcgm_rate", "bitmask", "last"]
Dialect = Literal["truegpu", "dcgm"]

#: Label spellings, first non-empty wins: canonical name -> input label names.
LABEL_ALIASES: dict[str, tuple[str, ...]] = {
    "hostname": ("hostname", "Hostname"),
    "gpu": ("gpu",),
    "uuid": ("uuid", "UUID"),
    "gpu_instance": ("gpu_instance", "GPU_I_ID"),
    "mig_profile": ("mig_profile", "GPU_I_PROFILE"),
    "model": ("model", "modelName"),
    "namespace": ("namespace", "pod_namespace"),
    "pod": ("pod", "pod_name"),
    "container": ("container", "container_name"),
}
#: dcgm-exporter's HPC job mapping label: an explicit job name when no job_label is given.
HPC_JOB_LABEL = "hpc_job"
#: Contract labels that tell series of one device apart (all other labels are identity,
#: attribution or attributes such as err_code, which change without starting a new series).
SIGNAL_LABELS: tuple[str, ...] = tuple(
    dict.fromkeys(label for m in {s.metric for s in SIGNALS} | {S.XID_ERRORS} for label in m.labels)
)


@dataclass(frozen=True)
class Source:
    """One input metric name feeding one signal."""

    name: str
    signal: Signal
    dialect: Dialect
    kind: SourceKind
    #: x * scale / div is the value in base units (DcgmField.factors: percent divides by 100 exactly).
    scale: float = 1.0
    div: float = 1.0
    #: dcgm bitmask: the bits whose reasons the signal covers.
    bits: int = 0
    #: Used only where the signal's other sources are unknown (NVLink ``direction=total``).
    fallback: bool = False
    #: Contract label values this dcgm field stands for (empty for truegpu: read from labels).
    labels: tuple[tuple[str, str], ...] = ()


def _field_matches(signal: Signal, f: S.DcgmField) -> bool:
    if (f.kind == "last") != (signal.kind == "last"):  # the last-event gauge feeds its state signal only
        return False
    labels = dict(f.labels)
    return all(labels.get(label) in accepted for label, accepted in signal.labels if label in labels)


def _truegpu_kind(signal: Signal) -> SourceKind:
    if signal.metric.type == "counter":
        return "counter"
    return "flag" if signal.kind == "flag" else "gauge"


def _dcgm_sources(signal: Signal) -> Iterable[Source]:
    for f in signal.metric.dcgm:
        if not _field_matches(signal, f):
            continue
        if f.kind == "last":
            bits, kind = 0, "last"
        elif f.kind == "bitmask":
            reasons = dict(signal.labels).get("reason", ())
            bits = sum(bit for bit, reason in S.CLOCK_EVENT_REASONS.items() if reason in reasons)
            kind: SourceKind = "bitmask"
        elif f.kind == "rate":
            bits, kind = 0, "dcgm_rate"
        else:
            bits, kind = 0, "counter" if signal.metric.type == "counter" else "gauge"
        fallback = dict(f.labels).get("direction") == "total"
        for name in f.spellings:
            yield Source(name, signal, "dcgm", kind, *f.factors, bits, fallback, f.labels)


def _build() -> dict[str, list[Source]]:
    out: dict[str, list[Source]] = {}
    for signal in SIGNALS:
        if signal.in_truegpu:
            own = Source(signal.metric.name, signal, "truegpu", _truegpu_kind(signal))
            out.setdefault(own.name, []).append(own)
        for src in _dcgm_sources(signal):
            out.setdefault(src.name, []).append(src)
    return out


#: Input metric name -> the signal sources it feeds.
SOURCES: dict[str, list[Source]] = _build()


def _label_filters() -> dict[str, dict[str, tuple[str, ...]]]:
    """truegpu metric -> label -> the values its signals accept (normalize's ``_label_mask``), for every label each
    of its signals filters on: the series a Prometheus read leaves on the server (three of the nine clock-event
    reasons and ECC's aggregate scope, ~8 % of a fleet's series; each costs the server and the analyzer at every
    serve tick, and normalize never reads them)."""
    out = {}
    for name, sources in SOURCES.items():
        own = [dict(s.signal.labels) for s in sources if s.dialect == "truegpu"]
        if own and all(own):
            common = sorted(set.intersection(*(set(labels) for labels in own)))
            out[name] = {k: tuple(sorted({v for labels in own for v in labels[k]})) for k in common}
    return {name: filters for name, filters in out.items() if filters}


#: truegpu metric name -> label -> the values normalize reads (``_label_filters``).
LABEL_FILTERS: dict[str, dict[str, tuple[str, ...]]] = _label_filters()

#: dcgm-exporter framebuffer fields: memory total = FB_USED + FB_FREE + FB_RESERVED (MiB)
#: when FB_TOTAL is not collected (it is not in the default counter list).
FB_USED = S.MEMORY_USED.dcgm[0].field
FB_PARTS: dict[str, str] = {n: base for base in (FB_USED, DCGM_FB_FREE, DCGM_FB_RESERVED)
                             for n in S.dcgm_spellings(base)}
XID_DCGM: frozenset[str] = frozenset(n for f in S.XID_ERRORS.dcgm for n in f.spellings)
#: dcgm-exporter's XID count collector (XIDs within a sliding window, per xid label).
XID_DCGM_COUNT: frozenset[str] = frozenset(S.dcgm_spellings(S.DCGM_XID_COUNT))
#: Per-holder families of shared GPUs (Fleet.shares).
SHARE_METRICS: tuple[S.Metric, ...] = (S.SHARER_UTILIZATION, S.SHARER_MEMORY_USED)
#: Families that are no GPU telemetry rows of their own: identity, placement, who holds a GPU.
INFO_METRICS: tuple[S.Metric, ...] = (S.GPU_INFO, S.NODE_INFO, S.GPU_TOPOLOGY_INFO, S.GPU_ALLOCATION_INFO,
                                      S.SLURM_JOB_INFO, *SHARE_METRICS)


def needed_names() -> frozenset[str]:
    """Every input metric name normalize reads (both dialects, both dcgm spellings)."""
    return (frozenset(SOURCES) | frozenset(FB_PARTS) | XID_DCGM | XID_DCGM_COUNT | {S.XID_ERRORS.name}
            | {m.name for m in INFO_METRICS})


def dialect_of(name: str) -> Dialect | None:
    """Which dialect an input metric name belongs to (None: not GPU telemetry we read)."""
    if name.startswith(S.PREFIX):
        return "truegpu"
    if name in SOURCES or name in FB_PARTS or name in XID_DCGM or name in XID_DCGM_COUNT or \
            name[:8].lower() == "dcgm_fi_":
        return "dcgm"
    return None


_GPM = {S.SM_ACTIVE, S.SM_OCCUPANCY, S.TENSOR_ACTIVE, S.DRAM_ACTIVE, S.GRAPHICS_ENGINE_ACTIVE}
_TRUEGPU_REASON = {
    S.NVLINK_BYTES: "the GPUs have no NVLink (PCIe-only models) or NVML exposes no NVLink counters",
    S.NVLINK_ERRORS: "the GPUs have no NVLink (PCIe-only models)",
    S.NVLINK_LINKS: "the GPUs have no NVLink (PCIe-only models)",
}


def missing_reason(signal: Signal, dialect: Dialect) -> str:
    """One sentence: why ``signal`` is unknown in ``dialect`` input and how to get it."""
    metric = signal.metric
    if dialect == "truegpu":
        if metric in _GPM:
            why = "NVML GPM needs Hopper or newer; run dcgm-exporter alongside"
        elif signal.name == "mem_temp":
            why = "GDDR GPUs have no memory temperature sensor"
        else:
            why = _TRUEGPU_REASON.get(
                metric, "the exporter did not publish it (see truegpu_exporter_errors_total{kind=\"not_supported\"})"
            )
        return f"{signal.name} unknown: {metric.name} absent: {why}"
    fields = [f.field for f in metric.dcgm if _field_matches(signal, f)]
    if not fields:
        return (
            f"{signal.name} unknown: dcgm-exporter has no field for {metric.name}; run the truegpu exporter alongside"
        )
    off = [f for f in fields if f not in DCGM_DEFAULT_FIELDS]
    hint = " (it is commented out in the default list)" if off else ""
    return f"{signal.name} unknown: {' / '.join(fields)} not collected; enable it in dcgm-exporter's counters CSV{hint}"
