"""exporter/ modules import one another without cycles, lazy (in-function) imports included.

An import placed inside a function to dodge a cycle still couples the two modules both ways; what
both sides need belongs in a leaf module (e.g. exporter/simulator/series.py). Imports under
``if TYPE_CHECKING:`` are for annotations only and do not count.
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

EXPORTER = ROOT / "exporter"


def _module_name(path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for p in EXPORTER.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        tree = ast.parse(path.read_text())
        typing_only = {
            id(n) for node in ast.walk(tree)
            if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test)
            for stmt in node.body for n in ast.walk(stmt)
        }
        deps = set()
        for node in ast.walk(tree):
            if id(node) in typing_only:
                continue
            if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                targets = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
            elif isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            else:
                continue
            deps |= {t for t in targets if t in modules and t != name}
        graph[name] = deps
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str]:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str]:
        state[node] = 1
        stack.append(node)
        for dep in sorted(graph[node]):
            if state.get(dep) == 1:
                return [*stack[stack.index(dep):], dep]
            if dep not in state and (found := visit(dep)):
                return found
        stack.pop()
        state[node] = 2
        return []

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return []


def test_simulator_history_and_dcgm_dialect_do_not_import_each_other() -> None:
    graph = _graph()
    assert "exporter.simulator.history" not in graph["exporter.simulator.dcgm_dialect"]
    assert graph["exporter.simulator.series"] == set(), "series.py is a leaf"


def test_no_import_cycles_in_exporter() -> None:
    assert _cycle(_graph()) == []
