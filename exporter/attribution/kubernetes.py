"""Kubernetes attribution from the kubelet pod-resources API (the way dcgm-exporter does it).

The kubelet serves ``PodResourcesLister.List`` on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``; mount that directory read-only into
the exporter pod). Each container lists the device-plugin devices it was given: for
NVIDIA, resource ``nvidia.com/gpu`` with GPU UUIDs (``GPU-...``), and MIG instances as
``nvidia.com/mig-<profile>`` (mixed strategy) or ``nvidia.com/gpu`` (single strategy)
with MIG UUIDs (``MIG-<uuid>``, or ``MIG-GPU-<uuid>/<gi>/<ci>`` on old drivers).
Also understood: time-slicing replicas ``GPU-<uuid>::<n>`` and GKE's ``nvidia<i>``,
``nvidia<i>/gi<g>`` and ``.../vgpu<n>`` ids.

The API carries no pod labels, so ``job`` comes from :func:`derive_job` on the pod
name (with the node's other pods of its namespace as ``siblings``: StatefulSet ordinals),
from ``static_jobs`` (``{"namespace/pod": job}``), or from ``pod_labels`` (a callable the
caller may back with the API server) with ``job_label``: then the operator and controller
labels name the owner exactly.

GPUs allocated by Dynamic Resource Allocation come in the same reply (``dynamic_resources``, with
the kubelet feature gate KubeletPodResourcesDynamicResources: on by default from 1.34) and are mapped
to GPU UUIDs and MIG instances by :mod:`exporter.attribution.dra` (claims of ``dra_drivers``, default
``gpu.nvidia.com``), then held exactly like device-plugin devices.

When a GPU is shared (time-slicing, or one ResourceClaim used by several containers or pods), ``lookup``
reports one holder: the first by (namespace, pod, container), so the series is stable between scrapes;
``holders`` lists every one in that order (a container holding several replicas of a GPU once).

``grpc`` and the generated stubs are imported on the first refresh, never at import
time: nodes without Kubernetes attribution do not pay for (or need) grpcio.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Collection, Iterable, Mapping
from dataclasses import dataclass, field, replace

from exporter.attribution.base import Allocation, AttributionError, CachedAttributor
from exporter.attribution.dra import DEFAULT_CDI_DIRS, DEFAULT_DRIVERS, CdiSpecs, DeviceRef, DraResolver
from exporter.attribution.jobs import derive_job

DEFAULT_SOCKET = "/var/lib/kubelet/pod-resources/kubelet.sock"
GPU_RESOURCE = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX = "nvidia.com/mig-"
#: The kubelet allows replies up to 16 MiB; grpc's client default is 4 MiB.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

_OLD_MIG = re.compile(r"^MIG-(?P<parent>GPU-[^/]+)/(?P<gi>\d+)/\d+$")
_GKE = re.compile(r"^nvidia(?P<index>\d+)(?:/gi(?P<gi>\d+))?$")

PodLabels = Callable[[str, str], Mapping[str, str] | None]
Holders = tuple[Allocation, ...]


@dataclass
class _Table:
    """Device id forms -> its holders (smallest first), filled from one List() reply."""

    by_uuid: dict[str, Holders] = field(default_factory=dict)  # GPU-... and MIG-... UUIDs
    by_parent_instance: dict[tuple[str, str], Holders] = field(default_factory=dict)  # (GPU uuid, gi)
    by_index: dict[str, Holders] = field(default_factory=dict)  # GKE nvidia<i>
    by_index_instance: dict[tuple[str, str], Holders] = field(default_factory=dict)  # GKE nvidia<i>/gi<g>

    def add(self, device_id: str, holder: Allocation) -> None:
        device_id = device_id.split("::", 1)[0].split("/vgpu", 1)[0]  # sharing replicas -> the device
        if m := _OLD_MIG.match(device_id):
            _hold(self.by_parent_instance, (m["parent"], m["gi"]), holder)
        elif m := _GKE.match(device_id):
            if m["gi"] is None:
                _hold(self.by_index, m["index"], holder)
            else:
                _hold(self.by_index_instance, (m["index"], m["gi"]), holder)
        _hold(self.by_uuid, device_id, holder)

    def add_ref(self, ref: DeviceRef, holder: Allocation) -> None:
        """A device a DRA claim resolved to (exporter.attribution.dra)."""
        if ref.uuid and ref.gpu_instance is not None:
            _hold(self.by_parent_instance, (ref.uuid, ref.gpu_instance), holder)
        elif ref.uuid:
            self.add(ref.uuid, holder)
        elif ref.index is not None and ref.gpu_instance is not None:
            _hold(self.by_index_instance, (ref.index, ref.gpu_instance), holder)
        elif ref.index is not None:
            _hold(self.by_index, ref.index, holder)


def _hold(table: dict, key: object, holder: Allocation) -> None:
    """Add ``holder`` to the device's holders, kept sorted so a shared device reports a stable first one."""
    held = table.get(key, ())
    if holder not in held:
        table[key] = tuple(sorted((*held, holder), key=_order))


