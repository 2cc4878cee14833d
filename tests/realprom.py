"""A real Prometheus on loopback holding backfilled history, for tests that query it.

History goes in through `promtool tsdb create-blocks-from openmetrics` (what an operator
does with `truegpu simulate` output), the server runs with a 100-year retention so old
simulated timestamps are kept, and it is always stopped when the block ends.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port


def wait_ready(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"prometheus exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            if requests.get(f"{url}/-/ready", timeout=1).status_code == 200:
                return
        except requests.RequestException:
            pass
        time.sleep(0.2)
    pytest.fail(f"prometheus not ready after {timeout:g} s:\n{log.read_text()[-3000:]}")


@contextmanager
def backfilled_prometheus(tmp: Path, files: Sequence[Path], promtool: str, prometheus_bin: str) -> Iterator[str]:
    """Backfill ``files`` (OpenMetrics) into a fresh TSDB under ``tmp`` and serve it; yields the base URL."""
    data = tmp / "data"
    for om in files:
        backfill = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
            capture_output=True, text=True, timeout=300,
        )
        assert backfill.returncode == 0, backfill.stderr + backfill.stdout
    config = tmp / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\n")
    port = free_port()
    log = tmp / "prometheus.log"
    with open(log, "w") as log_f:
        proc = subprocess.Popen(
            [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={data}",
             f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y"],
            stdout=log_f, stderr=subprocess.STDOUT,
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, log)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
