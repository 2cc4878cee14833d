"""A served analyzer for the service tests: the simulated source, a service over it, a loopback app; and how a
kept window is compared with a full load."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict

import pandas as pd
from pandas.testing import assert_frame_equal

from analyzer.data.frame import Fleet
from analyzer.service import AnalyzerService
from exporter.simulator import Cluster
from tests.conftest import free_port

#: 2023-11-15T01:00:00Z: the 4 h cluster spans midnight, so rollups cover two UTC days.
NOW = 1_700_010_000.0
WINDOW = 1800.0
TOKEN = "tok-3f9a1c-for-tests"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Source:
    """A loader over the simulated cluster that can be switched off (Prometheus down)."""

    def __init__(self, cluster: Cluster) -> None:
        self.cluster, self.down, self.calls = cluster, False, 0

    def __call__(self, start: float, end: float):
        from analyzer.data.simulated import fleet_from_cluster

        self.calls += 1
        if self.down:
            raise ConnectionError("prometheus at http://prom.test:9090 is down")
        return fleet_from_cluster(self.cluster, start=start, end=end, step=60.0)


def new_service(cluster: Cluster) -> tuple[AnalyzerService, Source]:
    source = Source(cluster)
    return AnalyzerService(source, url="http://prom.test:9090", interval=60, window=WINDOW, step=60,
                           clock=lambda: NOW + 7), source


@contextmanager
def served(app) -> Iterator[str]:
    """The app on a loopback uvicorn; yields its base URL."""
    import uvicorn

    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_config=None, access_log=False,
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
        time.sleep(0.02)
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        server.should_exit = True
        thread.join(10)


# -- comparing a kept window with a full load -----------------------------------------------------
def _frame(fleet: Fleet) -> pd.DataFrame:
    out = fleet.frame.copy()
    for c in out.columns:
        if isinstance(out[c].dtype, pd.CategoricalDtype):
            out[c] = out[c].cat.remove_unused_categories()
    return out


def _events(fleet: Fleet) -> pd.DataFrame:
    return fleet.events.sort_values(list(fleet.events.columns)).reset_index(drop=True)


def _shares(fleet: Fleet) -> pd.DataFrame:
    return fleet.shares.sort_values(["timestamp", "hostname", "gpu", "pod"]).reset_index(drop=True)


def finding_texts(findings) -> list[str]:
    """Findings as comparable JSON, ids left out (two services number them apart)."""
    return [json.dumps({k: v for k, v in asdict(f).items() if k != "id"}, sort_keys=True, default=str)
            for f in findings]


def assert_same_fleet(kept: Fleet, full: Fleet) -> None:
    """A fleet spliced from kept windows is the full load: frame, events, topology, accounting, holders, gaps."""
    assert (kept.start, kept.end, kept.step, kept.dialect) == (full.start, full.end, full.step, full.dialect)
    assert_frame_equal(_frame(kept), _frame(full), check_exact=True)
    assert_frame_equal(_events(kept), _events(full), check_exact=True)
    assert_frame_equal(kept.topology, full.topology)
    assert_frame_equal(kept.accounting, full.accounting)
    assert_frame_equal(_shares(kept), _shares(full), check_exact=True)
    assert kept.missing == full.missing
