"""Cost report outputs: a FOCUS-aligned CSV, JSON (with a lossless round trip) and a self-contained HTML page.

FOCUS (FinOps Open Cost and Usage Specification, focus.finops.org) CSV: one row per
(UTC day, group, GPU model), i.e. a daily usage charge of GPU-hours. Standard columns where
they apply:

* ``BillingPeriodStart``/``BillingPeriodEnd`` = the report window (this is a showback report,
  not an invoice); ``ChargePeriodStart``/``ChargePeriodEnd`` = the part of that UTC day
  inside the window;
* ``ChargeCategory`` "Usage", ``ChargeFrequency`` "Usage-Based", ``ChargeDescription``;
* ``ConsumedQuantity`` = ``PricingQuantity`` = GPU-hours (MIG slices by their share),
  ``ConsumedUnit`` = ``PricingUnit`` = "GPU-Hours";
* ``ListUnitPrice`` = the catalog's price per GPU-hour, ``ListCost`` = ``BilledCost`` = the
  catalog cost of those GPU-hours (empty, never 0, for a model the catalog does not price),
  ``BillingCurrency`` the catalog's currency;
* ``ServiceCategory`` "Compute", ``ServiceName`` "GPU Compute", ``ResourceType`` "GPU",
  ``ResourceId`` the hostname for node reports and the GPU UUID for gpu reports,
  ``ResourceName`` the group, ``SkuId`` the catalog entry, ``ProviderName``,
  ``PublisherName`` and ``InvoiceIssuerName`` the catalog cluster (or "unspecified"),
  ``BillingAccountId``/``BillingAccountName`` the catalog's ``billing_account``,
  ``ChargeClass`` empty (no row corrects an earlier one);
* ``Tags``: JSON object with the group's namespace / job / team / hostname / model.

Every FOCUS 1.x mandatory column is present (``FOCUS_MANDATORY``). Catalog prices are list
prices with no amortized commitments or negotiated discounts, so ``EffectiveCost`` (FOCUS's
amortized cost), ``ContractedCost``, ``ListCost`` and ``BilledCost`` are equal. FOCUS's
"effective" is not ours: the cost of the GPU-hours that did real SM work is
``x_EffectiveGpuHours`` / ``x_EffectiveWorkCost``.
Every truegpu metric is an ``x_``-prefixed column: one per cost-identity component in
GPU-hours and in dollars (``analyzer.finops.costs``), the waste total, the unpriced hours.
"""

from __future__ import annotations

import csv
import io
import json
import math
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analyzer.data.coverage import MOSTLY_EMPTY, Coverage, coverage_unknown
from analyzer.findings import json_ready
from analyzer.finops.costs import (
    COMPONENTS,
    DETAIL_COLUMNS,
    NORMAL_COMPONENTS,
    UNALLOCATED,
    WASTE_COMPONENTS,
    CostReport,
    normalize_detail,
    savings,
    summarize,
)
from analyzer.report import svg
from analyzer.report.html import CSS, UNKNOWN, card, cell, fmt_hours, fmt_pct, table
from analyzer.report.svg import esc

JSON_SCHEMA = "truegpu.cost_report/v2"
#: Earlier schemas ``from_json`` still reads (v1: no normal parts; its "underused" held them).
READABLE_SCHEMAS = ("truegpu.cost_report/v1", JSON_SCHEMA)
CONSUMED_UNIT = "GPU-Hours"

_CAMEL = {c: "".join(w.capitalize() for w in c.split("_")) for c in COMPONENTS}
_IDENTITY = (f"cost = {' + '.join(COMPONENTS)}; waste (recoverable) = {' + '.join(WASTE_COMPONENTS)}; "
             f"normal (not waste) = {' + '.join(NORMAL_COMPONENTS)}")


def _x_cost(c: str) -> str:
    if c == "effective":
        return "x_EffectiveWorkCost"
    return f"x_Waste{_CAMEL[c]}Cost" if c in WASTE_COMPONENTS else f"x_{_CAMEL[c]}Cost"


def _x_hours(c: str) -> str:
    return f"x_Waste{_CAMEL[c]}GpuHours" if c in WASTE_COMPONENTS else f"x_{_CAMEL[c]}GpuHours"


