"""Grafana dashboards generated from the metric contract.

Each module (fleet, node, job, thermal, health, finops, mig) lists its panels once against a
``queries.Dialect`` and names its related dashboards (``LINKS``) and the analyzer finding kinds it
shows as annotations (``FINDINGS``); every dashboard is generated twice, ``truegpu-<key>.json`` for
truegpu's exporter and ``dcgm-<key>.json`` for plain dcgm-exporter data. ``python -m dashboards``
rewrites ``dashboards/generated/`` (committed; tests fail when it drifts) for the default cluster
label; ``python -m dashboards --site FILE --out DIR`` renders them for a site config's.

To add a panel: one ``PanelSpec`` in the dashboard's module with PromQL from ``queries.Dialect``
(both dialects at once), then ``python -m dashboards``; tests/dashboards lint it with a real promtool.
"""

from __future__ import annotations

from pathlib import Path

from dashboards.queries import DEFAULT_CLUSTER_LABEL

GENERATED = Path(__file__).resolve().parent / "generated"
MODULES = ("fleet", "node", "job", "thermal", "health", "finops", "mig")


def build_all(cluster_label: str = DEFAULT_CLUSTER_LABEL) -> dict[str, str]:
    """File name -> dashboard JSON text, for every dashboard in both dialects, for a site's cluster label."""
    import importlib

    from dashboards.builder import dashboard, to_json
    from dashboards.queries import dialects

    mods = [importlib.import_module(f"dashboards.{name}") for name in MODULES]
    titles = {m.KEY: m.TITLE for m in mods}
    files: dict[str, str] = {}
    for mod in mods:
        for d in dialects(cluster_label):
            dash = dashboard(key=mod.KEY, title=mod.TITLE, description=mod.DESCRIPTION, dialect=d,
                             specs=mod.panels(d), links=mod.LINKS, titles=titles, findings=mod.FINDINGS,
                             pages=getattr(mod, "PAGES", ()))
            files[f"{d.name}-{mod.KEY}.json"] = to_json(dash)
    return files


def write_all(target: Path = GENERATED, cluster_label: str = DEFAULT_CLUSTER_LABEL) -> list[Path]:
    """Write every dashboard into ``target``, removing stale ones."""
    target.mkdir(parents=True, exist_ok=True)
    files = build_all(cluster_label)
    for stale in target.glob("*.json"):
        if stale.name not in files:
            stale.unlink()
    paths = []
    for name, text in sorted(files.items()):
        path = target / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths
