"""Attribution of GPUs allocated by Kubernetes Dynamic Resource Allocation (DRA).

The kubelet is grpcio serving the committed pod-resources v1 stubs on a unix socket; its replies
carry ``dynamic_resources`` built from the v1 proto as KEP-3695 describes them (claim name and
namespace; per device the driver, pool and device name plus the CDI devices). The node around it
is a directory tree in the formats NVIDIA's DRA driver and GPU driver write: one transient CDI spec
per claim (``k8s.gpu.nvidia.com-claim_<uid>.yaml``, devices ``<uid>-gpu-<minor>`` and
``<uid>-gpu-<minor>-mig-<profile>-<profile id>-<placement>``, ``NVIDIA_VISIBLE_DEVICES=void``),
``/proc/driver/nvidia/gpus/<bus>/information`` and ``/proc/driver/nvidia-caps/mig-minors``.
Device minors deliberately differ from NVML indices (as on some multi-GPU servers), so a test that
confuses the two fails.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from exporter.attribution import Allocation, KubernetesAttributor, build_attributor
from exporter.attribution.dra import parse_cdi_spec
from exporter.attribution.podresources import api_pb2
from tests.exporter.kit import GPU0, GPU1, GPU2, GPU3, MIG_A, MIG_B, MIG_C, TRAINING, FakeClock

DRIVER = "gpu.nvidia.com"
NODE = "gpu-node-1"  # the driver's pool name is the node name
#: NVML index -> (PCI bus id, device minor): minors not in index order.
GPUS = {"0": ("0000:07:00.0", 2), "1": ("0000:0f:00.0", 3), "2": ("0000:47:00.0", 0), "3": ("0000:4e:00.0", 1)}
UUIDS = {"0": GPU0, "1": GPU1, "2": GPU2, "3": GPU3}
CLAIM_A, CLAIM_B, CLAIM_C = ("0b1f6a0e-6a6b-4c1e-9f53-8d2a7c1e5d0" + c for c in "abc")


def minor(index: str) -> int:
    return GPUS[index][1]


def cap_minor(gpu_minor: int, gi: int, ci: int | None = None) -> int:
    """The driver's fixed table: 3 + 135 per GPU, 9 per GPU instance (its access, then 8 CIs)."""
    return 3 + 135 * gpu_minor + 9 * gi + (0 if ci is None else 1 + ci)


@dataclass
class Node:
    root: Path

    @property
    def proc(self) -> str:
        return str(self.root / "proc")

    @property
    def cdi(self) -> Path:
        return self.root / "var" / "run" / "cdi"

    def claim_spec(self, claim_uid: str, devices: dict[str, list[str]], env: list[str] | None = None) -> Path:
        """The transient spec the driver writes for one prepared claim: device name -> device nodes."""
        spec = {
            "cdiVersion": "0.5.0",
            "kind": f"k8s.{DRIVER}/claim",
            "devices": [{"name": f"{claim_uid}-{name}",
                         "containerEdits": {"deviceNodes": [{"path": p, "hostPath": p} for p in nodes],
                                            **({"env": env} if env else {})}}
                        for name, nodes in devices.items()],
            "containerEdits": {
                "env": ["NVIDIA_VISIBLE_DEVICES=void"],
                "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
                "hooks": [{"hookName": "createContainer", "path": "/usr/bin/nvidia-cdi-hook",
                           "args": ["nvidia-cdi-hook", "update-ldcache", "--folder", "/usr/lib/x86_64-linux-gnu"]}],
                "mounts": [{"hostPath": "/usr/bin/nvidia-smi", "containerPath": "/usr/bin/nvidia-smi",
                            "options": ["ro", "nosuid", "nodev", "bind"]}],
            },
        }
        path = self.cdi / f"k8s.{DRIVER}-claim_{claim_uid}.yaml"
        path.write_text(yaml.safe_dump(spec, sort_keys=False))
        return path


