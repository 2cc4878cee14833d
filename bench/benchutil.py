"""What the benchmark scripts share: memory readings from /proc (Linux), a simulated fleet's
history served by a real Prometheus, and the checkouts measured side by side."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

GPUS_PER_NODE = 8
#: History is written and backfilled in pieces this long: a 10,000-GPU hour (~150 M samples) is never on disk at once.
PIECE_S = 600.0


def checkouts(root: Path, baseline: Path | None) -> dict[str, Path]:
    """Output line prefix -> source tree to measure: this one, then ``--baseline DIR`` (lines ``baseline_...``)."""
    return {"": root, **({"baseline_": baseline.resolve()} if baseline else {})}


def healthy_cluster(gpus: int, seconds: float) -> Any:
    """healthy-fleet with ``gpus`` GPUs (whole 8-GPU nodes), racks of at most 25 nodes, lasting ``seconds``."""
    from exporter.simulator import Cluster, load_scenario

    nodes = max(1, round(gpus / GPUS_PER_NODE))
    racks = next(r for r in range(-(-nodes // 25), nodes + 1) if nodes % r == 0)
    return Cluster(load_scenario("healthy-fleet", sites=1, racks=racks, nodes_per_rack=nodes // racks,
                                 gpus_per_node=GPUS_PER_NODE, duration=f"{seconds:g}s"))


def status_mb(field: str) -> float:
    """A /proc/self/status memory field (VmRSS, VmHWM) in MB; NaN where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def reset_peak() -> None:
    """Reset VmHWM where Linux allows it, so a later peak is the measured step's, not the set-up's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


@contextmanager
def simulated_prometheus(sim: Any, start: float, end: float, scrape: float, tmp: Path,
                         promtool: str = "promtool", prometheus: str = "prometheus") -> Iterator[str]:
    """The simulated cluster ``sim``'s history over ``[start, end)`` every ``scrape`` s, written in
    ``PIECE_S`` pieces, each backfilled with promtool into a fresh TSDB under ``tmp``, then served by a
    real Prometheus on loopback until the block ends; yields its base URL."""
    from exporter.simulator.history import write_history
    from tests.realprom import serving_tsdb

    data = tmp / "data"
    a = start
    while a < end:
        piece = tmp / "piece.om"
        write_history(piece, sim, a, min(a + PIECE_S, end), scrape)
        done = subprocess.run([promtool, "tsdb", "create-blocks-from", "openmetrics", str(piece), str(data)],
                              capture_output=True, text=True)
        piece.unlink()
        if done.returncode:
            raise SystemExit(f"promtool backfill failed: {done.stderr[-2000:]}")
        a += PIECE_S
    with serving_tsdb(tmp, data, prometheus, timeout=600.0) as url:
        yield url
