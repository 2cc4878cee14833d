"""Golden exposition: the exact /metrics text the exporter serves for one fixed simulated node.

Like node_exporter's ``collector/fixtures/e2e-output.txt``: any change to names, labels, values,
HELP/TYPE text, family order or formatting shows up as a diff of ``simulated_node.prom`` in review.
The node is fixed (scenario ``GOLDEN_SCENARIO``, node ``GOLDEN_NODE``, seed ``GOLDEN_SEED``, ``GOLDEN_OFFSET``
seconds into the scenario, a frozen clock), and the text goes through the real WSGI app
(``exporter.server.make_app``) with Prometheus' plain-text Accept header.

Only the values of genuinely volatile series are masked (``VOLATILE``): how long this collection took
(wall-clock timing of this process) and the Unix time of the last success (``time.time()``). Their
series and HELP/TYPE lines stay in the file.

Update after an intended change with ``.venv/bin/python -m tests.exporter.golden`` and review the diff.
"""

from __future__ import annotations

import re
from pathlib import Path

from exporter import schema
from exporter.collector import build_registry
from exporter.server import make_app
from exporter.sources.simulated import SimulatedSource

GOLDEN = Path(__file__).with_name("simulated_node.prom")
GOLDEN_SCENARIO = "mig-training"
GOLDEN_NODE = "dc1-r1-n01"  # 8 A100: MIG instances of two profiles, pods holding them
GOLDEN_SEED = 42
GOLDEN_OFFSET = 1800.0  # 30 min in: jobs running, MIG instances allocated
VOLATILE = (schema.COLLECT_DURATION, schema.SOURCE_LAST_SUCCESS)
_MASK = "<volatile>"
_VOLATILE_NAMES = "|".join(m.name for m in VOLATILE)
_VOLATILE_LINE = re.compile(r"^(?P<series>(?:" + _VOLATILE_NAMES + r")(?:\{[^}]*\})?) \S+$", re.M)


def render() -> str:
    """The exposition as served now, with the volatile values masked."""
    source = SimulatedSource(GOLDEN_SCENARIO, hostnames=[GOLDEN_NODE], seed=GOLDEN_SEED, start=GOLDEN_OFFSET,
                             clock=lambda: 0.0)
    registry, collector = build_registry([source])
    try:
        started: list[str] = []
        environ = {"REQUEST_METHOD": "GET", "PATH_INFO": "/metrics", "QUERY_STRING": "",
                   "HTTP_ACCEPT": "text/plain;version=0.0.4"}
        body = b"".join(make_app(registry, collector)(environ, lambda status, headers, exc_info=None:
                                                       started.append(status)))
    finally:
        collector.close()
    assert started == ["200 OK"], started
    return _VOLATILE_LINE.sub(lambda m: f"{m['series']} {_MASK}", body.decode())


def write() -> Path:
    """Regenerate the committed golden file."""
    GOLDEN.write_text(render(), encoding="utf-8")
    return GOLDEN
