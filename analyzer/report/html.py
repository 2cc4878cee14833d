"""The report page: one self-contained HTML file (inline CSS and SVG, no script, no links out).

Layout, top to bottom: what was analyzed, what could not be measured, headline numbers,
what to do, charts over time, where the GPU-hours go, jobs, findings, how we measured.
The page is well-formed XML as well as HTML (tests parse it), and every string that comes
from the input (host, job, pod names, notes) is escaped.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analysis.partition import attach
from analyzer.analysis.rows import FALLBACK_SM_PER_UTIL, IDLE_UTIL, mig_rows
from analyzer.analysis.scores import Scores, fleet_summary
from analyzer.data.coverage import MOSTLY_EMPTY
from analyzer.data.frame import Fleet
from analyzer.findings import Finding, rfc3339, sort_findings
from analyzer.report import data, svg
from analyzer.report.svg import esc

UNKNOWN = "unknown"
REPORTED_COLOR, EFFECTIVE_COLOR, GAP_COLOR, WASTE_COLOR = "#e08a2c", "#2f6db5", "#8e44ad", "#c0504d"
#: Most rows a table shows (the full data is in the JSON outputs).
MAX_JOB_ROWS, MAX_FINDING_ROWS, TOP_JOBS_CHART = 300, 300, 12

CSS = """
:root { color-scheme: light; }
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #222; background: #fafafa; margin: 0; }
main { max-width: 1180px; margin: 0 auto; padding: 24px 28px 48px; background: #fff; }
h1 { font-size: 24px; margin: 0 0 6px; }
h2 { font-size: 18px; margin: 32px 0 8px; padding-bottom: 4px; border-bottom: 1px solid #ddd; }
h3 { font-size: 15px; margin: 18px 0 6px; }
p.lede, p.note { color: #555; margin: 4px 0 10px; max-width: 900px; }
dl.meta { display: grid; grid-template-columns: max-content 1fr; gap: 2px 16px; margin: 10px 0; }
dl.meta dt { color: #666; }
dl.meta dd { margin: 0; }
.box { border: 1px solid #d9b44a; background: #fff8e1; padding: 10px 16px; margin: 16px 0; border-radius: 4px; }
.box.ok { border-color: #9cc59c; background: #f1f8f1; }
.box h2 { border: 0; margin: 0 0 4px; padding: 0; font-size: 16px; }
.box ul { margin: 4px 0; padding-left: 20px; }
.cards { display: flex; flex-wrap: wrap; gap: 10px; margin: 8px 0 4px; }
.card { border: 1px solid #ddd; border-radius: 4px; padding: 8px 12px; min-width: 130px; flex: 1 1 130px; }
.card .v { font-size: 22px; font-weight: 600; font-variant-numeric: tabular-nums; }
.card .k { color: #555; font-size: 12px; }
.card .s { color: #777; font-size: 12px; }
.card.warn .v { color: #b03a2e; }
.unknown { color: #888; font-style: italic; }
table { border-collapse: collapse; width: 100%; margin: 6px 0 4px; font-size: 13px; }
th, td { border-bottom: 1px solid #e6e6e6; padding: 4px 8px; text-align: left; vertical-align: top; }
th { background: #f3f3f3; font-weight: 600; position: sticky; top: 0; }
td.n, th.n { text-align: right; font-variant-numeric: tabular-nums; white-space: nowrap; }
td.t { white-space: nowrap; font-variant-numeric: tabular-nums; }
.sev { display: inline-block; padding: 0 6px; border-radius: 3px; font-size: 12px; font-weight: 600; }
.sev-critical { background: #f8d7da; color: #842029; }
.sev-warning { background: #fff3cd; color: #664d03; }
.sev-info { background: #e2e3e5; color: #41464b; }
details summary { cursor: pointer; color: #2f6db5; }
details ul { margin: 4px 0; padding-left: 18px; }
svg.chart { display: block; max-width: 100%; height: auto; margin: 10px 0; }
ol.todo li, ul.defs li { margin: 4px 0; }
footer { color: #666; font-size: 12px; margin-top: 32px; }
@media print { body { background: #fff; } main { padding: 0; } th { position: static; } }
"""


# ---------------------------------------------------------------- formatting


def _known(v: Any) -> bool:
    return v is not None and not (isinstance(v, float | np.floating) and math.isnan(v))


def fmt_pct(v: Any, digits: int = 1) -> str:
    """A fraction as a percentage ("36.5%"), or "unknown"."""
    return f"{float(v) * 100:.{digits}f}%" if _known(v) else UNKNOWN


def fmt_pts(v: Any) -> str:
    """A difference of fractions in percentage points ("36.5 pts"), or "unknown"."""
    return f"{float(v) * 100:.1f} pts" if _known(v) else UNKNOWN


def fmt_hours(v: Any, digits: int = 1) -> str:
    """GPU-hours with thousands separators ("1,234.5"), or "unknown"."""
    return f"{float(v):,.{digits}f}" if _known(v) else UNKNOWN


def cell(text: str, cls: str = "") -> str:
    """A table cell; "unknown" is styled as such."""
    classes = " ".join(c for c in (cls, "unknown" if text == UNKNOWN else "") if c)
    return f'<td class="{classes}">{esc(text)}</td>' if classes else f"<td>{esc(text)}</td>"


def _duration(seconds: float) -> str:
    if seconds < 3600:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"


def _mostly_empty(summary: dict[str, Any]) -> bool:
    ratio = (summary.get("coverage") or {}).get("ratio")
    return ratio is not None and ratio < MOSTLY_EMPTY


def _share(part: float | None, whole: float | None) -> str:
    if not (_known(part) and _known(whole)) or not whole:
        return ""
    return f"{part / whole * 100:.0f}% of capacity"


# ---------------------------------------------------------------- sections


def _header(fleet: Fleet, title: str, shape: dict[str, Any]) -> str:
    window = f"{rfc3339(fleet.start)} – {rfc3339(fleet.end)}"
    span = f"{_duration(fleet.end - fleet.start)}, one sample every {fleet.step:g} s"
    gpus = f"{shape['gpus']:,} GPUs on {shape['nodes']:,} nodes"
    if shape["devices"] != shape["gpus"]:
        gpus += f" ({shape['devices']:,} devices counting MIG instances)"
    models = ", ".join(f"{m} × {n:,}" for m, n in shape["models"].items()) or UNKNOWN
    rows = [
        ("Window (UTC)", f"{window} ({span})"),
        ("Fleet", gpus),
        ("GPU models", models),
        ("Sites", ", ".join(shape["sites"]) or UNKNOWN),
        ("Input dialect", fleet.dialect),
    ]
    meta = "".join(f"<dt>{esc(k)}</dt><dd>{esc(v)}</dd>" for k, v in rows)
    return (
        f"<header><h1>{esc(title)}</h1>"
        '<p class="lede">How much of this GPU fleet really worked: the utilization dashboards report, '
        "the share of SM cycles that actually did work, and the GPU-hours in between.</p>"
        f'<dl class="meta">{meta}</dl></header>'
    )


def _unknowns(fleet: Fleet, scores: Scores, summary: dict[str, Any]) -> str:
    items: list[str] = []
    for name, why in sorted(fleet.missing.items()):
        items.append(f"<li><strong>{esc(name)}</strong>: {esc(why)}</li>")
    for note in [*scores.notes, *fleet.notes]:
        items.append(f"<li>{esc(note)}</li>")
    unknown_h = summary.get("unknown_gpu_hours")
    if _known(unknown_h) and unknown_h > 0:
        items.append(
            f"<li>{esc(fmt_hours(unknown_h))} GPU-hours have no utilization data at all (telemetry gaps, lost "
            "GPUs): they are reported as unknown and left out of every mean, never counted as idle.</li>"
        )
    if mig_rows(fleet.frame).any():
        items.append(
            "<li>MIG instances have no per-instance GPU util (nvidia-smi reports none): their reported util and "
            "masking gap are unknown and left out of those means; their effective util is measured.</li>"
        )
    low = summary.get("low_confidence_share")
    if _known(low) and low > 0:
        items.append(
            f"<li>{esc(fmt_pct(low, 0))} of the measured GPU-hours are scored by the fallback estimate "
            f"({FALLBACK_SM_PER_UTIL} × GPU util) because SM activity was missing: low confidence.</li>"
        )
    if not items:
        return (
            '<section class="box ok" id="unknowns"><h2>What we could not measure</h2>'
            "<p>Nothing: every signal the analysis uses was present in the input.</p></section>"
        )
    return (
        '<section class="box" id="unknowns"><h2>What we could not measure</h2>'
        "<p>These gaps limit the numbers below. Unknown values are shown as “unknown”, never as 0.</p>"
        f"<ul>{''.join(items)}</ul></section>"
    )


def card(label: str, value: str, sub: str = "", warn: bool = False) -> str:
    cls = "card warn" if warn and value != UNKNOWN else "card"
    vcls = "v unknown" if value == UNKNOWN else "v"
    sub_html = f'<div class="s">{esc(sub)}</div>' if sub else ""
    return f'<div class="{cls}"><div class="{vcls}">{esc(value)}</div><div class="k">{esc(label)}</div>{sub_html}</div>'


def _headline(s: dict[str, Any]) -> str:
    gap = s.get("masking_gap")
    util_cards = [
        card("Reported GPU util (allocated GPUs)", fmt_pct(s["reported_util"]), "what nvidia-smi / dashboards show"),
        card("Effective util (allocated GPUs)", fmt_pct(s["effective_util"]), "SM activity × clock ratio"),
        card("Masking gap (allocated GPUs)", fmt_pts(gap), "reported − SM activity", warn=_known(gap) and gap > 0.2),
        card("Reported GPU util (whole fleet)", fmt_pct(s["fleet_reported_util"]), "idle capacity included"),
        card("Effective util (whole fleet)", fmt_pct(s["fleet_effective_util"]), "idle capacity included"),
    ]
    cap = s.get("gpu_hours")
    low = s.get("low_confidence_share")
    est = " (estimate: no SM activity)" if _known(low) and low > 0.5 else ""
    hour_cards = [
        card("GPU-hours of capacity", fmt_hours(cap), "GPUs × window"),
        card("GPU-hours allocated", fmt_hours(s["allocated_gpu_hours"]), _share(s["allocated_gpu_hours"], cap)),
        card("GPU-hours effective", fmt_hours(s["effective_gpu_hours"]), "real SM work in allocated hours" + est),
        card("GPU-hours of recoverable waste", fmt_hours(s["waste_gpu_hours"]),
             "idle, masked, straggler wait, throttled, under the workload class's floor" + est, warn=True),
        card("GPU-hours of normal headroom", fmt_hours(s["normal_gpu_hours"]),
             "the gap healthy work of its class has, bandwidth-bound work, power caps: not waste"),
        card("GPU-hours unclassified", fmt_hours(s["unclassified_gpu_hours"]),
             "gap of workloads of no known class (site config)"),
        card("GPU-hours idle", fmt_hours(s["idle_gpu_hours"]), f"allocated, GPU util < {IDLE_UTIL:.0%}",
              warn=True),
        card("GPU-hours unallocated", fmt_hours(s["unallocated_gpu_hours"]), _share(s["unallocated_gpu_hours"], cap)),
        card("GPU-hours unknown", fmt_hours(s["unknown_gpu_hours"]), "no usable data (never 0, never unallocated)"),
        card("Data coverage", fmt_pct((s.get("coverage") or {}).get("ratio")), "of the capacity has data",
              warn=_mostly_empty(s)),
    ]
    return (
        '<section id="headline"><h2>Headline numbers</h2>'
        '<p class="note">“Reported” is GPU util, the share of time any kernel was resident: a memory-bound '
        "or barrier-waiting kernel shows 100%. “Effective” is SM activity scaled by the clock ratio, the share "
        "of the GPU's compute that did work. The masking gap is the utilization dashboards show that no SM "
        "backs.</p>"
        f'<h3>Utilization</h3><div class="cards">{"".join(util_cards)}</div>'
        f'<h3>GPU-hours</h3><div class="cards">{"".join(hour_cards)}</div></section>'
    )


def _todo(s: dict[str, Any], jobs: pd.DataFrame, findings: Sequence[Finding]) -> str:
    items: list[str] = []
    crit = [f for f in findings if f.severity == "critical"]
    if crit:
        kinds = sorted({f.kind for f in crit})
        items.append(f"{len(crit)} critical finding(s) ({', '.join(kinds)}): start with the Findings table below.")
    idle = s.get("idle_gpu_hours")
    if _known(idle) and idle > 0 and not jobs.empty:
        top = jobs[jobs["idle_gpu_hours"] >= 0.05].nlargest(3, "idle_gpu_hours")
        names = ", ".join(f"{j} ({fmt_hours(h)} GPU-h)" for j, h in zip(top["job"], top["idle_gpu_hours"], strict=True))
        items.append(f"{fmt_hours(idle)} allocated GPU-hours ran nothing at all. Reclaim those GPUs or scale the "
                     f"jobs down: {names}.")
    wasted = s.get("waste_gpu_hours")
    if _known(wasted) and wasted > 0 and not jobs.empty:
        top = jobs[jobs["waste_gpu_hours"] >= 0.05].head(3)
        names = ", ".join(f"{j} ({fmt_hours(h)} GPU-h)" for j, h in zip(top["job"], top["waste_gpu_hours"],
                                                                           strict=True))
        items.append(f"{fmt_hours(wasted)} allocated GPU-hours are recoverable waste. The jobs wasting most: {names}; "
                     "their bottleneck class says where to look (input pipeline, memory bandwidth, communication).")
    gap = s.get("masking_gap")
    if _known(gap) and gap > 0.1:
        items.append(f"GPU util overstates the work done by {fmt_pts(gap)} on allocated GPUs: do not plan capacity "
                     "or charge back on GPU util; use effective utilization (SM activity).")
    unalloc, cap = s.get("unallocated_gpu_hours"), s.get("gpu_hours")
    if _known(unalloc) and _known(cap) and cap and unalloc / cap > 0.05:
        items.append(f"{fmt_hours(unalloc)} GPU-hours ({unalloc / cap:.0%} of capacity) were not allocated to any "
                     "pod: free capacity to schedule on, or to give back.")
    if not items:
        items.append("Nothing stands out: no critical findings, no idle allocations, no large masking gap.")
    lis = "".join(f"<li>{esc(t)}</li>" for t in items)
    return f'<section id="todo"><h2>What to do</h2><ol class="todo">{lis}</ol></section>'


def _time_charts(fleet: Fleet, scores: Scores) -> str:
    ts = data.timeseries(fleet, scores)
    x_range = (fleet.start, fleet.end)
    if ts.empty:
        msg = "No allocated GPUs in this window: nothing to plot."
        util = svg.empty_chart("util-time", "Reported vs effective utilization of allocated GPUs", msg)
        gap = svg.empty_chart("gap-time", "Masking gap over time", msg)
    else:
        x = ts["timestamp"].to_numpy() + ts["width"].to_numpy() / 2
        bucket = f"{ts['width'].iloc[0]:g} s"
        util = svg.line_chart(
            "util-time",
            [
                svg.Line("reported GPU util", x, ts["reported_util"].to_numpy(), REPORTED_COLOR, dashed=True),
                svg.Line("effective util", x, ts["effective_util"].to_numpy(), EFFECTIVE_COLOR, area=True),
            ],
            title="Reported vs effective utilization of allocated GPUs",
            desc=("GPU-weighted mean over allocated GPUs per " + bucket + " bucket, in percent. Reported is GPU util "
                  "(kernel-resident time); effective is SM activity times the clock ratio. Gaps are unknown data."),
            y_label="utilization (%)", x_range=x_range, y_range=(0.0, 1.0),
        )
        if ts["masking_gap"].notna().any():
            gap = svg.line_chart(
                "gap-time",
                [svg.Line("masking gap (GPU util − SM activity)", x, ts["masking_gap"].to_numpy(), GAP_COLOR,
                          area=True)],
                title="Masking gap over time",
                desc="GPU-weighted mean of GPU util minus SM activity over allocated whole GPUs per " + bucket
                     + " bucket, in percentage points.",
                y_label="gap (percentage points)", x_range=x_range, y_range=(0.0, 0.5),
                y_fmt=lambda v: f"{v * 100:.0f}",
            )
        else:
            gap = svg.empty_chart("gap-time", "Masking gap over time",
                                  "Unknown: needs both GPU util and SM activity on whole GPUs.")
    return (
        '<section id="over-time"><h2>Over time</h2>'
        '<p class="note">Allocated GPUs only, weighted by the GPU share of each device (a 3g MIG slice counts '
        "3/7). The space between the two lines is utilization that dashboards show and no SM backs.</p>"
        f"{util}{gap}</section>"
    )


def _waste_charts(fleet: Fleet, scores: Scores, jobs: pd.DataFrame) -> str:
    if jobs.empty:
        bars = svg.empty_chart("top-waste", "Top jobs by recoverable waste", "No jobs held GPUs in this window.")
    else:
        top = jobs[jobs["waste_gpu_hours"].notna()].head(TOP_JOBS_CHART)
        texts = [
            f"{fmt_hours(w)} of {fmt_hours(a)} GPU-h"
            for w, a in zip(top["waste_gpu_hours"], top["allocated_gpu_hours"], strict=True)
        ]
        bars = svg.hbar_chart(
            "top-waste", top["job"].tolist(), top["waste_gpu_hours"].to_numpy(),
            title=f"Top {len(top)} jobs by recoverable waste",
            desc="Recoverable waste per job (idle, masked, straggler wait, throttled, under its class's floor), "
                 "largest first, with the job's allocated GPU-hours.",
            x_label="GPU-hours of recoverable waste", value_text=texts, color=WASTE_COLOR,
            legend="recoverable waste (GPU-hours)",
        )
    edges, heights, total, mean = data.util_histogram(fleet, scores)
    if total <= 0:
        hist = svg.empty_chart("util-hist", "Effective utilization of busy allocated GPUs",
                               "No busy allocated GPU with known effective utilization.")
    else:
        hist = svg.histogram(
            "util-hist", edges, heights,
            title="Effective utilization of busy allocated GPUs",
            desc=f"GPU-hours of allocated GPUs with GPU util at least {IDLE_UTIL:.0%}, by effective utilization in "
                 f"5% bins; {fmt_hours(total)} GPU-hours in all.",
            x_label="effective utilization (SM activity × clock ratio, %)", y_label="GPU-hours",
            color=EFFECTIVE_COLOR, legend="GPU-hours",
            markers=[(mean, f"mean of these GPU-hours {fmt_pct(mean)}", "#333333")] if _known(mean) else [],
        )
    return (
        '<section id="waste"><h2>Where the GPU-hours go</h2>'
        '<p class="note">Recoverable waste is the part of the allocated hours without SM work that the owner can '
        "get back; the normal headroom of healthy work of the same class (site config) is not waste. The "
        "histogram leaves idle GPUs out (they are in the idle GPU-hours): it shows how well the GPUs that do run "
        "kernels use their SMs.</p>"
        f"{bars}{hist}</section>"
    )


def table(headers: Sequence[tuple[str, bool]], rows: Iterable[str]) -> str:
    head = "".join(f'<th class="n">{esc(h)}</th>' if num else f"<th>{esc(h)}</th>" for h, num in headers)
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(rows)}</tbody></table>"


def _jobs(jobs: pd.DataFrame) -> str:
    if jobs.empty:
        return '<section id="jobs"><h2>Jobs</h2><p class="note">No job held a GPU in this window.</p></section>'
    headers = [
        ("Job", False), ("Namespace", False), ("Allocated GPU-h", True), ("Reported util", True),
        ("Effective util", True), ("Masking gap", True), ("Waste GPU-h", True), ("Headroom GPU-h", True),
        ("Idle GPU-h", True), ("Unknown GPU-h", True), ("Bottleneck", False),
    ]
    rows = []
    for r in jobs.head(MAX_JOB_ROWS).itertuples(index=False):
        if isinstance(r.bottleneck, str):
            bn = f"{r.bottleneck} ({r.bottleneck_share:.0%} of GPU-h)"
            if r.bottleneck_confidence == "low":
                bn += ", low confidence"
        else:
            bn = UNKNOWN
        rows.append(
            "<tr>" + cell(str(r.job)) + cell(str(r.namespace))
            + cell(fmt_hours(r.allocated_gpu_hours), "n") + cell(fmt_pct(r.reported_util), "n")
            + cell(fmt_pct(r.effective_util), "n") + cell(fmt_pts(r.masking_gap), "n")
            + cell(fmt_hours(r.waste_gpu_hours), "n") + cell(fmt_hours(r.normal_gpu_hours), "n")
            + cell(fmt_hours(r.idle_gpu_hours), "n")
            + cell(fmt_hours(r.unknown_gpu_hours), "n") + cell(bn) + "</tr>"
        )
    more = (f'<p class="note">Showing the {MAX_JOB_ROWS} jobs wasting most of {len(jobs):,}.</p>'
            if len(jobs) > MAX_JOB_ROWS else "")
    return (
        '<section id="jobs"><h2>Jobs</h2>'
        '<p class="note">Allocated hours only, most recoverable waste first. Bottleneck: the class holding most of the '
        "job's GPU-hours over 5-minute windows (compute_bound is healthy; input_bound: the data loader or request "
        "stream cannot keep the GPUs fed; memory_bound: kernels stall on HBM bandwidth; communication_bound: "
        "kernels wait on NCCL/NVLink/network; idle: nothing launched).</p>"
        f"{table(headers, rows)}{more}</section>"
    )


def _where(f: Finding) -> str:
    parts = []
    if f.hostname:
        parts.append(f.hostname)
    if f.gpu is not None:
        parts.append(f"GPU {f.gpu}")
    if f.gpu_instance:
        parts.append(f"MIG {f.gpu_instance}")
    if not parts and f.rack:
        parts.append(f"rack {f.rack}")
    return " / ".join(parts) or "fleet"


def _job_of(f: Finding) -> str:
    if not f.job:
        return ""
    extra = "/".join(x for x in (f.namespace, f.pod) if x)
    return f"{f.job} ({extra})" if extra else f.job


def _evidence(f: Finding) -> str:
    ev = f.to_json()["evidence"]
    if not ev:
        return ""
    items = "".join(f"<li>{esc(k)}: {esc(UNKNOWN if v is None else v)}</li>" for k, v in ev.items())
    return f"<details><summary>evidence</summary><ul>{items}</ul></details>"


def findings_section(findings: Sequence[Finding], end: float) -> str:
    if not findings:
        return ('<section id="findings"><h2>Findings</h2><p class="note">No findings: the detectors found no '
                "problem in this window.</p></section>")
    counts = pd.Series([f.severity for f in findings]).value_counts()
    tally = ", ".join(f"{int(counts[s])} {s}" for s in ("critical", "warning", "info") if s in counts)
    headers = [("Severity", False), ("Kind", False), ("Where", False), ("Job", False), ("Start (UTC)", False),
               ("End (UTC)", False), ("Duration", True), ("Confidence", False), ("Summary", False)]
    rows = []
    for f in list(findings)[:MAX_FINDING_ROWS]:
        sev = esc(f.severity)
        end_txt = rfc3339(f.end) if f.end is not None else "ongoing"
        dur = _duration((f.end if f.end is not None else end) - f.start)
        rows.append(
            f'<tr><td><span class="sev sev-{sev}">{sev}</span></td>' + cell(f.kind) + cell(_where(f))
            + cell(_job_of(f)) + cell(rfc3339(f.start), "t") + cell(end_txt, "t") + cell(dur, "n")
            + cell(f.confidence) + f"<td>{esc(f.summary)}{_evidence(f)}</td></tr>"
        )
    more = (f'<p class="note">Showing the {MAX_FINDING_ROWS} most urgent of {len(findings):,} findings.</p>'
            if len(findings) > MAX_FINDING_ROWS else "")
    return (
        f'<section id="findings"><h2>Findings</h2><p class="note">{len(findings):,} findings ({esc(tally)}), most '
        "urgent first (severity, then score). “ongoing” means the problem lasts to the end of the data.</p>"
        f"{table(headers, rows)}{more}</section>"
    )


def _method() -> str:
    defs = [
        "GPU-hours: each sample counts step seconds of its GPU share (1 for a whole GPU, N/7 for an Ng MIG slice).",
        "Reported GPU util: nvidia-smi GPU-Util / DCGM_FI_DEV_GPU_UTIL, the share of time any kernel was resident.",
        "Effective util: SM activity (share of cycles an SM holds a warp) × SM clock / max clock. Without SM "
        f"activity it is estimated as {FALLBACK_SM_PER_UTIL} × GPU util (low confidence).",
        "Masking gap: reported GPU util − SM activity, on whole GPUs. Healthy training typically shows ~35 points.",
        "Recoverable waste: allocated GPU-hours with known utilization that did no SM work and that the owner can "
        "get back: idle GPUs, masked (where the idle-masking detector flags it), straggler wait, throttling by heat "
        "or hardware, and use below what the workload's class attains (analyzer/analysis/partition.py).",
        "Normal headroom: the gap healthy work of the workload's class normally has (site config; built-in: "
        "training 45%, inference 10% effective, from AcmeTrace's busy-GPU SM activity), bandwidth-bound work and "
        "power-capped clocks; unclassified: the gap of workloads of no known class.",
        f"Idle GPU-hours: allocated GPU-hours with GPU util below {IDLE_UTIL:.0%} (nothing launched).",
        "Unknown GPU-hours: hours with no utilization data; never counted as 0 or as waste.",
    ]
    lis = "".join(f"<li>{esc(d)}</li>" for d in defs)
    return f'<section id="method"><h2>How we measured</h2><ul class="defs">{lis}</ul></section>'


def render(fleet: Fleet, scores: Scores, findings: Sequence[Finding], *, title: str) -> str:
    """The whole page as a string (well-formed XML, HTML5 doctype)."""
    if scores.partition is None:
        attach(scores, fleet, findings)
    summary = fleet_summary(scores)
    shape = data.fleet_shape(fleet)
    jobs = data.job_table(fleet, scores)
    ordered = sort_findings(list(findings))
    body = "".join([
        _header(fleet, title, shape),
        _unknowns(fleet, scores, summary),
        _headline(summary),
        _todo(summary, jobs, ordered),
        _time_charts(fleet, scores),
        _waste_charts(fleet, scores, jobs),
        _jobs(jobs),
        findings_section(ordered, fleet.end),
        _method(),
        "<footer>Generated by truegpu analyzer. Self-contained page: no scripts, no external resources.</footer>",
    ])
    return (
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"/>'
        '<meta name="viewport" content="width=device-width, initial-scale=1"/>'
        f"<title>{esc(title)}</title><style>{CSS}</style></head>\n"
        f"<body><main>{body}</main></body></html>\n"
    )
