"""The rollup writer analyzes a day in hour pieces with context either side: the same numbers as the day at
once, loads bounded by a piece, hours without data counted as unknown."""

from __future__ import annotations

from dataclasses import replace
from datetime import UTC, datetime
from pathlib import Path

import pandas as pd
import pytest

from analyzer.data.load import NoTelemetry
from analyzer.data.signals import NAMES
from analyzer.data.simulated import fleet_from_cluster
from analyzer.finops import cost_report, daily_rollups
from analyzer.finops.catalog import default_catalog
from analyzer.finops.rollups import CONTEXT_S, PIECE_S, RollupWriter
from analyzer.finops.store import open_store
from analyzer.pipeline import analyze
from exporter.simulator import Cluster, load_scenario


def _day(t: float):
    return datetime.fromtimestamp(t, UTC).date()


class Loader:
    """The simulated cluster's window, every call recorded; ``gap``: a range nobody reported."""

    def __init__(self, cluster: Cluster, gap: tuple[float, float] | None = None) -> None:
        self.cluster, self.gap, self.calls = cluster, gap, []

    def __call__(self, start: float, end: float):
        self.calls.append((start, end))
        if self.gap and self.gap[0] <= start and end <= self.gap[1]:
            raise NoTelemetry(f"no GPU telemetry between {start:.0f} and {end:.0f}")
        fleet = fleet_from_cluster(self.cluster, start=start, end=end, step=60.0)
        if self.gap:  # rows in the gap are there (the devices were seen in the window), their values unknown
            ts = fleet.frame["timestamp"].to_numpy()
            silent = (ts >= self.gap[0]) & (ts < self.gap[1])
            for c in (c for c in NAMES if c in fleet.frame.columns):
                fleet.frame.loc[silent, c] = float("nan")
        return fleet


def _stored(writer: RollupWriter, start: float, end: float, tmp: Path) -> pd.DataFrame:
    writer.write(start, end)
    with open_store(writer.store) as st:
        return st.read(_day(start), _day(end - 1), "namespace").set_index("group")


def test_a_day_in_pieces_gives_the_numbers_of_the_day_at_once(tmp_path: Path) -> None:
    cluster = Cluster(load_scenario("multi-fault"))  # a straggler across pieces, thermal, faults, idle
    start, end = cluster.start, cluster.start + 3 * 3600
    loader = Loader(cluster)
    got = _stored(RollupWriter(loader, str(tmp_path / "r.db"), default_catalog(), group_bys=["namespace"]),
                  start, end, tmp_path)
    assert max(b - a for a, b in loader.calls) <= PIECE_S + 2 * CONTEXT_S  # never the day at once
    fleet = fleet_from_cluster(cluster, start=start, end=end, step=60.0)
    whole = analyze(fleet, partition=False)
    want = daily_rollups(cost_report(fleet, whole.scores, whole.findings, default_catalog(),
                                     group_by="namespace")).groupby("group").sum(numeric_only=True)
    assert set(got.index) == set(want.index)
    for c in ("gpu_hours", "cost", "unknown_gpu_hours", "allocated_gpu_hours"):
        assert got[c].to_numpy() == pytest.approx(want.loc[got.index, c].to_numpy(), rel=1e-9), c
    # Findings spanning pieces (the straggler's lost GPU-hours, idle and masked hours) land once.
    for c in (c for c in want.columns if c.endswith("_gpu_hours")):
        assert got[c].to_numpy() == pytest.approx(want.loc[got.index, c].to_numpy(), abs=0.1), c
    assert want["straggler_gpu_hours"].sum() > 1.0  # not met vacuously


def test_each_write_analyzes_only_the_newest_pieces(tmp_path: Path) -> None:
    cluster = Cluster(load_scenario("idle-waste"))
    loader = Loader(cluster)
    writer = RollupWriter(loader, str(tmp_path / "r.db"), default_catalog(), group_bys=["namespace"])
    start = cluster.start
    writer.write(start, start + 2 * 3600)
    assert len(loader.calls) == 2
    loader.calls.clear()
    writer.write(start, start + 3 * 3600)  # the first piece is final: its context after it is complete
    assert [a for a, _ in loader.calls] == [start + 3600 - CONTEXT_S, start + 7200 - CONTEXT_S]


def test_hours_without_data_are_unknown_hours_of_the_days_devices(tmp_path: Path) -> None:
    cluster = Cluster(load_scenario("idle-waste"))
    start = cluster.start
    gap = (start + 3600 - CONTEXT_S, start + 2 * 3600 + CONTEXT_S)  # the second hour and its context: nothing
    writer = RollupWriter(Loader(cluster, gap), str(tmp_path / "r.db"), default_catalog(), group_bys=["namespace"])
    got = _stored(writer, start, start + 3 * 3600, tmp_path)
    n = len(cluster.gpus)
    assert got["gpu_hours"].sum() == pytest.approx(3 * n)
    assert got["unknown_gpu_hours"].sum() >= n  # the silent hour (and the gap's edges): unknown, not left out
    assert got["unallocated_gpu_hours"].sum() < 0.1 * n


def test_a_slurm_job_s_hours_without_data_keep_its_user(tmp_path: Path) -> None:
    """A node silent for an hour of a multi-node job: its GPUs' hours there are unknown and stay the job's, so
    grouped by Slurm user they are its user's, never "(unknown)"."""
    cluster = Cluster(load_scenario("multi-fault"))
    start = cluster.start
    base = Loader(cluster)
    host = str(cluster.gpus.hostname[0])

    def load(a: float, b: float):
        fleet = base(a, b)
        fr = fleet.frame
        ts = fr["timestamp"].to_numpy()
        gone = (fr["hostname"].astype(str) == host).to_numpy() & (ts >= start + 3600) & (ts < start + 7200)
        fleet = replace(fleet, frame=fr.loc[~gone].reset_index(drop=True))  # the node's rows are absent
        jobs = sorted(set(fleet.frame["job"].dropna().astype(str)))
        fleet.accounting = pd.DataFrame({"job": jobs, "user": [f"u-{j}" for j in jobs], "account": "a",
                                         "partition": "p"})
        return fleet

    writer = RollupWriter(load, str(tmp_path / "r.db"), default_catalog(), group_bys=["user"])
    writer.write(start, start + 3 * 3600)
    with open_store(writer.store) as st:
        got = st.read(_day(start), _day(start + 3 * 3600 - 1), "user").set_index("group")
    assert "(unknown)" not in got.index
    assert got["unknown_gpu_hours"].drop("(unallocated)", errors="ignore").sum() > 1.0  # the silent hour, held
    assert got["gpu_hours"].sum() == pytest.approx(3 * len(cluster.gpus))
