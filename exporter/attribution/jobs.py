"""Derive the workload (``job``) from a pod: the unit the analyzer groups GPUs by.

The workload is what a person owns and scales (a Deployment, a StatefulSet, a CronJob, a
training job), so its name must survive pod restarts (new random suffixes) and must not
split a set of replicas into one workload per pod. Owners, first match wins:

1. an explicit label (``job_label``), else the labels the training operators and controllers
   put on every pod (:data:`KNOWN_JOB_LABELS`: Kubeflow training-operator, JobSet,
   LeaderWorkerSet, Volcano, Ray, then batch/v1 Job). A Job label naming a CronJob's run
   (``<cronjob>-<scheduled minute>``, 8+ digits) gives the CronJob: its runs are one workload;
2. controller labels: ``pod-template-hash`` (Deployment/ReplicaSet: the name less
   ``-<hash>-<suffix>``), ``statefulset.kubernetes.io/pod-name`` or
   ``apps.kubernetes.io/pod-index`` (StatefulSet: the name less ``-<ordinal>``);
3. the pod name, stripped of the suffixes that controllers and training operators add:

==================================================  ====================================
pod name                                            job
==================================================  ====================================
``pretrain-7b-worker-1`` (Kubeflow PyTorchJob etc.)  ``pretrain-7b``  (also -master-N,
                                                    -ps-N, -chief-N, -evaluator-N)
``bert-mpi-launcher`` / ``bert-mpi-launcher-x7k2q``  ``bert-mpi`` (MPIJob launcher)
``vllm-7d9c8b6f5-x2k9q`` (Deployment)               ``vllm`` (ReplicaSet and pod hashes)
``sweep-4kx8z`` (Job, DaemonSet, bare ReplicaSet)   ``sweep``
``shard-3-4kx8z`` (Indexed Job), ``report-29345678-x7k2q`` (CronJob run)  ``shard``, ``report``
``tensorflow-0`` (StatefulSet's first pod)           ``tensorflow``
``tensorflow-3`` with ``tensorflow-0`` among         ``tensorflow`` (``siblings``)
the pods seen
``llama-3``, ``resnet-50`` (alone)                  unchanged
==================================================  ====================================

StatefulSet ordinals without labels: a bare ``-N`` is stripped only when ``<stem>-0`` is
the pod itself or among ``siblings`` (the pods seen with it in its namespace): every
StatefulSet has an ordinal-0 pod (from ordinal 0 unless ``.spec.ordinals.start`` says
otherwise), while model names ending in numbers (``llama-3``, ``resnet-50``, ``gpt-2``)
rarely come with a ``-0`` twin. A workload name says who owns the pods, never that they
are one synchronous job: a StatefulSet's replicas serve independently unless they
communicate (the analyzer judges that from the data: analyzer.detectors._peers.communicating).

Generated hashes use Kubernetes' "safe" alphabet (``bcdfghjklmnpqrstvwxz2456789``: no
vowels, so words rarely look like hashes); a 5-character suffix must contain a letter,
so ``exp-24562`` stays whole.

Prometheus label names cannot hold ``.`` or ``/``: dcgm-exporter's pod labels
(``--kubernetes-enable-pod-labels``) and kube-state-metrics' ``kube_pod_labels`` carry them
sanitized (``training_kubeflow_org_job_name``, ``label_training_kubeflow_org_job_name``):
:func:`sanitized_job_labels` lists those spellings for the analyzer.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Mapping

#: Labels that name the job for the common operators, tried when no explicit label is
#: configured (Kubeflow training operator, JobSet, LeaderWorkerSet, Volcano, Ray, batch/v1 Job).
KNOWN_JOB_LABELS: tuple[str, ...] = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "leaderworkerset.sigs.k8s.io/name",
    "volcano.sh/job-name",
    "ray.io/cluster",
    "batch.kubernetes.io/job-name",
    "job-name",
)
#: batch/v1 Job labels: their value may name a CronJob's run (``<cronjob>-<scheduled minute>``).
_BATCH_JOB_LABELS = frozenset({"batch.kubernetes.io/job-name", "job-name"})
#: Controller labels: Deployment/ReplicaSet pods carry their template hash, StatefulSet pods their name/ordinal.
POD_TEMPLATE_HASH = "pod-template-hash"
STATEFULSET_POD_NAME = "statefulset.kubernetes.io/pod-name"
STATEFULSET_POD_INDEX = "apps.kubernetes.io/pod-index"

_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
_POD_HASH = rf"(?=[^-]*[a-z]){_SAFE}{{5}}"
#: A training operator's role pod (``<job>-worker-3``), also recreated by a Job with a new suffix
#: (``<job>-worker-3-x7k2q``): the role and index are not part of the job's name either way.
_ROLE = re.compile(rf"^(?P<job>.+?)-(?:worker|master|ps|chief|evaluator)-\d+(?:-{_POD_HASH})?$")
_LAUNCHER = re.compile(rf"^(?P<job>.+?)-launcher(?:-{_POD_HASH})?$")
_DEPLOYMENT = re.compile(rf"^(?P<job>.+?)-{_SAFE}{{6,10}}-{_POD_HASH}$")
_HASHED = re.compile(rf"^(?P<job>.+?)(?:-\d+)?-{_POD_HASH}$")
_ORDINAL = re.compile(r"^(?P<job>.+)-(?P<n>\d+)$")
#: A CronJob's Job: ``<cronjob>-<scheduled time in minutes since the epoch>`` (8 digits until 2160).
_CRON_RUN = re.compile(r"^(?P<job>.+)-\d{8,}$")


def sanitized_job_labels() -> tuple[str, ...]:
    """KNOWN_JOB_LABELS as Prometheus label names: as dcgm-exporter's pod labels and with
    kube-state-metrics' ``label_`` prefix (``.``, ``/`` and ``-`` become ``_``)."""
    plain = tuple(dict.fromkeys(re.sub(r"[^a-zA-Z0-9_]", "_", k) for k in KNOWN_JOB_LABELS))
    return plain + tuple(f"label_{k}" for k in plain)


