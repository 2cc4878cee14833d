"""Benchmark: a 30-day effective-cost report for ~1,000 GPUs. Prints plain number lines:

    report_gpus N                   GPUs in the fleet (healthy-fleet: 2 sites x racks x nodes x 8)
    report_rows N                   frame rows (GPUs x 30 days at the long-window step, 300 s)
    report_fleet_build_seconds N    simulating the fleet in memory (not part of a user's report)
    report_seconds N                scores + the detectors the split reads + the cost report
    report_fleet_rss_mb N           RSS with the simulated fleet built, before the report
    report_peak_rss_mb N            peak RSS while reporting (the peak is reset after simulating where Linux
                                    allows it: /proc/self/clear_refs; otherwise the process peak)

IN MEMORY: the fleet comes from the simulator, not from a file or a Prometheus (30 days of
1,000 GPUs is ~300 M samples, too much to backfill here); the end-to-end 30-day path reads
daily rollups (issue 15). The work budget (analyzer.data.budget) admits this request: 8.8 M rows.

    .venv/bin/python bench/bench_report.py [--nodes-per-rack 16] [--racks 4] [--days 30] [--step 300]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analyzer.analysis.scores import compute_scores  # noqa: E402
from analyzer.data.budget import check_rows, check_window  # noqa: E402
from analyzer.data.simulated import fleet_from_cluster  # noqa: E402
from analyzer.detectors import run_detectors  # noqa: E402
from analyzer.finops.catalog import default_catalog  # noqa: E402
from analyzer.finops.costs import COST_FINDING_KINDS, cost_report  # noqa: E402
from bench.benchutil import reset_peak, status_mb  # noqa: E402
from exporter.simulator import Cluster, load_scenario  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--nodes-per-rack", type=int, default=16)
    ap.add_argument("--racks", type=int, default=4)
    ap.add_argument("--days", type=float, default=30.0)
    ap.add_argument("--step", type=float, default=300.0)
    args = ap.parse_args()
    seconds = args.days * 86400.0
    cluster = Cluster(load_scenario("healthy-fleet", nodes_per_rack=args.nodes_per_rack, racks=args.racks,
                                    duration=f"{int(seconds)}s"))
    steps = check_window(cluster.start, cluster.start + seconds, args.step)
    check_rows(len(cluster.gpus), steps, args.step)
    t0 = time.perf_counter()
    fleet = fleet_from_cluster(cluster, step=args.step)
    build = time.perf_counter() - t0
    fleet_rss = status_mb("VmRSS")
    reset_peak()  # what matters is the report's peak, not the simulation's
    t0 = time.perf_counter()
    scores = compute_scores(fleet)
    findings = run_detectors(fleet, list(COST_FINDING_KINDS))
    report = cost_report(fleet, scores, findings, default_catalog(), group_by="namespace")
    took = time.perf_counter() - t0
    print(f"report_gpus {len(cluster.gpus)}")
    print(f"report_rows {len(fleet.frame)}")
    print(f"report_fleet_build_seconds {build:.1f}")
    print(f"report_seconds {took:.1f}")
    print(f"report_fleet_rss_mb {fleet_rss:.0f}")
    print(f"report_peak_rss_mb {status_mb('VmHWM'):.0f}")
    print(f"# total cost {report.totals['cost']:,.0f} {report.currency}", file=sys.stderr)


if __name__ == "__main__":
    main()
