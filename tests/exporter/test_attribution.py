"""GPU attribution against a real kubelet-shaped gRPC server and real job-mapping files.

The pod-resources server is grpcio serving the committed stubs on a unix socket, as the
kubelet does; nothing is mocked. Time for the cache is a fake clock, so no test sleeps.
"""

from __future__ import annotations

import logging
import os
import socket
import subprocess
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc
import pytest

from exporter.attribution import (
    Allocation,
    AttributionError,
    Attributor,
    CompositeAttributor,
    KubeApiPodLabels,
    KubernetesAttributor,
    SlurmAttributor,
    build_attributor,
    derive_job,
)
from exporter.attribution.podresources import api_pb2_grpc
from tests.conftest import ROOT
from tests.exporter.kit import GPU0, GPU1, GPU2, GPU3, MIG_A, MIG_B, MIG_C, TRAINING, FakeClock, pod


def test_lookup_whole_gpus_and_mig_instances(kubelet) -> None:
    servicer, _, path = kubelet
    servicer.pods = TRAINING
    attributor = KubernetesAttributor(path, timeout=5)
    assert isinstance(attributor, Attributor)

    assert attributor.refresh() == []
    worker0 = Allocation("train", "llama-worker-0", "pytorch", "llama")
    assert attributor.lookup(GPU0, "0") == worker0
    assert attributor.lookup(GPU1, "1") == worker0
    assert attributor.lookup(GPU2, "2", "1", MIG_A) == Allocation("train", "llama-worker-1", "pytorch", "llama")
    assert attributor.lookup(GPU2, "2", "2", MIG_B) == Allocation("train", "llama-worker-1", "pytorch", "llama")
    assert attributor.lookup(GPU2, "2", "3", MIG_C) == Allocation("serve", "vllm-7d9c8b6f5-x2k9q", "vllm", "vllm")
    # The MIG-mode parent is held by nobody as a whole; a free instance is free.
    assert attributor.lookup(GPU2, "2") is None
    assert attributor.lookup(GPU2, "2", "4", "MIG-free") is None
    # A whole GPU held by a pod holds any instance asked about on it.
    assert attributor.lookup(GPU0, "0", "1") == worker0
    # Time-sliced GPU: the first holder by (namespace, pod, container), whatever the order.
    assert attributor.lookup(GPU3, "3") == Allocation("dev", "notebook-a", "jupyter", "notebook-a")
    # Non-GPU devices are not GPUs; unknown GPUs are unallocated.
    assert attributor.lookup("fpga0", "7") is None
    assert attributor.lookup("hca0", "8") is None
    assert attributor.lookup("GPU-unknown", "9") is None
    assert worker0.labels() == {"namespace": "train", "pod": "llama-worker-0", "container": "pytorch",
                                "workload": "llama"}


def test_holders_lists_every_holder_of_a_shared_device(kubelet) -> None:
    servicer, _, path = kubelet
    # A third pod on the time-sliced GPU 3 holds two of its replicas: still one holder.
    replicas = [f"{GPU3}::2", f"{GPU3}::3"]
    servicer.pods = [*TRAINING, pod("dev", "notebook-c", ("jupyter", [("nvidia.com/gpu", replicas)]))]
    attributor = KubernetesAttributor(path)
    assert attributor.holders(GPU3, "3") == ()  # nothing read yet
    assert attributor.refresh() == []
    a, b, c = (Allocation("dev", f"notebook-{x}", "jupyter", f"notebook-{x}") for x in "abc")
    assert attributor.holders(GPU3, "3") == (a, b, c)  # sorted, whatever the kubelet's order
    assert attributor.lookup(GPU3, "3") == a  # lookup keeps reporting the first
    worker0 = Allocation("train", "llama-worker-0", "pytorch", "llama")
    assert attributor.holders(GPU0, "0") == (worker0,)
    assert attributor.holders(GPU0, "0", "1") == (worker0,)  # a whole GPU's holder holds its instances
    assert attributor.holders(GPU2, "2", "3", MIG_C) == (Allocation("serve", "vllm-7d9c8b6f5-x2k9q", "vllm", "vllm"),)
    assert attributor.holders(GPU2, "2") == ()
    assert attributor.holders("GPU-unknown", "9") == ()


