"""GPU attribution: who holds each GPU (Kubernetes pod, Slurm job), for truegpu_gpu_allocation_info.

Usage from a source, once per collection::

    for error in attributor.refresh():        # cached for ttl seconds; never raises
        reading.errors.append(SourceError(getattr(error, "kind", "attribution"), str(error)))
    holder = attributor.lookup(uuid, gpu, gpu_instance, mig_uuid)
    if holder:
        reading.add(GPU_ALLOCATION_INFO, {**gpu_labels, **holder.labels()}, 1)

Importing this package is cheap: grpc is only imported when a KubernetesAttributor
first refreshes.
"""

from __future__ import annotations

from collections.abc import Mapping

from exporter.attribution.base import Allocation, AttributionError, Attributor, CachedAttributor, CompositeAttributor
from exporter.attribution.jobs import KNOWN_JOB_LABELS, derive_job
from exporter.attribution.kubernetes import DEFAULT_SOCKET, KubernetesAttributor
from exporter.attribution.slurm import SlurmAttributor

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
