"""Shared test helpers: real binaries and loopback ports.

Real parts are never skipped: when promtool/prometheus/alertmanager are missing the
test fails with the command that installs them (``make test`` does it on a fresh box).
"""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: Debian names the Alertmanager binary prometheus-alertmanager.
_BINARIES = {
    "promtool": ("promtool",),
    "prometheus": ("prometheus",),
    "alertmanager": ("prometheus-alertmanager", "alertmanager"),
    "amtool": ("amtool",),
}


#: Test modules that evaluate the built-in scenarios. Their fleets are simulated (and for dcgm written and read
#: back) once per process (``named_scenario_fleet``), so ``make test``'s workers run these modules on one worker.
SCENARIO_MODULES = frozenset(f"tests/analyzer/{m}.py" for m in (
    "analysis/test_evaluate", "test_finding_ids", "detectors/test_detection_gate",
    "detectors/test_detector_conformance", "detectors/test_detectors_degraded", "detectors/test_detectors_gpu_fault",
    "detectors/test_detectors_straggler", "detectors/test_detectors_thermal", "detectors/test_detectors_topology",
    "detectors/test_partial_failures", "service/test_service_memory", "service/test_service_state",
))


#: The units that take longest (``pytest --durations``: 1-5 minutes each on 2 cores), handed out first in this
#: order, the rest by test count. xdist's own order (most tests first) left a few-test module of two minutes to
#: the end while the other worker sat idle: longest first keeps the two workers finishing together.
SLOW_FIRST = ("scenario fleets", *(f"tests/{m}.py" for m in (
    "analyzer/service/test_incremental", "analyzer/data/test_shard_prometheus", "alerts/test_e2e_alerting",
    "analyzer/data/test_prometheus_limits", "analyzer/service/test_api_schemathesis", "dashboards/test_dashboards",
    "analyzer/service/test_service", "analyzer/data/test_samples", "analyzer/service/test_api",
)))


def pytest_xdist_make_scheduler(config, log):
    """``--dist loadscope`` with the scenario modules as one unit: each module on one worker (its module fixtures,
    real servers among them, start once), and the modules that share the scenario fleets on the same one;
    ``SLOW_FIRST`` first."""
    if config.getvalue("dist") != "loadscope":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadScopeScheduling

    def rank(scope: str) -> int:
        return SLOW_FIRST.index(scope) if scope in SLOW_FIRST else len(SLOW_FIRST)

    class SlowFirst(OrderedDict):
        def popitem(self, last: bool = True):  # xdist takes the next unit with popitem(last=False)
            scope = min(self, key=rank)  # ties keep xdist's order
            return scope, self.pop(scope)

    class ModulesAndScenarios(LoadScopeScheduling):
        def __init__(self, config, log=None) -> None:
            super().__init__(config, log)
            self.workqueue = SlowFirst()

        def _split_scope(self, nodeid: str) -> str:
            module = nodeid.split("::", 1)[0]
            return "scenario fleets" if module in SCENARIO_MODULES else module

    return ModulesAndScenarios(config, log)


def find_binary(name: str) -> str:
    for candidate in _BINARIES.get(name, (name,)):
        path = shutil.which(candidate)
        if path:
            return path
    pytest.fail(
        f"{name} is not installed; run `make test` (installs Debian's prometheus and "
        "prometheus-alertmanager) or `apt-get install prometheus prometheus-alertmanager`",
        pytrace=False,
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def promtool() -> str:
    return find_binary("promtool")


@pytest.fixture(scope="session")
def prometheus_bin() -> str:
    return find_binary("prometheus")


@pytest.fixture(scope="session")
def victoriametrics_bin() -> str:
    """The single-node VictoriaMetrics server (Debian's victoria-metrics package)."""
    path = shutil.which("victoria-metrics")
    if not path:
        pytest.fail("victoria-metrics is not installed; run `make test` (installs Debian's victoria-metrics) "
                    "or `apt-get install victoria-metrics`", pytrace=False)
    return path


def promtool_check(promtool: str, exposition: bytes) -> None:
    """The real `promtool check metrics` accepts an exposition, or the test fails with its output."""
    proc = subprocess.run([promtool, "check", "metrics"], input=exposition, capture_output=True, timeout=60)
    assert proc.returncode == 0, f"promtool check metrics failed:\n{proc.stdout.decode()}{proc.stderr.decode()}"


def sample_value(families: dict, metric, **labels: str) -> float | None:
    """Value of one series (exact label set) in parsed families keyed by name, None when absent."""
    fam = families.get(metric.family_name)
    for s in fam.samples if fam else ():
        if s.name == metric.name and s.labels == labels:
            return s.value
    return None


@pytest.fixture(scope="module")
def pki() -> Iterator[Path]:
    """A throw-away CA, server (127.0.0.1) and client certificates (tests/pki.py), for TLS tests."""
    from tests.pki import made_pki

    with made_pki() as d:
        yield d