def test_refresh_is_cached_for_ttl_and_sees_changes(kubelet) -> None:
    servicer, _, path = kubelet
    servicer.pods = TRAINING
    clock = FakeClock()
    attributor = KubernetesAttributor(path, ttl=15, clock=clock)
    assert attributor.refresh() == []
    assert servicer.calls == 1
    servicer.pods = [pod("train", "llama-worker-0", ("pytorch", [("nvidia.com/gpu", [GPU1])]))]
    clock.now += 14
    assert attributor.refresh() == []
    assert servicer.calls == 1  # cached
    assert attributor.lookup(GPU0, "0") is not None
    clock.now += 1
    assert attributor.refresh() == []
    assert servicer.calls == 2
    assert attributor.lookup(GPU0, "0") is None  # the pod gave GPU 0 back
    assert attributor.lookup(GPU1, "1").pod == "llama-worker-0"


def test_other_device_id_forms_and_configurable_resources(kubelet) -> None:
    servicer, _, path = kubelet
    servicer.pods = [
        # Old drivers: MIG-GPU-<parent>/<gi>/<ci>; GKE: nvidia<i>, nvidia<i>/gi<g>[/vgpu<n>].
        pod("a", "old-mig", ("c", [("nvidia.com/gpu", [f"MIG-{GPU1}/5/0"])])),
        pod("b", "gke-whole", ("c", [("nvidia.com/gpu", ["nvidia0"])])),
        pod("c", "gke-mig", ("c", [("nvidia.com/mig-1g.5gb", ["nvidia2/gi3/vgpu0"])])),
        pod("d", "custom", ("c", [("example.com/gpu", [GPU3])])),
    ]
    default = KubernetesAttributor(path)
    default.refresh()
    assert default.lookup(GPU1, "1", "5").pod == "old-mig"
    assert default.lookup(GPU1, "1", "6") is None
    assert default.lookup("GPU-whatever", "0").pod == "gke-whole"
    assert default.lookup("GPU-whatever", "2", "3").pod == "gke-mig"
    assert default.lookup(GPU3, "3") is None  # not an NVIDIA resource by default

    custom = KubernetesAttributor(path, resource_names=["example.com/gpu"], mig_resource_prefix="")
    custom.refresh()
    assert custom.lookup(GPU3, "3").pod == "custom"
    assert custom.lookup("GPU-whatever", "2", "3") is None


def test_job_from_static_mapping_and_pod_labels(kubelet) -> None:
    servicer, _, path = kubelet
    servicer.pods = TRAINING
    labels = {("serve", "vllm-7d9c8b6f5-x2k9q"): {"app.kubernetes.io/instance": "chat-prod"}}

    def pod_labels(namespace: str, name: str):
        if name == "notebook-a":
            raise RuntimeError("API server down")
        return labels.get((namespace, name))

    attributor = KubernetesAttributor(path, static_jobs={"train/llama-worker-1": "llama-70b-sft"},
                                      pod_labels=pod_labels, job_label="app.kubernetes.io/instance")
    assert attributor.refresh() == []
    assert attributor.lookup(GPU2, "2", "1", MIG_A).job == "llama-70b-sft"
    assert attributor.lookup(GPU0, "0").job == "llama"
    assert attributor.lookup(GPU2, "2", "3", MIG_C).job == "chat-prod"
    assert attributor.lookup(GPU3, "3").job == "notebook-a"  # label lookup failed: pod name


