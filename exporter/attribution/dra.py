"""GPUs allocated by Kubernetes Dynamic Resource Allocation (DRA), as the kubelet reports them.

With DRA the kubelet's pod-resources ``List()`` names a container's devices in
``dynamic_resources`` (KEP-3695; kubelet feature gate ``KubeletPodResourcesDynamicResources``:
alpha and off in 1.27-1.33, beta and on from 1.34, GA in 1.36): per claim, ``claim_resources``
with ``driver_name``, ``pool_name``, ``device_name`` (from 1.31) and the CDI devices the runtime
injected (``vendor/class=name``). None of these is a GPU UUID, so this module turns them into one.

NVIDIA's DRA driver (``gpu.nvidia.com``, github.com/NVIDIA/k8s-dra-driver-gpu) names a whole GPU
``gpu-<minor>`` (the ``/dev/nvidia<minor>`` minor, not the NVML index, since v25.3.0; the index
before), a MIG device ``gpu-<parent minor>-mig-...`` (profile and placement, never the GPU-instance
id), and writes one transient CDI spec per claim (``/var/run/cdi/k8s.gpu.nvidia.com-claim_<uid>.yaml``)
whose devices, named ``<claim uid>-<device name>``, carry device nodes: ``/dev/nvidia<minor>`` for a
GPU, plus ``/dev/nvidia-caps/nvidia-cap<m>`` for a MIG device. The driver sets
``NVIDIA_VISIBLE_DEVICES=void``, so no UUID travels in the spec's environment.

Resolution, most exact first:
1. the CDI spec device (read-only from the CDI spec directories): a UUID list in its
   ``NVIDIA_VISIBLE_DEVICES`` (other CDI generators), else its nvidia-cap nodes -> (GPU minor, GPU
   instance) by ``/proc/driver/nvidia-caps/mig-minors``, else its ``/dev/nvidia<minor>`` node;
2. the device name: ``gpu-<minor>`` (whole GPUs only; a MIG name does not say its GPU instance).
A minor becomes a UUID by ``/proc/driver/nvidia/gpus/*/information``; where that is unreadable the
minor is taken as the NVML index (equal on most hosts, not all) and that is reported.
Devices of other drivers are ignored; a device of a watched driver that maps to nothing is
reported (once a refresh), never guessed.
"""

from __future__ import annotations

import os
import re
import stat
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from exporter.attribution.base import AttributionError

DEFAULT_DRIVERS = ("gpu.nvidia.com",)
#: The CDI specification's default spec directories (static, then generated).
DEFAULT_CDI_DIRS = ("/etc/cdi", "/var/run/cdi")
#: CDI specs larger than this are not read (the GPU operator's full spec is ~100 KiB).
MAX_SPEC_BYTES = 4 * 1024 * 1024

_GPU_NAME = re.compile(r"^gpu-(?P<minor>\d+)$")
_MIG_NAME = re.compile(r"^gpu-\d+-mig-.+$")
_VFIO_NAME = re.compile(r"^gpu-vfio-\d+$")  # a GPU passed through to a VM: NVML cannot see it
_CLAIM_UID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}-", re.IGNORECASE)
_GPU_NODE = re.compile(r"^/dev/nvidia(?P<minor>\d+)$")
_CAP_NODE = re.compile(r"^/dev/nvidia-caps/nvidia-cap(?P<minor>\d+)$")
_MIG_MINOR = re.compile(r"^gpu(?P<gpu>\d+)/gi(?P<gi>\d+)/(?:ci\d+/)?access\s+(?P<minor>\d+)$")
_NO_DEVICES = {"", "void", "none", "all"}


@dataclass(frozen=True)
class DeviceRef:
    """One GPU or MIG instance a DRA device stands for, in a form the attribution table keys on:
    a UUID (``GPU-...``/``MIG-...``), a parent UUID with its GPU instance, or a bare NVML index."""

    uuid: str | None = None
    gpu_instance: str | None = None
    index: str | None = None


@dataclass(frozen=True)
class CdiDevice:
    """What attribution needs from one CDI spec device: its environment and device node paths."""

    env: tuple[str, ...]
    nodes: tuple[str, ...]


