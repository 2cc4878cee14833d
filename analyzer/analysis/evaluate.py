"""Judge detectors against the simulator's ground truth: precision, recall, onset error.

Matching rules (a finding *matches* a ground-truth record when all three hold):

1. Same kind.
2. Same entity, at the truth's granularity:
   - GPU-level truth (``gpu`` set): same hostname and same GPU index; findings on MIG
     instances of that GPU all match it (the truth is per physical GPU);
   - node-level truth (``gpu`` None, ``hostname`` set): any finding on that host;
   - job-level truth (no hostname, ``job`` set): any finding attributed to that job.
   A finding coarser than the truth matches when it contains the truth's entity: a
   rack-level finding (no hostname, ``rack`` set: "this rack is cooking") matches node
   truth on any host of that rack, and a job-level finding (no hostname, ``job`` set:
   "this job spans two sites") matches node truth carrying that job. One rack finding for
   a rack-wide problem is what an on-call engineer wants, not one finding per GPU.
3. Time overlap: the half-open intervals ``[start, end)`` share some time, an open end
   (None) meaning the end of the evaluated window. *Any* overlap, not an IoU threshold:
   whether the detector found the problem is one question (precision/recall), how well it
   placed it in time another, answered by the onset error (``finding.start - truth.start``
   of the earliest matching finding: positive = late) and the coverage (share of the
   truth's interval covered by matching findings). An IoU cut would turn a few minutes of
   detection delay on a short truth into a miss and hide that it was merely late.

Counting: a finding is a true positive when it matches any truth, else a false finding;
a truth is detected when any finding matches it. Several findings may match one truth
(MIG instances of one GPU; a problem split in two), reported as ``fragmented``.
Precision is 1.0 with no findings (nothing false was claimed), recall 1.0 with no truth.
False findings are also given per 1,000 GPU-hours of the fleet (sum of ``gpu_share`` over
rows x step), the rate an operator would see on a healthy fleet. Truth is clipped to the
evaluated window; records entirely outside it are ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.data.frame import Fleet
from analyzer.findings import IDLE_ALLOCATED, IDLE_MASKING, Finding
from analyzer.pipeline import detect
from analyzer.site import SiteConfig

#: Kinds judged by default (the detectors that exist so far).
DEFAULT_KINDS: tuple[str, ...] = (IDLE_MASKING, IDLE_ALLOCATED)
DIALECTS: tuple[str, ...] = ("truegpu", "dcgm")


def fleet_gpu_hours(fleet: Fleet) -> float:
    """Physical GPU-hours covered by the fleet's rows (MIG instances weighted by their share)."""
    f = fleet.frame
    share = f["gpu_share"].to_numpy(dtype=np.float64) if "gpu_share" in f.columns else np.ones(len(f))
    return float(np.nansum(share) * fleet.step / 3600.0)


def _entity_match(f: Finding, t: Mapping[str, Any], racks: Mapping[str, str]) -> bool:
    host = t.get("hostname")
    if host:
        if f.hostname is None and t.get("gpu") is None:  # a coarser finding containing this node
            if f.rack:
                return racks.get(host) == f.rack
            return bool(f.job) and f.job == t.get("job")
        if f.hostname != host:
            return False
        return t.get("gpu") is None or (f.gpu is not None and str(f.gpu) == str(t["gpu"]))
    if t.get("job"):
        return f.job == t["job"]
    return False


def host_racks(fleet: Fleet | None) -> dict[str, str]:
    """hostname -> rack, from the fleet's rows (empty without a fleet or rack labels)."""
    if fleet is None or "rack" not in fleet.frame.columns:
        return {}
    pairs = fleet.frame[["hostname", "rack"]].drop_duplicates()
    return {str(h): str(r) for h, r in zip(pairs["hostname"], pairs["rack"], strict=True) if r == r and r}


def _overlap(a0: float, a1: float, b0: float, b1: float) -> float:
    return max(0.0, min(a1, b1) - max(a0, b0))


def matches(f: Finding, t: Mapping[str, Any], window_end: float, racks: Mapping[str, str] | None = None) -> bool:
    """Does finding ``f`` match truth ``t`` (same kind, same entity, overlapping in time)?"""
    if f.kind != t["kind"] or not _entity_match(f, t, racks or {}):
        return False
    f_end = window_end if f.end is None else f.end
    t_end = window_end if t.get("end") is None else float(t["end"])
    return _overlap(f.start, f_end, float(t["start"]), t_end) > 0


