"""Benchmark: effective-utilization scores on a 10,000-GPU fleet. Prints plain number lines:

    scores_rows N                   frame rows scored (10,000 GPUs x 1 h at 15 s = 2.4 M)
    scores_seconds N                compute_scores wall time: row scores, every level's aggregates
                                    (all GPUs and allocated only) and bottlenecks per job and per GPU
    scores_rows_per_second N
    scores_peak_rss_mb N            peak RSS during compute_scores (peak reset after building the fleet
                                    where Linux allows it; otherwise the process peak)
    fleet_rss_mb N                  RSS with the fleet built, before scoring

    .venv/bin/python bench/bench_scores.py [--nodes-per-rack 125] [--racks 5] [--hours 1] [--repeat 2]

healthy-fleet has 2 sites x racks x nodes_per_rack nodes of 8 GPUs: 125 x 5 gives 10,000 GPUs.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analyzer.analysis.partition import attach  # noqa: E402
from analyzer.analysis.scores import compute_scores  # noqa: E402
from analyzer.data.simulated import fleet_from_cluster  # noqa: E402
from analyzer.detectors import run_detectors  # noqa: E402
from bench.benchutil import status_mb  # noqa: E402
from exporter.simulator import Cluster, load_scenario  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes-per-rack", type=int, default=125)
    ap.add_argument("--racks", type=int, default=5)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    cluster = Cluster(load_scenario("healthy-fleet", nodes_per_rack=args.nodes_per_rack, racks=args.racks,
                                    duration=f"{args.hours * 3600:g}s"))
    t0 = time.perf_counter()
    fleet = fleet_from_cluster(cluster, step=15.0)
    build = time.perf_counter() - t0
    n = len(fleet.frame)
    print(f"# {len(cluster.gpus)} GPUs", file=sys.stderr)
    best_scores = best_detect = best_split = float("inf")
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        scores = compute_scores(fleet)
        t1 = time.perf_counter()
        findings = run_detectors(fleet)
        t2 = time.perf_counter()
        attach(scores, fleet, findings)  # the GPU-hour partition analyze prints (analyzer.analysis.partition)
        t3 = time.perf_counter()
        best_scores, best_detect = min(best_scores, t1 - t0), min(best_detect, t2 - t1)
        best_split = min(best_split, t3 - t2)
        del scores
    print(f"analyze_rows {n}")
    print(f"analyze_signals {len(fleet.signals)}")
    print(f"fleet_build_seconds {build:.3f}")
    print(f"scores_seconds {best_scores:.3f}")
    print(f"detectors_seconds {best_detect:.3f}")
    print(f"partition_seconds {best_split:.3f}")
    print(f"analyze_seconds {best_scores + best_detect + best_split:.3f}")
    print(f"analyze_peak_rss_mb {status_mb('VmHWM'):.0f}")


if __name__ == "__main__":
    main()
