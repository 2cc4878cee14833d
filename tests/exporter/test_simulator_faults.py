"""Simulator fault signatures: measured slowdowns, link faults that slow a gang, soft degradations,
topology mistakes and noisy neighbours, read back from the signals the detectors see."""

from __future__ import annotations

import numpy as np
import pytest
import yaml

from exporter import schema as S
from exporter.simulator import Cluster, load_scenario, sample_key
from exporter.simulator.scenario import XID_CODES, parse_scenario

STEP = 30.0
_CACHE: dict[str, tuple[Cluster, np.ndarray, dict[str, np.ndarray]]] = {}

K_UTIL, K_SM, K_TENSOR = S.GPU_UTILIZATION.name, S.SM_ACTIVE.name, S.TENSOR_ACTIVE.name
K_CLOCK, K_POWER, K_DRAM = S.SM_CLOCK.name, S.POWER.name, S.DRAM_ACTIVE.name
K_TEMP = sample_key(S.TEMPERATURE, sensor="gpu")
K_MEMTEMP = sample_key(S.TEMPERATURE, sensor="memory")
K_NVL = sample_key(S.NVLINK_BYTES, direction="tx")
THROTTLES = [sample_key(S.CLOCK_EVENT_ACTIVE, reason=r) for r in S.CLOCK_EVENT_REASONS.values() if r != "idle"]


def run(name: str, step: float = STEP) -> tuple[Cluster, np.ndarray, dict[str, np.ndarray]]:
    if name not in _CACHE:
        c = Cluster(load_scenario(name))
        t = c.start + np.arange(0.0, c.duration, step)
        _CACHE[name] = (c, t, c.sample(t))
    return _CACHE[name]


def inline(body: str, name: str = "inline") -> Cluster:
    return Cluster(parse_scenario(yaml.safe_load(f"name: {name}\n" + body), f"<{name}>"))


def window(c: Cluster, t: np.ndarray, a: float, b: float) -> np.ndarray:
    return (t >= c.start + a) & (t < c.start + b)


def job_rows(c: Cluster, name: str) -> np.ndarray:
    return next(j for j in c.jobs if j.name == name).rows


def nvlink_rate(c: Cluster, rows: np.ndarray, a: float, b: float) -> float:
    """Mean NVLink tx byte rate of ``rows`` over [a, b) relative seconds (noise-free counters)."""
    d = c.sample(c.start + np.array([a, b]), rows)[K_NVL]
    return float(((d[1] - d[0]) / (b - a)).mean())


# Stragglers: the slowdown the scenario says, measured from the peers' signals --------------------
@pytest.mark.parametrize(("job", "slowdown", "reason"), [
    ("train-10", 0.1, "sw_thermal"), ("train-20", 0.2, "sw_power_cap"), ("train-50", 0.5, "sw_thermal")])
def test_straggler_slowdowns_are_what_the_scenario_says(job, slowdown, reason):
    c, t, d = run("straggler-slowdowns")
    rows = job_rows(c, job)
    (truth,) = [r for r in c.ground_truth() if r["kind"] == "straggler" and r["job"] == job]
    s = next(r for r in rows if c.gpus.hostname[r] == truth["hostname"] and c.gpus.gpu[r] == truth["gpu"])
    peers = rows[rows != s]
    before, during = window(c, t, 10 * 60, 55 * 60), window(c, t, 65 * 60, 175 * 60)
    # peers wait at the barrier: tensor activity (work per step / step time) falls by 1 / (1 + slowdown)
    ratio = d[K_TENSOR][before][:, peers].mean() / d[K_TENSOR][during][:, peers].mean()
    assert ratio == pytest.approx(1 + slowdown, abs=0.02)
    # so does every member's NVLink byte rate (bytes per step / step time), exactly (noise-free counters)
    assert nvlink_rate(c, rows, 10 * 60, 55 * 60) / nvlink_rate(c, rows, 65 * 60, 175 * 60) == pytest.approx(
        1 + slowdown, rel=0.005)
    assert d[K_UTIL][during][:, peers].mean() > 0.9  # ... while GPU util stays high
    # the straggler: clock lowered through the named throttle reason, still computing
    ev = sample_key(S.CLOCK_EVENT_ACTIVE, reason=reason)
    assert d[ev][during, s].min() == 1.0 and d[ev][before, s].max() == 0.0
    assert d[ev][:, peers].max() == 0.0
    clock = d[K_CLOCK][during, s].mean() / d[K_CLOCK][before, s].mean()
    assert clock == pytest.approx(1 / (1 + slowdown * 1.14), abs=0.03)  # step = 1/f + comm, comm 0.14 (2 nodes)
    assert d[K_SM][during, s].mean() > d[K_SM][during][:, peers].mean() + 0.05
    assert truth["start"] == c.start + 3600 and truth["end"] == c.start + 3 * 3600
    assert f"{slowdown:.0%}" in truth["cause"]


