"""The NVML source: GPU telemetry straight from the driver, including GPM profiling.

Failure model (a node exporter must never be the thing that breaks):
- no pynvml / no library / no driver: collect() says so (up False, kind nvml_unavailable),
  logs it once and retries init with backoff; nothing raises;
- a GPU that falls off the bus (NVMLError_GpuIsLost) loses only its own series;
- a call NotSupported on a GPU omits only that family on that GPU and is not asked again;
- missing telemetry is omitted, never published as 0.

Static identity (names, bus IDs, NUMA, topology, max clocks, GPM support, MIG layout) is
read once at init. XID events come from a background thread (nvml_events); GPM from
back-to-back sample streams (nvml_gpm).
"""

from __future__ import annotations

import argparse
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any

from exporter import schema
from exporter.attribution import Attributor, Device, attribute
from exporter.schema import Metric
from exporter.sources.base import Labels, Reading, Source
from exporter.sources.nvml_events import EventWatcher
from exporter.sources.nvml_gpm import GPM_RATIOS, GpmStream, gpm_supported

log = logging.getLogger(__name__)

NVML_UNAVAILABLE = "nvml_unavailable"
GPU_LOST = "gpu_lost"
NVML_ERROR = "nvml_error"
MIN_GPM_INTERVAL = 0.1
UINT_MAX = 0xFFFFFFFF
KIB = 1024

#: nvmlDeviceGetTopologyCommonAncestor level -> contract link (closest first).
TOPOLOGY_LEVELS: dict[str, str] = {
    "NVML_TOPOLOGY_INTERNAL": "pcie_switch",
    "NVML_TOPOLOGY_SINGLE": "pcie_switch",
    "NVML_TOPOLOGY_MULTIPLE": "pcie_switch",
    "NVML_TOPOLOGY_HOSTBRIDGE": "host_bridge",
    "NVML_TOPOLOGY_NODE": "numa",
    "NVML_TOPOLOGY_SYSTEM": "system",
}
ECC_COUNTERS: tuple[tuple[str, str, str, str], ...] = (
    ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_VOLATILE_ECC", "correctable", "volatile"),
    ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_VOLATILE_ECC", "uncorrectable", "volatile"),
    ("NVML_MEMORY_ERROR_TYPE_CORRECTED", "NVML_AGGREGATE_ECC", "correctable", "aggregate"),
    ("NVML_MEMORY_ERROR_TYPE_UNCORRECTED", "NVML_AGGREGATE_ECC", "uncorrectable", "aggregate"),
)
NVLINK_COUNTERS: tuple[tuple[str, str], ...] = (
    ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "crc_flit"),
    ("NVML_NVLINK_ERROR_DL_CRC_DATA", "crc_data"),
    ("NVML_NVLINK_ERROR_DL_REPLAY", "replay"),
    ("NVML_NVLINK_ERROR_DL_RECOVERY", "recovery"),
)
#: nvmlDeviceGetFieldValues fields -> (family, label, label value, scale, tag of what it delivers); an
#: empty label adds none. Fields the installed binding does not define are never asked for.
FIELDS: dict[str, tuple[Metric, str, str, float, str]] = {
    "NVML_FI_DEV_MEMORY_TEMP": (schema.TEMPERATURE, "sensor", "memory", 1.0, "memory_temp"),
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX": (schema.NVLINK_BYTES, "direction", "tx", KIB, "nvlink_bytes"),
    "NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX": (schema.NVLINK_BYTES, "direction", "rx", KIB, "nvlink_bytes"),
    "NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (schema.NVLINK_ERRORS, "type", "crc_flit", 1.0, "crc_flit"),
    "NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (schema.NVLINK_ERRORS, "type", "crc_data", 1.0, "crc_data"),
    "NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": (schema.NVLINK_ERRORS, "type", "replay", 1.0, "replay"),
    "NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": (schema.NVLINK_ERRORS, "type", "recovery", 1.0, "recovery"),
    "NVML_FI_DEV_GET_GPU_RECOVERY_ACTION": (schema.GPU_RECOVERY_ACTION, "", "", 1.0, "recovery_action"),
}
#: Field families asked only of GPUs that have NVLinks.
_NVLINK_FAMILIES = (schema.NVLINK_BYTES, schema.NVLINK_ERRORS)
#: Per-field answers meaning "this GPU or driver has no such field" (a driver older than the field ID
#: rejects it as an invalid argument): the field is left out from then on, never reported as 0.
_FIELD_ABSENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT")
#: Reasons decoded once: (bit, {"reason": name}) for the clock-event family.
_REASONS = tuple((bit, reason) for bit, reason in schema.CLOCK_EVENT_REASONS.items())


class _GpuLost(Exception):
    """Internal: abandon this GPU for this collection."""


@dataclass(frozen=True)
class GpuProcess:
    """One process holding GPU memory (for attribution to pods/jobs, never a metric label)."""

    gpu: str
    uuid: str
    pid: int
    used_memory_bytes: int | None
    gpu_instance: int | None


