"""The `/` page of `truegpu serve`: a small self-contained overview of the latest analysis.

Fleet reported vs effective utilization, the GPU-hours that matter, the most urgent
findings and the cost of the window (when prices are configured). Inline CSS (the HTML
report's), no script, no external resource; every string from the data is escaped. The
numbers carry ids (``reported-util``, ``effective-util``, ...) so tests and scrapers can find
them.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from analyzer.analysis.scores import fleet_summary
from analyzer.findings import Finding, rfc3339, sort_findings
from analyzer.report.html import CSS, UNKNOWN, fmt_hours, fmt_pct, fmt_pts, table
from analyzer.report.svg import esc
from analyzer.service.fmt import integer, text

if TYPE_CHECKING:
    from analyzer.service.deps import Current
    from analyzer.service.loop import AnalyzerService

TOP_FINDINGS = 10
TOP_COST_GROUPS = 10

EXTRA_CSS = """
.stale { border: 1px solid #c0504d; background: #fdecea; padding: 8px 14px; margin: 12px 0; border-radius: 4px; }
nav a { margin-right: 14px; }
"""


def _card(card_id: str, label: str, value: str, sub: str = "", warn: bool = False) -> str:
    cls = "card warn" if warn and value != UNKNOWN else "card"
    vcls = "v unknown" if value == UNKNOWN else "v"
    sub_html = f'<div class="s">{esc(sub)}</div>' if sub else ""
    return (f'<div class="{cls}"><div class="{vcls}" id="{esc(card_id)}">{esc(value)}</div>'
            f'<div class="k">{esc(label)}</div>{sub_html}</div>')


def _td(text: Any, cls: str = "") -> str:
    text = "" if text is None else str(text)
    return f'<td class="{cls}">{esc(text)}</td>' if cls else f"<td>{esc(text)}</td>"


def _page(title: str, body: str, refresh: float | None = None) -> str:
    meta = f'<meta http-equiv="refresh" content="{max(5, int(refresh))}"/>' if refresh else ""
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
        f'<meta name="viewport" content="width=device-width, initial-scale=1"/>{meta}'
        f"<title>{esc(title)}</title><style>{CSS}{EXTRA_CSS}</style></head>\n"
        f"<body><main>{body}"
        '<footer>truegpu analyzer. JSON: <a href="/api/findings">/api/findings</a>, '
        '<a href="/api/scores">/api/scores</a>, <a href="/api/reports/cost">/api/reports/cost</a>; '
        '<a href="/docs">API docs</a>, <a href="/metrics">/metrics</a>, <a href="/healthz">/healthz</a>.</footer>'
        "</main></body></html>\n"
    )


def _utilization(summary: dict[str, Any]) -> str:
    gap = summary.get("masking_gap")
    cards = [
        _card("reported-util", "Reported GPU util (allocated GPUs)", fmt_pct(summary.get("reported_util")),
              "what nvidia-smi / dashboards show"),
        _card("effective-util", "Effective util (allocated GPUs)", fmt_pct(summary.get("effective_util")),
              "SM activity × clock ratio"),
        _card("masking-gap", "Masking gap", fmt_pts(gap), "reported − SM activity",
              warn=gap is not None and gap > 0.2),
        _card("fleet-reported-util", "Reported GPU util (whole fleet)", fmt_pct(summary.get("fleet_reported_util")),
              "idle capacity included"),
        _card("fleet-effective-util", "Effective util (whole fleet)", fmt_pct(summary.get("fleet_effective_util")),
              "idle capacity included"),
    ]
    hours = [
        _card("gpu-hours", "GPU-hours of capacity", fmt_hours(summary.get("gpu_hours"))),
        _card("allocated-gpu-hours", "GPU-hours allocated", fmt_hours(summary.get("allocated_gpu_hours"))),
        _card("effective-gpu-hours", "GPU-hours effective", fmt_hours(summary.get("effective_gpu_hours"))),
        _card("waste-gpu-hours", "GPU-hours of recoverable waste", fmt_hours(summary.get("waste_gpu_hours")),
              "idle, masked, straggler wait, throttled, under the class floor", warn=True),
        _card("normal-gpu-hours", "GPU-hours of normal headroom", fmt_hours(summary.get("normal_gpu_hours")),
              "healthy work's normal gap: not waste"),
        _card("idle-gpu-hours", "GPU-hours idle", fmt_hours(summary.get("idle_gpu_hours")), warn=True),
        _card("unknown-gpu-hours", "GPU-hours unknown", fmt_hours(summary.get("unknown_gpu_hours")), "no usable data"),
        _card("coverage", "Data coverage", fmt_pct((summary.get("coverage") or {}).get("ratio")),
              "of the capacity has data"),
    ]
    return (f'<section id="utilization"><h2>Utilization</h2><div class="cards">{"".join(cards)}</div>'
            f'<h3>GPU-hours</h3><div class="cards">{"".join(hours)}</div></section>')


def _fallback_summary(cur: Current) -> dict[str, Any]:
    """Without scores (injected results): what the analysis itself carries."""
    a = cur.analysis
    return {"reported_util": a.fleet_reported.get("allocated"), "effective_util": a.fleet_effective.get("allocated"),
            "fleet_reported_util": a.fleet_reported.get("all"), "fleet_effective_util": a.fleet_effective.get("all"),
            "masking_gap": None}


def _where(f: Finding) -> str:
    host, gpu, mig, rack = text(f.hostname), integer(f.gpu), text(f.gpu_instance), text(f.rack)
    parts = [p for p in (host, f"GPU {gpu}" if gpu is not None else None, f"MIG {mig}" if mig else None) if p]
    if not parts and rack:
        parts.append(f"rack {rack}")
    return " / ".join(parts) or "fleet"


def _job(f: Finding) -> str:
    """The finding's workload as a cell linking to its job page (/jobs/NAME)."""
    job, ns = text(f.job), text(f.namespace)
    if not job:
        return "<td></td>"
    label = f"{ns}/{job}" if ns else job
    return f'<td><a href="/jobs/{esc(quote(job, safe=""))}">{esc(label)}</a></td>'


def _findings(findings: Sequence[Finding]) -> str:
    ordered = sort_findings(list(findings))
    open_n = sum(1 for f in ordered if f.end is None)
    if not ordered:
        return ('<section id="findings"><h2>Top findings</h2><p class="note" id="findings-count">No findings in '
                "this window.</p></section>")
    rows = []
    for f in ordered[:TOP_FINDINGS]:
        sev = esc(f.severity)
        rows.append(
            f'<tr class="finding"><td><span class="sev sev-{sev}">{sev}</span></td>' + _td(f.kind) + _td(_where(f))
            + _job(f) + _td(f"{float(f.score):.2f}", "n") + _td(rfc3339(f.start), "t")
            + _td("ongoing" if f.end is None else rfc3339(f.end), "t") + _td(f.summary) + "</tr>"
        )
    headers = [("Severity", False), ("Kind", False), ("Where", False), ("Job", False), ("Score", True),
               ("Start (UTC)", False), ("End (UTC)", False), ("Summary", False)]
    return (
        f'<section id="findings"><h2>Top findings</h2><p class="note" id="findings-count">{len(ordered):,} findings '
        f"({open_n:,} open); the {min(TOP_FINDINGS, len(ordered))} most urgent:</p>{table(headers, rows)}</section>"
    )


def _cost(cost: Any, note: str | None) -> str:
    if cost is None:
        return f'<section id="cost"><h2>Cost</h2><p class="note" id="cost-note">{esc(note or UNKNOWN)}</p></section>'
    groups = cost.groups.head(TOP_COST_GROUPS)
    rows = [(str(r["group"]), r["cost"], r["waste_cost"]) for r in groups.to_dict("records")]
    return _cost_html(cost.totals, cost.currency, rows, cost.group_by)


def _cost_html(totals: dict[str, Any], currency: str, rows: Sequence[tuple[str, Any, Any]], group_by: str) -> str:
    def money(v: Any) -> str:
        try:
            return f"{float(v):,.2f} {currency}".strip()
        except (TypeError, ValueError):
            return UNKNOWN

    cards = [_card("cost-total", "Cost of the window", money(totals.get("cost"))),
             _card("cost-waste", "Cost of wasted GPU-hours", money(totals.get("waste_cost")), warn=True),
             _card("cost-unallocated", "Cost of unallocated capacity", money(totals.get("unallocated_cost")))]
    body = [f'<tr class="cost-row">{_td(name)}{_td(money(c), "n")}{_td(money(w), "n")}</tr>' for name, c, w in rows]
    grid = table([(group_by.capitalize(), False), ("Cost", True), ("Waste", True)], body) if body else ""
    return f'<section id="cost"><h2>Cost</h2><div class="cards">{"".join(cards)}</div>{grid}</section>'


def render_overview(
    cur: Current | None, *, service: AnalyzerService, cost: Any = None, cost_note: str | None = None,
    message: str | None = None,
) -> str:
    """The page; ``cur`` None (no results yet) renders ``message`` only."""
    title = "truegpu analyzer"
    if cur is None:
        body = (f"<h1>{esc(title)}</h1>"
                f'<div class="stale" id="status"><strong>No results yet.</strong> {esc(message or "")}</div>')
        return _page(title, body, refresh=service.interval)
    a = cur.analysis
    header = (
        f"<h1>{esc(title)}</h1>"
        f'<dl class="meta"><dt>Window</dt><dd id="window">{esc(rfc3339(a.start))} – {esc(rfc3339(a.end))}</dd>'
        f'<dt>Analyzed</dt><dd id="as-of">{esc(rfc3339(a.finished))}</dd>'
        f"<dt>Source</dt><dd>{esc(service.url or UNKNOWN)}</dd></dl>"
    )
    if cur.stale:
        header += (f'<div class="stale" id="status"><strong>Stale:</strong> the latest analysis failed '
                   f"({esc(cur.last_error or 'results too old')}); showing the results of {esc(rfc3339(a.finished))}."
                   "</div>")
    summary = fleet_summary(a.scores) if a.scores is not None else _fallback_summary(cur)
    body = header + _utilization(summary) + _findings(a.findings) + _cost(cost, cost_note)
    return _page(title, body, refresh=service.interval)


__all__ = ["render_overview"]
