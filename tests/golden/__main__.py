"""``python -m tests.golden``: regenerate tests/golden/simulated_node.prom (then review the diff)."""

from tests.golden import write

print(f"wrote {write()}")
