"""The sharding rule (analyzer.data.shard): units, owners, the merge of two reads, and a fleet read whole
cut into shards that add up to it exactly (the real-Prometheus path: test_shard_prometheus.py)."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from collections import Counter

import numpy as np
import pandas as pd
import pytest

from analyzer.data.frame import Fleet
from analyzer.data.shard import (
    PIECE_SHARE,
    SLACK,
    KeptReads,
    Ownership,
    Shard,
    ShardFleet,
    _workloads,
    assign,
    context_names,
    merge,
    ownership_from_fleet,
    shard_fleet,
    shard_of,
    units,
)
from analyzer.data.simulated import fleet_from_cluster
from analyzer.findings import Finding
from analyzer.pipeline import analyze
from exporter import schema as S
from exporter.simulator import Cluster, load_scenario
from tests.conftest import ROOT

SCENARIO = ROOT / "fixtures" / "shard" / "fleet.yaml"


@pytest.fixture(scope="module")
def fleet() -> Fleet:
    return fleet_from_cluster(Cluster(load_scenario(str(SCENARIO))), step=60.0)


# The rule ----------------------------------------------------------------------------------------------
@pytest.mark.parametrize(("text", "want"), [("0/4", (0, 4)), ("3/4", (3, 4)), ("0/1", (0, 1)),
                                            ("truegpu-analyzer-2/4", (2, 4)), (" 1 / 2 ", (1, 2))])
def test_shard_parses_an_index_or_a_statefulset_pod_name(text, want):
    shard = Shard.parse(text)
    assert (shard.index, shard.count) == want and str(shard) == f"{want[0]}/{want[1]}"


@pytest.mark.parametrize("text", ["4/4", "1", "a/4", "1/0", "-1/4", "truegpu-analyzer/4", "1/x"])
def test_shard_refuses_what_is_not_a_shard(text):
    with pytest.raises(ValueError, match="--shard"):
        Shard.parse(text)


def test_owners_are_the_same_in_every_process():
    """sha256, not Python's hash(), which is salted per process (PYTHONHASHSEED): every replica assigns alike."""
    keys = [f"dc1-r{r}-n{n:02d}" for r in range(1, 6) for n in range(1, 6)]
    racks = {k: k[:6] for k in keys}
    jobs = [[a, b] for a, b in zip(keys[2::5], keys[5::5], strict=False)]
    here = [[shard_of(k, 4) for k in keys], assign(units(keys, jobs), racks, {}, 4)]
    code = ("import json; from analyzer.data.shard import assign, shard_of, units; "
            f"keys, racks, jobs = {keys!r}, {racks!r}, {jobs!r}; "
            "print(json.dumps([[shard_of(k, 4) for k in keys], assign(units(keys, jobs), racks, {}, 4)])); "
            "print([hash(k) % 4 for k in keys])")
    runs = [subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT,
                           env={**os.environ, "PYTHONHASHSEED": seed}).stdout.splitlines() for seed in ("1", "2")]
    assert [json.loads(r[0]) for r in runs] == [here, here]
    assert runs[0][1] != runs[1][1], "hash() would have differed (the test can fail)"
    assert set(here[0]) == {0, 1, 2, 3} == set(here[1].values())


def _racks(count: int, per_rack: int = 8) -> dict[str, str]:
    """node -> rack of ``count`` racks of ``per_rack`` nodes (r00-n0 ...)."""
    return {f"r{r:02d}-n{n}": f"r{r:02d}" for r in range(count) for n in range(per_rack)}


def _shares(owners: dict[str, int], count: int) -> tuple[list[float], int]:
    """(each shard's share of the nodes, racks whose nodes sit in more than one shard)."""
    racks: dict[str, set[int]] = {}
    for n, s in owners.items():
        racks.setdefault(n.split("-")[0], set()).add(s)
    return [sum(s == i for s in owners.values()) / len(owners) for i in range(count)], \
        sum(len(v) > 1 for v in racks.values())


def test_shards_own_whole_racks_in_near_equal_shares():
    """Jobs inside racks and a few spanning two: every rack is owned whole (thermal reads no other shard's
    nodes), and no shard holds more than SLACK over its fair share."""
    racks = _racks(64)
    jobs = [[f"r{r:02d}-n{2 * k}", f"r{r:02d}-n{2 * k + 1}"] for r in range(64) for k in range(3)]
    jobs += [[f"r{r:02d}-n7", f"r{r + 1:02d}-n6"] for r in range(0, 64, 8)]  # pairs of racks linked
    owners = assign(units(racks, jobs), racks, dict.fromkeys(racks, 8), 4)
    shares, split = _shares(owners, 4)
    assert split == 0 and max(shares) <= (1 + SLACK) / 4 and min(shares) >= 0.2
    assert all(len({owners[n] for n in job}) == 1 for job in jobs)


