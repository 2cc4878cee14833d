"""Per-holder use of shared GPUs (time-slicing, MPS, Slurm jobs sharing a GPU) from NVML's per-process calls.

End to end: the NVML source over the fake pynvml (real structs and exceptions), holders from a real
kubelet-shaped gRPC server or real Slurm job-mapping files, processes joined with their pods and jobs
through a /proc tree of real files. Time is the fake's virtual clock; no test sleeps.
"""

from __future__ import annotations

import argparse
import logging
import shutil
from collections.abc import Iterator
from pathlib import Path

import pynvml as real
import pytest

from exporter import schema
from exporter.attribution import KubeApiPodLabels, KubernetesAttributor, SlurmAttributor
from exporter.sources import add_source_arguments
from exporter.sources.base import Reading
from exporter.sources.nvml import NvmlSource, from_args
from tests.exporter.fakes.fake_pynvml import (
    GIB,
    MIB,
    PROCESS_SAMPLE_BUFFER,
    FakeGpu,
    FakeNvml,
    VirtualClock,
    h100_node,
    h100_sxm,
    mig_h100,
)
from tests.exporter.kit import pod
from tests.exporter.test_nvml_source import gpus_in, make, series
from tests.exporter.test_podlabels import ApiServer

UTIL, MEMORY = schema.SHARER_UTILIZATION, schema.SHARER_MEMORY_USED
#: The per-process calls (the unversioned ones call these).
PER_PROCESS = ("nvmlDeviceGetProcessUtilization", "nvmlDeviceGetComputeRunningProcesses_v3",
               "nvmlDeviceGetMPSComputeRunningProcesses_v3")


def holder(gpu: str, pod_name: str = "", namespace: str = "dev", container: str = "jupyter",
           workload: str | None = None) -> tuple[str, ...]:
    """A sharer series' key as ``series`` gives it: (gpu, namespace, pod, container, workload)."""
    if not pod_name:
        return (gpu, "", "", "", workload or "")
    return (gpu, namespace, pod_name, container, pod_name if workload is None else workload)


def nobody(gpu: str) -> tuple[str, ...]:
    """The unattributed holder's key."""
    return holder(gpu)


def shares(reading: Reading, metric: schema.Metric) -> dict[tuple, float]:
    """The family's series, each checked as the collector will: the contract's labels, a value it accepts."""
    for labels, value in reading.samples.get(metric, []):
        assert set(labels) == set(metric.all_labels), labels
        assert metric.accepts(value), (labels, value)
    return series(reading, metric)


def sliced(uuid: str, *pods: str, namespace: str = "dev") -> list:
    """Pods each holding one time-slicing replica of GPU ``uuid`` (``GPU-<uuid>::<n>``)."""
    return [pod(namespace, name, ("jupyter", [("nvidia.com/gpu", [f"{uuid}::{n}"])])) for n, name in enumerate(pods)]


