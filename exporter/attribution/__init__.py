"""GPU attribution: who holds each GPU (Kubernetes pod, Slurm job), for truegpu_gpu_allocation_info.

A source calls :func:`refresh_attribution` once per collection before it reads its GPUs
(it re-reads the attributor, cached for ttl seconds, never raises, and counts its errors
without marking the source down; the NVML source asks for a shared GPU's holders while it
reads it) and :func:`publish_allocations` after, with the GPUs (and MIG instances) it saw:
truegpu_gpu_allocation_info for every held device.

Importing this package is cheap: grpc is only imported when a KubernetesAttributor
first refreshes, requests on the first pod-label lookup, yaml when a job map is loaded.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from exporter.attribution.base import Allocation, AttributionError, Attributor, CachedAttributor, CompositeAttributor
from exporter.attribution.dra import DEFAULT_CDI_DIRS
from exporter.attribution.dra import DEFAULT_DRIVERS as DEFAULT_DRA_DRIVERS
from exporter.attribution.jobs import KNOWN_JOB_LABELS, derive_job
from exporter.attribution.kubernetes import DEFAULT_SOCKET, KubernetesAttributor
from exporter.attribution.podlabels import DEFAULT_CA_FILE, DEFAULT_TOKEN_FILE, KubeApiPodLabels
from exporter.attribution.slurm import SlurmAttributor
from exporter.schema import GPU_ALLOCATION_INFO, SLURM_JOB_INFO, WORKLOAD
from exporter.sources.base import Labels, Reading, SourceError

#: One device to attribute: (its series labels, GPU uuid, GPU index, gpu_instance, MIG uuid).
Device = tuple[Labels, str, str, str | None, str | None]

__all__ = [
    "DEFAULT_CDI_DIRS",
    "DEFAULT_DRA_DRIVERS",
    "DEFAULT_SOCKET",
    "KNOWN_JOB_LABELS",
    "Allocation",
    "AttributionError",
    "Attributor",
    "CachedAttributor",
    "CompositeAttributor",
    "KubeApiPodLabels",
    "KubernetesAttributor",
    "SlurmAttributor",
    "build_attributor",
    "derive_job",
    "load_job_map",
    "publish_allocations",
    "refresh_attribution",
]


def build_attributor(
    kubelet_socket: str | None = None,
    slurm_dir: str | None = None,
    *,
    timeout: float = 2.0,
    ttl: float = 10.0,
    slurm_meta_dir: str | None = None,
    static_jobs: Mapping[str, str] | None = None,
    job_label: str | None = None,
    kube_api: str | None = None,
    kube_token_file: str | None = None,
    kube_ca_file: str | None = None,
    pod_labels_ttl: float = 60.0,
    dra_drivers: Iterable[str] | None = None,
    cdi_spec_dirs: Iterable[str] | None = None,
    proc_root: str = "/proc",
) -> Attributor | None:
    """The attributor the exporter's options ask for: Kubernetes first, then Slurm;
    None when neither is configured (the exporter then emits no allocation series).

    With ``job_label`` or ``kube_api`` set, Kubernetes jobs come from pod labels read from
    the API server (``kube_api``, default in-cluster): ``job_label`` when the pod has it,
    else the well-known operator labels (only without ``job_label``), else the pod name.
    The label lookup's failures are counted with the attributor's own. ``dra_drivers`` (default
    ``gpu.nvidia.com``; empty: DRA claims ignored) and ``cdi_spec_dirs`` (default the CDI spec
    directories; empty: device names only) steer the mapping of DRA-allocated GPUs (:mod:`exporter.attribution.dra`),
    with the driver's device minors read under ``proc_root`` (the host's /proc)."""
    parts: list[Attributor] = []
    if kubelet_socket:
        pod_labels = None
        if job_label or kube_api:
            pod_labels = KubeApiPodLabels(
                kube_api,
                token_file=kube_token_file or DEFAULT_TOKEN_FILE,
                ca_file=kube_ca_file or DEFAULT_CA_FILE,
                timeout=timeout,
                ttl=pod_labels_ttl,
            )
        parts.append(KubernetesAttributor(
            kubelet_socket, timeout=timeout, ttl=ttl, static_jobs=static_jobs, pod_labels=pod_labels,
            job_label=job_label or None,
            dra_drivers=DEFAULT_DRA_DRIVERS if dra_drivers is None else [d for d in dra_drivers if d],
            cdi_spec_dirs=DEFAULT_CDI_DIRS if cdi_spec_dirs is None else [d for d in cdi_spec_dirs if d],
            proc_root=proc_root))
        if pod_labels is not None:
            parts.append(pod_labels)  # attributes nothing; its refresh() reports the lookups' failures
    if slurm_dir:
        parts.append(SlurmAttributor(slurm_dir, ttl=ttl, meta_directory=slurm_meta_dir))
    if not parts:
        return None
    return parts[0] if len(parts) == 1 else CompositeAttributor(parts)


def load_job_map(path: str) -> dict[str, str]:
    """A static ``{"namespace/pod": job}`` mapping from a YAML or JSON file (JSON is YAML);
    ValueError when the file is not such a mapping, OSError when it cannot be read."""
    import yaml

    with open(path, encoding="utf-8") as fh:
        try:
            data = yaml.safe_load(fh)
        except yaml.YAMLError as exc:
            raise ValueError(f"job map {path}: not YAML/JSON: {exc}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ValueError(f"job map {path}: expected a mapping of 'namespace/pod: job', got {type(data).__name__}")
    jobs: dict[str, str] = {}
    for key, job in data.items():
        if not isinstance(key, str) or key.count("/") != 1 or not all(key.split("/")):
            raise ValueError(f"job map {path}: key {key!r} is not 'namespace/pod'")
        if not isinstance(job, (str, int)) or isinstance(job, bool) or not str(job).strip():
            raise ValueError(f"job map {path}: job for {key!r} must be a non-empty string, got {job!r}")
        jobs[key] = str(job).strip()
    return jobs


def refresh_attribution(reading: Reading, attributor: Attributor) -> None:
    """Re-read the backend (cached for its ttl); its errors are counted in ``reading``, never raised."""
    for error in attributor.refresh():
        reading.errors.append(SourceError(getattr(error, "kind", "attribution"), str(error)))


def publish_allocations(reading: Reading, attributor: Attributor, devices: Iterable[Device]) -> None:
    """truegpu_gpu_allocation_info (and Slurm accounting) for every held device, from the last refresh."""
    for labels, uuid, gpu, gpu_instance, mig_uuid in devices:
        holder = attributor.lookup(uuid, gpu, gpu_instance, mig_uuid)
        if holder is not None:
            reading.add(GPU_ALLOCATION_INFO, {**labels, **holder.labels()}, 1.0)
            if holder.accounting is not None:
                user, account, partition = holder.accounting
                reading.add(SLURM_JOB_INFO, {**labels, WORKLOAD: holder.job, "user": user, "account": account,
                                             "partition": partition}, 1.0)
