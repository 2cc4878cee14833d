"""Effective cost: what the fleet's GPU-hours cost and where the money did no work.

``cost_report(fleet, scores, findings, catalog, group_by=...)`` prices every row of the tidy
frame (``w = step * gpu_share / 3600`` GPU-hours, ``analyzer.analysis.scores``) at its model's catalog
price (``analyzer.finops.catalog``; a MIG slice pays its share) and splits each row's hours,
and so its dollars, into components that add up to the row exactly.

The cost identity (per row, so per group, per day and for the fleet) is the one GPU-hour
partition (``analyzer.analysis.partition``: its docstring defines every part)::

    cost = effective
           + idle_allocated + masked + straggler + throttled + underused     (recoverable waste)
           + headroom + bandwidth_bound + power_capped                      (normal for healthy work)
           + unclassified                                                   (workload class unknown)
           + unknown + unallocated

``waste`` is the recoverable part only; ``attainable`` = effective + the normal parts (what
healthy work of the class turns its hours into), so ``cost_per_attainable_gpu_hour`` compares
healthy jobs of different classes fairly, next to ``cost_per_effective_gpu_hour``.

Dollars: ``component_cost = component_fraction * row_cost``, ``row_cost = step/3600 * share *
price`` (``share`` = ``gpu_share`` or the catalog's ``mig_shares`` entry). Rows of a model the
catalog does not price are counted in ``unpriced_gpu_hours`` and add no dollars (their hours are
still split); the report names the models: they are never priced at $0 silently.

Grouping (``group_by``): namespace, workload, team, user and account (a Slurm job's, from
truegpu_slurm_job_info) group allocated rows and put every unallocated row into one
``UNALLOCATED`` group (capacity nobody holds is not a namespace's cost); allocated rows without
the label (or a job without accounting) go to ``(unknown)``, teams not in the map to
``(unmapped)``; the activity of a shared GPU that no holder's process explains (analyzer.analysis.shares)
to ``(shared, unattributed)``. node, model and gpu (the GPU UUID, FOCUS ResourceId) group every row: their
``unallocated_*`` columns hold the idle capacity of that node/model/GPU. Sum over groups =
fleet total in every case.

``cost_per_effective_gpu_hour = cost / effective_gpu_hours`` (unallocated capacity included for
the fleet, node and model; unknown where part of the group is unpriced).

Daily rollups (``daily_rollups``): rows per (UTC day of the row's timestamp, group, GPU model) with the
additive columns only (``ROLLUP_COLUMNS``); ratios are recomputed from their sums.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analysis.partition import (
    ATTAINABLE,
    LEVERS,
    NORMAL,
    PARTS,
    WASTE,
    per_category,
    row_parts,
    split_parts,
)
from analyzer.analysis.scores import Scores
from analyzer.analysis.shares import holder_rows
from analyzer.data.coverage import Coverage, coverage_unknown
from analyzer.data.frame import Fleet
from analyzer.data.signals import ALLOCATION_COLUMN_OF, ALLOCATION_COLUMNS, ALLOCATION_LABELS
from analyzer.findings import IDLE_MASKING, STRAGGLER, Finding
from analyzer.finops.catalog import DEFAULT_BILLING_ACCOUNT, Catalog
from analyzer.site import SiteConfig
from exporter.schema import WORKLOAD

GROUP_BY: tuple[str, ...] = ("namespace", WORKLOAD, "team", "user", "account", "node", "model", "gpu")
#: Groupings by a Slurm job's accounting (Fleet.accounting).
ACCOUNTING_GROUP_BY: tuple[str, ...] = ("user", "account")
#: What the daily rollup store keeps by default: per-GPU rows are a report, not a history to keep.
ROLLUP_GROUP_BY: tuple[str, ...] = tuple(g for g in GROUP_BY if g != "gpu")
#: Group of the capacity nobody held (namespace/job/team reports).
UNALLOCATED = "(unallocated)"
#: Allocated rows without the grouping label.
UNKNOWN_GROUP = "(unknown)"
#: Allocated rows whose team-map key has no team.
UNMAPPED = "(unmapped)"
#: The share of shared GPUs no holder's process explains (the partition's shared_unattributed).
UNATTRIBUTED_SHARE = "(shared, unattributed)"
#: Groupings that name holders (each holder of a shared GPU gets its own share); the others group GPUs.
HOLDER_GROUP_BY: tuple[str, ...] = ("namespace", WORKLOAD, "team", "user", "account")

#: The finding kinds the split reads (straggler wait, masked): run at least these before cost_report.
COST_FINDING_KINDS: tuple[str, ...] = (STRAGGLER, IDLE_MASKING)
#: The cost identity's components: the parts of the one GPU-hour partition (analyzer.analysis.partition).
COMPONENTS: tuple[str, ...] = PARTS
#: Recoverable waste; the other unused parts are normal for healthy work (analyzer.analysis.partition).
WASTE_COMPONENTS: tuple[str, ...] = WASTE
#: Unused but normal: the headroom of healthy work, bandwidth-bound work, power caps.
NORMAL_COMPONENTS: tuple[str, ...] = NORMAL

#: Additive GPU-hour columns: total, allocated, one per component, and the unpriced hours (a subset).
ROLLUP_HOUR_COLUMNS: tuple[str, ...] = (
    "gpu_hours", "allocated_gpu_hours", *(f"{c}_gpu_hours" for c in COMPONENTS), "unpriced_gpu_hours",
)
#: Additive dollar columns (in ``currency``): total priced cost and one per component.
ROLLUP_COST_COLUMNS: tuple[str, ...] = ("cost", *(f"{c}_cost" for c in COMPONENTS))
#: Key columns of a daily rollup row: ``day`` is the UTC date "YYYY-MM-DD" of the rows' timestamps,
#: ``group_by`` one of GROUP_BY, ``group`` its value (or UNALLOCATED/UNKNOWN_GROUP/UNMAPPED), ``model``
#: the GPU model (so a report from the store still names each row's SKU and list price). Every
#: other column is a float (the store keeps numeric columns only): the currency and the catalog's
#: cluster are in ``DataFrame.attrs`` ("currency", "cluster"); keep one store per cluster/currency.
ROLLUP_KEY_COLUMNS: tuple[str, ...] = ("day", "group_by", "group", "model")
#: The row schema the rollup store persists: keys, then additive GPU-hours and dollars (never ratios).
ROLLUP_COLUMNS: tuple[str, ...] = ROLLUP_KEY_COLUMNS + ROLLUP_HOUR_COLUMNS + ROLLUP_COST_COLUMNS
_SUM_COLUMNS: tuple[str, ...] = ROLLUP_HOUR_COLUMNS + ROLLUP_COST_COLUMNS
#: Per (day, group, model) detail: keys, the model's catalog SKU and unit price, then the sums.
DETAIL_COLUMNS: tuple[str, ...] = ("day", "group", "model", "sku", "unit_price", *_SUM_COLUMNS)
#: Derived per-group columns (recomputed from the sums, never stored).
DERIVED_COLUMNS: tuple[str, ...] = (
    "waste_gpu_hours", "waste_cost", "attainable_gpu_hours", "cost_per_effective_gpu_hour",
    "cost_per_attainable_gpu_hour",
)


@dataclass
class CostReport:
    """Costs of one fleet window grouped by ``group_by`` (see the module docstring)."""

    group_by: str
    start: float
    end: float
    step: float
    currency: str
    cluster: str | None
    #: Per (day, group, model): DETAIL_COLUMNS.
    detail: pd.DataFrame
    #: Per group: "group", ROLLUP_HOUR_COLUMNS, ROLLUP_COST_COLUMNS, DERIVED_COLUMNS, most costly first
    #: (the special groups last).
    groups: pd.DataFrame
    #: Fleet totals: the same columns summed over the groups, plus derived values.
    totals: dict[str, float]
    #: group -> tags for the FOCUS ``Tags`` column (namespace/job/team where known).
    tags: dict[str, dict[str, str]] = field(default_factory=dict)
    #: Model names the catalog does not price -> their GPU-hours.
    unpriced_models: dict[str, float] = field(default_factory=dict)
    #: What the straggler findings claimed (lost GPU-hours) before the cap of the identity.
    straggler_findings_gpu_hours: float = 0.0
    catalog_source: str = ""
    team_label: str | None = None
    notes: list[str] = field(default_factory=list)
    #: FOCUS BillingAccountId / BillingAccountName (from the price catalog).
    billing_account_id: str = DEFAULT_BILLING_ACCOUNT
    billing_account_name: str = ""
    #: How much of the window has data (its hours without data are the ``unknown`` component).
    coverage: Coverage = field(default_factory=coverage_unknown)


# ------------------------------------------------------------------ team map


def load_team_map(path: str | Path) -> dict[str, str]:
    """A YAML/JSON mapping ``label value -> team`` (keys may be globs like ``ml-*``)."""
    from analyzer.yamlfile import read_yaml

    p = Path(path)
    data = read_yaml(p, "team map")
    if not isinstance(data, Mapping) or not data:
        raise ValueError(f"team map {p}: expected a non-empty mapping of namespace (or --team-label value) -> team")
    bad = [k for k, v in data.items() if not isinstance(v, str) or not v]
    if bad:
        raise ValueError(f"team map {p}: team names must be non-empty strings (bad: {', '.join(map(str, bad[:5]))})")
    return {str(k): v for k, v in data.items()}


def _team_of(team_map: Mapping[str, str] | None) -> Any:
    def team(value: str) -> str:
        if team_map is None:
            return value
        if value in team_map:
            return team_map[value]
        for pattern, t in team_map.items():
            if any(ch in pattern for ch in "*?[") and fnmatch.fnmatchcase(value, pattern):
                return t
        return UNMAPPED

    return team


# ------------------------------------------------------------------ per-row split


def _group_keys(fleet: Fleet, group_by: str, alloc: np.ndarray, team_label: str,
                team_map: Mapping[str, str] | None) -> np.ndarray:
    fr = fleet.frame
    n = len(fr)
    if group_by == "node":
        return per_category(fr["hostname"], str, UNKNOWN_GROUP) if n else np.zeros(0, object)
    if group_by == "model":
        return per_category(fr["model"], lambda v: v or UNKNOWN_GROUP, UNKNOWN_GROUP) if n else np.zeros(0, object)
    if group_by == "gpu":  # the GPU UUID (FOCUS ResourceId), a MIG instance as UUID/instance
        if not n:
            return np.zeros(0, object)
        uuid = per_category(fr["uuid"], lambda v: v or UNKNOWN_GROUP, UNKNOWN_GROUP)
        inst = per_category(fr["gpu_instance"], str, "") if "gpu_instance" in fr.columns else np.full(n, "", object)
        return np.where(inst != "", uuid + "/" + inst, uuid)
    if group_by in ACCOUNTING_GROUP_BY:  # a Slurm job's user or account; an allocation without one is unknown
        acct = fleet.accounting
        of_job = dict(zip(acct["job"].astype(str), acct[group_by].astype(str), strict=True))
        keys = per_category(fr["job"], lambda j: of_job.get(j) or UNKNOWN_GROUP, UNKNOWN_GROUP) \
            if "job" in fr.columns else np.full(n, UNKNOWN_GROUP, dtype=object)
        return np.where(alloc, keys, UNALLOCATED)
    col = team_label if group_by == "team" else ALLOCATION_COLUMN_OF.get(group_by, group_by)
    if col not in fr.columns:
        keys = np.full(n, UNKNOWN_GROUP if group_by != "team" else UNMAPPED, dtype=object)
    elif group_by == "team":
        keys = per_category(fr[col], _team_of(team_map), UNMAPPED)
    else:
        keys = per_category(fr[col], lambda v: v or UNKNOWN_GROUP, UNKNOWN_GROUP)
    return np.where(alloc, keys, UNALLOCATED)


def _prices(fleet: Fleet, catalog: Catalog) -> tuple[np.ndarray, np.ndarray, dict[str, tuple[str | None, float]]]:
    """Per row: dollars per row (NaN when unpriced) and the priced flag; per model: (sku, unit price)."""
    fr = fleet.frame
    n = len(fr)
    share = fr["gpu_share"].to_numpy(dtype=np.float64) if n else np.zeros(0)
    models = fr["model"].astype("category") if n else pd.Series([], dtype="category")
    per_model: dict[str, tuple[str | None, float]] = {}
    prices = []
    entries = []
    for m in models.cat.categories:
        entry = catalog.lookup(str(m))
        entries.append(entry)
        prices.append(np.nan if entry is None else entry.price_per_gpu_hour)
        per_model[str(m)] = (None, np.nan) if entry is None else (entry.key, entry.price_per_gpu_hour)
    codes = models.cat.codes.to_numpy() if n else np.zeros(0, np.int64)
    price = np.append(np.asarray(prices, dtype=np.float64), np.nan)[codes]
    if any(e is not None and e.mig_shares for e in entries) and "mig_profile" in fr.columns:
        profiles = fr["mig_profile"].astype(str).to_numpy()
        share = share.copy()
        for i, entry in enumerate(entries):
            if entry is None or not entry.mig_shares:
                continue
            for prof, s in entry.mig_shares.items():
                share[(codes == i) & (profiles == prof)] = s
    return price * share * (fleet.step / 3600.0), ~np.isnan(price), per_model


# ------------------------------------------------------------------ aggregation


def _derive(t: pd.DataFrame) -> pd.DataFrame:
    t = t.copy()
    t["waste_gpu_hours"] = sum(t[f"{c}_gpu_hours"] for c in WASTE_COMPONENTS)
    t["waste_cost"] = sum(t[f"{c}_cost"] for c in WASTE_COMPONENTS)
    t["attainable_gpu_hours"] = sum(t[f"{c}_gpu_hours"] for c in ATTAINABLE)
    priced = t["unpriced_gpu_hours"] <= 0
    with np.errstate(invalid="ignore", divide="ignore"):
        cpe = t["cost"] / t["effective_gpu_hours"]
        cpa = t["cost"] / t["attainable_gpu_hours"]
    t["cost_per_effective_gpu_hour"] = cpe.where((t["effective_gpu_hours"] > 0) & priced)
    t["cost_per_attainable_gpu_hour"] = cpa.where((t["attainable_gpu_hours"] > 0) & priced)
    return t


_SPECIAL = (UNKNOWN_GROUP, UNMAPPED, UNATTRIBUTED_SHARE, UNALLOCATED)


def normalize_detail(detail: pd.DataFrame) -> pd.DataFrame:
    """DETAIL_COLUMNS in order with fixed dtypes: text keys, ``sku`` None when unpriced, floats."""
    out = pd.DataFrame(index=pd.RangeIndex(len(detail)))
    for c in DETAIL_COLUMNS:
        v = detail[c].reset_index(drop=True)
        if c in ("day", "group", "model"):
            out[c] = v.astype(str)
        elif c == "sku":
            out[c] = pd.Series([x if isinstance(x, str) else None for x in v], dtype=object)
        else:
            out[c] = v.astype("float64")
    return out


def summarize(detail: pd.DataFrame) -> tuple[pd.DataFrame, dict[str, float]]:
    """Per-group table and fleet totals from the (day, group, model) detail."""
    sums = list(_SUM_COLUMNS)
    if detail.empty:
        groups = pd.DataFrame({c: pd.Series(dtype="float64") for c in sums})
        groups.insert(0, "group", pd.Series(dtype="object"))
    else:
        groups = detail.groupby("group", sort=False)[sums].sum().reset_index()
    groups = _derive(groups)
    special = groups["group"].map(lambda g: _SPECIAL.index(g) + 1 if g in _SPECIAL else 0)
    order = np.lexsort((groups["group"].astype(str).to_numpy(), -groups["cost"].to_numpy(), special.to_numpy()))
    groups = groups.iloc[order].reset_index(drop=True)
    total = _derive(pd.DataFrame([detail[sums].sum() if not detail.empty else pd.Series(0.0, index=sums)]))
    totals = {k: float(v) for k, v in total.iloc[0].items()}
    return groups, totals


def cost_report(
    fleet: Fleet,
    scores: Scores,
    findings: Sequence[Finding],
    catalog: Catalog,
    *,
    group_by: str = "namespace",
    team_label: str | None = None,
    team_map: Mapping[str, str] | None = None,
    site: SiteConfig | None = None,
) -> CostReport:
    """Costs of ``fleet``'s window grouped by ``group_by`` (one of GROUP_BY; see the module docstring).

    ``team_label``: the allocation column (namespace, job, pod, container; default namespace) whose
    value ``team_map`` maps to a team (exact keys or globs); without a map the value is the team.
    """
    if group_by not in GROUP_BY:
        raise ValueError(f"group_by must be one of {', '.join(GROUP_BY)}, got {group_by!r}")
    label = team_label or "namespace"
    if label not in ALLOCATION_COLUMNS:
        raise ValueError(f"team_label must be one of {', '.join(ALLOCATION_COLUMNS)}, got {label!r}")
    fr = fleet.frame
    fractions, alloc, claimed = row_parts(fleet, scores, findings, site)
    w = fr["gpu_share"].to_numpy(dtype=np.float64) * (fleet.step / 3600.0)
    row_cost, priced, per_model = _prices(fleet, catalog)
    dollars = np.where(priced, row_cost, 0.0)
    keys = _group_keys(fleet, group_by, alloc, label, team_map)
    cols: dict[str, np.ndarray] = {
        "gpu_hours": w,
        "allocated_gpu_hours": np.where(alloc, w, 0.0),
        **{f"{c}_gpu_hours": f * w for c, f in fractions.items()},
        "unpriced_gpu_hours": np.where(priced, 0.0, w),
        "cost": dollars,
        **{f"{c}_cost": f * dollars for c, f in fractions.items()},
    }
    ts = fr["timestamp"].to_numpy(dtype=np.float64) if len(fr) else np.zeros(0)
    day = np.floor(ts / 86400.0).astype(np.int64)
    model = per_category(fr["model"], str, "") if len(fr) else np.zeros(0, object)
    cut = split_parts(fleet, cols, ALLOCATION_COLUMNS, {"group": keys, "day": day, "model": model, "alloc": alloc},
                      suffixes=("_gpu_hours", "_cost"))
    if cut is not None:  # shared GPUs: each holder its share, the unexplained rest its own group
        cols, k, rest = cut
        day, model, keys = k["day"].astype(np.int64), k["model"], k["group"]
        if group_by in HOLDER_GROUP_BY:
            entries = replace(fleet, frame=pd.DataFrame({c: pd.Categorical(k[c]) for c in ALLOCATION_COLUMNS
                                                         if c in k}))
            keys = np.where(rest, UNATTRIBUTED_SHARE,
                            _group_keys(entries, group_by, k["alloc"].astype(bool), label, team_map))
    if len(keys):
        # Sums per (day, group, model) with bincount: no row-level DataFrame of ~30 columns to build.
        codes, uniques = zip(*(pd.factorize(a, sort=True) for a in (day, keys, model)), strict=True)
        combined = (codes[0] * len(uniques[1]) + codes[1]) * len(uniques[2]) + codes[2]
        found, ids = np.unique(combined, return_inverse=True)
        detail = pd.DataFrame({c: np.bincount(ids, weights=v, minlength=len(found)) for c, v in cols.items()})
        m, k = len(uniques[2]), len(uniques[1])
        detail.insert(0, "model", np.asarray(uniques[2], dtype=object)[found % m])
        detail.insert(0, "group", np.asarray(uniques[1], dtype=object)[(found // m) % k])
        detail.insert(0, "day", [datetime.fromtimestamp(int(d) * 86400, UTC).strftime("%Y-%m-%d")
                                 for d in np.asarray(uniques[0])[found // (m * k)]])
    else:
        detail = pd.DataFrame({c: pd.Series(dtype="float64") for c in _SUM_COLUMNS})
        for c in ("day", "group", "model"):
            detail[c] = pd.Series(dtype="object")
    detail["sku"] = [per_model.get(m, (None, np.nan))[0] for m in detail["model"]]
    detail["unit_price"] = np.array([per_model.get(m, (None, np.nan))[1] for m in detail["model"]], dtype=np.float64)
    detail = normalize_detail(detail)
    groups, totals = summarize(detail)
    unpriced = detail[detail["unpriced_gpu_hours"] > 0].groupby("model")["unpriced_gpu_hours"].sum()
    notes = list(scores.notes)
    if len(unpriced):
        notes.append(
            f"unpriced GPU model(s) {', '.join(repr(m) for m in unpriced.index)}: "
            f"{float(unpriced.sum()):,.1f} GPU-hours are not in any cost (add a 'models' entry to the price catalog)"
        )
    if claimed - totals["straggler_gpu_hours"] > max(0.01, 0.001 * claimed):
        notes.append(
            f"straggler findings claim {claimed:,.1f} lost GPU-hours; {totals['straggler_gpu_hours']:,.1f} are "
            "counted as straggler wait (capped by the peers' measured non-working time, so nothing counts twice)"
        )
    return CostReport(
        group_by=group_by, start=fleet.start, end=fleet.end, step=fleet.step, currency=catalog.currency,
        cluster=catalog.cluster, detail=detail, groups=groups, totals=totals,
        tags=_tags(fleet, group_by, groups["group"].tolist(), label, team_map),
        unpriced_models={str(k): float(v) for k, v in unpriced.items()}, straggler_findings_gpu_hours=claimed,
        catalog_source=catalog.source, team_label=label if group_by == "team" or team_map else None, notes=notes,
        coverage=scores.coverage, billing_account_id=catalog.billing_account_id,
        billing_account_name=catalog.billing_account_name,
    )


def _tags(fleet: Fleet, group_by: str, groups: list[str], label: str,
          team_map: Mapping[str, str] | None) -> dict[str, dict[str, str]]:
    """FOCUS Tags per group: the grouping label, plus the job's namespace and the team where known."""
    team = _team_of(team_map)
    fr = fleet.frame
    out: dict[str, dict[str, str]] = {}
    job_ns: dict[str, str] = {}
    if group_by == WORKLOAD and {"job", "namespace"} <= set(fr.columns) and len(fr):
        pairs = holder_rows(fleet, ("job", "namespace")).drop_duplicates().dropna()  # a shared GPU's every holder
        for j, ns in pairs.itertuples(index=False):
            job_ns.setdefault(str(j), str(ns))
    for g in groups:
        if g in _SPECIAL:
            out[g] = {}
            continue
        name = {"node": "hostname", "gpu": "uuid"}.get(group_by, group_by)
        tags = {name: g}
        if group_by == WORKLOAD and g in job_ns:
            tags["namespace"] = job_ns[g]
        if team_map is not None and group_by != "team":
            src = tags.get(ALLOCATION_LABELS[label])
            if src is not None:
                tags["team"] = team(src)
        out[g] = tags
    return out