def test_racks_chained_by_jobs_are_cut_into_pieces_with_units_whole():
    """Each job spans the boundary of two racks, so all 64 racks are one block: it is cut in rack order, units
    whole, into pieces of about PIECE_SHARE of a shard; only racks at a cut are read by two shards."""
    racks = _racks(64)
    jobs = [[f"r{r:02d}-n7", f"r{r + 1:02d}-n0"] for r in range(63)]
    owners = assign(units(racks, jobs), racks, dict.fromkeys(racks, 8), 4)
    shares, split = _shares(owners, 4)
    assert all(len({owners[n] for n in job}) == 1 for job in jobs)
    assert max(shares) <= (1 + SLACK) / 4 + PIECE_SHARE / 4 / 8 and 0 < split <= 4 / PIECE_SHARE


def test_a_new_job_inside_a_rack_moves_no_node_and_one_across_racks_few():
    racks = _racks(64)
    jobs = [[f"r{r:02d}-n0", f"r{r:02d}-n1"] for r in range(64)] + [["r03-n7", "r04-n0"]]
    gpus = dict.fromkeys(racks, 8)
    before = assign(units(racks, jobs), racks, gpus, 4)
    inside = assign(units(racks, [*jobs, ["r10-n2", "r10-n3"]]), racks, gpus, 4)
    across = assign(units(racks, [*jobs, ["r10-n7", "r20-n0"]]), racks, gpus, 4)
    assert inside == before
    moved = sum(across[n] != before[n] for n in racks)
    assert 0 < moved <= 0.1 * len(racks)  # the two racks joined (3 %), and pieces whose first choice filled


def test_units_link_hosts_through_workloads():
    nodes = ["a", "b", "c", "d", "e", "f", "g"] + [f"m{i}" for i in range(10)]
    workloads = [
        ["a", "c"],  # job1 on a and c; later a's GPU moves to job2 ...
        ["a", "b"],  # ... which also runs on b: a, b and c are one unit
        [f"m{i}" for i in range(10)],  # one job on ten hosts: one unit
        ["e", "f"], ["e", "g"],  # host e holds GPUs of two jobs: both jobs' hosts go with it
    ]  # d held no workload: a unit of its own
    got = units(nodes, workloads)
    assert {got[n] for n in "abc"} == {"a"} and {got[n] for n in "efg"} == {"e"} and got["d"] == "d"
    assert {got[f"m{i}"] for i in range(10)} == {"m0"}


def _frame(rows: list[tuple[str, str, float, str | None]]) -> Fleet:
    """A tiny fleet: (hostname, gpu, timestamp, job) rows."""
    host, gpu, ts, job = zip(*rows, strict=True)
    frame = pd.DataFrame({"timestamp": ts, "hostname": pd.Categorical(host), "gpu": pd.Categorical(gpu),
                          "job": pd.Categorical(job), "gpu_util": np.ones(len(rows))})
    return Fleet(frame=frame, step=60.0, start=0.0, end=120.0)


def test_a_gpu_that_moved_between_jobs_keeps_both_jobs_and_hosts_together():
    fl = _frame([("h1", "0", 0.0, "j1"), ("h1", "0", 60.0, "j2"),  # h1's GPU 0: j1, then j2
                 ("h2", "0", 0.0, "j1"), ("h2", "0", 60.0, "j1"),
                 ("h3", "0", 0.0, "j2"), ("h3", "0", 60.0, "j2"),
                 ("h4", "0", 0.0, None), ("h4", "0", 60.0, None)])  # unallocated: its own unit
    for count in (2, 3, 7):
        owners = [ownership_from_fleet(fl, Shard(i, count)) for i in range(count)]
        assert len({o.owner(h) for o in owners for h in ("h1", "h2", "h3")}) == 1
        linked = {i for i, o in enumerate(owners) if "h1" in o.nodes}
        assert len(linked) == 1 and {"h1", "h2", "h3"} <= owners[linked.pop()].nodes
        assert sum("h4" in o.nodes for o in owners) == 1  # every host in exactly one shard


