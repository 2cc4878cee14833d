"""Benchmark of the dcgm source: median DcgmSource.collect() against the H100 fixture served on
loopback, and the parse-only / parse+map time of the same body. Prints plain number lines.

    .venv/bin/python bench/bench_dcgm.py [--rounds N]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.sources import promtext  # noqa: E402
from exporter.sources.dcgm import DcgmSource  # noqa: E402

FIXTURE = ROOT / "fixtures" / "dcgm" / "h100_mig_pods.txt"


def _serve(body: bytes) -> ThreadingHTTPServer:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # keep-alive, as the Session reuses the connection

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


def _median_us(fn, rounds: int) -> float:
    for _ in range(min(20, rounds)):
        fn()
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--rounds", type=int, default=300)
    args = ap.parse_args()
    body = FIXTURE.read_bytes()
    text = body.decode()
    server = _serve(body)
    try:
        src = DcgmSource(f"http://127.0.0.1:{server.server_address[1]}/metrics", retries=0)
        reading = src.collect()
        assert reading.up, reading.errors
        samples = sum(len(v) for v in reading.samples.values())
        collect_us = _median_us(src.collect, args.rounds)
        parse_us = _median_us(lambda: promtext.parse(text), args.rounds)
        convert_src = DcgmSource("http://127.0.0.1:1/metrics")
        convert_us = _median_us(lambda: convert_src.convert(text), args.rounds)
        src.close()
    finally:
        server.shutdown()
        server.server_close()
    print(f"fixture_lines {len(text.splitlines())}")
    print(f"contract_samples {samples}")
    print(f"collect_median_us {collect_us:.0f}")
    print(f"parse_median_us {parse_us:.0f}")
    print(f"parse_and_map_median_us {convert_us:.0f}")


if __name__ == "__main__":
    main()