#: Standard FOCUS columns written, in order: FOCUS 1.x's mandatory set (FOCUS_MANDATORY) plus the
#: conditional ones that apply to GPU usage.
FOCUS_STANDARD_COLUMNS: tuple[str, ...] = (
    "BillingAccountId", "BillingAccountName", "BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart",
    "ChargePeriodEnd", "ChargeCategory", "ChargeClass", "ChargeFrequency", "ChargeDescription", "BilledCost",
    "EffectiveCost", "ListCost", "ContractedCost", "ListUnitPrice", "BillingCurrency", "ConsumedQuantity",
    "ConsumedUnit", "PricingQuantity", "PricingUnit", "InvoiceIssuerName", "ProviderName", "PublisherName",
    "ServiceCategory", "ServiceName", "ResourceId", "ResourceName", "ResourceType", "SkuId", "Tags",
)
#: FOCUS 1.x mandatory columns (every row carries them).
FOCUS_MANDATORY: tuple[str, ...] = (
    "BilledCost", "BillingAccountId", "BillingAccountName", "BillingCurrency", "BillingPeriodEnd",
    "BillingPeriodStart", "ChargeCategory", "ChargeClass", "ChargeDescription", "ChargePeriodEnd",
    "ChargePeriodStart", "ContractedCost", "EffectiveCost", "InvoiceIssuerName", "ListCost", "PricingQuantity",
    "PricingUnit", "ProviderName", "PublisherName", "ServiceCategory", "ServiceName",
)
#: truegpu's own columns (x_ prefix, as FOCUS asks of custom columns).
FOCUS_X_COLUMNS: tuple[str, ...] = (
    "x_GroupBy", "x_Group", "x_GpuModel", "x_Cluster", "x_AllocatedGpuHours",
    *(_x_hours(c) for c in COMPONENTS), "x_WasteGpuHours", "x_NormalGpuHours", "x_UnpricedGpuHours",
    *(_x_cost(c) for c in COMPONENTS), "x_WasteCost", "x_NormalCost",
)
FOCUS_COLUMNS: tuple[str, ...] = FOCUS_STANDARD_COLUMNS + FOCUS_X_COLUMNS


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _num(v: Any, digits: int = 6) -> str:
    """A CSV number: rounded, "" for unknown (NaN is never written as 0)."""
    if v is None or (isinstance(v, float | np.floating) and not math.isfinite(v)):
        return ""
    return f"{round(float(v), digits):.{digits}f}".rstrip("0").rstrip(".") or "0"


_NO_RESOURCE = frozenset({UNALLOCATED, "(unknown)"})


def focus_rows(report: CostReport) -> list[dict[str, str]]:
    """The FOCUS CSV rows as dicts of strings (FOCUS_COLUMNS)."""
    out = []
    for r in report.detail.to_dict("records"):
        day0 = datetime.strptime(r["day"], "%Y-%m-%d").replace(tzinfo=UTC).timestamp()
        start, end = max(day0, report.start), min(day0 + 86400.0, report.end)
        priced = r["unpriced_gpu_hours"] <= 0
        cost = r["cost"] if priced else math.nan
        group, model = str(r["group"]), str(r["model"])
        tags = dict(report.tags.get(group, {}))
        if model:
            tags.setdefault("model", model)
        provider = report.cluster or "unspecified"
        row = {
            "BillingAccountId": report.billing_account_id, "BillingAccountName": report.billing_account_name,
            "BillingPeriodStart": _iso(report.start), "BillingPeriodEnd": _iso(report.end),
            "ChargePeriodStart": _iso(start), "ChargePeriodEnd": _iso(end),
            "ChargeCategory": "Usage", "ChargeClass": "", "ChargeFrequency": "Usage-Based",
            "ChargeDescription": f"{r['gpu_hours']:.2f} GPU-hours of {model or 'unknown GPU model'} "
                                 f"({report.group_by} {group})" + ("" if priced else ", unpriced model"),
            # Catalog prices carry no amortized commitments or negotiated discounts: all four costs agree.
            "BilledCost": _num(cost), "EffectiveCost": _num(cost), "ListCost": _num(cost),
            "ContractedCost": _num(cost), "ListUnitPrice": _num(r["unit_price"]),
            "BillingCurrency": report.currency,
            "ConsumedQuantity": _num(r["gpu_hours"]), "ConsumedUnit": CONSUMED_UNIT,
            "PricingQuantity": _num(r["gpu_hours"]), "PricingUnit": CONSUMED_UNIT,
            "InvoiceIssuerName": provider, "ProviderName": provider, "PublisherName": provider,
            "ServiceCategory": "Compute", "ServiceName": "GPU Compute",
            "ResourceId": group if report.group_by in ("node", "gpu") and group not in _NO_RESOURCE else "",
            "ResourceName": group, "ResourceType": "GPU", "SkuId": r["sku"] if isinstance(r["sku"], str) else "",
            "Tags": json.dumps(tags, sort_keys=True),
            "x_GroupBy": report.group_by, "x_Group": group, "x_GpuModel": model, "x_Cluster": report.cluster or "",
            "x_AllocatedGpuHours": _num(r["allocated_gpu_hours"]),
            "x_WasteGpuHours": _num(sum(r[f"{c}_gpu_hours"] for c in WASTE_COMPONENTS)),
            "x_NormalGpuHours": _num(sum(r[f"{c}_gpu_hours"] for c in NORMAL_COMPONENTS)),
            "x_UnpricedGpuHours": _num(r["unpriced_gpu_hours"]),
            "x_WasteCost": _num(sum(r[f"{c}_cost"] for c in WASTE_COMPONENTS) if priced else math.nan),
            "x_NormalCost": _num(sum(r[f"{c}_cost"] for c in NORMAL_COMPONENTS) if priced else math.nan),
        }
        for c in COMPONENTS:
            row[_x_hours(c)] = _num(r[f"{c}_gpu_hours"])
            row[_x_cost(c)] = _num(r[f"{c}_cost"] if priced else math.nan)
        out.append({k: row[k] for k in FOCUS_COLUMNS})
    return out


