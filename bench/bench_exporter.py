"""Exporter benchmark: scrape cost against a bare prometheus_client registry, start-up, RSS.

Prints plain ``name value`` lines:

  collector_scrape_us      our collector + generate_latest, one 8-GPU simulated node, the
                           node's Reading replayed so only exporter work is timed (median)
  bare_registry_scrape_us  generate_latest of a plain registry of Gauge/Counter objects
                           holding exactly the same series (median)
  scrape_ratio             collector / bare (target <= 1.3)
  live_scrape_us           the same node with the live simulator computing each scrape
  series                   series per scrape
  startup_s                `truegpu exporter` subprocess launch -> first good /metrics (target <= 1)
  rss_mb                   its VmRSS after a few scrapes (target <= 60)

Usage: python bench/bench_exporter.py [--scenario healthy-fleet] [--runs 2000]
"""

from __future__ import annotations

import argparse
import signal
import socket
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from prometheus_client import generate_latest

from exporter import schema as S
from exporter.collector import build_registry
from exporter.sources.base import Reading, Source
from exporter.sources.simulated import SimulatedSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from scrape_compare import bare_registry, median_call_us, paired_scrape_us, series_of

ROOT = Path(__file__).resolve().parent.parent


class ReplaySource(Source):
    """Serves one fixed Reading, so the timing is the exporter's work and not the simulator's."""

    name = "simulated"

    def __init__(self, reading: Reading) -> None:
        self.reading = reading

    def collect(self) -> Reading:
        return self.reading


def one_node_reading(scenario: str, seed: int) -> tuple[str, Reading]:
    """The Reading of the first node of ``scenario`` that has 8 GPUs."""
    probe = SimulatedSource(scenario, seed=seed)
    reading = probe.collect()
    probe.close()
    per_host: dict[str, set[str]] = {}
    for labels, _ in reading.samples.get(S.GPU_INFO, []):
        per_host.setdefault(labels[S.HOSTNAME], set()).add(labels[S.GPU])
    host = next(h for h, gpus in sorted(per_host.items()) if len(gpus) == 8)
    source = SimulatedSource(scenario, hostnames=[host], seed=seed)
    node = source.collect()
    source.close()
    return host, node


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def startup(scenario: str, host: str) -> tuple[float, float]:
    """Seconds from launching `truegpu exporter` to the first good /metrics, and its RSS in MB after 5 scrapes."""
    port = free_port()
    exe = Path(sys.executable).with_name("truegpu")
    url = f"http://127.0.0.1:{port}/metrics"
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        [str(exe), "--log-level", "WARNING", "exporter", "--source", "simulated", "--scenario", scenario,
         "--node", host, "--listen", f"127.0.0.1:{port}"],
        cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        while True:
            if proc.poll() is not None:
                raise SystemExit(f"exporter exited with {proc.returncode}")
            try:
                with urllib.request.urlopen(url, timeout=5) as resp:
                    if resp.status == 200 and b"truegpu_gpu_utilization_ratio" in resp.read():
                        break
            except OSError:
                time.sleep(0.005)
        elapsed = time.perf_counter() - t0
        for _ in range(5):
            with urllib.request.urlopen(url, timeout=5) as resp:
                resp.read()
        status = Path(f"/proc/{proc.pid}/status").read_text()
        rss_kb = int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:")))
        return elapsed, rss_kb / 1024
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=15)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--scenario", default="healthy-fleet")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--runs", type=int, default=2000)
    ap.add_argument("--startups", type=int, default=3, help="start-up measurements (median reported)")
    args = ap.parse_args()

    host, reading = one_node_reading(args.scenario, args.seed)
    ours, _ = build_registry([ReplaySource(reading)])
    bare = bare_registry(reading, ReplaySource.name)
    if series_of(generate_latest(ours)) != series_of(generate_latest(bare)):
        raise SystemExit("the bare registry does not hold the same series as the collector")
    live, live_collector = build_registry([SimulatedSource(args.scenario, hostnames=[host], seed=args.seed)])

    ours_us, bare_us = paired_scrape_us(ours, bare, args.runs)
    live_us = median_call_us(lambda: generate_latest(live), max(args.runs // 5, 50))
    live_collector.close()

    starts = [startup(args.scenario, host) for _ in range(args.startups)]
    print(f"series {sum(len(v) for v in reading.samples.values())}")
    print(f"collector_scrape_us {ours_us:.1f}")
    print(f"bare_registry_scrape_us {bare_us:.1f}")
    print(f"scrape_ratio {ours_us / bare_us:.3f}")
    print(f"live_scrape_us {live_us:.1f}")
    print(f"startup_s {statistics.median(s for s, _ in starts):.3f}")
    print(f"rss_mb {max(r for _, r in starts):.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
