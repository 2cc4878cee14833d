"""A Fleet straight from the simulator's in-memory table, without text in between.

The demo, the evaluation harness and the benchmarks analyze simulated fleets of up to
10,000 GPUs; going through OpenMetrics text would measure the parser, not the analysis.
The result must equal what normalize() makes of the same cluster's history file (a test
holds the two paths together).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.data.coverage import hold_allocations
from analyzer.data.frame import EVENT_COLUMNS, SHARE_COLUMNS, TOPOLOGY_COLUMNS, Fleet, gpu_share
from analyzer.data.mig import with_uncarved
from analyzer.data.signals import ALLOCATION_COLUMNS, ALLOCATION_LABELS, SIGNALS, Signal
from exporter import schema as S
from exporter.simulator.model import SAMPLE_SIGNALS, Cluster
from exporter.simulator.topology import MODEL_KEYS, closest_link


def _keys(signal: Signal) -> list[str]:
    """The simulator table keys feeding ``signal`` (one per accepted label combination); none for a signal
    truegpu does not publish (the simulated fleet is truegpu's)."""
    if not signal.in_truegpu:
        return []
    out = []
    for metric, labels, key in SAMPLE_SIGNALS:
        if metric is signal.metric and all(labels.get(k) in values for k, values in signal.labels):
            out.append(key)
    return out


def _combine(signal: Signal, arrays: list[np.ndarray]) -> np.ndarray:
    stack = np.stack(arrays)
    known = ~np.isnan(stack).all(axis=0)
    if signal.kind == "flag":
        return np.where(known, np.nanmax(np.where(np.isnan(stack), -np.inf, stack), axis=0), np.nan)
    return np.where(known, np.nansum(stack, axis=0), np.nan)


def fleet_from_cluster(
    cluster: Cluster, start: float | None = None, end: float | None = None, step: float = 15.0
) -> Fleet:
    """Normalized telemetry of ``cluster`` over ``[start, end)`` sampled every ``step`` seconds."""
    start = cluster.start if start is None else float(start)
    end = start + cluster.duration if end is None else float(end)
    times = np.arange(start, end, step, dtype=float)
    # One extra sample so counters give a rate for the last interval too.
    table = cluster.sample(np.append(times, times[-1] + step) if len(times) else times)
    T, g = len(times), cluster.gpus
    # Device order (hostname, gpu index, instance) fixed once on N rows; rows are then laid
    # out device-major, so the frame is born sorted and never sorts millions of rows.
    gi = np.array([int(x) if x else -1 for x in g.gpu_instance])
    order = np.lexsort((gi, g.gpu.astype(int), g.hostname))
    n = len(order)

    def per_row(values: np.ndarray) -> np.ndarray:
        """(T, N) in cluster row order -> one value per frame row (device-major, then time)."""
        return np.ascontiguousarray(values[:, order].T).reshape(-1)

    def categorical(values: np.ndarray) -> pd.Categorical:
        cats, codes = np.unique(values[order].astype(str), return_inverse=True)
        return pd.Categorical.from_codes(np.repeat(codes, T), cats)

    cols: dict[str, object] = {"timestamp": np.tile(times, n)}
    for name in ("hostname", "gpu", "uuid", "gpu_instance", "mig_profile", "model", "site", "rack"):
        cols[name] = categorical(getattr(g, name))
    cols["gpu_share"] = np.repeat(np.array([gpu_share(p) for p in g.mig_profile])[order], T)

    held = ~np.isnan(table[S.GPU_ALLOCATION_INFO.name][:T])  # (T, N)
    alloc = cluster.allocation_labels
    for col in ALLOCATION_COLUMNS:
        label = ALLOCATION_LABELS[col]
        cats = sorted({a[label] for a in alloc if a and a[label]})
        index = {c: i for i, c in enumerate(cats)}
        code = np.array([index.get(a[label], -1) if a else -1 for a in alloc])
        cols[col] = pd.Categorical.from_codes(per_row(np.where(held, code[None, :], -1)), cats)

    for signal in SIGNALS:
        keys = _keys(signal)
        if not keys:
            continue
        if signal.kind == "rate":
            arrays = [np.diff(table[k], axis=0) / step for k in keys]
        else:
            arrays = [table[k][:T] for k in keys]
        cols[signal.name] = per_row(_combine(signal, arrays))

    frame = with_uncarved(hold_allocations(pd.DataFrame(cols)))
    return Fleet(
        frame=frame, step=float(step), start=start, end=start + T * step,
        events=_xid_events(cluster, table, times, step), topology=_topology(cluster),
        shares=_shares(cluster, table, times), dialect="truegpu",
    )


def _shares(cluster: Cluster, table: dict[str, np.ndarray], times: np.ndarray) -> pd.DataFrame:
    """The sharer rows of the cluster's shared GPUs (Fleet.shares), as normalize reads them from the series."""
    T, g = len(times), cluster.gpus
    data = {k: table[k][:T] for k in (S.GPU_ALLOCATION_INFO.name, S.GPU_UTILIZATION.name, S.MEMORY_USED.name)}
    parts = []
    for c, labels, util, mem in cluster.sharer_series(data, np.arange(len(g.hostname))):
        held = ~np.isnan(util)
        parts.append(pd.DataFrame({
            "timestamp": times[held], "hostname": str(g.hostname[c]), "gpu": str(g.gpu[c]),
            **{col: labels[ALLOCATION_LABELS[col]] for col in ALLOCATION_COLUMNS}, "utilization": util[held],
            "memory": mem[held],
        }))  # fmt: skip
    if not parts:
        return pd.DataFrame(columns=list(SHARE_COLUMNS))
    return pd.concat(parts, ignore_index=True)[list(SHARE_COLUMNS)]


def _xid_events(cluster: Cluster, table: dict[str, np.ndarray], times: np.ndarray, step: float) -> pd.DataFrame:
    g = cluster.gpus
    parts = []
    for metric, labels, key in SAMPLE_SIGNALS:
        if metric is not S.XID_ERRORS:
            continue
        counts = np.diff(np.nan_to_num(table[key]), axis=0)  # (T, N) events per interval
        t_idx, rows = np.nonzero((counts > 0) & g.device_row[None, :])
        if len(rows):
            parts.append(pd.DataFrame({
                "timestamp": times[t_idx], "hostname": g.hostname[rows].astype(str), "gpu": g.gpu[rows].astype(str),
                "uuid": g.uuid[rows].astype(str), "xid": labels["xid"], "count": counts[t_idx, rows],
            }))
    if not parts:
        return pd.DataFrame(columns=list(EVENT_COLUMNS))
    return pd.concat(parts, ignore_index=True).sort_values(["timestamp", "hostname", "gpu"], ignore_index=True)


def _topology(cluster: Cluster) -> pd.DataFrame:
    g, lay = cluster.gpus, cluster.layout
    rows = []
    for r in np.nonzero(g.device_row)[0]:
        gi, model = int(g.gpu[r]), MODEL_KEYS[lay.row_model[r]]
        for peer in range(lay.node_gpus[lay.row_node[r]]):
            if peer != gi:
                rows.append((str(g.hostname[r]), str(gi), str(peer), closest_link(model, gi, peer)))
    return pd.DataFrame(rows, columns=list(TOPOLOGY_COLUMNS))
