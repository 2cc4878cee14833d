"""dcgm-exporter pod names in the host label -> the Kubernetes nodes they ran on.

Some dcgm-exporter installs put their own pod name (``nvidia-dcgm-exporter-7xk2p``,
``exporter.schema.DCGM_EXPORTER_POD``) in ``Hostname``/``hostname`` instead of the node's,
so a node's history, rack findings and node stragglers split whenever the DaemonSet rolls.
kube-state-metrics' ``kube_pod_info{pod, node}`` names the node of every pod: the loaders
bring its series into the long frame (a file that holds them, or ``query_pod_info`` against
Prometheus), and normalize calls ``map_exporter_pods`` on its per-series host values.

A pod never moves between nodes, so each pod name maps to one node, and the old and new pod
of a roll both map to the same node: their series join into one node history. A pod name
listed on several nodes over the range (a reused name, two clusters in one query) takes the
node of its latest sample and is named in a note; pods without kube_pod_info keep their name.

Where a node is: kube-state-metrics' ``kube_node_labels`` with the zone label allowlisted gives
each node's zone (``node_zones``), the node's site where no truegpu node info names one, so a
dcgm-exporter fleet's training jobs split across zones are found too.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from analyzer.data import dialects as D
from analyzer.data.ingest import IngestReport, PrometheusClient
from analyzer.data.ingest._common import FrameBuilder
from analyzer.data.ingest.prometheus import duration, selector
from exporter.schema import (
    DCGM_EXPORTER_POD,
    KUBE_NODE_LABELS,
    KUBE_NODE_LABELS_NODE,
    KUBE_NODE_ZONE_LABELS,
    KUBE_POD_INFO,
    KUBE_POD_INFO_NODE,
    KUBE_POD_INFO_POD,
)

#: Pod names per kube_pod_info query: keeps the regex matcher well under server limits.
QUERY_BATCH = 500
_INFO_COLUMNS = (KUBE_POD_INFO_POD, KUBE_POD_INFO_NODE, "timestamp")


def exporter_pods(values: Iterable[str]) -> list[str]:
    """The distinct values that are dcgm-exporter pod names, sorted (a loop per distinct value)."""
    return sorted(v for v in set(values) if isinstance(v, str) and DCGM_EXPORTER_POD.fullmatch(v))


def host_values(long: pd.DataFrame) -> list[str]:
    """Distinct host label values of a long ingest frame (every spelling), without per-sample strings."""
    out: set[str] = set()
    for name in D.LABEL_ALIASES["hostname"]:
        if name not in long.columns:
            continue
        col = long[name]
        if isinstance(col.dtype, pd.CategoricalDtype):
            codes = np.asarray(col.cat.codes)
            used = np.unique(codes[codes >= 0])
            out.update(map(str, col.cat.categories[used]))
        else:
            out.update(str(v) for v in pd.unique(col.dropna()))
    return sorted(out)


def pod_info_query(pods: Iterable[str], window: float) -> str:
    """PromQL: per step, the (pod, node) pairs kube-state-metrics listed for ``pods`` within ``window``."""
    sel = selector(KUBE_POD_INFO, {KUBE_POD_INFO_POD: list(pods)})
    return f"max by ({KUBE_POD_INFO_POD}, {KUBE_POD_INFO_NODE}) (last_over_time({sel}[{duration(window)}]))"


def query_pod_info(
    client: PrometheusClient, pods: Iterable[str], start: float, end: float, step: float
) -> tuple[pd.DataFrame, IngestReport]:
    """kube_pod_info of ``pods`` over [start, end] every ``step`` s, as long-frame rows (metric, timestamp,
    value, pod, node) that normalize turns into the host mapping; one query per QUERY_BATCH pods."""
    pods = sorted(set(pods))
    return _query_info(client, KUBE_POD_INFO, [pod_info_query(pods[first:first + QUERY_BATCH], step)
                                               for first in range(0, len(pods), QUERY_BATCH)], start, end, step)


def query_node_zones(client: PrometheusClient, start: float, end: float, step: float) -> tuple[pd.DataFrame,
                                                                                               IngestReport]:
    """kube_node_labels' zones over [start, end] every ``step`` s, as long-frame rows (one series per node
    and zone: small); none where kube-state-metrics does not export the zone."""
    by = ", ".join((KUBE_NODE_LABELS_NODE, *KUBE_NODE_ZONE_LABELS))
    promql = f"max by ({by}) (last_over_time({KUBE_NODE_LABELS}[{duration(step)}]))"
    return _query_info(client, KUBE_NODE_LABELS, [promql], start, end, step)


def _query_info(client: PrometheusClient, metric: str, queries: list[str], start: float, end: float,
                step: float) -> tuple[pd.DataFrame, IngestReport]:
    report = IngestReport()
    builder = FrameBuilder(report)
    for promql in queries:
        report.queries.setdefault(metric, promql)
        result = client.query_range(promql, start, end, step)
        report.warnings.extend(f"{metric}: {w}" for w in result.warnings)
        for labels, ts, vals in result.series:
            sid = builder.series_id(metric, labels.items())
            builder.add(np.full(len(ts), sid, dtype=np.int64), ts, vals)
    return builder.build(), report


def pod_info(long: pd.DataFrame) -> pd.DataFrame:
    """The kube_pod_info samples of a long frame as (pod, node, timestamp) rows; empty when it has none."""
    empty = pd.DataFrame({c: pd.Series(dtype=object if c != "timestamp" else float) for c in _INFO_COLUMNS})
    needed = ("metric", "timestamp", "value", KUBE_POD_INFO_POD, KUBE_POD_INFO_NODE)
    if any(c not in long.columns for c in needed):
        return empty
    metric = long["metric"]
    if isinstance(metric.dtype, pd.CategoricalDtype) and KUBE_POD_INFO not in metric.cat.categories:
        return empty  # the common case, decided without a pass over the samples
    sel = np.asarray(metric == KUBE_POD_INFO, dtype=bool)
    if not sel.any():
        return empty
    rows = long.loc[sel, [KUBE_POD_INFO_POD, KUBE_POD_INFO_NODE, "timestamp", "value"]]
    rows = rows[(rows["value"] > 0) & rows[KUBE_POD_INFO_POD].notna() & rows[KUBE_POD_INFO_NODE].notna()]
    return pd.DataFrame({
        KUBE_POD_INFO_POD: rows[KUBE_POD_INFO_POD].astype(str).to_numpy(dtype=object),
        KUBE_POD_INFO_NODE: rows[KUBE_POD_INFO_NODE].astype(str).to_numpy(dtype=object),
        "timestamp": rows["timestamp"].to_numpy(dtype=np.float64),
    })  # fmt: skip


def map_exporter_pods(host: np.ndarray, info: pd.DataFrame) -> tuple[np.ndarray, list[str]]:
    """Replace every dcgm-exporter pod name in ``host`` (per-series values) by its node from ``info``
    (``pod_info``'s rows); return the new values and notes saying what was mapped and what was not."""
    pods = exporter_pods(host)
    if not pods:
        return host, []
    info = info[info[KUBE_POD_INFO_POD].isin(pods)]
    # the node of each pod's latest sample (ties: the last node name, so the answer is deterministic)
    latest = info.sort_values(["timestamp", KUBE_POD_INFO_NODE], kind="stable").groupby(KUBE_POD_INFO_POD)[
        KUBE_POD_INFO_NODE].last()
    pairs = info.drop_duplicates([KUBE_POD_INFO_POD, KUBE_POD_INFO_NODE])
    counts = pairs[KUBE_POD_INFO_POD].value_counts()
    multi = pairs[pairs[KUBE_POD_INFO_POD].isin(counts.index[counts > 1])]
    ambiguous = multi.groupby(KUBE_POD_INFO_POD)[KUBE_POD_INFO_NODE].agg(sorted)  # a call per ambiguous pod
    notes = []
    if len(latest):
        notes.append(
            f"host label held dcgm-exporter pod names; mapped {_count(len(latest), 'pod')} to "
            f"{_count(latest.nunique(), 'node')} via {KUBE_POD_INFO}"
        )
    if len(ambiguous):
        listed = "; ".join(f"{pod} on {', '.join(nodes)} -> {latest[pod]}"
                           for pod, nodes in list(ambiguous.items())[:3])
        more = f" and {len(ambiguous) - 3} more" if len(ambiguous) > 3 else ""
        notes.append(
            f"{KUBE_POD_INFO} lists {_count(len(ambiguous), 'dcgm-exporter pod')} on more than one node over the "
            f"range ({listed}{more}): each mapped to the node of its latest sample"
        )
    unmapped = [p for p in pods if p not in latest.index]
    if unmapped:
        more = f" and {len(unmapped) - 3} more" if len(unmapped) > 3 else ""
        notes.append(
            f"the host label holds dcgm-exporter pod names, not nodes, and {KUBE_POD_INFO} was missing for them "
            f"({', '.join(unmapped[:3])}{more}): a node's history splits whenever the DaemonSet rolls; run "
            "dcgm-exporter with the node name (NODE_NAME from the downward API), relabel the host in Prometheus, "
            f"or keep kube-state-metrics' {KUBE_POD_INFO} in the same source"
        )
    mapped = pd.Series(host, dtype=object).map(latest).to_numpy(dtype=object)
    found = pd.notna(mapped)
    return np.where(found, mapped, host).astype(object), notes


def node_zones(long: pd.DataFrame) -> dict[str, str]:
    """node -> zone of the kube_node_labels samples of a long frame (a node's latest zone); empty when none."""
    zone = [c for c in KUBE_NODE_ZONE_LABELS if c in long.columns]
    if not zone or any(c not in long.columns for c in ("metric", "timestamp", "value", KUBE_NODE_LABELS_NODE)):
        return {}
    rows = long.loc[np.asarray(long["metric"] == KUBE_NODE_LABELS, dtype=bool)]
    value = rows[zone[0]].astype(object).where(rows[zone[0]].notna(), "")
    for c in zone[1:]:  # the older spelling where the current one is empty
        value = value.where(value != "", rows[c].astype(object).where(rows[c].notna(), ""))
    keep = (rows["value"] > 0).to_numpy() & (value != "").to_numpy() & rows[KUBE_NODE_LABELS_NODE].notna().to_numpy()
    table = pd.DataFrame({"node": rows[KUBE_NODE_LABELS_NODE].astype(str).to_numpy()[keep],
                          "zone": value.astype(str).to_numpy()[keep], "t": rows["timestamp"].to_numpy()[keep]})
    return table.sort_values(["t", "zone"], kind="stable").groupby("node")["zone"].last().to_dict()


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


__all__ = ["QUERY_BATCH", "exporter_pods", "host_values", "map_exporter_pods", "node_zones", "pod_info",
           "pod_info_query", "query_node_zones", "query_pod_info"]