def _from_labels(pod: str, labels: Mapping[str, str], job_label: str | None) -> str | None:
    """The owner the labels name (explicit, operator, then controller labels), or None."""
    for key in (job_label,) if job_label else KNOWN_JOB_LABELS:
        value = str(labels.get(key, "")).strip()
        if value:
            if key in _BATCH_JOB_LABELS and (m := _CRON_RUN.match(value)):
                return m["job"]
            return value
    if job_label:
        return None
    template = str(labels.get(POD_TEMPLATE_HASH, "")).strip()
    if template and pod.count(f"-{template}-") == 1:
        return pod.split(f"-{template}-")[0]
    if labels.get(STATEFULSET_POD_NAME) == pod or str(labels.get(STATEFULSET_POD_INDEX, "")).isdigit():
        m = _ORDINAL.match(pod)
        if m:
            return m["job"]
    return None


def derive_job(pod: str, labels: Mapping[str, str] | None = None, job_label: str | None = None,
               siblings: Collection[str] = ()) -> str:
    """Job name for ``pod``: ``labels[job_label]`` if set, else a well-known operator or
    controller label (only when ``job_label`` is None), else the pod name without controller
    suffixes; ``siblings``: the other pod names of its namespace (StatefulSet ordinals)."""
    if labels:
        owner = _from_labels(pod, labels, job_label)
        if owner:
            return owner
    for pattern in (_ROLE, _LAUNCHER, _DEPLOYMENT, _HASHED):
        match = pattern.match(pod)
        if match:
            return match["job"]
    match = _ORDINAL.match(pod)
    if match and (match["n"] == "0" or f"{match['job']}-0" in siblings):
        return match["job"]
    return pod
