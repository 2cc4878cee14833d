"""The NVML source: GPU telemetry straight from the driver, including GPM profiling.

Failure model (a node exporter must never be the thing that breaks):
- no pynvml / no library / no driver: collect() says so (up False, kind nvml_unavailable),
  logs it once and retries init with backoff; nothing raises;
- a GPU that falls off the bus (NVMLError_GpuIsLost) loses only its own series;
- a call NotSupported on a GPU omits only that family on that GPU and is not asked again;
- missing telemetry is omitted, never published as 0.

Static identity (names, bus IDs, NUMA, topology, max clocks, GPM support, MIG layout) is
read once at init. XID events come from a background thread (nvml_events); GPM from
back-to-back sample streams (nvml_gpm); each holder's use of a GPU several pods or jobs hold
at once from NVML's per-process calls (nvml_processes).

What to read is data: each contract family's ``nvml_reads`` (``schema.NvmlRead``: call or field,
arguments, scale, labels) are executed by one generic reader, in contract order (``PLAN``). Only
what needs real logic is hand-written (``_HAND_WRITTEN``): the clock-event bitmask, PCIe
throughput integration, per-link NVLink sums and states, GPM, MIG instances, identity.
"""

from __future__ import annotations

import argparse
import logging
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from types import ModuleType
from typing import Any, Literal

from exporter import schema
from exporter.attribution import Attributor, Device, publish_allocations, refresh_attribution
from exporter.schema import Metric, NvmlCall, NvmlRead
from exporter.sources.base import Labels, Reading, Source
from exporter.sources.nvml_events import EventWatcher
from exporter.sources.nvml_gpm import GPM_RATIOS, GpmStream, gpm_supported
from exporter.sources.nvml_processes import ProcessSampler

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
#: Per-link NVLink error counters, asked link by link when the summed fields are not there.
NVLINK_COUNTERS: tuple[tuple[str, str], ...] = (
    ("NVML_NVLINK_ERROR_DL_CRC_FLIT", "crc_flit"),
    ("NVML_NVLINK_ERROR_DL_CRC_DATA", "crc_data"),
    ("NVML_NVLINK_ERROR_DL_REPLAY", "replay"),
    ("NVML_NVLINK_ERROR_DL_RECOVERY", "recovery"),
)
#: Field families asked only of GPUs that have NVLinks.
_NVLINK_FAMILIES = (schema.NVLINK_BYTES, schema.NVLINK_ERRORS)
#: Per-field answers meaning "this GPU or driver has no such field" (a driver older than the field ID
#: rejects it as an invalid argument): the field is left out from then on, never reported as 0.
_FIELD_ABSENT = ("NVML_ERROR_NOT_SUPPORTED", "NVML_ERROR_INVALID_ARGUMENT")
#: Reasons decoded once: (bit, {"reason": name}) for the clock-event family.
_REASONS = tuple((bit, reason) for bit, reason in schema.CLOCK_EVENT_REASONS.items())
#: Families whose reading needs real logic, by the NvmlSource method that reads them (at the family's
#: place in the contract order). A family may have both: NVLink errors come from fields where the driver
#: has them, else from per-link counters.
_HAND_WRITTEN: dict[Metric, str] = {
    schema.CLOCK_EVENT_ACTIVE: "_read_clock_events",
    schema.PCIE_BYTES: "_read_pcie_throughput",
    schema.NVLINK_ERRORS: "_read_nvlink_errors",
    schema.NVLINK_LINKS: "_read_nvlink_links",
    schema.GPU_INFO: "_read_identity",
    schema.GPM_SUPPORTED: "_read_gpm",
}
StepKind = Literal["read", "once", "fields", "hand"]


def _plan() -> tuple[tuple[StepKind, Metric, NvmlRead | None], ...]:
    """Every GPU's collection, in contract order: one step per call recipe ("once": republish the value read
    at start-up), the one batched field call at the first field recipe, hand-written readers in place."""
    steps: list[tuple[StepKind, Metric, NvmlRead | None]] = []
    for metric in schema.METRICS:
        for read in metric.nvml_reads:
            if not read.field:
                steps.append(("once" if read.once else "read", metric, read))
            elif not any(kind == "fields" for kind, _, _ in steps):
                steps.append(("fields", metric, None))
        if metric in _HAND_WRITTEN:
            steps.append(("hand", metric, None))
    return tuple(steps)


