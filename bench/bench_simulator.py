"""Benchmark of the cluster simulator. Prints plain number lines:

    simulator_values_per_second N       Cluster.sample, 10,000 GPUs x 1 h at 15 s (target >= 5 M/s)
    simulator_sample_seconds N          wall time of that sample() call (after building the cluster)
    simulator_build_seconds N           Cluster() + counter grid for that fleet
    simulated_collect_microseconds N    SimulatedSource.collect() of one 8-GPU node, new tick each call
    simulated_collect_cached_microseconds N   the same within one tick (what a busy scraper sees)

    .venv/bin/python bench/bench_simulator.py [--gpus 10000] [--rounds 200]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.simulator import Cluster, load_scenario  # noqa: E402
from exporter.sources.simulated import SimulatedSource  # noqa: E402


def bench_sample(gpus: int) -> None:
    # healthy-fleet has 2 sites x racks x nodes_per_rack nodes of 8 GPUs; scale racks and nodes
    nodes = max(1, gpus // 8)
    racks = max(1, round((nodes / 2) ** 0.5))
    per_rack = max(1, round(nodes / 2 / racks))
    t0 = time.perf_counter()
    c = Cluster(load_scenario("healthy-fleet", racks=racks, nodes_per_rack=per_rack, duration="1h"))
    c._grid_cum()  # counters' integration grid, built once per cluster
    t1 = time.perf_counter()
    times = c.start + np.arange(0.0, 3600.0, 15.0)
    table = c.sample(times)
    t2 = time.perf_counter()
    values = sum(v.size for v in table.values())
    print(f"# {len(c.gpus)} GPUs x {len(times)} times x {len(table)} signals = {values} values", file=sys.stderr)
    print(f"simulator_build_seconds {t1 - t0:.3f}")
    print(f"simulator_sample_seconds {t2 - t1:.3f}")
    print(f"simulator_values_per_second {values / (t2 - t1):.0f}")


def bench_collect(rounds: int) -> None:
    now = [0.0]
    src = SimulatedSource("healthy-fleet", hostnames=["dc1-r1-n01"], clock=lambda: now[0])
    src.collect()
    fresh, cached = [], []
    for _ in range(rounds):
        now[0] += 1.0  # a new virtual second: values are computed
        t0 = time.perf_counter()
        src.collect()
        t1 = time.perf_counter()
        src.collect()  # same tick: served from the tick cache
        t2 = time.perf_counter()
        fresh.append(t1 - t0)
        cached.append(t2 - t1)
    print(f"simulated_collect_microseconds {statistics.median(fresh) * 1e6:.0f}")
    print(f"simulated_collect_cached_microseconds {statistics.median(cached) * 1e6:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=10_000)
    ap.add_argument("--rounds", type=int, default=200)
    args = ap.parse_args()
    bench_sample(args.gpus)
    bench_collect(args.rounds)


if __name__ == "__main__":
    main()
