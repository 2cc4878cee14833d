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
import contextlib
import ctypes
import gc
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analyzer.scores import compute_scores  # noqa: E402
from analyzer.simulated import fleet_from_cluster  # noqa: E402
from exporter.simulator import Cluster, load_scenario  # noqa: E402


def _status_mb(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024.0
    return float("nan")


def _reset_peak() -> bool:
    """Give freed heap back to the OS (glibc) and reset the peak, so the peak measures scoring."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")  # resets VmHWM (peak RSS) to the current RSS
        return True
    except OSError:
        return False


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes-per-rack", type=int, default=125)
    ap.add_argument("--racks", type=int, default=5)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    cluster = Cluster(load_scenario("healthy-fleet", nodes_per_rack=args.nodes_per_rack, racks=args.racks,
                                    duration=f"{args.hours * 3600:g}s"))
    fleet = fleet_from_cluster(cluster, step=15.0)
    n = len(fleet.frame)
    print(f"# {len(cluster.gpus)} GPUs, {n} rows, {len(fleet.frame.columns)} columns", file=sys.stderr)
    _reset_peak()
    print(f"fleet_rss_mb {_status_mb('VmRSS'):.0f}")
    best = float("inf")
    for _ in range(max(1, args.repeat)):
        t0 = time.perf_counter()
        scores = compute_scores(fleet)
        best = min(best, time.perf_counter() - t0)
        del scores
    print(f"scores_rows {n}")
    print(f"scores_seconds {best:.3f}")
    print(f"scores_rows_per_second {n / best:.0f}")
    print(f"scores_peak_rss_mb {_status_mb('VmHWM'):.0f}")


if __name__ == "__main__":
    main()
