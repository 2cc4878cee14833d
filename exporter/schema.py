"""The metric contract: every truegpu metric, its unit and labels, and where it comes from.

Every other part of truegpu (exporter sources, simulator, analyzer, dashboards, alert
rules) imports names from here instead of typing them, so a rename is one edit and a
typo is an ImportError rather than a silently empty panel.

Conventions (Prometheus naming): ratios are 0..1 and end in ``_ratio``; units are base
units (bytes, seconds, hertz, watts, joules, celsius); counters end in ``_total``;
identity that would make hot series unbounded (model, driver, PCI address, pod) lives
in ``*_info`` series with value 1 and is joined in PromQL.

Each metric also records how to obtain it from NVML (``nvml_reads``: declarative recipes the
NVML source executes; ``nvml``: prose for the parts that need hand-written code) and from NVIDIA
dcgm-exporter (``dcgm``, machine-readable field mappings used both to read dcgm-exporter output
and to emit that dialect from the simulator).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, field
from functools import cached_property
from typing import Literal

PREFIX = "truegpu_"

# Label names -----------------------------------------------------------------------
HOSTNAME = "hostname"
GPU = "gpu"
UUID = "uuid"
GPU_INSTANCE = "gpu_instance"
MIG_PROFILE = "mig_profile"
#: Labels that identify one GPU on every per-GPU series.
GPU_LABELS: tuple[str, ...] = (HOSTNAME, GPU, UUID)
#: Extra labels a MIG instance adds to per-GPU series (absent on whole GPUs).
MIG_LABELS: tuple[str, ...] = (GPU_INSTANCE, MIG_PROFILE)
#: The label naming the workload that holds a GPU (a training job, a deployment, a Slurm job id).
#: Not ``job``: that is Prometheus' scrape-job label, and reusing it forces ``honor_labels: true``
#: (which lets a target overwrite ``job`` and ``instance``). Older truegpu data says ``job``
#: (``exported_job`` once Prometheus renamed it); the analyzer still reads both.
WORKLOAD = "workload"
#: The labels Prometheus gives every scrape target: its scrape job and address. Never a workload; one GPU's
#: series under two targets are the same telemetry twice (the exporter in two scrape jobs).
SCRAPE_JOB = "job"
INSTANCE = "instance"
TARGET_LABELS: tuple[str, ...] = (SCRAPE_JOB, INSTANCE)

Scope = Literal["gpu", "node", "exporter"]
MetricType = Literal["gauge", "counter"]
#: How a dcgm-exporter field value becomes a contract value:
#: value   -- multiply by ``scale``;
#: rate    -- a per-second rate (times ``scale``) that must be integrated into a counter;
#: bitmask -- the clock-event bitmask, decoded into one 0/1 series per reason;
#: last    -- "value of the last event" gauge (DCGM_FI_DEV_XID_ERRORS): each change to
#:            a non-zero value counts one event for that code.
DcgmKind = Literal["value", "rate", "bitmask", "last"]


@dataclass(frozen=True)
class DcgmField:
    """One dcgm-exporter field feeding a contract metric.

    ``labels`` are the contract label values this field produces (e.g. the memory
    temperature field sets ``sensor="memory"``). dcgm-exporter 1.x publishes the same
    field in lower case (``dcgm_fi_dev_gpu_temp``) and the oldest ones under short names
    (``dcgm_gpu_temp``): ``spellings`` lists them all.
    """

    field: str
    scale: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()
    kind: DcgmKind = "value"

    @property
    def spellings(self) -> tuple[str, ...]:
        """Every name dcgm-exporter releases gave this field (``dcgm_spellings``)."""
        return dcgm_spellings(self.field)

    @property
    def factors(self) -> tuple[float, float]:
        """(m, d) with ``x * m / d`` the value in base units: a sub-unit scale divides by its exact
        reciprocal, so 57 % is 0.57, not 57 * 0.01 = 0.5700000000000001."""
        if 0 < self.scale < 1 and (1.0 / self.scale) == round(1.0 / self.scale):
            return 1.0, float(round(1.0 / self.scale))
        return self.scale, 1.0


def exact_factors(scale: float) -> tuple[float, float]:
    """(m, d) with ``x * m / d`` the value in base units, a sub-unit scale dividing by its integer
    reciprocal: 57 % is 57 / 100 = 0.57 and 5 ns is 5 / 1e9, not 57 * 0.01 = 0.5700000000000001."""
    if 0 < scale < 1:
        d = round(1.0 / scale)
        if abs(d * scale - 1.0) < 1e-12:
            return 1.0, float(d)
    return scale, 1.0


def _short(x: float) -> str:
    """1000, 1024, 1e6, 1e9: how a person writes a unit factor."""
    return f"{x:g}".replace("e+0", "e").replace("e+", "e")


@dataclass(frozen=True)
class NvmlCall:
    """One pynvml device call, ``name(handle, *args)``, with ``args`` named as pynvml constants.

    ``key`` names the call in error messages and in the NVML source's memory of what a GPU does not
    support (asked once, then never again); calls that stand or fall together share it (the four ECC
    counters ask one driver feature).
    """

    name: str
    args: tuple[str, ...] = ()
    key: str = ""

    def __str__(self) -> str:
        return f"{self.name}({', '.join(self.args)})"


#: How an NVML result becomes a number: the number itself, 1/0 for a truthy/falsy flag, or a list's length.
NvmlConvert = Literal["value", "flag", "count"]


@dataclass(frozen=True)
class NvmlRead:
    """How the NVML source reads one series of a family, kept as data next to the family.

    ``NvmlSource`` executes it and docs/metrics.md prints it, so the recipe and the code cannot drift.
    Either ``call`` (its result, or the attribute or index ``pick`` of it) or ``field`` (an ``NVML_FI_*``
    id, read in the one batched nvmlDeviceGetFieldValues call, summed over NVLinks). The number is
    ``convert``ed, then times ``scale`` to base units; ``true_if`` makes it 1 when the result equals that
    pynvml constant (else 0); a result equal to ``omit_if`` means unknown and is left out. ``once``: a
    property that never changes, read at start-up and republished. ``fallback``: the call asked instead
    once ``call`` proved unsupported (older drivers). ``labels`` are the family labels the series sets.
    Anything needing more logic (bitmasks, GPM, MIG, events, per-link sums) stays hand-written in the
    source and is described in ``Metric.nvml``.
    """

    call: NvmlCall | None = None
    field: str = ""
    pick: str = ""
    scale: float = 1.0
    labels: tuple[tuple[str, str], ...] = ()
    convert: NvmlConvert = "value"
    true_if: str = ""
    omit_if: str = ""
    once: bool = False
    fallback: NvmlCall | None = None

    @cached_property
    def factors(self) -> tuple[float, float]:
        """(m, d) with ``x * m / d`` the value in base units (see ``exact_factors``)."""
        return exact_factors(self.scale)

    @property
    def names(self) -> tuple[str, ...]:
        """Every pynvml function and constant name this recipe uses (all must exist in nvidia-ml-py)."""
        calls = [c for c in (self.call, self.fallback) if c is not None]
        constants = [n for n in (self.field, self.true_if, self.omit_if) if n]
        return (*(n for c in calls for n in (c.name, *c.args)), *constants)

    def describe(self) -> str:
        """The recipe as one line of docs/metrics.md."""
        text = f"field {self.field}" if self.field else str(self.call)
        if self.pick:
            text += f"[{self.pick}]" if self.pick.isdigit() else f".{self.pick}"
        if self.convert == "count":
            text = f"len({text})"
        elif self.convert == "flag":
            text = f"bool({text})"
        if self.true_if:
            text += f" == {self.true_if}"
        m, d = self.factors
        text += f" / {_short(d)}" if d != 1 else f" * {_short(m)}" if m != 1 else ""
        notes = [f"{k}={v}" for k, v in self.labels]
        if self.omit_if:
            notes.append(f"{self.omit_if} left out")
        if self.once:
            notes.append("read once")
        if self.fallback is not None:
            notes.append(f"else {self.fallback}")
        return text + (f" ({', '.join(notes)})" if notes else "")


#: The short names of dcgm-exporter 1.x (NVIDIA gpu-monitoring-tools) -> today's field. Only fields
#: truegpu maps are listed; the other 1.x names (violation counters) are "not in the contract".
DCGM_1X_NAMES: dict[str, str] = {
    "dcgm_sm_clock": "DCGM_FI_DEV_SM_CLOCK", "dcgm_memory_clock": "DCGM_FI_DEV_MEM_CLOCK",
    "dcgm_memory_temp": "DCGM_FI_DEV_MEMORY_TEMP", "dcgm_gpu_temp": "DCGM_FI_DEV_GPU_TEMP",
    "dcgm_power_usage": "DCGM_FI_DEV_POWER_USAGE",
    "dcgm_total_energy_consumption": "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
    "dcgm_pcie_replay_counter": "DCGM_FI_DEV_PCIE_REPLAY_COUNTER",
    "dcgm_gpu_utilization": "DCGM_FI_DEV_GPU_UTIL", "dcgm_mem_copy_utilization": "DCGM_FI_DEV_MEM_COPY_UTIL",
    "dcgm_enc_utilization": "DCGM_FI_DEV_ENC_UTIL", "dcgm_dec_utilization": "DCGM_FI_DEV_DEC_UTIL",
    "dcgm_xid_errors": "DCGM_FI_DEV_XID_ERRORS", "dcgm_fb_free": "DCGM_FI_DEV_FB_FREE",
    "dcgm_fb_used": "DCGM_FI_DEV_FB_USED",
    "dcgm_ecc_sbe_volatile_total": "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "dcgm_ecc_dbe_volatile_total": "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL",
    "dcgm_ecc_sbe_aggregate_total": "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
    "dcgm_ecc_dbe_aggregate_total": "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "dcgm_nvlink_flit_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_data_crc_error_count_total": "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_replay_error_count_total": "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_recovery_error_count_total": "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "dcgm_nvlink_bandwidth_total": "DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL",
    "dcgm_retired_pages_sbe": "DCGM_FI_DEV_RETIRED_SBE", "dcgm_retired_pages_dbe": "DCGM_FI_DEV_RETIRED_DBE",
    "dcgm_retired_pages_pending": "DCGM_FI_DEV_RETIRED_PENDING",
}


def dcgm_spellings(field_name: str) -> tuple[str, ...]:
    """A field's current name, its lower-case spelling (2.x+ builds) and its 1.x short names."""
    return (field_name, field_name.lower(), *(old for old, new in DCGM_1X_NAMES.items() if new == field_name))


