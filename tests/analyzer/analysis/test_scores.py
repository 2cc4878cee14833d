"""Effective-utilization scores and bottleneck classes: formulas on hand-built fleets, then scenarios."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from analyzer.analysis import bottleneck as B
from analyzer.analysis.rows import FALLBACK_SM_PER_UTIL
from analyzer.analysis.scores import (
    AGG_COLUMNS,
    LEVELS,
    aggregate,
    compute_scores,
    fleet_summary,
    row_scores,
)
from analyzer.data.frame import Fleet
from analyzer.data.simulated import fleet_from_cluster
from exporter.simulator import Cluster, load_scenario
from tests import fleets

START, STEP = 1_700_000_000.0, 15.0
MAX_CLK = 1.98e9


def make_fleet(devices: list[dict], steps: int = 4, step: float = STEP) -> Fleet:
    return fleets.make_fleet(devices, steps, step, START)


def busy_gpu(**kw) -> dict:
    d = {"gpu_util": 0.95, "sm_active": 0.6, "tensor_active": 0.2, "dram_active": 0.3,
         "sm_clock": MAX_CLK, "sm_clock_max": MAX_CLK, "job": "train", "namespace": "ml", "pod": "p0"}
    d.update(kw)
    return d


def test_the_clock_note_names_what_is_not_collected():
    """dcgm-exporter's default counters carry the SM clock but not its max: the note says the max is missing."""
    def note(**kw) -> list[str]:
        gpu = busy_gpu(**kw)
        for k in [k for k, v in gpu.items() if v is None]:
            del gpu[k]
        return [n for n in compute_scores(make_fleet([gpu])).notes if "throttling" in n]

    assert note() == []
    assert note(sm_clock_max=None) == ["the max SM clock not collected: throttling cannot be counted as lost capacity"]
    assert note(sm_clock=None, sm_clock_max=None) == [
        "the SM clock and the max SM clock not collected: throttling cannot be counted as lost capacity"]


# Row formulas ----------------------------------------------------------------------------------


def test_effective_util_is_sm_activity_and_masking_gap_is_util_minus_sm():
    r = row_scores(make_fleet([busy_gpu()]))
    assert r.index.equals(make_fleet([busy_gpu()]).frame.index)
    assert r["effective_util"].tolist() == pytest.approx([0.6] * 4)
    assert r["effective_tensor"].tolist() == pytest.approx([0.2] * 4)
    assert r["masking_gap"].tolist() == pytest.approx([0.35] * 4)
    assert (r["confidence"] == "high").all()


def test_throttling_reduces_effective_util_in_proportion_to_clock():
    clocks = [MAX_CLK, 0.75 * MAX_CLK, 0.5 * MAX_CLK, 0.25 * MAX_CLK]
    fleet = make_fleet([busy_gpu(sm_active=0.8, tensor_active=0.4, sm_clock=clocks)])
    r = row_scores(fleet)
    assert r["clock_ratio"].tolist() == pytest.approx([1.0, 0.75, 0.5, 0.25])
    assert r["effective_util"].tolist() == pytest.approx([0.8, 0.6, 0.4, 0.2])
    assert r["effective_tensor"].tolist() == pytest.approx([0.4, 0.3, 0.2, 0.1])
    # The cycle-counted SM activity itself is unchanged: the gap vs util does not see throttling.
    assert r["masking_gap"].tolist() == pytest.approx([0.15] * 4)
    # Over one hour-equivalent: throttled GPU-hours are lost capacity.
    agg = aggregate(fleet, r, "gpu")
    assert agg["effective_gpu_hours"].item() == pytest.approx((0.8 + 0.6 + 0.4 + 0.2) * STEP / 3600)


def test_clock_ratio_is_clamped_and_unknown_clocks_do_not_invent_loss():
    fleet = make_fleet([busy_gpu(sm_clock=[2 * MAX_CLK, np.nan, MAX_CLK, MAX_CLK],
                                 sm_clock_max=[MAX_CLK, MAX_CLK, np.nan, 0.0])])
    r = row_scores(fleet)
    assert r["clock_ratio"].iloc[0] == 1.0
    assert r["clock_ratio"].iloc[1:].isna().all()
    assert r["effective_util"].tolist() == pytest.approx([0.6] * 4)