def test_socket_absent_reports_once_and_never_raises(sockdir: Path, caplog) -> None:
    clock = FakeClock()
    path = str(sockdir / "missing.sock")
    attributor = KubernetesAttributor(path, ttl=10, clock=clock)
    with caplog.at_level(logging.DEBUG, logger="truegpu.attribution"):
        errors = attributor.refresh()
        assert [e.kind for e in errors] == ["kubelet_socket_missing"]
        assert path in errors[0] and isinstance(errors[0], str)
        assert attributor.lookup(GPU0, "0") is None
        assert attributor.refresh() == []  # within ttl: nothing new
        clock.now += 10
        assert [e.kind for e in attributor.refresh()] == ["kubelet_socket_missing"]  # counted again
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and path in warnings[0].getMessage()


def test_kubelet_down_keeps_last_known_then_drops_it(kubelet, caplog) -> None:
    servicer, server, path = kubelet
    servicer.pods = TRAINING
    clock = FakeClock()
    attributor = KubernetesAttributor(path, ttl=10, max_stale=30, timeout=5, clock=clock)
    assert attributor.refresh() == []
    server.stop(grace=None).wait()
    if not os.path.exists(path):  # a dead kubelet leaves its socket file behind
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(path)
        stale.close()

    with caplog.at_level(logging.INFO, logger="truegpu.attribution"):
        clock.now += 10
        errors = attributor.refresh()
        assert [e.kind for e in errors] == ["kubelet_unavailable"]
        assert attributor.lookup(GPU0, "0").pod == "llama-worker-0"  # a restart must not blank owners
        clock.now += 25
        assert [e.kind for e in attributor.refresh()] == ["kubelet_unavailable"]
        assert attributor.lookup(GPU0, "0") is None  # older than max_stale: unknown beats wrong

        # The kubelet comes back on the same socket.
        os.unlink(path)
        revived = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
        api_pb2_grpc.add_PodResourcesListerServicer_to_server(servicer, revived)
        revived.add_insecure_port(f"unix:{path}")
        revived.start()
        try:
            clock.now += 10
            assert attributor.refresh() == []
            assert attributor.lookup(GPU0, "0").pod == "llama-worker-0"
        finally:
            revived.stop(grace=None)
    messages = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert sum("kubelet_unavailable" in m for m in messages) == 2  # one warning, one recovery
    assert any("recovered" in m for m in messages)


def test_hanging_kubelet_times_out(kubelet) -> None:
    servicer, _, path = kubelet
    servicer.pods = TRAINING
    servicer.hang.set()
    attributor = KubernetesAttributor(path, timeout=0.3)
    started = time.monotonic()
    errors = attributor.refresh()
    elapsed = time.monotonic() - started
    assert [e.kind for e in errors] == ["kubelet_timeout"]
    assert "0.3s" in errors[0]
    assert attributor.lookup(GPU0, "0") is None
    assert servicer.calls == 1
    # The server holds the call for 30 s; returning well before that proves the deadline works.
    assert elapsed < 10


def test_grpc_is_imported_lazily() -> None:
    code = (
        "import sys, exporter.attribution as a\n"
        "k = a.KubernetesAttributor('/nonexistent/kubelet.sock')\n"
        "assert [e.kind for e in k.refresh()] == ['kubelet_socket_missing']\n"
        "a.build_attributor('/nonexistent/kubelet.sock', '/nonexistent/slurm').refresh()\n"
        "leaked = sorted(m for m in sys.modules if m == 'grpc' or m.startswith(('grpc.', 'google.protobuf')))\n"
        "assert not leaked, leaked\n"
    )
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)


# Slurm ------------------------------------------------------------------------------


