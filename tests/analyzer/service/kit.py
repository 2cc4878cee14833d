"""A served analyzer for the service tests: the simulated source, a service over it, a loopback app."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

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