def _clip_truth(truth: Iterable[Mapping[str, Any]], start: float, end: float) -> list[dict[str, Any]]:
    out = []
    for t in truth:
        t_end = end if t.get("end") is None else min(float(t["end"]), end)
        t_start = max(float(t["start"]), start)
        if t_end > t_start:
            out.append({**t, "start": t_start, "end": None if t_end >= end else t_end})
    return out


def _ratio(num: float, den: float, empty: float = 1.0) -> float:
    return num / den if den else empty


def evaluate(
    findings: Sequence[Finding],
    truth: Iterable[Mapping[str, Any]],
    kinds: Iterable[str] = DEFAULT_KINDS,
    fleet: Fleet | None = None,
    *,
    window: tuple[float, float] | None = None,
) -> dict[str, Any]:
    """Per-kind precision/recall/F1, onset error and false-finding rate (see the module doc).

    The window is ``fleet.start..fleet.end`` (or ``window``); ``fleet`` also gives the
    GPU-hours for the false-finding rate (None without a fleet).
    """
    if window is None:
        if fleet is None:
            raise ValueError("give the fleet (or window=(start, end)) the findings were computed on")
        window = (fleet.start, fleet.end)
    w0, w1 = window
    gpu_hours = fleet_gpu_hours(fleet) if fleet is not None else None
    truth = _clip_truth(truth, w0, w1)
    racks = host_racks(fleet)
    result: dict[str, Any] = {"window": [w0, w1], "gpu_hours": gpu_hours, "kinds": {}}
    for kind in kinds:
        fs = [f for f in findings if f.kind == kind]
        ts = [t for t in truth if t["kind"] == kind]
        hit_f = np.zeros(len(fs), bool)
        detected, onsets, coverage, fragmented = 0, [], [], 0
        missed = []
        for t in ts:
            m = [i for i, f in enumerate(fs) if matches(f, t, w1, racks)]
            if not m:
                missed.append(_brief_truth(t))
                continue
            hit_f[m] = True
            detected += 1
            onsets.append(min(fs[i].start for i in m) - float(t["start"]))
            t_end = w1 if t.get("end") is None else float(t["end"])
            covered = sum(_overlap(fs[i].start, w1 if fs[i].end is None else fs[i].end, float(t["start"]), t_end)
                          for i in m)
            coverage.append(min(covered / max(t_end - float(t["start"]), 1e-9), 1.0))
            per_device: dict[tuple, int] = {}
            for i in m:
                key = (fs[i].hostname, fs[i].gpu, fs[i].gpu_instance)
                per_device[key] = per_device.get(key, 0) + 1
            fragmented += sum(1 for c in per_device.values() if c > 1)
        tp = int(hit_f.sum())
        fp = len(fs) - tp
        precision, recall = _ratio(tp, len(fs)), _ratio(detected, len(ts))
        result["kinds"][kind] = {
            "findings": len(fs), "truth": len(ts), "tp": tp, "fp": fp, "detected": detected,
            "missed": len(ts) - detected,
            "precision": precision, "recall": recall,
            "f1": _ratio(2 * precision * recall, precision + recall, 0.0),
            "onset_median_s": float(np.median(onsets)) if onsets else None,
            "onset_max_s": float(np.max(onsets)) if onsets else None,
            "coverage_mean": float(np.mean(coverage)) if coverage else None,
            "fragmented": fragmented,
            "confidence": {c: sum(1 for f in fs if f.confidence == c) for c in ("high", "low")},
            "false_per_1000_gpu_hours": (fp / gpu_hours * 1000.0) if gpu_hours else None,
            "false_findings": [_brief_finding(f) for f, h in zip(fs, hit_f, strict=True) if not h],
            "missed_truth": missed,
        }
    return result


def _brief_finding(f: Finding) -> dict[str, Any]:
    return {"hostname": f.hostname, "gpu": f.gpu, "gpu_instance": f.gpu_instance, "job": f.job,
            "start": f.start, "end": f.end, "summary": f.summary}


def _brief_truth(t: Mapping[str, Any]) -> dict[str, Any]:
    return {k: t.get(k) for k in ("hostname", "gpu", "job", "start", "end", "cause")}