def savings(report: CostReport, limit: int = 10) -> list[dict[str, Any]]:
    """The largest recoverable amounts, one per (group, waste part), with the lever that recovers each.

    Ranked by dollars (GPU-hours where a group is unpriced); the top of every cost report."""
    g = report.groups
    if g.empty:
        return []
    out = []
    for part in WASTE_COMPONENTS:
        hours, cost = g[f"{part}_gpu_hours"].to_numpy(), g[f"{part}_cost"].to_numpy()
        priced = g["unpriced_gpu_hours"].to_numpy() <= 0
        for i in np.flatnonzero(hours > 0.005):
            out.append({
                "group": str(g["group"].iloc[i]), "part": part, "gpu_hours": float(hours[i]),
                "cost": float(cost[i]) if priced[i] else None, "lever": LEVERS[part],
            })
    out.sort(key=lambda r: (-(r["cost"] if r["cost"] is not None else -1.0), -r["gpu_hours"], r["group"], r["part"]))
    return out[:limit]


def daily_rollups(report: CostReport | Fleet, *args: Any, **kwargs: Any) -> pd.DataFrame:
    """Rows per (UTC day, group, model) with ROLLUP_COLUMNS: additive GPU-hours and dollars only.

    ``daily_rollups(report)`` or ``daily_rollups(fleet, scores, findings, catalog, group_by=...)``.
    Summing rows of any days (and groups) gives that period's numbers; recompute ratios
    (cost per effective GPU-hour, effective share) from the sums, never average them.
    """
    if not isinstance(report, CostReport):
        report = cost_report(report, *args, **kwargs)
    d = report.detail
    sums = list(_SUM_COLUMNS)
    if d.empty:
        out = pd.DataFrame({c: pd.Series(dtype="object" if c in ROLLUP_KEY_COLUMNS else "float64")
                            for c in ROLLUP_COLUMNS})
        out.attrs.update(currency=report.currency, cluster=report.cluster or "")
        return out
    out = d.groupby(["day", "group", "model"], sort=True)[sums].sum().reset_index()
    out["group_by"] = report.group_by
    out = out[list(ROLLUP_COLUMNS)]
    out.attrs.update(currency=report.currency, cluster=report.cluster or "")
    return out
