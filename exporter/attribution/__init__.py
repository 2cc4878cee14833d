"""GPU attribution: who holds each GPU (Kubernetes pod, Slurm job), for truegpu_gpu_allocation_info.

A source calls :func:`attribute` once per collection with the GPUs (and MIG instances)
it saw; that refreshes the attributor (cached for ttl seconds, never raises), counts its
errors without marking the source down, and adds truegpu_gpu_allocation_info for every
held device.

Importing this package is cheap: grpc is only imported when a KubernetesAttributor
first refreshes.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exporter.attribution.base import Allocation, AttributionError, Attributor, CachedAttributor, CompositeAttributor
from exporter.attribution.jobs import KNOWN_JOB_LABELS, derive_job
from exporter.attribution.kubernetes import DEFAULT_SOCKET, KubernetesAttributor
from exporter.attribution.slurm import SlurmAttributor
from exporter.schema import GPU_ALLOCATION_INFO
from exporter.sources.base import Labels, Reading, SourceError

#: One device to attribute: (its series labels, GPU uuid, GPU index, gpu_instance, MIG uuid).
Device = tuple[Labels, str, str, str | None, str | None]

__all__ = [
    "DEFAULT_SOCKET",
    "KNOWN_JOB_LABELS",
    "Allocation",
    "AttributionError",
    "Attributor",
    "CachedAttributor",
    "CompositeAttributor",
    "KubernetesAttributor",
    "SlurmAttributor",
    "attribute",
    "build_attributor",
    "derive_job",
]


def build_attributor(
    kubelet_socket: str | None = None,
    slurm_dir: str | None = None,
    *,
    timeout: float = 2.0,
    ttl: float = 10.0,
    static_jobs: Mapping[str, str] | None = None,
) -> Attributor | None:
    """The attributor the exporter's options ask for: Kubernetes first, then Slurm;
    None when neither is configured (the exporter then emits no allocation series)."""
    parts: list[Attributor] = []
    if kubelet_socket:
        parts.append(KubernetesAttributor(kubelet_socket, timeout=timeout, ttl=ttl, static_jobs=static_jobs))
    if slurm_dir:
        parts.append(SlurmAttributor(slurm_dir, ttl=ttl))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else CompositeAttributor(parts)


def attribute(reading: Reading, attributor: Attributor, devices: Iterable[Device]) -> None:
    """Add who holds each device to ``reading``; attribution trouble is counted, not fatal."""
    for error in attributor.refresh():
        reading.errors.append(SourceError(getattr(error, "kind", "attribution"), str(error)))
    for labels, uuid, gpu, gpu_instance, mig_uuid in devices:
        holder = attributor.lookup(uuid, gpu, gpu_instance, mig_uuid)
        if holder is not None:
            reading.add(GPU_ALLOCATION_INFO, {**labels, **holder.labels()}, 1.0)