#: Ratios may overshoot 1 by this much (rounding in drivers and in dcgm-exporter's percent).
RATIO_TOLERANCE = 0.02
#: Valid range per unit: anything outside is a driver sentinel, an overflow or a bad parse,
#: never a reading. Physical bounds, far from any real GPU, so no real value is dropped.
UNIT_RANGES: dict[str, tuple[float, float]] = {
    "ratio": (0.0, 1.0 + RATIO_TOLERANCE),
    "celsius": (-50.0, 200.0),
    "watts": (0.0, 20_000.0),
    "hertz": (0.0, 1e11),
}
#: Every other family (bytes, counters, counts, info series): non-negative.
DEFAULT_RANGE = (0.0, float("inf"))


@dataclass(frozen=True, eq=False)
class Metric:
    """One metric family of the contract.

    Compared and hashed by identity: every Metric is a module-level singleton here, and
    sources key their samples by Metric on hot paths where hashing all fields would cost.
    ``valid`` overrides the unit's range (``UNIT_RANGES``); values outside ``valid_range``
    or not finite are dropped and counted at the edge (exporter, analyzer ingest).
    """

    name: str
    type: MetricType
    unit: str
    help: str
    labels: tuple[str, ...] = ()
    scope: Scope = "gpu"
    nvml: str = ""
    dcgm: tuple[DcgmField, ...] = field(default=())
    valid: tuple[float, float] | None = None
    nvml_reads: tuple[NvmlRead, ...] = ()

    @property
    def nvml_recipe(self) -> str:
        """How NVML provides the family: its ``nvml_reads`` as text, then the prose of hand-written parts."""
        return "; ".join([*(r.describe() for r in self.nvml_reads), *([self.nvml] if self.nvml else [])])

    @property
    def valid_range(self) -> tuple[float, float]:
        """Inclusive (low, high) bounds of a valid value; counters are never negative."""
        if self.valid is not None:
            return self.valid
        return DEFAULT_RANGE if self.type == "counter" else UNIT_RANGES.get(self.unit, DEFAULT_RANGE)

    def accepts(self, value: float) -> bool:
        """True for a finite value within ``valid_range``."""
        lo, hi = self.valid_range
        return lo <= value <= hi and value - value == 0

    def dcgm_fields(self, **labels: str) -> tuple[DcgmField, ...]:
        """The dcgm-exporter fields whose contract labels agree with ``labels`` (``type="uncorrectable"``)."""
        return tuple(f for f in self.dcgm if all(dict(f.labels).get(k) == v for k, v in labels.items()))

    def dcgm_field(self, **labels: str) -> DcgmField:
        """The first such field; LookupError naming the family when none matches."""
        found = self.dcgm_fields(**labels)
        if not found:
            raise LookupError(f"{self.name} has no dcgm field with {labels}")
        return found[0]

    @property
    def base_labels(self) -> tuple[str, ...]:
        """Identity labels every sample of this family carries (before MIG labels)."""
        return {"gpu": GPU_LABELS, "node": (HOSTNAME,), "exporter": ()}[self.scope]

    @property
    def all_labels(self) -> tuple[str, ...]:
        return self.base_labels + self.labels

    @property
    def family_name(self) -> str:
        """Name without the ``_total`` suffix, as OpenMetrics and prometheus_client want."""
        return self.name.removesuffix("_total") if self.type == "counter" else self.name