def test_slurm_directory(tmp_path: Path) -> None:
    (tmp_path / "0").write_text("1234\n")
    (tmp_path / "1.3").write_text("\n  5678  \n")
    (tmp_path / "2").write_text("20\n3\n\n20\nabc\n")  # several jobs: distinct, sorted, joined
    (tmp_path / "3").write_text("")  # empty: the GPU is free
    (tmp_path / "4").mkdir()  # not a mapping file
    (tmp_path / "README").write_text("999\n")
    (tmp_path / "5.x").write_text("999\n")
    os.mkfifo(tmp_path / "6")  # must not block the exporter
    (tmp_path / "7").symlink_to("7")  # a symlink loop: unreadable even for root
    attributor = SlurmAttributor(str(tmp_path))

    errors = attributor.refresh()
    assert sorted(e.kind for e in errors) == ["slurm_file_unreadable", "slurm_file_unreadable"]
    assert any(str(tmp_path / "6") in e for e in errors) and any(str(tmp_path / "7") in e for e in errors)
    assert attributor.lookup("GPU-a", "0") == Allocation("", "", "", "1234")
    assert attributor.lookup("GPU-a", "0", "2") == Allocation("", "", "", "1234")  # whole GPU holds instances
    assert attributor.lookup("GPU-b", "1", "3").job == "5678"
    assert attributor.lookup("GPU-b", "1", "4") is None
    assert attributor.lookup("GPU-b", "1") is None
    assert attributor.lookup("GPU-c", "2").job == "3,20,abc"
    for gpu in ("3", "4", "5", "6", "7", "8"):
        assert attributor.lookup("GPU-x", gpu) is None


def test_slurm_accounting_from_the_prolog_s_meta_files(tmp_path: Path) -> None:
    jobs, meta = tmp_path / "slurm-jobs", tmp_path / "slurm-meta"  # the prolog's layout: meta beside the jobs
    jobs.mkdir()
    meta.mkdir()
    (jobs / "0").write_text("4242\n")
    (jobs / "1").write_text("7\n8\n")
    (jobs / "2").write_text("99\n")  # no meta file: attributed, no accounting
    (jobs / "3").write_text("abc\n")  # not a Slurm job id: its meta file is never looked for
    (meta / "4242.env").write_text("job=4242\nuser=alice\naccount=phys-a\npartition=gpu\n")
    (meta / "7.env").write_text("job=7\nuser=bob\naccount=chem\npartition=\n")
    (meta / "8.env").write_text("job=8\nuser=carol\naccount=chem\npartition=debug\n")
    (meta / "abc.env").write_text("user=mallory\n")
    attributor = SlurmAttributor(str(jobs))
    assert attributor.refresh() == []
    assert attributor.lookup("GPU-a", "0") == Allocation("", "", "", "4242", ("alice", "phys-a", "gpu"))
    assert attributor.lookup("GPU-b", "1") == Allocation("", "", "", "7,8", ("bob,carol", "chem", "debug"))
    assert attributor.lookup("GPU-c", "2") == Allocation("", "", "", "99")
    assert attributor.lookup("GPU-d", "3") == Allocation("", "", "", "abc")
    elsewhere = SlurmAttributor(str(jobs), meta_directory=str(tmp_path / "nowhere"))
    elsewhere.refresh()
    assert elsewhere.lookup("GPU-a", "0").accounting is None


def test_slurm_holders_are_one_per_job_with_its_own_accounting(tmp_path: Path) -> None:
    jobs, meta = tmp_path / "slurm-jobs", tmp_path / "slurm-meta"
    jobs.mkdir()
    meta.mkdir()
    (jobs / "0").write_text("8\n7\n8\n")  # two jobs share GPU 0 (one listed twice)
    (jobs / "1.3").write_text("9\n")
    (meta / "7.env").write_text("job=7\nuser=bob\naccount=chem\npartition=gpu\n")
    (meta / "8.env").write_text("job=8\nuser=carol\naccount=chem\npartition=debug\n")
    attributor = SlurmAttributor(str(jobs))
    assert attributor.refresh() == []
    assert attributor.holders("GPU-a", "0") == (Allocation("", "", "", "7", ("bob", "chem", "gpu")),
                                                Allocation("", "", "", "8", ("carol", "chem", "debug")))
    assert attributor.lookup("GPU-a", "0") == Allocation("", "", "", "7,8", ("bob,carol", "chem", "debug,gpu"))
    assert attributor.holders("GPU-a", "0", "2") == attributor.holders("GPU-a", "0")  # whole GPU holds instances
    assert attributor.holders("GPU-b", "1", "3") == (Allocation("", "", "", "9"),)
    assert attributor.holders("GPU-b", "1") == ()