def test_missing_sm_activity_falls_back_with_low_confidence_and_unknown_is_never_zero():
    dev = busy_gpu(gpu_util=[0.95, 0.5, np.nan, np.nan], tensor_active=[0.2, 0.45, 0.1, np.nan])
    del dev["sm_active"]  # dcgm-exporter defaults: the column is absent
    fleet = make_fleet([dev])
    assert "sm_active" not in fleet.frame.columns
    r = row_scores(fleet)
    eff = r["effective_util"]
    assert eff.iloc[0] == pytest.approx(FALLBACK_SM_PER_UTIL * 0.95)
    assert eff.iloc[1] == pytest.approx(0.45)  # tensor activity is a lower bound on SM activity
    assert eff.iloc[2] == pytest.approx(0.1)  # only tensor known: the lower bound, still low confidence
    assert math.isnan(eff.iloc[3])  # nothing known: unknown, not 0
    assert r["confidence"].iloc[:3].tolist() == ["low"] * 3
    assert pd.isna(r["confidence"].iloc[3])
    assert r["masking_gap"].isna().all()  # idle masking cannot be measured without SM activity

    agg = aggregate(fleet, r, "fleet").iloc[0]
    h = STEP / 3600
    assert agg["unknown_gpu_hours"] == pytest.approx(h)
    assert agg["effective_util"] == pytest.approx(eff.iloc[:3].mean())  # unknown excluded, not averaged as 0
    assert agg["unused_gpu_hours"] == pytest.approx(3 * h - eff.iloc[:3].sum() * h)
    assert agg["low_confidence_share"] == 1.0
    s = fleet_summary(compute_scores(fleet))
    assert any("SM activity" in n for n in s["notes"])
    assert s["unknown_gpu_hours"] == pytest.approx(h)


def test_sm_missing_on_some_rows_only_lowers_their_confidence():
    fleet = make_fleet([busy_gpu(sm_active=[0.6, np.nan, 0.6, 0.6])])
    r = row_scores(fleet)
    assert r["confidence"].tolist() == ["high", "low", "high", "high"]
    assert r["effective_util"].iloc[1] == pytest.approx(FALLBACK_SM_PER_UTIL * 0.95)
    agg = aggregate(fleet, r, "gpu").iloc[0]
    assert agg["low_confidence_share"] == pytest.approx(0.25)
    assert agg["masking_gap"] == pytest.approx(0.35)  # the unknown row is excluded from the mean


def test_mig_instances_weigh_their_share_use_own_sm_and_parent_clocks():
    parent = {"uuid": "GPU-A", "hostname": "n0", "gpu": "0", "sm_clock": 0.5 * MAX_CLK, "sm_clock_max": MAX_CLK,
              "gpu_util": np.nan, "power": 300.0}
    devices = [
        {**parent, "gpu_instance": "1", "mig_profile": "3g.40gb", "sm_active": 0.8, "gr_active": 0.9, "job": "a"},
        {**parent, "gpu_instance": "2", "mig_profile": "1g.10gb", "sm_active": 0.2, "gr_active": 0.0, "job": "b"},
        busy_gpu(uuid="GPU-B", hostname="n0", gpu="1", job="c"),
    ]
    fleet = make_fleet(devices)
    r = row_scores(fleet)
    per_dev = r.groupby(fleet.frame["gpu_instance"].astype(str).to_numpy())["effective_util"].first()
    assert per_dev["1"] == pytest.approx(0.4) and per_dev["2"] == pytest.approx(0.1)  # own SM x parent clock
    assert r["busy"].iloc[:4].tolist() == pytest.approx([0.9] * 4)  # the instance's own engine activity
    assert r["masking_gap"].iloc[:8].isna().all()  # no per-instance GPU-Util to compare against

    h = STEP / 3600
    gpus = aggregate(fleet, r, "gpu").set_index("gpu_instance")
    assert gpus.loc["1", "gpu_hours"] == pytest.approx(4 * h * 3 / 7)
    assert gpus.loc["2", "gpu_hours"] == pytest.approx(4 * h * 1 / 7)
    node = aggregate(fleet, r, "node").iloc[0]
    assert node["gpu_hours"] == pytest.approx(4 * h * (3 / 7 + 1 / 7 + 1))
    # Share-weighted mean: the 3g slice weighs three times the 1g slice.
    expected = (3 / 7 * 0.4 + 1 / 7 * 0.1 + 1 * 0.6) / (3 / 7 + 1 / 7 + 1)
    assert node["effective_util"] == pytest.approx(expected)
    assert node["reported_util"] == pytest.approx(0.95)  # only the whole GPU reports GPU-Util
    jobs = aggregate(fleet, r, "job").set_index("job")
    assert jobs.loc["b", "idle_gpu_hours"] == pytest.approx(4 * h / 7)
    assert jobs.loc["a", "idle_gpu_hours"] == 0.0