def to_focus_csv(report: CostReport) -> str:
    """The FOCUS-aligned CSV as text (header row first)."""
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=list(FOCUS_COLUMNS), lineterminator="\n")
    writer.writeheader()
    writer.writerows(focus_rows(report))
    return buf.getvalue()


# ------------------------------------------------------------------ JSON


def to_json(report: CostReport) -> dict[str, Any]:
    """JSON-ready dict: window, catalog, fleet totals, groups (with derived ratios) and the
    (day, group, model) detail that ``from_json`` rebuilds the report from."""
    return json_ready({
        "schema": JSON_SCHEMA,
        "group_by": report.group_by,
        "start": _iso(report.start), "end": _iso(report.end),
        "start_unix": report.start, "end_unix": report.end, "step_seconds": report.step,
        "currency": report.currency, "cluster": report.cluster, "catalog_source": report.catalog_source,
        "billing_account": {"id": report.billing_account_id, "name": report.billing_account_name},
        "team_label": report.team_label,
        "identity": _IDENTITY,
        "totals": report.totals,
        "savings": savings(report),
        "coverage": report.coverage.as_dict(),
        "groups": [{**g, "tags": report.tags.get(str(g["group"]), {})} for g in report.groups.to_dict("records")],
        "unpriced_models": report.unpriced_models,
        "straggler_findings_gpu_hours": report.straggler_findings_gpu_hours,
        "notes": list(report.notes),
        "detail": report.detail.to_dict("records"),
    })


def from_json(data: dict[str, Any]) -> CostReport:
    """Rebuild a CostReport from ``to_json``'s dict (groups and totals recomputed from the detail)."""
    if data.get("schema") not in READABLE_SCHEMAS:
        raise ValueError(f"not a truegpu cost report (schema {data.get('schema')!r}, expected {JSON_SCHEMA!r})")
    rows = data["detail"]
    keys = ("day", "group", "model", "sku", "unit_price")
    detail = normalize_detail(pd.DataFrame({c: [r.get(c, None if c in keys else 0.0) for r in rows]
                                            for c in DETAIL_COLUMNS}))
    groups, totals = summarize(detail)
    return CostReport(
        group_by=data["group_by"], start=float(data["start_unix"]), end=float(data["end_unix"]),
        step=float(data["step_seconds"]), currency=data["currency"], cluster=data.get("cluster"), detail=detail,
        groups=groups, totals=totals, tags={g["group"]: dict(g.get("tags") or {}) for g in data["groups"]},
        unpriced_models=dict(data.get("unpriced_models") or {}),
        straggler_findings_gpu_hours=float(data.get("straggler_findings_gpu_hours") or 0.0),
        catalog_source=data.get("catalog_source", ""), team_label=data.get("team_label"),
        notes=list(data.get("notes") or []),
        coverage=Coverage.from_dict(data["coverage"]) if data.get("coverage") else coverage_unknown(),
        **_billing(data.get("billing_account")),
    )