@dataclass
class _Mig:
    gpu_instance: int
    profile: str
    handle: object
    labels: Labels
    uuid: str = ""
    gpm: GpmStream | None = None


@dataclass
class _Gpu:
    """One physical GPU: its handle, static identity and per-GPU collection state."""

    index: int
    handle: object
    ready: bool = False
    uuid: str = ""
    labels: Labels = field(default_factory=dict)
    info: Labels = field(default_factory=dict)
    bus_id: str = ""
    max_sm_clock: float | None = None
    pcie_max: dict[str, float] = field(default_factory=dict)
    nvlinks: list[int] = field(default_factory=list)
    gpm: GpmStream | None = None
    gpm_supported: bool = False
    migs: list[_Mig] = field(default_factory=list)
    #: Calls (or fields) that answered NotSupported/NoPermission: never asked again.
    skip: set[str] = field(default_factory=set)
    fields: list[Any] = field(default_factory=list)
    pcie_last: tuple[float, float, float] | None = None  # time, tx KiB/s, rx KiB/s
    pcie_bytes: dict[str, float] = field(default_factory=lambda: {"tx": 0.0, "rx": 0.0})
    lost_error: str = ""


class NvmlSource(Source):
    """Contract samples for every GPU NVML sees on this host."""

    name = "nvml"

    def __init__(
        self,
        nvml: ModuleType | None = None,
        *,
        hostname: str | None = None,
        gpm_interval: float = MIN_GPM_INTERVAL,
        events: bool = True,
        event_timeout_ms: int = 500,
        retry_backoff: tuple[float, float] = (5.0, 300.0),
        sysfs_root: str | Path = "/sys",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        attributor: Attributor | None = None,
    ) -> None:
        if gpm_interval < MIN_GPM_INTERVAL:
            raise ValueError(f"gpm_interval must be >= {MIN_GPM_INTERVAL} s (GPM needs samples 100 ms apart)")
        self._nv = nvml
        self.hostname = hostname or socket.gethostname()
        self.gpm_interval = float(gpm_interval)
        self._events_enabled = events
        self._event_timeout_ms = event_timeout_ms
        self._backoff_min, self._backoff_max = retry_backoff
        self._backoff = self._backoff_min
        self._sysfs = Path(sysfs_root)
        self._clock = clock
        self._sleep = sleep
        self._attributor = attributor
        self._gpus: list[_Gpu] | None = None
        self._topology: list[tuple[Labels, float]] = []
        self._watcher: EventWatcher | None = None
        self._retry_at = float("-inf")
        self._unavailable = ""
        self._logged_unavailable = False
        self._initialized = False
        self._ensure_init(Reading())

    # -- init -----------------------------------------------------------------------------------
    def _ensure_init(self, reading: Reading) -> bool:
        if self._gpus is not None:
            return True
        now = self._clock()
        if now >= self._retry_at:
            try:
                self._init()
            except Exception as exc:  # ImportError, NVMLError (no library, no driver, ...)
                self._unavailable = self._explain(exc)
                self._retry_at = now + self._backoff
                self._backoff = min(self._backoff * 2, self._backoff_max)
                if not self._logged_unavailable:
                    log.warning("NVML unavailable, retrying with backoff: %s", self._unavailable)
                    self._logged_unavailable = True
                else:
                    log.debug("NVML still unavailable: %s", self._unavailable)
            else:
                if self._logged_unavailable:
                    log.warning("NVML available again")
                self._logged_unavailable = False
                self._backoff = self._backoff_min
                return True
        reading.fail(NVML_UNAVAILABLE, self._unavailable)
        return False

    def _explain(self, exc: Exception) -> str:
        if isinstance(exc, ImportError):
            return f"pynvml is not installed (pip install nvidia-ml-py): {exc}"
        nv = self._nv
        if nv is not None:
            if isinstance(exc, nv.NVMLError_LibraryNotFound):
                return "libnvidia-ml.so.1 not found: no NVIDIA driver installed on this host"
            if isinstance(exc, nv.NVMLError_DriverNotLoaded):
                return "the NVIDIA kernel driver is not loaded"
            if isinstance(exc, nv.NVMLError):
                return f"NVML init failed: {exc}"
        return f"NVML init failed: {exc!r}"

    def _init(self) -> None:
        if self._nv is None:
            import pynvml

            self._nv = pynvml
        nv = self._nv
        nv.nvmlInit()
        self._initialized = True
        try:
            driver = nv.nvmlSystemGetDriverVersion()
            gpus = [_Gpu(i, nv.nvmlDeviceGetHandleByIndex(i)) for i in range(nv.nvmlDeviceGetCount())]
        except nv.NVMLError:
            self._shutdown()
            raise
        self._driver = driver if isinstance(driver, str) else driver.decode()
        self._field_table = {getattr(nv, name): spec for name, spec in FIELDS.items() if hasattr(nv, name)}
        self._field_absent = {getattr(nv, code) for code in _FIELD_ABSENT}
        no_gpm: list[str] = []
        for gpu in gpus:
            self._load_static(gpu)
            if gpu.ready and not gpu.gpm_supported:
                no_gpm.append(f"{gpu.index} ({gpu.info.get('model', '?')})")
        if no_gpm:
            log.info(
                "NVML GPM profiling not supported on GPU %s (needs Hopper or newer, bare metal): "
                "SM activity, occupancy, tensor and DRAM activity are omitted there, not zero",
                ", ".join(no_gpm),
            )
        self._gpus = gpus
        self._topology = self._read_topology(gpus)
        if self._events_enabled and gpus:
            self._watcher = EventWatcher(nv, {g.index: g.handle for g in gpus}, timeout_ms=self._event_timeout_ms)
            self._watcher.start()

    def _load_static(self, gpu: _Gpu) -> None:
        """Identity and never-changing properties; a GPU lost here is retried next collection."""
        nv = self._nv
        h = gpu.handle
        try:
            gpu.uuid = _text(nv.nvmlDeviceGetUUID(h))
            model = _text(nv.nvmlDeviceGetName(h))
            pci = nv.nvmlDeviceGetPciInfo(h)
            gpu.bus_id = _text(pci.busId)
            gpu.labels = {schema.HOSTNAME: self.hostname, schema.GPU: str(gpu.index), schema.UUID: gpu.uuid}
            gpu.info = {
                **gpu.labels,
                "model": model,
                "driver_version": self._driver,
                "pci_bus_id": gpu.bus_id,
                "numa_node": self._numa_node(gpu, pci),
            }
            clock = self._static(gpu, "max_sm_clock", nv.nvmlDeviceGetMaxClockInfo, h, nv.NVML_CLOCK_SM)
            gpu.max_sm_clock = None if clock is None else clock * schema.MHZ
            gen = self._static(gpu, "pcie_gen_max", nv.nvmlDeviceGetMaxPcieLinkGeneration, h)
            width = self._static(gpu, "pcie_width_max", nv.nvmlDeviceGetMaxPcieLinkWidth, h)
            if gen is not None:
                gpu.pcie_max["gen_max"] = float(gen)
            if width is not None:
                gpu.pcie_max["width_max"] = float(width)
            gpu.nvlinks = self._discover_links(gpu)
            # NVLink fields take scopeId UINT_MAX for "summed over all links"
            gpu.fields = [
                (field_id, UINT_MAX)
                for field_id, spec in self._field_table.items()
                if gpu.nvlinks or spec[0] not in _NVLINK_FAMILIES
            ]
            gpu.gpm_supported = gpm_supported(nv, h, lambda e: log.debug("GPU %s GPM query: %s", gpu.index, e))
            if gpu.gpm_supported:
                gpu.gpm = GpmStream(nv, h)
            gpu.migs = self._discover_migs(gpu)
            gpu.ready = True
            gpu.lost_error = ""
        except nv.NVMLError as exc:
            gpu.ready = False
            gpu.lost_error = f"GPU {gpu.index}: static info unreadable: {exc}"
            log.warning("%s", gpu.lost_error)

    def _static(self, gpu: _Gpu, key: str, fn: Callable[..., Any], *args: Any) -> Any:
        try:
            return fn(*args)
        except self._nv.NVMLError_GpuIsLost:
            raise
        except self._nv.NVMLError as exc:
            gpu.skip.add(key)
            log.info("GPU %s: %s unavailable (%s)", gpu.index, key, exc)
            return None

    def _numa_node(self, gpu: _Gpu, pci: Any) -> str:
        nv = self._nv
        try:
            node = nv.nvmlDeviceGetNumaNodeId(gpu.handle)
        except nv.NVMLError_GpuIsLost:
            raise
        except nv.NVMLError:
            node = self._sysfs_numa(_text(pci.busId))
        return "" if node is None or node < 0 else str(node)

    def _sysfs_numa(self, bus_id: str) -> int | None:
        domain, rest = bus_id.split(":", 1)
        path = self._sysfs / "bus" / "pci" / "devices" / f"{int(domain, 16):04x}:{rest.lower()}" / "numa_node"
        try:
            return int(path.read_text().strip())
        except (OSError, ValueError):
            return None

    def _discover_links(self, gpu: _Gpu) -> list[int]:
        nv = self._nv
        links = []
        for link in range(nv.NVML_NVLINK_MAX_LINKS):
            try:
                nv.nvmlDeviceGetNvLinkState(gpu.handle, link)
            except nv.NVMLError_GpuIsLost:
                raise
            except nv.NVMLError_NotSupported:
                if link == 0:
                    break
                continue
            except nv.NVMLError:
                continue
            links.append(link)
        return links

    def _discover_migs(self, gpu: _Gpu) -> list[_Mig]:
        nv = self._nv
        h = gpu.handle
        mode = self._static(gpu, "mig_mode", nv.nvmlDeviceGetMigMode, h)
        if not mode or mode[0] != nv.NVML_DEVICE_MIG_ENABLE:
            return []
        migs = []
        for i in range(nv.nvmlDeviceGetMaxMigDeviceCount(h)):
            try:
                mh = nv.nvmlDeviceGetMigDeviceHandleByIndex(h, i)
            except nv.NVMLError_GpuIsLost:
                raise
            except nv.NVMLError:
                continue  # NOT_FOUND: an empty slot
            gi = nv.nvmlDeviceGetGpuInstanceId(mh)
            profile = _mig_profile(_text(nv.nvmlDeviceGetName(mh)))
            labels = {**gpu.labels, schema.GPU_INSTANCE: str(gi), schema.MIG_PROFILE: profile}
            try:
                mig_uuid = _text(nv.nvmlDeviceGetUUID(mh))
            except nv.NVMLError:
                mig_uuid = ""  # attribution then falls back to the parent UUID + instance id
            mig = _Mig(gi, profile, mh, labels, mig_uuid)
            if gpu.gpm_supported:
                mig.gpm = GpmStream(nv, h, gi, rates=False)
            migs.append(mig)
        return migs

    def _read_topology(self, gpus: list[_Gpu]) -> list[tuple[Labels, float]]:
        """Closest link between each ordered pair of GPUs."""
        nv = self._nv
        ready = [g for g in gpus if g.ready]
        by_bus = {_norm_bus(g.bus_id): g.index for g in ready}
        nvlink_peers: set[tuple[int, int]] = set()
        for g in ready:
            for link in g.nvlinks:
                try:
                    remote = _norm_bus(_text(nv.nvmlDeviceGetNvLinkRemotePciInfo(g.handle, link).busId))
                except nv.NVMLError:
                    continue
                if remote in by_bus and by_bus[remote] != g.index:
                    nvlink_peers.add((g.index, by_bus[remote]))
                    nvlink_peers.add((by_bus[remote], g.index))
        levels = {getattr(nv, name): link for name, link in TOPOLOGY_LEVELS.items()}
        out: list[tuple[Labels, float]] = []
        for a in ready:
            for b in ready:
                if a is b:
                    continue
                link = None
                if (a.index, b.index) in nvlink_peers:
                    link = "nvlink"
                elif a.nvlinks and b.nvlinks:
                    try:
                        status = nv.nvmlDeviceGetP2PStatus(a.handle, b.handle, nv.NVML_P2P_CAPS_INDEX_NVLINK)
                        if status == nv.NVML_P2P_STATUS_OK:
                            link = "nvlink"
                    except nv.NVMLError:
                        pass
                if link is None:
                    try:
                        link = levels.get(nv.nvmlDeviceGetTopologyCommonAncestor(a.handle, b.handle))
                    except nv.NVMLError as exc:
                        log.debug("topology %s-%s: %s", a.index, b.index, exc)
                if link is not None:
                    out.append(({**a.labels, "peer_gpu": str(b.index), "link": link}, 1.0))
        return out

    # -- collection ---------------------------------------------------------------------------------
    def collect(self) -> Reading:
        reading = Reading()
        if not self._ensure_init(reading):
            return reading
        assert self._gpus is not None
        for gpu in self._gpus:
            if not gpu.ready:
                self._load_static(gpu)
        live = [g for g in self._gpus if g.ready]
        lost: dict[int, str] = {}
        self._prepare_gpm(live, lost)
        xids = self._watcher.xid_counts() if self._watcher is not None else {}
        buckets: dict[int, tuple[Metric, list[tuple[Labels, float]]]] = {}
        for gpu in self._gpus:
            if not gpu.ready:
                reading.fail(GPU_LOST, gpu.lost_error, str(gpu.index))
                continue
            if gpu.index in lost:
                reading.fail(GPU_LOST, lost[gpu.index], str(gpu.index))
                continue
            out: list[tuple[Metric, Labels, float]] = []
            errors: list[str] = []
            try:
                self._collect_gpu(gpu, out, errors)
            except _GpuLost as exc:
                lost[gpu.index] = str(exc)
                reading.fail(GPU_LOST, str(exc), str(gpu.index))
                continue
            for metric, labels, value in out:
                # Grouped by identity: hashing a Metric (a frozen dataclass) per sample is costly.
                bucket = buckets.get(id(metric))
                if bucket is None:
                    bucket = buckets[id(metric)] = (metric, [])
                bucket[1].append((labels, value))
            for message in errors:
                reading.fail(NVML_ERROR, message, str(gpu.index))
            for (index, xid), count in xids.items():
                if index == gpu.index:
                    reading.add(schema.XID_ERRORS, {**gpu.labels, "xid": str(xid)}, float(count))
        for metric, samples in buckets.values():
            reading.samples.setdefault(metric, []).extend(samples)
        live = [g for g in self._gpus if g.ready and g.index not in lost]
        live_indexes = {g.index for g in live}
        for labels, value in self._topology:
            if int(labels[schema.GPU]) in live_indexes and int(labels["peer_gpu"]) in live_indexes:
                reading.add(schema.GPU_TOPOLOGY_INFO, labels, value)
        if self._attributor is not None:
            attribute(reading, self._attributor, _devices(live))
        return reading

    def _prepare_gpm(self, gpus: list[_Gpu], lost: dict[int, str]) -> None:
        """Make sure every GPM stream has a first sample at least ``gpm_interval`` old (one wait for all)."""
        nv = self._nv
        now = self._clock()
        wait = 0.0
        for gpu in gpus:
            streams = [
                s for s in [gpu.gpm, *(m.gpm for m in gpu.migs)]
                if s is not None and _gpm_key(s) not in gpu.skip
            ]
            for stream in streams:
                try:
                    stream.prime(now)
                except nv.NVMLError_GpuIsLost as exc:
                    lost[gpu.index] = f"GPU {gpu.index} lost: {exc}"
                    break
                except nv.NVMLError as exc:
                    log.warning("GPU %s: GPM sample failed: %s", gpu.index, exc)
                    continue
                wait = max(wait, stream.wait_needed(now, self.gpm_interval))
        if wait > 0:
            self._sleep(wait)

    def _call(self, gpu: _Gpu, key: str, errors: list[str], fn: Callable[..., Any], *args: Any) -> Any:
        """One NVML call for one family: None when unsupported (remembered) or failed (reported)."""
        if key in gpu.skip:
            return None
        nv = self._nv
        try:
            return fn(*args)
        except nv.NVMLError_GpuIsLost as exc:
            raise _GpuLost(f"GPU {gpu.index} lost (fell off the bus?): {exc}") from exc
        except (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission, nv.NVMLError_FunctionNotFound) as exc:
            gpu.skip.add(key)
            log.info("GPU %s: %s unavailable (%s); omitted from now on", gpu.index, key, exc)
        except nv.NVMLError as exc:
            errors.append(f"GPU {gpu.index}: {key}: {exc}")
        return None

    def _collect_gpu(self, gpu: _Gpu, out: list[tuple[Metric, Labels, float]], errors: list[str]) -> None:
        nv = self._nv
        h = gpu.handle
        base = gpu.labels
        call = self._call
        add = out.append

        util = call(gpu, "utilization", errors, nv.nvmlDeviceGetUtilizationRates, h)
        if util is not None:
            add((schema.GPU_UTILIZATION, base, util.gpu / 100.0))
            add((schema.MEMORY_UTILIZATION, base, util.memory / 100.0))
        for key, fn, metric in (("encoder", nv.nvmlDeviceGetEncoderUtilization, schema.ENCODER_UTILIZATION),
                                ("decoder", nv.nvmlDeviceGetDecoderUtilization, schema.DECODER_UTILIZATION)):
            video = call(gpu, key, errors, fn, h)
            if video is not None:
                add((metric, base, video[0] / 100.0))
        mem = call(gpu, "memory_v2", errors, nv.nvmlDeviceGetMemoryInfo, h, nv.nvmlMemory_v2)
        if mem is None and "memory_v2" in gpu.skip:
            mem = call(gpu, "memory", errors, nv.nvmlDeviceGetMemoryInfo, h)
        if mem is not None:
            add((schema.MEMORY_USED, base, float(mem.used)))
            add((schema.MEMORY_TOTAL, base, float(mem.total)))

        power = call(gpu, "power", errors, nv.nvmlDeviceGetPowerUsage, h)
        if power is not None:
            add((schema.POWER, base, power / 1000.0))
        limit = call(gpu, "power_limit", errors, nv.nvmlDeviceGetEnforcedPowerLimit, h)
        if limit is not None:
            add((schema.POWER_LIMIT, base, limit / 1000.0))
        energy = call(gpu, "energy", errors, nv.nvmlDeviceGetTotalEnergyConsumption, h)
        if energy is not None:
            add((schema.ENERGY, base, energy / 1000.0))
        fan = call(gpu, "fan", errors, nv.nvmlDeviceGetFanSpeed, h)  # NOT_SUPPORTED when passively cooled
        if fan is not None:
            add((schema.FAN_SPEED, base, fan / 100.0))
        pstate = call(gpu, "pstate", errors, nv.nvmlDeviceGetPerformanceState, h)
        if pstate is not None and pstate != nv.NVML_PSTATE_UNKNOWN:
            add((schema.PERFORMANCE_STATE, base, float(pstate)))
        for reason, policy in (("power", nv.NVML_PERF_POLICY_POWER), ("thermal", nv.NVML_PERF_POLICY_THERMAL)):
            held = call(gpu, f"violation_{reason}", errors, nv.nvmlDeviceGetViolationStatus, h, policy)
            if held is not None:
                add((schema.CLOCK_VIOLATION, {**base, "reason": reason}, held.violationTime / 1e9))
        temp = call(gpu, "temperature", errors, nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
        if temp is not None:
            add((schema.TEMPERATURE, {**base, "sensor": "gpu"}, float(temp)))

        from_fields = self._collect_fields(gpu, out, errors)

        sm = call(gpu, "sm_clock", errors, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_SM)
        if sm is not None:
            add((schema.SM_CLOCK, base, sm * schema.MHZ))
        if gpu.max_sm_clock is not None:
            add((schema.SM_CLOCK_MAX, base, gpu.max_sm_clock))
        memclk = call(gpu, "mem_clock", errors, nv.nvmlDeviceGetClockInfo, h, nv.NVML_CLOCK_MEM)
        if memclk is not None:
            add((schema.MEMORY_CLOCK, base, memclk * schema.MHZ))
        reasons = call(gpu, "clock_events", errors, nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is None and "clock_events" in gpu.skip:
            reasons = call(gpu, "clock_throttle", errors, nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        if reasons is not None:
            for bit, reason in _REASONS:
                add((schema.CLOCK_EVENT_ACTIVE, {**base, "reason": reason}, 1.0 if reasons & bit else 0.0))

        self._collect_pcie(gpu, out, errors)
        self._collect_errors(gpu, out, errors)
        if gpu.nvlinks:
            self._collect_nvlink(gpu, out, errors, from_fields)

        add((schema.GPM_SUPPORTED, base, 1.0 if gpu.gpm_supported else 0.0))
        if gpu.gpm is not None:
            values = self._finish_gpm(gpu, gpu.gpm, base, out, errors)
            if values is not None:
                for (family, direction), total in gpu.gpm.bytes.items():
                    if family is schema.PCIE_BYTES or (gpu.nvlinks and "nvlink_bytes" not in from_fields):
                        add((family, {**base, "direction": direction}, total))
        for mig in gpu.migs:
            mem = call(gpu, f"mig{mig.gpu_instance}_memory", errors, nv.nvmlDeviceGetMemoryInfo, mig.handle,
                       nv.nvmlMemory_v2)
            if mem is not None:
                add((schema.MEMORY_USED, mig.labels, float(mem.used)))
                add((schema.MEMORY_TOTAL, mig.labels, float(mem.total)))
            if mig.gpm is not None:
                self._finish_gpm(gpu, mig.gpm, mig.labels, out, errors)
        add((schema.GPU_INFO, gpu.info, 1.0))

    def _finish_gpm(self, gpu: _Gpu, stream: GpmStream, labels: Labels, out: list, errors: list[str]) -> dict | None:
        if stream.prev_time is None:
            return None  # priming failed this round (already logged)
        result = self._call(gpu, _gpm_key(stream), errors, stream.finish, self._clock())
        if result is None:
            return None
        values, _dt = result
        for name, family in GPM_RATIOS:
            if name in values:
                out.append((family, labels, values[name] / 100.0))
        return values

    def _collect_fields(self, gpu: _Gpu, out: list, errors: list[str]) -> set[str]:
        """Memory temperature, recovery action and NVLink byte/error counters in one batched call.

        Returns the tags (``nvlink_bytes``, NVLink error types) it delivered, so the caller
        only falls back to slower per-link calls for what the driver did not give here.
        """
        nv = self._nv
        if not gpu.fields:
            return set()
        values = self._call(gpu, "field_values", errors, nv.nvmlDeviceGetFieldValues, gpu.handle, gpu.fields)
        if values is None:
            return set()
        got: set[str] = set()
        keep = []
        table = self._field_table
        for request, v in zip(gpu.fields, values, strict=True):
            if v.nvmlReturn in self._field_absent:
                log.info("GPU %s: field %s unavailable (%s); omitted from now on", gpu.index, v.fieldId,
                         nv.NVMLError(v.nvmlReturn))
                continue
            keep.append(request)
            if v.nvmlReturn != nv.NVML_SUCCESS:
                errors.append(f"GPU {gpu.index}: field {v.fieldId}: {nv.NVMLError(v.nvmlReturn)}")
                continue
            metric, label, label_value, scale, tag = table[v.fieldId]
            labels = {**gpu.labels, label: label_value} if label else gpu.labels
            out.append((metric, labels, _field_value(nv, v) * scale))
            got.add(tag)
        gpu.fields = keep
        return got

    def _collect_pcie(self, gpu: _Gpu, out: list, errors: list[str]) -> None:
        nv = self._nv
        h = gpu.handle
        base = gpu.labels
        call = self._call
        gen = call(gpu, "pcie_gen", errors, nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
        if gen is not None:
            out.append((schema.PCIE_LINK_GENERATION, {**base, "state": "current"}, float(gen)))
        if "gen_max" in gpu.pcie_max:
            out.append((schema.PCIE_LINK_GENERATION, {**base, "state": "max"}, gpu.pcie_max["gen_max"]))
        width = call(gpu, "pcie_width", errors, nv.nvmlDeviceGetCurrPcieLinkWidth, h)
        if width is not None:
            out.append((schema.PCIE_LINK_WIDTH, {**base, "state": "current"}, float(width)))
        if "width_max" in gpu.pcie_max:
            out.append((schema.PCIE_LINK_WIDTH, {**base, "state": "max"}, gpu.pcie_max["width_max"]))
        replays = call(gpu, "pcie_replays", errors, nv.nvmlDeviceGetPcieReplayCounter, h)
        if replays is not None:
            out.append((schema.PCIE_REPLAYS, base, float(replays)))
        if gpu.gpm is not None:
            return  # GPM gives PCIe traffic averaged over the whole interval; see _finish_gpm
        tx = call(gpu, "pcie_throughput", errors, nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_TX_BYTES)
        rx = call(gpu, "pcie_throughput", errors, nv.nvmlDeviceGetPcieThroughput, h, nv.NVML_PCIE_UTIL_RX_BYTES)
        if tx is None or rx is None:
            return
        now = self._clock()
        if gpu.pcie_last is not None:
            # trapezoid between the two instantaneous rates (KiB/s) over the time between reads
            t0, tx0, rx0 = gpu.pcie_last
            dt = max(0.0, now - t0)
            gpu.pcie_bytes["tx"] += (tx0 + tx) / 2 * KIB * dt
            gpu.pcie_bytes["rx"] += (rx0 + rx) / 2 * KIB * dt
        gpu.pcie_last = (now, float(tx), float(rx))
        for direction, total in gpu.pcie_bytes.items():
            out.append((schema.PCIE_BYTES, {**base, "direction": direction}, total))

    def _collect_errors(self, gpu: _Gpu, out: list, errors: list[str]) -> None:
        nv = self._nv
        h = gpu.handle
        base = gpu.labels
        for err_type, counter_type, type_label, scope in ECC_COUNTERS:
            count = self._call(gpu, "ecc", errors, nv.nvmlDeviceGetTotalEccErrors, h,
                               getattr(nv, err_type), getattr(nv, counter_type))
            if count is not None:
                out.append((schema.ECC_ERRORS, {**base, "type": type_label, "scope": scope}, float(count)))
        rows = self._call(gpu, "remapped_rows", errors, nv.nvmlDeviceGetRemappedRows, h)
        if rows is not None:
            corr, unc, pending, failure = rows
            out.append((schema.REMAPPED_ROWS, {**base, "type": "correctable"}, float(corr)))
            out.append((schema.REMAPPED_ROWS, {**base, "type": "uncorrectable"}, float(unc)))
            out.append((schema.ROW_REMAP_PENDING, base, 1.0 if pending else 0.0))
            out.append((schema.ROW_REMAP_FAILURE, base, 1.0 if failure else 0.0))
        self._collect_memory_health(gpu, out, errors)

    def _collect_memory_health(self, gpu: _Gpu, out: list, errors: list[str]) -> None:
        """Spare-row histogram (Ampere+) and retired pages (before Ampere).

        Each GPU answers NotSupported for the generation it is not, once; from then on the source
        skips that call, so a GPU costs only the calls its architecture can answer.
        """
        nv = self._nv
        h = gpu.handle
        base = gpu.labels
        histogram = getattr(nv, "nvmlDeviceGetRowRemapperHistogram", None)  # absent from old bindings
        banks = None if histogram is None else self._call(gpu, "row_remap_histogram", errors, histogram, h)
        if banks is not None:
            for bucket in schema.ROW_REMAP_AVAILABILITY:
                out.append((schema.ROW_REMAP_BANKS, {**base, "availability": bucket}, float(getattr(banks, bucket))))
        causes = (nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS,
                  nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
        for cause, label in zip(causes, schema.RETIREMENT_CAUSES, strict=True):
            pages = self._call(gpu, "retired_pages", errors, nv.nvmlDeviceGetRetiredPages, h, cause)
            if pages is not None:
                out.append((schema.RETIRED_PAGES, {**base, "cause": label}, float(len(pages))))
        pending = self._call(gpu, "retired_pages_pending", errors, nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
        if pending is not None:
            out.append((schema.RETIRED_PAGES_PENDING, base, 1.0 if pending == nv.NVML_FEATURE_ENABLED else 0.0))

    def _collect_nvlink(self, gpu: _Gpu, out: list, errors: list[str], from_fields: set[str]) -> None:
        nv = self._nv
        h = gpu.handle
        base = gpu.labels
        up = down = 0
        for link in gpu.nvlinks:
            state = self._call(gpu, "nvlink_state", errors, nv.nvmlDeviceGetNvLinkState, h, link)
            if state is None:
                break
            if state:
                up += 1
            else:
                down += 1
        if up + down == len(gpu.nvlinks):
            out.append((schema.NVLINK_LINKS, {**base, "state": "up"}, float(up)))
            out.append((schema.NVLINK_LINKS, {**base, "state": "down"}, float(down)))
        for counter_name, type_label in NVLINK_COUNTERS:
            if type_label in from_fields:
                continue  # the batched field call already summed it over links
            key = "nvlink_" + type_label
            counter = getattr(nv, counter_name)
            total = 0
            for link in gpu.nvlinks:
                count = self._call(gpu, key, errors, nv.nvmlDeviceGetNvLinkErrorCounter, h, link, counter)
                if count is None:
                    break
                total += count
            else:
                out.append((schema.NVLINK_ERRORS, {**base, "type": type_label}, float(total)))

    # -- extras ------------------------------------------------------------------------------------
    def running_processes(self) -> list[GpuProcess]:
        """Processes holding GPU memory right now, per GPU (for attribution; not metric labels)."""
        if self._gpus is None:
            return []
        nv = self._nv
        procs: list[GpuProcess] = []
        for gpu in self._gpus:
            if not gpu.ready or "processes" in gpu.skip:
                continue
            try:
                infos = nv.nvmlDeviceGetComputeRunningProcesses(gpu.handle)
            except (nv.NVMLError_NotSupported, nv.NVMLError_NoPermission) as exc:
                gpu.skip.add("processes")
                log.info("GPU %s: running processes unavailable: %s", gpu.index, exc)
                continue
            except Exception as exc:  # NVMLError incl. GpuIsLost, or a pynvml/driver version mismatch
                log.debug("GPU %s: running processes: %s", gpu.index, exc)
                continue
            for p in infos:
                gi = getattr(p, "gpuInstanceId", UINT_MAX)
                procs.append(GpuProcess(
                    gpu=str(gpu.index),
                    uuid=gpu.uuid,
                    pid=int(p.pid),
                    used_memory_bytes=None if p.usedGpuMemory is None else int(p.usedGpuMemory),
                    gpu_instance=None if gi in (None, UINT_MAX) else int(gi),
                ))
        return procs

    @property
    def event_watcher(self) -> EventWatcher | None:
        """The XID/ECC event thread (None until NVML is up, or when events are disabled)."""
        return self._watcher

    def _shutdown(self) -> None:
        if self._initialized and self._nv is not None:
            try:
                self._nv.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown: %s", exc)
            self._initialized = False

    def close(self) -> None:
        if self._watcher is not None:
            self._watcher.close()
            self._watcher = None
        for gpu in self._gpus or []:
            for stream in [gpu.gpm, *(m.gpm for m in gpu.migs)]:
                if stream is not None:
                    stream.free()
        self._gpus = None
        self._shutdown()


def _devices(gpus: list[_Gpu]) -> list[Device]:
    """What attribution looks up: each MIG instance of a MIG-mode GPU, else the whole GPU."""
    out: list[Device] = []
    for g in gpus:
        if g.migs:
            out += [(m.labels, g.uuid, str(g.index), str(m.gpu_instance), m.uuid or None) for m in g.migs]
        else:
            out.append((g.labels, g.uuid, str(g.index), None, None))
    return out


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _gpm_key(stream: GpmStream) -> str:
    return "gpm" if stream.gpu_instance is None else f"gpm_mig{stream.gpu_instance}"


def _norm_bus(bus_id: str) -> str:
    """'00000000:18:00.0' and '0000:18:00.0' name the same device."""
    domain, _, rest = bus_id.partition(":")
    try:
        return f"{int(domain, 16):08x}:{rest.lower()}"
    except ValueError:
        return bus_id.lower()


def _mig_profile(name: str) -> str:
    """'NVIDIA H100 80GB HBM3 MIG 3g.40gb' -> '3g.40gb'."""
    _, sep, profile = name.rpartition(" MIG ")
    return profile.strip() if sep else "unknown"


def _field_value(nv: ModuleType, v: Any) -> float:
    vt = v.valueType
    if vt == nv.NVML_VALUE_TYPE_DOUBLE:
        return float(v.value.dVal)
    if vt == nv.NVML_VALUE_TYPE_UNSIGNED_INT:
        return float(v.value.uiVal)
    if vt == nv.NVML_VALUE_TYPE_UNSIGNED_LONG:
        return float(v.value.ulVal)
    if vt == nv.NVML_VALUE_TYPE_SIGNED_LONG_LONG:
        return float(v.value.sllVal)
    if vt == nv.NVML_VALUE_TYPE_SIGNED_INT:
        return float(v.value.siVal)
    if vt == nv.NVML_VALUE_TYPE_UNSIGNED_SHORT:
        return float(v.value.usVal)
    return float(v.value.ullVal)


def from_args(args: argparse.Namespace) -> NvmlSource:
    """Build the source from parsed ``add_arguments`` options (ValueError when they are unusable)."""
    from exporter.attribution import build_attributor, load_job_map

    job_map = getattr(args, "job_map", None)
    kube_only = [flag for flag, dest in (("--job-pod-label", "job_pod_label"), ("--kube-api", "kube_api"),
                                         ("--job-map", "job_map")) if getattr(args, dest, None)]
    if kube_only and not getattr(args, "kubelet_socket", None):
        raise ValueError(f"{', '.join(kube_only)} need --kubelet-socket (Kubernetes attribution)")
    attributor = build_attributor(
        getattr(args, "kubelet_socket", None), getattr(args, "slurm_job_dir", None),
        ttl=getattr(args, "attribution_ttl", 10.0),
        static_jobs=load_job_map(job_map) if job_map else None,
        job_label=getattr(args, "job_pod_label", None),
        kube_api=getattr(args, "kube_api", None),
        kube_token_file=getattr(args, "kube_token_file", None),
        kube_ca_file=getattr(args, "kube_ca_file", None),
    )
    return NvmlSource(
        hostname=getattr(args, "nvml_hostname", None),
        gpm_interval=getattr(args, "gpm_interval", MIN_GPM_INTERVAL),
        events=getattr(args, "xid_events", True),
        attributor=attributor,
    )
