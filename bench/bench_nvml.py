"""Median NvmlSource.collect() time over the fake 8x H100 node, in microseconds.

Measures the source's own overhead (call plumbing, unit conversion, label building) with
NVML calls that cost next to nothing; on real hardware each NVML call adds its driver time.
The fake pynvml lives in tests/, so run from the repository root:
``python bench/bench_nvml.py [--rounds N]``. Prints ``name value`` number lines.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from exporter.sources.nvml import NvmlSource
from tests.fakes.fake_pynvml import FakeNvml, VirtualClock, h100_node


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=300)
    args = parser.parse_args(argv)

    clock = VirtualClock()
    fake = FakeNvml(h100_node(8), clock=clock)
    source = NvmlSource(fake.module, hostname="bench", events=False, clock=clock, sleep=clock.sleep)
    try:
        reading = source.collect()  # first collection primes GPM (virtual 0.1 s wait)
        samples = sum(len(s) for s in reading.samples.values())
        timings = []
        for _ in range(args.rounds):
            clock.advance(15.0)  # a scrape interval: GPM never has to wait
            start = time.perf_counter()
            source.collect()
            timings.append((time.perf_counter() - start) * 1e6)
    finally:
        source.close()
    print(f"nvml_collect_median_us {statistics.median(timings):.1f}")
    print(f"nvml_collect_p90_us {statistics.quantiles(timings, n=10)[-1]:.1f}")
    print(f"nvml_samples_per_collect {samples}")
    print(f"nvml_collect_per_gpu_median_us {statistics.median(timings) / 8:.1f}")


if __name__ == "__main__":
    main()
