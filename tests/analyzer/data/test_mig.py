"""MIG capacity never carved into instances is unallocated capacity, in scores, partition and cost; never
missing (a GPU in MIG mode with 3 of 7 slices created holds 4/7 that no instance reports)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.data.coverage import DATA_SHARE
from analyzer.data.frame import UNCARVED, Fleet
from analyzer.data.load import load_files
from analyzer.data.mig import with_uncarved, without_uncarved
from analyzer.data.simulated import fleet_from_cluster
from analyzer.finops import cost_report, load_catalog
from analyzer.pipeline import analyze
from exporter.simulator import Cluster, load_scenario
from exporter.simulator.history import write_history

STEP, T = 60.0, 60
T0 = 1_767_571_200.0


def one_slice_gpu(gap: slice | None = None) -> Fleet:
    """One H100 in MIG mode with a single 3g.40gb instance (3 of 7 slices) held by a job for an hour, next to
    a whole GPU nobody holds; ``gap``: steps where the instance has no data."""
    rows = []
    for gpu, inst, prof, share, job in (("0", "1", "3g.40gb", 3 / 7, "train"), ("1", "", "", 1.0, None)):
        for k in range(T):
            rows.append({"timestamp": T0 + k * STEP, "hostname": "n1", "gpu": gpu, "uuid": f"GPU-{gpu}",
                         "gpu_instance": inst, "mig_profile": prof, "model": "NVIDIA H100 80GB HBM3", "site": "",
                         "rack": "", "gpu_share": share, "namespace": "ml" if job else None, "pod": None,
                         "container": None, "job": job, "sm_active": 0.5, "gr_active": 0.9, "gpu_util": np.nan,
                         "mem_used": 1e9})
    frame = pd.DataFrame(rows)
    if gap is not None:
        at = frame.index[(frame["gpu"] == "0")][gap]
        frame.loc[at, ["sm_active", "gr_active", "mem_used"]] = np.nan
    for c in ("hostname", "gpu", "uuid", "gpu_instance", "mig_profile", "model", "site", "rack", "namespace", "pod",
              "container", "job"):
        frame[c] = frame[c].astype("category")
    return Fleet(frame=with_uncarved(frame), step=STEP, start=T0, end=T0 + T * STEP)


def test_uncarved_slices_are_unallocated_in_scores_partition_and_cost():
    fleet = one_slice_gpu()
    fr = fleet.frame
    uncarved = fr[fr["gpu_instance"] == UNCARVED]
    assert len(uncarved) == T and uncarved["gpu_share"].eq(4 / 7).all() and uncarved["job"].isna().all()
    assert list(fr["gpu_instance"].astype(str).iloc[[0, T, 2 * T]]) == ["1", UNCARVED, ""]  # device order kept
    result = analyze(fleet)
    total = result.scores.levels["fleet"].iloc[0]
    assert total["gpu_hours"] == pytest.approx(2.0)  # both GPUs whole, for an hour
    assert total["allocated_gpu_hours"] == pytest.approx(3 / 7)
    assert total["unallocated_gpu_hours"] == pytest.approx(4 / 7 + 1.0)
    assert total["unknown_gpu_hours"] == pytest.approx(0.0)
    assert result.scores.partition.fleet["unallocated_gpu_hours"] == pytest.approx(4 / 7 + 1.0)
    catalog = load_catalog()
    report = cost_report(fleet, result.scores, result.findings, catalog, group_by="gpu")
    price = catalog.lookup("NVIDIA H100 80GB HBM3").price_per_gpu_hour
    groups = report.groups.set_index("group")
    assert set(groups.index) == {"GPU-0/1", f"GPU-0/{UNCARVED}", "GPU-1"}  # the rest of the card, its own row
    gpu0 = groups.loc[["GPU-0/1", f"GPU-0/{UNCARVED}"]].sum()
    assert gpu0["gpu_hours"] == pytest.approx(1.0) and gpu0["cost"] == pytest.approx(price)
    assert groups.loc[f"GPU-0/{UNCARVED}", "unallocated_cost"] == pytest.approx(4 / 7 * price)
    assert not [f for f in result.findings if f.gpu_instance == UNCARVED]


def test_uncarved_capacity_is_unknown_where_the_gpu_is_not_seen():
    fleet = one_slice_gpu(gap=slice(10, 20))
    total = analyze(fleet).scores.levels["fleet"].iloc[0]
    assert total["gpu_hours"] == pytest.approx(2.0)
    assert total["unknown_gpu_hours"] == pytest.approx((3 / 7 + 4 / 7) * 10 / 60)  # the instance and the rest
    assert total["unallocated_gpu_hours"] == pytest.approx(4 / 7 * 50 / 60 + 1.0)


def test_recomputed_never_doubled_and_a_whole_carve_adds_nothing():
    fleet = one_slice_gpu()
    again = with_uncarved(fleet.frame)
    pd.testing.assert_frame_equal(again, fleet.frame)
    assert len(without_uncarved(fleet.frame)) == 2 * T
    full = without_uncarved(fleet.frame).copy()
    full["gpu_share"] = full["gpu_share"].where(full["gpu"] != "0", 1.0)  # 7 of 7 slices
    assert (with_uncarved(full)["gpu_instance"] != UNCARVED).all()
    assert DATA_SHARE in fleet.frame.columns and fleet.frame[DATA_SHARE].iloc[:T].isna().all()


def test_a_mig_fleet_s_gpu_hours_are_its_gpus_from_the_simulator_and_from_a_file(tmp_path):
    cluster = Cluster(load_scenario("mig-training"))
    sim = fleet_from_cluster(cluster, step=60.0)
    path = tmp_path / "mig.om"
    write_history(path, cluster, cluster.start, cluster.start + 3600 + 60, 60.0)
    read = load_files([path], step=60.0, start=cluster.start, end=cluster.start + 3600)
    for fleet in (sim, read):
        hours = (fleet.end - fleet.start) / 3600
        total = analyze(fleet).scores.levels["fleet"].iloc[0]
        assert total["gpu_hours"] == pytest.approx(fleet.gpu_count() * hours)
        per_gpu = fleet.frame.groupby(["hostname", "gpu", "timestamp"], observed=True)["gpu_share"].sum()
        assert np.allclose(per_gpu.to_numpy(), 1.0)  # every GPU whole at every step: instances + uncarved
        assert (fleet.frame["gpu_instance"] == UNCARVED).any()