def scenario_fleet(cluster: Any, dialect: str = "truegpu", step: float = 60.0, *,
                   dcgm_counters: str = "all", workdir: str | Path | None = None) -> Fleet:
    """The Fleet the analyzer sees for a simulated cluster in ``dialect``.

    truegpu: straight from the simulator's table (``fleet_from_cluster``). dcgm: the
    cluster's history written as dcgm-exporter would have exposed it (``dcgm_counters``
    "all" or "default"), read back through ``analyzer.data.load.load_files``: the full path a
    user's dcgm data takes.
    """
    if dialect == "truegpu":
        from analyzer.data.simulated import fleet_from_cluster

        return fleet_from_cluster(cluster, step=step)
    if dialect != "dcgm":
        raise ValueError(f"unknown dialect {dialect!r} (one of {', '.join(DIALECTS)})")
    from analyzer.data.load import load_files  # written alongside; imported lazily so truegpu works without it
    from exporter.simulator.dcgm_dialect import DcgmOptions
    from exporter.simulator.history import write_history

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / "history.om"
        write_history(path, cluster, cluster.start, cluster.start + cluster.duration, step, dialect="dcgm",
                      dcgm_options=DcgmOptions(counters=dcgm_counters))  # type: ignore[arg-type]
        loaded = load_files([path])
    if isinstance(loaded, Fleet):
        return loaded
    from analyzer.data.normalize import normalize

    return normalize(loaded)


@functools.cache
def _built(name: str, dialect: str, step: float, dcgm_counters: str) -> tuple[Any, Fleet]:
    from exporter.simulator.model import Cluster
    from exporter.simulator.scenario import load_scenario

    cluster = Cluster(load_scenario(name))
    return cluster, scenario_fleet(cluster, dialect, step, dcgm_counters=dcgm_counters)


def named_scenario_fleet(
    name: str, dialect: str = "truegpu", step: float = 60.0, *, dcgm_counters: str = "all"
) -> tuple[Any, Fleet]:
    """(Cluster, Fleet) of a built-in scenario, built once per process.

    Simulating a scenario and (for dcgm) writing and re-reading its history costs seconds;
    every detector's evaluation reads the same fleets, so they are kept. Each caller gets its
    own notes/missing (detectors append notes); the frame is shared and must not be mutated.
    """
    cluster, fleet = _built(name, dialect, float(step), dcgm_counters)
    return cluster, dataclasses.replace(fleet, notes=list(fleet.notes), missing=dict(fleet.missing))


def evaluate_scenarios(
    names: Iterable[str] | None = None,
    dialect: str = "truegpu",
    step: float = 60.0,
    kinds: Sequence[str] = DEFAULT_KINDS,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    *,
    dcgm_counters: str = "all",
    site: SiteConfig | None = None,
) -> list[dict[str, Any]]:
    """Simulate each scenario, analyze it in ``dialect`` and judge the findings of ``kinds`` (detector
    settings: the ``site`` config's, then ``config``)."""
    from exporter.simulator.scenario import list_scenarios

    out = []
    for name in (list(names) if names is not None else list_scenarios()):
        cluster, fleet = named_scenario_fleet(name, dialect, step, dcgm_counters=dcgm_counters)
        findings = detect(fleet, kinds, site, config)
        res = evaluate(findings, cluster.ground_truth(), kinds, fleet)
        res.update(scenario=name, dialect=dialect, step=step, notes=list(fleet.notes))
        out.append(res)
    return out


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(results: Sequence[Mapping[str, Any]]) -> str:
    """Results of ``evaluate_scenarios`` as a fixed-width table, one line per scenario and kind."""
    head = ("scenario", "dialect", "kind", "found", "truth", "TP", "FP", "FN", "prec", "recall", "F1",
            "onset med s", "onset max s", "cover", "FP/1kGPUh")
    rows = [head]
    for r in results:
        for kind, k in r["kinds"].items():
            rows.append((
                r.get("scenario", "-"), r.get("dialect", "-"), kind, str(k["findings"]), str(k["truth"]),
                str(k["tp"]), str(k["fp"]), str(k["missed"]), f"{k['precision']:.3f}", f"{k['recall']:.3f}",
                f"{k['f1']:.3f}", _num(k["onset_median_s"], ".0f"), _num(k["onset_max_s"], ".0f"),
                _num(k["coverage_mean"], ".2f"), _num(k["false_per_1000_gpu_hours"], ".2f"),
            ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) if i < 3 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def pooled(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """Micro-averaged precision/recall per (dialect, kind) over scenarios: the CI gate's numbers.

    Pooling counts (not averaging per-scenario ratios) keeps a scenario with one truth from
    weighing as much as one with twenty.
    """
    acc: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        for kind, k in r["kinds"].items():
            a = acc.setdefault((str(r.get("dialect", "-")), kind), {"findings": 0, "tp": 0, "truth": 0, "detected": 0})
            for key in a:
                a[key] += k[key]
    for a in acc.values():
        a["precision"] = _ratio(a["tp"], a["findings"])
        a["recall"] = _ratio(a["detected"], a["truth"])
    return acc


__all__ = ["DEFAULT_KINDS", "evaluate", "evaluate_scenarios", "fleet_gpu_hours", "format_table", "matches",
           "named_scenario_fleet", "pooled", "scenario_fleet"]
