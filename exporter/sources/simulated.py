"""Exporter source backed by the cluster simulator: one or more simulated nodes, live.

Virtual time runs at ``speed`` virtual seconds per wall-clock second from the moment the
source is created: ``vt = cluster.start + offset + (clock() - t0) * speed``. ``start``
is either an absolute Unix time (>= 1e8: scenario time 0 is moved there) or an offset in
seconds into the scenario (default 0). Past the scenario's end the scenario loops:
gauges repeat from its beginning while counters keep growing (they never go backwards,
as a real exporter's would not).

Virtual time is quantized to ``tick`` (1 s, like DCGM's default field update interval):
collections within one tick return the same values, computed once, so a busy scraper
costs almost nothing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence

import numpy as np

from exporter import schema as S
from exporter.schema import Metric
from exporter.simulator.model import INSTANCE_METRICS, PRODUCED, SAMPLE_SIGNALS, Cluster
from exporter.simulator.scenario import load_scenario
from exporter.simulator.topology import MODEL_KEYS, closest_link
from exporter.sources.base import Labels, Reading, Source, SourceError

_ABSOLUTE = 1e8


class SimulatedSource(Source):
    """Serves the simulated nodes ``hostnames`` (default all) of a scenario."""

    name = "simulated"
    tick: float = 1.0

    def __init__(self, scenario: str, hostnames: Sequence[str] | None = None, speed: float = 1.0,
                 start: float | None = None, seed: int | None = None, clock: Callable[[], float] = time.time):
        absolute = start is not None and start >= _ABSOLUTE
        self.cluster = Cluster(load_scenario(scenario), seed=seed, start=start if absolute else None)
        self.offset = 0.0 if start is None or absolute else float(start)
        try:
            self.rows = self.cluster.rows_for(hostnames if hostnames else None)
        except KeyError as e:
            raise ValueError(str(e.args[0])) from None
        self.speed = float(speed)
        self.clock = clock
        self.t0 = clock()
        self._cached: tuple[float, dict[Metric, list[tuple[Labels, float]]], list[SourceError]] | None = None
        self._plan()

    def _plan(self) -> None:
        """Precompute label dicts and column selections once, so collect() only computes values."""
        c, g, rows = self.cluster, self.cluster.gpus, self.rows
        dev = g.device_row[rows]
        self._dev_cols = np.flatnonzero(dev)
        base = [{S.HOSTNAME: str(g.hostname[r]), S.GPU: str(g.gpu[r]), S.UUID: str(g.uuid[r])} for r in rows]
        inst = [dict(b, **{S.GPU_INSTANCE: str(g.gpu_instance[r]), S.MIG_PROFILE: str(g.mig_profile[r])})
                if g.mig_profile[r] else b for b, r in zip(base, rows, strict=True)]
        self._col_phys = c.layout.row_phys[rows]
        self._gpu_of = [(str(g.hostname[r]), str(g.gpu[r])) for r in rows]
        plan: list[tuple] = []
        by_metric: dict[Metric, list[tuple[dict[str, str], str]]] = {}
        for m, lbl, key in SAMPLE_SIGNALS:
            by_metric.setdefault(m, []).append((lbl, key))
        all_cols = np.arange(len(rows))
        for m in S.METRICS:
            if m not in PRODUCED and m not in (S.NODE_INFO, S.GPU_INFO, S.GPU_TOPOLOGY_INFO):
                continue
            if m is S.NODE_INFO:
                hosts = list(dict.fromkeys(g.hostname[rows]))
                lay = c.layout
                plan.append((m, [("static", [({S.HOSTNAME: h, "site": lay.node_site[lay.nodes.index(h)],
                                                "rack": lay.node_rack[lay.nodes.index(h)]}, 1.0) for h in hosts])]))
            elif m is S.GPU_INFO:
                plan.append((m, [("perdev", [(col, [(dict(base[col], model=str(g.model[r]),
                                                             driver_version=str(g.driver_version[r]),
                                                             pci_bus_id=str(g.pci_bus_id[r]),
                                                             numa_node=str(g.numa_node[r])), 1.0)])
                                                 for col, r in enumerate(rows) if dev[col]])]))
            elif m is S.GPU_TOPOLOGY_INFO:
                entries = []
                for col, r in enumerate(rows):
                    if dev[col]:
                        gi, model = int(g.gpu[r]), MODEL_KEYS[c.layout.row_model[r]]
                        npg = c.layout.node_gpus[c.layout.row_node[r]]
                        entries.append((col, [(dict(base[col], peer_gpu=str(p), link=closest_link(model, gi, p)), 1.0)
                                              for p in range(npg) if p != gi]))
                plan.append((m, [("perdev", entries)]))
            elif m is S.GPU_ALLOCATION_INFO:
                al = c.allocation_labels
                cols = np.array([col for col, r in enumerate(rows) if al[r] is not None], np.int64)
                plan.append((m, [("signal", m.name, cols, [dict(inst[col], **al[rows[col]]) for col in cols])]))
            else:
                per_inst = m in INSTANCE_METRICS
                cols = all_cols if per_inst else self._dev_cols
                plan.append((m, [("signal", key, cols, [dict((inst if per_inst else base)[col], **lbl)
                                                        for col in cols]) for lbl, key in by_metric[m]]))
        self._plan_entries = plan

    def virtual_time(self) -> float:
        """Current virtual Unix time (before quantization to ``tick``)."""
        return self.cluster.start + self.offset + (self.clock() - self.t0) * self.speed

    def collect(self) -> Reading:
        rel = self.virtual_time() - self.cluster.start
        q = self.cluster.start + math.floor(rel / self.tick) * self.tick
        if self._cached is None or self._cached[0] != q:
            self._cached = (q, *self._compute(q))
        _, samples, errors = self._cached
        reading = Reading({m: list(v) for m, v in samples.items()}, list(errors))
        reading.up = not errors
        return reading

    def _compute(self, t: float) -> tuple[dict[Metric, list[tuple[Labels, float]]], list[SourceError]]:
        vals = self.cluster.sample(np.array([t]), self.rows, wrap=True)
        lost_cols = np.isnan(vals[S.POWER.name][0])
        errors = []
        if lost_cols.any():
            for col in self._dev_cols[lost_cols[self._dev_cols]]:
                host, gpu = self._gpu_of[col]
                errors.append(SourceError("gpu_lost", f"GPU {gpu} on {host} is lost (XID 79, fallen off the bus)", gpu))
        samples: dict[Metric, list[tuple[Labels, float]]] = {}
        for m, entries in self._plan_entries:
            out: list[tuple[Labels, float]] = []
            for entry in entries:
                kind = entry[0]
                if kind == "signal":
                    _, key, cols, labels = entry
                    v = vals[key][0][cols]
                    if np.isnan(v).any():  # lost GPU, or not supported (MIG utilization): omitted
                        out.extend((lb, x) for lb, x in zip(labels, v.tolist(), strict=True) if x == x)
                    else:
                        out.extend(zip(labels, v.tolist(), strict=True))
                elif kind == "static":
                    out.extend(entry[1])
                else:
                    for col, lbls in entry[1]:
                        if not lost_cols[col]:
                            out.extend(lbls)
            if out:
                samples[m] = out
        return samples, errors