@pytest.fixture
def node(tmp_path: Path) -> Node:
    n = Node(tmp_path)
    for index, (bus, dev_minor) in GPUS.items():
        d = tmp_path / "proc" / "driver" / "nvidia" / "gpus" / bus
        d.mkdir(parents=True)
        (d / "information").write_text(
            "Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 0\n"
            f"GPU UUID: \t {UUIDS[index]}\nVideo BIOS: \t 96.00.99.00.01\nBus Type: \t PCIe\n"
            f"DMA Size: \t 52 bits\nDMA Mask: \t 0xfffffffffffff\nBus Location: \t {bus}\n"
            f"Device Minor: \t {dev_minor}\nGPU Excluded:\t No\n")
    caps = tmp_path / "proc" / "driver" / "nvidia-caps"
    caps.mkdir(parents=True)
    lines = ["config 1", "monitor 2"]
    for g in range(8):
        for gi in range(15):
            lines.append(f"gpu{g}/gi{gi}/access {cap_minor(g, gi)}")
            lines += [f"gpu{g}/gi{gi}/ci{ci}/access {cap_minor(g, gi, ci)}" for ci in range(8)]
    (caps / "mig-minors").write_text("\n".join(lines) + "\n")
    n.cdi.mkdir(parents=True)
    return n


def claim(name: str, namespace: str, *devices: tuple[str, str, list[str]],
          driver: str = DRIVER, pool: str = NODE) -> api_pb2.DynamicResource:
    """A prepared ResourceClaim as the kubelet reports it: (device name, claim uid, CDI names) per device."""
    return api_pb2.DynamicResource(
        claim_name=name, claim_namespace=namespace,
        claim_resources=[api_pb2.ClaimResource(driver_name=driver, pool_name=pool, device_name=device,
                                               cdi_devices=[api_pb2.CDIDevice(name=c) for c in cdi])
                         for device, _, cdi in devices])


def cdi_name(claim_uid: str, device: str) -> str:
    return f"k8s.{DRIVER}/claim={claim_uid}-{device}"


def dev(device: str, claim_uid: str) -> tuple[str, str, list[str]]:
    return (device, claim_uid, [cdi_name(claim_uid, device)])


def dra_pod(namespace: str, name: str, *containers: tuple[str, list[api_pb2.DynamicResource]]) -> api_pb2.PodResources:
    return api_pb2.PodResources(name=name, namespace=namespace, containers=[
        api_pb2.ContainerResources(name=c, dynamic_resources=claims, cpu_ids=[4]) for c, claims in containers])


def attributor(path: str, node: Node, **kwargs) -> KubernetesAttributor:
    return KubernetesAttributor(path, timeout=5, cdi_spec_dirs=[str(node.root / "etc" / "cdi"), str(node.cdi)],
                                proc_root=node.proc, **kwargs)


# The MIG devices of GPU 1 (minor 3): a 3g.40gb instance (GI 1) and a 1g.10gb instance (GI 9).
MIG_3G, MIG_1G = "gpu-3-mig-3g40gb-9-4", "gpu-3-mig-1g10gb-19-2"


def mig_nodes(gpu_minor: int, gi: int, ci: int = 0) -> list[str]:
    return [f"/dev/nvidia{gpu_minor}", f"/dev/nvidia-caps/nvidia-cap{cap_minor(gpu_minor, gi)}",
            f"/dev/nvidia-caps/nvidia-cap{cap_minor(gpu_minor, gi, ci)}"]


def test_whole_gpus_by_dra_map_through_the_device_minor(kubelet, node: Node) -> None:
    servicer, _, path = kubelet
    node.claim_spec(CLAIM_A, {f"gpu-{minor('0')}": [f"/dev/nvidia{minor('0')}"],
                              f"gpu-{minor('2')}": [f"/dev/nvidia{minor('2')}"]})
    servicer.pods = [dra_pod("train", "llama-worker-0", ("pytorch", [
        claim("llama-worker-0-gpus-x7k2q", "train", dev(f"gpu-{minor('0')}", CLAIM_A),
              dev(f"gpu-{minor('2')}", CLAIM_A))]))]
    a = attributor(path, node)
    assert a.refresh() == []
    holder = Allocation("train", "llama-worker-0", "pytorch", "llama")
    assert a.lookup(GPU0, "0") == holder
    assert a.lookup(GPU2, "2") == holder
    assert a.lookup(GPU2, "2", "1") == holder  # a whole GPU holds any instance asked about
    # gpu-2 and gpu-0 are minors, not indices: GPU 1 and GPU 3 stay free.
    assert a.lookup(GPU1, "1") is None and a.lookup(GPU3, "3") is None