def _billing(account: Any) -> dict[str, str]:
    if not isinstance(account, dict):
        return {}
    return {"billing_account_id": str(account.get("id") or ""), "billing_account_name": str(account.get("name") or "")}


# ------------------------------------------------------------------ HTML

#: Component -> (label, color) for the charts and the table.
COMPONENT_STYLE: dict[str, tuple[str, str]] = {
    "effective": ("effective", "#2f6db5"),
    "idle_allocated": ("idle", "#c0504d"),
    "masked": ("masked", "#8e44ad"),
    "straggler": ("straggler wait", "#e08a2c"),
    "throttled": ("throttled", "#d4a017"),
    "underused": ("underused", "#7f8c8d"),
    "headroom": ("headroom (healthy)", "#9cc3e6"),
    "bandwidth_bound": ("bandwidth-bound work", "#6fa8dc"),
    "power_capped": ("power-capped (policy)", "#b4a7d6"),
    "unclassified": ("unclassified", "#e0d8b0"),
    "shared_unattributed": ("shared, unattributed", "#d9b38c"),
    "unknown": ("unknown", "#c8c8c8"),
    "unallocated": ("unallocated", "#5b9b5b"),
}
#: Most groups the cost chart shows (the table lists all of them, up to MAX_TABLE_ROWS).
TOP_GROUPS_CHART, MAX_TABLE_ROWS = 15, 500


def money(v: Any, currency: str) -> str:
    """"$1,234.56" (USD) or "1,234.56 EUR"; "unknown" for NaN."""
    if v is None or (isinstance(v, float | np.floating) and not math.isfinite(v)):
        return UNKNOWN
    return f"${float(v):,.2f}" if currency == "USD" else f"{float(v):,.2f} {currency}"


def _charts(report: CostReport) -> str:
    g = report.groups
    cur = report.currency
    if g.empty or not (g["cost"] > 0).any():
        return svg.empty_chart("cost-by-group", "Cost by group", "no priced GPU-hours in this window")
    top = g.sort_values("cost", ascending=False, kind="stable").head(TOP_GROUPS_CHART)
    stacks = [(COMPONENT_STYLE[c][0], COMPONENT_STYLE[c][1], top[f"{c}_cost"].to_numpy()) for c in COMPONENTS
              if (top[f"{c}_cost"] > 0).any()]
    by_group = svg.stacked_hbar_chart(
        "cost-by-group", [str(x) for x in top["group"]], stacks,
        title=f"Cost by {report.group_by}: effective work, recoverable waste, normal headroom",
        desc=f"Cost in {cur} of the {len(top)} most costly groups, split into effective work, recoverable waste, "
             "the normal headroom of healthy work, unclassified, unknown and unallocated capacity.",
        x_label=f"cost ({cur})", value_fmt=lambda v: money(v, cur),
    )
    comps = [c for c in (*WASTE_COMPONENTS, "unallocated", "unknown")]
    vals = [report.totals[f"{c}_cost"] for c in comps]
    breakdown = svg.hbar_chart(
        "waste-breakdown", [COMPONENT_STYLE[c][0] for c in comps], vals,
        title="Where the money did no work (recoverable waste first)",
        desc=f"Fleet cost in {cur} of each recoverable waste part, unallocated capacity and unmeasured hours.",
        x_label=f"cost ({cur})", value_text=[money(v, cur) for v in vals], legend="fleet total",
    )
    return f'<section id="charts"><h2>Cost breakdown</h2>{by_group}{breakdown}</section>'