def _order(a: Allocation) -> tuple[str, str, str]:
    return (a.namespace, a.pod, a.container)


class KubernetesAttributor(CachedAttributor[_Table]):
    """GPU and MIG holders from the kubelet pod-resources API."""

    name = "kubernetes"

    def __init__(
        self,
        socket_path: str = DEFAULT_SOCKET,
        timeout: float = 2.0,
        ttl: float = 10.0,
        max_stale: float = 60.0,
        resource_names: Iterable[str] = (GPU_RESOURCE,),
        mig_resource_prefix: str = MIG_RESOURCE_PREFIX,
        static_jobs: Mapping[str, str] | None = None,
        pod_labels: PodLabels | None = None,
        job_label: str | None = None,
        dra_drivers: Iterable[str] = DEFAULT_DRIVERS,
        cdi_spec_dirs: Iterable[str] = DEFAULT_CDI_DIRS,
        proc_root: str = "/proc",
        clock: Callable[[], float] = time.monotonic,
    ):
        super().__init__(ttl=ttl, max_stale=max_stale, clock=clock)
        self.socket_path = socket_path
        self.timeout = timeout
        self.resource_names = frozenset(resource_names)
        self.mig_resource_prefix = mig_resource_prefix
        self.static_jobs = dict(static_jobs or {})
        self.pod_labels = pod_labels
        self.job_label = job_label
        self.dra_drivers = frozenset(dra_drivers)
        self.proc_root = proc_root
        self._cdi_specs = CdiSpecs(tuple(cdi_spec_dirs))  # parsed specs kept between refreshes

    def _is_gpu_resource(self, name: str) -> bool:
        prefix = self.mig_resource_prefix
        return name in self.resource_names or bool(prefix and name.startswith(prefix))

    def holders(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> tuple[Allocation, ...]:
        """Every holder of the device; a shared device's with their pod UIDs where the API server is asked for
        pod labels (``--kube-api``): their processes' cgroups carry it, so per-process attribution needs no
        read of another user's environment. Asked only here, for shared devices (cached like the labels)."""
        found = super().holders(uuid, gpu, gpu_instance, mig_uuid)
        uid = getattr(self.pod_labels, "uid", None)
        if len(found) < 2 or uid is None:
            return found
        return tuple(replace(h, uid=uid(h.namespace, h.pod)) for h in found)

    def _job(self, namespace: str, pod: str, siblings: Collection[str] = ()) -> str:
        static = self.static_jobs.get(f"{namespace}/{pod}")
        if static:
            return static
        labels = None
        if self.pod_labels is not None:
            try:
                labels = self.pod_labels(namespace, pod)
            except Exception:  # a label lookup failure falls back to the pod name
                labels = None
        return derive_job(pod, labels, self.job_label, siblings)

    def _load(self, errors: list[AttributionError]) -> _Table | None:
        if not os.path.exists(self.socket_path):
            errors.append(AttributionError(
                "kubelet_socket_missing",
                f"kubelet pod-resources socket {self.socket_path} not found "
                "(mount /var/lib/kubelet/pod-resources into the exporter)"))
            return None
        reply = self._list(errors)
        if reply is None:
            return None
        table = _Table()
        dra = DraResolver(self.dra_drivers, self._cdi_specs, self.proc_root)
        names: dict[str, set[str]] = {}  # namespace -> pods on this node (StatefulSet ordinals: derive_job)
        for pod in reply.pod_resources:
            names.setdefault(pod.namespace, set()).add(pod.name)
        for pod in reply.pod_resources:
            job: str | None = None
            for container in pod.containers:
                holder: Allocation | None = None
                for devices in container.devices:
                    if not self._is_gpu_resource(devices.resource_name):
                        continue
                    if holder is None:
                        job = job or self._job(pod.namespace, pod.name, names[pod.namespace])
                        holder = Allocation(pod.namespace, pod.name, container.name, job)
                    for device_id in devices.device_ids:
                        table.add(device_id, holder)
                for claim in container.dynamic_resources:
                    for resource in claim.claim_resources:
                        cdi_names = [d.name for d in resource.cdi_devices]
                        if not dra.watches(resource.driver_name, cdi_names):
                            continue
                        refs = dra.resolve(resource.driver_name, resource.pool_name, resource.device_name, cdi_names)
                        if refs and holder is None:
                            job = job or self._job(pod.namespace, pod.name, names[pod.namespace])
                            holder = Allocation(pod.namespace, pod.name, container.name, job)
                        for ref in refs:
                            table.add_ref(ref, holder)
        errors.extend(dra.errors())
        return table

    def _list(self, errors: list[AttributionError]):  # -> ListPodResourcesResponse | None
        """One List() call on a fresh channel (cheap on a unix socket, and it survives
        kubelet restarts that replace the socket)."""
        try:
            import grpc

            from exporter.attribution.podresources import api_pb2, api_pb2_grpc
        except Exception as exc:  # ImportError, or stubs newer than the installed runtime
            errors.append(AttributionError(
                "grpc_missing", f"Kubernetes attribution needs grpcio and protobuf ({type(exc).__name__}: {exc})"))
            return None
        # A local subchannel pool: channels otherwise share gRPC's global subchannels, and one still
        # backing off from a dead kubelet would refuse the first call after the kubelet is back.
        options = [("grpc.max_receive_message_length", MAX_MESSAGE_BYTES), ("grpc.use_local_subchannel_pool", 1)]
        try:
            with grpc.insecure_channel(f"unix:{self.socket_path}", options=options) as channel:
                stub = api_pb2_grpc.PodResourcesListerStub(channel)
                return stub.List(api_pb2.ListPodResourcesRequest(), timeout=self.timeout)
        except grpc.RpcError as exc:
            code = exc.code() if hasattr(exc, "code") else None
            detail = exc.details() if hasattr(exc, "details") else str(exc)
            if code == grpc.StatusCode.DEADLINE_EXCEEDED:
                kind, what = "kubelet_timeout", f"no reply within {self.timeout:g}s"
            elif code == grpc.StatusCode.UNAVAILABLE:
                kind, what = "kubelet_unavailable", "kubelet not answering"
            else:
                kind, what = "kubelet_error", f"List() failed with {getattr(code, 'name', code)}"
            errors.append(AttributionError(kind, f"pod-resources {self.socket_path}: {what}: {detail}"))
            return None

    def _lookup(
        self, table: _Table, uuid: str, gpu: str, gpu_instance: str | None, mig_uuid: str | None
    ) -> Allocation | None:
        held = self._holders(table, uuid, gpu, gpu_instance, mig_uuid)
        return held[0] if held else None

    def _holders(
        self, table: _Table, uuid: str, gpu: str, gpu_instance: str | None, mig_uuid: str | None
    ) -> Holders:
        if mig_uuid and (found := table.by_uuid.get(mig_uuid)):
            return found
        if gpu_instance is not None:
            found = table.by_parent_instance.get((uuid, gpu_instance)) or table.by_index_instance.get(
                (gpu, gpu_instance))
            if found:
                return found
        # A whole GPU held by a pod also holds its MIG instances.
        return table.by_uuid.get(uuid) or table.by_index.get(gpu) or ()