def test_slow_gpu_without_visible_cause_is_an_unknown_straggler():
    c = inline("""duration: 2h
topology: {nodes_per_rack: 2}
workloads: [{name: tr, kind: training, nodes: 2}]
faults: [{kind: slow_gpu, target: {job: tr, rank: 4}, start: 30m, slowdown: 0.3}]
""")
    t = c.start + np.arange(0, c.duration, 60.0)
    d = c.sample(t)
    s, peers = c.jobs[0].rows[4], np.delete(c.jobs[0].rows, 4)
    during = window(c, t, 40 * 60, 7200)
    assert d[K_CLOCK][during, s].mean() > 0.97 * 1980e6
    assert max(d[k][:, s].max() for k in THROTTLES) == 0.0
    ratio = d[K_TENSOR][window(c, t, 0, 25 * 60)][:, peers].mean() / d[K_TENSOR][during][:, peers].mean()
    assert ratio == pytest.approx(1.3, abs=0.03)
    (truth,) = c.ground_truth()
    assert (truth["kind"], truth["attribution"], truth["gpu"]) == ("straggler", "unknown", str(c.gpus.gpu[s]))


# Link faults in a training gang ----------------------------------------------------------------
GANG = """duration: 2h
topology: {nodes_per_rack: 2, model: H100}
workloads: [{name: tr, kind: training, nodes: 2}]
faults: [%s]
"""


def test_pcie_downgrade_in_a_gang_is_a_gpu_fault_and_slows_the_gang():
    c = inline(GANG % "{kind: pcie_downgrade, target: {job: tr, rank: 6}, start: 1h, gen: 3, width: 8}")
    rows = c.jobs[0].rows
    s, peers = rows[6], np.delete(rows, 6)
    slow = nvlink_rate(c, rows, 600, 3000) / nvlink_rate(c, rows, 4000, 7000) - 1
    assert 0.15 < slow < 0.22  # gen3 x8 is 1/8 of gen5 x16: 0.03 x 7 extra per step over 1.14
    t = c.start + np.arange(4000, 7000, 60.0)
    d = c.sample(t)
    assert d[K_UTIL][:, s].mean() < d[K_UTIL][:, peers].mean() - 0.1  # it idles on its copies
    assert d[K_UTIL][:, peers].mean() > 0.9 and max(d[k].max() for k in THROTTLES) == 0.0
    gt = {(r["kind"], r["attribution"]): r for r in c.ground_truth()}
    assert set(gt) == {("gpu_fault", "pcie_downgrade"), ("straggler", "pcie")}
    assert gt[("straggler", "pcie")]["gpu"] == str(c.gpus.gpu[s])
    assert gt[("straggler", "pcie")]["start"] == c.start + 3600


@pytest.mark.parametrize(("down", "straggler"), [(0, False), (2, False), (12, True)])
def test_nvlink_links_down_slow_the_gang_in_proportion(down, straggler):
    c = inline(GANG % f"{{kind: nvlink_errors, target: {{job: tr, rank: 3}}, start: 1h, links_down: {down}}}")
    rows = c.jobs[0].rows
    slow = nvlink_rate(c, rows[rows != rows[3]], 600, 3000) / nvlink_rate(c, rows[rows != rows[3]], 4000, 7000) - 1
    expected = 0.08 * (18 / (18 - down) - 1) / 1.14
    assert slow == pytest.approx(expected, abs=0.002)
    kinds = {(r["kind"], r["attribution"]) for r in c.ground_truth()}
    assert ("gpu_fault", "nvlink") in kinds
    assert (("straggler", "nvlink") in kinds) is straggler


# Soft degradations: invisible in hard signals, the named relation shifts ------------------------
def _peers_same_job(c: Cluster, r: int) -> np.ndarray:
    rows = c.jobs[c.layout.row_job[r]].rows
    return rows[rows != r]


