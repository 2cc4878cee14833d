"""NVIDIA XID catalogue: what an XID code means, how bad it is and what to do about it.

XIDs are the NVIDIA driver's error reports (kernel log ``NVRM: Xid``, NVML/DCGM
``DCGM_FI_DEV_XID_ERRORS``). Meanings and recommended actions follow NVIDIA's "XID
Errors" documentation (docs.nvidia.com/deploy/xid-errors) and the GPU memory error
management guide (row remapping on A100/H100). Severity is the analyzer's own triage:

- ``critical``: the GPU cannot be trusted or used until someone acts (uncontained or
  double-bit memory errors, a GPU that fell off the bus, a failed row remap, firmware
  halted): drain it.
- ``warning``: a hardware problem that degrades the GPU or needs a reset at the next
  opportunity (contained ECC error, a recorded row remap, NVLink errors).
- ``info``: usually the *application's* fault (illegal memory access, a kernel exception):
  the GPU is fine; the job owner should look at the job's logs. Reported so that a burst
  of them across many jobs on one GPU can still be noticed, never as a hardware fault.

Codes not in the catalogue are reported as ``warning`` with "see NVIDIA's XID table":
an unknown driver error is worth a look but not a page.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

Severity = Literal["critical", "warning", "info"]


@dataclass(frozen=True)
class Xid:
    code: int
    name: str
    severity: Severity
    #: "hardware" (the GPU or its links), "driver" (driver/firmware; reset usually clears it) or
    #: "application" (the job's own bug).
    category: Literal["hardware", "driver", "application"]
    action: str


_RESET = "drain the node and reset the GPU (nvidia-smi -r or reboot)"
_APP = "application error: check the job's logs (illegal address, bad kernel); the GPU itself is fine"

CATALOGUE: dict[int, Xid] = {x.code: x for x in (
    Xid(8, "GPU stopped processing (timeout)", "warning", "driver", _RESET + " if it repeats"),
    Xid(13, "graphics engine exception", "info", "application", _APP),
    Xid(31, "GPU memory page fault", "info", "application", _APP),
    Xid(32, "invalid or corrupted push buffer stream", "warning", "driver",
        "check the PCIe link and driver version; " + _RESET + " if it repeats"),
    Xid(38, "driver firmware error", "warning", "driver", _RESET + "; update the driver if it repeats"),
    Xid(43, "GPU stopped processing (channel reset)", "info", "application", _APP),
    Xid(45, "preemptive cleanup after previous errors", "info", "application",
        "usually an application error's follow-up (a killed process): look at the XID before it"),
    Xid(48, "double-bit ECC error", "critical", "hardware",
        _RESET + " to apply the row remap; RMA if uncorrectable errors recur"),
    Xid(61, "internal micro-controller breakpoint/warning", "warning", "driver", _RESET),
    Xid(62, "internal micro-controller halt", "critical", "driver", _RESET),
    Xid(63, "row remapping event recorded", "warning", "hardware",
        "schedule a GPU reset to apply the pending row remap (no data lost)"),
    Xid(64, "row remapping failure", "critical", "hardware",
        "drain the GPU and RMA it: memory errors can no longer be remapped"),
    Xid(68, "video decoder (NVDEC) exception", "warning", "driver", _RESET + " if it repeats"),
    Xid(69, "graphics engine class error", "warning", "driver", _RESET + " if it repeats"),
    Xid(74, "NVLink error", "warning", "hardware",
        _RESET + "; if it repeats check/reseat the NVLink bridge or baseboard, then RMA"),
    Xid(79, "GPU has fallen off the bus", "critical", "hardware",
        _RESET + "; if it falls off again reseat it, check riser/PCIe slot and power, then RMA"),
    Xid(92, "high single-bit ECC error rate", "warning", "hardware",
        "watch the GPU's ECC counters; reset to trigger row remapping, RMA if the rate stays high"),
    Xid(94, "contained ECC error", "warning", "hardware",
        "the affected process was killed; reset the GPU when drained to apply the row remap"),
    Xid(95, "uncontained ECC error", "critical", "hardware",
        _RESET + " now: every process on it may have read corrupted memory"),
    Xid(109, "context switch timeout", "warning", "driver", _RESET + " if it repeats"),
    Xid(119, "GSP RPC timeout", "critical", "driver", _RESET + "; update the driver/firmware if it repeats"),
    Xid(120, "GSP error", "critical", "driver", _RESET + "; update the driver/firmware if it repeats"),
    Xid(121, "C2C (chip-to-chip) link error", "warning", "hardware", _RESET + "; RMA if it repeats"),
    Xid(140, "unrecovered ECC error", "critical", "hardware", _RESET + "; RMA if it recurs"),
)}

#: Memory faults that kill the process and leave the GPU awaiting a reset (to apply the row remap, or to be
#: trusted again): its owner's pod may hold it idle meanwhile, a fault to fix, not waste to release.
RESET_PENDING_XIDS: frozenset[int] = frozenset({48, 94, 95})
#: Codes that are usually the application's bug, not the GPU's.
APPLICATION_XIDS: frozenset[int] = frozenset(c for c, x in CATALOGUE.items() if x.category == "application")


def describe(code: int) -> Xid:
    """The catalogue entry for ``code``; unknown codes are a ``warning`` pointing to NVIDIA's table."""
    known = CATALOGUE.get(int(code))
    if known is not None:
        return known
    return Xid(int(code), "unknown XID", "warning", "driver",
               "look the code up in NVIDIA's XID table (docs.nvidia.com/deploy/xid-errors)")


__all__ = ["APPLICATION_XIDS", "CATALOGUE", "RESET_PENDING_XIDS", "Xid", "describe"]