# Label values ----------------------------------------------------------------------
#: NVML clocks-event (throttle) reasons: bit -> reason label. Same bits as
#: nvmlClocksEventReason* and DCGM_FI_DEV_CLOCKS_EVENT_REASONS.
CLOCK_EVENT_REASONS: dict[int, str] = {
    0x1: "idle",
    0x2: "applications_clocks_setting",
    0x4: "sw_power_cap",
    0x8: "hw_slowdown",
    0x10: "sync_boost",
    0x20: "sw_thermal",
    0x40: "hw_thermal",
    0x80: "hw_power_brake",
    0x100: "display_clock_setting",
}
#: Reasons that mean the GPU is losing capacity to heat or power.
THERMAL_REASONS = ("sw_thermal", "hw_thermal", "hw_slowdown")
POWER_REASONS = ("sw_power_cap", "hw_power_brake")

TOPOLOGY_LINKS = ("nvlink", "pcie_switch", "host_bridge", "numa", "system")
ECC_TYPES = ("correctable", "uncorrectable")
ECC_SCOPES = ("volatile", "aggregate")
NVLINK_ERROR_TYPES = ("crc_flit", "crc_data", "replay", "recovery")
#: ``cause`` of retired pages: nvmlPageRetirementCause_t MULTIPLE_SINGLE_BIT_ECC_ERRORS (the same address
#: corrected twice) and DOUBLE_BIT_ECC_ERROR, in that (NVML) order.
RETIREMENT_CAUSES = ("single_bit_ecc", "double_bit_ecc")
#: ``availability`` buckets of the row remapper histogram (nvmlRowRemapperHistogramValues_t fields, most
#: spare rows left first).
ROW_REMAP_AVAILABILITY = ("max", "high", "partial", "low", "none")
#: nvmlDeviceGpuRecoveryAction_t (NVML_GPU_RECOVERY_ACTION_*): code -> what the GPU needs to recover.
GPU_RECOVERY_ACTIONS: dict[int, str] = {
    0: "none",
    1: "gpu_reset",
    2: "node_reboot",
    3: "drain_p2p",
    4: "drain_and_reset",
    5: "recover_imex_domain",
    6: "bus_reset",
    7: "system_reboot",
}
DIRECTIONS = ("tx", "rx")

MIB = 1024 * 1024
MHZ = 1e6

_PCT = 0.01

# NVML calls feeding several series: asked once per collection, each series picks its part.
_UTILIZATION = NvmlCall("nvmlDeviceGetUtilizationRates", key="utilization")
_MEMORY_INFO = NvmlCall("nvmlDeviceGetMemoryInfo", ("nvmlMemory_v2",), "memory_v2")
_MEMORY_INFO_V1 = NvmlCall("nvmlDeviceGetMemoryInfo", key="memory")  # drivers before the v2 struct
_REMAPPED_ROWS = NvmlCall("nvmlDeviceGetRemappedRows", key="remapped_rows")  # (corr, unc, pending, failure)
_ROW_REMAPPER_HISTOGRAM = NvmlCall("nvmlDeviceGetRowRemapperHistogram", key="row_remap_histogram")

# Utilization -------------------------------------------------------------------------
GPU_UTILIZATION = Metric(
    "truegpu_gpu_utilization_ratio", "gauge", "ratio",
    "Fraction of the sample period during which at least one kernel was resident "
    "(nvidia-smi 'GPU-Util'); says nothing about how busy the SMs were.",
    nvml_reads=(NvmlRead(_UTILIZATION, pick="gpu", scale=_PCT),),
    dcgm=(DcgmField("DCGM_FI_DEV_GPU_UTIL", _PCT),),
)
ENCODER_UTILIZATION = Metric(
    "truegpu_encoder_utilization_ratio", "gauge", "ratio",
    "Fraction of the sampling period the video encoder (NVENC) was busy (video pipelines, not compute).",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetEncoderUtilization", key="encoder"), pick="0", scale=_PCT),),
    dcgm=(DcgmField("DCGM_FI_DEV_ENC_UTIL", _PCT),),
)
DECODER_UTILIZATION = Metric(
    "truegpu_decoder_utilization_ratio", "gauge", "ratio",
    "Fraction of the sampling period the video decoder (NVDEC) was busy (video pipelines, not compute).",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetDecoderUtilization", key="decoder"), pick="0", scale=_PCT),),
    dcgm=(DcgmField("DCGM_FI_DEV_DEC_UTIL", _PCT),),
)
MEMORY_UTILIZATION = Metric(
    "truegpu_memory_utilization_ratio", "gauge", "ratio",
    "Fraction of the sample period during which device memory was being read or written.",
    nvml_reads=(NvmlRead(_UTILIZATION, pick="memory", scale=_PCT),),
    dcgm=(DcgmField("DCGM_FI_DEV_MEM_COPY_UTIL", _PCT),),
)
SM_ACTIVE = Metric(
    "truegpu_sm_active_ratio", "gauge", "ratio",
    "Fraction of time at least one warp was resident on an SM, averaged over all SMs.",
    nvml="GPM NVML_GPM_METRIC_SM_UTIL / 100 (Hopper+)",
    dcgm=(DcgmField("DCGM_FI_PROF_SM_ACTIVE"),),
)
SM_OCCUPANCY = Metric(
    "truegpu_sm_occupancy_ratio", "gauge", "ratio",
    "Resident warps relative to the maximum an SM can hold, averaged over all SMs.",
    nvml="GPM NVML_GPM_METRIC_SM_OCCUPANCY / 100 (Hopper+)",
    dcgm=(DcgmField("DCGM_FI_PROF_SM_OCCUPANCY"),),
)
TENSOR_ACTIVE = Metric(
    "truegpu_tensor_active_ratio", "gauge", "ratio",
    "Fraction of cycles any tensor-core pipe was active.",
    nvml="GPM NVML_GPM_METRIC_ANY_TENSOR_UTIL / 100 (Hopper+)",
    dcgm=(DcgmField("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE"),),
)
DRAM_ACTIVE = Metric(
    "truegpu_dram_active_ratio", "gauge", "ratio",
    "Fraction of cycles the device memory interface was sending or receiving data.",
    nvml="GPM NVML_GPM_METRIC_DRAM_BW_UTIL / 100 (Hopper+)",
    dcgm=(DcgmField("DCGM_FI_PROF_DRAM_ACTIVE"),),
)
GRAPHICS_ENGINE_ACTIVE = Metric(
    "truegpu_graphics_engine_active_ratio", "gauge", "ratio",
    "Fraction of time the graphics/compute engine was active.",
    nvml="GPM NVML_GPM_METRIC_GRAPHICS_UTIL / 100 (Hopper+)",
    dcgm=(DcgmField("DCGM_FI_PROF_GR_ENGINE_ACTIVE"),),
)

