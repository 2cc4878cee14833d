"""Effective-cost (FinOps) reports: what the GPU-hours cost and where the money is wasted.

* ``catalog``: the price catalog ($/GPU-hour per GPU model, MIG slices by share, per-cluster
  overrides; ``fixtures/prices/default.yaml`` documents the illustrative defaults);
* ``costs``: ``cost_report(fleet, scores, findings, catalog, group_by=...)`` -> ``CostReport``
  with the cost identity (see ``analyzer.finops.costs``) and ``daily_rollups`` whose columns
  (``ROLLUP_COLUMNS``) the rollup store (``analyzer.finops.store``) persists;
* ``outputs``: FOCUS-aligned CSV, JSON and the self-contained HTML page;
* ``report_cli``: ``truegpu report``.

Names are re-exported lazily: importing this package (as ``truegpu report`` does before
parsing its arguments) loads neither pandas nor numpy.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Catalog": "catalog", "CatalogError": "catalog", "ModelPrice": "catalog", "load_catalog": "catalog",
    "default_catalog": "catalog", "DEFAULT_CATALOG_PATH": "catalog",
    "CostReport": "costs", "cost_report": "costs", "daily_rollups": "costs", "GROUP_BY": "costs",
    "ROLLUP_GROUP_BY": "costs",
    "ROLLUP_COLUMNS": "costs", "ROLLUP_KEY_COLUMNS": "costs", "ROLLUP_HOUR_COLUMNS": "costs",
    "ROLLUP_COST_COLUMNS": "costs", "UNALLOCATED": "costs", "load_team_map": "costs",
    "to_focus_csv": "outputs", "to_json": "outputs", "from_json": "outputs", "render_html": "outputs",
    "write_html": "outputs", "FOCUS_COLUMNS": "outputs",
}
__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