def _groups_table(report: CostReport) -> str:
    cur = report.currency
    headers = [(report.group_by.capitalize(), False), ("GPU-h", True), ("Effective GPU-h", True), ("Cost", True),
               ("Effective work", True), *((COMPONENT_STYLE[c][0].capitalize(), True) for c in WASTE_COMPONENTS),
               ("Normal headroom", True), ("Unclassified", True), ("Unknown", True), ("Unallocated", True),
               ("Waste share", True), ("Cost / effective GPU-h", True), ("Cost / attainable GPU-h", True)]
    unpriced = report.totals.get("unpriced_gpu_hours", 0.0) > 0
    if unpriced:
        headers.append(("Unpriced GPU-h", True))
    rows = []
    for r in report.groups.head(MAX_TABLE_ROWS).to_dict("records"):
        share = r["waste_cost"] / r["cost"] if r["cost"] > 0 else math.nan
        rows.append(
            "<tr>" + cell(str(r["group"])) + cell(fmt_hours(r["gpu_hours"]), "n")
            + cell(fmt_hours(r["effective_gpu_hours"]), "n") + cell(money(r["cost"], cur), "n")
            + cell(money(r["effective_cost"], cur), "n")
            + "".join(cell(money(r[f"{c}_cost"], cur), "n") for c in WASTE_COMPONENTS)
            + cell(money(sum(r[f"{c}_cost"] for c in NORMAL_COMPONENTS), cur), "n")
            + cell(money(r["unclassified_cost"], cur), "n")
            + cell(money(r["unknown_cost"], cur), "n") + cell(money(r["unallocated_cost"], cur), "n")
            + cell(fmt_pct(share), "n") + cell(money(r["cost_per_effective_gpu_hour"], cur), "n")
            + cell(money(r["cost_per_attainable_gpu_hour"], cur), "n")
            + (cell(fmt_hours(r["unpriced_gpu_hours"]), "n") if unpriced else "") + "</tr>"
        )
    more = (f'<p class="note">Showing {MAX_TABLE_ROWS} of {len(report.groups):,} groups (all are in the CSV/JSON).</p>'
            if len(report.groups) > MAX_TABLE_ROWS else "")
    return f'<section id="groups"><h2>By {esc(report.group_by)}</h2>{table(headers, rows)}{more}</section>'


def _headline(report: CostReport) -> str:
    t, cur = report.totals, report.currency
    eff_share = t["effective_cost"] / t["cost"] if t["cost"] > 0 else math.nan
    waste_share = t["waste_cost"] / t["cost"] if t["cost"] > 0 else math.nan
    cards = [
        card("total cost", money(t["cost"], cur), f"{fmt_hours(t['gpu_hours'])} GPU-hours"),
        card("effective work", money(t["effective_cost"], cur), f"{fmt_pct(eff_share)} of the cost"),
        card("recoverable waste", money(t["waste_cost"], cur), f"{fmt_pct(waste_share)} of the cost", warn=True),
        card("normal headroom", money(sum(t[f"{c}_cost"] for c in NORMAL_COMPONENTS), cur),
             "healthy work's normal gap, bandwidth-bound work, power caps: not waste"),
        card("unallocated capacity", money(t["unallocated_cost"], cur),
              f"{fmt_hours(t['unallocated_gpu_hours'])} GPU-hours"),
        card("cost per effective GPU-hour", money(t["cost_per_effective_gpu_hour"], cur),
              "total cost / effective GPU-hours"),
        card("cost per attainable GPU-hour", money(t["cost_per_attainable_gpu_hour"], cur),
              "total cost / (effective + normal headroom) GPU-hours"),
        card("unknown (no data)", money(t["unknown_cost"], cur), f"{fmt_hours(t['unknown_gpu_hours'])} GPU-hours; "
             f"data coverage {fmt_pct(report.coverage.ratio)}", warn=(report.coverage.ratio or 1.0) < MOSTLY_EMPTY),
    ]
    if t["unpriced_gpu_hours"] > 0:
        cards.append(card("unpriced GPU-hours", fmt_hours(t["unpriced_gpu_hours"]), "not in any cost", warn=True))
    return f'<section id="headline"><div class="cards">{"".join(cards)}</div></section>'


def _savings(report: CostReport) -> str:
    """The ranked list of dollars that can be saved, each with its lever: the top of the page."""
    top = savings(report)
    if not top:
        return ('<section id="savings"><h2>What can be saved</h2><p class="note">No recoverable waste in this '
                "window.</p></section>")
    cur = report.currency
    headers = [("#", True), (report.group_by.capitalize(), False), ("Where it goes", False), ("Cost", True),
               ("GPU-h", True), ("How to get it back", False)]
    rows = ["<tr>" + cell(str(i), "n") + cell(r["group"]) + cell(COMPONENT_STYLE[r["part"]][0])
            + cell(money(r["cost"], cur), "n") + cell(fmt_hours(r["gpu_hours"]), "n") + cell(r["lever"]) + "</tr>"
            for i, r in enumerate(top, 1)]
    return f'<section id="savings"><h2>What can be saved</h2>{table(headers, rows)}</section>'