PLAN = _plan()
#: Field recipes, in contract order: what the batched nvmlDeviceGetFieldValues call asks.
FIELD_READS: tuple[tuple[Metric, NvmlRead], ...] = tuple(
    (m, r) for m in schema.METRICS for r in m.nvml_reads if r.field
)


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
    memory_call: NvmlCall | None = None  # the GPU's memory recipe, asked of this instance


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
    #: Values of the ``once`` recipes, read at start-up (max clocks, max PCIe link).
    static: dict[NvmlRead, float] = field(default_factory=dict)
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


@dataclass
class _Pass:
    """One GPU's collection: what it produced and what failed, the results of calls several recipes share,
    and which (family, labels) the batched field call delivered (so fallbacks skip those)."""

    gpu: _Gpu
    out: list[tuple[Metric, Labels, float]]
    errors: list[str]
    results: dict[NvmlCall, Any] = field(default_factory=dict)
    from_fields: set[tuple[Metric, tuple[tuple[str, str], ...]]] = field(default_factory=set)


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
        proc_root: str | Path = "/proc",
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
        self.proc_root = Path(proc_root)
        self._samplers: dict[int, ProcessSampler] = {}  # GPU index -> its sampler, while the GPU is shared
        self._gpus: list[_Gpu] | None = None
        self._topology: list[tuple[Labels, float]] = []
        self._watcher: EventWatcher | None = None
        self._retry_at = float("-inf")
        self._unavailable = ""
        self._logged_unavailable = False
        self._initialized = False
        self._steps = [self._step(kind, metric, read) for kind, metric, read in PLAN]
        self._ensure_init(Reading())

    def _step(self, kind: StepKind, metric: Metric, read: NvmlRead | None) -> Callable[[_Pass], None]:
        if kind == "read":
            return partial(self._read, metric, read)
        if kind == "once":
            return partial(self._republish, metric, read)
        if kind == "fields":
            return self._read_fields
        return getattr(self, _HAND_WRITTEN[metric])

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
        self._field_table = {getattr(nv, r.field): (m, r) for m, r in FIELD_READS if hasattr(nv, r.field)}
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
            gpu.static = self._read_once(gpu)
            gpu.nvlinks = self._discover_links(gpu)
            # NVLink fields take scopeId UINT_MAX for "summed over all links"
            gpu.fields = [
                (field_id, UINT_MAX)
                for field_id, (metric, _read) in self._field_table.items()
                if gpu.nvlinks or metric not in _NVLINK_FAMILIES
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

    def _read_once(self, gpu: _Gpu) -> dict[NvmlRead, float]:
        """The ``once`` recipes: properties that never change, asked at start-up only."""
        nv = self._nv
        values: dict[NvmlRead, float] = {}
        for kind, _metric, read in PLAN:
            if kind != "once":
                continue
            call = read.call
            fn = getattr(nv, call.name, None)
            raw = None if fn is None else self._static(gpu, call.key, fn, gpu.handle, *self._args(call))
            value = None if raw is None else _value(nv, read, raw)
            if value is not None:
                values[read] = value
        return values

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
            mig = _Mig(gi, profile, mh, labels, mig_uuid, memory_call=_mig_memory_call(gi))
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
        if self._attributor is not None:  # before the GPUs: shared ones are read per holder
            refresh_attribution(reading, self._attributor)
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
            publish_allocations(reading, self._attributor, _devices(live))
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

    def _args(self, call: NvmlCall) -> list[Any]:
        """The pynvml constants a recipe names, looked up in the binding in use."""
        return [getattr(self._nv, name) for name in call.args]

    def _ask(self, p: _Pass, call: NvmlCall, handle: object = None) -> Any:
        """Execute one recipe call (on the GPU, or on ``handle``); a binding without the function never asks."""
        fn = getattr(self._nv, call.name, None)
        if fn is None:
            return None
        return self._call(p.gpu, call.key, p.errors, fn, p.gpu.handle if handle is None else handle,
                          *self._args(call))

    def _result(self, p: _Pass, read: NvmlRead) -> Any:
        """The result of ``read``'s call, asked once per collection however many recipes share it."""
        call = read.call
        if call in p.results:
            return p.results[call]
        raw = self._ask(p, call)
        if raw is None and read.fallback is not None and call.key in p.gpu.skip:
            raw = self._ask(p, read.fallback)
        p.results[call] = raw
        return raw

    def _collect_gpu(self, gpu: _Gpu, out: list[tuple[Metric, Labels, float]], errors: list[str]) -> None:
        """Every step of the plan, then the GPU's MIG instances, then its holders' use when it is shared."""
        p = _Pass(gpu, out, errors)
        for step in self._steps:
            step(p)
        self._read_migs(p)
        self._read_sharers(p)

    # -- the generic reader -------------------------------------------------------------------------
    def _read(self, metric: Metric, read: NvmlRead, p: _Pass) -> None:
        """One call recipe: ask (or reuse) its call, convert the result, publish it with its labels."""
        raw = self._result(p, read)
        if raw is None:
            return
        value = _value(self._nv, read, raw)
        if value is not None:
            p.out.append((metric, _labels(p.gpu.labels, read), value))

    def _republish(self, metric: Metric, read: NvmlRead, p: _Pass) -> None:
        """A ``once`` recipe: the value read at start-up, if the GPU had one."""
        value = p.gpu.static.get(read)
        if value is not None:
            p.out.append((metric, _labels(p.gpu.labels, read), value))

    def _read_fields(self, p: _Pass) -> None:
        """Every field recipe (memory temperature, recovery action, NVLink bytes and errors) in one batched call.

        Records what it delivered in ``p.from_fields``, so the hand-written readers only fall back to
        slower per-link calls for what the driver did not give here.
        """
        nv = self._nv
        gpu = p.gpu
        if not gpu.fields:
            return
        values = self._call(gpu, "field_values", p.errors, nv.nvmlDeviceGetFieldValues, gpu.handle, gpu.fields)
        if values is None:
            return
        keep = []
        table = self._field_table
        for request, v in zip(gpu.fields, values, strict=True):
            if v.nvmlReturn in self._field_absent:
                log.info("GPU %s: field %s unavailable (%s); omitted from now on", gpu.index, v.fieldId,
                         nv.NVMLError(v.nvmlReturn))
                continue
            keep.append(request)
            if v.nvmlReturn != nv.NVML_SUCCESS:
                p.errors.append(f"GPU {gpu.index}: field {v.fieldId}: {nv.NVMLError(v.nvmlReturn)}")
                continue
            metric, read = table[v.fieldId]
            m, d = read.factors
            p.out.append((metric, _labels(gpu.labels, read), _field_value(nv, v) * m / d))
            p.from_fields.add((metric, read.labels))
        gpu.fields = keep

    # -- hand-written readers ------------------------------------------------------------------------
    def _read_clock_events(self, p: _Pass) -> None:
        """The clock-event (throttle) bitmask, one 0/1 series per reason; pre-12.x drivers name it Throttle."""
        nv = self._nv
        gpu, h = p.gpu, p.gpu.handle
        reasons = self._call(gpu, "clock_events", p.errors, nv.nvmlDeviceGetCurrentClocksEventReasons, h)
        if reasons is None and "clock_events" in gpu.skip:
            reasons = self._call(gpu, "clock_throttle", p.errors, nv.nvmlDeviceGetCurrentClocksThrottleReasons, h)
        if reasons is not None:
            base = gpu.labels
            for bit, reason in _REASONS:
                p.out.append((schema.CLOCK_EVENT_ACTIVE, {**base, "reason": reason}, 1.0 if reasons & bit else 0.0))

    def _read_pcie_throughput(self, p: _Pass) -> None:
        """PCIe bytes from the driver's instantaneous KiB/s, integrated; GPU with GPM: see ``_read_gpm``."""
        nv = self._nv
        gpu, h = p.gpu, p.gpu.handle
        if gpu.gpm is not None:
            return  # GPM gives PCIe traffic averaged over the whole interval
        tx = self._call(gpu, "pcie_throughput", p.errors, nv.nvmlDeviceGetPcieThroughput, h,
                        nv.NVML_PCIE_UTIL_TX_BYTES)
        rx = self._call(gpu, "pcie_throughput", p.errors, nv.nvmlDeviceGetPcieThroughput, h,
                        nv.NVML_PCIE_UTIL_RX_BYTES)
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
            p.out.append((schema.PCIE_BYTES, {**gpu.labels, "direction": direction}, total))

    def _read_nvlink_errors(self, p: _Pass) -> None:
        """NVLink error counters the field call did not deliver, summed link by link."""
        nv = self._nv
        gpu = p.gpu
        for counter_name, type_label in NVLINK_COUNTERS:
            if not gpu.nvlinks or (schema.NVLINK_ERRORS, (("type", type_label),)) in p.from_fields:
                continue  # no links, or the batched field call already summed it over links
            key = "nvlink_" + type_label
            counter = getattr(nv, counter_name)
            total = 0
            for link in gpu.nvlinks:
                count = self._call(gpu, key, p.errors, nv.nvmlDeviceGetNvLinkErrorCounter, gpu.handle, link, counter)
                if count is None:
                    break
                total += count
            else:
                p.out.append((schema.NVLINK_ERRORS, {**gpu.labels, "type": type_label}, float(total)))

    def _read_nvlink_links(self, p: _Pass) -> None:
        """How many of the GPU's NVLinks are up and down (left out unless every link answered)."""
        nv = self._nv
        gpu = p.gpu
        if not gpu.nvlinks:
            return
        up = down = 0
        for link in gpu.nvlinks:
            state = self._call(gpu, "nvlink_state", p.errors, nv.nvmlDeviceGetNvLinkState, gpu.handle, link)
            if state is None:
                break
            if state:
                up += 1
            else:
                down += 1
        if up + down == len(gpu.nvlinks):
            p.out.append((schema.NVLINK_LINKS, {**gpu.labels, "state": "up"}, float(up)))
            p.out.append((schema.NVLINK_LINKS, {**gpu.labels, "state": "down"}, float(down)))

    def _read_identity(self, p: _Pass) -> None:
        p.out.append((schema.GPU_INFO, p.gpu.info, 1.0))

    def _read_gpm(self, p: _Pass) -> None:
        """GPM support, the GPU's GPM ratios and its PCIe (and, without NVLink fields, NVLink) bytes."""
        gpu = p.gpu
        p.out.append((schema.GPM_SUPPORTED, gpu.labels, 1.0 if gpu.gpm_supported else 0.0))
        if gpu.gpm is None:
            return
        values = self._finish_gpm(gpu, gpu.gpm, gpu.labels, p.out, p.errors)
        if values is None:
            return
        nvlink_from_fields = any(metric is schema.NVLINK_BYTES for metric, _ in p.from_fields)
        for (family, direction), total in gpu.gpm.bytes.items():
            if family is schema.PCIE_BYTES or (gpu.nvlinks and not nvlink_from_fields):
                p.out.append((family, {**gpu.labels, "direction": direction}, total))

    def _read_migs(self, p: _Pass) -> None:
        """Each MIG instance's memory (the GPU's memory recipe, asked of the instance) and GPM ratios."""
        for mig in p.gpu.migs:
            mem = self._ask(p, mig.memory_call, mig.handle)
            if mem is not None:
                for metric in _MIG_MEMORY:
                    p.out.append((metric, mig.labels, _value(self._nv, metric.nvml_reads[0], mem)))
            if mig.gpm is not None:
                self._finish_gpm(p.gpu, mig.gpm, mig.labels, p.out, p.errors)

    def _read_sharers(self, p: _Pass) -> None:
        """Each holder's use of a whole GPU two or more pods or jobs hold (nvml_processes), labelled as its
        allocation. Only shared GPUs are asked: an unshared one costs nothing and keeps no sampler. MIG
        instances are out of scope: NVML reports no utilization, per process either, for a GPU in MIG mode."""
        gpu = p.gpu
        holders = () if self._attributor is None or gpu.migs else self._attributor.holders(gpu.uuid, str(gpu.index))
        if len(holders) < 2:
            self._samplers.pop(gpu.index, None)
            return
        sampler = self._samplers.get(gpu.index)
        if sampler is None:
            sampler = self._samplers[gpu.index] = ProcessSampler(self.proc_root)

        def ask(key: str, fn: Callable[..., Any], *args: Any) -> Any:
            return self._call(gpu, key, p.errors, fn, *args)

        found = sampler.sample(self._nv, gpu.handle, holders, ask, lambda key: key in gpu.skip) or {}
        for holder, use in found.items():
            labels = {**gpu.labels, **holder.labels()}
            p.out.append((schema.SHARER_UTILIZATION, labels, use.utilization))
            if use.memory_bytes is not None:
                p.out.append((schema.SHARER_MEMORY_USED, labels, float(use.memory_bytes)))

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
        self._samplers.clear()
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


#: Per MIG instance, NVML reports memory (its own) through the GPU's memory recipe.
_MIG_MEMORY = (schema.MEMORY_USED, schema.MEMORY_TOTAL)


def _mig_memory_call(gpu_instance: int) -> NvmlCall:
    """The memory recipe's call under the instance's own key (so one instance's failure skips only it)."""
    call = schema.MEMORY_USED.nvml_reads[0].call
    assert call is not None
    return replace(call, key=f"mig{gpu_instance}_memory")


def _labels(base: Labels, read: NvmlRead) -> Labels:
    return {**base, **dict(read.labels)} if read.labels else base


def _value(nv: ModuleType, read: NvmlRead, raw: Any) -> float | None:
    """The base-unit value of ``read`` from its call's result; None when the result means unknown."""
    if read.pick:
        raw = raw[int(read.pick)] if read.pick.isdigit() else getattr(raw, read.pick)
    if read.omit_if and raw == getattr(nv, read.omit_if):
        return None
    if read.true_if:
        return 1.0 if raw == getattr(nv, read.true_if) else 0.0
    if read.convert == "flag":
        return 1.0 if raw else 0.0
    m, d = read.factors
    return (float(len(raw)) if read.convert == "count" else float(raw)) * m / d


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
    proc_root = getattr(args, "proc_root", None) or "/proc"
    kube_only = [flag for flag, dest in (("--job-pod-label", "job_pod_label"), ("--kube-api", "kube_api"),
                                         ("--job-map", "job_map"), ("--dra-driver", "dra_driver"),
                                         ("--cdi-spec-dir", "cdi_spec_dir")) if getattr(args, dest, None)]
    if kube_only and not getattr(args, "kubelet_socket", None):
        raise ValueError(f"{', '.join(kube_only)} need --kubelet-socket (Kubernetes attribution)")
    attributor = build_attributor(
        getattr(args, "kubelet_socket", None), getattr(args, "slurm_job_dir", None),
        ttl=getattr(args, "attribution_ttl", 10.0),
        slurm_meta_dir=getattr(args, "slurm_meta_dir", None),
        static_jobs=load_job_map(job_map) if job_map else None,
        job_label=getattr(args, "job_pod_label", None),
        kube_api=getattr(args, "kube_api", None),
        kube_token_file=getattr(args, "kube_token_file", None),
        kube_ca_file=getattr(args, "kube_ca_file", None),
        dra_drivers=getattr(args, "dra_driver", None),
        cdi_spec_dirs=getattr(args, "cdi_spec_dir", None),
        proc_root=proc_root,
    )
    return NvmlSource(
        hostname=getattr(args, "nvml_hostname", None),
        gpm_interval=getattr(args, "gpm_interval", MIN_GPM_INTERVAL),
        events=getattr(args, "xid_events", True),
        attributor=attributor,
        proc_root=proc_root,
    )