# Memory --------------------------------------------------------------------------------
MEMORY_USED = Metric(
    "truegpu_memory_used_bytes", "gauge", "bytes",
    "Device memory in use.",
    nvml_reads=(NvmlRead(_MEMORY_INFO, pick="used", fallback=_MEMORY_INFO_V1),),
    dcgm=(DcgmField("DCGM_FI_DEV_FB_USED", MIB),),
)
MEMORY_TOTAL = Metric(
    "truegpu_memory_total_bytes", "gauge", "bytes",
    "Device memory installed (dcgm-exporter: FB_TOTAL, or FB_USED+FB_FREE+FB_RESERVED).",
    nvml_reads=(NvmlRead(_MEMORY_INFO, pick="total", fallback=_MEMORY_INFO_V1),),
    dcgm=(DcgmField("DCGM_FI_DEV_FB_TOTAL", MIB),),
)

# Power and heat --------------------------------------------------------------------------
POWER = Metric(
    "truegpu_power_watts", "gauge", "watts",
    "Power draw.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetPowerUsage", key="power"), scale=1e-3),),  # mW
    dcgm=(DcgmField("DCGM_FI_DEV_POWER_USAGE"),),
)
POWER_LIMIT = Metric(
    "truegpu_power_limit_watts", "gauge", "watts",
    "Enforced power limit.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetEnforcedPowerLimit", key="power_limit"), scale=1e-3),),  # mW
    dcgm=(DcgmField("DCGM_FI_DEV_POWER_MGMT_LIMIT"),),
)
ENERGY = Metric(
    "truegpu_energy_joules_total", "counter", "joules",
    "Energy consumed since the driver was loaded.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetTotalEnergyConsumption", key="energy"), scale=1e-3),),  # mJ
    dcgm=(DcgmField("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", 1e-3),),
)
CLOCK_VIOLATION = Metric(
    "truegpu_clock_violation_seconds_total", "counter", "seconds",
    "Time the clocks were held below their target by a power or thermal policy since the driver loaded "
    "(reason=power|thermal): how long throttling really lasted, between scrapes too.",
    labels=("reason",),
    nvml_reads=tuple(
        NvmlRead(
            NvmlCall("nvmlDeviceGetViolationStatus", (f"NVML_PERF_POLICY_{reason.upper()}",), f"violation_{reason}"),
            pick="violationTime", scale=1e-9, labels=(("reason", reason),),  # ns
        )
        for reason in ("power", "thermal")
    ),
    dcgm=(DcgmField("DCGM_FI_DEV_POWER_VIOLATION", 1e-9, (("reason", "power"),)),
          DcgmField("DCGM_FI_DEV_THERMAL_VIOLATION", 1e-9, (("reason", "thermal"),))),
)
FAN_SPEED = Metric(
    "truegpu_fan_speed_ratio", "gauge", "ratio",
    "Fan speed as a share of its maximum; absent on passively cooled data-centre GPUs (the chassis fans "
    "cool them), never 0.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetFanSpeed", key="fan"), scale=_PCT),),  # NOT_SUPPORTED when passive
    dcgm=(DcgmField("DCGM_FI_DEV_FAN_SPEED", _PCT),),
)
PERFORMANCE_STATE = Metric(
    "truegpu_performance_state", "gauge", "",
    "Performance state, 0 (P0: maximum performance) to 15 (P15: minimum); a busy GPU out of P0 is held back.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetPerformanceState", key="pstate"), omit_if="NVML_PSTATE_UNKNOWN"),),
    dcgm=(DcgmField("DCGM_FI_DEV_PSTATE"),),
    valid=(0.0, 15.0),
)
TEMPERATURE = Metric(
    "truegpu_temperature_celsius", "gauge", "celsius",
    "Temperature of the GPU die (sensor=gpu) or of the HBM stacks (sensor=memory).",
    labels=("sensor",),
    nvml_reads=(
        NvmlRead(NvmlCall("nvmlDeviceGetTemperature", ("NVML_TEMPERATURE_GPU",), "temperature"),
                 labels=(("sensor", "gpu"),)),
        NvmlRead(field="NVML_FI_DEV_MEMORY_TEMP", labels=(("sensor", "memory"),)),
    ),
    dcgm=(
        DcgmField("DCGM_FI_DEV_GPU_TEMP", labels=(("sensor", "gpu"),)),
        DcgmField("DCGM_FI_DEV_MEMORY_TEMP", labels=(("sensor", "memory"),)),
    ),
)

# Clocks --------------------------------------------------------------------------------
SM_CLOCK = Metric(
    "truegpu_sm_clock_hertz", "gauge", "hertz",
    "Current SM clock.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetClockInfo", ("NVML_CLOCK_SM",), "sm_clock"), scale=MHZ),),
    dcgm=(DcgmField("DCGM_FI_DEV_SM_CLOCK", MHZ),),
)
SM_CLOCK_MAX = Metric(
    "truegpu_sm_clock_max_hertz", "gauge", "hertz",
    "Maximum SM clock the GPU can run at; SM clock / this is the capacity not lost to throttling.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetMaxClockInfo", ("NVML_CLOCK_SM",), "max_sm_clock"), scale=MHZ,
                         once=True),),
    dcgm=(DcgmField("DCGM_FI_DEV_MAX_SM_CLOCK", MHZ),),
)
MEMORY_CLOCK = Metric(
    "truegpu_memory_clock_hertz", "gauge", "hertz",
    "Current memory clock.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetClockInfo", ("NVML_CLOCK_MEM",), "mem_clock"), scale=MHZ),),
    dcgm=(DcgmField("DCGM_FI_DEV_MEM_CLOCK", MHZ),),
)
CLOCK_EVENT_ACTIVE = Metric(
    "truegpu_clock_event_active", "gauge", "",
    "1 while the clock-event (throttle) reason is active, else 0; one series per reason.",
    labels=("reason",),
    nvml="nvmlDeviceGetCurrentClocksEventReasons() bitmask, see CLOCK_EVENT_REASONS",
    dcgm=(
        DcgmField("DCGM_FI_DEV_CLOCKS_EVENT_REASONS", kind="bitmask"),
        DcgmField("DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", kind="bitmask"),
    ),
    valid=(0.0, 1.0),
)

