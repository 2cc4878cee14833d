"""Fixtures of the service tests: the simulated mixed-fleet cluster and a service with one good run."""

from __future__ import annotations

import pytest

from analyzer.service import AnalyzerService
from exporter.simulator import Cluster, load_scenario
from tests.analyzer.service.kit import NOW, Source, new_service


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    scenario = load_scenario("mixed-fleet")
    return Cluster(scenario, start=NOW - float(scenario.duration))


@pytest.fixture(scope="module")
def analyzed(cluster) -> tuple[AnalyzerService, Source]:
    """A service with one good run (shared, read-only)."""
    service, source = new_service(cluster)
    assert service.run_once()
    return service, source


@pytest.fixture(scope="module")
def catalog():
    from analyzer.finops import load_catalog

    return load_catalog()
