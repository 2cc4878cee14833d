"""Shared GPUs (time-slicing, MPS): each holder gets the GPU-hours, work and cost of what it used, the rest
no holder explains is its own part, in every output (issue 17)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer import pipeline
from analyzer.analysis.partition import PARTS
from analyzer.analysis.shares import holder_view, owners
from analyzer.cli.analyze import build_summary, format_summary
from analyzer.data.frame import SHARE_COLUMNS
from analyzer.data.simulated import fleet_from_cluster
from analyzer.finops.catalog import default_catalog
from analyzer.finops.costs import UNATTRIBUTED_SHARE, cost_report
from analyzer.report.job import job_report, workloads
from exporter.simulator.history import write_history
from exporter.simulator.model import Cluster
from exporter.simulator.scenario import load_scenario
from tests.fleets import STEP, T0, timeline

#: The scenario's shares: chat-serve time-sliced 70/30; embed-mps two MPS clients 60/30 and 10 % of no known pod.
SHARES = {"chat-a": 0.7, "chat-b": 0.3, "embed-a": 0.6, "embed-b": 0.3}
GPUS = {"chat-a": 4, "chat-b": 4, "embed-a": 2, "embed-b": 2, "solo": 2}


_PARTS = set(PARTS)


def _outputs(fleet) -> dict[str, dict[str, float]]:
    """GPU-hours per workload from every output: scores by job, the partition, the cost report, truegpu job."""
    result = pipeline.analyze(fleet)
    cost = cost_report(fleet, result.scores, result.findings, default_catalog(), group_by="workload")
    scores = result.scores.allocated["job"].set_index("job")["gpu_hours"]
    part = result.scores.partition.job
    groups = cost.groups.set_index("group")
    out = {"scores": {str(k): float(v) for k, v in scores.items()},
           "partition": {str(k): float(sum(r[c] for c in part.columns if c.endswith("_gpu_hours") and c[:-10]
                                           in _PARTS)) for k, r in part.iterrows()},
           "cost": {str(k): float(v) for k, v in groups["gpu_hours"].items()},
           "dollars": {str(k): float(v) for k, v in groups["cost"].items()},
           "job": {}}
    for name in workloads(fleet):
        rep = job_report(fleet, result.scores, result.findings, name, cost)
        out["job"][name] = rep.scores["gpu_hours"]
        assert rep.cost["gpu_hours"] == pytest.approx(rep.scores["gpu_hours"])  # the report's cost is its share
    out["unattributed"] = {"partition": result.scores.partition.fleet["shared_unattributed_gpu_hours"],
                           "cost": float(groups.loc[UNATTRIBUTED_SHARE, "gpu_hours"])}
    out["fleet"] = {"partition": sum(v for k, v in result.scores.partition.fleet.items() if k[:-10] in _PARTS),
                    "capacity": float(result.scores.levels["fleet"]["gpu_hours"].iloc[0])}
    return out


def _check(out: dict, hours: float) -> None:
    for output in ("scores", "partition", "cost", "job"):
        got = out[output]
        for name, share in SHARES.items():
            assert got[name] == pytest.approx(GPUS[name] * hours * share, rel=0.03), (output, name, got)
        assert got["chat-a"] / (got["chat-a"] + got["chat-b"]) == pytest.approx(0.7, abs=0.02), output
        assert got["solo"] == pytest.approx(GPUS["solo"] * hours, rel=1e-6), output  # an unshared GPU is its own
    # The 10 % of the MPS GPUs no pod explains is its own part, never spread over the two clients.
    for where in ("partition", "cost"):
        assert out["unattributed"][where] == pytest.approx(2 * hours * 0.1, rel=0.05), where
    assert out["fleet"]["partition"] == pytest.approx(out["fleet"]["capacity"])
    total = sum(out["cost"].values())
    assert total == pytest.approx(out["fleet"]["capacity"])  # the groups add up to the fleet
    assert out["dollars"]["chat-b"] / out["dollars"]["chat-a"] == pytest.approx(3 / 7, rel=0.05)


def test_time_sliced_and_mps_gpus_split_by_what_each_holder_used_in_every_output() -> None:
    cluster = Cluster(load_scenario("shared-gpus"))
    fleet = fleet_from_cluster(cluster, step=60.0)
    _check(_outputs(fleet), cluster.duration / 3600.0)


def test_the_split_holds_through_the_exporter_families_in_a_history_file(tmp_path: Path) -> None:
    from analyzer.data.load import load_files

    cluster = Cluster(load_scenario("shared-gpus"))
    path = tmp_path / "metrics.om"
    write_history(path, cluster, cluster.start, cluster.start + cluster.duration, 15.0)
    fleet = load_files(path, step=60.0)
    assert len(fleet.shares) and set(fleet.shares.columns) == set(SHARE_COLUMNS)
    _check(_outputs(fleet), cluster.duration / 3600.0)
    # The holder's memory, not the GPU's: what its own processes used.
    result = pipeline.analyze(fleet)
    text = format_summary(build_summary(fleet, result.scores, result.findings))
    assert "shared GPUs, use no holder's process explains: 0.4 GPU-hours" in text  # analyze's summary says it
    b = job_report(fleet, result.scores, result.findings, "chat-b")
    a = job_report(fleet, result.scores, result.findings, "chat-a")
    assert b.gpus["memory_used_max_bytes"].max() == pytest.approx(a.gpus["memory_used_max_bytes"].max() * 3 / 7,
                                                                   rel=0.05)


def _shared(util: list[float | None], holders: dict[str, list[float | None]], steps: int = 4):
    fleet = timeline([{"gpu": 0, "gpu_util": util, "sm_active": [None if u is None else u / 2 for u in util],
                       "job": "chat-a",
                       "namespace": "ns", "pod": "chat-a-0"}], steps)
    rows = [{"timestamp": T0 + t * STEP, "hostname": "node-a", "gpu": "0", "namespace": "ns" if name else "",
             "pod": f"{name}-0" if name else "", "container": "", "job": name, "utilization": v, "memory": np.nan}
            for name, vals in holders.items() for t, v in enumerate(vals) if v is not None]
    fleet.shares = pd.DataFrame(rows, columns=list(SHARE_COLUMNS))
    return fleet


def _weights(fleet) -> dict[tuple[int, str], float]:
    own = owners(fleet)
    out: dict[tuple[int, str], float] = {}
    for r, w, job in zip(own.row, own.weight, own.labels["job"], strict=True):
        key = (int(r), "(rest)" if pd.isna(job) else str(job))
        out[key] = out.get(key, 0.0) + float(w)
    return out


def test_the_rule_busy_idle_concurrent_unexplained_and_unshared_steps() -> None:
    fleet = _shared([0.8, 0.0, 0.5, 0.9], {"chat-a": [0.56, 0.0, 0.6, None], "chat-b": [0.24, 0.0, 0.3, None],
                                          "": [0.0, 0.0, 0.0, None]})
    w = _weights(fleet)
    assert w[(0, "chat-a")] == pytest.approx(0.7) and w[(0, "chat-b")] == pytest.approx(0.3)  # what each used
    assert (0, "(rest)") not in w
    assert w[(1, "chat-a")] == pytest.approx(0.5) and w[(1, "chat-b")] == pytest.approx(0.5)  # idle: held together
    assert w[(2, "chat-a")] == pytest.approx(2 / 3) and w[(2, "chat-b")] == pytest.approx(1 / 3)  # MPS: sum p > U
    assert not any(r == 3 for r, _ in w)  # no sharer series at that step: the row's one holder keeps it
    # Activity no holder's process explains (U above sum p, or the holder with empty labels) is the rest.
    w = _weights(_shared([0.8] * 4, {"chat-a": [0.4] * 4, "chat-b": [0.2] * 4, "": [0.1] * 4}))
    assert w[(0, "chat-a")] == pytest.approx(0.5) and w[(0, "chat-b")] == pytest.approx(0.25)
    assert w[(0, "(rest)")] == pytest.approx(0.25)


def test_a_scrape_gap_keeps_the_last_known_holders_until_the_gpu_reports_again() -> None:
    # steps 0-1 shared 70/30; 2-3 no telemetry at all (gap); 4 reports with no sharer series (one holder left)
    fleet = _shared([0.8, 0.8, None, None, 0.8], {"chat-a": [0.56, 0.56, None, None, None],
                                                "chat-b": [0.24, 0.24, None, None, None]}, steps=5)
    w = _weights(fleet)
    for r in (2, 3):
        assert w[(r, "chat-a")] == pytest.approx(0.7) and w[(r, "chat-b")] == pytest.approx(0.3)
    assert not any(r == 4 for r, _ in w)  # the GPU reports again: the row's holder keeps it


def test_one_job_s_view_of_a_shared_gpu_is_its_share() -> None:
    fleet = _shared([0.8] * 4, {"chat-a": [0.56] * 4, "chat-b": [0.24] * 4})
    view = holder_view(fleet, "chat-b")
    assert view.frame["gpu_share"].to_numpy() == pytest.approx([0.3] * 4)
    assert set(view.frame["job"].astype(str)) == {"chat-b"} and set(view.frame["pod"].astype(str)) == {"chat-b-0"}
    assert not len(view.shares)
    assert holder_view(fleet, "chat-a").frame["gpu_share"].to_numpy() == pytest.approx([0.7] * 4)
    assert not len(holder_view(fleet, "nobody").frame)
    assert fleet.between(T0 + STEP, T0 + 3 * STEP).shares["timestamp"].nunique() == 2  # windows keep their steps


def test_the_api_gives_each_holder_its_share() -> None:
    """/api/scores by workload, /api/reports/cost and /api/jobs/{name} of the service over the shared-gpus fleet."""
    import requests

    from analyzer.finops import load_catalog
    from analyzer.service.app import create_app
    from analyzer.service.settings import ApiSettings
    from tests.analyzer.service.kit import AUTH, NOW, TOKEN, WINDOW, new_service, served

    scenario = load_scenario("shared-gpus")
    service, _ = new_service(Cluster(scenario, start=NOW - float(scenario.duration)))
    assert service.run_once()
    hours = WINDOW / 3600.0
    with served(create_app(service, ApiSettings(token=TOKEN, catalog=load_catalog()))) as url:
        def get(path: str, **params: str) -> dict:
            r = requests.get(url + path, params=params, headers=AUTH, timeout=60)
            assert r.status_code == 200, r.text
            return r.json()

        scores = {r["workload"]: r for r in get("/api/scores", level="workload", allocated_only="true")["rows"]}
        groups = {g["group"]: g for g in get("/api/reports/cost", group_by="workload")["report"]["groups"]}
        for name, share in SHARES.items():
            want = GPUS[name] * hours * share
            assert scores[name]["allocated_gpu_hours"] == pytest.approx(want, rel=0.03), name
            assert groups[name]["gpu_hours"] == pytest.approx(want, rel=0.03), name
            job = get(f"/api/jobs/{name}")["job"]
            assert job["cost"]["cost"] == pytest.approx(groups[name]["cost"]), name
        assert groups[UNATTRIBUTED_SHARE]["gpu_hours"] == pytest.approx(2 * hours * 0.1, rel=0.05)


def test_listings_and_scopes_see_every_holder_of_a_shared_gpu() -> None:
    """The jobs listing (and its mail), the report's job table, the cost report's tags and a namespace-scoped
    token see chat-b, which allocation info never names."""
    from analyzer.report.data import job_table
    from analyzer.report.job_list import job_list
    from analyzer.service.deps import Scope
    from analyzer.site import ScopedToken

    fleet = fleet_from_cluster(Cluster(load_scenario("shared-gpus")), step=60.0)
    result = pipeline.analyze(fleet)
    listed = job_list(fleet, result.scores).set_index("job")
    assert set(SHARES) <= set(listed.index)
    assert (listed.loc["chat-b", "gpus"], listed.loc["chat-b", "namespace"]) == (4, "serving")
    assert listed.loc["chat-b", "allocated_gpu_hours"] == pytest.approx(GPUS["chat-b"] * 2.0 * 0.3, rel=0.03)
    assert job_table(fleet, result.scores).set_index("job").loc["embed-b", "namespace"] == "batch"
    cost = cost_report(fleet, result.scores, result.findings, default_catalog(), group_by="workload")
    assert cost.tags["chat-b"] == {"workload": "chat-b", "namespace": "serving"}  # FOCUS Tags of the CSV
    serving = Scope(ScopedToken(name="serving", digest=b"", namespaces=("serving",)))
    assert serving.jobs(fleet) == {"chat-a", "chat-b", "solo"}
