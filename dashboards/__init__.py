"""Grafana dashboards generated from the metric contract.

Each module (fleet, node, job, thermal, health, finops, mig) lists its panels once against a
``queries.Dialect``; every dashboard is generated twice, ``truegpu-<key>.json`` for truegpu's
exporter and ``dcgm-<key>.json`` for plain dcgm-exporter data. ``python -m dashboards``
rewrites ``dashboards/generated/`` (committed; tests fail when it drifts).
"""

from __future__ import annotations

from pathlib import Path

GENERATED = Path(__file__).resolve().parent / "generated"
MODULES = ("fleet", "node", "job", "thermal", "health", "finops", "mig")


def build_all() -> dict[str, str]:
    """File name -> dashboard JSON text, for every dashboard in both dialects."""
    import importlib

    from dashboards.builder import dashboard, to_json
    from dashboards.queries import DIALECTS

    files: dict[str, str] = {}
    for name in MODULES:
        mod = importlib.import_module(f"dashboards.{name}")
        for d in DIALECTS:
            dash = dashboard(key=mod.KEY, title=mod.TITLE, description=mod.DESCRIPTION, dialect=d,
                             specs=mod.panels(d))
            files[f"{d.name}-{mod.KEY}.json"] = to_json(dash)
    return files


def write_all(target: Path = GENERATED) -> list[Path]:
    target.mkdir(parents=True, exist_ok=True)
    files = build_all()
    for stale in target.glob("*.json"):
        if stale.name not in files:
            stale.unlink()
    paths = []
    for name, text in sorted(files.items()):
        path = target / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
