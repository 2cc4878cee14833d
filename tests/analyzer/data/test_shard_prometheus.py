"""Four shards of a real Prometheus add up to exactly the unsharded analysis (analyzer.data.shard).

fixtures/shard/fleet.yaml (200 GPUs in 5 racks: gangs across racks, a thermal straggler, a rack whose
cooling fails, idle notebooks, unallocated nodes) is backfilled into a real Prometheus, one hour at
60 s, in both dialects. `truegpu analyze --shard i/4` four times must give the findings of one
unsharded run (every field, ids included) and GPU-hours that add up to its totals; `serve --shard`'s
/metrics of the four replicas union to the unsharded replica's series.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from analyzer import output_schema as O
from analyzer.data import reference
from analyzer.data.shard import KeptReads, Shard, load_shard, shard_loader
from analyzer.pipeline import analyze
from analyzer.service import AnalyzerService, prometheus_loader
from analyzer.service.metrics import build_registry
from exporter.simulator import Cluster, load_scenario
from exporter.simulator.history import write_history
from tests.analyzer.service.kit import assert_same_fleet, finding_texts
from tests.conftest import ROOT
from tests.realprom import backfilled_prometheus
from truegpu.cli import main

SCENARIO = ROOT / "fixtures" / "shard" / "fleet.yaml"
STEP, HOUR, SHARDS = 60.0, 3600.0, 4
#: Summary numbers that are GPU-hours: the shards' add up to the fleet's.
HOURS = ("gpu_hours", "allocated_gpu_hours", "effective_gpu_hours", "unused_gpu_hours", "idle_gpu_hours",
         "unallocated_gpu_hours", "unknown_gpu_hours", "waste_gpu_hours", "normal_gpu_hours")


@pytest.fixture(scope="module", params=["truegpu", "dcgm"])
def prom(request, tmp_path_factory, promtool, prometheus_bin):
    cluster = Cluster(load_scenario(str(SCENARIO)))
    tmp = tmp_path_factory.mktemp(f"shard-{request.param}")
    write_history(tmp / "hour.om", cluster, cluster.start, cluster.start + HOUR + STEP, STEP, dialect=request.param)
    with backfilled_prometheus(tmp, [tmp / "hour.om"], promtool, prometheus_bin) as url:
        yield url, cluster.start, cluster.start + HOUR


def _analyze(capsys, url: str, start: float, end: float, *extra: str) -> dict:
    assert main(["analyze", "--quiet", "--json", "--prometheus", url, "--start", repr(start), "--end", repr(end),
                 "--step", "60s", *extra]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("sample", [None, "6", "6, hot rack last"])
def test_four_shards_give_exactly_the_unsharded_findings_and_totals(prom, capsys, monkeypatch, sample):
    """``sample`` 6: the fleet's references from 6+ of its 25 hosts (two racks in truegpu's data), so each
    shard reads its own hosts, that sample and its racks' other nodes, not the whole fleet; with the hot rack
    ranked last it is outside the sample, read only as the racks' other nodes (thermal's families)."""
    url, start, end = prom
    if sample is not None:
        monkeypatch.setattr(reference, "REFERENCE_HOSTS", 6)
    if sample == "6, hot rack last":
        rank = reference.unit_rank
        monkeypatch.setattr(reference, "unit_rank", lambda key: 2**52 if key == "rack:dc1-r3" else rank(key))
    whole = _analyze(capsys, url, start, end)
    shards = [_analyze(capsys, url, start, end, "--shard", f"{i}/{SHARDS}") for i in range(SHARDS)]
    kinds = Counter(f["kind"] for f in whole["findings"])
    assert {"straggler", "thermal", "idle_allocated", "gpu_fault", "degraded_gpu"} <= set(kinds), kinds
    # the hot rack is one cooling finding over several nodes (a rack in truegpu's data; dcgm's has no racks)
    assert any(f["kind"] == "thermal" and f["gpu"] is None for f in whole["findings"])

    def key(f: dict) -> str:
        return json.dumps(f, sort_keys=True)

    union = [key(f) for s in shards for f in s["findings"]]
    assert Counter(union) == Counter(key(f) for f in whole["findings"])  # each finding once, every field equal
    about = [s["summary"]["shard"] for s in shards]
    assert all(a["nodes"] > 0 for a in about), about  # every shard holds hosts: the union means something
    if sample is not None:  # the sample and the racks' other nodes, not every other host
        assert any(a["nodes"] + a["context_nodes"] < 25 for a in about), about
    assert sum(a["nodes"] for a in about) == whole["summary"]["nodes"]
    assert sum(a["gpus"] for a in about) == whole["summary"]["gpus"] == 200
    for name in HOURS:
        assert sum(s["summary"][name] for s in shards) == pytest.approx(whole["summary"][name], rel=1e-12), name
    for part, hours in whole["summary"]["parts"].items():
        assert sum(s["summary"]["parts"][part] for s in shards) == pytest.approx(hours, rel=1e-12, abs=1e-12), part
    # each shard's ratios are its own; weighted by its measured hours they give the fleet's
    eff = sum(s["summary"]["effective_util"] * (s["summary"]["allocated_gpu_hours"] - s["summary"]["unknown_gpu_hours"])
              for s in shards if s["summary"]["effective_util"] is not None)
    known = sum(s["summary"]["allocated_gpu_hours"] - s["summary"]["unknown_gpu_hours"] for s in shards)
    assert eff / known == pytest.approx(whole["summary"]["effective_util"], rel=1e-9)


def _metrics(loader, start: float, end: float) -> dict[tuple[str, tuple], float]:
    """The /metrics samples of one run of a service over [start, end) (the analyzer's own families)."""
    service = AnalyzerService(loader, fixed=(start, end), step=STEP)
    assert service.run_once(), service.snapshot().health.last_error
    text = generate_latest(build_registry(service.snapshot)).decode()
    own = {O.FINDING_ACTIVE.name, O.FINDING_SCORE.name, O.FINDING_STARTED.name, O.JOB_EFFECTIVE_UTILIZATION.name,
           O.JOB_REPORTED_UTILIZATION.name, O.JOB_ALLOCATED_GPUS.name, O.FLEET_GPU_SECONDS.name,
           O.NAMESPACE_GPU_SECONDS.name}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples if s.name in own}