def test_mig_instances_by_dra(kubelet, node: Node) -> None:
    servicer, _, path = kubelet
    node.claim_spec(CLAIM_A, {MIG_3G: mig_nodes(minor("1"), 1)})
    node.claim_spec(CLAIM_B, {MIG_1G: mig_nodes(minor("1"), 9, ci=0)})
    servicer.pods = [
        dra_pod("train", "llama-worker-1", ("pytorch", [claim("mig-big", "train", dev(MIG_3G, CLAIM_A))])),
        dra_pod("serve", "vllm-7d9c8b6f5-x2k9q", ("vllm", [claim("mig-small", "serve", dev(MIG_1G, CLAIM_B))])),
    ]
    a = attributor(path, node)
    assert a.refresh() == []
    assert a.lookup(GPU1, "1", "1", MIG_A) == Allocation("train", "llama-worker-1", "pytorch", "llama")
    assert a.lookup(GPU1, "1", "9", MIG_B) == Allocation("serve", "vllm-7d9c8b6f5-x2k9q", "vllm", "vllm")
    # The spec's parent node (/dev/nvidia3) does not make the pod hold the whole GPU or other instances.
    assert a.lookup(GPU1, "1") is None
    assert a.lookup(GPU1, "1", "2", "MIG-free") is None
    assert a.lookup(GPU3, "3", "1") is None  # minor 1 is GPU 3: its GI 1 is not GPU 1's


def test_device_plugin_and_dra_on_one_node(kubelet, node: Node) -> None:
    servicer, _, path = kubelet
    node.claim_spec(CLAIM_C, {"gpu-1": ["/dev/nvidia1"]})  # minor 1 = GPU 3
    both = api_pb2.ContainerResources(  # one container with a device-plugin MIG instance and a claim
        name="trainer",
        devices=[api_pb2.ContainerDevices(resource_name="nvidia.com/mig-1g.10gb", device_ids=[MIG_C])],
        dynamic_resources=[claim("extra", "mixed", dev("gpu-1", CLAIM_C))])
    servicer.pods = [TRAINING[0], api_pb2.PodResources(name="mixed-0", namespace="mixed", containers=[both])]
    a = attributor(path, node)
    assert a.refresh() == []
    worker0 = Allocation("train", "llama-worker-0", "pytorch", "llama")
    assert a.lookup(GPU0, "0") == worker0 and a.lookup(GPU1, "1") == worker0  # device plugin
    mixed = Allocation("mixed", "mixed-0", "trainer", "mixed")
    assert a.lookup(GPU2, "2", "3", MIG_C) == mixed  # device plugin, same container
    assert a.lookup(GPU3, "3") == mixed  # DRA
    assert a.lookup(GPU2, "2") is None


@pytest.mark.parametrize("reverse", [False, True])
def test_a_claim_shared_by_containers_and_pods_reports_one_stable_holder(kubelet, node: Node, reverse) -> None:
    servicer, _, path = kubelet
    node.claim_spec(CLAIM_A, {"gpu-0": ["/dev/nvidia0"]})  # GPU 2
    shared = claim("shared-gpu", "inference", dev("gpu-0", CLAIM_A))
    pods = [dra_pod("inference", "server-b", ("app", [shared])),
            dra_pod("inference", "server-a", ("sidecar", [shared]), ("app", [shared]))]
    servicer.pods = pods[::-1] if reverse else pods
    a = attributor(path, node)
    assert a.refresh() == []
    assert a.lookup(GPU2, "2") == Allocation("inference", "server-a", "app", "server-a")


def test_devices_of_other_drivers_are_ignored(kubelet, node: Node) -> None:
    servicer, _, path = kubelet
    servicer.pods = [dra_pod("net", "rdma-0", ("app", [
        claim("nic", "net", ("gpu-0", "", ["k8s.dra.example.com/claim=nic"]), driver="dra.example.com"),
        claim("cpu", "net", ("cpu-0", "", []), driver="dra.cpu.example.com")]))]
    a = attributor(path, node)
    assert a.refresh() == []  # nothing of theirs is reported, and no CDI spec is even read
    assert all(a.lookup(u, i) is None for i, u in UUIDS.items())
    # Another driver name that follows the same convention is watched when configured.
    custom = attributor(path, node, dra_drivers=["dra.example.com"])
    assert custom.refresh() == []
    assert custom.lookup(GPU2, "2") == Allocation("net", "rdma-0", "app", "rdma")  # gpu-0: minor 0 = GPU 2
    off = build_attributor(path, dra_drivers=[""])
    assert off.refresh() == [] and off.lookup(GPU2, "2") is None