def _notes(report: CostReport) -> str:
    items = list(report.notes)
    if report.unpriced_models:
        items.insert(0, "Unpriced GPU models (add them to the price catalog): " + ", ".join(
            f"{m} ({h:,.1f} GPU-h)" for m, h in report.unpriced_models.items()))
    if not items:
        return ""
    lis = "".join(f"<li>{esc(n)}</li>" for n in items)
    return f'<div class="box"><h2>Read this first</h2><ul>{lis}</ul></div>'


def _method() -> str:
    defs = [
        "Cost = GPU-hours × the catalog's price per GPU-hour of the model (a MIG slice pays its share).",
        "cost = effective work + recoverable waste (idle allocated, masked, straggler wait, throttled, underused) "
        "+ normal headroom (headroom of healthy work, bandwidth-bound work, power-capped) + unclassified + unknown + "
        "unallocated, per sample, so per group and for the fleet; nothing is counted twice.",
        "Effective work: allocated GPU-hours × effective utilization (SM activity × SM clock / max clock).",
        "Idle allocated: the whole non-working share of allocated GPUs with nothing launched.",
        "Throttled: SM-active cycles lost to a reduced clock from heat or hardware slowdown; the same under a "
        "power cap is power-capped (site policy, not the owner's waste).",
        "Straggler wait: the waiting peers' share of the straggler findings' lost GPU-hours, capped by their "
        "measured non-working time.",
        "Masked: GPU util reported that no SM activity backs, only where the idle-masking detector flags it.",
        "Bandwidth-bound: the gap of GPUs whose memory bandwidth is at its ceiling (real work, e.g. LLM decode).",
        "Headroom and underused: by the workload's class (site config): the gap healthy work of that class "
        "normally has is headroom, the shortfall below what the class attains is underused. Unclassified: the gap "
        "of workloads of no known class (neither headroom nor waste).",
        "Cost per attainable GPU-hour: cost / (effective work + normal headroom): what healthy work of the class "
        "costs, comparable across classes.",
        "Unknown: GPU-hours with no utilization data (never counted as waste); unallocated: capacity nobody held.",
        "FOCUS CSV: BilledCost, ListCost, ContractedCost and EffectiveCost (FOCUS's amortized cost) are the catalog "
        "list cost (no commitments or discounts to amortize); truegpu's effective-work numbers are the x_ columns.",
    ]
    return ('<section id="method"><h2>How the cost is split</h2><ul class="defs">'
            + "".join(f"<li>{esc(d)}</li>" for d in defs) + "</ul></section>")


def render_html(report: CostReport, *, title: str = "GPU effective-cost report") -> str:
    """The report as one self-contained page (inline CSS and SVG, no script, no external reference)."""
    window = f"{_iso(report.start)} – {_iso(report.end)}"
    meta = (
        '<dl class="meta">'
        f"<dt>Window</dt><dd>{esc(window)}</dd>"
        f"<dt>Grouped by</dt><dd>{esc(report.group_by)}"
        + (f" (team from {esc(report.team_label)})" if report.group_by == "team" and report.team_label else "")
        + "</dd>"
        f"<dt>Prices</dt><dd>{esc(report.catalog_source)}"
        + (f", cluster {esc(report.cluster)}" if report.cluster else "") + f" ({esc(report.currency)})</dd></dl>"
    )
    body = "".join([
        f"<h1>{esc(title)}</h1>", meta, _notes(report), _headline(report), _savings(report), _charts(report),
        _groups_table(report),
        _method(),
        "<footer>Generated by truegpu. Self-contained page: no scripts, no external resources.</footer>",
    ])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
        f"<body><main>{body}</main></body></html>\n"
    )


HTML_NAME = "cost-report.html"


def write_html(report: CostReport, out_dir: str | Path, *, title: str = "GPU effective-cost report") -> Path:
    """Write ``out_dir/cost-report.html`` (directories created) and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / HTML_NAME
    path.write_text(render_html(report, title=title), encoding="utf-8")
    return path


__all__ = [
    "FOCUS_COLUMNS", "HTML_NAME", "JSON_SCHEMA", "UNALLOCATED", "focus_rows", "from_json", "money", "render_html",
    "to_focus_csv", "to_json", "write_html",
]