def _hard_signals_quiet(c: Cluster, d: dict[str, np.ndarray], r: int) -> None:
    for k in THROTTLES:
        assert d[k][:, r].max() == 0.0, k
    for code in XID_CODES:
        assert d[sample_key(S.XID_ERRORS, xid=str(code))][:, r].max() == 0.0
    for key in (sample_key(S.ECC_ERRORS, type="uncorrectable", scope="volatile"),
                sample_key(S.ECC_ERRORS, type="correctable", scope="volatile"), S.ROW_REMAP_PENDING.name,
                S.PCIE_REPLAYS.name, sample_key(S.NVLINK_ERRORS, type="crc_flit"),
                sample_key(S.NVLINK_LINKS, state="down")):
        assert np.nanmax(d[key][:, r]) == 0.0, key
    cur, mx = sample_key(S.PCIE_LINK_GENERATION, state="current"), sample_key(S.PCIE_LINK_GENERATION, state="max")
    busy = d[K_UTIL][:, r] > 0.5
    assert (d[cur][busy, r] == d[mx][busy, r]).all()
    assert d[K_CLOCK][busy, r].mean() > 0.97 * 1980e6
    assert d[K_TEMP][:, r].max() < 85  # hot for its power, not throttling yet


def _faulted(c: Cluster, kind: str) -> list[tuple[int, float]]:
    return [(int(f.rows[0]), f.start) for f in c.faults if f.kind == kind]


def test_thermal_degradation_runs_hot_for_its_power():
    c, t, d = run("degraded-gpus")
    for r, start in _faulted(c, "thermal_degradation"):
        _hard_signals_quiet(c, d, r)
        peers = _peers_same_job(c, r)
        before, after = window(c, t, 0, start), window(c, t, start + 300, c.duration)
        assert abs(d[K_POWER][after, r].mean() / d[K_POWER][after][:, peers].mean() - 1) < 0.1  # same power
        excess = d[K_TEMP][after, r].mean() - d[K_TEMP][after][:, peers].mean()
        assert 7 < excess < 20
        assert abs(d[K_TEMP][before, r].mean() - d[K_TEMP][before][:, peers].mean()) < 6
        # per watt: the die-to-inlet slope is above every peer's and well above the typical one
        slope = lambda rows, w: (d[K_TEMP][w][:, rows].mean(0) - 21.5) / d[K_POWER][w][:, rows].mean(0)  # noqa: E731
        assert slope([r], after)[0] > max(slope(peers, after).max(), 1.2 * np.median(slope(peers, after)))


def test_power_inefficiency_draws_more_power_for_the_same_work():
    c, t, d = run("degraded-gpus")
    ((r, start),) = _faulted(c, "power_inefficiency")
    _hard_signals_quiet(c, d, r)
    peers = _peers_same_job(c, r)
    after, before = window(c, t, start + 300, c.duration), window(c, t, 0, start)
    per_sm = lambda rows, w: d[K_POWER][w][:, rows].mean(0) / d[K_SM][w][:, rows].mean(0)  # noqa: E731
    assert abs(d[K_SM][after, r].mean() / d[K_SM][after][:, peers].mean() - 1) < 0.05  # same work
    assert per_sm([r], after)[0] > 1.12 * per_sm(peers, after).max()
    assert per_sm([r], before)[0] < 1.08 * np.median(per_sm(peers, before))
    # a whole memory-bound job has far more power per SM activity on every member: a workload, no truth
    mb = job_rows(c, "embed-batch")
    assert per_sm(mb, after).min() > 1.5 * per_sm([r], after)[0]
    assert not any(g["kind"] == "degraded_gpu" and g["job"] == "embed-batch" for g in c.ground_truth())


def test_hbm_hot_memory_runs_hot_for_its_die():
    c, t, d = run("degraded-gpus")
    ((r, start),) = _faulted(c, "hbm_hot")
    _hard_signals_quiet(c, d, r)
    peers = _peers_same_job(c, r)
    after = window(c, t, start + 300, c.duration)
    resid = d[K_MEMTEMP] - (26 + 0.6 * d[K_TEMP] + 6 * d[K_DRAM])
    assert resid[after, r].mean() == pytest.approx(10, abs=1)
    assert np.abs(resid[after][:, peers].mean(0)).max() < 1
    assert abs(d[K_TEMP][after, r].mean() - d[K_TEMP][after][:, peers].mean()) < 6  # the die is normal
    mb = job_rows(c, "embed-batch")  # memory-bound: hotter HBM through DRAM traffic, explained by it
    assert d[K_MEMTEMP][after][:, mb].mean() - 0.6 * d[K_TEMP][after][:, mb].mean() > (
        d[K_MEMTEMP][after][:, peers].mean() - 0.6 * d[K_TEMP][after][:, peers].mean() + 2)
    assert np.abs(resid[after][:, mb].mean(0)).max() < 1


