"""The house rules of the layout: no import cycles anywhere, no function over 120 lines.

An import placed inside a function to dodge a cycle still couples the two modules both ways; what
both sides need belongs in a leaf module (exporter/simulator/series.py, analyzer/analysis/rows.py,
analyzer/service/fmt.py). Imports under ``if TYPE_CHECKING:`` are for annotations only and do not
count; a package importing its own submodules (``analyzer/service/__init__.py``) is not a cycle.
"""

from __future__ import annotations

import ast

from tests.conftest import ROOT

PACKAGES = ("exporter", "analyzer", "alerts", "dashboards", "truegpu")
MAX_FUNCTION_LINES = 120


def _module_name(path) -> str:
    rel = path.relative_to(ROOT).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _graph() -> dict[str, set[str]]:
    modules = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
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
            deps |= {t for t in targets if t in modules and t != name and not t.startswith(f"{name}.")}
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


def test_no_import_cycles() -> None:
    graph = _graph()
    assert {"analyzer.pipeline", "analyzer.service.app", "alerts.rules", "dashboards.builder"} <= set(graph)
    assert _cycle(graph) == []


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]


def test_the_service_loop_needs_no_web_framework() -> None:
    """``analyzer/service/loop.py`` (and what it imports) never imports FastAPI: the loop runs headless."""
    graph, seen, todo = _graph(), set(), ["analyzer.service.loop"]
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph[name]
    sources = "".join((ROOT / (n.replace(".", "/") + ".py")).read_text() for n in seen
                      if (ROOT / (n.replace(".", "/") + ".py")).exists())
    assert "fastapi" not in sources


def test_no_function_is_longer_than_120_lines() -> None:
    long = []
    for pkg in PACKAGES:
        for path in (ROOT / pkg).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    lines = node.end_lineno - node.lineno + 1
                    if lines > MAX_FUNCTION_LINES:
                        long.append(f"{path.relative_to(ROOT)}:{node.lineno} {node.name} ({lines} lines)")
    assert long == []


def test_the_test_modules_sharing_scenario_fleets_run_on_one_worker() -> None:
    """Every test module that builds the cached scenario fleets is in the scheduler's unit, and only those."""
    from tests.conftest import SCENARIO_MODULES

    uses = {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py") if p.name != "test_architecture.py"
            and any(name in p.read_text() for name in ("named_scenario_fleet", "evaluate_scenarios"))}
    assert uses == SCENARIO_MODULES


def test_the_slow_units_handed_out_first_exist() -> None:
    """A renamed or removed module in the longest-first list would silently stop being first."""
    from tests.conftest import SLOW_FIRST

    assert SLOW_FIRST[0] == "scenario fleets"
    assert [m for m in SLOW_FIRST[1:] if not (ROOT / m).is_file()] == []
