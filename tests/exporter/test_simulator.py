"""Cluster simulator: determinism, calibration, workload semantics, counters, series()."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from exporter import schema as S
from exporter.simulator import SAMPLE_SIGNALS, Cluster, list_scenarios, load_scenario, sample_key
from exporter.simulator.model import INSTANCE_METRICS

STEP = 15.0
_CACHE: dict[str, tuple[Cluster, np.ndarray, dict[str, np.ndarray]]] = {}


def run(name: str) -> tuple[Cluster, np.ndarray, dict[str, np.ndarray]]:
    """Cluster, times and the full table of a bundled scenario (cached per test session)."""
    if name not in _CACHE:
        c = Cluster(load_scenario(name))
        t = c.start + np.arange(0.0, c.duration, STEP)
        _CACHE[name] = (c, t, c.sample(t))
    return _CACHE[name]


def col(c: Cluster, host: str, gpu: str) -> int:
    hits = np.flatnonzero((c.gpus.hostname == host) & (c.gpus.gpu == gpu))
    assert len(hits) == 1
    return int(hits[0])


def window(c: Cluster, t: np.ndarray, a: float, b: float) -> np.ndarray:
    return (t >= c.start + a) & (t < c.start + b)


K_UTIL = S.GPU_UTILIZATION.name
K_SM = S.SM_ACTIVE.name
K_TENSOR = S.TENSOR_ACTIVE.name
K_CLOCK = S.SM_CLOCK.name
K_POWER = S.POWER.name
K_TEMP = sample_key(S.TEMPERATURE, sensor="gpu")
K_MEMTEMP = sample_key(S.TEMPERATURE, sensor="memory")


def test_sample_keys_cover_every_signal_and_ratios_are_valid():
    c, t, d = run("mixed-fleet")
    assert list(d) == [k for _, _, k in SAMPLE_SIGNALS]
    for m, _, key in SAMPLE_SIGNALS:
        assert d[key].shape == (len(t), len(c.gpus)), key
        if m.unit == "ratio":
            v = d[key][~np.isnan(d[key])]
            assert v.min() >= 0.0 and v.max() <= 1.0, key
    assert sample_key(S.ECC_ERRORS, type="uncorrectable", scope="volatile") in d
    assert len(c.gpus) == 64 and len(set(c.gpus.uuid)) == 64


def test_same_seed_same_output_and_seed_matters():
    a = Cluster(load_scenario("mixed-fleet"))
    b = Cluster(load_scenario("mixed-fleet"))
    other = Cluster(load_scenario("mixed-fleet"), seed=99)
    t = a.start + np.arange(0, 3600, 60.0)
    da, db, do = a.sample(t), b.sample(t), other.sample(t)
    for key in da:
        np.testing.assert_array_equal(da[key], db[key], err_msg=key)
    assert list(a.gpus.uuid) == list(b.gpus.uuid)
    assert not np.array_equal(da[K_POWER], do[K_POWER], equal_nan=True)
    assert a.ground_truth() == b.ground_truth()


def test_arbitrary_unsorted_and_single_times_match_a_range():
    c = Cluster(load_scenario("xid-faults"))
    t = c.start + np.arange(0, c.duration, 37.0)
    full = c.sample(t)
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(t))
    shuffled = c.sample(t[perm])
    for key in full:
        np.testing.assert_array_equal(shuffled[key], full[key][perm], err_msg=key)
    i = len(t) // 2
    single = c.sample(t[i])
    for key in full:
        np.testing.assert_array_equal(single[key][0], full[key][i], err_msg=key)


def test_row_subset_matches_full_table_including_gang_effects():
    c, t, d = run("thermal-straggler")
    rows = c.rows_for(["dc1-r1-n02"])  # the straggler's gang-mates are on the other node
    sub = c.sample(t, rows)
    for key in d:
        np.testing.assert_array_equal(sub[key], d[key][:, rows], err_msg=key)


def test_healthy_fleet_matches_acme_calibration():
    c, _t, d = run("healthy-fleet")
    h100 = np.array(["H100" in m for m in c.gpus.model])
    util, sm, tensor = d[K_UTIL], d[K_SM], d[K_TENSOR]
    busy = util > 0.5
    assert 0.93 <= np.median(util[busy]) <= 0.99
    assert 0.5 <= np.median(sm[busy]) <= 0.75
    assert 0.12 <= np.median(tensor[busy]) <= 0.3
    assert 0.26 <= np.mean(util <= 0.01) <= 0.34
    temp, mem = d[K_TEMP][:, h100], d[K_MEMTEMP][:, h100]
    assert 32 <= np.median(temp) <= 48
    assert 52 <= np.percentile(temp, 90) <= 68
    assert 24 <= np.percentile(temp, 10) <= 32
    assert np.median(mem) > np.median(temp)
    power = d[K_POWER][:, h100]
    assert 60 <= np.median(power) <= 200
    assert 330 <= np.percentile(power, 90) <= 480
    assert np.percentile(power, 10) >= 50
    # realistic noise: busy GPUs do not report one constant value
    assert np.std(sm[busy]) > 0.01 and len(np.unique(util[busy])) > 3


def test_thermal_straggler_keeps_computing_while_peers_wait_at_the_barrier():
    c, t, d = run("thermal-straggler")
    s = col(c, "dc1-r1-n01", "5")
    peers = [i for i in range(len(c.gpus)) if i != s]
    before, during = window(c, t, 10 * 60, 55 * 60), window(c, t, 80 * 60, 140 * 60)
    thermal = sample_key(S.CLOCK_EVENT_ACTIVE, reason="sw_thermal")
    # the straggler: hot, throttled clock, thermal clock events
    assert d[K_TEMP][during, s].mean() > 85
    assert d[K_CLOCK][during, s].mean() < 0.75 * 1980e6
    assert d[thermal][during, s].min() == 1.0 and d[thermal][before, s].max() == 0.0
    assert d[K_CLOCK][before, s].mean() > 0.95 * 1980e6
    # peers: GPU util stays high while SM/tensor activity drop in proportion
    for k in (K_SM, K_TENSOR):
        drop = d[k][during][:, peers].mean() / d[k][before][:, peers].mean()
        assert drop < 0.75, k
    assert d[K_UTIL][during][:, peers].mean() > 0.9
    assert d[thermal][during][:, peers].max() == 0.0
    # the slow one keeps computing: its SM activity stays above its waiting peers'
    assert d[K_SM][during, s].mean() > d[K_SM][during][:, peers].mean() + 0.1


def test_input_starved_node_shows_true_idle_gaps_and_peers_wait():
    c, t, d = run("input-starved-node")
    starved = c.rows_for(["dc1-r1-n03"])
    peers = c.rows_for(["dc1-r1-n01", "dc1-r1-n02"])
    before, during = window(c, t, 10 * 60, 55 * 60), window(c, t, 65 * 60, 115 * 60)
    u = d[K_UTIL]
    for r in starved:  # every GPU of the node loses GPU util, not just SM activity
        assert u[during, r].mean() < 0.7 * u[before, r].mean()
    assert u[during][:, peers].mean() > 0.9
    assert d[K_SM][during][:, peers].mean() < 0.75 * d[K_SM][before][:, peers].mean()
    assert (d[K_CLOCK][during][:, starved] > 0.95 * 1980e6).all()  # not a throttling problem


def test_power_cap_flattens_power_and_lowers_clock():
    c, t, d = run("power-capped")
    s = c.jobs[0].rows[9]
    during = window(c, t, 40 * 60, c.duration)
    cap_reason = sample_key(S.CLOCK_EVENT_ACTIVE, reason="sw_power_cap")
    assert (d[S.POWER_LIMIT.name][during, s] == 300).all()
    assert (d[K_POWER][during, s] <= 300).all()
    assert d[cap_reason][during, s].min() == 1.0
    assert d[K_CLOCK][during, s].mean() < 0.9 * 1980e6
    others = np.delete(np.arange(len(c.gpus)), s)
    assert d[cap_reason][:, others].max() == 0.0


def test_memory_bound_job_masks_idle_behind_gpu_util():
    c, t, d = run("idle-waste")
    rows = next(j for j in c.jobs if j.name == "embed-batch").rows
    assert 0.9 <= d[K_UTIL][:, rows].mean() <= 1.0
    assert 0.12 <= d[K_SM][:, rows].mean() <= 0.3
    assert d[S.DRAM_ACTIVE.name][:, rows].mean() > 0.6
    idle = next(j for j in c.jobs if j.name == "nb-carol").rows
    assert d[K_UTIL][:, idle].max() <= 0.01
    assert (d[S.GPU_ALLOCATION_INFO.name][:, idle] == 1).all()
    assert (d[S.MEMORY_USED.name][:, idle] > 0).all()
    late = next(j for j in c.jobs if j.name == "nb-alice")
    assert np.isnan(d[S.GPU_ALLOCATION_INFO.name][t < c.start + 20 * 60][:, late.rows]).all()


def test_wan_split_job_is_communication_bound():
    c, _t, d = run("wan-split")
    split = next(j for j in c.jobs if j.name == "pretrain-split").rows
    local = next(j for j in c.jobs if j.name == "pretrain-local").rows
    assert d[K_UTIL][:, split].mean() > 0.9
    assert d[K_SM][:, split].mean() < 0.45 and d[K_TENSOR][:, split].mean() < 0.12
    assert d[K_SM][:, local].mean() > 0.55
    assert set(c.gpus.site[split]) == {"dc1", "dc2"}


def test_rack_cooling_heats_the_rack_until_it_throttles():
    c, t, d = run("rack-cooling")
    hot = np.flatnonzero(c.gpus.rack == "dc1-r1")
    cool = np.flatnonzero(c.gpus.rack == "dc1-r2")
    before, late = window(c, t, 0, 55 * 60), window(c, t, 150 * 60, 200 * 60)
    assert d[K_TEMP][late][:, hot].mean() > d[K_TEMP][before][:, hot].mean() + 20
    assert abs(d[K_TEMP][late][:, cool].mean() - d[K_TEMP][before][:, cool].mean()) < 5
    thermal = sample_key(S.CLOCK_EVENT_ACTIVE, reason="sw_thermal")
    assert d[thermal][late][:, hot].max() == 1.0 and d[thermal][:, cool].max() == 0.0
    assert d[thermal][before].max() == 0.0


def test_pcie_downgrade_and_idle_link_power_saving():
    c, _t, d = run("pcie-downgrade")
    r = col(c, "dc1-r1-n02", "2")
    cur, mx = sample_key(S.PCIE_LINK_GENERATION, state="current"), sample_key(S.PCIE_LINK_GENERATION, state="max")
    width = sample_key(S.PCIE_LINK_WIDTH, state="current")
    assert (d[cur][:, r] == 3).all() and (d[mx][:, r] == 4).all() and (d[width][:, r] == 8).all()
    assert d[S.PCIE_REPLAYS.name][-1, r] > d[S.PCIE_REPLAYS.name][0, r]
    healthy_busy = col(c, "dc1-r1-n01", "0")
    assert (d[cur][:, healthy_busy] == 4).all()
    unallocated = col(c, "dc1-r1-n02", "7")
    assert (d[cur][:, unallocated] == 1).all()  # idle GPUs drop the link generation: not a fault
    assert d[S.PCIE_REPLAYS.name][:, [healthy_busy, unallocated]].max() == 0


def test_nvlink_errors_grow_and_links_go_down():
    c, t, d = run("nvlink-errors")
    r = c.jobs[0].rows[3]
    crc = sample_key(S.NVLINK_ERRORS, type="crc_flit")
    down = sample_key(S.NVLINK_LINKS, state="down")
    up = sample_key(S.NVLINK_LINKS, state="up")
    after = window(c, t, 50 * 60, c.duration)
    assert d[crc][window(c, t, 0, 45 * 60), r].max() == 0
    assert d[crc][-1, r] > 1000
    assert (d[down][after, r] == 2).all() and (d[up][after, r] == 16).all()
    others = np.delete(np.arange(len(c.gpus)), r)
    assert d[crc][:, others].max() == 0 and (d[up][:, others] == 18).all()


def test_nvlink_signals_absent_on_pcie_only_gpus():
    c, _t, d = run("mixed-fleet")
    l40s = np.array(["L40S" in m for m in c.gpus.model])
    assert np.isnan(d[sample_key(S.NVLINK_BYTES, direction="tx")][:, l40s]).all()
    assert np.isnan(d[K_MEMTEMP][:, l40s]).all()
    assert not np.isnan(d[sample_key(S.NVLINK_BYTES, direction="tx")][:, ~l40s]).any()


def test_xid79_gpu_disappears_while_node_peers_report_and_gang_hangs():
    c, t, d = run("xid-faults")
    job = next(j for j in c.jobs if j.name == "pretrain-7b")
    lost = job.rows[10]
    host = c.gpus.hostname[lost]
    node = [r for r in c.rows_for([host]) if r != lost]
    gone = t >= c.start + 3600 + 30
    xid79 = sample_key(S.XID_ERRORS, xid="79")
    for key in d:
        assert np.isnan(d[key][gone, lost]).all(), key
        assert not np.isnan(d[key][t < c.start + 3600, lost]).any() or key in (
            S.GPU_ALLOCATION_INFO.name,), key
    assert not np.isnan(d[K_POWER][:, node]).any()
    # the XID is counted before the GPU drops off
    at = np.flatnonzero((t >= c.start + 3600) & (t < c.start + 3630))
    assert (d[xid79][at, lost] == 1).all() and (d[xid79][t < c.start + 3600, lost] == 0).all()
    # the rest of the gang hangs in NCCL: util high, SM near zero
    peers = [r for r in job.rows if r != lost]
    hang = window(c, t, 3700, 7200)
    assert d[K_UTIL][hang][:, peers].mean() > 0.9 and d[K_SM][hang][:, peers].mean() < 0.1


def test_ecc_xids_update_error_counters_and_remap_state():
    c, t, d = run("xid-faults")
    serve = next(j for j in c.jobs if j.name == "chat-serve").rows
    r94, r63, r64 = serve[2], serve[5], serve[7]
    end = -1
    unc = sample_key(S.ECC_ERRORS, type="uncorrectable", scope="volatile")
    assert d[unc][end, r94] == 1 and d[S.ROW_REMAP_PENDING.name][end, r94] == 1
    assert d[sample_key(S.REMAPPED_ROWS, type="uncorrectable")][end, r94] == 1
    assert d[K_UTIL][window(c, t, 45 * 60, 60 * 60), r94].max() == 0  # the process died
    assert d[sample_key(S.REMAPPED_ROWS, type="correctable")][end, r63] == 1
    assert d[sample_key(S.ECC_ERRORS, type="correctable", scope="volatile")][end, r63] > 10
    assert d[S.ROW_REMAP_FAILURE.name][end, r64] == 1
    healthy = next(j for j in c.jobs if j.name == "pretrain-7b").rows[0]
    assert d[unc][:, healthy].max() == 0 and d[S.ROW_REMAP_PENDING.name][:, healthy].max() == 0


def test_counters_are_monotonic_everywhere():
    for name in list_scenarios():
        _c, _t, d = run(name)
        for m, _, key in SAMPLE_SIGNALS:
            if m.type != "counter":
                continue
            v = d[key]
            diffs = np.diff(v, axis=0)
            ok = np.isnan(diffs) | (diffs >= 0)
            assert ok.all(), f"{name}: {key} decreases"


def test_energy_is_the_integral_of_power():
    c, t, d = run("mixed-fleet")
    e, p = d[S.ENERGY.name], d[K_POWER]
    ok = ~np.isnan(e).any(axis=0)
    integral = np.trapezoid(p[:, ok], t, axis=0)
    delta = e[-1, ok] - e[0, ok]
    np.testing.assert_allclose(delta, integral, rtol=0.03)
    # bytes counters follow their traffic: busy training GPUs move far more NVLink data than idle ones
    nv = sample_key(S.NVLINK_BYTES, direction="tx")
    train = next(j for j in c.jobs if j.name == "finetune-13b").rows
    assert (d[nv][-1, train] - d[nv][0, train]).min() > 1e12


def test_counters_keep_growing_when_wrapped_past_the_end():
    c = Cluster(load_scenario("nvlink-errors"))
    t = c.start + np.array([0.0, c.duration - 15, c.duration + 15, 2 * c.duration + 60])
    d = c.sample(t, wrap=True)
    for m, _, key in SAMPLE_SIGNALS:
        if m.type == "counter":
            assert (np.diff(d[key], axis=0) >= 0).all(), key
    crc = sample_key(S.NVLINK_ERRORS, type="crc_flit")
    r = c.jobs[0].rows[3]
    assert d[crc][3, r] > d[crc][1, r]
    # gauges repeat the scenario from its start
    np.testing.assert_array_equal(c.sample(t[2:3], wrap=True)[K_POWER], c.sample(c.start + 15.0)[K_POWER])


def test_mig_instances_share_device_signals_and_lack_gpu_util():
    c, _t, d = run("mig-training")
    mig = c.gpus.mig_profile != ""
    assert {"3g.40gb", "1g.10gb"} <= set(c.gpus.mig_profile)
    assert np.isnan(d[K_UTIL][:, mig]).all() and not np.isnan(d[K_SM][:, mig]).any()
    for key in (K_POWER, K_TEMP, K_CLOCK, S.ENERGY.name):
        for _, grp in itertools.groupby(np.flatnonzero(mig), key=lambda r: c.layout.row_phys[r]):
            rows = list(grp)
            for r in rows[1:]:
                np.testing.assert_array_equal(d[key][:, r], d[key][:, rows[0]], err_msg=key)
    train = next(j for j in c.jobs if j.name == "mig-finetune").rows
    assert d[K_SM][:, train].mean() > 0.5
    tot = d[S.MEMORY_TOTAL.name][0]
    assert tot[train].max() < 41 * 2**30 and tot[~mig].min() > 79 * 2**30


def test_series_grouped_by_metric_with_exact_labels():
    c = Cluster(load_scenario("mig-training"))
    t = c.start + np.arange(0, 600, 60.0)
    order: list = []
    seen_mig = False
    n_topology = 0
    for m, labels, values in c.series(t):
        if not order or order[-1] is not m:
            assert m not in order, f"{m.name} is not contiguous"
            order.append(m)
        assert len(values) == len(t)
        extra = tuple(k for k in labels if k not in m.all_labels)
        assert tuple(k for k in labels if k in m.all_labels) == m.all_labels
        assert extra in ((), S.MIG_LABELS), (m.name, labels)
        if extra:
            seen_mig = True
            assert m in INSTANCE_METRICS
        if m is S.GPU_TOPOLOGY_INFO:
            n_topology += 1
            assert labels["link"] == "nvlink" and labels["peer_gpu"] != labels["gpu"]
        if m is S.GPU_ALLOCATION_INFO:
            assert set(np.unique(values[~np.isnan(values)])) <= {1.0}
    assert seen_mig
    assert n_topology == 2 * 8 * 7
    assert order == [m for m in S.METRICS if m in order]
    assert S.NODE_INFO in order and S.GPU_INFO in order
    assert not set(order) & set(S.SELF_METRICS)


def test_series_for_one_host_and_pcie_topology():
    c = Cluster(load_scenario("mixed-fleet"))
    t = c.start + np.array([0.0, 60.0])
    out = list(c.series(t, hostnames=["dc1-r2-n01"]))
    assert {lbl[S.HOSTNAME] for _, lbl, _ in out} == {"dc1-r2-n01"}
    links = {(lbl["gpu"], lbl["peer_gpu"]): lbl["link"] for m, lbl, _ in out if m is S.GPU_TOPOLOGY_INFO}
    assert links[("0", "1")] == "pcie_switch" and links[("0", "2")] == "numa" and links[("0", "5")] == "system"
    assert len(links) == 56 and set(links.values()) <= set(S.TOPOLOGY_LINKS)
    pods = {lbl["pod"] for m, lbl, _ in out if m is S.GPU_ALLOCATION_INFO}
    assert len(pods) == 8 and all(p.startswith("chat-serve-") for p in pods)


def test_training_pods_are_named_like_the_training_operator():
    c = Cluster(load_scenario("mixed-fleet"))
    pods = {lbl["pod"] for lbl in c.allocation_labels if lbl and lbl["workload"] == "pretrain-7b"}
    assert pods == {"pretrain-7b-worker-0", "pretrain-7b-worker-1"}
    lbl = next(lb for lb in c.allocation_labels if lb and lb["workload"] == "pretrain-7b")
    assert lbl["namespace"] == "llm" and lbl["container"] == "pytorch"


@pytest.mark.parametrize("override", [{"nodes_per_rack": 5}, {"racks": 3}])
def test_overrides_scale_the_fleet(override):
    base = Cluster(load_scenario("healthy-fleet"))
    big = Cluster(load_scenario("healthy-fleet", **override, duration="30m"))
    assert len(big.gpus) > len(base.gpus) and big.duration == 1800
    assert big.ground_truth() == []


def test_mig_instances_share_their_gpus_link_counters():
    """NVLink/PCIe links belong to the physical GPU: every instance row carries the same counter."""
    c = Cluster(load_scenario("mig-training"))
    table = c.sample(c.start + np.arange(0, 1200, 60.0))
    g = c.gpus
    mig = g.mig_profile != ""
    assert mig.any()
    for metric in (S.NVLINK_BYTES, S.PCIE_BYTES):
        values = table[sample_key(metric, direction="tx")]
        for uuid in set(g.uuid[mig]):
            cols = np.nonzero(g.uuid == uuid)[0]
            assert len(cols) > 1
            assert np.array_equal(values[:, cols[0]], values[:, cols[-1]], equal_nan=True)