def test_slurm_directory_missing_then_created(tmp_path: Path, caplog) -> None:
    clock = FakeClock()
    directory = tmp_path / "jobs"
    attributor = SlurmAttributor(str(directory), ttl=5, clock=clock)
    with caplog.at_level(logging.WARNING, logger="truegpu.attribution"):
        assert [e.kind for e in attributor.refresh()] == ["slurm_dir_missing"]
        clock.now += 5
        assert [e.kind for e in attributor.refresh()] == ["slurm_dir_missing"]
    assert len(caplog.records) == 1
    directory.mkdir()
    (directory / "0").write_text("42\n")
    clock.now += 5
    assert attributor.refresh() == []
    assert attributor.lookup("GPU-a", "0").job == "42"
    (directory / "0").unlink()  # epilog ran
    clock.now += 5
    assert attributor.refresh() == []
    assert attributor.lookup("GPU-a", "0") is None

    not_a_dir = tmp_path / "file"
    not_a_dir.write_text("")
    assert [e.kind for e in SlurmAttributor(str(not_a_dir)).refresh()] == ["slurm_dir_unreadable"]


def test_composite_tries_in_order(tmp_path: Path, kubelet) -> None:
    servicer, _, path = kubelet
    servicer.pods = TRAINING
    (tmp_path / "0").write_text("slurm-job\n")
    (tmp_path / "5").write_text("77\n")
    composite = build_attributor(path, str(tmp_path))
    assert isinstance(composite, CompositeAttributor)
    assert composite.refresh() == []
    assert composite.lookup(GPU0, "0").pod == "llama-worker-0"  # Kubernetes first
    assert composite.lookup("GPU-x", "5").job == "77"

    broken = CompositeAttributor([KubernetesAttributor(str(tmp_path / "none.sock")), SlurmAttributor(str(tmp_path))])
    assert [e.kind for e in broken.refresh()] == ["kubelet_socket_missing"]
    assert broken.lookup(GPU0, "0").job == "slurm-job"
    assert build_attributor() is None
    assert isinstance(build_attributor(slurm_dir=str(tmp_path)), SlurmAttributor)


def test_composite_holders_come_from_the_first_attributor_that_knows_the_device(tmp_path: Path, kubelet) -> None:
    servicer, _, path = kubelet
    servicer.pods = TRAINING
    (tmp_path / "3").write_text("slurm-job\n")
    (tmp_path / "5").write_text("77\n78\n")
    pod_labels = KubeApiPodLabels("http://127.0.0.1:1")  # attributes nothing, so it holds nothing either
    assert isinstance(pod_labels, Attributor) and pod_labels.holders(GPU3, "3") == ()
    composite = CompositeAttributor([pod_labels, KubernetesAttributor(path), SlurmAttributor(str(tmp_path))])
    assert composite.refresh() == []
    assert [h.pod for h in composite.holders(GPU3, "3")] == ["notebook-a", "notebook-b"]  # never merged with Slurm's
    assert [h.job for h in composite.holders("GPU-x", "5")] == ["77", "78"]
    assert composite.holders("GPU-x", "6") == ()


def test_attribution_error_is_a_str_with_a_kind() -> None:
    error = AttributionError("kubelet_timeout", "no reply")
    assert error == "no reply" and error.kind == "kubelet_timeout" and error.message == "no reply"
    assert "kubelet_timeout" in repr(error)


# Job names --------------------------------------------------------------------------