# Interconnect ----------------------------------------------------------------------------
NVLINK_BYTES = Metric(
    "truegpu_nvlink_bytes_total", "counter", "bytes",
    "NVLink data transferred, all links. direction=tx|rx; a source that only knows the "
    "sum (dcgm-exporter NVLINK_BANDWIDTH_TOTAL) publishes direction=total instead.",
    labels=("direction",),
    nvml_reads=tuple(
        NvmlRead(field=f"NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_{d.upper()}", scale=1024.0,  # KiB
                 labels=(("direction", d),))
        for d in DIRECTIONS
    ),
    nvml="without those fields: GPM NVML_GPM_METRIC_NVLINK_TOTAL_TX/RX_PER_SEC integrated",
    dcgm=(
        DcgmField("DCGM_FI_PROF_NVLINK_TX_BYTES", labels=(("direction", "tx"),), kind="rate"),
        DcgmField("DCGM_FI_PROF_NVLINK_RX_BYTES", labels=(("direction", "rx"),), kind="rate"),
        # Declared a counter but really a TX+RX rate in ~MiB/s that goes up and down.
        DcgmField("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", MIB, (("direction", "total"),), "rate"),
    ),
)
PCIE_BYTES = Metric(
    "truegpu_pcie_bytes_total", "counter", "bytes",
    "PCIe data transferred. direction=tx|rx.",
    labels=("direction",),
    nvml="nvmlDeviceGetPcieThroughput(NVML_PCIE_UTIL_TX/RX_BYTES) KiB/s integrated, or GPM PCIE_TX/RX_PER_SEC",
    dcgm=(
        DcgmField("DCGM_FI_PROF_PCIE_TX_BYTES", labels=(("direction", "tx"),), kind="rate"),
        DcgmField("DCGM_FI_PROF_PCIE_RX_BYTES", labels=(("direction", "rx"),), kind="rate"),
    ),
)
PCIE_LINK_GENERATION = Metric(
    "truegpu_pcie_link_generation", "gauge", "",
    "PCIe link generation, state=current|max; current below max is a degraded link "
    "(or an idle GPU saving power).",
    labels=("state",),
    nvml_reads=(
        NvmlRead(NvmlCall("nvmlDeviceGetCurrPcieLinkGeneration", key="pcie_gen"), labels=(("state", "current"),)),
        NvmlRead(NvmlCall("nvmlDeviceGetMaxPcieLinkGeneration", key="pcie_gen_max"), labels=(("state", "max"),),
                 once=True),
    ),
    dcgm=(
        DcgmField("DCGM_FI_DEV_PCIE_LINK_GEN", labels=(("state", "current"),)),
        DcgmField("DCGM_FI_DEV_PCIE_MAX_LINK_GEN", labels=(("state", "max"),)),
    ),
    valid=(0.0, 16.0),
)
PCIE_LINK_WIDTH = Metric(
    "truegpu_pcie_link_width", "gauge", "",
    "PCIe link width in lanes, state=current|max.",
    labels=("state",),
    nvml_reads=(
        NvmlRead(NvmlCall("nvmlDeviceGetCurrPcieLinkWidth", key="pcie_width"), labels=(("state", "current"),)),
        NvmlRead(NvmlCall("nvmlDeviceGetMaxPcieLinkWidth", key="pcie_width_max"), labels=(("state", "max"),),
                 once=True),
    ),
    dcgm=(
        DcgmField("DCGM_FI_DEV_PCIE_LINK_WIDTH", labels=(("state", "current"),)),
        DcgmField("DCGM_FI_DEV_PCIE_MAX_LINK_WIDTH", labels=(("state", "max"),)),
    ),
    valid=(0.0, 64.0),
)
PCIE_REPLAYS = Metric(
    "truegpu_pcie_replays_total", "counter", "",
    "PCIe link-level replays (retries); growth means a marginal link.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetPcieReplayCounter", key="pcie_replays")),),
    dcgm=(DcgmField("DCGM_FI_DEV_PCIE_REPLAY_COUNTER"),),
)

