"""Benchmark: `analyze` end to end from a REAL Prometheus. Prints plain number lines per fleet size:

    prometheus_backfill_seconds N       setup, excluded from the rest: simulate the history file,
                                        promtool backfill, start the server
    e2e_prometheus_gpus N
    e2e_prometheus_seconds N            load_prometheus + pipeline.analyze, wall time
    e2e_prometheus_peak_rss_mb N        peak RSS of the (fresh) process that did it
    e2e_prometheus_mb_per_gpu_hour N

    .venv/bin/python bench/bench_prometheus.py [--gpus 256,1000] [--hours 1] [--step 15] [--code DIR]

The fleet is healthy-fleet rescaled to 8-GPU nodes (so 256, the nearest to 250) at a 15 s scrape,
analyzed at ``--step`` (15 s: every sample). The measured part runs in a child process so its peak
is not the setup's. ``--code DIR`` measures the analyzer in DIR too, against the same server,
right after (e.g. ``git archive HEAD | tar -x -C DIR`` for a before/after): its lines follow
``# code DIR`` on stderr. Other work on the machine makes the seconds noisy; compare side by side.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
#: The child measures the analyzer found here (ROOT unless --code gave another tree).
CODE = Path(os.environ.get("TRUEGPU_BENCH_CODE", ROOT))
for path in (ROOT, CODE):  # CODE ends up first
    if str(path) not in sys.path:
        sys.path.insert(0, str(path))

SCRAPE = 15.0


def measure(url: str, start: float, end: float, step: float, gpus: int) -> None:
    """The measured part (in the child): read and analyze, then print the numbers."""
    from analyzer.data.load import load_prometheus
    from analyzer.pipeline import analyze
    from bench.benchutil import status_mb

    t0 = time.perf_counter()
    fleet = load_prometheus(url, start, end, step, timeout=600.0)
    result = analyze(fleet)
    seconds = time.perf_counter() - t0
    assert fleet.gpu_count() == gpus, (fleet.gpu_count(), gpus)
    peak = status_mb("VmHWM")
    print(f"e2e_prometheus_gpus {gpus}")
    print(f"e2e_prometheus_seconds {seconds:.2f}")
    print(f"e2e_prometheus_peak_rss_mb {peak:.0f}")
    print(f"e2e_prometheus_mb_per_gpu_hour {peak / (gpus * (end - start) / 3600):.3f}")
    print(f"# {len(fleet.frame):,} rows, {len(result.findings)} findings", file=sys.stderr)


def run(gpus: int, hours: float, step: float, codes: list[Path]) -> None:
    from bench.benchutil import healthy_cluster, simulated_prometheus

    sim = healthy_cluster(gpus, hours * 3600 + SCRAPE)
    n = len(sim.gpus)
    start, end = sim.start, sim.start + hours * 3600
    with tempfile.TemporaryDirectory(prefix="bench-prometheus-") as tmp:
        t0 = time.perf_counter()
        with simulated_prometheus(sim, start, end + SCRAPE, SCRAPE, Path(tmp)) as url:
            print(f"prometheus_backfill_seconds {time.perf_counter() - t0:.1f}", flush=True)
            for code in codes:
                print(f"# code {code}", file=sys.stderr, flush=True)
                env = {**os.environ, "TRUEGPU_BENCH_CODE": str(code)}
                subprocess.run([sys.executable, __file__, "--measure", url, repr(start), repr(end), repr(step),
                                str(n)], check=True, env=env)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="256,1000", help="fleet sizes, comma-separated (default 256,1000)")
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--step", type=float, default=15.0, help="analysis step in seconds (default 15)")
    ap.add_argument("--code", type=Path, action="append", default=[],
                    help="also measure the analyzer in this source tree (repeatable)")
    ap.add_argument("--measure", nargs=5, metavar=("URL", "START", "END", "STEP", "GPUS"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        url, start, end, step, gpus = args.measure
        measure(url, float(start), float(end), float(step), int(gpus))
        return
    for gpus in (int(g) for g in args.gpus.split(",")):
        run(gpus, args.hours, args.step, [ROOT, *(c.resolve() for c in args.code)])


if __name__ == "__main__":
    main()
