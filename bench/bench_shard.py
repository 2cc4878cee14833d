"""Benchmark: `analyze --shard i/n` from a REAL Prometheus against the unsharded run. Prints:

    shard_backfill_seconds N        setup, excluded: simulate the history, promtool backfill, start the server
    shard_gpus N
    shard_n N                       shards
    shard_seconds_max N             the slowest shard: discovery + its reads + analysis, wall time
    shard_peak_rss_mb_max N         the largest shard's peak RSS (each shard in a fresh process)
    shard_seconds_ratio N           shard_seconds_max / unsharded_seconds (1/n would be perfect scaling)
    shard_peak_rss_ratio N          shard_peak_rss_mb_max / unsharded_peak_rss_mb
    shard_union_exact 1|0           the shards' findings are exactly the unsharded ones (every field)
    unsharded_seconds N             load_prometheus + analysis, wall time
    unsharded_peak_rss_mb N

    .venv/bin/python bench/bench_shard.py [--gpus 2048] [--shards 4] [--hours 1] [--step 15] [--baseline DIR]

The fleet is fixtures/shard/fleet.yaml (the sharding test's) rescaled to ``--gpus`` (racks of 8
8-GPU nodes, a multiple of 64) at a 15 s scrape, analyzed at ``--step``. The runs go one after the
other, each in a child process so its peak is its own; other work on the machine makes the seconds
noisy. Per-shard numbers go to stderr. A shard reads its hosts whole (whole racks where jobs do not
chain them), the fleet's reference sample (64 hosts per model) with the context families and the other
nodes of the racks at its pieces' cuts with the thermal ones (analyzer.data.shard): about 1/n plus a part
that stops growing with the fleet. ``--baseline DIR`` measures another checkout on the same Prometheus.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCENARIO = ROOT / "fixtures" / "shard" / "fleet.yaml"
GPUS_PER_NODE, NODES_PER_RACK, SCRAPE = 8, 8, 15.0


def measure(url: str, start: float, end: float, step: float, shard: str, out: Path) -> None:
    """The measured part (in the child): read and analyze one shard ("" = unsharded); numbers to ``out``."""
    from analyzer.data.load import load_prometheus
    from analyzer.data.shard import Shard, load_shard
    from analyzer.pipeline import analyze
    from bench.benchutil import status_mb

    t0 = time.perf_counter()
    if shard:
        fleet = load_shard(url, start, end, step, Shard.parse(shard), timeout=600.0)
    else:
        fleet = load_prometheus(url, start, end, step, timeout=600.0)
    result = analyze(fleet)
    seconds = time.perf_counter() - t0
    out.write_text(json.dumps({"seconds": seconds, "peak_mb": status_mb("VmHWM"), "gpus": fleet.gpu_count(),
                               "findings": sorted(json.dumps(f.to_json(), sort_keys=True) for f in result.findings)}))


def run(gpus: int, shards: int, hours: float, step: float, baseline: Path | None = None) -> None:
    from bench.benchutil import checkouts, simulated_prometheus
    from exporter.simulator import Cluster, load_scenario

    nodes = gpus // GPUS_PER_NODE
    if gpus % (GPUS_PER_NODE * NODES_PER_RACK):
        raise SystemExit(f"--gpus {gpus}: give a multiple of {GPUS_PER_NODE * NODES_PER_RACK} (racks of "
                         f"{NODES_PER_RACK} 8-GPU nodes)")
    sim = Cluster(load_scenario(str(SCENARIO), racks=nodes // NODES_PER_RACK, nodes_per_rack=NODES_PER_RACK,
                                gpus_per_node=GPUS_PER_NODE, duration=f"{hours * 3600 + SCRAPE:g}s"))
    start, end = sim.start, sim.start + hours * 3600
    with tempfile.TemporaryDirectory(prefix="bench-shard-") as tmp:
        t0 = time.perf_counter()
        with simulated_prometheus(sim, start, end + SCRAPE, SCRAPE, Path(tmp)) as url:
            print(f"shard_backfill_seconds {time.perf_counter() - t0:.1f}", flush=True)

            def child(shard: str, code: Path = ROOT) -> dict:
                out = Path(tmp) / f"run-{shard.replace('/', '-') or 'all'}.json"
                subprocess.run([sys.executable, str(code / "bench" / "bench_shard.py"), "--measure", url, repr(start),
                                repr(end), repr(step), shard, str(out)], check=True, cwd=code)  # fmt: skip
                return json.loads(out.read_text())

            runs = checkouts(ROOT, baseline)
            measured = {prefix: (child("", code), [child(f"{i}/{shards}", code) for i in range(shards)])
                        for prefix, code in runs.items()}
    for prefix, (whole, parts) in measured.items():
        report(prefix, whole, parts, shards)


def report(prefix: str, whole: dict, parts: list[dict], shards: int) -> None:
    """The printed lines of one checkout's runs (``prefix`` "" or "baseline_")."""
    for i, p in enumerate(parts):
        print(f"# {prefix}shard {i}/{shards}: {p['gpus']} GPUs, {p['seconds']:.1f} s, peak {p['peak_mb']:.0f} MB, "
              f"{len(p['findings'])} findings", file=sys.stderr)
    exact = sorted(f for p in parts for f in p["findings"]) == whole["findings"]
    worst_s, worst_mb = max(p["seconds"] for p in parts), max(p["peak_mb"] for p in parts)
    print(f"{prefix}shard_gpus {whole['gpus']}")
    print(f"{prefix}shard_n {shards}")
    print(f"{prefix}shard_seconds_max {worst_s:.2f}")
    print(f"{prefix}shard_peak_rss_mb_max {worst_mb:.0f}")
    print(f"{prefix}shard_seconds_ratio {worst_s / whole['seconds']:.3f}")
    print(f"{prefix}shard_peak_rss_ratio {worst_mb / whole['peak_mb']:.3f}")
    print(f"{prefix}shard_union_exact {int(exact)}")
    print(f"{prefix}unsharded_seconds {whole['seconds']:.2f}")
    print(f"{prefix}unsharded_peak_rss_mb {whole['peak_mb']:.0f}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=2048, help="fleet size, a multiple of 64 (default 2048)")
    ap.add_argument("--shards", type=int, default=4)
    ap.add_argument("--hours", type=float, default=1.0)
    ap.add_argument("--step", type=float, default=15.0, help="analysis step in seconds (default 15)")
    ap.add_argument("--baseline", type=Path, help="another checkout (e.g. a git worktree of an older commit) to run "
                    "on the same Prometheus after this one: its lines are prefixed baseline_")
    ap.add_argument("--measure", nargs=6, metavar=("URL", "START", "END", "STEP", "SHARD", "OUT"),
                    help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.measure:
        url, start, end, step, shard, out = args.measure
        measure(url, float(start), float(end), float(step), shard, Path(out))
        return
    run(args.gpus, args.shards, args.hours, args.step, args.baseline)


if __name__ == "__main__":
    main()