class FakeProc:
    """A /proc tree of real files, shaped as the kernel shows a process: stat, environ, cgroup."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def add(self, pid: int, env: dict[str, str] | None = None, cgroup: str = "0::/\n", start: int = 4242) -> None:
        """Process ``pid`` started at ``start`` (ticks after boot); ``env`` None: its environ is unreadable."""
        base = self.root / str(pid)
        base.mkdir(parents=True, exist_ok=True)
        fields = ["S", *["0"] * 18, str(start), *["0"] * 30]  # field 3 (state) ... field 22 (start time) ...
        (base / "stat").write_text(f"{pid} (python3 (worker)) {' '.join(fields)}\n")
        (base / "cgroup").write_text(cgroup)
        environ = base / "environ"
        if env is None:
            environ.unlink(missing_ok=True)
        else:
            environ.write_bytes(b"".join(f"{k}={v}\0".encode() for k, v in {"PATH": "/usr/bin", **env}.items()))

    def pod(self, pid: int, pod_name: str, start: int = 4242) -> None:
        """A process of a pod's container: Kubernetes sets HOSTNAME to the pod's name."""
        self.add(pid, {"HOSTNAME": pod_name}, f"0::/kubepods.slice/kubepods-pod{pid}.slice/cri-containerd-{pid}\n",
                 start)

    def remove(self, pid: int) -> None:
        shutil.rmtree(self.root / str(pid))


@pytest.fixture
def proc(tmp_path: Path) -> FakeProc:
    return FakeProc(tmp_path / "proc")


@pytest.fixture
def kube(kubelet, proc: FakeProc) -> Iterator:
    """``start(gpus, *pods)`` -> (fake, source, clock): the NVML source with Kubernetes attribution over the
    kubelet fixture (re-read every collection) and ``proc`` as its /proc."""
    servicer, _, path = kubelet
    sources: list[NvmlSource] = []

    def start(gpus: list[FakeGpu], *pods) -> tuple[FakeNvml, NvmlSource, VirtualClock]:
        servicer.pods = list(pods)
        fake, source, clock = make(gpus, attributor=KubernetesAttributor(path, ttl=0), proc_root=proc.root)
        sources.append(source)
        return fake, source, clock

    yield start
    for source in sources:
        source.close()


def notebooks(kube, proc: FakeProc, memory: tuple[int, int] = (GIB, GIB)) -> tuple[FakeNvml, NvmlSource,
                                                                                   VirtualClock, FakeGpu]:
    """One GPU time-sliced by pods notebook-a (process 4001) and notebook-b (4002), the clock 10 s on."""
    gpu = h100_sxm(0)
    fake, source, clock = kube([gpu], *sliced(gpu.uuid, "notebook-a", "notebook-b"))
    proc.pod(4001, "notebook-a")
    proc.pod(4002, "notebook-b")
    gpu.processes = [(4001, memory[0], 0), (4002, memory[1], 0)]
    clock.advance(10)
    return fake, source, clock, gpu


def test_time_sliced_gpu_is_split_by_what_each_pod_ran(kube, proc: FakeProc) -> None:
    gpus = h100_node(2)
    fake, source, clock = kube(gpus, *sliced(gpus[0].uuid, "notebook-b", "notebook-a"),
                               pod("train", "llama-worker-0", ("pytorch", [("nvidia.com/gpu", [gpus[1].uuid])])))
    for pid, name in ((4001, "notebook-a"), (4003, "notebook-a"), (4002, "notebook-b")):
        proc.pod(pid, name)
    gpus[0].processes = [(4001, 6 * GIB, 0), (4003, 2 * GIB, 0), (4002, 5 * GIB, 0)]
    clock.advance(10)
    fake.process_ran(0, 4001, 50, 10)  # notebook-a's two processes: 70 % of the time between them
    fake.process_ran(0, 4003, 20, 10)
    fake.process_ran(0, 4002, 30, 10)
    reading = source.collect()
    assert reading.up and reading.errors == []
    a, b = holder("0", "notebook-a"), holder("0", "notebook-b")
    assert shares(reading, UTIL) == {a: pytest.approx(0.7, abs=0.02), b: pytest.approx(0.3, abs=0.02)}
    assert shares(reading, MEMORY) == {a: 8 * GIB, b: 5 * GIB}
    # truegpu_gpu_allocation_info still names one holder per GPU; GPU 1 (one pod) has no sharer series
    assert {k[:3] for k in series(reading, schema.GPU_ALLOCATION_INFO)} == {("0", "dev", "notebook-a"),
                                                                            ("1", "train", "llama-worker-0")}

    clock.advance(10)  # the next interval counts only its own samples
    fake.process_ran(0, 4001, 10, 10)
    fake.process_ran(0, 4002, 85, 10)
    reading = source.collect()
    assert shares(reading, UTIL) == {a: pytest.approx(0.1, abs=0.02), b: pytest.approx(0.85, abs=0.02)}


def test_a_holder_busy_in_bursts_counts_the_sample_times_it_was_absent_as_idle(kube, proc: FakeProc) -> None:
    # The driver samples only processes that ran: notebook-b's 2 busy seconds of 10 are not 10 busy seconds.
    fake, source, _, _ = notebooks(kube, proc)
    fake.process_ran(0, 4001, 40, 10)
    fake.process_ran(0, 4002, 100, 2)
    reading = source.collect()
    a, b = holder("0", "notebook-a"), holder("0", "notebook-b")
    assert shares(reading, UTIL) == {a: pytest.approx(0.4, abs=0.02), b: pytest.approx(0.2, abs=0.02)}


def test_pods_are_found_by_the_uid_in_their_cgroup_without_reading_their_environment(kubelet, api: ApiServer,
                                                                                       proc: FakeProc) -> None:
    # The process-attribution overlay grants hostPID, not root: other users' environ is unreadable, the cgroup
    # (world-readable) names the pod's UID, which the API server gives with the pod's labels.
    servicer, _, path = kubelet
    gpu = h100_sxm(0)
    servicer.pods = sliced(gpu.uuid, "notebook-a", "notebook-b")
    uids = {"notebook-a": "6f1c2a3b-1111-4a5b-9c8d-0e1f2a3b4c5d", "notebook-b": "7a2d3b4c-2222-4b6c-8d9e-1f2a3b4c5d6e"}
    for name, uid in uids.items():
        api.pods[("dev", name)] = {}
        api.uids[("dev", name)] = uid
    for pid, name in ((4001, "notebook-a"), (4002, "notebook-b")):
        systemd = uids[name].replace("-", "_")  # the systemd cgroup driver writes the UID with underscores
        proc.add(pid, None, f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{systemd}.slice/"
                            f"cri-containerd-{pid:064x}.scope\n")
    labels = KubeApiPodLabels(api.url, token_file=None, ca_file=None)
    fake, source, clock = make([gpu], attributor=KubernetesAttributor(path, ttl=0, pod_labels=labels),
                               proc_root=proc.root)
    try:
        gpu.processes = [(4001, GIB, 0), (4002, GIB, 0)]
        clock.advance(10)
        fake.process_ran(0, 4001, 60, 10)
        fake.process_ran(0, 4002, 30, 10)
        reading = source.collect()
        a, b = holder("0", "notebook-a"), holder("0", "notebook-b")
        assert shares(reading, UTIL) == {a: pytest.approx(0.6, abs=0.02), b: pytest.approx(0.3, abs=0.02)}
    finally:
        source.close()


def test_mps_clients_are_attributed_and_the_mps_server_is_nobodys(kube, proc: FakeProc) -> None:
    gpu = h100_sxm(0)
    fake, source, clock = kube([gpu], *sliced(gpu.uuid, "infer-a", "infer-b"))
    proc.add(77, {"HOSTNAME": "nvidia-device-plugin-mps-control-daemon-x7k2q"})  # the MPS server's pod
    proc.pod(5001, "infer-a")
    proc.pod(5002, "infer-b")
    proc.pod(5003, "infer-b")
    gpu.processes = [(77, 300 * MIB, 0)]  # the compute list shows the MPS server
    gpu.mps_processes = [(5001, 4 * GIB, 0), (5002, 3 * GIB, 0), (5003, None, 0)]  # 5003: memory unknown to NVML
    clock.advance(10)
    fake.process_ran(0, 5001, 60, 10)
    fake.process_ran(0, 5002, 25, 10)
    reading = source.collect()
    a, b = holder("0", "infer-a"), holder("0", "infer-b")
    assert shares(reading, UTIL) == {a: pytest.approx(0.6), b: pytest.approx(0.25), nobody("0"): 0.0}
    assert shares(reading, MEMORY) == {a: 4 * GIB, nobody("0"): 300 * MIB}  # infer-b's total is unknown


def test_a_binding_newer_than_the_driver_counts_mps_clients_without_their_memory(kube, proc: FakeProc,
                                                                                 caplog) -> None:
    gpu = h100_sxm(0)
    # The binding's unversioned MPS call needs a _v3 this driver lacks: it raises NVMLLibraryMismatchError.
    gpu.raises = {"nvmlDeviceGetMPSComputeRunningProcesses_v3": real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)}
    fake, source, clock = kube([gpu], *sliced(gpu.uuid, "infer-a", "infer-b"))
    proc.pod(5001, "infer-a")
    proc.pod(5002, "infer-b")
    gpu.processes = [(5002, GIB, 0)]
    gpu.mps_processes = [(5001, 4 * GIB, 0)]
    with caplog.at_level(logging.INFO, logger="exporter.sources.nvml"):
        for _ in range(2):
            clock.advance(10)
            fake.process_ran(0, 5001, 40, 10)
            reading = source.collect()
            assert reading.up and reading.errors == []
            a, b = holder("0", "infer-a"), holder("0", "infer-b")
            assert shares(reading, UTIL) == {a: pytest.approx(0.4), b: 0.0}  # sampled, joined through /proc
            assert shares(reading, MEMORY) == {b: GIB}  # infer-a's client is not listed: its memory is unknown
    assert gpu.call_counts["nvmlDeviceGetMPSComputeRunningProcesses_v3"] == 1  # not asked again
    assert sum("mps_processes" in r.getMessage() for r in caplog.records) == 1


def test_processes_no_holder_can_be_found_for_stay_unattributed(kube, kubelet, proc: FakeProc) -> None:
    gpu = h100_sxm(0)
    fake, source, clock = kube([gpu], *sliced(gpu.uuid, "notebook-a", "notebook-b"))
    proc.pod(4001, "notebook-a")
    proc.pod(6001, "someone-else")  # a pod that does not hold this GPU
    proc.add(6002, env=None)  # an environment the exporter may not read
    gpu.processes = [(4001, 2 * GIB, 0), (6000, GIB, 0), (6001, GIB, 0), (6002, 512 * MIB, 0)]  # 6000: no /proc entry
    clock.advance(10)
    fake.process_ran(0, 4001, 40, 10)
    fake.process_ran(0, 6000, 25, 10)  # another PID namespace
    fake.process_ran(0, 6001, 10, 10)
    fake.process_ran(0, 6003, 5, 10)  # ran, then exited before the process list
    reading = source.collect()
    a, b = holder("0", "notebook-a"), holder("0", "notebook-b")
    # never spread over the pods: notebook-b ran nothing and keeps 0
    assert shares(reading, UTIL) == {a: pytest.approx(0.4), b: 0.0, nobody("0"): pytest.approx(0.4)}
    assert shares(reading, MEMORY) == {a: 2 * GIB, b: 0}  # nobody's: the exited PID's memory is unknown

    # A second pod named notebook-a (another namespace) shares the GPU: HOSTNAME no longer names one holder.
    servicer, _, _ = kubelet
    servicer.pods = [*servicer.pods, *sliced(gpu.uuid, "notebook-a", namespace="team-x")]
    gpu.processes = [(4001, 2 * GIB, 0)]
    clock.advance(10)
    fake.process_ran(0, 4001, 40, 10)
    reading = source.collect()
    assert shares(reading, UTIL) == {a: 0.0, b: 0.0, holder("0", "notebook-a", namespace="team-x"): 0.0,
                                     nobody("0"): pytest.approx(0.4)}


def test_a_pod_name_longer_than_a_hostname_matches_its_cut_hostname(kube, proc: FakeProc) -> None:
    gpu = h100_sxm(0)
    long_name = "a" * 62 + "-tail"  # Kubernetes' HOSTNAME: the first 63 characters, trailing "-" dropped
    fake, source, clock = kube([gpu], *sliced(gpu.uuid, long_name, "notebook-b"))
    proc.add(4001, {"HOSTNAME": "a" * 62})
    gpu.processes = [(4001, GIB, 0)]
    clock.advance(10)
    fake.process_ran(0, 4001, 45, 10)
    assert shares(source.collect(), UTIL) == {holder("0", long_name): pytest.approx(0.45),
                                              holder("0", "notebook-b"): 0.0}


def test_no_sample_since_the_last_scrape_means_no_holder_ran(kube, proc: FakeProc) -> None:
    fake, source, clock, _ = notebooks(kube, proc, (2 * GIB, GIB))
    fake.process_ran(0, 4001, 70, 10)
    assert shares(source.collect(), UTIL)[holder("0", "notebook-a")] == pytest.approx(0.7)
    clock.advance(10)  # idle: the driver has nothing newer (NVML_ERROR_NOT_FOUND)
    reading = source.collect()
    assert reading.up and reading.errors == []
    assert shares(reading, UTIL) == {holder("0", "notebook-a"): 0.0, holder("0", "notebook-b"): 0.0}
    assert shares(reading, MEMORY) == {holder("0", "notebook-a"): 2 * GIB, holder("0", "notebook-b"): GIB}


def test_gpu_without_per_process_utilization_publishes_no_sharer_families(kube, proc: FakeProc, caplog) -> None:
    gpu = h100_sxm(0)
    gpu.not_supported = {"nvmlDeviceGetProcessUtilization"}  # a consumer card, a vGPU
    fake, source, clock = kube([gpu], *sliced(gpu.uuid, "notebook-a", "notebook-b"))
    proc.pod(4001, "notebook-a")
    gpu.processes = [(4001, 2 * GIB, 0)]
    with caplog.at_level(logging.INFO, logger="exporter.sources.nvml"):
        for _ in range(3):
            clock.advance(10)
            fake.process_ran(0, 4001, 70, 10)
            reading = source.collect()
            assert reading.up and reading.errors == []
            assert UTIL not in reading.samples and MEMORY not in reading.samples
            assert series(reading, schema.GPU_UTILIZATION) == {("0",): pytest.approx(0.95)}
            assert len(reading.samples[schema.GPU_ALLOCATION_INFO]) == 1
    assert gpu.call_counts["nvmlDeviceGetProcessUtilization"] == 1  # asked once, then left alone
    assert gpu.call_counts["nvmlDeviceGetComputeRunningProcesses_v3"] == 0
    assert sum("process_utilization" in r.getMessage() for r in caplog.records) == 1


def test_where_the_driver_cannot_sample_per_process_accounting_stats_stand_in(kube, proc: FakeProc) -> None:
    gpu = h100_sxm(0)
    gpu.not_supported = {"nvmlDeviceGetProcessUtilization"}
    gpu.accounting, gpu.accounting_stats = True, {4001: (56, 9 * GIB), 4002: (24, 3 * GIB)}  # lifetime shares
    _, source, clock = kube([gpu], *sliced(gpu.uuid, "notebook-a", "notebook-b"))
    proc.pod(4001, "notebook-a")
    proc.pod(4002, "notebook-b")
    proc.pod(4003, "notebook-b")  # not in the accounting buffer (yet): ran nothing known
    gpu.processes = [(4001, 8 * GIB, 0), (4002, 2 * GIB, 0), (4003, GIB, 0)]
    for _ in range(2):
        clock.advance(10)
        reading = source.collect()
        assert reading.up and reading.errors == []
        a, b = holder("0", "notebook-a"), holder("0", "notebook-b")
        assert shares(reading, UTIL) == {a: pytest.approx(0.56), b: pytest.approx(0.24)}
        assert shares(reading, MEMORY) == {a: 8 * GIB, b: 3 * GIB}  # what they use now, from the process list
    assert gpu.call_counts["nvmlDeviceGetProcessUtilization"] == 1
    gpu.accounting = False  # switched off: nothing to say
    clock.advance(10)
    assert UTIL not in source.collect().samples


def test_pid_reuse_and_churn(kube, proc: FakeProc) -> None:
    gpu = h100_sxm(0)
    fake, source, clock = kube([gpu], *sliced(gpu.uuid, "notebook-a", "notebook-b"))
    a, b = holder("0", "notebook-a"), holder("0", "notebook-b")
    proc.pod(4001, "notebook-a", start=100)
    proc.pod(4002, "notebook-b")
    gpu.processes = [(4001, 2 * GIB, 0), (4002, GIB, 0)]
    clock.advance(10)
    fake.process_ran(0, 4001, 50, 10)
    fake.process_ran(0, 4002, 30, 10)
    assert shares(source.collect(), UTIL) == {a: pytest.approx(0.5), b: pytest.approx(0.3)}

    # Between two scrapes 4001 exits and notebook-b starts a process that gets the same PID.
    proc.pod(4001, "notebook-b", start=900)
    clock.advance(10)
    fake.process_ran(0, 4001, 40, 10)
    fake.process_ran(0, 4002, 30, 10)
    reading = source.collect()
    assert shares(reading, UTIL) == {a: 0.0, b: pytest.approx(0.7)}
    assert shares(reading, MEMORY) == {a: 0, b: 3 * GIB}

    # 4001 exits for good; notebook-a starts 4005. What /proc said of PIDs gone from the GPU is forgotten.
    proc.remove(4001)
    proc.pod(4005, "notebook-a")
    gpu.processes = [(4002, GIB, 0), (4005, 3 * GIB, 0)]
    clock.advance(10)
    fake.process_ran(0, 4005, 20, 10)
    fake.process_ran(0, 4002, 30, 10)
    reading = source.collect()
    assert shares(reading, UTIL) == {a: pytest.approx(0.2), b: pytest.approx(0.3)}
    assert shares(reading, MEMORY) == {a: 3 * GIB, b: GIB}
    assert set(source._samplers[0]._owners) == {4002, 4005}


def test_samples_older_than_the_driver_keeps_expire(kube, proc: FakeProc) -> None:
    fake, source, clock, _ = notebooks(kube, proc)
    a, b = holder("0", "notebook-a"), holder("0", "notebook-b")
    fake.process_ran(0, 4001, 70, 10)
    fake.process_ran(0, 4002, 30, 10)
    clock.advance(5)  # still in the driver's buffer (20 s)
    assert shares(source.collect(), UTIL) == {a: pytest.approx(0.7), b: pytest.approx(0.3)}
    fake.process_ran(0, 4001, 90, 10)
    clock.advance(25)  # a missed scrape: those samples are gone
    assert shares(source.collect(), UTIL) == {a: 0.0, b: 0.0}


def test_unshared_gpus_never_ask_the_per_process_calls(kube, proc: FakeProc) -> None:
    gpus = [*h100_node(3), mig_h100(3)]
    fake, source, clock = kube(
        gpus,
        *sliced(gpus[0].uuid, "notebook-a", "notebook-b"),  # GPU 0 shared; GPU 2 free
        pod("train", "llama-worker-0", ("pytorch", [("nvidia.com/gpu", [gpus[1].uuid])])),
        # GPU 3 in MIG mode, one instance time-sliced by two pods: MIG sharing is out of scope
        *(pod("dev", name, ("c", [("nvidia.com/mig-3g.40gb", [f"MIG-0003-0001::{n}"])]))
          for n, name in enumerate(("mig-a", "mig-b"))),
    )
    proc.pod(4001, "notebook-a")
    gpus[0].processes = [(4001, GIB, 0)]
    for _ in range(2):
        clock.advance(10)
        fake.process_ran(0, 4001, 50, 10)
        reading = source.collect()
        assert {key[0] for key in shares(reading, UTIL)} == {"0"}
    assert [gpus[0].call_counts[call] for call in PER_PROCESS] == [2, 2, 2]
    for gpu in gpus[1:]:
        assert [gpu.call_counts[call] for call in PER_PROCESS] == [0, 0, 0]


def test_gpu_lost_while_sampling_processes_loses_only_that_gpu(kube, proc: FakeProc) -> None:
    gpus = h100_node(3)
    fake, source, clock = kube(gpus, *sliced(gpus[0].uuid, "a0", "b0"), *sliced(gpus[1].uuid, "a1", "b1"))
    for i in range(2):
        proc.pod(4000 + i, f"a{i}")
        gpus[i].processes = [(4000 + i, GIB, 0)]
    clock.advance(10)
    for i in range(2):
        fake.process_ran(i, 4000 + i, 60, 10)
    assert {key[0] for key in shares(source.collect(), UTIL)} == {"0", "1"}
    gpus[0].raises = {"nvmlDeviceGetComputeRunningProcesses_v3": real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)}
    clock.advance(10)
    fake.process_ran(1, 4001, 60, 10)
    reading = source.collect()
    assert [(e.kind, e.gpu) for e in reading.errors] == [("gpu_lost", "0")]
    assert gpus_in(reading) == {"1", "2"}  # the lost GPU's series go, as with any call it fails
    assert shares(reading, UTIL) == {holder("1", "a1"): pytest.approx(0.6), holder("1", "b1"): 0.0}


def test_a_failed_per_process_call_costs_only_this_scrapes_sharer_families(kube, proc: FakeProc) -> None:
    gpu = h100_sxm(0)
    fake, source, clock = kube([gpu], *sliced(gpu.uuid, "notebook-a", "notebook-b"))
    proc.pod(4001, "notebook-a")
    gpu.processes = [(4001, GIB, 0)]
    gpu.raises = {"nvmlDeviceGetProcessUtilization": real.NVMLError(real.NVML_ERROR_TIMEOUT)}
    clock.advance(10)
    fake.process_ran(0, 4001, 60, 10)
    reading = source.collect()
    assert [(e.kind, e.gpu) for e in reading.errors] == [("nvml_error", "0")]
    assert UTIL not in reading.samples and MEMORY not in reading.samples  # unknown, never published as 0
    assert series(reading, schema.GPU_UTILIZATION) == {("0",): pytest.approx(0.95)}
    gpu.raises = {}
    clock.advance(5)
    reading = source.collect()  # asked again: the samples the failed scrape missed are still there
    assert reading.errors == []
    assert shares(reading, UTIL)[holder("0", "notebook-a")] == pytest.approx(0.6)


def test_slurm_jobs_sharing_a_gpu_are_told_apart_by_job_id(tmp_path: Path, proc: FakeProc) -> None:
    jobs = tmp_path / "slurm-jobs"
    jobs.mkdir()
    (jobs / "0").write_text("102\n101\n")
    proc.add(8001, {"SLURM_JOB_ID": "101"}, "12:memory:/slurm/uid_1000/job_101/step_0/task_0\n")  # cgroup v1
    proc.add(8002, {}, "0::/system.slice/slurmstepd.scope/job_102/step_0/user/task_0\n")  # cgroup v2, no env
    proc.add(8003, {"SLURM_JOB_ID": "999"})  # a job the mapping does not put on this GPU
    gpu = h100_sxm(0)
    gpu.processes = [(8001, 10 * GIB, 0), (8002, 20 * GIB, 0), (8003, GIB, 0)]
    fake, source, clock = make([gpu], attributor=SlurmAttributor(str(jobs)), proc_root=proc.root)
    try:
        clock.advance(10)
        fake.process_ran(0, 8001, 55, 10)
        fake.process_ran(0, 8002, 35, 10)
        reading = source.collect()
    finally:
        source.close()
    job101, job102 = holder("0", workload="101"), holder("0", workload="102")
    assert shares(reading, UTIL) == {job101: pytest.approx(0.55), job102: pytest.approx(0.35), nobody("0"): 0.0}
    assert shares(reading, MEMORY) == {job101: 10 * GIB, job102: 20 * GIB, nobody("0"): GIB}
    assert [labels[schema.WORKLOAD] for labels, _ in reading.samples[schema.GPU_ALLOCATION_INFO]] == ["101,102"]


def test_proc_root_option_reaches_the_source_and_the_kubelet_attribution() -> None:
    parser = argparse.ArgumentParser()
    add_source_arguments(parser)
    for argv, want in (([], "/proc"), (["--proc-root", "/host/proc"], "/host/proc")):
        source = from_args(parser.parse_args([*argv, "--kubelet-socket", "/nonexistent/kubelet.sock"]))
        try:
            assert source.proc_root == Path(want)
            assert source._attributor.proc_root == want  # DRA device minors are read there too
        finally:
            source.close()


def test_fake_process_utilization_answers_like_the_driver() -> None:
    """Per-process samples as the binding returns them: real structs newer than the timestamp, NOT_FOUND
    when none, a bounded buffer; process lists with NVML's unknown memory as None."""
    clock = VirtualClock()
    gpus = [h100_sxm(0), mig_h100(1)]
    fake = FakeNvml(gpus, clock=clock)
    nv = fake.module
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(real.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, 0)
    clock.advance(1)
    fake.process_ran(0, 42, 70, 1)
    fake.process_ran(0, 43, 0, 1)  # idle processes have no samples
    samples = nv.nvmlDeviceGetProcessUtilization(h, 0)
    assert all(isinstance(s, real.c_nvmlProcessUtilizationSample_t) for s in samples)
    assert {(s.pid, s.smUtil) for s in samples} == {(42, 70)} and len(samples) == 6
    newest = max(s.timeStamp for s in samples)
    assert newest == int(clock() * 1e6)
    with pytest.raises(real.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, newest)
    clock.advance(21)  # past the driver's buffer span
    with pytest.raises(real.NVMLError_NotFound):
        nv.nvmlDeviceGetProcessUtilization(h, 0)
    for pid in range(100, 110):  # 10 processes for 20 s: more samples than the driver keeps
        fake.process_ran(0, pid, 30, 20)
    kept = nv.nvmlDeviceGetProcessUtilization(h, 0)
    assert len(kept) == PROCESS_SAMPLE_BUFFER and min(s.timeStamp for s in kept) > (clock() - 17) * 1e6  # oldest out
    with pytest.raises(real.NVMLError_NotSupported):  # no per-process utilization in MIG mode
        nv.nvmlDeviceGetProcessUtilization(nv.nvmlDeviceGetHandleByIndex(1), 0)
    gpus[0].processes = [(42, None, 0)]
    gpus[0].mps_processes = [(44, 3 * GIB, 0)]
    assert [(p.pid, p.usedGpuMemory) for p in nv.nvmlDeviceGetComputeRunningProcesses(h)] == [(42, None)]
    assert [(p.pid, p.usedGpuMemory) for p in nv.nvmlDeviceGetMPSComputeRunningProcesses(h)] == [(44, 3 * GIB)]
    gpus[0].raises = {"nvmlDeviceGetMPSComputeRunningProcesses_v3": real.NVMLError(real.NVML_ERROR_FUNCTION_NOT_FOUND)}
    with pytest.raises(real.NVMLLibraryMismatchError):
        nv.nvmlDeviceGetMPSComputeRunningProcesses(h)