@dataclass
class CdiSpecs:
    """CDI spec devices by qualified name (``vendor/class=name``), re-parsed only when a file changes."""

    dirs: tuple[str, ...]
    _files: dict[str, tuple[tuple[int, int], dict[str, CdiDevice]]] = field(default_factory=dict)

    def load(self, errors: list[AttributionError]) -> dict[str, CdiDevice]:
        """Every device of every spec file; a missing directory set or garbled file is an error
        (no directories configured: specs are not read, devices map by name only)."""
        if not self.dirs:
            return {}
        present = [d for d in self.dirs if os.path.isdir(d)]
        if not present:
            errors.append(AttributionError(
                "cdi_spec_dir_missing",
                f"no CDI spec directory ({', '.join(self.dirs)}): DRA GPUs are matched by device name only "
                "(mount /var/run/cdi read-only into the exporter)"))
            self._files.clear()
            return {}
        devices: dict[str, CdiDevice] = {}
        bad: list[str] = []
        seen: set[str] = set()
        for directory in present:
            try:
                names = sorted(os.listdir(directory))
            except OSError as exc:
                bad.append(f"{directory}: {exc.strerror or exc}")
                continue
            for name in names:
                if not name.endswith((".yaml", ".yml", ".json")):
                    continue
                path = os.path.join(directory, name)
                seen.add(path)
                try:
                    devices.update(self._file(path))
                except (OSError, ValueError) as exc:
                    bad.append(f"{path}: {exc}")
        for path in set(self._files) - seen:
            del self._files[path]
        if bad:
            shown = "; ".join(bad[:3]) + (f"; and {len(bad) - 3} more" if len(bad) > 3 else "")
            errors.append(AttributionError("cdi_spec_invalid", f"unusable CDI spec files: {shown}"))
        return devices

    def _file(self, path: str) -> dict[str, CdiDevice]:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            return {}  # a FIFO or device must never block the scrape; the CDI runtime ignores them too
        key = (info.st_mtime_ns, info.st_size)
        cached = self._files.get(path)
        if cached is not None and cached[0] == key:
            return cached[1]
        if info.st_size > MAX_SPEC_BYTES:
            raise ValueError(f"larger than {MAX_SPEC_BYTES} bytes")
        parsed = parse_cdi_spec(Path(path).read_bytes())
        self._files[path] = (key, parsed)
        return parsed