@pytest.mark.parametrize(("pod", "job"), [
    ("pretrain-7b-worker-1", "pretrain-7b"),
    ("llama-worker-0", "llama"),
    ("llama-worker-2-mnjnb", "llama"),  # the same pod recreated by a Job under a new suffix
    ("llama-master-0", "llama"),
    ("tf-dist-ps-12", "tf-dist"),
    ("tf-dist-chief-0", "tf-dist"),
    ("tf-dist-evaluator-0", "tf-dist"),
    ("bert-mpi-launcher", "bert-mpi"),
    ("bert-mpi-launcher-x7k2q", "bert-mpi"),
    ("vllm-7d9c8b6f5-x2k9q", "vllm"),
    ("triton-server-5b8c9d7f4b-p7xqz", "triton-server"),
    ("sweep-4kx8z", "sweep"),
    ("shard-3-4kx8z", "shard"),
    ("report-29345678-x7k2q", "report"),  # a CronJob's run
    ("tensorflow-0", "tensorflow"),  # a StatefulSet's first pod (no model is named "-0")
    # Left alone: bare ordinals with no "-0" twin, and names that merely look like suffixes.
    ("tensorflow-1", "tensorflow-1"),
    ("llama-3", "llama-3"),
    ("resnet-50", "resnet-50"),
    ("run-20245", "run-20245"),
    ("exp-24562", "exp-24562"),  # all-digit "hash": a number, not a hash
    ("llama-worker", "llama-worker"),
    ("mistral-model", "mistral-model"),
    ("notebook", "notebook"),
])
def test_derive_job_from_pod_name(pod: str, job: str) -> None:
    assert derive_job(pod) == job


def test_derive_job_labels() -> None:
    labels = {"training.kubeflow.org/job-name": "pretrain-7b", "team-job": "llm-pretrain", "empty": ""}
    assert derive_job("x-worker-3", labels, "team-job") == "llm-pretrain"  # explicit label wins
    assert derive_job("x-worker-3", labels) == "pretrain-7b"  # well-known operator label
    assert derive_job("x-worker-3", labels, "empty") == "x"  # explicit but empty: the name
    assert derive_job("x-worker-3", labels, "absent") == "x"  # an explicit label disables the defaults
    assert derive_job("eval-0-4kx8z", {"batch.kubernetes.io/job-name": "eval-0"}) == "eval-0"
    assert derive_job("x-worker-3", {}) == "x"


@pytest.mark.parametrize(("pod", "labels", "job"), [
    ("w-3", {"training.kubeflow.org/job-name": "pretrain-7b"}, "pretrain-7b"),
    ("big-run-trainer-0-0-x7k2q", {"jobset.sigs.k8s.io/jobset-name": "big-run"}, "big-run"),
    ("llm-serve-1-2", {"leaderworkerset.sigs.k8s.io/name": "llm-serve"}, "llm-serve"),
    ("sim-worker-4", {"volcano.sh/job-name": "sim"}, "sim"),
    ("raycluster-a-worker-gpu-x7k2q", {"ray.io/cluster": "raycluster-a"}, "raycluster-a"),
    ("nightly-29345678-x7k2q", {"batch.kubernetes.io/job-name": "nightly-29345678"}, "nightly"),  # CronJob
    ("eval-0-4kx8z", {"batch.kubernetes.io/job-name": "eval-0"}, "eval-0"),  # a Job's own name stays whole
    ("llama-3", {"statefulset.kubernetes.io/pod-name": "llama-3"}, "llama"),  # StatefulSet: strip the ordinal
    ("llama-3", {"apps.kubernetes.io/pod-index": "3"}, "llama"),
    ("api-7f9d6c5b4-p2x9z", {"pod-template-hash": "7f9d6c5b4"}, "api"),  # Deployment, by its template hash
    ("gpt-2", {"app": "gpt-2"}, "gpt-2"),  # no owner label: the name rules
])
def test_owner_labels_name_the_workload(pod: str, labels: dict[str, str], job: str) -> None:
    assert derive_job(pod, labels) == job


def test_statefulset_ordinals_need_a_zero_twin() -> None:
    pods = [f"tensorflow-{i}" for i in range(4)]
    assert {derive_job(p, siblings=pods) for p in pods} == {"tensorflow"}
    assert derive_job("llama-3", siblings=["llama-3", "resnet-50"]) == "llama-3"
    assert derive_job("resnet-50", siblings=["resnet-0"]) == "resnet"  # a StatefulSet after all