# Topology mistakes, noisy neighbours, multi-fault -----------------------------------------------
def test_topology_mistakes_placement_and_cost():
    c, _t, d = run("topology-mistakes")
    numa = job_rows(c, "numa-split")
    assert set(c.gpus.hostname[numa]) == {"dc1-r1-n01"} and list(c.gpus.gpu[numa]) == ["2", "3", "4", "5"]
    assert set(c.gpus.numa_node[numa]) == {"0", "1"}
    pcie, ok = job_rows(c, "pcie-gang"), job_rows(c, "pretrain-ok")
    assert {"L40S" in m for m in c.gpus.model[pcie]} == {True} and {"H100" in m for m in c.gpus.model[ok]} == {True}
    # all-reduce over PCIe: more of each step in communication, less SM/tensor work, util still high
    assert d[K_TENSOR][:, pcie].mean() < 0.8 * d[K_TENSOR][:, ok].mean()
    assert d[K_UTIL][:, pcie].mean() > 0.9
    mig = job_rows(c, "mig-train")
    assert set(c.gpus.mig_profile[mig]) == {"3g.40gb"} and len(mig) == 8


def test_noisy_neighbours_swing_but_training_stays_steady():
    c, _t, d = run("noisy-neighbours", step=60.0)
    serve = np.concatenate([job_rows(c, n) for n in ("serve-a", "serve-b", "serve-c")])
    train = np.concatenate([job_rows(c, n) for n in ("train-a", "train-b", "pretrain")])
    for n in ("serve-a", "train-a"):
        assert set(c.gpus.hostname[job_rows(c, n)]) == {"dc1-r1-n01"}
    u = d[K_UTIL][:, serve]
    assert u.max() - u.min() > 0.5  # bursty, diurnal
    bursts = np.diff(d[K_UTIL][:, serve], axis=0)
    assert (np.abs(bursts) > 0.3).mean() > 0.05
    assert d[K_UTIL][:, train].min() > 0.9 and d[K_SM][:, train].mean() > 0.55
    assert max(d[k].max() for k in THROTTLES) == 0.0
    assert c.ground_truth() == []


def test_multi_fault_two_faults_on_one_node():
    c, t, d = run("multi-fault")
    hot = c.rows_for(["dc1-r2-n01", "dc1-r2-n02", "dc1-r2-n03"])
    thermal = sample_key(S.CLOCK_EVENT_ACTIVE, reason="sw_thermal")
    late = window(c, t, 2 * 3600, 2 * 3600 + 40 * 60)
    assert d[thermal][late][:, hot].mean() > 0.5  # the rack throttles together
    strag = next(int(f.rows[0]) for f in c.faults if f.kind == "thermal_straggler")
    degr = next(int(f.rows[0]) for f in c.faults if f.kind == "thermal_degradation")
    assert c.gpus.hostname[strag] == c.gpus.hostname[degr] == "dc1-r1-n01"
    assert d[thermal][:, degr].max() == 0.0 and d[thermal][window(c, t, 40 * 60, 2 * 3600), strag].min() == 1.0


# Quiet stragglers and the healthy variation they must be told from (issue 12) --------------

QUIET = """
duration: 1h
topology: {sites: [dc1], racks_per_site: 1, nodes_per_rack: 2, model: H100}
workloads:
  - {name: g, kind: training, namespace: llm, nodes: 2}
faults:
"""


def _step_slowdown(c: Cluster, fault_kind: str) -> tuple[np.ndarray, np.ndarray]:
    f = next(f for f in c.faults if f.kind == fault_kind)
    return c._fault_slowdown(f, c.jobs[0])


