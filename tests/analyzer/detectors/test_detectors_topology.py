"""topology: WAN-split, MIG-slice, NVLink-less and NUMA-spread training jobs; hand-built fleets and scenarios."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.analysis.evaluate import evaluate_scenarios
from analyzer.data.frame import TOPOLOGY_COLUMNS, Fleet
from analyzer.detectors import run_detectors
from analyzer.detectors._peers import communicating
from analyzer.detectors.topology import Topology, _one_numa_packing
from analyzer.findings import TOPOLOGY
from exporter.simulator.scenario import list_scenarios
from tests.fleets import STEP, T0, timeline

STEPS = 60
TRAIN = {"gpu_util": 0.97, "sm_active": 0.70, "tensor_active": 0.2, "dram_active": 0.3}
WAITING = {"gpu_util": 0.97, "sm_active": 0.35, "tensor_active": 0.08, "dram_active": 0.1}
SERVE = {"gpu_util": 0.4, "sm_active": 0.15, "tensor_active": 0.05, "dram_active": 0.2}


def dev(host: str, gpu: int, job: object, pod: object, levels: dict, **kw: object) -> dict:
    ns = [None if j is None else "ns" for j in job] if isinstance(job, list) else None if job is None else "ns"
    return {"hostname": host, "gpu": gpu, "uuid": f"GPU-{host}-{gpu}", "job": job, "pod": pod, "namespace": ns,
            **levels, **kw}


def topo(host: str, gpus: int, link: object) -> pd.DataFrame:
    """Pairwise links of one node; ``link`` a string or a function (a, b) -> link."""
    rows = [(host, str(a), str(b), link(a, b) if callable(link) else link)
            for a in range(gpus) for b in range(gpus) if a != b]
    return pd.DataFrame(rows, columns=list(TOPOLOGY_COLUMNS))


def pcie(a: int, b: int) -> str:
    """L40S-like board: pairs share a PCIe switch, GPUs 0-3 / 4-7 on NUMA 0 / 1."""
    return "pcie_switch" if a // 2 == b // 2 else "numa" if a // 4 == b // 4 else "system"


def fleet(devices: list[dict], *topologies: pd.DataFrame, steps: int = STEPS) -> Fleet:
    fl = timeline(devices, steps)
    if topologies:
        fl.topology = pd.concat(topologies, ignore_index=True)
    return fl


def node(host: str, job: str | None, pod: str | None, levels: dict, gpus: range = range(8), **kw: object) -> list[dict]:
    return [dev(host, g, job, pod, levels, **kw) for g in gpus]


# WAN ---------------------------------------------------------------------------------------
def wan_fleet(**kw: object) -> Fleet:
    return fleet(
        node("a1", "split", "split-worker-0", WAITING, site="dc1")
        + node("b1", "split", "split-worker-1", WAITING, site="dc2")
        + node("a2", "local", "local-worker-0", TRAIN, site="dc1"),
        topo("a1", 8, "nvlink"), topo("b1", 8, "nvlink"), topo("a2", 8, "nvlink"), **kw)


def test_training_split_across_sites_is_one_job_level_warning_with_its_cost() -> None:
    (f,) = Topology().detect(wan_fleet())
    assert f.kind == TOPOLOGY and f.severity == "warning" and f.confidence == "high"
    assert (f.hostname, f.gpu, f.job, f.namespace) == (None, None, "split", "ns")
    assert (f.start, f.end) == (T0, None)  # open while the placement lasts
    ev = f.evidence
    assert ev["problem"] == "wan" and ev["hosts_per_site"] == {"dc1": 1, "dc2": 1} and ev["hosts"] == ["a1", "b1"]
    assert ev["gpu_hours"] == pytest.approx(16.0)
    assert ev["job_activity"] == pytest.approx(0.35) and ev["reference_activity"] == pytest.approx(0.70)
    assert ev["est_slowdown"] == pytest.approx(0.5) and ev["gpu_hours_at_stake"] == pytest.approx(8.0)
    assert ev["communication_share"] == pytest.approx(1.0)
    assert "dc1" in f.summary and "dc2" in f.summary and "WAN" in f.summary and "one site" in f.summary
    assert "50% slower" in f.summary
    f.to_json()


def test_wan_finding_closes_when_the_job_leaves_one_site() -> None:
    job, pod = ["split"] * 30 + [None] * (STEPS - 30), ["split-worker-1"] * 30 + [None] * (STEPS - 30)
    devices = node("a1", "split", "split-worker-0", WAITING, site="dc1") + [
        dev("b1", g, job, pod, WAITING, site="dc2") for g in range(8)]
    (f,) = Topology().detect(fleet(devices))
    assert (f.start, f.end) == (T0, T0 + 30 * STEP)


def test_inference_deployment_across_sites_is_not_a_split_job() -> None:
    devices = [dev(h, g, "chat", f"chat-5d8f9c7b6-{h}{g}k9", SERVE, site=s)
               for h, s in (("a1", "dc1"), ("b1", "dc2")) for g in range(2)]
    assert Topology().detect(fleet(devices)) == []
    busy = [{**d, **TRAIN} for d in devices]  # even steadily busy: replicas of a Deployment do not talk
    assert Topology().detect(fleet(busy)) == []


def phases(levels: dict, rng: np.random.Generator | None, seed: int = 0) -> dict:
    """``levels`` with SM/tensor activity moving in busy/wait phases: the same phases on every member when
    ``rng`` is None (one collective: members wait together), independent ones per member otherwise."""
    r = rng if rng is not None else np.random.default_rng(seed)
    wave = r.normal(0.0, 0.06, STEPS)
    return {**levels, "sm_active": list(np.clip(levels["sm_active"] + wave, 0.0, 1.0)),
            "tensor_active": list(np.clip(levels["tensor_active"] + wave / 3, 0.0, 1.0))}


def test_unnamed_gang_is_recognised_by_behaviour_with_low_confidence() -> None:
    sync = phases(WAITING, None)  # one shared sequence of busy/wait phases
    devices = node("a1", "sweep", "sweep-q2k8z", sync, site="dc1") + node("b1", "sweep", "sweep-x7m4p", sync,
                                                                            site="dc2")
    (f,) = Topology().detect(fleet(devices))
    assert f.confidence == "low" and f.evidence["problem"] == "wan"
    assert "in step" in f.evidence["training_evidence"]
    # The same pods with flat or independent phases show no sign of talking: not one job.
    flat = node("a1", "sweep", "sweep-q2k8z", WAITING, site="dc1") + node("b1", "sweep", "sweep-x7m4p", WAITING,
                                                                           site="dc2")
    assert Topology().detect(fleet(flat)) == []
    rng = np.random.default_rng(1)
    apart = [{**d, **phases(WAITING, rng)} for d in flat]
    assert Topology().detect(fleet(apart)) == []
    idle = [{**d, "gpu_util": 0.02, "sm_active": 0.0} for d in devices]  # two idle notebooks are not a gang
    assert Topology().detect(fleet(idle)) == []


def test_short_placement_is_not_reported() -> None:
    part = ["split"] * 4 + [None] * (STEPS - 4)
    pods = [f"split-worker-{i}" if j else None for i, j in ((1, x) for x in part)]
    devices = node("a1", "split", "split-worker-0", WAITING, site="dc1") + [
        dev("b1", g, part, pods, WAITING, site="dc2") for g in range(8)]
    assert Topology().detect(fleet(devices)) == []
    assert len(Topology(min_duration_s=180).detect(fleet(devices))) == 1


# MIG ---------------------------------------------------------------------------------------
def mig(host: str, gpu: int, inst: int, job: str | None, pod: str | None, levels: dict) -> dict:
    return {**dev(host, gpu, job, pod, {**levels, "gpu_util": None, "gr_active": levels["gpu_util"]}),
            "gpu_instance": str(inst), "mig_profile": "3g.40gb"}


def test_training_on_mig_slices_is_a_warning_and_inference_on_slices_is_not() -> None:
    devices = [mig("a1", g, i, "ft", f"ft-worker-{2 * g + i - 1}", TRAIN) for g in range(2) for i in (1, 2)]
    devices += [mig("a1", 2, i, "serve", f"serve-7c9d4b8f5-k{i}x2z", SERVE) for i in (1, 2)]
    devices += node("a2", "big", "big-worker-0", TRAIN, gpus=range(4))
    (f,) = Topology().detect(fleet(devices, topo("a1", 4, "nvlink"), topo("a2", 4, "nvlink")))
    assert (f.job, f.severity, f.evidence["problem"]) == ("ft", "warning", "mig")
    ev = f.evidence
    assert ev["members"] == 4 and ev["physical_gpus"] == 2 and ev["mig_profiles"] == ["3g.40gb"]
    assert ev["whole_gpu_equivalent"] == pytest.approx(4 * 3 / 7)
    assert ev["gpu_hours"] == pytest.approx(4 * 3 / 7)
    assert "MIG" in f.summary and "2 whole GPU(s)" in f.summary


def test_single_instance_training_is_fine() -> None:
    assert Topology().detect(fleet([mig("a1", 0, 1, "ft", "ft-worker-0", TRAIN)])) == []


def test_mig_training_is_still_found_without_topology_or_sites_dcgm_like() -> None:
    devices = [{**mig("a1", g, i, "ft", f"ft-worker-{2 * g + i - 1}", TRAIN), "site": ""}
               for g in range(2) for i in (1, 2)]
    fl = fleet(devices)
    (f,) = Topology().detect(fl)
    assert f.evidence["problem"] == "mig"
    assert any("no GPU topology" in n and "no site labels" in n and "MIG" in n for n in fl.notes)


def test_without_sites_or_topology_nothing_else_is_guessed() -> None:
    fl = wan_fleet()
    fl.topology = fl.topology.iloc[0:0]
    fl.frame["site"] = pd.Categorical([""] * len(fl.frame))
    assert Topology().detect(fl) == []


# NVLink ------------------------------------------------------------------------------------
def test_multi_gpu_training_without_nvlink_while_nvlink_exists() -> None:
    devices = node("p1", "tp", "tp-worker-0", WAITING, gpus=range(4)) + node("n1", "ok", "ok-worker-0", TRAIN)
    (f,) = Topology().detect(fleet(devices, topo("p1", 8, pcie), topo("n1", 8, "nvlink")))
    assert (f.job, f.evidence["problem"]) == ("tp", "no_nvlink")
    assert f.evidence["per_host_gpus"] == {"p1": [0, 1, 2, 3]}
    assert f.severity == "warning"  # communication-bound: the missing NVLink costs
    assert "NVLink" in f.summary and "PCIe" in f.summary


def test_without_topology_no_nvlink_comes_from_traffic_with_low_confidence() -> None:
    gang = node("p1", "tp", "tp-worker-0", {**WAITING, "nvlink_bps": None}, gpus=range(4))
    ok = node("n1", "ok", "ok-worker-0", {**TRAIN, "nvlink_bps": 3e10})
    (f,) = Topology().detect(fleet(gang + ok))
    assert (f.job, f.evidence["problem"], f.confidence) == ("tp", "no_nvlink", "low")
    # NVLink bytes not collected anywhere (dcgm-exporter default counters): nothing claimed.
    quiet = node("n1", "ok", "ok-worker-0", {**TRAIN, "nvlink_bps": None})
    assert Topology().detect(fleet(gang + quiet)) == []
    # A gang hung in NCCL (a member died: util ~97 %, SM ~0.05) moves nothing over any link: its silence
    # says nothing about NVLink, as in serve's window after an XID 79.
    hung = node("p1", "tp", "tp-worker-0", {**WAITING, "sm_active": 0.05, "tensor_active": 0.0, "nvlink_bps": 0.0},
                gpus=range(4))
    assert Topology().detect(fleet(hung + ok)) == []
    # dcgm-exporter's default counters (no SM activity): tensor work tells a gang at work; a hung one has none
    def no_sm(devices: list[dict]) -> list[dict]:
        return [{k: v for k, v in d.items() if k != "sm_active"} for d in devices]
    (f,) = Topology().detect(fleet(no_sm(gang + ok)))
    assert (f.job, f.evidence["problem"]) == ("tp", "no_nvlink")
    assert Topology().detect(fleet(no_sm(hung + ok))) == []
    # NVLink reported on the node (0 while the gang loads) but unknown while it works (a scrape gap: a rate has no
    # value at its first sample after one, SM activity has): unknown, not silence (serve's window as a fine-tune
    # began on an HGX node: "talks over PCIe").
    half = STEPS // 2
    starting = node("p1", "tp", "tp-worker-0", {
        **{k: [0.0] * half + [v] * half for k, v in TRAIN.items()},
        "nvlink_bps": [0.0] * half + [None] * half}, gpus=range(4))
    assert Topology().detect(fleet(starting + ok)) == []


def test_no_nvlink_anywhere_means_nowhere_better_to_go() -> None:
    devices = node("p1", "tp", "tp-worker-0", WAITING, gpus=range(4))
    assert Topology().detect(fleet(devices, topo("p1", 8, pcie))) == []


def test_inference_and_single_gpu_jobs_on_pcie_are_fine() -> None:
    devices = [dev("p1", g, "serve", f"serve-7c9d4b8f5-k{g}x2z", SERVE) for g in range(4)]
    devices += [dev("p1", 4, "one", "one-worker-0", TRAIN)]
    devices += node("n1", "ok", "ok-worker-0", TRAIN)
    assert Topology().detect(fleet(devices, topo("p1", 8, pcie), topo("n1", 8, "nvlink"))) == []


def test_statefulset_replicas_serving_independently_are_not_one_job() -> None:
    """``tensorflow-0..3`` (one workload ``tensorflow`` by its StatefulSet) on four PCIe-only GPUs, steadily
    busy, each serving its own requests: no sign of talking, so no "talks over PCIe" finding. The same
    pods moving in lock-step busy/wait phases are a collective, found with confidence "low"."""
    busy = {"gpu_util": 0.93, "sm_active": 0.55, "tensor_active": 0.2, "dram_active": 0.3}
    rng = np.random.default_rng(7)
    ok = node("n1", "ok", "ok-worker-0", TRAIN)
    links = (topo("p1", 8, pcie), topo("n1", 8, "nvlink"))
    alone = [dev("p1", g, "tensorflow", f"tensorflow-{g}", phases(busy, rng)) for g in range(4)]
    assert Topology().detect(fleet(alone + ok, *links)) == []
    together = phases(busy, None, seed=3)
    gang = [dev("p1", g, "tensorflow", f"tensorflow-{g}", together) for g in range(4)]
    (f,) = Topology().detect(fleet(gang + ok, *links))
    assert (f.job, f.evidence["problem"], f.confidence) == ("tensorflow", "no_nvlink", "low")


def test_communicating_judgement_and_its_evidence() -> None:
    rng = np.random.default_rng(2)
    busy = {"gpu_util": 0.93, "sm_active": 0.55, "tensor_active": 0.2, "dram_active": 0.3}
    apart = [dev("p1", g, "tf", f"tf-{g}", phases(busy, rng)) for g in range(4)]
    lock = [dev("p2", g, "lock", f"lock-{g}", phases(busy, None, seed=5)) for g in range(4)]
    nvl = [dev("p3", g, "nv", f"nv-{g}", {**busy, "nvlink_bps": 2e10}) for g in range(2)]
    named = [dev("p4", g, "pt", "pt-worker-0", busy) for g in range(2)]
    one = [dev("p5", 0, "solo", "solo-0", busy)]
    renamed = [dev("p6", 0, "api", ["api-x2k9q"] * 30 + ["api-p7xqz"] * (STEPS - 30), phases(busy, rng))]
    comm = communicating(fleet(apart + lock + nvl + named + one + renamed))
    assert comm["tf"].communicating is False and comm["tf"].sync is not None and abs(comm["tf"].sync) < 0.3
    assert (comm["lock"].communicating, comm["lock"].evidence) == (True, "synchronized")
    assert comm["lock"].sync == pytest.approx(1.0)
    assert (comm["nv"].communicating, comm["nv"].evidence) == (True, "nvlink")
    assert (comm["pt"].communicating, comm["pt"].evidence) == (True, "declared")
    assert comm["solo"].communicating is None and comm["api"].concurrent_pods == 1
    assert comm["tf"].concurrent_pods == 4


# NUMA --------------------------------------------------------------------------------------
def test_job_spread_over_numa_nodes_while_one_would_do_is_info() -> None:
    devices = node("p1", "job4", "job4-worker-0", TRAIN, gpus=range(2, 6))  # 2,3 on NUMA 0; 4,5 on NUMA 1
    (f,) = Topology().detect(fleet(devices, topo("p1", 8, pcie)))
    assert (f.job, f.severity, f.evidence["problem"], f.confidence) == ("job4", "info", "numa", "high")
    assert f.evidence["per_host_gpus"] == {"p1": [2, 3, 4, 5]}
    assert "NUMA" in f.summary


def test_numa_spread_beside_single_gpu_pods_is_flagged_they_could_sit_around_it() -> None:
    devices = node("p1", "job4", "job4-worker-0", TRAIN, gpus=range(2, 6))
    devices += [dev("p1", g, "serve", f"serve-7c9d4b8f5-k{g}x2z", SERVE) for g in (0, 1, 6, 7)]
    (f,) = Topology().detect(fleet(devices, topo("p1", 8, pcie)))
    assert f.evidence["problem"] == "numa" and "fit in one" in f.summary


def test_numa_spread_forced_by_numa_aligned_neighbours_is_fine() -> None:
    devices = node("p1", "job2", "job2-worker-0", TRAIN, gpus=range(3, 5))  # 3 on NUMA 0, 4 on NUMA 1
    devices += node("p1", "x", "x-worker-0", TRAIN, gpus=range(0, 3)) + node("p1", "y", "y-worker-0", TRAIN,
                                                                               gpus=range(5, 8))
    assert Topology().detect(fleet(devices, topo("p1", 8, pcie))) == []
    # Two 2-GPU neighbours could share NUMA 1 and leave NUMA 0 to a 4-GPU job: flagged.
    devices = node("p1", "job4", "job4-worker-0", TRAIN, gpus=range(2, 6))
    devices += node("p1", "x", "x-worker-0", TRAIN, gpus=range(0, 2)) + node("p1", "y", "y-worker-0", TRAIN,
                                                                               gpus=range(6, 8))
    assert [f.job for f in Topology().detect(fleet(devices, topo("p1", 8, pcie)))] == ["job4"]


def test_packing() -> None:
    halves = [0x0F, 0xF0]
    assert _one_numa_packing(halves, 4, [0x01, 0x02, 0x40, 0x80])  # single-GPU pods move anywhere
    assert _one_numa_packing(halves, 4, [0x03, 0xC0])  # two 2-GPU pods share a NUMA node
    assert not _one_numa_packing(halves, 2, [0x07, 0xE0])  # 3+3 aligned: 1+1 left
    assert _one_numa_packing(halves, 2, [0x07, 0x18])  # a spanning pod may move: only 0x07 is rigid
    assert not _one_numa_packing(halves, 5, [])


def test_more_gpus_than_one_numa_node_holds_is_fine() -> None:
    devices = node("p1", "job6", "job6-worker-0", TRAIN, gpus=range(6))
    assert Topology().detect(fleet(devices, topo("p1", 8, pcie))) == []


def test_numa_on_nvlink_boards_uses_the_socket_halves_with_low_confidence() -> None:
    devices = node("n1", "job2", "job2-worker-0", TRAIN, gpus=range(3, 5))
    (f,) = Topology().detect(fleet(devices, topo("n1", 8, "nvlink")))
    assert (f.evidence["problem"], f.confidence) == ("numa", "low")
    assert Topology(assume_socket_halves=False).detect(fleet(devices, topo("n1", 8, "nvlink"))) == []
    same_socket = node("n1", "job2", "job2-worker-0", TRAIN, gpus=range(2, 4))
    assert Topology().detect(fleet(same_socket, topo("n1", 8, "nvlink"))) == []


def test_numa_without_topology_only_on_boards_moving_nvlink_traffic() -> None:
    """dcgm-exporter input (no topology): a node whose GPUs move NVLink traffic is an NVLink board and takes the
    socket halves (low confidence); PCIe cards, or NVLink bytes not collected, are never guessed."""
    def board(nvl: float | None) -> list[dict]:
        job = node("n1", "job2", "job2-worker-0", {**TRAIN, "nvlink_bps": nvl}, gpus=range(3, 5))
        return job + node("n1", None, None, {"gpu_util": 0.0, "sm_active": 0.0, "nvlink_bps": None if nvl is None
                                             else 0.0}, gpus=[0, 1, 2, 5, 6, 7])
    (f,) = Topology().detect(fleet(board(3e10)))
    assert (f.job, f.evidence["problem"], f.confidence) == ("job2", "numa", "low")
    assert f.evidence["per_host_gpus"] == {"n1": [3, 4]}
    assert Topology().detect(fleet(board(0.0))) == []  # PCIe cards: the layout is unknown
    assert Topology().detect(fleet(board(None))) == []  # NVLink bytes not collected
    assert Topology(assume_socket_halves=False).detect(fleet(board(3e10))) == []


def test_runner_and_empty_inputs() -> None:
    assert run_detectors(wan_fleet(), [TOPOLOGY])[0].job == "split"
    empty = timeline([{"gpu": 0, **TRAIN}], 10)
    assert Topology().detect(empty) == []


# Scenarios ---------------------------------------------------------------------------------
@pytest.mark.parametrize("name", list_scenarios())
def test_scenario_quality_truegpu(name: str) -> None:
    (r,) = evaluate_scenarios([name], "truegpu", 60.0, kinds=[TOPOLOGY])
    k = r["kinds"][TOPOLOGY]
    assert k["precision"] >= 0.95, k["false_findings"]
    assert k["recall"] >= 0.95, k["missed_truth"]
    if k["truth"] == 0:
        assert k["findings"] == 0, k["false_findings"]


@pytest.mark.parametrize("name", ["topology-mistakes", "mig-training", "healthy-fleet", "mixed-fleet"])
def test_scenario_dcgm_default_counters_no_false_findings(name: str) -> None:
    (r,) = evaluate_scenarios([name], "dcgm", 60.0, kinds=[TOPOLOGY], dcgm_counters="default")
    assert r["kinds"][TOPOLOGY]["fp"] == 0, r["kinds"][TOPOLOGY]["false_findings"]


@pytest.mark.parametrize("counters", ["all", "default"])
@pytest.mark.parametrize("name", ["topology-mistakes", "wan-split"])
def test_scenario_quality_dcgm(name: str, counters: str) -> None:
    """dcgm-exporter has no topology: sites come from kube-state-metrics' node zones, NUMA from the board layout
    of nodes moving NVLink traffic (in its default counters too)."""
    (r,) = evaluate_scenarios([name], "dcgm", 60.0, kinds=[TOPOLOGY], dcgm_counters=counters)
    k = r["kinds"][TOPOLOGY]
    assert k["precision"] >= 0.95 and k["recall"] >= 0.95, (k["false_findings"], k["missed_truth"])


@pytest.mark.parametrize("name", list_scenarios())
def test_scenario_dcgm_without_false_findings(name: str) -> None:
    (r,) = evaluate_scenarios([name], "dcgm", 60.0, kinds=[TOPOLOGY])
    k = r["kinds"][TOPOLOGY]
    assert k["fp"] == 0, k["false_findings"]
    assert any("topology:" in n for n in r["notes"]) or k["findings"] == 0