def test_aggregate_columns_levels_and_allocation_split():
    idle = {"gpu_util": 0.0, "sm_active": 0.0, "sm_clock": 0.1 * MAX_CLK, "sm_clock_max": MAX_CLK}
    devices = [
        busy_gpu(job=["j1", "j1", None, None], namespace=["ml", "ml", None, None], pod=["p", "p", None, None]),
        busy_gpu(job="j2", sm_active=0.3),
        {**idle, "job": "j2", "namespace": "ml", "pod": "q"},  # allocated, idle
        dict(idle),  # unallocated, idle
    ]
    fleet = make_fleet(devices)
    r = row_scores(fleet)
    h = STEP / 3600
    f = aggregate(fleet, r, "fleet")
    assert list(f.columns) == list(AGG_COLUMNS)
    f = f.iloc[0]
    assert f["gpu_hours"] == pytest.approx(16 * h)
    assert f["allocated_gpu_hours"] == pytest.approx(10 * h)
    assert f["unallocated_gpu_hours"] == pytest.approx(6 * h)
    assert f["idle_gpu_hours"] == pytest.approx(4 * h)  # the unallocated idle GPU is capacity, not waste
    assert f["allocated_effective_gpu_hours"] == pytest.approx((2 * 0.6 + 4 * 0.3) * h)
    assert f["unused_gpu_hours"] == pytest.approx(10 * h - (2 * 0.6 + 4 * 0.3) * h)
    assert f["effective_gpu_hours"] == pytest.approx((4 * 0.6 + 4 * 0.3) * h)

    jobs = aggregate(fleet, r, "job").set_index("job")
    assert sorted(jobs.index) == ["j1", "j2"]
    assert jobs.loc["j1", "gpu_hours"] == pytest.approx(2 * h)
    assert jobs.loc["j2", "effective_util"] == pytest.approx(0.15)
    assert jobs.loc["j2", "masking_gap"] == pytest.approx((0.65 * 4 + 0.0 * 4) / 8)

    alloc = aggregate(fleet, r, "gpu", allocated_only=True)
    assert len(alloc) == 3  # the never-allocated GPU has no allocated hours
    assert (alloc["gpu_hours"] == alloc["allocated_gpu_hours"]).all()
    assert alloc["gpu_hours"].sum() == pytest.approx(10 * h)
    by_list = aggregate(fleet, r, ["namespace", "job"])
    assert by_list["gpu_hours"].sum() == pytest.approx(10 * h)


# Bottleneck rules ------------------------------------------------------------------------------


def test_classify_rules():
    nan = np.nan
    cases = [  # busy, sm, dram, tensor -> class
        (0.0, 0.0, 0.0, 0.0, B.IDLE),
        (0.5, 0.3, 0.2, 0.1, B.INPUT),
        (0.95, 0.6, 0.3, 0.2, B.COMPUTE),
        (0.95, 0.2, 0.78, 0.02, B.MEMORY),
        (0.97, 0.37, 0.18, 0.07, B.COMM),
        (0.97, 0.05, nan, nan, B.COMM),
        (0.95, nan, 0.78, 0.02, B.MEMORY),  # no SM activity: the low-confidence rules
        (0.95, nan, 0.3, 0.2, B.COMPUTE),
        (0.95, nan, 0.3, 0.05, None),
        (nan, 0.0, nan, nan, B.IDLE),
        (nan, 0.3, nan, nan, None),
        (nan, nan, nan, nan, None),
    ]
    arr = np.array([c[:4] for c in cases], dtype=float)
    codes = B.classify(arr[:, 0], arr[:, 1], arr[:, 2], arr[:, 3])
    got = [B.CLASSES[c] if c >= 0 else None for c in codes]
    assert got == [c[4] for c in cases]


