"""A fake ``pynvml`` that behaves like the real binding on machines without a GPU.

Only the functions that would reach ``libnvidia-ml`` are faked. Everything else (constants,
ctypes structs, the NVMLError class hierarchy) is the installed real ``pynvml``, so the
source under test catches exactly the exception classes it would catch in production and
reads exactly the struct fields the real library returns. Handles, event sets and GPM
samples are real ctypes pointers (opaque, never dereferenced), like the real ones.

Faked behaviour that matters for the exporter:
- per-call ``NVMLError_NotSupported`` (``FakeGpu.not_supported``) and per-field
  ``nvmlReturn`` NOT_SUPPORTED in ``nvmlDeviceGetFieldValues`` (memory temperature, recovery action),
  or any per-field return code (``field_returns``);
- memory health by architecture (``FakeGpu.architecture``): page retirement
  (``nvmlDeviceGetRetiredPages``, ``...PendingStatus``) before Ampere, the row remapper
  (``nvmlDeviceGetRemappedRows``, ``nvmlDeviceGetRowRemapperHistogram``) from Ampere on; the other
  generation's calls raise ``NVMLError_NotSupported``, as the real driver does;
- a GPU that falls off the bus after N device calls (``lost_after``): every later call on it
  raises ``NVMLError_GpuIsLost`` and XID 79 is delivered to registered event sets;
- slow calls (``slow``: sleep seconds) and gated calls (``gate``: block until released);
- XID / double-bit-ECC events through ``nvmlEventSetWait_v2`` with a real timeout
  (``NVMLError_Timeout``) and injectable wait errors;
- GPM samples taken at the fake's clock and metrics computed from the two samples given;
- MIG devices behind ``nvmlDeviceGetMigDeviceHandleByIndex``;
- processes (``FakeGpu.processes``, MPS clients in ``FakeGpu.mps_processes``; memory None: NVML's
  NVML_VALUE_NOT_AVAILABLE, which the binding turns into None) and the driver's per-process utilization
  samples (``FakeNvml.process_ran``): one per sample period with a non-zero utilization, timestamped in
  microseconds of the fake's clock, kept for ``PROCESS_SAMPLE_SPAN`` seconds and at most
  ``PROCESS_SAMPLE_BUFFER`` of them; ``nvmlDeviceGetProcessUtilization`` raises ``NVMLError_NotFound``
  when none is newer than the timestamp asked;
- unversioned calls as the binding wraps them (``throwOnVersionMismatch``): a driver without the
  versioned function makes them raise ``NVMLLibraryMismatchError``;
- no library / no driver at ``nvmlInit``.

Call ``FakeNvml(...).module`` to get the module object to hand to the source.
"""

from __future__ import annotations

import collections
import ctypes
import inspect
import threading
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field

import pynvml as real

UINT_MAX = 0xFFFFFFFF
GIB = 1024**3
MIB = 1024**2

#: NVLink error-total fields -> the per-link counter they sum.
_NVLINK_ERROR_FIELDS = {
    real.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL: real.NVML_NVLINK_ERROR_DL_CRC_FLIT,
    real.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL: real.NVML_NVLINK_ERROR_DL_CRC_DATA,
    real.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL: real.NVML_NVLINK_ERROR_DL_REPLAY,
    real.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL: real.NVML_NVLINK_ERROR_DL_RECOVERY,
}
#: Pure helpers of the real binding that never touch the library: kept as they are.
_PURE = {"nvmlStructToFriendlyObject", "nvmlFriendlyObjectToStruct", "nvmlExceptionClass"}
#: The driver's per-process utilization sampling: a sample per process per period (seconds), kept this long
#: (seconds) and at most this many per GPU (a ring buffer: the oldest go first).
PROCESS_SAMPLE_PERIOD = 1 / 6
PROCESS_SAMPLE_SPAN = 20.0
PROCESS_SAMPLE_BUFFER = 1000
_NOT_AVAILABLE = real.NVML_VALUE_NOT_AVAILABLE_ulonglong.value


def _error(code: int) -> real.NVMLError:
    """The real binding's exception for an NVML return code (NVMLError maps it to its subclass)."""
    return real.NVMLError(code)


def _ptr(kind: type, address: int) -> ctypes._Pointer:
    """An opaque handle of the real ctypes pointer type with a chosen, never-dereferenced address."""
    return ctypes.cast(ctypes.c_void_p(address), kind)


def _addr(pointer: object) -> int:
    return ctypes.cast(pointer, ctypes.c_void_p).value or 0


@dataclass
class FakeLink:
    """One NVLink of a GPU: where it goes, its state, error counters and traffic (KiB)."""

    remote_bus_id: str
    remote_type: int = real.NVML_NVLINK_DEVICE_TYPE_SWITCH
    active: bool = True
    errors: dict[int, int] = field(default_factory=dict)  # NVML_NVLINK_ERROR_DL_* -> count
    tx_kib: int = 0
    rx_kib: int = 0


@dataclass
class FakeMig:
    """One MIG device (GPU instance + compute instance) of a MIG-enabled GPU."""

    gi_id: int
    profile: str
    uuid: str
    mem_total: int
    mem_used: int = 0
    gpm: dict[int, float] = field(default_factory=dict)


