"""The exporter runs on every GPU node: it must never pull in the analyzer's heavy stack."""

from __future__ import annotations

import ast
import json
import subprocess
import sys

from tests.conftest import ROOT

FORBIDDEN = ("pandas", "sklearn", "scipy", "analyzer", "fastapi")
EXPORTER = ROOT / "exporter"

_PROBE = """
import importlib, json, pkgutil, sys
import exporter
failed = {}
for mod in pkgutil.walk_packages(exporter.__path__, "exporter."):
    try:
        importlib.import_module(mod.name)
    except Exception as exc:  # reported, so a broken module fails the test with its reason
        failed[mod.name] = repr(exc)
from truegpu.cli import build_parser
argv = ["exporter", "--source", "simulated", "--scenario", "mixed-fleet", "--listen", "127.0.0.1:0"]
args = build_parser(argv).parse_args(argv)
assert args.func.__module__ == "exporter.server", args.func
forbidden = %r
loaded = sorted(m for m in sys.modules if m.split(".")[0] in forbidden)
ours = sorted(m for m in sys.modules if m.startswith("exporter"))
print(json.dumps({"failed": failed, "loaded": loaded, "imported": ours}))
"""


def test_importing_every_exporter_module_loads_no_heavy_stack():
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE % (FORBIDDEN,)], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["failed"] == {}, f"exporter modules that do not import: {report['failed']}"
    assert report["loaded"] == [], f"the exporter imported {report['loaded']}"
    expected = {"exporter.collector", "exporter.server", "exporter.sources", "exporter.sources.base", "exporter.schema"}
    assert expected <= set(report["imported"])


def _imported_modules(tree: ast.AST) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            found.append((node.lineno, node.args[0].value))
    return found


def test_static_scan_finds_no_forbidden_imports():
    files = sorted(EXPORTER.rglob("*.py"))
    assert EXPORTER / "server.py" in files
    bad = [
        f"{path.relative_to(ROOT)}:{line}: {name}"
        for path in files
        for line, name in _imported_modules(ast.parse(path.read_text(), str(path)))
        if name.split(".")[0] in FORBIDDEN
    ]
    assert bad == [], "exporter/ must not import the analyzer stack:\n" + "\n".join(bad)


def test_static_scan_would_catch_an_import():
    """The scanner itself finds each form of import (so an empty result above means something)."""
    src = "import pandas as pd\nfrom sklearn.cluster import KMeans\nimportlib.import_module('scipy')\n"
    names = [name for _, name in _imported_modules(ast.parse(src))]
    assert {"pandas", "sklearn.cluster", "scipy"} <= set(names)