def test_bottlenecks_per_window_and_job_gated_by_input_bound_members():
    steps = 40  # 10 min at 15 s: two 5-minute windows
    starved = [0.95] * 20 + [0.5] * 20
    devices = [busy_gpu(uuid=f"GPU-{i}", gpu=str(i), sm_active=[0.6] * 20 + [0.38] * 20) for i in range(7)]
    devices.append(busy_gpu(uuid="GPU-7", gpu="7", gpu_util=starved, sm_active=[0.6] * 20 + [0.32] * 20))
    fleet = make_fleet(devices, steps=steps)
    r = row_scores(fleet)
    dev = B.bottlenecks(fleet, r, by=("uuid", "gpu_instance"), window=300)
    assert len(dev) == 16 and {"hostname", "gpu", "window_start", "window_end"} <= set(dev.columns)
    second = dev[dev["window_start"] == START + 300].set_index("uuid")["bottleneck"]
    assert second["GPU-7"] == B.INPUT
    assert (second.drop("GPU-7") == B.COMM).all()  # peers wait at the barrier
    job = B.bottlenecks(fleet, r, by=("job",), window=300).set_index("window_start")
    assert job.loc[START, "bottleneck"] == B.COMPUTE
    assert job.loc[START + 300, "bottleneck"] == B.INPUT  # 1/8 of the hours are input-bound: they gate
    assert job.loc[START + 300, "share_input_bound"] == pytest.approx(1 / 8)
    assert job.loc[START + 300, "members"] == 8
    assert job.loc[START + 300, "gpu_util"] == pytest.approx((7 * 0.95 + 0.5) / 8)
    assert (job["confidence"] == "high").all()


# Simulator scenarios ---------------------------------------------------------------------------


def scores_for(name: str):
    cluster = Cluster(load_scenario(name))
    fleet = fleet_from_cluster(cluster)
    return cluster, fleet, compute_scores(fleet)


@pytest.fixture(scope="module")
def mixed():
    return scores_for("mixed-fleet")


def test_aggregates_add_up(mixed):
    _, fleet, sc = mixed
    f = sc.levels["fleet"].iloc[0]
    h = (fleet.frame["gpu_share"] * fleet.step / 3600).sum()
    assert f["gpu_hours"] == pytest.approx(h)
    jobs = sc.levels["job"]
    assert jobs["gpu_hours"].sum() + f["unallocated_gpu_hours"] == pytest.approx(f["gpu_hours"])
    assert jobs["unused_gpu_hours"].sum() == pytest.approx(f["unused_gpu_hours"])
    unalloc = sc.levels["fleet"].iloc[0]["effective_gpu_hours"] - sc.allocated["fleet"].iloc[0]["effective_gpu_hours"]
    assert jobs["effective_gpu_hours"].sum() + unalloc == pytest.approx(f["effective_gpu_hours"])
    for name in LEVELS:
        t = sc.levels[name]
        assert (t["allocated_gpu_hours"] + t["unallocated_gpu_hours"]).to_numpy() == pytest.approx(t["gpu_hours"])
        if name not in ("job", "namespace"):
            assert t["gpu_hours"].sum() == pytest.approx(f["gpu_hours"]), name
            assert t["effective_gpu_hours"].sum() == pytest.approx(f["effective_gpu_hours"]), name
        assert sc.allocated[name]["gpu_hours"].sum() == pytest.approx(f["allocated_gpu_hours"]), name
    assert len(sc.levels["gpu"]) == 64
    # The XID 79 GPU's lost telemetry is unknown hours, not zero utilization.
    assert f["unknown_gpu_hours"] > 2.0
    pd.testing.assert_frame_equal(aggregate(fleet, sc.rows, "job"), sc.levels["job"])


def test_healthy_fleet_matches_acme_calibration():
    _, _, sc = scores_for("healthy-fleet")
    s = fleet_summary(sc)
    assert s["unknown_gpu_hours"] == 0 and s["low_confidence_share"] == 0 and s["notes"] == []
    # Fleet-wide (idle capacity included) AcmeTrace means: util ~0.62-0.70, SM ~0.38-0.42: SM/util ~0.6.
    assert 0.45 <= s["fleet_reported_util"] <= 0.75
    assert 0.25 <= s["fleet_effective_util"] <= 0.45
    assert 0.5 <= s["fleet_effective_util"] / s["fleet_reported_util"] <= 0.75
    assert s["unallocated_gpu_hours"] / s["gpu_hours"] == pytest.approx(0.33, abs=0.05)
    train = sc.levels["job"][sc.levels["job"]["job"].astype(str).str.startswith("train")]
    assert (train["reported_util"] > 0.9).all()  # busy GPUs: ~95% util ...
    assert train["effective_util"].between(0.5, 0.75).all()  # ... ~60% SM ...
    assert train["effective_tensor"].between(0.15, 0.3).all()  # ... ~20% tensor
    assert (sc.bottlenecks["job"].set_index("job").loc[train["job"], "bottleneck"] == B.COMPUTE).all()


