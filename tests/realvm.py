"""A real single-node VictoriaMetrics on loopback holding imported history, for tests.

History goes in through ``/api/v1/import/prometheus`` (VictoriaMetrics reads the OpenMetrics
text of ``truegpu simulate``, timestamps in seconds included). Old simulated timestamps need a
100-year ``-retentionPeriod``. A sample written twice is kept twice unless ``dedup``
(``-dedup.minScrapeInterval=1ms``, what VictoriaMetrics advises for HA pairs; Prometheus keeps
one). Ingested samples become searchable only after ``/internal/force_flush``, and a query
answered meanwhile may sit in the rollup cache, so the helper waits until every imported sample
is counted and then resets that cache. The server is always stopped when the block ends
(tests/realprom.py's ``running``).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from tests.conftest import free_port
from tests.realprom import running


def _samples(path: Path, distinct: bool) -> tuple[int, float, float]:
    """(sample lines, first and last timestamp in s) of an OpenMetrics file with timestamps;
    ``distinct``: a series' repeated timestamps (in this file) count once."""
    count, lo, hi, seen = 0, float("inf"), float("-inf"), set()
    with open(path, "rb") as f:
        for line in f:
            if line.startswith(b"#") or not line.strip():
                continue
            series, _, ts_text = line.rsplit(None, 2)
            if distinct:
                key = hash((series, ts_text))
                if key in seen:
                    continue
                seen.add(key)
            ts = float(ts_text)
            count, lo, hi = count + 1, min(lo, ts), max(hi, ts)
    return count, lo, hi


def _import(url: str, om: Path) -> None:
    with open(om, "rb") as f:
        resp = requests.post(f"{url}/api/v1/import/prometheus", data=f, timeout=300)
    assert resp.status_code == 204, f"import of {om} into VictoriaMetrics: HTTP {resp.status_code}: {resp.text}"


def _stored(url: str, lo: float, hi: float) -> int:
    """Samples VictoriaMetrics can search in [lo, hi] (0 while none are)."""
    window = f"{int(hi - lo) + 1}s"
    resp = requests.post(f"{url}/api/v1/query", timeout=60, data={
        "query": f'sum(count_over_time({{__name__=~".+"}}[{window}]))', "time": repr(hi), "nocache": "1"})
    resp.raise_for_status()
    result = resp.json()["data"]["result"]
    return int(float(result[0]["value"][1])) if result else 0


@contextmanager
def imported_victoriametrics(
    tmp: Path, files: Sequence[Path], vm_bin: str, *, dedup: bool = False, timeout: float = 60.0
) -> Iterator[str]:
    """Serve a fresh VictoriaMetrics under ``tmp`` holding ``files`` (OpenMetrics, timestamped);
    yields the base URL once every sample is searchable. ``dedup``: keep one sample per series and
    timestamp, as Prometheus does (VictoriaMetrics keeps repeats unless ``-dedup.minScrapeInterval``)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [vm_bin, f"-storageDataPath={tmp / 'vmdata'}", f"-httpListenAddr=127.0.0.1:{port}",
            "-retentionPeriod=100y", "-loggerLevel=WARN", *(["-dedup.minScrapeInterval=1ms"] if dedup else [])]
    with running(argv, tmp / "victoria-metrics.log", f"{url}/health"):
        want, lo, hi = 0, float("inf"), float("-inf")
        for om in files:
            _import(url, om)
            n, first, last = _samples(om, dedup)
            want, lo, hi = want + n, min(lo, first), max(hi, last)
        deadline = time.monotonic() + timeout
        while (got := _stored(url, lo, hi)) != want:
            requests.get(f"{url}/internal/force_flush", timeout=10).raise_for_status()
            if time.monotonic() > deadline:
                pytest.fail(f"VictoriaMetrics holds {got} of {want} imported samples after {timeout:g} s")
            time.sleep(0.2)
        requests.get(f"{url}/internal/resetRollupResultCache", timeout=10).raise_for_status()
        yield url
