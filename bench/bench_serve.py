"""Benchmark: `serve` ticks against a REAL Prometheus, incremental window vs full reload, side by side.

Replays ``--ticks`` ticks of the service loop (AnalyzerService.run_once: load, score, detect,
publish) on a virtual clock, one tick per ``--interval``, over a backfilled fleet, and prints per
fleet size:

    serve_backfill_seconds N             setup, excluded: simulate the history, promtool backfill
    serve_gpus N
    serve_tick_seconds_p50 N             incremental window (what `truegpu serve` runs)
    serve_tick_seconds_max N             (the first tick loads the whole window)
    serve_rss_mb_first N                 RSS after the first and the last tick
    serve_rss_mb_last N
    serve_full_loads N                   ticks that loaded the whole window (1: only the first)
    serve_full_reload_tick_seconds_p50 N the same ticks re-reading the whole window each time
    serve_full_reload_tick_seconds_max N
    serve_full_reload_rss_mb_first N
    serve_full_reload_rss_mb_last N

and with ``--shard I/N`` the same for that shard's replica (``serve --shard``: its reads kept between
ticks, analyzer.data.shard.KeptReads), prefixed ``serve_shard_`` and ``serve_shard_full_reload_``, with
``serve_shard_gpus`` (the GPUs it owns) and ``serve_shard_full_loads`` (its reads' whole-window loads).

    .venv/bin/python bench/bench_serve.py [--gpus 256,1000] [--ticks 100] [--full-ticks 100] [--shard I/N]
                                          [--baseline DIR]

The fleet is healthy-fleet rescaled to 8-GPU nodes (256 is the nearest to 250) scraped every
``--scrape`` s; the service analyzes the default 30-minute window at a 60 s step every 60 s. The
history (window + ticks) is written and backfilled in 10-minute pieces, so ``--gpus 10000`` fits
on disk. Each mode runs in its own child process (its RSS is its own). Other work on the machine
makes the seconds noisy: compare the two modes of one run, or with ``--baseline DIR`` another checkout's
ticks on the same Prometheus (lines prefixed ``baseline_``).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

WINDOW = 1800.0
STEP = 60.0


def measure(url: str, start: float, interval: float, ticks: int, mode: str, gpus: int, shard: str) -> None:
    """The measured part (in the child): ``ticks`` service runs, then the numbers."""
    from analyzer.data.shard import KeptReads, Shard, shard_loader
    from analyzer.data.window import WindowLoader
    from analyzer.service import AnalyzerService, prometheus_loader
    from bench.benchutil import status_mb

    incremental = mode == "incremental"  # as serve runs: its ticks' loader keeps the series' label sets
    kept = KeptReads() if incremental and shard else None
    if shard:
        loader = shard_loader(url, STEP, Shard.parse(shard), kept=kept, timeout=600.0)
    else:
        plain = prometheus_loader(url, STEP, timeout=600.0, remember=incremental)
        loader = WindowLoader(plain) if incremental else plain
    now = [0.0]
    service = AnalyzerService(loader, url=url, interval=interval, window=WINDOW, step=STEP, clock=lambda: now[0])
    seconds, rss = [], []
    for i in range(ticks):
        now[0] = start + WINDOW + i * interval + 7.0
        t0 = time.perf_counter()
        ok = service.run_once()
        seconds.append(time.perf_counter() - t0)
        rss.append(status_mb("VmRSS"))
        if not ok:
            raise SystemExit(f"tick {i} failed: {service.health_json()['last_error']}")
    fleet = service.snapshot().analysis.fleet
    name = ("serve_shard" if shard else "serve") + ("" if incremental else "_full_reload")
    if shard:
        print(f"serve_shard_gpus {fleet.gpu_count()}")
    else:
        assert fleet is not None and fleet.gpu_count() == gpus, (fleet and fleet.gpu_count(), gpus)
    print(f"{name}_tick_seconds_p50 {np.median(seconds):.2f}")
    print(f"{name}_tick_seconds_max {max(seconds):.2f}")
    print(f"{name}_rss_mb_first {rss[0]:.0f}")
    print(f"{name}_rss_mb_last {rss[-1]:.0f}")
    if incremental:
        loads = sum(w.full_loads for w in kept.windows.values()) if kept else loader.full_loads
        print(f"{'serve_shard' if shard else 'serve'}_full_loads {loads}")
    print(f"# {name}: {ticks} ticks, RSS min/max {min(rss):.0f}/{max(rss):.0f} MB, peak {status_mb('VmHWM'):.0f} MB",
          file=sys.stderr)


def run(gpus: int, ticks: int, full_ticks: int, interval: float, scrape: float, shard: str,
        baseline: Path | None = None) -> None:
    from bench.benchutil import checkouts, healthy_cluster, simulated_prometheus

    history = WINDOW + max(ticks, full_ticks) * interval + STEP
    sim = healthy_cluster(gpus, history + scrape)
    n = len(sim.gpus)
    with tempfile.TemporaryDirectory(prefix="bench-serve-") as tmp:
        t0 = time.perf_counter()
        with simulated_prometheus(sim, sim.start, sim.start + history + scrape, scrape, Path(tmp)) as url:
            print(f"serve_backfill_seconds {time.perf_counter() - t0:.1f}", flush=True)
            print(f"serve_gpus {n}", flush=True)
            runs = checkouts(ROOT, baseline)
            for prefix, code in runs.items():
                for part in ("", shard) if shard else ("",):
                    for mode, count in (("incremental", ticks), ("full", full_ticks)):
                        if count:
                            done = subprocess.run(
                                [sys.executable, str(code / "bench" / "bench_serve.py"), "--measure", url,
                                 repr(sim.start), repr(interval), str(count), mode, str(n), part],
                                check=True, cwd=code, stdout=subprocess.PIPE, text=True)
                            print("".join(prefix + line for line in done.stdout.splitlines(keepends=True)),
                                  end="", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", default="256,1000", help="fleet sizes, comma-separated (default 256,1000)")
    ap.add_argument("--ticks", type=int, default=100, help="incremental ticks (default 100)")
    ap.add_argument("--full-ticks", type=int, default=100, help="full-reload ticks (default 100; 0: skip)")
    ap.add_argument("--interval", type=float, default=60.0, help="seconds between ticks (default 60)")
    ap.add_argument("--scrape", type=float, default=15.0, help="history sample interval in seconds (default 15)")
    ap.add_argument("--shard", default="", metavar="I/N", help="also replay this shard's replica's ticks")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. a git worktree of an older commit) to "
                    "replay on the same Prometheus after this one: its lines are prefixed baseline_")
    ap.add_argument("--measure", nargs=7, metavar=("URL", "START", "INTERVAL", "TICKS", "MODE", "GPUS", "SHARD"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        url, start, interval, ticks, mode, gpus, shard = args.measure
        measure(url, float(start), float(interval), int(ticks), mode, int(gpus), shard)
        return
    for gpus in (int(g) for g in args.gpus.split(",")):
        run(gpus, args.ticks, args.full_ticks, args.interval, args.scrape, args.shard, args.baseline)


if __name__ == "__main__":
    main()
