"""dcgm-exporter pod names in the host label -> nodes via kube-state-metrics' kube_pod_info, and
nodes' zones (their site) via its kube_node_labels (analyzer.data.hosts), from an OpenMetrics file
and from a REAL Prometheus backfilled by promtool.

The history: node-a's two GPUs are served by dcgm-exporter-wwwjh, then (after a DaemonSet roll
half-way) by dcgm-exporter-x7k2p; node-b's GPU by nvidia-dcgm-exporter-7xk2p all along. GPU 0 of
node-a reads 20 % before the roll and 80 % after: one node history holds both.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.data import hosts
from analyzer.data.hosts import map_exporter_pods, pod_info, pod_info_query
from analyzer.data.load import load_files, load_prometheus
from exporter import schema as S
from tests.realprom import backfilled_prometheus

T0 = 1_699_999_980.0  # a multiple of STEP
STEP = 60.0
SAMPLE = 30.0
N = 20  # samples per series: 600 s, 10 rows
ROLL = T0 + 300.0
UTIL = S.GPU_UTILIZATION.dcgm[0].field
TEMP = S.dcgm_field(S.TEMPERATURE, sensor="gpu").field
OLD, NEW, OTHER = "dcgm-exporter-wwwjh", "dcgm-exporter-x7k2p", "nvidia-dcgm-exporter-7xk2p"
#: Another node's exporter pod: listed by kube-state-metrics, absent from the GPU data.
UNUSED = "nvidia-dcgm-exporter-q9zzt"
#: (exporter pod, node, gpu, util %, first sample, last sample + SAMPLE); node-b's GPU runs a workload.
GPUS = (
    (OLD, "node-a", "0", 20.0, T0, ROLL), (OLD, "node-a", "1", 10.0, T0, ROLL),
    (NEW, "node-a", "0", 80.0, ROLL, T0 + N * SAMPLE), (NEW, "node-a", "1", 90.0, ROLL, T0 + N * SAMPLE),
    (OTHER, "node-b", "0", 50.0, T0, T0 + N * SAMPLE),
)  # fmt: skip
#: kube_pod_info: (pod, node, from, to); trainer-0 is a workload pod and must not become a host.
PODS = (
    (OLD, "node-a", T0, ROLL), (NEW, "node-a", ROLL, T0 + N * SAMPLE), (OTHER, "node-b", T0, T0 + N * SAMPLE),
    (UNUSED, "node-c", T0, T0 + N * SAMPLE), ("trainer-0", "node-b", T0, T0 + N * SAMPLE),
)  # fmt: skip
#: kube_node_labels: (node, zone label, zone); node-b's cluster predates topology.kubernetes.io/zone.
ZONES = (("node-a", S.KUBE_NODE_ZONE_LABELS[0], "eu-1a"), ("node-b", S.KUBE_NODE_ZONE_LABELS[1], "eu-1b"),
         ("node-c", S.KUBE_NODE_ZONE_LABELS[0], "eu-1c"))


def _times(first: float, stop: float) -> np.ndarray:
    return np.arange(first, stop, SAMPLE)


def history(pods=PODS, shift: float = 0.0, zones=ZONES) -> str:
    """OpenMetrics text (seconds, ``# EOF``) of GPUS and, for each of ``pods``, kube_pod_info, for each of
    ``zones`` kube_node_labels."""
    out = []
    for name, unit_value in ((UTIL, lambda u: u), (TEMP, lambda u: 30.0 + u / 10)):
        out.append(f"# TYPE {name} gauge")
        for pod, _node, gpu, util, first, stop in GPUS:
            work = ',namespace="ml",pod="trainer-0",container="main"' if pod == OTHER else ""
            labels = f'gpu="{gpu}",UUID="GPU-{pod[-5:]}-{gpu}",modelName="NVIDIA H100 80GB HBM3",Hostname="{pod}"'
            for t in _times(first, stop):
                out.append(f"{name}{{{labels}{work}}} {unit_value(util):g} {t + shift:.0f}")
    if pods:
        out.append(f"# TYPE {S.KUBE_POD_INFO} gauge")
        for pod, node, first, stop in pods:
            labels = (f'namespace="gpu-operator",pod="{pod}",node="{node}",host_ip="10.0.0.{ord(node[-1])}",'
                      f'created_by_kind="DaemonSet",created_by_name="nvidia-dcgm-exporter"')
            for t in _times(first, stop):
                out.append(f"{S.KUBE_POD_INFO}{{{labels}}} 1 {t + shift:.0f}")
    if zones:
        out.append(f"# TYPE {S.KUBE_NODE_LABELS} gauge")
        for node, label, zone in zones:
            for t in _times(T0, T0 + N * SAMPLE):
                out.append(f'{S.KUBE_NODE_LABELS}{{node="{node}",{label}="{zone}"}} 1 {t + shift:.0f}')
    out.append("# EOF")
    return "\n".join(out) + "\n"


def _util(fleet, host: str, gpu: str) -> list[float]:
    f = fleet.frame
    rows = f[(f["hostname"].astype(str) == host) & (f["gpu"].astype(str) == gpu)].sort_values("timestamp")
    return [round(v, 6) for v in rows["gpu_util"].to_numpy(dtype=float)]


def assert_nodes(fleet) -> None:
    """Hosts are nodes; node-a's GPUs hold one history each across the roll; values are the real ones."""
    f = fleet.frame
    assert sorted(set(f["hostname"].astype(str))) == ["node-a", "node-b"]
    assert sorted(set(zip(f["hostname"].astype(str), f["gpu"].astype(str), strict=True))) == [
        ("node-a", "0"), ("node-a", "1"), ("node-b", "0")]
    assert len(f) == 3 * 10 and fleet.start == T0 and fleet.step == STEP
    assert _util(fleet, "node-a", "0") == [0.2] * 5 + [0.8] * 5
    assert _util(fleet, "node-a", "1") == [0.1] * 5 + [0.9] * 5
    assert _util(fleet, "node-b", "0") == [0.5] * 10
    b = f[f["hostname"].astype(str) == "node-b"]
    assert set(b["pod"].astype(str)) == {"trainer-0"} and set(b["namespace"].astype(str)) == {"ml"}
    assert "host label held dcgm-exporter pod names; mapped 3 pods to 2 nodes via kube_pod_info" in fleet.notes
    assert not any("was missing" in n or "more than one node" in n for n in fleet.notes), fleet.notes
    # the nodes' zones are their sites (either zone label spelling)
    assert dict(zip(f["hostname"].astype(str), f["site"].astype(str), strict=True)) == {"node-a": "eu-1a",
                                                                                         "node-b": "eu-1b"}


def test_openmetrics_file_with_kube_pod_info_maps_pods_to_nodes(tmp_path: Path):
    path = tmp_path / "h.om"
    path.write_text(history())
    assert_nodes(load_files(path, step=STEP))


def test_without_kube_pod_info_pod_names_stay_and_the_note_says_so(tmp_path: Path):
    path = tmp_path / "h.om"
    path.write_text(history(pods=()))
    fleet = load_files(path, step=STEP)
    f = fleet.frame
    assert sorted(set(f["hostname"].astype(str))) == [OLD, NEW, OTHER]
    assert len(f) == 5 * 10  # the roll splits node-a: each pod is a host of its own
    assert _util(fleet, OLD, "0")[:5] == [0.2] * 5 and np.isnan(_util(fleet, OLD, "0")[5:]).all()
    assert np.isnan(_util(fleet, NEW, "0")[:5]).all() and _util(fleet, NEW, "0")[5:] == [0.8] * 5
    [note] = [n for n in fleet.notes if "dcgm-exporter pod names" in n]
    assert f"kube_pod_info was missing for them ({OLD}, {NEW}, {OTHER})" in note
    assert "DaemonSet rolls" in note and "mapped" not in note
    # kube_pod_info is read when present, never listed as a series the input lacks
    assert not any("absent" in n and "kube_pod_info" in n for n in fleet.notes)


def test_ambiguous_pod_takes_its_latest_node_and_others_still_map(tmp_path: Path):
    """OTHER listed on node-c early and node-b later -> node-b, said; NEW has no kube_pod_info -> kept, said."""
    pods = [p for p in PODS if p[0] != NEW] + [(OTHER, "node-c", T0, T0 + 90.0)]
    path = tmp_path / "h.om"
    path.write_text(history(pods=pods))
    fleet = load_files(path, step=STEP)
    f = fleet.frame
    assert sorted(set(f["hostname"].astype(str))) == [NEW, "node-a", "node-b"]
    assert _util(fleet, "node-b", "0") == [0.5] * 10
    assert _util(fleet, "node-a", "0")[:5] == [0.2] * 5 and _util(fleet, NEW, "0")[5:] == [0.8] * 5
    assert "host label held dcgm-exporter pod names; mapped 2 pods to 2 nodes via kube_pod_info" in fleet.notes
    assert any(f"kube_pod_info lists 1 dcgm-exporter pod on more than one node over the range ({OTHER} on "
               "node-b, node-c -> node-b)" in n for n in fleet.notes), fleet.notes
    assert any(f"kube_pod_info was missing for them ({NEW})" in n for n in fleet.notes), fleet.notes


def test_map_exporter_pods_per_series_values():
    info = pd.DataFrame({"pod": [OLD, OLD, "x"], "node": ["n1", "n2", "n3"], "timestamp": [2.0, 1.0, 0.0]})
    host = np.array([OLD, "plain-host", "", OLD, NEW], dtype=object)
    got, notes = map_exporter_pods(host, info)
    assert got.tolist() == ["n1", "plain-host", "", "n1", NEW]  # n1: the node of the latest sample
    assert len(notes) == 3
    same, none = map_exporter_pods(np.array(["h1", "h2"], dtype=object), info)
    assert same.tolist() == ["h1", "h2"] and none == []
    assert pod_info(pd.DataFrame({"metric": ["x"], "timestamp": [0.0], "value": [1.0]})).empty


def test_node_zones_latest_per_node_either_spelling_and_never_over_node_info(tmp_path: Path):
    cur, old = S.KUBE_NODE_ZONE_LABELS
    long = pd.DataFrame({"metric": [S.KUBE_NODE_LABELS] * 5 + ["x"], "timestamp": [1.0, 2.0, 1.0, 1.0, 3.0, 9.0],
                         "value": [1.0, 1.0, 1.0, 1.0, 0.0, 1.0], "node": ["a", "a", "b", "c", "c", "a"],
                         cur: ["z1", "z2", None, "", "z9", "zx"], old: [None, None, "zb", None, None, None]})
    assert hosts.node_zones(long) == {"a": "z2", "b": "zb"}  # c: no zone; a value 0 is no label
    assert hosts.node_zones(pd.DataFrame({"metric": ["x"], "timestamp": [0.0], "value": [1.0]})) == {}
    # truegpu's node info names a site: it wins over the zone
    path = tmp_path / "h.om"
    text = history().replace("# EOF\n", f'# TYPE {S.NODE_INFO.name} gauge\n'
                             f'{S.NODE_INFO.name}{{hostname="node-b",site="dc1",rack="r1"}} 1 {T0:.0f}\n# EOF\n')
    path.write_text(text)
    f = load_files(path, step=STEP).frame
    assert dict(zip(f["hostname"].astype(str), f["site"].astype(str), strict=True)) == {"node-a": "eu-1a",
                                                                                         "node-b": "dc1"}


def test_pod_info_query_escapes_and_matches_only_the_pods():
    q = pod_info_query([OLD, 'a"}) or vector(1) #'], 60.0)
    assert q == ('max by (pod, node) (last_over_time(kube_pod_info{pod=~"dcgm-exporter-wwwjh|'
                 'a\\"\\\\}\\\\) or vector\\\\(1\\\\) #"}[60s]))')


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory, promtool, prometheus_bin):
    """A real Prometheus with the history and kube_pod_info, and a day later the same GPU data
    without kube_pod_info (the first day's must not leak into the second day's mapping)."""
    tmp = tmp_path_factory.mktemp("prom-hosts")
    files = [tmp / "day1.om", tmp / "day2.om"]
    files[0].write_text(history())
    files[1].write_text(history(pods=(), shift=86_400.0, zones=()))
    with backfilled_prometheus(tmp, files, promtool, prometheus_bin) as url:
        yield url


def test_prometheus_maps_pods_to_nodes(prom_url, monkeypatch):
    monkeypatch.setattr(hosts, "QUERY_BATCH", 2)  # three pods: two kube_pod_info queries
    fleet = load_prometheus(prom_url, T0, T0 + 600.0, STEP)
    assert_nodes(fleet)


def test_prometheus_without_kube_pod_info_in_range_keeps_pod_names(prom_url):
    day = 86_400.0
    fleet = load_prometheus(prom_url, T0 + day, T0 + day + 600.0, STEP)
    assert sorted(set(fleet.frame["hostname"].astype(str))) == [OLD, NEW, OTHER]
    assert _util(fleet, NEW, "1")[5:] == [0.9] * 5
    assert any(f"kube_pod_info was missing for them ({OLD}, {NEW}, {OTHER})" in n for n in fleet.notes)
    assert set(fleet.frame["site"].astype(str)) == {""}  # day 2 has no kube_node_labels either
