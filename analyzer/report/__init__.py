"""The HTML report: one self-contained page for SREs and FinOps (inline CSS and SVG, opens offline).

``write_report(out_dir, fleet, scores, findings)`` writes ``out_dir/index.html``: what was
analyzed, what could not be measured, reported vs effective utilization, GPU-hours
(allocated, effective, wasted, idle, unallocated, unknown), charts over time, the jobs
wasting most, and the findings, most urgent first.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from analyzer.analysis.scores import Scores
from analyzer.data.frame import Fleet
from analyzer.findings import Finding
from analyzer.report.html import render

__all__ = ["render", "write_report"]

DEFAULT_TITLE = "GPU fleet report"


def write_report(
    out_dir: str | Path, fleet: Fleet, scores: Scores, findings: Sequence[Finding], *, title: str = DEFAULT_TITLE
) -> Path:
    """Write the report page to ``out_dir/index.html`` (directories created) and return its path."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    path = out / "index.html"
    path.write_text(render(fleet, scores, findings, title=title), encoding="utf-8")
    return path