def test_intermittent_straggler_is_slow_in_spells_and_true_over_the_span_it_recurs():
    c = inline(QUIET + "  - {kind: intermittent_straggler, target: {job: g, rank: 3}, start: 10m, end: 50m,"
                       " slowdown: 0.15, period: 600, duty: 0.3}\n")
    t, sd = _step_slowdown(c, "intermittent_straggler")
    spell = np.mod(t - 600.0, 600.0) < 180.0
    assert sd[spell] == pytest.approx(0.15, abs=1e-6) and np.abs(sd[~spell]).max() < 1e-9
    (truth,) = [g for g in c.ground_truth() if g["kind"] == "straggler"]
    assert truth["attribution"] == "unknown" and truth["start"] - c.start == 600.0
    assert truth["needs"] == ["sm_active"]  # it stalls: only SM activity can show it
    assert truth["end"] - c.start == pytest.approx(2400.0 + 180.0)  # the last spell's end
    # Same clock in and out of spells (no throttling); SM activity (kernel time) higher on the slow member in
    # spells, tensor activity not (it stalls: the same work in more cycles).
    tt = c.start + np.arange(600.0, 3000.0, 30.0)
    s = c.sample(tt)
    assert np.nanmax(s[sample_key(S.CLOCK_EVENT_ACTIVE, reason="sw_thermal")]) == 0.0
    on = np.mod(tt - c.start - 600.0, 600.0) < 150.0
    lead = s[K_SM][:, 3] / np.median(s[K_SM], axis=1)
    assert lead[on].mean() > 1.1 and abs(lead[~on].mean() - 1.0) < 0.04
    lead_t = s[K_TENSOR][:, 3] / np.median(s[K_TENSOR], axis=1)
    assert abs(lead_t[on].mean() - 1.0) < 0.03


def test_a_straggler_is_true_by_what_it_costs_its_gang_on_top_of_the_chip_spread():
    """The truth's slowdown is the fault's on top of the gang's healthy variation: a slow member's cost
    depends on how its chip compares with the gang's slowest one, not only on the nominal slowdown."""
    spread = "  - {kind: chip_spread, target: {job: g}, spread: 0.04}\n"
    fault = ("  - {kind: intermittent_straggler, target: {job: g, rank: 3}, start: 10m, end: 50m,"
             " slowdown: 0.10, period: 600, duty: 0.3}\n")
    alone, spread_too = inline(QUIET + fault), inline(QUIET + spread + fault)
    assert _truth_slowdown(alone) == pytest.approx(0.10, abs=1e-6)
    _, sd = _step_slowdown(spread_too, "intermittent_straggler")
    assert _truth_slowdown(spread_too) == pytest.approx(sd.max()) and abs(sd.max() - 0.10) > 0.005
    assert f"by up to {sd.max():.0%}" in next(g["cause"] for g in spread_too.ground_truth()
                                               if g["kind"] == "straggler")


def _truth_slowdown(c: Cluster) -> float:
    (truth,) = [g for g in c.ground_truth() if g["kind"] == "straggler"]
    return truth["slowdown"]


def test_chip_spread_and_startup_are_healthy_variation_without_truth():
    c = inline(QUIET + "  - {kind: chip_spread, target: {job: g}, spread: 0.04}\n"
                       "  - {kind: startup, target: {job: g}, start: 0, seconds: 300}\n")
    assert [g for g in c.ground_truth() if g["kind"] == "straggler"] == []
    t = c.start + np.arange(0.0, 3600.0, 60.0)
    s = c.sample(t)
    late = t >= c.start + 600
    clk = s[K_CLOCK][late].mean(axis=0)
    assert 0.005 < 1.0 - clk.min() / clk.max() <= 0.045  # spread, under the 5% straggler truth
    _, sd = _step_slowdown(c, "chip_spread")
    assert 0.0 < sd.max() < 0.05
    first = s[K_UTIL][:5]  # start-up: loading members idle, loaded ones wait at the first barrier
    assert (first < 0.05).any() and (first > 0.9).any()
    assert s[K_UTIL][late].min() > 0.9


@pytest.mark.parametrize("body, key", [
    ("{kind: chip_spread, target: {job: g}, spread: 0.08}", "spread"),
    ("{kind: intermittent_straggler, target: {job: g, rank: 0}, duty: 1.0}", "duty"),
    ("{kind: intermittent_straggler, target: {job: g, rank: 0}, period: 30}", "period"),
    ("{kind: startup, target: {hostname: x, gpu: 0}}", "target"),
])
def test_quiet_straggler_parameters_are_validated(body: str, key: str):
    from exporter.simulator.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=key):
        inline(QUIET + f"  - {body}\n")