@dataclass
class FakeGpu:
    """Everything the fake reports for one physical GPU (NVML units: MHz, mW, mJ, KB/s, %)."""

    name: str
    uuid: str
    bus_id: str
    numa_node: int | None = 0  # None: nvmlDeviceGetNumaNodeId is NotSupported (use sysfs)
    hostbridge: int = 0
    pcie_switch: int = 0
    gpm_supported: bool = True
    mig_capable: bool = True
    util_gpu: int = 0
    util_mem: int = 0
    #: NVENC/NVDEC busy percent; None: the GPU has no video engine (A100/H100 PCIe have NVDEC only).
    util_enc: int | None = 0
    util_dec: int | None = 0
    mem_total: int = 80 * GIB
    mem_reserved: int = 512 * MIB
    mem_used: int = 0
    power_mw: int = 70_000
    power_limit_mw: int = 700_000
    energy_mj: int = 0
    temp_gpu: int = 35
    #: Fan percent; None: passively cooled (SXM/OAM modules), nvmlDeviceGetFanSpeed is NOT_SUPPORTED.
    fan_pct: int | None = None
    pstate: int = 0  # NVML_PSTATE_UNKNOWN (32) is what some drivers answer for a GPU they cannot read
    #: perf policy (real.NVML_PERF_POLICY_*) -> violation nanoseconds since the driver loaded.
    violation_ns: dict[int, int] = field(default_factory=dict)
    temp_mem: int | None = 40  # None: field NVML_FI_DEV_MEMORY_TEMP answers NOT_SUPPORTED
    sm_clock: int = 1980
    mem_clock: int = 2619
    max_sm_clock: int = 1980
    clock_reasons: int = 0
    pcie_tx_kbps: int = 0
    pcie_rx_kbps: int = 0
    pcie_gen: int = 5
    pcie_gen_max: int = 5
    pcie_width: int = 16
    pcie_width_max: int = 16
    pcie_replays: int = 0
    ecc: dict[tuple[int, int], int] = field(default_factory=dict)  # (error type, counter type) -> count
    #: nvmlDeviceGetArchitecture; decides which memory-health calls are supported (see the module doc).
    architecture: int = real.NVML_DEVICE_ARCH_HOPPER
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)  # corr, unc, pending, failure
    #: Banks per spare-row availability: max, high, partial, low, none (nvmlRowRemapperHistogramValues_t).
    remap_histogram: tuple[int, int, int, int, int] = (10240, 0, 0, 0, 0)
    #: NVML_PAGE_RETIREMENT_CAUSE_* -> addresses of the pages retired for it (pre-Ampere only).
    retired_pages: dict[int, list[int]] = field(default_factory=dict)
    retired_pending: bool = False
    #: NVML_GPU_RECOVERY_ACTION_* the field NVML_FI_DEV_GET_GPU_RECOVERY_ACTION answers; None: NOT_SUPPORTED
    #: (a GPU or driver without it).
    recovery_action: int | None = real.NVML_GPU_RECOVERY_ACTION_NONE
    nvlinks: list[FakeLink] = field(default_factory=list)
    gpm: dict[int, float] = field(default_factory=dict)  # NVML_GPM_METRIC_* -> value
    mig: list[FakeMig] = field(default_factory=list)  # non-empty: MIG mode on
    processes: list[tuple[int, int | None, int]] = field(default_factory=list)  # pid, used bytes (None: N/A), gi id
    mps_processes: list[tuple[int, int | None, int]] = field(default_factory=list)  # MPS clients, same form
    #: The driver's per-process utilization samples: (time us, pid, smUtil, memUtil), oldest first.
    process_samples: list[tuple[int, int, int, int]] = field(default_factory=list)
    #: Accounting mode (``nvidia-smi -am 1``; off by default) and its per-PID stats: pid -> (gpuUtilization %
    #: over the process's lifetime, maxMemoryUsage bytes); a PID not in it is NOT_FOUND, as the driver answers.
    accounting: bool = False
    accounting_stats: dict[int, tuple[int, int]] = field(default_factory=dict)
    not_supported: set[str] = field(default_factory=set)  # function names raising NotSupported
    unsupported_fields: set[int] = field(default_factory=set)  # NVML_FI_* answering NOT_SUPPORTED
    field_returns: dict[int, int] = field(default_factory=dict)  # NVML_FI_* -> the nvmlReturn it answers
    fields_asked: list[int] = field(default_factory=list)  # every NVML_FI_* requested, in order
    raises: dict[str, BaseException] = field(default_factory=dict)  # function name -> exception
    slow: dict[str, float] = field(default_factory=dict)  # function name -> seconds it sleeps
    gate: threading.Event | None = None  # when set up: calls in gated_calls wait for it
    gated_calls: set[str] = field(default_factory=set)
    lost_after: int | None = None  # device calls after which the GPU falls off the bus
    calls: int = 0
    lost: bool = False
    call_counts: collections.Counter = field(default_factory=collections.Counter)