# Errors --------------------------------------------------------------------------------
XID_ERRORS = Metric(
    "truegpu_xid_errors_total", "counter", "",
    "XID error events by XID code.",
    labels=("xid",),
    nvml="nvmlEventSet with nvmlEventTypeXidCriticalError, counted per eventData",
    dcgm=(DcgmField("DCGM_FI_DEV_XID_ERRORS", kind="last"),),
)
ECC_ERRORS = Metric(
    "truegpu_ecc_errors_total", "counter", "",
    "ECC errors, type=correctable|uncorrectable, scope=volatile (since driver load)|"
    "aggregate (lifetime).",
    labels=("type", "scope"),
    nvml_reads=tuple(
        NvmlRead(
            NvmlCall("nvmlDeviceGetTotalEccErrors",
                     (f"NVML_MEMORY_ERROR_TYPE_{error}", f"NVML_{scope.upper()}_ECC"), "ecc"),
            labels=(("type", kind), ("scope", scope)),
        )
        for scope in ECC_SCOPES
        for error, kind in zip(("CORRECTED", "UNCORRECTED"), ECC_TYPES, strict=True)
    ),
    dcgm=(
        DcgmField("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", labels=(("type", "correctable"), ("scope", "volatile"))),
        DcgmField("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", labels=(("type", "uncorrectable"), ("scope", "volatile"))),
        DcgmField("DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", labels=(("type", "correctable"), ("scope", "aggregate"))),
        DcgmField("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL", labels=(("type", "uncorrectable"), ("scope", "aggregate"))),
    ),
)
REMAPPED_ROWS = Metric(
    "truegpu_remapped_rows_total", "counter", "",
    "HBM rows remapped to spares, type=correctable|uncorrectable.",
    labels=("type",),
    nvml_reads=tuple(
        NvmlRead(_REMAPPED_ROWS, pick=str(i), labels=(("type", kind),)) for i, kind in enumerate(ECC_TYPES)
    ),
    dcgm=(
        DcgmField("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", labels=(("type", "correctable"),)),
        DcgmField("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", labels=(("type", "uncorrectable"),)),
    ),
)
ROW_REMAP_PENDING = Metric(
    "truegpu_row_remap_pending", "gauge", "",
    "1 when a row remap is pending and the GPU needs a reset to apply it.",
    nvml_reads=(NvmlRead(_REMAPPED_ROWS, pick="2", convert="flag"),),
    dcgm=(DcgmField("DCGM_FI_DEV_ROW_REMAP_PENDING"),),
    valid=(0.0, 1.0),
)
ROW_REMAP_FAILURE = Metric(
    "truegpu_row_remap_failure", "gauge", "",
    "1 when row remapping failed (no spare rows left): the GPU should be replaced.",
    nvml_reads=(NvmlRead(_REMAPPED_ROWS, pick="3", convert="flag"),),
    dcgm=(DcgmField("DCGM_FI_DEV_ROW_REMAP_FAILURE"),),
    valid=(0.0, 1.0),
)
ROW_REMAP_BANKS = Metric(
    "truegpu_row_remap_banks", "gauge", "",
    "Memory banks by the spare rows they have left for row remapping (Ampere and newer), "
    "availability=max (every spare left)|high|partial|low|none (no spare left: the next row to fail "
    "there cannot be remapped). Banks moving towards none foretell a row-remap failure.",
    labels=("availability",),
    nvml_reads=tuple(
        NvmlRead(_ROW_REMAPPER_HISTOGRAM, pick=bucket, labels=(("availability", bucket),))
        for bucket in ROW_REMAP_AVAILABILITY
    ),
    dcgm=(
        DcgmField("DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_MAX", labels=(("availability", "max"),)),
        DcgmField("DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_HIGH", labels=(("availability", "high"),)),
        DcgmField("DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_PARTIAL", labels=(("availability", "partial"),)),
        DcgmField("DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_LOW", labels=(("availability", "low"),)),
        DcgmField("DCGM_FI_DEV_BANKS_REMAP_ROWS_AVAIL_NONE", labels=(("availability", "none"),)),
    ),
)
RETIRED_PAGES = Metric(
    "truegpu_retired_pages_total", "counter", "",
    "Device-memory pages retired by dynamic page retirement, a lifetime count kept in the InfoROM "
    "(pending ones included), cause=single_bit_ecc (the same address corrected twice)|double_bit_ecc. "
    "Before Ampere only: newer GPUs remap rows instead (truegpu_remapped_rows_total) and omit it.",
    labels=("cause",),
    nvml_reads=tuple(
        NvmlRead(NvmlCall("nvmlDeviceGetRetiredPages", (f"NVML_PAGE_RETIREMENT_CAUSE_{cause}",), "retired_pages"),
                 convert="count", labels=(("cause", label),))
        for cause, label in zip(("MULTIPLE_SINGLE_BIT_ECC_ERRORS", "DOUBLE_BIT_ECC_ERROR"), RETIREMENT_CAUSES,
                                strict=True)
    ),
    dcgm=(
        DcgmField("DCGM_FI_DEV_RETIRED_SBE", labels=(("cause", "single_bit_ecc"),)),
        DcgmField("DCGM_FI_DEV_RETIRED_DBE", labels=(("cause", "double_bit_ecc"),)),
    ),
)
RETIRED_PAGES_PENDING = Metric(
    "truegpu_retired_pages_pending", "gauge", "",
    "1 when retired pages are pending: they are set aside only once the GPU is reset or the driver "
    "reloaded. Before Ampere only.",
    nvml_reads=(NvmlRead(NvmlCall("nvmlDeviceGetRetiredPagesPendingStatus", key="retired_pages_pending"),
                         true_if="NVML_FEATURE_ENABLED"),),
    dcgm=(DcgmField("DCGM_FI_DEV_RETIRED_PENDING"),),
    valid=(0.0, 1.0),
)
GPU_RECOVERY_ACTION = Metric(
    "truegpu_gpu_recovery_action", "gauge", "",
    "What the driver says this GPU needs before it can be trusted again, as the code of "
    "nvmlDeviceGpuRecoveryAction_t: "
    + ", ".join(f"{code} {action}" for code, action in GPU_RECOVERY_ACTIONS.items())
    + "; any other non-zero code is an action newer than this contract. Absent where the driver "
    "or GPU does not report it.",
    nvml_reads=(NvmlRead(field="NVML_FI_DEV_GET_GPU_RECOVERY_ACTION"),),
    dcgm=(DcgmField("DCGM_FI_DEV_GET_GPU_RECOVERY_ACTION"),),
    valid=(0.0, 255.0),
)
NVLINK_ERRORS = Metric(
    "truegpu_nvlink_errors_total", "counter", "",
    "NVLink errors summed over links, type=crc_flit|crc_data|replay|recovery.",
    labels=("type",),
    nvml_reads=tuple(
        NvmlRead(field=f"NVML_FI_DEV_NVLINK_{name}_ERROR_COUNT_TOTAL", labels=(("type", kind),))
        for name, kind in zip(("CRC_FLIT", "CRC_DATA", "REPLAY", "RECOVERY"), NVLINK_ERROR_TYPES, strict=True)
    ),
    nvml="without those fields: nvmlDeviceGetNvLinkErrorCounter(link, NVML_NVLINK_ERROR_DL_*) summed over links",
    dcgm=(
        DcgmField("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL", labels=(("type", "crc_flit"),)),
        DcgmField("DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL", labels=(("type", "crc_data"),)),
        DcgmField("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", labels=(("type", "replay"),)),
        DcgmField("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL", labels=(("type", "recovery"),)),
    ),
)
NVLINK_LINKS = Metric(
    "truegpu_nvlink_links", "gauge", "",
    "Number of NVLink links in each state, state=up|down.",
    labels=("state",),
    nvml="nvmlDeviceGetNvLinkState(link) over NVML_NVLINK_MAX_LINKS",
)