def test_a_workload_split_across_shards_is_refused():
    fl = _frame([("h1", "0", 0.0, "j1"), ("h2", "0", 0.0, "j1")])
    own = Ownership(Shard(0, 2), {"h1": 0, "h2": 1})  # as if discovery had missed the link
    with pytest.raises(ValueError, match="'j1' spans hosts of several shards"):
        ShardFleet.of(fl, fl, own, {})


def test_findings_belong_to_their_host_job_or_rack(fleet):
    shards = [shard_fleet(fleet, Shard(i, 4)) for i in range(4)]
    f = fleet.frame
    job_host = min(f.loc[f["job"] == "train-b", "hostname"].astype(str))
    rack_host = min(f.loc[f["rack"] == "dc1-r3", "hostname"].astype(str))

    def owner(finding: Finding) -> list[int]:
        return [i for i, s in enumerate(shards) if s.owns(finding)]

    base = {"kind": "thermal", "severity": "warning", "summary": "", "start": 0.0, "end": None, "score": 1.0}
    assert owner(Finding(**base, hostname="dc1-r4-n02", gpu=3)) == [shards[0].ownership.owner("dc1-r4-n02")]
    assert owner(Finding(**base, job="train-b")) == [shards[0].ownership.owner(job_host)]
    assert owner(Finding(**base, rack="dc1-r3")) == [shards[0].ownership.owner(rack_host)]
    assert owner(Finding(**base)) == [0]


# A fleet read whole, cut into shards ----------------------------------------------------------------------
@pytest.mark.parametrize("count", [3, 4])
def test_shards_of_a_fleet_add_up_to_it_exactly(fleet, count):
    whole = analyze(fleet)
    parts = [analyze(shard_fleet(fleet, Shard(i, count))) for i in range(count)]

    def key(f: Finding) -> str:
        return json.dumps(f.to_json(), sort_keys=True)

    assert Counter(key(f) for r in parts for f in r.findings) == Counter(key(f) for f in whole.findings)
    assert {f.kind for f in whole.findings} >= {"straggler", "thermal", "idle_allocated", "gpu_fault"}
    for name, hours in whole.scores.partition.fleet.items():
        assert sum(r.scores.partition.fleet[name] for r in parts) == pytest.approx(hours, rel=1e-12, abs=1e-12)
    def by_name(table: pd.DataFrame) -> pd.DataFrame:
        return table.set_axis(table.index.astype(str)).sort_index()

    jobs = by_name(pd.concat([by_name(r.scores.partition.job) for r in parts]))
    pd.testing.assert_frame_equal(jobs, by_name(whole.scores.partition.job), check_exact=False, rtol=1e-12)
    ns = pd.concat([by_name(r.scores.partition.namespace) for r in parts]).groupby(level=0).sum()
    pd.testing.assert_frame_equal(ns, by_name(whole.scores.partition.namespace), check_exact=False, rtol=1e-12)
    nodes = pd.concat([r.scores.levels["node"].astype({"hostname": str}) for r in parts])
    pd.testing.assert_frame_equal(nodes.sort_values("hostname").reset_index(drop=True),
                                  whole.scores.levels["node"].astype({"hostname": str}), check_exact=False, rtol=1e-12)


def test_without_context_the_shards_would_not_add_up(fleet):
    """The context is needed: detectors run on the owned rows alone miss or change findings (thermal's
    rack references, degraded_gpu's per-model fits), so this test's subject is real."""
    whole = {(f.kind, f.hostname, f.gpu, f.rack, f.job, f.start) for f in analyze(fleet).findings}
    alone = set()
    for i in range(4):
        sf = shard_fleet(fleet, Shard(i, 4))
        owned = Fleet(frame=sf.frame, step=sf.step, start=sf.start, end=sf.end, events=sf.events,
                      topology=sf.topology)
        alone |= {(f.kind, f.hostname, f.gpu, f.rack, f.job, f.start) for f in analyze(owned).findings}
    assert alone != whole


# Reading from Prometheus: the merge of two reads, the workload names, the context families ----------------
def test_merge_of_two_reads_over_disjoint_hosts_is_the_fleet(fleet):
    f = fleet.frame
    hosts = sorted(f["hostname"].astype(str).unique())
    mine = f["hostname"].astype(str).isin(hosts[1::3]).to_numpy()

    def part(sel: np.ndarray, drop: tuple[str, ...] = ()) -> Fleet:
        frame = f[sel].drop(columns=list(drop)).reset_index(drop=True)
        for c in frame.columns:
            if isinstance(frame[c].dtype, pd.CategoricalDtype):
                frame[c] = frame[c].cat.remove_unused_categories()
        return dataclasses.replace(fleet, frame=frame, notes=[])

    merged = merge(part(mine), part(~mine))
    pd.testing.assert_frame_equal(merged.frame, f)
    context = merge(part(mine), part(~mine, drop=("mem_used", "pcie_gen")))  # the context lacks families
    assert context.frame["mem_used"].notna().to_numpy().tolist() == (mine & f["mem_used"].notna()).tolist()
    pd.testing.assert_frame_equal(context.frame.drop(columns=["mem_used", "pcie_gen"]),
                                  f.drop(columns=["mem_used", "pcie_gen"]))


