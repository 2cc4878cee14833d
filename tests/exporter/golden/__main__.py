"""``python -m tests.exporter.golden``: regenerate tests/exporter/golden/simulated_node.prom (then review the diff)."""

from tests.exporter.golden import write

print(f"wrote {write()}")
