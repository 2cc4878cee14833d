"""Benchmark: OpenMetrics history ingest speed, plain and gzip, and Prometheus text scrapes.

Generates a history file the way the simulator writes one (exporter.simulator.history
writer, contract metric names, hostname/gpu/uuid labels, shortest-repr float values,
series one after another) and the same samples as concatenated scrapes (Prometheus text,
every series once per scrape time, millisecond timestamps: time-major, so no run of one
series key to exploit), and prints one ``name value`` line per measurement:

    ingest_openmetrics_samples_per_second <N>             (plain text)
    ingest_openmetrics_gzip_samples_per_second <N>        (same file, gzip)
    ingest_prometheus_text_time_major_samples_per_second <N>
    ingest_dcgm_exporter_labels_samples_per_second <N>    (dcgm-exporter's label set: spaced modelName)
    ingest_dcgm_exporter_labels_compact_samples_per_second <N>   (the same, read as analyze reads it)

Usage: python bench/bench_ingest.py [--gpus 200] [--metrics 10] [--points 720] [--repeat 3]
"""

from __future__ import annotations

import argparse
import gzip
import shutil
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from analyzer.data.ingest import read_openmetrics  # noqa: E402
from exporter import schema  # noqa: E402
from exporter.simulator.history import format_labels, write_openmetrics  # noqa: E402

METRICS = (
    schema.GPU_UTILIZATION, schema.SM_ACTIVE, schema.SM_OCCUPANCY, schema.TENSOR_ACTIVE, schema.DRAM_ACTIVE,
    schema.MEMORY_USED, schema.POWER, schema.SM_CLOCK, schema.ENERGY, schema.PCIE_REPLAYS,
    schema.MEMORY_UTILIZATION, schema.GRAPHICS_ENGINE_ACTIVE,
)  # fmt: skip


def _labels(g: int, dcgm: bool) -> dict[str, str]:
    """One GPU's labels: ours, or the set dcgm-exporter attaches (its ``modelName`` holds spaces)."""
    host, uuid = f"gpu-node-{g // 8:04d}.cluster.local", f"GPU-{g:08x}-1c2d-4e5f-8a9b-{g * 7919:012x}"
    if not dcgm:
        return {schema.HOSTNAME: host, schema.GPU: str(g % 8), schema.UUID: uuid}
    return {"gpu": str(g % 8), "UUID": uuid, "pci_bus_id": f"00000000:{0x18 + g % 8:02X}:00.0",
            "device": f"nvidia{g % 8}", "modelName": "NVIDIA H100 80GB HBM3", "Hostname": host,
            "DCGM_FI_DRIVER_VERSION": "550.127.05", "namespace": "llm", "pod": f"pretrain-worker-{g // 8}",
            "container": "pytorch"}  # fmt: skip


def _series(gpus: int, n_metrics: int, points: int, dcgm: bool = False):
    """``(metric, labels, values)`` for ``n_metrics`` families x ``gpus`` series x ``points`` samples."""
    rng = np.random.default_rng(7)
    labels = [_labels(g, dcgm) for g in range(gpus)]
    for metric in METRICS[:n_metrics]:
        for lab in labels:
            values = rng.random(points)
            if metric.type == "counter":
                values = np.cumsum(values * 100.0)
            yield metric, lab, values


def _times(points: int) -> np.ndarray:
    return 1_700_000_000.0 + 15.0 * np.arange(points)


def write_file(path: Path, gpus: int, n_metrics: int, points: int, dcgm: bool = False) -> int:
    """Write the history file, series after series; return the sample count."""
    with open(path, "w", encoding="utf-8") as out:
        stats = write_openmetrics(out, _series(gpus, n_metrics, points, dcgm), _times(points))
    return stats.samples


def write_scrapes(path: Path, gpus: int, n_metrics: int, points: int) -> int:
    """Write the same samples scrape after scrape (Prometheus text, ms timestamps); return the sample count."""
    series = list(_series(gpus, n_metrics, points))
    keys = [f"{m.name}{'_total' if m.type == 'counter' else ''}{format_labels(lab)} " for m, lab, _ in series]
    values = np.array([v for _, _, v in series]).T.tolist()  # one row per scrape time
    with open(path, "w", encoding="utf-8") as out:
        for t, row in zip(_times(points).tolist(), values, strict=True):
            suffix = f" {round(t * 1000)}\n"
            out.write("".join(k + repr(v) + suffix for k, v in zip(keys, row, strict=True)))
    return len(series) * points


def measure(path: Path, repeat: int, compact: bool = False) -> tuple[float, int]:
    """Best-of-``repeat`` samples per second for reading ``path`` (into the long frame, or with ``compact``
    into the Samples ``analyze`` reads)."""
    best = float("inf")
    samples = 0
    for _ in range(repeat):
        t0 = time.perf_counter()
        frame, report = read_openmetrics(path, workers=1, compact=compact)  # one core: the per-core rate
        best = min(best, time.perf_counter() - t0)
        samples = len(frame)
        assert report.bad_line_count == 0, report.bad_lines
        del frame
    return samples / best, samples


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--gpus", type=int, default=200)
    ap.add_argument("--metrics", type=int, default=10)
    ap.add_argument("--points", type=int, default=720)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        plain = Path(tmp) / "history.om"
        expected = write_file(plain, args.gpus, args.metrics, args.points)
        gz = Path(tmp) / "history.om.gz"
        with open(plain, "rb") as src, gzip.open(gz, "wb", compresslevel=6) as dst:
            shutil.copyfileobj(src, dst)
        rate, samples = measure(plain, args.repeat)
        assert samples == expected, (samples, expected)
        print(f"ingest_openmetrics_samples {samples}")
        print(f"ingest_openmetrics_file_bytes {plain.stat().st_size}")
        print(f"ingest_openmetrics_samples_per_second {rate:.0f}")
        rate_gz, samples_gz = measure(gz, args.repeat)
        assert samples_gz == expected
        print(f"ingest_openmetrics_gzip_samples_per_second {rate_gz:.0f}")
        plain.unlink()
        gz.unlink()
        scrapes = Path(tmp) / "scrapes.prom"
        expected = write_scrapes(scrapes, args.gpus, args.metrics, args.points)
        rate_tm, samples_tm = measure(scrapes, args.repeat)
        assert samples_tm == expected, (samples_tm, expected)
        print(f"ingest_prometheus_text_time_major_samples_per_second {rate_tm:.0f}")
        scrapes.unlink()
        dcgm = Path(tmp) / "dcgm.om"
        expected = write_file(dcgm, args.gpus, args.metrics, args.points, dcgm=True)
        for compact, name in ((False, ""), (True, "_compact")):
            rate_d, samples_d = measure(dcgm, args.repeat, compact)
            assert samples_d == expected, (samples_d, expected)
            print(f"ingest_dcgm_exporter_labels{name}_samples_per_second {rate_d:.0f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