# quiet partial failures (issue 12) ------------------------------------------------------------
K_SBE = sample_key(S.ECC_ERRORS, type="correctable", scope="volatile")
K_DBE = sample_key(S.ECC_ERRORS, type="uncorrectable", scope="volatile")
K_CRC = sample_key(S.NVLINK_ERRORS, type="crc_flit")


def test_ecc_storm_and_rising_nvlink_errors_grow_from_their_starting_rate() -> None:
    c, _t, d = run("error-storms", 60.0)
    truth = {x["attribution"]: x for x in c.ground_truth()}
    assert set(truth) == {"ecc_storm", "nvlink"} and {x["kind"] for x in truth.values()} == {"gpu_fault"}
    sbe_row = np.flatnonzero((c.gpus.hostname == truth["ecc_storm"]["hostname"]) & (c.gpus.gpu == "5"))[0]
    sbe = np.diff(d[K_SBE][:, sbe_row]) / 60.0
    onset = int((truth["ecc_storm"]["start"] - c.start) // 60)
    assert np.all(d[K_SBE][:onset, sbe_row] == 0) and np.all(d[K_DBE][:, sbe_row] == 0)
    assert 0.01 <= sbe[onset:onset + 5].mean() <= 0.04  # leaves normal at ~0.02/s
    assert sbe[onset + 60:].mean() == pytest.approx(3.0, rel=0.05)  # a few per second after the hour
    assert np.all(np.diff(d[K_SBE][:, sbe_row]) >= 0)
    others = np.delete(d[K_SBE], sbe_row, axis=1)
    assert np.all(others == 0)  # healthy GPUs: no SBE at all
    nv_row = np.flatnonzero((c.gpus.hostname == truth["nvlink"]["hostname"]) & (c.gpus.gpu == "3"))[0]
    crc = np.diff(d[K_CRC][:, nv_row]) / 60.0
    n0 = int((truth["nvlink"]["start"] - c.start) // 60)
    assert crc[n0 + 10:n0 + 15].mean() > 2 * crc[n0:n0 + 5].mean() > 0  # keeps rising
    assert d[sample_key(S.NVLINK_LINKS, state="down")][:, nv_row].max() == 0


def test_power_deficit_draws_less_at_the_same_activity_and_clock_and_spread_is_no_fault() -> None:
    c, t, d = run("power-deficit", 60.0)
    truth = c.ground_truth()
    assert {(x["kind"], x["attribution"]) for x in truth} == {("degraded_gpu", "power_deficit")}
    r = np.flatnonzero((c.gpus.hostname == truth[0]["hostname"]) & (c.gpus.gpu == truth[0]["gpu"]))[0]
    peers = _peers_same_job(c, r)
    late = window(c, t, 3600, 9000)
    ratio = d[K_POWER][late, r].mean() / np.median(d[K_POWER][late][:, peers].mean(axis=0))
    assert 0.6 < ratio < 0.8
    for k in (K_UTIL, K_SM, K_CLOCK):
        assert d[k][late, r].mean() == pytest.approx(np.median(d[k][late][:, peers].mean(axis=0)), rel=0.05), k
    _hard_signals_quiet(c, d, r)
    # healthy spread: peers' power differs by up to ~+/-10%, no throttling
    early = window(c, t, 600, 2400)
    p = d[K_POWER][early][:, peers].mean(axis=0)
    assert 0.08 < (p.max() - p.min()) / np.median(p) < 0.25


@pytest.mark.parametrize(("body", "key"), [
    ("{kind: ecc_storm, target: {job: j, rank: 0}, start_per_second: 2, peak_per_second: 1}", "peak_per_second"),
    ("{kind: power_deficit, target: {job: j, rank: 0}, deficit_fraction: 0.95}", "deficit_fraction"),
    ("{kind: power_spread, target: {hostname: dc1-r1-n01, gpu: 0}}", "needs {job} or {hostname}"),
])
def test_partial_failure_parameters_are_validated(body: str, key: str) -> None:
    from exporter.simulator.scenario import ScenarioError

    with pytest.raises(ScenarioError, match=key.replace("{", r"\{").replace("}", r"\}")):
        inline("duration: 1h\nworkloads: [{name: j, kind: training, nodes: 1}]\nfaults: [" + body + "]")