def test_unknown_device_is_reported_once_and_the_rest_still_attributed(kubelet, node: Node, caplog) -> None:
    servicer, _, path = kubelet
    node.claim_spec(CLAIM_A, {"gpu-2": ["/dev/nvidia2"]})
    weird = claim("odd", "lab", ("tpu-7", CLAIM_B, [cdi_name(CLAIM_B, "tpu-7")]))
    servicer.pods = [
        dra_pod("lab", "exp-a", ("main", [weird, claim("ok", "lab", dev("gpu-2", CLAIM_A))]), ("aux", [weird])),
        dra_pod("lab", "exp-b", ("main", [weird, claim("gone", "lab", ("gpu-7", CLAIM_C, []))])),
    ]
    clock = FakeClock()
    a = attributor(path, node, ttl=10, clock=clock)
    with caplog.at_level(logging.WARNING, logger="truegpu.attribution"):
        errors = a.refresh()
        assert [e.kind for e in errors] == ["dra_device_unknown"]
        assert errors[0].count("tpu-7") == 1 and f"{DRIVER}/{NODE}/tpu-7 (unknown device name)" in errors[0]
        assert "gpu-7 (no GPU with device minor 7 on this node)" in errors[0]
        assert a.lookup(GPU0, "0") == Allocation("lab", "exp-a", "main", "exp-a")  # gpu-2: minor 2 = GPU 0
        assert a.refresh() == []  # within ttl
        clock.now += 10
        assert [e.kind for e in a.refresh()] == ["dra_device_unknown"]  # counted each refresh
    assert len([r for r in caplog.records if "dra_device_unknown" in r.getMessage()]) == 1  # logged once


def test_cdi_spec_directory_missing(kubelet, tmp_path: Path, node: Node) -> None:
    servicer, _, path = kubelet
    servicer.pods = [dra_pod("train", "w-0", ("c", [claim("g", "train", dev("gpu-3", CLAIM_A),
                                                            dev(MIG_3G, CLAIM_A))]))]
    a = KubernetesAttributor(path, cdi_spec_dirs=[str(tmp_path / "nowhere")], proc_root=node.proc)
    errors = a.refresh()
    assert [e.kind for e in errors] == ["cdi_spec_dir_missing", "dra_device_unknown"]
    assert str(tmp_path / "nowhere") in errors[0] and "/var/run/cdi" in errors[0]
    assert "a MIG device needs its CDI spec" in errors[1]
    # The whole GPU still maps by its name (gpu-3: minor 3 = GPU 1); the MIG device is not guessed.
    assert a.lookup(GPU1, "1") == Allocation("train", "w-0", "c", "w")
    assert a.lookup(GPU1, "1", "1") == Allocation("train", "w-0", "c", "w")  # ... as the whole GPU's holder


def test_garbled_cdi_specs_are_reported_and_the_good_ones_used(kubelet, node: Node) -> None:
    servicer, _, path = kubelet
    node.claim_spec(CLAIM_A, {MIG_3G: mig_nodes(minor("1"), 1)})
    broken = node.cdi / f"k8s.{DRIVER}-claim_{CLAIM_B}.yaml"
    broken.write_text("cdiVersion: 0.5.0\nkind: [unclosed\n")
    (node.cdi / "list.json").write_text('["not", "a", "spec"]')
    os.mkfifo(node.cdi / "fifo.yaml")  # must not block the scrape
    (node.cdi / "notes.txt").write_text("ignored: not a spec file name")
    servicer.pods = [dra_pod("train", "w-0", ("c", [claim("g", "train", dev(MIG_3G, CLAIM_A))]))]
    clock = FakeClock()
    a = attributor(path, node, clock=clock)
    errors = a.refresh()
    assert [e.kind for e in errors] == ["cdi_spec_invalid"]
    assert str(broken) in errors[0] and "list.json" in errors[0] and "fifo" not in errors[0]
    assert a.lookup(GPU1, "1", "1") == Allocation("train", "w-0", "c", "w")
    broken.unlink()
    (node.cdi / "list.json").unlink()
    clock.now += 10
    assert a.refresh() == []


