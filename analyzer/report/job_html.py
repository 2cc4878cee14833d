"""One job's page (``truegpu job NAME --html DIR``, ``GET /api/jobs/{name}?format=html``): the job report with
small plots, self-contained (inline CSS and SVG, no script), well-formed XML like the fleet report."""

from __future__ import annotations

import math

import numpy as np

from analyzer.analysis.partition import PARTS, WASTE
from analyzer.findings import rfc3339
from analyzer.report import svg
from analyzer.report.html import (
    CSS,
    EFFECTIVE_COLOR,
    REPORTED_COLOR,
    UNKNOWN,
    card,
    cell,
    findings_section,
    fmt_pct,
    table,
)
from analyzer.report.job import JobReport, _duration, _gb
from analyzer.report.svg import esc


def _cards(r: JobReport) -> str:
    s = r.scores
    high, cap = r.memory_high_water_bytes, r.memory_capacity_bytes
    mem = f"{_gb(high)} of {_gb(cap)}" if math.isfinite(high) and math.isfinite(cap) else UNKNOWN
    items = [
        card("GPUs", f"{r.physical_gpus}", r.slices or f"{r.gpus['hostname'].nunique()} node(s)"),
        card("Ran", _duration(r.duration_s), "still running" if r.running else "finished"),
        card("Effective utilization", fmt_pct(s["effective_util"]), f"reported {fmt_pct(s['reported_util'])}",
             warn=bool(s["effective_util"] < 0.3)),
        card("Tensor cores", fmt_pct(s["effective_tensor"])),
        card("Memory high-water", mem, "per GPU"),
        card("GPU-hours held", f"{s['allocated_gpu_hours']:,.1f}",
             f"{s['allocated_effective_gpu_hours']:,.1f} of real work"),
    ]
    if r.cost is not None:
        cpe = r.cost.get("cost_per_effective_gpu_hour", math.nan)
        items.append(card("Cost", f"{r.cost['cost']:,.2f} {r.currency}",
                          f"{cpe:,.2f} per effective GPU-hour" if math.isfinite(cpe) else "no effective work"))
    return f'<div class="cards">{"".join(items)}</div>'


def _advice(r: JobReport) -> str:
    items = "".join(f"<li>{esc(a.text)}</li>" for a in r.advice)
    ok = " ok" if r.advice and r.advice[0].kind == "none" else ""
    return f'<div class="box{ok}"><h2>What to do</h2><ol class="todo">{items}</ol></div>'


def _charts(r: JobReport) -> str:
    ts = r.timeline
    x_range = (r.first_seen, r.last_seen + r.step)
    if ts.empty:
        util = svg.empty_chart("job-util", "Reported vs effective utilization", "No data in the window.")
    else:
        x = ts["timestamp"].to_numpy() + ts["width"].to_numpy() / 2
        util = svg.line_chart(
            "job-util",
            [svg.Line("reported GPU util", x, ts["reported_util"].to_numpy(), REPORTED_COLOR, dashed=True),
             svg.Line("effective util", x, ts["effective_util"].to_numpy(), EFFECTIVE_COLOR, area=True)],
            title="Reported vs effective utilization of the job's GPUs",
            desc="GPU-weighted mean over the job's GPUs per time bucket. Gaps are unknown data.",
            y_label="utilization (%)", x_range=x_range, y_range=(0.0, 1.0), height=240,
        )
    g = r.gpus
    labels = [f"{h} / {gpu}" + (f" / {mi}" if mi else "") for h, gpu, mi in
              zip(g["hostname"], g["gpu"], g["gpu_instance"], strict=True)]
    eff = g["effective_util"].to_numpy(np.float64)
    per_gpu = svg.hbar_chart(
        "job-gpus", labels, eff, title="Effective utilization per GPU", x_label="effective utilization",
        desc="Each of the job's GPUs over the time the job held it.", color=EFFECTIVE_COLOR,
        value_text=[fmt_pct(v) for v in eff],
    )
    hours = [(p, r.parts.get(f"{p}_gpu_hours", math.nan)) for p in PARTS]
    hours = [(p, v) for p, v in hours if math.isfinite(v) and v > 0]
    parts = svg.hbar_chart(
        "job-parts", [p + (" (waste)" if p in WASTE else "") for p, _ in hours], [v for _, v in hours],
        title="Where the job's GPU-hours went", x_label="GPU-hours",
        desc="The one GPU-hour partition of the job's allocated hours.",
        value_text=[f"{v:,.1f}" for _, v in hours],
    ) if hours else svg.empty_chart("job-parts", "Where the job's GPU-hours went", "Not split: unknown.")
    return f'<section id="charts"><h2>Over time and per GPU</h2>{util}{parts}{per_gpu}</section>'


def _gpu_table(r: JobReport) -> str:
    headers = [("Host", False), ("GPU", False), ("MIG", False), ("Model", False), ("GPU-hours", True),
               ("Reported", True), ("Effective", True), ("Tensor", True), ("Memory peak", True),
               ("Capacity", True)]
    rows = []
    for g in r.gpus.to_dict("records"):
        used, total = g["memory_used_max_bytes"], g["memory_total_bytes"]
        rows.append("<tr>" + cell(g["hostname"] or UNKNOWN) + cell(g["gpu"] or "") + cell(g["mig_profile"] or "")
                    + cell(g["model"] or UNKNOWN) + cell(f"{g['gpu_hours']:,.2f}", "n")
                    + cell(fmt_pct(g["reported_util"]), "n") + cell(fmt_pct(g["effective_util"]), "n")
                    + cell(fmt_pct(g["effective_tensor"]), "n")
                    + cell(_gb(used) if math.isfinite(used) else UNKNOWN, "n")
                    + cell(_gb(total) if math.isfinite(total) else UNKNOWN, "n") + "</tr>")
    return f'<section id="gpus"><h2>Per GPU</h2>{table(headers, rows)}</section>'


def render_job(r: JobReport) -> str:
    """The whole page as a string (well-formed XML, HTML5 doctype)."""
    where = f" in namespace {', '.join(r.namespaces)}" if r.namespaces else ""
    meta = (f'<dl class="meta"><dt>Window</dt><dd>{esc(rfc3339(r.start))} to {esc(rfc3339(r.end))}</dd>'
            f"<dt>Ran</dt><dd>{esc(rfc3339(r.first_seen))} to {esc(rfc3339(r.last_seen + r.step))}</dd>"
            f"<dt>Pods</dt><dd>{esc(', '.join(r.pods) or UNKNOWN)}</dd>"
            + (f"<dt>Bottleneck</dt><dd>{esc(r.bottleneck['class'])} ({r.bottleneck['share']:.0%} of its GPU-hours)"
               "</dd>" if r.bottleneck.get("class") else "") + "</dl>")
    notes = "".join(f'<p class="note">{esc(n)}</p>' for n in r.notes)
    body = "".join([
        f"<h1>Job {esc(r.name)}</h1><p class=\"lede\">What the job's GPUs really did{esc(where)}.</p>", meta,
        _cards(r), _advice(r), _charts(r), _gpu_table(r), findings_section(r.findings, r.end), notes,
        "<footer>Generated by truegpu analyzer. Self-contained page: no scripts, no external resources.</footer>",
    ])
    title = f"truegpu job {r.name}"
    return ('<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
            '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
            f"<title>{esc(title)}</title><style>{CSS}</style></head>\n<body><main>{body}</main></body></html>\n")
