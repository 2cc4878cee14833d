"""Real sources through the whole exporter: the fake-NVML 8x H100 node and dcgm-exporter's H100
output on loopback, behind the deadline wrapper as deployed, side by side with a bare
prometheus_client registry holding the same series, and per-scrape latency under 10
concurrent scrapers over HTTP on loopback.

``*_scrape_*``: as deployed (``--collect-interval 5``): the sources are collected on the
exporter's background thread and a scrape collects the collector's latest families and renders
them, exactly what a scrape of the bare registry does with its gauges.
``*_collection_*``: what one background collection costs (source + validation + families),
paid once per interval whatever the number of scrapers, and that cost as a share of one core.
``*_collect_on_scrape_*``: ``--collect-interval 0``, a whole collection inside every scrape.

Prints ``name value`` lines; run from the repository root (the fake pynvml lives in tests/):
``python bench/bench_sources.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "bench")]

from prometheus_client import generate_latest  # noqa: E402
from scrape_compare import bare_registry, median_call_us, paired_scrape_us, series_of  # noqa: E402

from exporter.collector import build_registry  # noqa: E402
from exporter.server import (  # noqa: E402
    DEFAULT_COLLECT_INTERVAL,
    make_app,
    make_server,
)
from exporter.sources import promtext  # noqa: E402
from exporter.sources.base import Source  # noqa: E402
from exporter.sources.dcgm import DcgmSource  # noqa: E402
from exporter.sources.deadline import DeadlineSource  # noqa: E402
from exporter.sources.nvml import NvmlSource  # noqa: E402
from tests.exporter.fakes.fake_pynvml import FakeNvml, VirtualClock, h100_node  # noqa: E402

DCGM_FIXTURE = ROOT / "fixtures" / "dcgm" / "h100_mig_pods.txt"


def serve_body(body: bytes) -> ThreadingHTTPServer:
    """A loopback stand-in for dcgm-exporter serving one recorded body (keep-alive)."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    return server


def concurrent_latencies(registry, collector, scrapers: int, per_scraper: int) -> list[float]:
    """Seconds per /metrics request with ``scrapers`` clients hammering the real HTTP server at once."""
    server = make_server("127.0.0.1", 0, make_app(registry, collector))
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
    latencies: list[float] = []
    lock = threading.Lock()

    def scrape() -> None:
        mine = []
        for _ in range(per_scraper):
            t0 = time.perf_counter()
            with urllib.request.urlopen(url, timeout=30) as resp:
                resp.read()
            mine.append(time.perf_counter() - t0)
        with lock:
            latencies.extend(mine)

    threads = [threading.Thread(target=scrape) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    server.shutdown()
    server.server_close()
    return latencies


def compare(name: str, make: Callable[[], Source], runs: int, scrapers: int) -> None:
    probe = make()
    reading = probe.collect()
    probe.close()
    if not reading.up:
        raise SystemExit(f"{name}: source not up: {reading.errors}")
    bare = bare_registry(reading, name)
    deployed, collector = build_registry([DeadlineSource(make(), 5.0)], interval=DEFAULT_COLLECT_INTERVAL)
    on_scrape, on_scrape_collector = build_registry([DeadlineSource(make(), 5.0)])
    for ours in (deployed, on_scrape):
        if series_of(generate_latest(ours)) - series_of(generate_latest(bare)) - {
            ("truegpu_exporter_source_stale", (("source", name),))
        }:
            raise SystemExit(f"{name}: the bare registry does not hold the same series as the exporter")
    scrape_us, bare_us = paired_scrape_us(deployed, bare, runs)
    collect_on_scrape_us, bare2_us = paired_scrape_us(on_scrape, bare, runs)
    collection_us = median_call_us(on_scrape_collector._collect, runs)
    on_scrape_collector.close()
    lat = sorted(concurrent_latencies(deployed, collector, scrapers, max(runs // scrapers, 20)))
    collector.close()
    print(f"{name}_series {sum(len(v) for v in reading.samples.values())}")
    print(f"{name}_scrape_us {scrape_us:.0f}")
    print(f"{name}_bare_registry_us {bare_us:.0f}")
    print(f"{name}_scrape_ratio {scrape_us / bare_us:.3f}")
    print(f"{name}_collection_us {collection_us:.0f}")
    print(f"{name}_collection_core_pct {100 * collection_us / 1e6 / DEFAULT_COLLECT_INTERVAL:.3f}")
    print(f"{name}_collect_on_scrape_ratio {collect_on_scrape_us / bare2_us:.3f}")
    print(f"{name}_concurrent{scrapers}_p50_ms {1000 * lat[len(lat) // 2]:.1f}")
    print(f"{name}_concurrent{scrapers}_p99_ms {1000 * lat[int(len(lat) * 0.99) - 1]:.1f}")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=1000)
    ap.add_argument("--scrapers", type=int, default=10)
    args = ap.parse_args()

    def nvml() -> Source:
        clock = VirtualClock()  # GPM's 100 ms between samples passes in virtual time
        return NvmlSource(FakeNvml(h100_node(8), clock=clock).module, hostname="bench", events=False,
                          clock=clock, sleep=clock.sleep)

    compare("nvml", nvml, args.runs, args.scrapers)

    body = DCGM_FIXTURE.read_bytes()
    server = serve_body(body)
    try:
        url = f"http://127.0.0.1:{server.server_address[1]}/metrics"
        compare("dcgm", lambda: DcgmSource(url, retries=0), args.runs, args.scrapers)
        print(f"dcgm_parse_us {median_call_us(lambda: promtext.parse(body.decode()), args.runs):.0f}")
    finally:
        server.shutdown()
        server.server_close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