def test_kubelet_without_device_names_uses_the_cdi_names(kubelet, node: Node) -> None:
    """Kubelets before 1.31 send only the CDI devices of a claim: the driver comes from the CDI
    vendor, the GPU from the spec, or from the device name inside the CDI name without one."""
    servicer, _, path = kubelet
    node.claim_spec(CLAIM_A, {MIG_1G: mig_nodes(minor("1"), 9)})
    servicer.pods = [dra_pod("a", "old-0", ("c", [
        api_pb2.DynamicResource(claim_name="g", claim_namespace="a", claim_resources=[
            api_pb2.ClaimResource(cdi_devices=[api_pb2.CDIDevice(name=cdi_name(CLAIM_A, MIG_1G))]),
            api_pb2.ClaimResource(cdi_devices=[api_pb2.CDIDevice(name=cdi_name(CLAIM_B, "gpu-1"))])])]))]
    a = attributor(path, node)
    assert a.refresh() == []
    assert a.lookup(GPU1, "1", "9") == Allocation("a", "old-0", "c", "old")
    assert a.lookup(GPU3, "3") == Allocation("a", "old-0", "c", "old")  # no spec: gpu-1 from the name


def test_uuids_in_the_cdi_environment_win(kubelet, node: Node) -> None:
    servicer, _, path = kubelet
    node.claim_spec(CLAIM_A, {"gpu-0": ["/dev/nvidia0"]}, env=[f"NVIDIA_VISIBLE_DEVICES={MIG_A}"])
    servicer.pods = [dra_pod("a", "p", ("c", [claim("g", "a", dev("gpu-0", CLAIM_A))]))]
    a = attributor(path, node)
    assert a.refresh() == []
    assert a.lookup(GPU2, "2", "5", MIG_A) == Allocation("a", "p", "c", "p")
    assert a.lookup(GPU2, "2") is None  # the UUID said which device; the node was not consulted


def test_unreadable_minor_table_falls_back_to_the_index_and_says_so(kubelet, tmp_path: Path, node: Node) -> None:
    servicer, _, path = kubelet
    servicer.pods = [dra_pod("a", "p", ("c", [claim("g", "a", dev("gpu-3", CLAIM_A))]))]
    a = KubernetesAttributor(path, cdi_spec_dirs=[str(node.cdi)], proc_root=str(tmp_path / "noproc"))
    errors = a.refresh()
    assert [e.kind for e in errors] == ["gpu_minors_unavailable"]
    assert a.lookup("GPU-any", "3") == Allocation("a", "p", "c", "p")


def test_parse_cdi_spec_rejects_what_is_not_a_spec() -> None:
    good = parse_cdi_spec(b'{"cdiVersion": "0.6.0", "kind": "nvidia.com/gpu", "devices": '
                          b'[{"name": "0", "containerEdits": {"deviceNodes": [{"path": "/dev/nvidia0"}]}}]}')
    assert list(good) == ["nvidia.com/gpu=0"] and good["nvidia.com/gpu=0"].nodes == ("/dev/nvidia0",)
    for bad in (b"kind: nvidia.com/gpu\n", b"kind: gpu\ndevices: []\n", b"devices: [{}]\nkind: a/b\n", b":\n- ["):
        with pytest.raises(ValueError):
            parse_cdi_spec(bad)


def test_cli_flags_reach_the_attributor() -> None:
    from exporter.sources import describe_source
    from exporter.sources.nvml import from_args
    from truegpu.cli import build_parser

    base = ["exporter", "--source", "nvml", "--kubelet-socket", "/tmp/absent.sock"]
    args = build_parser().parse_args([*base, "--dra-driver", "gpu.example.com", "--dra-driver", DRIVER,
                                      "--cdi-spec-dir", "/host/run/cdi"])
    assert "cdi_spec_dir=['/host/run/cdi']" in describe_source("nvml", args)
    kube = from_args(args)._attributor
    assert kube.dra_drivers == {"gpu.example.com", DRIVER} and kube._cdi_specs.dirs == ("/host/run/cdi",)
    default = from_args(build_parser().parse_args(base))._attributor
    assert default.dra_drivers == {DRIVER} and default._cdi_specs.dirs == ("/etc/cdi", "/var/run/cdi")
    off = from_args(build_parser().parse_args([*base, "--dra-driver=", "--cdi-spec-dir="]))._attributor
    assert off.dra_drivers == frozenset() and off._cdi_specs.dirs == ()
    with pytest.raises(ValueError, match="--dra-driver need --kubelet-socket"):
        from_args(build_parser().parse_args(["exporter", "--source", "nvml", "--dra-driver", DRIVER]))
