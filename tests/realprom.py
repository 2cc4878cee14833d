"""Real servers on loopback for tests: a generic runner, and Prometheus with backfilled history.

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


@contextmanager
def running(argv: Sequence[str], log: Path, ready_url: str, timeout: float = 60.0) -> Iterator[subprocess.Popen]:
    """Run a real server until the block ends: started with its output in ``log``, waited for
    until ``ready_url`` answers 200 (failing with the log's tail if it dies or never does),
    and always stopped (terminate, then kill)."""
    name = Path(argv[0]).name
    with open(log, "w") as log_f:
        proc = subprocess.Popen(list(argv), stdout=log_f, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                pytest.fail(f"{name} exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
            try:
                if requests.get(ready_url, timeout=1).status_code == 200:
                    break
            except requests.RequestException:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"{name} not ready after {timeout:g} s:\n{log.read_text()[-3000:]}")
            time.sleep(0.1)
        yield proc
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def backfilled_prometheus(
    tmp: Path, files: Sequence[Path], promtool: str, prometheus_bin: str, flags: Sequence[str] = ()
) -> Iterator[str]:
    """Backfill ``files`` (OpenMetrics) into a fresh TSDB under ``tmp`` and serve it with the extra
    command-line ``flags`` (e.g. ``--query.max-samples=5000``); yields the base URL."""
    data = tmp / "data"
    for om in files:
        backfill = subprocess.run(
            [promtool, "tsdb", "create-blocks-from", "openmetrics", str(om), str(data)],
            capture_output=True, text=True, timeout=300,
        )
        assert backfill.returncode == 0, backfill.stderr + backfill.stdout
    with serving_tsdb(tmp, data, prometheus_bin, flags) as url:
        yield url


@contextmanager
def serving_tsdb(tmp: Path, data: Path, prometheus_bin: str, flags: Sequence[str] = (),
                 timeout: float = 60.0) -> Iterator[str]:
    """Serve the TSDB at ``data`` (backfilled history, kept 100 years) on loopback; yields the base URL."""
    config = tmp / "prometheus.yml"
    config.write_text("global:\n  scrape_interval: 1h\n")
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [prometheus_bin, f"--config.file={config}", f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}", "--storage.tsdb.retention.time=100y", *flags]
    with running(argv, tmp / "prometheus.log", f"{url}/-/ready", timeout=timeout):
        yield url