def parse_cdi_spec(data: bytes) -> dict[str, CdiDevice]:
    """A CDI spec (YAML or JSON) -> its devices by qualified name; ValueError when it is not one."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        spec = yaml.load(data, Loader=loader)  # a safe loader (libyaml's when installed)
    except yaml.YAMLError as exc:
        raise ValueError(f"not YAML/JSON ({type(exc).__name__})") from None
    if not isinstance(spec, dict) or not isinstance(spec.get("kind"), str) or "/" not in spec["kind"]:
        raise ValueError("not a CDI spec (no 'kind: vendor/class')")
    entries = spec.get("devices")
    if not isinstance(entries, list):
        raise ValueError("not a CDI spec (no 'devices' list)")
    out: dict[str, CdiDevice] = {}
    for entry in entries:
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ValueError("a device without a name")
        edits = entry.get("containerEdits") or {}
        if not isinstance(edits, dict):
            raise ValueError(f"device {entry['name']}: containerEdits is not a mapping")
        env = tuple(e for e in edits.get("env") or () if isinstance(e, str))
        nodes = tuple(n["path"] for n in edits.get("deviceNodes") or ()
                      if isinstance(n, dict) and isinstance(n.get("path"), str))
        out[f"{spec['kind']}={entry['name']}"] = CdiDevice(env, nodes)
    return out


def read_gpu_minors(proc_root: str) -> dict[int, str] | None:
    """GPU device minor -> UUID from the driver's ``/proc/driver/nvidia/gpus/<bus>/information``;
    None when the directory cannot be read (no driver, or /proc hidden)."""
    base = os.path.join(proc_root, "driver", "nvidia", "gpus")
    try:
        buses = os.listdir(base)
    except OSError:
        return None
    minors: dict[int, str] = {}
    for bus in buses:
        fields: dict[str, str] = {}
        try:
            with open(os.path.join(base, bus, "information"), encoding="utf-8", errors="replace") as fh:
                for line in fh:
                    key, sep, value = line.partition(":")
                    if sep:
                        fields[key.strip()] = value.strip()
        except OSError:
            continue
        uuid, minor = fields.get("GPU UUID", ""), fields.get("Device Minor", "")
        if uuid.startswith("GPU-") and minor.isdigit():
            minors[int(minor)] = uuid
    return minors


def read_mig_minors(proc_root: str) -> dict[int, tuple[int, int]]:
    """nvidia-cap minor -> (GPU minor, GPU instance) from ``/proc/driver/nvidia-caps/mig-minors``
    (a fixed table the driver publishes; empty when unreadable)."""
    table: dict[int, tuple[int, int]] = {}
    try:
        with open(os.path.join(proc_root, "driver", "nvidia-caps", "mig-minors"), encoding="utf-8") as fh:
            for line in fh:
                if m := _MIG_MINOR.match(line.strip()):
                    table[int(m["minor"])] = (int(m["gpu"]), int(m["gi"]))
    except OSError:
        pass
    return table


class DraResolver:
    """Maps the DRA devices of one ``List()`` reply; node facts are read at most once, and only
    when a device of a watched driver shows up (nodes without DRA pay nothing)."""

    def __init__(self, drivers: Iterable[str], specs: CdiSpecs, proc_root: str):
        self.drivers = frozenset(drivers)
        self._vendors = {f"k8s.{d}" for d in self.drivers} | set(self.drivers)
        self._specs = specs
        self._proc_root = proc_root
        self._errors: list[AttributionError] = []
        self._cdi: dict[str, CdiDevice] | None = None
        self._minors: dict[int, str] | None = None
        self._mig_minors: dict[int, tuple[int, int]] | None = None
        self._minor_fallback = False
        self._unknown: dict[str, None] = {}  # insertion-ordered set: each device reported once

    def watches(self, driver_name: str, cdi_names: Iterable[str]) -> bool:
        """A device of a configured driver (kubelets before 1.31 send only CDI names: their vendor)."""
        if driver_name:
            return driver_name in self.drivers
        return any(name.partition("/")[0] in self._vendors for name in cdi_names)

    def resolve(self, driver_name: str, pool_name: str, device_name: str, cdi_names: Iterable[str]) -> list[DeviceRef]:
        """The GPUs and MIG instances one claim resource stands for; [] (and noted) when unknown."""
        cdi_names = list(cdi_names)
        for name in cdi_names:
            refs = self._from_cdi(name)
            if refs:
                return refs
        name = device_name or next((n for n in map(_device_from_cdi_name, cdi_names) if n), "")
        if _VFIO_NAME.match(name):
            return []
        if m := _GPU_NAME.match(name):
            ref = self._gpu_by_minor(int(m["minor"]))
            if ref is not None:
                return [ref]
            why = f"no GPU with device minor {m['minor']} on this node"
        elif _MIG_NAME.match(name):
            why = "a MIG device needs its CDI spec"
        else:
            why = "unknown device name"
        label = "/".join(p for p in (driver_name, pool_name, device_name) if p) or ",".join(cdi_names)
        self._unknown.setdefault(f"{label} ({why})")
        return []

    def errors(self) -> list[AttributionError]:
        """What went wrong while resolving, one error per kind."""
        out = list(self._errors)
        if self._minor_fallback:
            out.append(AttributionError(
                "gpu_minors_unavailable",
                f"{self._proc_root}/driver/nvidia/gpus unreadable: DRA GPUs named by device minor are "
                "matched to the NVML index of that number (right when minors follow PCI order)"))
        if self._unknown:
            shown = list(self._unknown)
            text = "; ".join(shown[:5]) + (f"; and {len(shown) - 5} more" if len(shown) > 5 else "")
            out.append(AttributionError("dra_device_unknown", f"DRA devices not mapped to a GPU: {text}"))
        return out

    def _from_cdi(self, qualified: str) -> list[DeviceRef]:
        if self._cdi is None:
            self._cdi = self._specs.load(self._errors)
        device = self._cdi.get(qualified)
        if device is None:
            return []
        for entry in device.env:
            key, _, value = entry.partition("=")
            if key == "NVIDIA_VISIBLE_DEVICES" and value.strip().lower() not in _NO_DEVICES:
                ids = [v.strip() for v in value.split(",")]
                if all(i.startswith(("GPU-", "MIG-")) for i in ids):
                    return [DeviceRef(uuid=i) for i in ids]
        instances: dict[tuple[int, int], None] = {}
        for node in device.nodes:
            if m := _CAP_NODE.match(node):
                if self._mig_minors is None:
                    self._mig_minors = read_mig_minors(self._proc_root)
                if found := self._mig_minors.get(int(m["minor"])):
                    instances.setdefault(found)
        if instances:  # a MIG device: its spec also holds the parent's node, which is not its GPU
            refs = [self._instance(gpu, gi) for gpu, gi in instances]
            return [r for r in refs if r is not None]
        refs = []
        for node in device.nodes:
            if (m := _GPU_NODE.match(node)) and (ref := self._gpu_by_minor(int(m["minor"]))) is not None:
                refs.append(ref)
        return refs

    def _instance(self, gpu_minor: int, gi: int) -> DeviceRef | None:
        parent = self._gpu_by_minor(gpu_minor)
        if parent is None:
            return None
        return DeviceRef(uuid=parent.uuid, index=parent.index, gpu_instance=str(gi))

    def _gpu_by_minor(self, minor: int) -> DeviceRef | None:
        if self._minors is None:
            self._minors = read_gpu_minors(self._proc_root)
        if self._minors is None:
            self._minor_fallback = True
            return DeviceRef(index=str(minor))
        uuid = self._minors.get(minor)
        return DeviceRef(uuid=uuid) if uuid else None


def _device_from_cdi_name(qualified: str) -> str:
    """``k8s.gpu.nvidia.com/claim=<claim uid>-gpu-0`` -> ``gpu-0`` (the driver's naming convention)."""
    name = qualified.partition("=")[2]
    return _CLAIM_UID.sub("", name, count=1)