def test_workload_names_follow_normalize():
    alloc, dcgm = S.GPU_ALLOCATION_INFO.name, "DCGM_FI_DEV_FB_USED"
    series = [
        {"__name__": alloc, "hostname": "h", "gpu": "0", "job": "truegpu-exporter", "workload": "llm-pretrain"},
        {"__name__": alloc, "hostname": "h", "gpu": "1", "job": "old-name"},  # before the rename
        {"__name__": dcgm, "Hostname": "h", "gpu": "0", "job": "dcgm-exporter", "hpc_job": "4711"},
        {"__name__": dcgm, "Hostname": "h", "gpu": "1", "namespace": "ml", "pod": "tensorflow-3"},
        {"__name__": dcgm, "Hostname": "g", "gpu": "0", "namespace": "ml", "pod": "tensorflow-0"},
        {"__name__": dcgm, "Hostname": "g", "gpu": "1", "namespace": "ml", "pod": "bert-x7k2q",
         "training_kubeflow_org_job_name": "bert-ft"},
        {"__name__": dcgm, "Hostname": "g", "gpu": "2", "job": "dcgm-exporter"},  # unallocated
    ]
    assert _workloads(series, None) == [{"llm-pretrain"}, {"old-name"}, {"4711"}, {"tensorflow", "tensorflow-3"},
                                        {"tensorflow"}, {"bert-ft"}, set()]
    assert _workloads([{**series[3], "team_job": "t-1"}], "team_job") == [{"t-1"}]


def test_context_families_cover_both_dialects():
    names = context_names()
    assert {"truegpu_temperature_celsius", "DCGM_FI_DEV_GPU_TEMP", "dcgm_fi_dev_gpu_temp", "truegpu_power_watts",
            "DCGM_FI_PROF_SM_ACTIVE", S.GPU_ALLOCATION_INFO.name, S.NODE_INFO.name} <= names
    assert not {"truegpu_memory_used_bytes", "DCGM_FI_DEV_FB_USED", S.XID_ERRORS.name, "truegpu_ecc_errors_total"} \
        & names


def test_kept_reads_keep_the_reads_a_tick_makes_and_drop_the_others(fleet):
    """KeptReads: a read keeps its window from tick to tick (a full load once, then only new steps); a read the
    last tick did not make is dropped, and made again it loads whole (its hosts changed: a unit moved)."""
    calls: list[tuple[str, float, float]] = []

    def reader(key: str):
        def read(lo: float, hi: float, labelsets) -> Fleet:
            calls.append((key, lo, hi))
            return fleet.between(lo, hi)

        return read

    kept = KeptReads()
    window, step = 1800.0, fleet.step
    end = fleet.start + window

    def tick(end: float, keys: list[str]) -> list[Fleet]:
        return kept.tick(lambda: [kept.load(k, reader(k), end - window, end) for k in keys])

    tick(end, ["owned", "sample"])
    tick(end + step, ["owned", "sample"])
    got = tick(end + 2 * step, ["owned", "mates"])
    assert sorted(kept.windows) == ["mates", "owned"]  # the sample was not read by the last tick
    assert kept.windows["owned"].full_loads == 1 and kept.windows["owned"].incremental_loads == 2
    assert kept.windows["mates"].full_loads == 1
    assert calls[-1] == ("mates", end + 2 * step - window, end + 2 * step)  # new: its whole window
    spans = [hi - lo for key, lo, hi in calls if key == "owned"]
    assert spans[0] == window and all(s <= 3 * step for s in spans[1:])  # then its new step and the overlap
    want = fleet.between(end + 2 * step - window, end + 2 * step)
    assert all(len(g.frame) == len(want.frame) and g.start == want.start and g.end == want.end for g in got)
    tick(end + 3 * step, ["owned"])
    assert sorted(kept.windows) == ["owned"]
    tick(end + 4 * step, ["owned", "sample"])
    assert kept.windows["sample"].full_loads == 1 and kept.windows["sample"].incremental_loads == 0