def test_memory_bound_job_is_memory_bound_with_large_masking_gap(mixed):
    cluster, _, sc = mixed
    masked = {g["job"] for g in cluster.ground_truth() if g["kind"] == "idle_masking"}
    assert masked == {"embed-batch"}
    job = sc.levels["job"].set_index("job").loc["embed-batch"]
    assert job["masking_gap"] > 0.6 and job["reported_util"] > 0.9 and job["effective_util"] < 0.3
    b = sc.bottlenecks["job"]
    assert (b[b["job"] == "embed-batch"]["bottleneck"] == B.MEMORY).all()
    assert not (b[b["job"] != "embed-batch"]["bottleneck"] == B.MEMORY).any()
    s = fleet_summary(sc)
    assert s["reported_util"] - s["effective_util"] == pytest.approx(s["masking_gap"], abs=0.02)


def test_idle_allocated_gpus_are_idle(mixed):
    cluster, _, sc = mixed
    idle = {(g["hostname"], g["gpu"]) for g in cluster.ground_truth() if g["kind"] == "idle_allocated"}
    assert len(idle) == 2
    dev = sc.bottlenecks["gpu"]
    key = list(zip(dev["hostname"].astype(str), dev["gpu"].astype(str), strict=True))
    on = np.array([k in idle for k in key])
    assert (dev.loc[on, "bottleneck"] == B.IDLE).all()
    assert (dev.loc[on, "allocated_share"] == 1.0).all()
    alloc_busy = ~on & (dev["allocated_share"] > 0) & (dev["busy"] > 0.2)
    assert not (dev.loc[alloc_busy, "bottleneck"] == B.IDLE).any()
    nb = sc.levels["job"].set_index("job").loc["nb-alice"]
    assert nb["idle_gpu_hours"] == pytest.approx(nb["gpu_hours"]) and nb["unused_gpu_hours"] == pytest.approx(8.0)


def test_idle_allocated_mig_instances_are_idle():
    _, _, sc = scores_for("mig-training")
    b = sc.bottlenecks["job"].set_index("job")
    assert (b.loc["nb-bob", "bottleneck"] == B.IDLE).all()
    assert (b.loc["mig-finetune", "bottleneck"] == B.COMPUTE).all()
    jobs = sc.levels["job"].set_index("job")
    assert jobs.loc["nb-bob", "gpu_hours"] == pytest.approx(3 * 2 * 1 / 7)  # 3 x 1g slices x 2 h
    assert math.isnan(jobs.loc["mig-finetune", "reported_util"])  # MIG reports no GPU-Util


def test_wan_split_job_is_communication_bound():
    cluster, _, sc = scores_for("wan-split")
    split = {g["job"] for g in cluster.ground_truth() if g["kind"] == "topology"}
    assert split == {"pretrain-split"}
    b = sc.bottlenecks["job"].set_index("job")
    assert (b.loc["pretrain-split", "bottleneck"] == B.COMM).all()
    assert (b.loc["pretrain-local", "bottleneck"] == B.COMPUTE).all()
    jobs = sc.levels["job"].set_index("job")
    assert jobs.loc["pretrain-split", "masking_gap"] > jobs.loc["pretrain-local", "masking_gap"] + 0.2


def test_input_starved_job_is_input_bound_in_the_starved_window():
    cluster, _, sc = scores_for("input-starved-node")
    (truth,) = [g for g in cluster.ground_truth() if g["kind"] == "straggler"]
    b = sc.bottlenecks["job"]
    b = b[b["job"] == truth["job"]]
    inside = (b["window_start"] >= truth["start"]) & (b["window_end"] <= truth["end"])
    outside = (b["window_end"] <= truth["start"]) | (b["window_start"] >= truth["end"])
    assert inside.sum() >= 10 and outside.sum() >= 20
    assert (b.loc[inside, "bottleneck"] == B.INPUT).all()
    assert (b.loc[outside, "bottleneck"] == B.COMPUTE).all()
    dev = sc.bottlenecks["gpu"]
    dev = dev[(dev["window_start"] >= truth["start"]) & (dev["window_end"] <= truth["end"])]
    starved = dev["hostname"].astype(str) == truth["hostname"]
    assert (dev.loc[starved, "bottleneck"] == B.INPUT).all()
    assert (dev.loc[~starved, "bottleneck"] == B.COMM).all()  # the peers wait at the barrier


def test_empty_fleet_scores_to_zero_hours_and_unknown_means():
    from analyzer.data.frame import empty_frame

    sc = compute_scores(Fleet(frame=empty_frame(), step=STEP, start=START, end=START))
    s = fleet_summary(sc)
    assert s["gpu_hours"] == 0.0 and s["effective_util"] is None and s["reported_util"] is None
    assert all(len(t) == 0 for name, t in sc.levels.items() if name != "fleet")
    assert len(sc.bottlenecks["job"]) == 0 and "bottleneck" in sc.bottlenecks["gpu"].columns
