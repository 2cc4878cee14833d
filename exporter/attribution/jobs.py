"""Derive the ``job`` label from a pod: the unit the analyzer groups GPUs by.

Straggler and gang findings compare the GPUs of one job, so every pod of a distributed
training run must get the same job value. An explicit label wins; otherwise the pod
name is stripped of the suffixes that controllers and training operators add:

==================================================  ====================================
pod name                                            job
==================================================  ====================================
``pretrain-7b-worker-1`` (Kubeflow PyTorchJob etc.)  ``pretrain-7b``  (also -master-N,
                                                    -ps-N, -chief-N, -evaluator-N)
``bert-mpi-launcher`` / ``bert-mpi-launcher-x7k2q``  ``bert-mpi`` (MPIJob launcher)
``vllm-7d9c8b6f5-x2k9q`` (Deployment)               ``vllm`` (ReplicaSet and pod hashes)
``sweep-4kx8z`` (Job, DaemonSet, bare ReplicaSet)   ``sweep``
``shard-3-4kx8z`` (Indexed Job)                     ``shard``
``llama-3``, ``resnet-50``, ``vllm-0``              unchanged
==================================================  ====================================

StatefulSet ordinals (``name-N``) are deliberately kept: model names end in numbers
(``llama-3``, ``resnet-50``) far too often to strip a bare ``-N`` safely. Give such
pods a label (or a static mapping) when they should be grouped.

Generated hashes use Kubernetes' "safe" alphabet (``bcdfghjklmnpqrstvwxz2456789``: no
vowels, so words rarely look like hashes); a 5-character suffix must contain a letter,
so ``exp-24562`` stays whole.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

#: Labels that name the job for the common operators, tried when no explicit label is
#: configured (Kubeflow training operator, JobSet, LeaderWorkerSet, batch/v1 Job, Volcano).
KNOWN_JOB_LABELS: tuple[str, ...] = (
    "training.kubeflow.org/job-name",
    "jobset.sigs.k8s.io/jobset-name",
    "leaderworkerset.sigs.k8s.io/name",
    "volcano.sh/job-name",
    "batch.kubernetes.io/job-name",
    "job-name",
)

_SAFE = "[bcdfghjklmnpqrstvwxz2456789]"
_POD_HASH = rf"(?=[^-]*[a-z]){_SAFE}{{5}}"
_ROLE = re.compile(r"^(?P<job>.+?)-(?:worker|master|ps|chief|evaluator)-\d+$")
_LAUNCHER = re.compile(rf"^(?P<job>.+?)-launcher(?:-{_POD_HASH})?$")
_DEPLOYMENT = re.compile(rf"^(?P<job>.+?)-{_SAFE}{{6,10}}-{_POD_HASH}$")
_HASHED = re.compile(rf"^(?P<job>.+?)(?:-\d+)?-{_POD_HASH}$")


def derive_job(pod: str, labels: Mapping[str, str] | None = None, job_label: str | None = None) -> str:
    """Job name for ``pod``: ``labels[job_label]`` if set, else a well-known operator label
    (only when ``job_label`` is None), else the pod name without controller suffixes."""
    if labels:
        for key in (job_label,) if job_label else KNOWN_JOB_LABELS:
            value = labels.get(key, "").strip()
            if value:
                return value
    for pattern in (_ROLE, _LAUNCHER, _DEPLOYMENT, _HASHED):
        match = pattern.match(pod)
        if match:
            return match["job"]
    return pod
