"""What the exporter's tests share: a fake clock, a kubelet-shaped pod-resources server, the pods of
a mixed node, and the committed dcgm-exporter pages."""

from __future__ import annotations

import threading

import grpc

from exporter.attribution.podresources import api_pb2, api_pb2_grpc
from tests.conftest import ROOT

#: dcgm-exporter pages in the real format (fixtures/dcgm/, real ones under real/).
DCGM_PAGES = ROOT / "fixtures" / "dcgm"


class FakeClock:
    """Monotonic time the test advances explicitly (cache expiry, rate integration): no test sleeps."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class Kubelet(api_pb2_grpc.PodResourcesListerServicer):
    """A pod-resources server: answers List() with ``pods``, or hangs while ``hang`` is set."""

    def __init__(self) -> None:
        self.pods: list[api_pb2.PodResources] = []
        self.calls = 0
        self.hang = threading.Event()
        self.release = threading.Event()

    def List(self, request: api_pb2.ListPodResourcesRequest, context: grpc.ServicerContext):
        self.calls += 1
        if self.hang.is_set():
            self.release.wait(30)
        return api_pb2.ListPodResourcesResponse(pod_resources=self.pods)


def pod(namespace: str, name: str, *containers: tuple[str, list[tuple[str, list[str]]]]) -> api_pb2.PodResources:
    return api_pb2.PodResources(
        name=name,
        namespace=namespace,
        containers=[
            api_pb2.ContainerResources(
                name=cname,
                devices=[api_pb2.ContainerDevices(resource_name=r, device_ids=ids) for r, ids in devices],
                cpu_ids=[2, 3],
            )
            for cname, devices in containers
        ],
    )


# A training job on two pods plus an inference Deployment pod on one node:
# GPU 0, 1 whole to llama-worker-0; GPU 2 in MIG mode, instances split between
# llama-worker-1 (2 instances) and the inference pod; GPU 3 time-sliced by two pods.
GPU0, GPU1, GPU2, GPU3 = (f"GPU-{i}1111111-2222-3333-4444-55555555555{i}" for i in range(4))
MIG_A, MIG_B, MIG_C = (f"MIG-{c * 8}-aaaa-bbbb-cccc-dddddddddddd" for c in "abc")
TRAINING = [
    pod("train", "llama-worker-0",
        ("pytorch", [("nvidia.com/gpu", [GPU0, GPU1]), ("rdma/hca_shared_devices_a", ["hca0"])]),
        ("log-shipper", [])),
    pod("train", "llama-worker-1", ("pytorch", [("nvidia.com/mig-3g.40gb", [MIG_A]),
                                               ("nvidia.com/mig-1g.10gb", [MIG_B])])),
    pod("serve", "vllm-7d9c8b6f5-x2k9q", ("vllm", [("nvidia.com/mig-1g.10gb", [MIG_C])]), ("envoy", [])),
    pod("dev", "notebook-b", ("jupyter", [("nvidia.com/gpu", [f"{GPU3}::1"])])),
    pod("dev", "notebook-a", ("jupyter", [("nvidia.com/gpu", [f"{GPU3}::0"])])),
    pod("kube-system", "cpu-only", ("app", [("example.com/fpga", ["fpga0"])])),
]