def test_serve_replicas_metrics_union_to_the_unsharded_replica(prom):
    url, start, end = prom
    whole = _metrics(prometheus_loader(url, STEP), start, end)
    union: dict[tuple[str, tuple], float] = {}
    for i in range(SHARDS):
        for key, value in _metrics(shard_loader(url, STEP, Shard(i, SHARDS)), start, end).items():
            additive = key[0] in (O.FLEET_GPU_SECONDS.name, O.NAMESPACE_GPU_SECONDS.name)
            assert additive or key not in union, f"{key} published by two shards"
            union[key] = union.get(key, 0.0) + value
    assert set(union) == set(whole)
    for key, value in whole.items():
        assert union[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key
    assert any(k[0] == O.FINDING_ACTIVE.name for k in whole)


def test_a_node_whose_exporter_pod_rolled_is_one_host_of_one_shard(tmp_path, promtool, prometheus_bin):
    """The host label holds dcgm-exporter pod names (tests/analyzer/data/test_hosts.py's history: node-a
    served by one pod, then, after a DaemonSet roll, another): discovery maps them to nodes through
    kube_pod_info, so node-a's two pod names are one host, read whole by one shard."""
    from analyzer.data.ingest import PrometheusClient
    from analyzer.data.shard import discover
    from tests.analyzer.data.test_hosts import NEW, OLD, OTHER, T0, _util, history
    from tests.analyzer.data.test_hosts import STEP as HOSTS_STEP

    (tmp_path / "h.om").write_text(history())
    with backfilled_prometheus(tmp_path, [tmp_path / "h.om"], promtool, prometheus_bin) as url:
        with PrometheusClient(url) as client:
            found = discover(client, T0, T0 + 600.0, HOSTS_STEP)
        shards = [load_shard(url, T0, T0 + 600.0, HOSTS_STEP, Shard(i, 2)) for i in range(2)]
    assert {n: sorted(v) for n, v in found.raw.items()} == {"node-a": sorted([OLD, NEW]), "node-b": [OTHER]}
    assert found.host_labels == ("Hostname",)
    owners = {h: [i for i, s in enumerate(shards) if h in set(s.frame["hostname"].astype(str))]
              for h in ("node-a", "node-b")}
    assert all(len(o) == 1 for o in owners.values()), owners
    (a,) = owners["node-a"]
    assert _util(shards[a], "node-a", "0") == [0.2] * 5 + [0.8] * 5  # both pods' samples: OLD's, then NEW's
    assert shards[a].ownership.owns("node-a") and shards[a].about["nodes"] == len(shards[a].ownership.nodes)
    assert sorted(set(shards[a].whole.frame["hostname"].astype(str))) == ["node-a", "node-b"]


def test_serve_shard_ticks_read_only_their_new_steps_and_equal_full_loads(prom):
    """serve --shard's ticks (KeptReads: each of the shard's reads is a kept window) give, tick after tick,
    the fleet and findings a full load of the shard gives, while reading only each tick's new steps."""
    url, start, _end = prom
    kept = KeptReads()
    ticks = shard_loader(url, STEP, Shard(1, SHARDS), kept=kept)
    window = 30 * 60.0
    for minute in range(30, 36):
        lo, hi = start + minute * 60.0 - window, start + minute * 60.0
        got, want = ticks(lo, hi), load_shard(url, lo, hi, STEP, Shard(1, SHARDS))
        assert_same_fleet(got, want)
        assert_same_fleet(got.whole, want.whole)
        if minute % 5 == 0:  # the same fleet gives the same findings: a few ticks check the splice reaches them
            assert finding_texts(analyze(got).findings) == finding_texts(analyze(want).findings), f"tick {minute} min"
        assert got.about == want.about
    assert len(kept.windows) >= 2  # the owned hosts and the context: reads of their own
    assert all(w.full_loads == 1 and w.incremental_loads == 5 for w in kept.windows.values()), \
        [(w.full_loads, w.incremental_loads, w.last_reason) for w in kept.windows.values()]