class FakeNvml:
    """The fake library state plus every faked ``pynvml`` function, same names and signatures."""

    def __init__(
        self,
        gpus: list[FakeGpu],
        *,
        driver_version: str = "550.54.15",
        clock: Callable[[], float] = time.monotonic,
        library_found: bool = True,
        driver_loaded: bool = True,
    ) -> None:
        self.gpus = gpus
        self.driver_version = driver_version
        self.clock = clock
        self.library_found = library_found
        self.driver_loaded = driver_loaded
        self.init_count = 0
        self.init_attempts = 0
        self._lock = threading.Lock()
        self._events = threading.Condition(self._lock)
        self._next_addr = 0x10_0000
        self._handles = [_ptr(real.c_nvmlDevice_t, 0x1000 + 0x100 * i) for i in range(len(gpus))]
        self._handle_ids = {id(h): i for i, h in enumerate(self._handles)}  # fast path: our own objects
        self._mig_handles: dict[int, tuple[int, int]] = {}  # address -> (gpu index, mig position)
        self._event_sets: dict[int, dict] = {}
        self.wait_errors: collections.deque[int] = collections.deque()  # codes the next waits raise
        self.samples: dict[int, tuple | None] = {}  # GPM sample address -> (gpu, gi, time, values)
        self.metrics_calls: list[tuple[float, float]] = []  # (sample1 time, sample2 time) per call
        self.module = self._build_module()

    # -- module plumbing -----------------------------------------------------------------
    def _build_module(self) -> types.ModuleType:
        module = types.ModuleType("pynvml", "fake pynvml (tests/exporter/fakes/fake_pynvml.py)")
        module.__dict__.update({k: v for k, v in vars(real).items() if not k.startswith("__")})
        for name, value in vars(real).items():
            if name.startswith("nvml") and inspect.isfunction(value) and name not in _PURE:
                module.__dict__[name] = self._missing(name)
        for name in dir(type(self)):
            if name.startswith("nvml"):
                module.__dict__[name] = getattr(self, name)
        return module

    @staticmethod
    def _missing(name: str) -> Callable[..., object]:
        def missing(*args: object, **kwargs: object) -> object:
            raise _error(real.NVML_ERROR_FUNCTION_NOT_FOUND)

        missing.__name__ = name
        return missing

    def _new_addr(self) -> int:
        with self._lock:
            self._next_addr += 0x10
            return self._next_addr

    def _check_init(self) -> None:
        if self.init_count <= 0:
            raise _error(real.NVML_ERROR_UNINITIALIZED)

    def _gpu_index(self, handle: object) -> int:
        index = self._handle_ids.get(id(handle))
        if index is not None:
            return index
        address = _addr(handle)
        for i, h in enumerate(self._handles):
            if _addr(h) == address:
                return i
        raise _error(real.NVML_ERROR_INVALID_ARGUMENT)

    def _enter(self, gpu: FakeGpu, fn: str) -> None:
        """Per-call behaviour shared by every device function: lost, gated, slow, unsupported."""
        self._check_init()
        if gpu.lost:
            raise _error(real.NVML_ERROR_GPU_IS_LOST)
        gpu.calls += 1
        gpu.call_counts[fn] += 1
        if gpu.lost_after is not None and gpu.calls > gpu.lost_after:
            gpu.lost = True
            self._deliver(self.gpus.index(gpu), real.nvmlEventTypeXidCriticalError, 79)
            raise _error(real.NVML_ERROR_GPU_IS_LOST)
        if gpu.gate is not None and fn in gpu.gated_calls:
            gpu.gate.wait()
        if fn in gpu.slow:
            time.sleep(gpu.slow[fn])
        if fn in gpu.raises:
            raise gpu.raises[fn]
        if fn in gpu.not_supported:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)

    def _dev(self, handle: object, fn: str) -> FakeGpu:
        """The physical GPU behind a (non-MIG) handle."""
        self._check_init()
        index = self._handle_ids.get(id(handle))
        if index is None:
            if _addr(handle) in self._mig_handles:
                raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
            index = self._gpu_index(handle)
        gpu = self.gpus[index]
        self._enter(gpu, fn)
        return gpu

    def _any(self, handle: object, fn: str) -> tuple[FakeGpu, FakeMig | None]:
        """A GPU or MIG handle -> (physical GPU, MIG device or None)."""
        self._check_init()
        address = None if id(handle) in self._handle_ids else _addr(handle)
        if address in self._mig_handles:
            gi, pos = self._mig_handles[address]
            gpu = self.gpus[gi]
            self._enter(gpu, fn)
            if pos >= len(gpu.mig):
                raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
            return gpu, gpu.mig[pos]
        return self._dev(handle, fn), None

    # -- init ---------------------------------------------------------------------------------
    def nvmlInit(self) -> None:
        self.nvmlInitWithFlags(0)

    def nvmlInitWithFlags(self, flags: int) -> None:
        self.init_attempts += 1
        if not self.library_found:
            raise _error(real.NVML_ERROR_LIBRARY_NOT_FOUND)
        if not self.driver_loaded:
            raise _error(real.NVML_ERROR_DRIVER_NOT_LOADED)
        self.init_count += 1

    def nvmlShutdown(self) -> None:
        self._check_init()
        self.init_count -= 1

    def nvmlSystemGetDriverVersion(self) -> str:
        self._check_init()
        return self.driver_version

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> object:
        self._check_init()
        if not 0 <= index < len(self.gpus):
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._handles[index]

    def nvmlDeviceGetIndex(self, handle: object) -> int:
        self._dev(handle, "nvmlDeviceGetIndex")
        return self._gpu_index(handle)

    # -- identity -----------------------------------------------------------------------------
    def nvmlDeviceGetName(self, handle: object) -> str:
        gpu, mig = self._any(handle, "nvmlDeviceGetName")
        return f"{gpu.name} MIG {mig.profile}" if mig else gpu.name

    def nvmlDeviceGetUUID(self, handle: object) -> str:
        gpu, mig = self._any(handle, "nvmlDeviceGetUUID")
        return mig.uuid if mig else gpu.uuid

    def nvmlDeviceGetPciInfo_v3(self, handle: object) -> real.nvmlPciInfo_t:
        gpu = self._dev(handle, "nvmlDeviceGetPciInfo_v3")
        return _pci_info(gpu.bus_id)

    def nvmlDeviceGetPciInfo(self, handle: object) -> real.nvmlPciInfo_t:
        return self.nvmlDeviceGetPciInfo_v3(handle)

    def nvmlDeviceGetNumaNodeId(self, handle: object) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetNumaNodeId")
        if gpu.numa_node is None:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.numa_node

    # -- utilization, memory, power, temperature -----------------------------------------------
    def nvmlDeviceGetUtilizationRates(self, handle: object) -> real.c_nvmlUtilization_t:
        gpu = self._dev(handle, "nvmlDeviceGetUtilizationRates")
        if gpu.mig:  # NVML does not report utilization of a GPU in MIG mode
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        util = real.c_nvmlUtilization_t()
        util.gpu, util.memory = gpu.util_gpu, gpu.util_mem
        return util

    def _video(self, handle: object, fn: str, attr: str) -> list[int]:
        """[utilization %, sampling period us], as pynvml returns it; NOT_SUPPORTED without the engine."""
        gpu = self._dev(handle, fn)
        value = getattr(gpu, attr)
        if value is None or gpu.mig:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return [value, 167000]

    def nvmlDeviceGetEncoderUtilization(self, handle: object) -> list[int]:
        return self._video(handle, "nvmlDeviceGetEncoderUtilization", "util_enc")

    def nvmlDeviceGetDecoderUtilization(self, handle: object) -> list[int]:
        return self._video(handle, "nvmlDeviceGetDecoderUtilization", "util_dec")

    def nvmlDeviceGetMemoryInfo(self, handle: object, version: int | None = None) -> object:
        gpu, mig = self._any(handle, "nvmlDeviceGetMemoryInfo")
        total, used = (mig.mem_total, mig.mem_used) if mig else (gpu.mem_total, gpu.mem_used)
        reserved = 0 if mig else gpu.mem_reserved
        if not version:
            mem = real.c_nvmlMemory_t()
            mem.total, mem.used, mem.free = total, used + reserved, total - used - reserved
            return mem
        if version != real.nvmlMemory_v2:
            raise _error(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        mem = real.c_nvmlMemory_v2_t()
        mem.version = version
        mem.total, mem.reserved, mem.used, mem.free = total, reserved, used, total - used - reserved
        return mem

    def nvmlDeviceGetPowerUsage(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetPowerUsage").power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetEnforcedPowerLimit").power_limit_mw

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetTotalEnergyConsumption").energy_mj

    def nvmlDeviceGetFanSpeed(self, handle: object) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetFanSpeed")
        if gpu.fan_pct is None:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu.fan_pct

    def nvmlDeviceGetPerformanceState(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetPerformanceState").pstate

    def nvmlDeviceGetViolationStatus(self, device: object, perfPolicyType: int) -> real.c_nvmlViolationTime_t:
        gpu = self._dev(device, "nvmlDeviceGetViolationStatus")
        if perfPolicyType not in range(real.NVML_PERF_POLICY_COUNT):
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        out = real.c_nvmlViolationTime_t()
        out.referenceTime = int(self.clock() * 1e6)
        out.violationTime = gpu.violation_ns.get(perfPolicyType, 0)
        return out

    def nvmlDeviceGetTemperature(self, handle: object, sensor: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTemperature")
        if sensor != real.NVML_TEMPERATURE_GPU:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.temp_gpu

    def nvmlDeviceGetFieldValues(self, handle: object, fieldIds: list) -> ctypes.Array:
        gpu = self._dev(handle, "nvmlDeviceGetFieldValues")
        values = (real.c_nvmlFieldValue_t * len(fieldIds))()
        now_us = int(self.clock() * 1e6)
        for i, fid in enumerate(fieldIds):
            fid, scope = fid if isinstance(fid, tuple) else (fid, 0)
            v = values[i]
            v.fieldId, v.scopeId, v.timestamp = fid, scope, now_us
            gpu.fields_asked.append(fid)
            if fid in gpu.field_returns:
                v.nvmlReturn = gpu.field_returns[fid]
                continue
            value = None if fid in gpu.unsupported_fields else self._field(gpu, fid, scope)
            if value is None:
                v.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
                continue
            v.nvmlReturn = real.NVML_SUCCESS
            if fid in (real.NVML_FI_DEV_MEMORY_TEMP, real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION):
                v.valueType, v.value.uiVal = real.NVML_VALUE_TYPE_UNSIGNED_INT, value
            else:
                v.valueType, v.value.ullVal = real.NVML_VALUE_TYPE_UNSIGNED_LONG_LONG, value
        return values

    @staticmethod
    def _field(gpu: FakeGpu, fid: int, scope: int) -> int | None:
        if fid == real.NVML_FI_DEV_MEMORY_TEMP:
            return gpu.temp_mem
        if fid == real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION:
            return gpu.recovery_action
        if fid in _NVLINK_ERROR_FIELDS:
            return sum(link.errors.get(_NVLINK_ERROR_FIELDS[fid], 0) for link in gpu.nvlinks) if gpu.nvlinks else None
        if fid in (real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX, real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX):
            if not gpu.nvlinks:
                return None
            attr = "tx_kib" if fid == real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX else "rx_kib"
            if scope == UINT_MAX:
                return sum(getattr(link, attr) for link in gpu.nvlinks)
            return getattr(gpu.nvlinks[scope], attr) if scope < len(gpu.nvlinks) else None
        return None

    # -- clocks --------------------------------------------------------------------------------
    def nvmlDeviceGetClockInfo(self, handle: object, type: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetClockInfo")
        return {real.NVML_CLOCK_SM: gpu.sm_clock, real.NVML_CLOCK_MEM: gpu.mem_clock}[type]

    def nvmlDeviceGetMaxClockInfo(self, handle: object, type: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetMaxClockInfo")
        return {real.NVML_CLOCK_SM: gpu.max_sm_clock, real.NVML_CLOCK_MEM: gpu.mem_clock}[type]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksEventReasons").clock_reasons

    def nvmlDeviceGetCurrentClocksThrottleReasons(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrentClocksThrottleReasons").clock_reasons

    # -- PCIe ------------------------------------------------------------------------------------
    def nvmlDeviceGetPcieThroughput(self, device: object, counter: int) -> int:
        gpu = self._dev(device, "nvmlDeviceGetPcieThroughput")
        return {real.NVML_PCIE_UTIL_TX_BYTES: gpu.pcie_tx_kbps, real.NVML_PCIE_UTIL_RX_BYTES: gpu.pcie_rx_kbps}[
            counter
        ]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrPcieLinkGeneration").pcie_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetMaxPcieLinkGeneration").pcie_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetCurrPcieLinkWidth").pcie_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetMaxPcieLinkWidth").pcie_width_max

    def nvmlDeviceGetPcieReplayCounter(self, handle: object) -> int:
        return self._dev(handle, "nvmlDeviceGetPcieReplayCounter").pcie_replays

    # -- ECC and row remapping ---------------------------------------------------------------
    def nvmlDeviceGetTotalEccErrors(self, handle: object, errorType: int, counterType: int) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetTotalEccErrors")
        return gpu.ecc.get((errorType, counterType), 0)

    def nvmlDeviceGetArchitecture(self, device: object) -> int:
        return self._dev(device, "nvmlDeviceGetArchitecture").architecture

    def _row_remapper(self, device: object, fn: str) -> FakeGpu:
        """Row remapping replaced page retirement with Ampere: NOT_SUPPORTED on older GPUs."""
        gpu = self._dev(device, fn)
        if gpu.architecture < real.NVML_DEVICE_ARCH_AMPERE:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def _page_retirement(self, device: object, fn: str) -> FakeGpu:
        """Dynamic page retirement (Kepler to Turing): NOT_SUPPORTED from Ampere on."""
        gpu = self._dev(device, fn)
        if gpu.architecture >= real.NVML_DEVICE_ARCH_AMPERE:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return gpu

    def nvmlDeviceGetRemappedRows(self, device: object) -> tuple[int, int, int, int]:
        return self._row_remapper(device, "nvmlDeviceGetRemappedRows").remapped_rows

    def nvmlDeviceGetRowRemapperHistogram(self, device: object) -> real.c_nvmlRowRemapperHistogramValues:
        gpu = self._row_remapper(device, "nvmlDeviceGetRowRemapperHistogram")
        values = real.c_nvmlRowRemapperHistogramValues()
        values.max, values.high, values.partial, values.low, values.none = gpu.remap_histogram
        return values

    def nvmlDeviceGetRetiredPages(self, device: object, sourceFilter: int) -> list[int]:
        """Addresses of the pages retired for one cause, as the binding returns them (a list of ints)."""
        gpu = self._page_retirement(device, "nvmlDeviceGetRetiredPages")
        if sourceFilter not in range(real.NVML_PAGE_RETIREMENT_CAUSE_COUNT):
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return [int(a) for a in gpu.retired_pages.get(sourceFilter, [])]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, device: object) -> int:
        gpu = self._page_retirement(device, "nvmlDeviceGetRetiredPagesPendingStatus")
        return real.NVML_FEATURE_ENABLED if gpu.retired_pending else real.NVML_FEATURE_DISABLED

    # -- NVLink and topology -------------------------------------------------------------------
    def _link(self, device: object, link: int, fn: str) -> FakeLink:
        gpu = self._dev(device, fn)
        if not gpu.nvlinks:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        if not 0 <= link < len(gpu.nvlinks):
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return gpu.nvlinks[link]

    def nvmlDeviceGetNvLinkState(self, device: object, link: int) -> int:
        return int(self._link(device, link, "nvmlDeviceGetNvLinkState").active)

    def nvmlDeviceGetNvLinkErrorCounter(self, device: object, link: int, counter: int) -> int:
        return self._link(device, link, "nvmlDeviceGetNvLinkErrorCounter").errors.get(counter, 0)

    def nvmlDeviceGetNvLinkRemotePciInfo(self, device: object, link: int) -> real.nvmlPciInfo_t:
        return _pci_info(self._link(device, link, "nvmlDeviceGetNvLinkRemotePciInfo").remote_bus_id)

    def nvmlDeviceGetNvLinkRemoteDeviceType(self, handle: object, link: int) -> int:
        return self._link(handle, link, "nvmlDeviceGetNvLinkRemoteDeviceType").remote_type

    def nvmlDeviceGetTopologyCommonAncestor(self, device1: object, device2: object) -> int:
        a = self._dev(device1, "nvmlDeviceGetTopologyCommonAncestor")
        b = self._dev(device2, "nvmlDeviceGetTopologyCommonAncestor")
        if a is b:
            return real.NVML_TOPOLOGY_INTERNAL
        if a.numa_node != b.numa_node:
            return real.NVML_TOPOLOGY_SYSTEM
        if a.hostbridge != b.hostbridge:
            return real.NVML_TOPOLOGY_NODE
        if a.pcie_switch != b.pcie_switch:
            return real.NVML_TOPOLOGY_HOSTBRIDGE
        return real.NVML_TOPOLOGY_SINGLE

    def nvmlDeviceGetP2PStatus(self, device1: object, device2: object, p2pIndex: int) -> int:
        a = self._dev(device1, "nvmlDeviceGetP2PStatus")
        b = self._dev(device2, "nvmlDeviceGetP2PStatus")
        if p2pIndex != real.NVML_P2P_CAPS_INDEX_NVLINK:
            return real.NVML_P2P_STATUS_OK
        switch = real.NVML_NVLINK_DEVICE_TYPE_SWITCH
        switched = {x.remote_bus_id for x in a.nvlinks if x.active and x.remote_type == switch} & {
            x.remote_bus_id for x in b.nvlinks if x.active
        }
        direct = any(link.active and link.remote_bus_id == b.bus_id for link in a.nvlinks)
        return real.NVML_P2P_STATUS_OK if switched or direct else real.NVML_P2P_STATUS_NOT_SUPPORTED

    # -- MIG -------------------------------------------------------------------------------------
    def nvmlDeviceGetMigMode(self, device: object) -> list[int]:
        gpu = self._dev(device, "nvmlDeviceGetMigMode")
        if not gpu.mig_capable:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        mode = real.NVML_DEVICE_MIG_ENABLE if gpu.mig else real.NVML_DEVICE_MIG_DISABLE
        return [mode, mode]

    def nvmlDeviceGetMaxMigDeviceCount(self, device: object) -> int:
        gpu = self._dev(device, "nvmlDeviceGetMaxMigDeviceCount")
        return 7 if gpu.mig else 0

    def nvmlDeviceGetMigDeviceHandleByIndex(self, device: object, index: int) -> object:
        index_gpu = self._gpu_index(device)
        gpu = self._dev(device, "nvmlDeviceGetMigDeviceHandleByIndex")
        if not gpu.mig_capable:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        if not gpu.mig:  # MIG-capable, MIG off: NotFound, as a real H200 (driver 580.159.04) answers
            raise _error(real.NVML_ERROR_NOT_FOUND)
        if not 0 <= index < 7:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        if index >= len(gpu.mig):
            raise _error(real.NVML_ERROR_NOT_FOUND)
        address = 0x8000_0000 + 0x100 * index_gpu + 0x10 * index
        self._mig_handles[address] = (index_gpu, index)
        return _ptr(real.c_nvmlDevice_t, address)

    def nvmlDeviceGetGpuInstanceId(self, device: object) -> int:
        _gpu, mig = self._any(device, "nvmlDeviceGetGpuInstanceId")
        if mig is None:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return mig.gi_id

    def nvmlDeviceIsMigDeviceHandle(self, device: object) -> int:
        _gpu, mig = self._any(device, "nvmlDeviceIsMigDeviceHandle")
        return int(mig is not None)

    # -- processes ---------------------------------------------------------------------------------
    def nvmlDeviceGetComputeRunningProcesses_v3(self, handle: object) -> list:
        gpu = self._dev(handle, "nvmlDeviceGetComputeRunningProcesses_v3")
        return _process_infos(gpu, gpu.processes)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: object) -> list:
        return _unversioned(self.nvmlDeviceGetComputeRunningProcesses_v3, handle)

    def nvmlDeviceGetMPSComputeRunningProcesses_v3(self, handle: object) -> list:
        gpu = self._dev(handle, "nvmlDeviceGetMPSComputeRunningProcesses_v3")
        return _process_infos(gpu, gpu.mps_processes)

    def nvmlDeviceGetMPSComputeRunningProcesses(self, handle: object) -> list:
        return _unversioned(self.nvmlDeviceGetMPSComputeRunningProcesses_v3, handle)

    def nvmlDeviceGetProcessUtilization(self, handle: object, timeStamp: int) -> list:
        """The samples newer than ``timeStamp`` (us), as the binding returns them: a list of structs."""
        gpu = self._dev(handle, "nvmlDeviceGetProcessUtilization")
        if gpu.mig:  # no per-process utilization in MIG mode
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        self._expire_samples(gpu)
        newer = [s for s in gpu.process_samples if s[0] > timeStamp]
        if not newer:
            raise _error(real.NVML_ERROR_NOT_FOUND)
        out = []
        for when, pid, sm, mem in newer:
            sample = real.c_nvmlProcessUtilizationSample_t()
            sample.pid, sample.timeStamp, sample.smUtil, sample.memUtil = pid, when, sm, mem
            sample.encUtil = sample.decUtil = 0
            out.append(sample)
        return out

    def nvmlDeviceGetAccountingMode(self, handle: object) -> int:
        gpu = self._dev(handle, "nvmlDeviceGetAccountingMode")
        return real.NVML_FEATURE_ENABLED if gpu.accounting else real.NVML_FEATURE_DISABLED

    def nvmlDeviceGetAccountingStats(self, handle: object, pid: int) -> real.c_nvmlAccountingStats_t:
        gpu = self._dev(handle, "nvmlDeviceGetAccountingStats")
        if not gpu.accounting or pid not in gpu.accounting_stats:
            raise _error(real.NVML_ERROR_NOT_FOUND)
        stats = real.c_nvmlAccountingStats_t()
        stats.gpuUtilization, stats.maxMemoryUsage = gpu.accounting_stats[pid]
        stats.isRunning = 1  # time stays 0 while the process runs, as NVML reports it
        return stats

    def _expire_samples(self, gpu: FakeGpu) -> None:
        """The driver keeps the last PROCESS_SAMPLE_SPAN seconds, at most PROCESS_SAMPLE_BUFFER samples."""
        oldest = int((self.clock() - PROCESS_SAMPLE_SPAN) * 1e6)
        gpu.process_samples = [s for s in gpu.process_samples if s[0] >= oldest][-PROCESS_SAMPLE_BUFFER:]

    # -- GPM -------------------------------------------------------------------------------------
    def nvmlGpmQueryDeviceSupport(self, device: object) -> real.c_nvmlGpmSupport_t:
        gpu = self._dev(device, "nvmlGpmQueryDeviceSupport")
        support = real.c_nvmlGpmSupport_t()
        support.version = real.NVML_GPM_SUPPORT_VERSION
        support.isSupportedDevice = int(gpu.gpm_supported)
        return support

    def nvmlGpmSampleAlloc(self) -> object:
        self._check_init()
        address = self._new_addr()
        self.samples[address] = None
        return _ptr(real.c_nvmlGpmSample_t, address)

    def nvmlGpmSampleFree(self, gpmSample: object) -> None:
        self._check_init()
        if self.samples.pop(_addr(gpmSample), "absent") == "absent":
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)

    def _store(self, sample: object, key: tuple, values: dict[int, float]) -> object:
        address = _addr(sample)
        if address not in self.samples:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        self.samples[address] = (key, self.clock(), dict(values))
        return sample

    def nvmlGpmSampleGet(self, device: object, gpmSample: object) -> object:
        gpu = self._dev(device, "nvmlGpmSampleGet")
        if not gpu.gpm_supported:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        return self._store(gpmSample, (self.gpus.index(gpu), None), gpu.gpm)

    def nvmlGpmMigSampleGet(self, device: object, gpuInstanceId: int, gpmSample: object) -> object:
        gpu = self._dev(device, "nvmlGpmMigSampleGet")
        if not gpu.gpm_supported:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        mig = next((m for m in gpu.mig if m.gi_id == gpuInstanceId), None)
        if mig is None:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        return self._store(gpmSample, (self.gpus.index(gpu), gpuInstanceId), mig.gpm)

    def nvmlGpmMetricsGet(self, metricsGet: real.c_nvmlGpmMetricsGet_t) -> real.c_nvmlGpmMetricsGet_t:
        """Metrics over the interval between the two samples: the values the second one carries."""
        self._check_init()
        if metricsGet.version != real.NVML_GPM_METRICS_GET_VERSION:
            raise _error(real.NVML_ERROR_ARGUMENT_VERSION_MISMATCH)
        first = self.samples.get(_addr(metricsGet.sample1))
        second = self.samples.get(_addr(metricsGet.sample2))
        if first is None or second is None or first[0] != second[0] or second[1] < first[1]:
            raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
        gpu = self.gpus[second[0][0]]
        self._enter(gpu, "nvmlGpmMetricsGet")
        self.metrics_calls.append((first[1], second[1]))
        values = second[2]
        for i in range(metricsGet.numMetrics):
            metric = metricsGet.metrics[i]
            if metric.metricId in values:
                metric.nvmlReturn, metric.value = real.NVML_SUCCESS, values[metric.metricId]
            else:
                metric.nvmlReturn = real.NVML_ERROR_NOT_SUPPORTED
        return metricsGet

    # -- events ----------------------------------------------------------------------------------
    def nvmlEventSetCreate(self) -> object:
        self._check_init()
        address = self._new_addr()
        with self._lock:
            self._event_sets[address] = {"registered": {}, "queue": collections.deque()}
        return _ptr(real.c_nvmlEventSet_t, address)

    def nvmlDeviceGetSupportedEventTypes(self, handle: object) -> int:
        self._dev(handle, "nvmlDeviceGetSupportedEventTypes")
        return (
            real.nvmlEventTypeXidCriticalError
            | real.nvmlEventTypeDoubleBitEccError
            | real.nvmlEventTypeSingleBitEccError
        )

    def nvmlDeviceRegisterEvents(self, handle: object, eventTypes: int, eventSet: object) -> None:
        index = self._gpu_index(handle)
        supported = self.nvmlDeviceGetSupportedEventTypes(handle)
        if eventTypes & ~supported:
            raise _error(real.NVML_ERROR_NOT_SUPPORTED)
        with self._lock:
            es = self._event_sets.get(_addr(eventSet))
            if es is None:
                raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
            es["registered"][index] = es["registered"].get(index, 0) | eventTypes

    def nvmlEventSetWait_v2(self, eventSet: object, timeoutms: int) -> real.c_nvmlEventData_t:
        self._check_init()
        with self._events:
            es = self._event_sets.get(_addr(eventSet))
            if es is None:
                raise _error(real.NVML_ERROR_INVALID_ARGUMENT)
            if self.wait_errors:
                raise _error(self.wait_errors.popleft())
            self._events.wait_for(lambda: bool(es["queue"]), timeoutms / 1000)
            if not es["queue"]:
                raise _error(real.NVML_ERROR_TIMEOUT)
            return es["queue"].popleft()

    def nvmlEventSetWait(self, eventSet: object, timeoutms: int) -> real.c_nvmlEventData_t:
        return self.nvmlEventSetWait_v2(eventSet, timeoutms)

    def nvmlEventSetFree(self, eventSet: object) -> None:
        self._check_init()
        with self._lock:
            if self._event_sets.pop(_addr(eventSet), None) is None:
                raise _error(real.NVML_ERROR_INVALID_ARGUMENT)

    # -- test controls (not part of pynvml) ----------------------------------------------------
    def _deliver(self, index: int, event_type: int, data: int, gi: int = UINT_MAX) -> int:
        delivered = 0
        with self._events:
            for es in self._event_sets.values():
                if es["registered"].get(index, 0) & event_type:
                    event = real.c_nvmlEventData_t()
                    event.device = self._handles[index]
                    event.eventType, event.eventData = event_type, data
                    event.gpuInstanceId, event.computeInstanceId = gi, UINT_MAX
                    es["queue"].append(event)
                    delivered += 1
            self._events.notify_all()
        return delivered

    def process_ran(self, index: int, pid: int, sm_util: int, seconds: float, mem_util: int = 0) -> None:
        """Process ``pid`` ran kernels ``sm_util`` percent of the last ``seconds`` of the clock on GPU ``index``:
        one sample per PROCESS_SAMPLE_PERIOD, none when idle (the driver samples only busy processes)."""
        if not (sm_util or mem_util):
            return
        gpu = self.gpus[index]
        now = self.clock()
        periods = round(seconds / PROCESS_SAMPLE_PERIOD)
        times = [int((now - k * PROCESS_SAMPLE_PERIOD) * 1e6) for k in reversed(range(periods))]
        gpu.process_samples = sorted([*gpu.process_samples, *((t, pid, sm_util, mem_util) for t in times)])
        self._expire_samples(gpu)

    def emit_xid(self, index: int, xid: int) -> int:
        """Deliver an XID event for GPU ``index``; returns how many event sets got it."""
        return self._deliver(index, real.nvmlEventTypeXidCriticalError, xid)

    def emit_double_bit_ecc(self, index: int) -> int:
        return self._deliver(index, real.nvmlEventTypeDoubleBitEccError, 0)

    def pending_events(self) -> int:
        with self._lock:
            return sum(len(es["queue"]) for es in self._event_sets.values())

    def registered(self) -> dict[int, int]:
        """GPU index -> event mask registered, over all live event sets."""
        with self._lock:
            out: dict[int, int] = {}
            for es in self._event_sets.values():
                for index, mask in es["registered"].items():
                    out[index] = out.get(index, 0) | mask
            return out


def _unversioned(versioned: Callable[[object], list], handle: object) -> list:
    """An unversioned binding call: the binding's ``throwOnVersionMismatch`` wrapper around its newest version."""
    try:
        return versioned(handle)
    except real.NVMLError_FunctionNotFound:
        raise real.NVMLLibraryMismatchError(f"unversioned call, and the driver lacks {versioned.__name__}") from None


def _process_infos(gpu: FakeGpu, processes: list[tuple[int, int | None, int]]) -> list:
    """c_nvmlProcessInfo_v3_t as friendly objects, usedGpuMemory None where NVML says NOT_AVAILABLE."""
    out = []
    for pid, used, gi in processes:
        info = real.c_nvmlProcessInfo_v3_t()
        info.pid, info.usedGpuMemory = pid, _NOT_AVAILABLE if used is None else used
        info.gpuInstanceId = gi if gpu.mig else UINT_MAX
        info.computeInstanceId = 0 if gpu.mig else UINT_MAX
        friendly = real.nvmlStructToFriendlyObject(info)
        if friendly.usedGpuMemory == _NOT_AVAILABLE:
            friendly.usedGpuMemory = None
        out.append(friendly)
    return out


def _pci_info(bus_id: str) -> real.nvmlPciInfo_t:
    info = real.nvmlPciInfo_t()
    domain, bus, rest = bus_id.split(":")
    device = rest.split(".")[0]
    info.busId = bus_id
    info.busIdLegacy = bus_id[-12:]
    info.domain, info.bus, info.device = int(domain, 16), int(bus, 16), int(device, 16)
    info.pciDeviceId = 0x233010DE
    return info


# -- canned machines ---------------------------------------------------------------------------
H100_SXM = "NVIDIA H100 80GB HBM3"
A100_PCIE = "NVIDIA A100 80GB PCIe"
V100_PCIE = "Tesla V100-PCIE-32GB"
H100_BUS = ("18", "2a", "3a", "5d", "9a", "ab", "ba", "db")
NVSWITCH_BUS = tuple(f"00000000:{b:02X}:00.0" for b in (0x05, 0x06, 0x07, 0x08))


def h100_gpm(sm: float = 60.0, occupancy: float = 30.0, tensor: float = 20.0, dram: float = 40.0,
             graphics: float = 95.0, pcie_tx: float = 100.0, pcie_rx: float = 200.0,
             nvlink_tx: float = 1000.0, nvlink_rx: float = 2000.0) -> dict[int, float]:
    """GPM metric values (percent, MiB/s) of a busy H100."""
    return {
        real.NVML_GPM_METRIC_SM_UTIL: sm,
        real.NVML_GPM_METRIC_SM_OCCUPANCY: occupancy,
        real.NVML_GPM_METRIC_ANY_TENSOR_UTIL: tensor,
        real.NVML_GPM_METRIC_DRAM_BW_UTIL: dram,
        real.NVML_GPM_METRIC_GRAPHICS_UTIL: graphics,
        real.NVML_GPM_METRIC_PCIE_TX_PER_SEC: pcie_tx,
        real.NVML_GPM_METRIC_PCIE_RX_PER_SEC: pcie_rx,
        real.NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC: nvlink_tx,
        real.NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC: nvlink_rx,
    }


def h100_sxm(index: int) -> FakeGpu:
    """One GPU of an HGX H100 8-GPU board: 18 NVLinks into the NVSwitches, GPM supported."""
    return FakeGpu(
        name=H100_SXM,
        uuid=f"GPU-{index:08x}-h100-4000-8000-{index:012x}",
        bus_id=f"00000000:{H100_BUS[index].upper()}:00.0",
        numa_node=index // 4,
        hostbridge=index // 2,
        pcie_switch=index // 2,
        util_gpu=95,
        util_mem=40,
        mem_total=81559 * MIB,
        mem_used=60_000 * MIB,
        power_mw=450_123,
        energy_mj=1_000_000 * (index + 1),
        temp_gpu=55,
        temp_mem=60,
        sm_clock=1755,
        mem_clock=2619,
        max_sm_clock=1980,
        pcie_tx_kbps=1000,
        pcie_rx_kbps=2000,
        nvlinks=[FakeLink(NVSWITCH_BUS[link % 4]) for link in range(18)],
        gpm=h100_gpm(),
        processes=[(1000 + index, 50_000 * MIB, 0)],
    )


def h100_node(n: int = 8) -> list[FakeGpu]:
    """An 8x H100 SXM node: two NUMA nodes, a PCIe switch per GPU pair, NVLink all-to-all."""
    return [h100_sxm(i) for i in range(n)]


def a100_pcie_pair() -> list[FakeGpu]:
    """Two A100 PCIe joined by an NVLink bridge: no GPM, no memory temperature, no NUMA from NVML."""
    buses = ("00000000:3B:00.0", "00000000:AF:00.0")
    gpus = []
    for i in range(2):
        gpus.append(FakeGpu(
            name=A100_PCIE,
            uuid=f"GPU-{i:08x}-a100-4000-8000-{i:012x}",
            bus_id=buses[i],
            numa_node=None,
            hostbridge=i,
            pcie_switch=i,
            gpm_supported=False,
            architecture=real.NVML_DEVICE_ARCH_AMPERE,
            util_gpu=80,
            util_mem=30,
            mem_total=81920 * MIB,
            mem_used=10_000 * MIB,
            power_mw=250_000,
            power_limit_mw=300_000,
            energy_mj=5_000_000,
            temp_gpu=48,
            temp_mem=None,
            sm_clock=1410,
            mem_clock=1512,
            max_sm_clock=1410,
            pcie_gen=4,
            pcie_gen_max=4,
            pcie_tx_kbps=4000,
            pcie_rx_kbps=8000,
            nvlinks=[FakeLink(buses[1 - i], remote_type=real.NVML_NVLINK_DEVICE_TYPE_GPU) for _ in range(12)],
        ))
    return gpus


def v100_pcie(index: int = 0) -> FakeGpu:
    """A Tesla V100 PCIe (Volta): page retirement instead of row remapping, no GPM, no MIG, no NVLink."""
    return FakeGpu(
        name=V100_PCIE,
        uuid=f"GPU-{index:08x}-v100-4000-8000-{index:012x}",
        bus_id=f"00000000:{0x86 + index:02X}:00.0",
        hostbridge=index,
        pcie_switch=index,
        gpm_supported=False,
        mig_capable=False,
        architecture=real.NVML_DEVICE_ARCH_VOLTA,
        util_gpu=70,
        mem_total=32768 * MIB,
        mem_used=8_000 * MIB,
        power_mw=180_000,
        power_limit_mw=250_000,
        temp_gpu=52,
        sm_clock=1380,
        mem_clock=877,
        max_sm_clock=1380,
        pcie_gen=3,
        pcie_gen_max=3,
    )


def mig_h100(index: int = 0) -> FakeGpu:
    """An H100 partitioned into 3g.40gb + 2x 2g.20gb MIG instances."""
    gpu = h100_sxm(index)
    gpu.mig = [
        FakeMig(1, "3g.40gb", f"MIG-{index:04x}-0001", 40_192 * MIB, 30_000 * MIB, h100_gpm(sm=70.0)),
        FakeMig(5, "2g.20gb", f"MIG-{index:04x}-0005", 19_968 * MIB, 5_000 * MIB, h100_gpm(sm=20.0)),
        FakeMig(6, "2g.20gb", f"MIG-{index:04x}-0006", 19_968 * MIB, 0, h100_gpm(sm=0.0)),
    ]
    gpu.processes = [(2001, 30_000 * MIB, 1), (2002, 5_000 * MIB, 5)]
    return gpu


class VirtualClock:
    """A monotonic clock tests move by hand; ``sleep`` advances it instead of waiting."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.slept: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.slept.append(seconds)
        self.now += max(seconds, 0.0)

    def advance(self, seconds: float) -> None:
        self.now += seconds
