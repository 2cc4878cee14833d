"""SimulatedSource: one node's families per collect, lost GPUs fail alone, virtual time."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from exporter import schema as S
from exporter.simulator.model import PRODUCED
from exporter.sources.base import Source
from exporter.sources.simulated import SimulatedSource


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def source(scenario: str, hosts: list[str] | None, **kw) -> tuple[SimulatedSource, Clock]:
    clock = Clock()
    return SimulatedSource(scenario, hostnames=hosts, clock=clock, **kw), clock


def test_one_node_returns_every_family_for_its_gpus_only():
    src, clock = source("thermal-straggler", ["dc1-r1-n02"])
    assert isinstance(src, Source) and src.name == "simulated"
    clock.now += 600
    r = src.collect()
    assert r.up and not r.errors
    expected = (PRODUCED | {S.GPU_INFO, S.GPU_TOPOLOGY_INFO, S.NODE_INFO})
    assert set(r.samples) == expected
    for m, samples in r.samples.items():
        for labels, value in samples:
            assert labels[S.HOSTNAME] == "dc1-r1-n02"
            assert tuple(labels) == m.all_labels, m.name
            assert value == value  # no NaN is ever published
    assert len(r.samples[S.GPU_UTILIZATION]) == 8
    assert len(r.samples[S.TEMPERATURE]) == 16
    assert len(r.samples[S.GPU_TOPOLOGY_INFO]) == 56
    assert len(r.samples[S.CLOCK_EVENT_ACTIVE]) == 8 * len(S.CLOCK_EVENT_REASONS)
    assert len(r.samples[S.NODE_INFO]) == 1
    alloc = r.samples[S.GPU_ALLOCATION_INFO]
    assert {lb["pod"] for lb, _ in alloc} == {"pretrain-7b-worker-1"}


def test_values_match_the_cluster_at_the_same_virtual_time():
    src, clock = source("thermal-straggler", ["dc1-r1-n01"])
    clock.now += 2 * 3600 + 0.4  # inside the throttling window, mid-tick
    r = src.collect()
    c = src.cluster
    t = c.start + 2 * 3600
    table = c.sample(np.array([t]), c.rows_for(["dc1-r1-n01"]))
    util = {lb[S.GPU]: v for lb, v in r.samples[S.GPU_UTILIZATION]}
    for i, g in enumerate(c.gpus.gpu[c.rows_for(["dc1-r1-n01"])]):
        assert util[g] == table[S.GPU_UTILIZATION.name][0, i]
    thermal = {lb[S.GPU]: v for lb, v in r.samples[S.CLOCK_EVENT_ACTIVE] if lb["reason"] == "sw_thermal"}
    assert thermal["5"] == 1.0 and thermal["4"] == 0.0


def test_lost_gpu_fails_alone_and_its_families_are_omitted():
    src, clock = source("mixed-fleet", ["dc1-r2-n01"])
    r = src.collect()  # before the XID 79
    assert r.up and len(r.samples[S.POWER]) == 8
    clock.now += 2 * 3600
    r = src.collect()
    assert not r.up
    assert [(e.kind, e.gpu) for e in r.errors] == [("gpu_lost", "3")]
    for m, samples in r.samples.items():
        gpus = {lb.get(S.GPU) for lb, _ in samples}
        assert "3" not in gpus, m.name
    assert len(r.samples[S.POWER]) == 7 and len(r.samples[S.GPU_INFO]) == 7
    assert S.NODE_INFO in r.samples


def test_other_nodes_are_unaffected_by_a_lost_gpu():
    src, clock = source("mixed-fleet", ["dc1-r2-n02"])
    clock.now += 2 * 3600
    r = src.collect()
    assert r.up and not r.errors and len(r.samples[S.POWER]) == 8


def test_speed_offset_and_wrapping_keep_counters_monotonic():
    src, clock = source("power-capped", None, speed=60.0, start=600.0)
    assert src.virtual_time() == src.cluster.start + 600.0
    clock.now += 10
    assert src.virtual_time() == src.cluster.start + 1200.0
    energies = []
    for _ in range(6):  # 6 x 30 min virtual: past the 2 h scenario end
        clock.now += 30
        r = src.collect()
        energies.append(sum(v for _, v in r.samples[S.ENERGY]))
    assert all(b > a for a, b in itertools.pairwise(energies))


def test_absolute_start_moves_the_scenario():
    src, _ = source("power-capped", ["dc1-r1-n01"], start=1.7e9)
    assert src.cluster.start == 1.7e9 and src.virtual_time() == 1.7e9


def test_within_one_tick_values_repeat_and_readings_are_independent():
    src, clock = source("mixed-fleet", ["dc1-r1-n01"])
    a = src.collect()
    a.samples[S.POWER].clear()
    clock.now += 0.2
    b = src.collect()
    assert len(b.samples[S.POWER]) == 8
    clock.now += 5
    c = src.collect()
    assert c.samples[S.ENERGY][0][1] > b.samples[S.ENERGY][0][1]


def test_mig_instances_carry_instance_labels():
    src, _ = source("mig-training", ["dc1-r1-n01"])
    r = src.collect()
    sm = r.samples[S.SM_ACTIVE]
    mig = [lb for lb, _ in sm if S.GPU_INSTANCE in lb]
    assert mig and all(tuple(lb) == S.SM_ACTIVE.all_labels + S.MIG_LABELS for lb in mig)
    # GPU util is not supported on MIG instances: omitted (unknown), not a failure
    assert all(S.GPU_INSTANCE not in lb for lb, _ in r.samples[S.GPU_UTILIZATION])
    assert r.up
    # device-level families appear once per physical GPU
    assert len(r.samples[S.POWER]) == 8


def test_unknown_hostname_is_a_clear_error():
    with pytest.raises(ValueError, match="nope"):
        SimulatedSource("power-capped", hostnames=["nope"])