# Identity ------------------------------------------------------------------------------
GPU_INFO = Metric(
    "truegpu_gpu_info", "gauge", "",
    "Static identity of a GPU (value 1); join on hostname, gpu, uuid.",
    labels=("model", "driver_version", "pci_bus_id", "numa_node"),
    nvml="nvmlDeviceGetName, nvmlSystemGetDriverVersion, nvmlDeviceGetPciInfo, "
    "nvmlDeviceGetNumaNodeId (sysfs fallback)",
    dcgm=(),
)
GPU_TOPOLOGY_INFO = Metric(
    "truegpu_gpu_topology_info", "gauge", "",
    "Closest link between two GPUs of a node (value 1), link=" + "|".join(TOPOLOGY_LINKS) + ".",
    labels=("peer_gpu", "link"),
    nvml="nvmlDeviceGetTopologyCommonAncestor and NVLink remote PCI info",
)
GPU_ALLOCATION_INFO = Metric(
    "truegpu_gpu_allocation_info", "gauge", "",
    "Who holds the GPU (value 1); absent while the GPU is unallocated. workload: the training job, "
    "deployment or Slurm job id the pod belongs to.",
    labels=("namespace", "pod", "container", WORKLOAD),
    nvml="running compute processes joined with the kubelet pod-resources API / Slurm",
)
SLURM_JOB_INFO = Metric(
    "truegpu_slurm_job_info", "gauge", "",
    "Slurm accounting of the job holding the GPU (value 1), from the job-mapping files the prolog writes: "
    "its user, account and partition; absent where the prolog does not write them.",
    labels=(WORKLOAD, "user", "account", "partition"),
    nvml="the Slurm prolog's job-mapping file (JOBID user=... account=... partition=...)",
)
#: Per-holder use of a GPU several pods or jobs hold at once (Kubernetes time-slicing or MPS replicas,
#: Slurm jobs sharing a GPU): published only for such GPUs, one series per holder. The holder with empty
#: namespace/pod/container/workload stands for processes no holder could be found for (a PID of another
#: PID namespace, a process that exited between the two NVML calls): never spread over the others.
SHARER_UTILIZATION = Metric(
    "truegpu_gpu_sharer_utilization_ratio", "gauge", "ratio",
    "Fraction of the scrape interval a kernel of this holder's processes ran on a shared GPU (the per-process "
    "share of GPU utilization, summed over the holder's processes).",
    labels=GPU_ALLOCATION_INFO.labels,  # the holder, as allocation info names one
    nvml="nvmlDeviceGetProcessUtilization smUtil / 100, mean of the samples since the last scrape, per PID of "
         "nvmlDeviceGetComputeRunningProcesses / nvmlDeviceGetMPSComputeRunningProcesses, PIDs joined with "
         "their pod or Slurm job through /proc/<pid>",
)
SHARER_MEMORY_USED = Metric(
    "truegpu_gpu_sharer_memory_used_bytes", "gauge", "bytes",
    "GPU memory this holder's processes use on a shared GPU.",
    labels=GPU_ALLOCATION_INFO.labels,
    nvml="usedGpuMemory of nvmlDeviceGetComputeRunningProcesses / nvmlDeviceGetMPSComputeRunningProcesses "
         "entries, summed per holder",
)
NODE_INFO = Metric(
    "truegpu_node_info", "gauge", "",
    "Where a node sits (value 1): site (data centre or zone) and rack.",
    labels=("site", "rack"),
    scope="node",
)

# Exporter self-metrics -----------------------------------------------------------------
SOURCE_UP = Metric(
    "truegpu_exporter_source_up", "gauge", "",
    "1 when the source's last collection succeeded for every GPU, else 0.",
    labels=("source",), scope="exporter",
    valid=(0.0, 1.0),
)
COLLECT_DURATION = Metric(
    "truegpu_exporter_collect_duration_seconds", "gauge", "seconds",
    "Time the source's last collection took.",
    labels=("source",), scope="exporter",
)
EXPORTER_ERRORS = Metric(
    "truegpu_exporter_errors_total", "counter", "",
    "Collection errors by source and kind (gpu_lost, not_supported, timeout, source_failed, ...).",
    labels=("source", "kind"), scope="exporter",
)

SOURCE_STALE = Metric(
    "truegpu_exporter_source_stale", "gauge", "",
    "1 while the exporter serves a source's last good values because a collection overran its deadline.",
    labels=("source",), scope="exporter",
    valid=(0.0, 1.0),
)
SOURCE_LAST_SUCCESS = Metric(
    "truegpu_exporter_source_last_success_timestamp_seconds", "gauge", "seconds",
    "Unix time of the source's last complete collection.",
    labels=("source",), scope="exporter",
)
SOURCE_IGNORED_SERIES = Metric(
    "truegpu_exporter_ignored_series", "gauge", "",
    "Series the source read in its last collection but did not publish, by input field and reason "
    "(not_in_contract: a field truegpu does not map; duplicate: the same series twice in one page, the "
    "first value kept; blank: DCGM's not-supported marker, NaN or Inf, i.e. unknown; partial: e.g. FB_FREE "
    "without FB_USED, so no total). Absent when nothing was left out.",
    labels=("source", "field", "reason"), scope="exporter",
)
GPM_SUPPORTED = Metric(
    "truegpu_gpm_supported", "gauge", "",
    "1 when NVML GPM profiling (SM activity, occupancy, tensor, DRAM) works on this GPU, 0 when it "
    "does not (pre-Hopper, vGPU): then NVML cannot provide those families (dcgm-exporter may).",
    nvml="nvmlGpmQueryDeviceSupport().isSupportedDevice",
    valid=(0.0, 1.0),
)

METRICS: tuple[Metric, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Metric))
#: Families NVML and DCGM report per MIG instance (its memory and its share of the SMs); every other
#: GPU family is a property of the whole GPU, published once per GPU even where dcgm-exporter repeats
#: it on each instance's line (summing those would count a GPU's power or energy once per instance).
PER_MIG_INSTANCE: frozenset[Metric] = frozenset({
    MEMORY_USED, MEMORY_TOTAL, SM_ACTIVE, SM_OCCUPANCY, TENSOR_ACTIVE, DRAM_ACTIVE, GRAPHICS_ENGINE_ACTIVE,
})
BY_NAME: dict[str, Metric] = {m.name: m for m in METRICS}
#: Families the exporter itself produces about its sources; a source never emits these.
SELF_METRICS: tuple[Metric, ...] = (
    SOURCE_UP, COLLECT_DURATION, EXPORTER_ERRORS, SOURCE_STALE, SOURCE_LAST_SUCCESS, SOURCE_IGNORED_SERIES,
)
#: dcgm-exporter field name (current upper-case and 1.x lower-case spelling) -> where it goes.
DCGM_BY_FIELD: dict[str, tuple[Metric, DcgmField]] = {
    name: (m, f) for m in METRICS for f in m.dcgm for name in f.spellings
}



def dcgm_valid_range(field_name: str) -> tuple[float, float] | None:
    """Valid range of a dcgm-exporter field as dcgm-exporter prints it (before ``scale``)."""
    hit = DCGM_BY_FIELD.get(field_name)
    if hit is None:
        return None
    metric, f = hit
    if f.kind != "value":  # rates, bitmasks and last-XID codes: non-negative
        return DEFAULT_RANGE
    lo, hi = metric.valid_range
    return (lo / f.scale, hi / f.scale) if f.scale > 0 else DEFAULT_RANGE


