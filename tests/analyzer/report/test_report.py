"""The HTML report: self-contained, well-formed, escaped, honest about what it could not measure."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.analysis.scores import compute_scores, fleet_summary
from analyzer.data.frame import Fleet
from analyzer.data.signals import ALLOCATION_COLUMNS
from analyzer.data.simulated import fleet_from_cluster
from analyzer.findings import Finding
from analyzer.report import data as D
from analyzer.report import write_report
from analyzer.report.html import fmt_hours, fmt_pct, fmt_pts
from analyzer.report.svg import nice_ticks, time_ticks
from exporter.simulator import Cluster, load_scenario

HOSTILE = '<script>alert("x")</script>'
VOID = frozenset({"meta", "br", "hr", "img", "input", "link"})
SEVERITY = {"gpu_fault": "critical", "thermal": "warning", "straggler": "warning", "degraded_gpu": "warning",
            "idle_allocated": "warning", "idle_masking": "info"}


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return Cluster(load_scenario("mixed-fleet"))


def mixed_fleet(cluster: Cluster) -> Fleet:
    return fleet_from_cluster(cluster, step=60)


def findings_from_truth(cluster: Cluster, end: float) -> list[Finding]:
    """Hand-made findings, one per injected problem of the scenario."""
    out = []
    for i, g in enumerate(cluster.ground_truth()):
        out.append(Finding(
            kind=g["kind"], severity=SEVERITY[g["kind"]], summary=g["cause"], start=g["start"],
            end=None if g["end"] >= end else g["end"], score=1.0 - i / 100, hostname=g["hostname"],
            gpu=None if g["gpu"] is None else int(g["gpu"]), job=g["job"],
            evidence={"gpu_util": 0.95, "sm_active": np.float64(0.2), "nan": float("nan")},
        ))
    return out


def rename_job(fleet: Fleet, old: str, new: str) -> None:
    fleet.frame["job"] = fleet.frame["job"].cat.rename_categories({old: new})


def well_formed(text: str) -> ET.Element:
    """Parse the page as XML (the page is written to be well-formed) and check tags balance as HTML."""
    root = ET.fromstring(re.sub(r"^<!DOCTYPE html>", "", text))

    class Balance(HTMLParser):
        def __init__(self) -> None:
            super().__init__()
            self.stack: list[str] = []

        def handle_starttag(self, tag, attrs):
            if tag not in VOID:
                self.stack.append(tag)

        def handle_startendtag(self, tag, attrs):
            pass

        def handle_endtag(self, tag):
            assert self.stack and self.stack[-1] == tag, (tag, self.stack[-5:])
            self.stack.pop()

    p = Balance()
    p.feed(text)
    p.close()
    assert p.stack == []
    return root


@pytest.fixture(scope="module")
def report(cluster: Cluster, tmp_path_factory) -> tuple[Path, str, Fleet, dict]:
    fleet = mixed_fleet(cluster)
    rename_job(fleet, "chat-serve", HOSTILE)
    findings = findings_from_truth(cluster, fleet.end)
    findings.append(Finding(kind="straggler", severity="warning", summary=f"job {HOSTILE} & friends lag",
                            start=fleet.start, end=None, score=0.4, hostname="dc1-r1-n01", gpu=0, job=HOSTILE,
                            namespace="ns<1>", pod='p"0'))
    scores = compute_scores(fleet)
    path = write_report(tmp_path_factory.mktemp("report") / "out", fleet, scores, findings, title="mixed-fleet")
    return path, path.read_text(encoding="utf-8"), fleet, fleet_summary(scores)


def test_report_written_self_contained(report) -> None:
    path, text, _, _ = report
    assert path.name == "index.html" and path.is_file()
    assert text.startswith("<!DOCTYPE html>")
    assert "http://" not in text and "https://" not in text
    assert "<script" not in text.lower()  # no scripts at all, hostile names included
    assert not re.search(r"\b(src|href)\s*=", text)
    assert "<link" not in text and "@import" not in text and "url(" not in text


def test_report_well_formed_with_svg(report) -> None:
    _, text, _, _ = report
    root = well_formed(text)
    svgs = list(root.iter("svg"))
    assert len(svgs) == 4
    for s in svgs:
        assert s.find("title") is not None and s.find("title").text
        assert s.get("role") == "img" and s.get("aria-labelledby")
        assert s.get("viewBox")
        texts = [t for t in s.iter("text")]
        assert len(texts) > 5  # ticks and axis labels
    kinds = {s.find("title").text for s in svgs}
    assert "Reported vs effective utilization of allocated GPUs" in kinds
    assert "Masking gap over time" in kinds
    assert any(k.startswith("Top ") and "recoverable waste" in k for k in kinds)
    assert "Effective utilization of busy allocated GPUs" in kinds
    # time series drawn as lines, the others as bars
    util = next(s for s in svgs if s.find("title").text.startswith("Reported vs"))
    assert len(util.findall("polyline")) >= 2
    assert len(next(s for s in svgs if s.find("title").text.startswith("Top ")).findall("rect")) >= 6


def test_report_summary_numbers(report) -> None:
    _, text, _, s = report
    root = well_formed(text)
    cards = {c.findall("div")[1].text: c.findall("div")[0].text for c in root.iter("div") if c.get("class", "")
             .startswith("card")}
    assert cards["Reported GPU util (allocated GPUs)"] == fmt_pct(s["reported_util"]) == "73.7%"
    assert cards["Effective util (allocated GPUs)"] == fmt_pct(s["effective_util"])
    assert cards["Masking gap (allocated GPUs)"] == fmt_pts(s["masking_gap"])
    assert cards["Effective util (whole fleet)"] == fmt_pct(s["fleet_effective_util"])
    for label, key in [("GPU-hours allocated", "allocated_gpu_hours"), ("GPU-hours effective", "effective_gpu_hours"),
                       ("GPU-hours of recoverable waste", "waste_gpu_hours"),
                       ("GPU-hours of normal headroom", "normal_gpu_hours"), ("GPU-hours idle", "idle_gpu_hours"),
                       ("GPU-hours unallocated", "unallocated_gpu_hours"), ("GPU-hours unknown", "unknown_gpu_hours")]:
        assert cards[label] == fmt_hours(s[key]), label
    # 213.5 held and reporting, plus the 2.5 h of the GPU chat-serve lost at 1h30 (XID 79): they
    # stay with chat-serve (still running elsewhere) as unknown.
    assert cards["GPU-hours allocated"] == "216.0"
    assert "2026-01-05T00:00:00Z" in text and "2026-01-05T04:00:00Z" in text
    assert "64 GPUs on 8 nodes" in text and "truegpu" in text


def test_report_escapes_hostile_names(report) -> None:
    _, text, _, _ = report
    assert HOSTILE not in text
    assert "&lt;script&gt;alert(&quot;x&quot;)&lt;/script&gt;" in text
    assert "ns&lt;1&gt;" in text and "p&quot;0" in text and "&amp; friends" in text
    root = well_formed(text)
    jobs = [td.text for td in root.iter("td")]
    assert HOSTILE in jobs  # the name survives, as text


def test_report_tables_sorted(report) -> None:
    _, text, _, _ = report
    root = well_formed(text)
    tables = list(root.iter("table"))
    assert len(tables) == 2
    job_rows = tables[0].find("tbody").findall("tr")
    wasted = [float(r.findall("td")[6].text.replace(",", "")) for r in job_rows]
    assert wasted == sorted(wasted, reverse=True) and len(job_rows) == 6
    bottlenecks = [r.findall("td")[10].text for r in job_rows]
    assert all(b.split(" ")[0] in {"compute_bound", "memory_bound", "communication_bound", "input_bound", "idle"}
               for b in bottlenecks)
    sev = [r.find("td/span").text for r in tables[1].find("tbody").findall("tr")]
    order = {"critical": 0, "warning": 1, "info": 2}
    assert sev[0] == "critical" and [order[s] for s in sev] == sorted(order[s] for s in sev)
    assert "ongoing" in text


def test_no_unknown_box_items_when_complete(report) -> None:
    _, text, fleet, s = report
    root = well_formed(text)
    box = next(sec for sec in root.iter("section") if sec.get("id") == "unknowns")
    assert fleet.missing == {}
    # mixed-fleet loses a GPU off the bus: its hours are unknown, said so.
    assert s["unknown_gpu_hours"] > 0
    assert "no utilization data" in ET.tostring(box, encoding="unicode")


def test_missing_signal_box(cluster: Cluster, tmp_path: Path) -> None:
    fleet = mixed_fleet(cluster)
    fleet.frame = fleet.frame.drop(columns=["sm_active"])
    fleet.missing["sm_active"] = "DCGM_FI_PROF_SM_ACTIVE not collected: enable it in dcgm-exporter's counters CSV"
    fleet.notes.append("42 lines <bad> skipped")
    fleet.dialect = "dcgm"
    text = write_report(tmp_path, fleet, compute_scores(fleet), []).read_text()
    root = well_formed(text)
    box = next(sec for sec in root.iter("section") if sec.get("id") == "unknowns")
    assert box.get("class") == "box"
    box_text = "".join(box.itertext())
    assert "What we could not measure" in box_text
    assert "sm_active" in box_text and "dcgm-exporter" in box_text
    assert "42 lines <bad> skipped" in box_text and "&lt;bad&gt;" in text
    assert "idle masking cannot be measured" in box_text  # Scores.notes
    cards = {c.findall("div")[1].text: c.findall("div")[0] for c in root.iter("div")
             if c.get("class", "").startswith("card")}
    gap = cards["Masking gap (allocated GPUs)"]
    assert gap.text == "unknown" and "unknown" in gap.get("class")  # unknown, not 0
    assert "Unknown: needs both GPU util and SM activity" in text
    assert "No findings" in text


def test_no_allocated_gpus_renders(cluster: Cluster, tmp_path: Path) -> None:
    fleet = mixed_fleet(cluster)
    for c in ALLOCATION_COLUMNS:
        fleet.frame[c] = pd.Categorical([np.nan] * len(fleet.frame), categories=[])
    scores = compute_scores(fleet)
    path = write_report(tmp_path / "a" / "b", fleet, scores, [], title="idle fleet")
    text = path.read_text()
    root = well_formed(text)
    assert len(list(root.iter("svg"))) == 4
    assert "No allocated GPUs in this window" in text and "No job held a GPU" in text
    cards = {c.findall("div")[1].text: c.findall("div")[0].text for c in root.iter("div")
             if c.get("class", "").startswith("card")}
    assert cards["Reported GPU util (allocated GPUs)"] == "unknown"
    assert cards["GPU-hours allocated"] == "0.0"
    # 256 GPU-hours of capacity; the GPU lost at 1h30 (XID 79) has no data for 2.5 h: unknown, not unallocated.
    assert cards["GPU-hours unallocated"] == "253.5"
    assert cards["GPU-hours unknown"] == "2.5"


def test_timeseries_matches_scores(cluster: Cluster) -> None:
    fleet = mixed_fleet(cluster)
    scores = compute_scores(fleet)
    ts = D.timeseries(fleet, scores)
    assert len(ts) == 240 and (ts["width"] == 60).all()
    # the time-weighted mean of the per-step means equals the allocated aggregate when allocation is constant
    s = fleet_summary(scores)
    w = ts["allocated_gpus"].to_numpy()
    eff = ts["effective_util"].to_numpy()
    assert np.nanmax(eff) <= 1 and np.nanmin(eff) >= 0
    assert abs(w.sum() * 60 / 3600 - s["allocated_gpu_hours"]) < 1e-6
    ts_coarse = D.timeseries(fleet, scores, max_points=50)
    assert len(ts_coarse) <= 50 and ts_coarse["width"].iloc[0] == 300
    edges, heights, total, mean = D.util_histogram(fleet, scores)
    assert len(edges) == 21 and abs(heights.sum() - total) < 1e-9 and 0 < mean < 1


def test_ticks() -> None:
    assert list(nice_ticks(0, 1)) == [0, 0.2, 0.4, 0.6, 0.8, 1.0]
    assert list(nice_ticks(0, 31.7)) == [0, 10, 20, 30, 40]
    ticks, fmt = time_ticks(1767571200.0, 1767585600.0)
    assert fmt == "%H:%M" and ticks[0] == 1767571200.0 and np.all(np.diff(ticks) == 3600)
