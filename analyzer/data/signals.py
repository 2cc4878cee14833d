"""Canonical signals: the columns of the analyzer's tidy frame, each tied to the metric contract.

Every input dialect (truegpu_* and dcgm-exporter's DCGM_FI_*) is normalized into these
columns, in base units, so scores and detectors never see a dialect. A signal names the
contract Metric (and label values) it comes from; the dcgm-exporter spelling follows from
that Metric's DcgmField mappings in exporter/schema.py, never from a string typed here.

Kinds:
- ``gauge``: the value as sampled (ratios 0..1, bytes, watts, celsius, hertz).
- ``rate``: a counter turned into a per-second rate over the step; several label values
  are summed (NVLink tx+rx). dcgm-exporter "rate" fields arrive as rates already.
- ``flag``: a 0/1 gauge combined with max() over its label values (any thermal reason).
- ``last``: a "value of the last event" gauge (dcgm-exporter's last XID): the code it shows, sticky until
  the exporter restarts. truegpu publishes XIDs as counters (events), never as this state.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from exporter import schema as S
from exporter.schema import Metric


@dataclass(frozen=True)
class Signal:
    name: str
    metric: Metric
    kind: Literal["gauge", "rate", "flag", "last"] = "gauge"
    #: Label filter: each label maps to the accepted values (several values are summed or max'ed).
    labels: tuple[tuple[str, tuple[str, ...]], ...] = ()
    unit: str = ""
    help: str = ""

    @property
    def in_truegpu(self) -> bool:
        """Whether truegpu's exporter publishes this signal: not a last-event state, its XIDs are counted
        events (the simulated fleet, a truegpu source and a truegpu "missing" note all follow from it)."""
        return self.kind != "last"


def _one(label: str, *values: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    return ((label, values),)


SIGNALS: tuple[Signal, ...] = (
    Signal("gpu_util", S.GPU_UTILIZATION, unit="ratio", help="kernel resident (nvidia-smi GPU-Util)"),
    Signal("mem_util", S.MEMORY_UTILIZATION, unit="ratio"),
    Signal("sm_active", S.SM_ACTIVE, unit="ratio", help="SMs with a resident warp"),
    Signal("sm_occupancy", S.SM_OCCUPANCY, unit="ratio"),
    Signal("tensor_active", S.TENSOR_ACTIVE, unit="ratio"),
    Signal("dram_active", S.DRAM_ACTIVE, unit="ratio"),
    Signal("gr_active", S.GRAPHICS_ENGINE_ACTIVE, unit="ratio"),
    Signal("mem_used", S.MEMORY_USED, unit="bytes"),
    Signal("mem_total", S.MEMORY_TOTAL, unit="bytes"),
    Signal("power", S.POWER, unit="watts"),
    Signal("power_limit", S.POWER_LIMIT, unit="watts"),
    Signal("temp", S.TEMPERATURE, labels=_one("sensor", "gpu"), unit="celsius"),
    Signal("mem_temp", S.TEMPERATURE, labels=_one("sensor", "memory"), unit="celsius"),
    Signal("sm_clock", S.SM_CLOCK, unit="hertz"),
    Signal("sm_clock_max", S.SM_CLOCK_MAX, unit="hertz"),
    Signal("mem_clock", S.MEMORY_CLOCK, unit="hertz"),
    Signal("thermal_throttle", S.CLOCK_EVENT_ACTIVE, "flag", _one("reason", *S.THERMAL_REASONS)),
    Signal("power_throttle", S.CLOCK_EVENT_ACTIVE, "flag", _one("reason", *S.POWER_REASONS)),
    Signal("idle_clocks", S.CLOCK_EVENT_ACTIVE, "flag", _one("reason", "idle")),
    Signal("nvlink_bps", S.NVLINK_BYTES, "rate", _one("direction", "tx", "rx", "total"), "bytes_per_second"),
    Signal("pcie_bps", S.PCIE_BYTES, "rate", _one("direction", "tx", "rx"), "bytes_per_second"),
    Signal("pcie_gen", S.PCIE_LINK_GENERATION, labels=_one("state", "current")),
    Signal("pcie_gen_max", S.PCIE_LINK_GENERATION, labels=_one("state", "max")),
    Signal("pcie_width", S.PCIE_LINK_WIDTH, labels=_one("state", "current")),
    Signal("pcie_width_max", S.PCIE_LINK_WIDTH, labels=_one("state", "max")),
    Signal("pcie_replay_rate", S.PCIE_REPLAYS, "rate", unit="per_second"),
    Signal("ecc_uncorrectable_rate", S.ECC_ERRORS, "rate",
           (("type", ("uncorrectable",)), ("scope", ("volatile",))), "per_second"),
    Signal("ecc_correctable_rate", S.ECC_ERRORS, "rate",
           (("type", ("correctable",)), ("scope", ("volatile",))), "per_second"),
    Signal("remapped_rows_rate", S.REMAPPED_ROWS, "rate", _one("type", "correctable", "uncorrectable"),
           "per_second"),
    Signal("row_remap_pending", S.ROW_REMAP_PENDING),
    Signal("row_remap_failure", S.ROW_REMAP_FAILURE),
    Signal("last_xid", S.XID_ERRORS, "last", help="the XID code dcgm-exporter's last-XID gauge shows"),
    Signal("nvlink_error_rate", S.NVLINK_ERRORS, "rate", _one("type", *S.NVLINK_ERROR_TYPES), "per_second"),
    Signal("nvlink_links_up", S.NVLINK_LINKS, labels=_one("state", "up")),
    Signal("nvlink_links_down", S.NVLINK_LINKS, labels=_one("state", "down")),
)
BY_NAME: dict[str, Signal] = {s.name: s for s in SIGNALS}
NAMES: tuple[str, ...] = tuple(BY_NAME)

#: Identity and attribution columns of the tidy frame (categoricals), in order.
DEVICE_COLUMNS: tuple[str, ...] = (S.HOSTNAME, S.GPU, S.UUID, S.GPU_INSTANCE, S.MIG_PROFILE, "model")
PLACEMENT_COLUMNS: tuple[str, ...] = ("site", "rack")
ALLOCATION_COLUMNS: tuple[str, ...] = ("namespace", "pod", "container", "job")
#: Frame column -> the allocation info label it comes from (the workload is ``workload`` on the wire).
ALLOCATION_LABELS: dict[str, str] = {"namespace": "namespace", "pod": "pod", "container": "container",
                                     "job": S.WORKLOAD}
#: The inverse (``workload`` -> the frame's ``job``): what an API level or a cost group names.
ALLOCATION_COLUMN_OF: dict[str, str] = {label: col for col, label in ALLOCATION_LABELS.items()}