def valid_range_of(name: str) -> tuple[float, float] | None:
    """Valid range of a sample of ``name`` (a contract family or its sample name, or a dcgm field)."""
    m = BY_NAME.get(name) or BY_NAME.get(name + "_total")
    return m.valid_range if m is not None else dcgm_valid_range(name)


# dcgm-exporter facts -----------------------------------------------------------------
def dcgm_field(metric: Metric, **labels: str) -> DcgmField:
    """The DcgmField of ``metric`` whose contract labels are exactly ``labels``."""
    want = tuple(sorted(labels.items()))
    for f in metric.dcgm:
        if tuple(sorted(f.labels)) == want:
            return f
    raise KeyError(f"{metric.name} has no dcgm field with labels {labels}")


#: Fields not in the contract that dcgm-exporter exposes by default and that we can derive:
#: free and reserved framebuffer (FB_USED + FB_FREE + FB_RESERVED = FB_TOTAL), since
#: FB_TOTAL itself is not enabled by default and memory capacity would otherwise be lost.
DCGM_FB_FREE = "DCGM_FI_DEV_FB_FREE"
DCGM_FB_RESERVED = "DCGM_FI_DEV_FB_RESERVED"
#: A dcgm-exporter DaemonSet pod's name (``<daemonset>-<5-character hash>``): what the host label holds
#: where dcgm-exporter runs without the node's name, so node history splits whenever the DaemonSet rolls.
DCGM_EXPORTER_POD = re.compile(r"(?:[a-z0-9-]+-)?dcgm-exporter-[a-z0-9]{5}")
#: kube-state-metrics: a node's GPU capacity (the device plugin's ``nvidia.com/gpu``, keyed by ``node``).
KUBE_NODE_CAPACITY = "kube_node_status_capacity"
KUBE_GPU_RESOURCE = "nvidia_com_gpu"
#: kube-state-metrics' ``kube_pod_info{namespace, pod, node, host_ip, ...} 1`` (one series per pod):
#: the analyzer maps a DCGM_EXPORTER_POD host back to the node the pod ran on.
KUBE_POD_INFO = "kube_pod_info"
KUBE_POD_INFO_POD = "pod"
KUBE_POD_INFO_NODE = "node"
#: kube-state-metrics' ``kube_node_labels{node, label_<label>="..."} 1``: the node labels it is allowed to
#: export (``--metric-labels-allowlist=nodes=[topology.kubernetes.io/zone]``: KUBE_NODE_ZONE). Its zone is a
#: node's site where no truegpu node info names one (dcgm-exporter input), as OpenCost reads a node's zone.
KUBE_NODE_LABELS = "kube_node_labels"
KUBE_NODE_LABELS_NODE = "node"
#: The Kubernetes node label of a node's zone, and its kube_node_labels spellings, current first
#: (failure-domain.beta.kubernetes.io/zone before Kubernetes 1.17).
KUBE_NODE_ZONE = "topology.kubernetes.io/zone"
KUBE_NODE_ZONE_LABELS = ("label_topology_kubernetes_io_zone", "label_failure_domain_beta_kubernetes_io_zone")
#: dcgm-exporter's XID count collector (when enabled): XIDs within a sliding window, one series per
#: ``xid`` label. Unlike the last-XID gauge, it sees the same XID repeating.
DCGM_XID_COUNT = "DCGM_EXP_XID_ERRORS_COUNT"

#: Mapped fields dcgm-exporter enables by default: its etc/default-counters.csv (and
#: dcp-metrics-included.csv), uncommented lines only. Not enabled there, hence absent from
#: most users' data: DCGM_FI_PROF_SM_ACTIVE, DCGM_FI_PROF_SM_OCCUPANCY, ECC, NVLink error
#: counters, clock-event (throttle) reasons, FB_TOTAL, power limit, max clocks, PCIe link
#: state, retired pages, the row-remap histogram, the GPU recovery action. Also default but
#: outside the contract (never emitted): ENC/DEC_UTIL, VGPU_LICENSE_STATUS.
DCGM_DEFAULT_FIELDS: frozenset[str] = frozenset(
    {
        dcgm_field(SM_CLOCK).field,
        dcgm_field(MEMORY_CLOCK).field,
        dcgm_field(TEMPERATURE, sensor="memory").field,
        dcgm_field(TEMPERATURE, sensor="gpu").field,
        dcgm_field(POWER).field,
        dcgm_field(ENERGY).field,
        dcgm_field(PCIE_REPLAYS).field,
        dcgm_field(GPU_UTILIZATION).field,
        dcgm_field(MEMORY_UTILIZATION).field,
        dcgm_field(XID_ERRORS).field,
        dcgm_field(MEMORY_USED).field,
        DCGM_FB_FREE,
        DCGM_FB_RESERVED,
        dcgm_field(NVLINK_BYTES, direction="total").field,
        dcgm_field(REMAPPED_ROWS, type="uncorrectable").field,
        dcgm_field(REMAPPED_ROWS, type="correctable").field,
        dcgm_field(ROW_REMAP_FAILURE).field,
        dcgm_field(GRAPHICS_ENGINE_ACTIVE).field,
        dcgm_field(TENSOR_ACTIVE).field,
        dcgm_field(DRAM_ACTIVE).field,
        dcgm_field(PCIE_BYTES, direction="tx").field,
        dcgm_field(PCIE_BYTES, direction="rx").field,
    }
)


# dcgm-exporter sentinels -----------------------------------------------------------------
#: DCGM prints "blank" values (no data, not found, not supported, not permissioned) as magic
#: numbers just above each type's blank constant (dcgm_structs.h DCGM_*_BLANK .. +3). The
#: int64 ones all round to 2**63 once parsed as float. They mean "unknown", never a value.
DCGM_SENTINEL_RANGES: tuple[tuple[float, float], ...] = (
    (float(0x7FFFFFF0), float(0x7FFFFFF3)),  # DCGM_INT32_BLANK .. NOT_PERMISSIONED
    (140737488355328.0, 140737488355331.0),  # DCGM_FP64_BLANK .. NOT_PERMISSIONED
    (float(0x7FFFFFFFFFFFFFF0), sys.float_info.max),  # DCGM_INT64_BLANK and up; +Inf is no marker: out of range
)


def is_dcgm_sentinel(value: float) -> bool:
    """True when a dcgm-exporter value is one of DCGM's blank/not-supported markers."""
    return any(lo <= value <= hi for lo, hi in DCGM_SENTINEL_RANGES)
