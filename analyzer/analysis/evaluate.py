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
A truth whose evidence the input does not carry at all (:data:`EVIDENCE`, or the truth's own ``needs``: an ECC
storm where no ECC counter is collected, a stalling straggler where SM activity is not) is *unobservable*: counted
of recall (a finding matching it is still true).

Replay (:func:`replay`, ``truegpu evaluate --replay``) judges the same way but as ``serve`` sees the
fleet: one analysis of the last window every interval, each run's findings matched with open ends at
the run time; it adds the time to detect (first run showing a matching finding minus the onset).
False findings are also given per 1,000 GPU-hours of the fleet (sum of ``gpu_share`` over
rows x step), the rate an operator would see on a healthy fleet. Truth is clipped to the
evaluated window; records entirely outside it are ignored.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from analyzer.data.frame import Fleet
from analyzer.findings import IDLE_ALLOCATED, IDLE_MASKING, SEVERITY_ORDER, Finding, json_ready
from analyzer.pipeline import detect
from analyzer.site import SiteConfig

#: Per truth attribution, the signals that carry its evidence. Where the input has none of them (dcgm-exporter's
#: default counter set leaves out every ECC and NVLink error field) no detector can see the problem: it is counted
#: apart as *unobservable*, with the input's own reason, neither found nor missed, so recall is judged on what the
#: input can show, and what it cannot is printed next to it, never dropped.
EVIDENCE: dict[str, tuple[str, ...]] = {
    "ecc_storm": ("ecc_correctable_rate",),
    "nvlink": ("nvlink_error_rate", "nvlink_links_down"),
}

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


def unobservable(t: Mapping[str, Any], fleet: Fleet | None) -> str | None:
    """Why ``fleet`` cannot show the problem ``t`` (its evidence signals' missing reasons), None where it can."""
    need = tuple(t.get("needs") or EVIDENCE.get(str(t.get("attribution")), ()))
    if fleet is None or not need or any(s not in fleet.missing for s in need):
        return None
    return "; ".join(fleet.missing[s] for s in need)


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
        every = [t for t in truth if t["kind"] == kind]
        hit = np.array([[matches(f, t, w1, racks) for t in every] for f in fs], bool).reshape(len(fs), len(every))
        hit_f = hit.any(axis=1)  # a finding on an unobservable problem is still true
        why = [unobservable(t, fleet) for t in every]
        unseen = [{**_brief_truth(t), "attribution": t.get("attribution"), "unobservable": w}
                  for t, w in zip(every, why, strict=True) if w]
        ts = [t for t, w in zip(every, why, strict=True) if not w]
        detected, onsets, coverage, fragmented = 0, [], [], 0
        missed = []
        for t, col, w in zip(every, hit.T, why, strict=True):
            if w:
                continue
            m = np.flatnonzero(col)
            if not len(m):
                missed.append(_brief_truth(t))
                continue
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
            "missed": len(ts) - detected, "unobservable": len(unseen),
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
            "unobservable_truth": unseen,
        }
    return result


def _brief_finding(f: Finding) -> dict[str, Any]:
    """What a reader needs to judge a false finding: where, when, how bad, and the detector's evidence."""
    return {"id": f.id, "kind": f.kind, "severity": f.severity, "confidence": f.confidence,
            "hostname": f.hostname, "gpu": f.gpu, "gpu_instance": f.gpu_instance, "job": f.job,
            "start": f.start, "end": f.end, "summary": f.summary, "evidence": json_ready(f.evidence)}


def _brief_truth(t: Mapping[str, Any]) -> dict[str, Any]:
    return {k: t.get(k) for k in ("hostname", "gpu", "job", "start", "end", "cause")}


def scenario_fleet(cluster: Any, dialect: str = "truegpu", step: float = 60.0, *,
                   dcgm_counters: str = "all", workdir: str | Path | None = None) -> Fleet:
    """The Fleet the analyzer sees for a simulated cluster in ``dialect``.

    truegpu: straight from the simulator's table (``fleet_from_cluster``). dcgm: the
    cluster's history written as dcgm-exporter would have exposed it (``dcgm_counters``
    "all" or "default"), read back through ``analyzer.data.load.load_files``: the full path a
    user's dcgm data takes. A scenario with ``mess:`` goes through a history file in both
    dialects, written with that mess (gaps, restarts, repeats, HA replicas).
    """
    mess = getattr(getattr(cluster, "scenario", None), "mess", None)
    if dialect == "truegpu" and not mess:
        from analyzer.data.simulated import fleet_from_cluster

        return fleet_from_cluster(cluster, step=step)
    if dialect not in DIALECTS:
        raise ValueError(f"unknown dialect {dialect!r} (one of {', '.join(DIALECTS)})")
    from analyzer.data.load import load_files  # written alongside; imported lazily so truegpu works without it
    from exporter.simulator.dcgm_dialect import DcgmOptions
    from exporter.simulator.history import Mess, write_history

    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        path = Path(tmp) / "history.om"
        write_history(path, cluster, cluster.start, cluster.start + cluster.duration, step, dialect=dialect,
                      dcgm_options=DcgmOptions(counters=dcgm_counters),  # type: ignore[arg-type]
                      mess=Mess(**mess) if mess else None)
        loaded = load_files([path])
    if isinstance(loaded, Fleet):
        return loaded
    from analyzer.data.normalize import normalize

    return normalize(loaded)


def _build(name: str, dialect: str, step: float, dcgm_counters: str, seed_offset: int = 0) -> tuple[Any, Fleet]:
    from exporter.simulator.model import Cluster
    from exporter.simulator.scenario import load_scenario

    scenario = load_scenario(name)
    if seed_offset:
        scenario = load_scenario(name, seed=scenario.seed + seed_offset)
    cluster = Cluster(scenario)
    return cluster, scenario_fleet(cluster, dialect, step, dcgm_counters=dcgm_counters)


_built = functools.cache(_build)


def named_scenario_fleet(
    name: str, dialect: str = "truegpu", step: float = 60.0, *, dcgm_counters: str = "all", seed_offset: int = 0
) -> tuple[Any, Fleet]:
    """(Cluster, Fleet) of a built-in scenario, built once per process; ``seed_offset`` re-runs it with the
    scenario's seed plus the offset (a different cluster, same faults: the multi-seed judgement).

    Simulating a scenario and (for dcgm) writing and re-reading its history costs seconds;
    every detector's evaluation reads the same fleets, so they are kept (the scenario's own seed
    only: many seeds of every scenario would not fit in memory). Each caller gets its own
    notes/missing (detectors append notes); the frame is shared and must not be mutated.
    """
    build = _build if seed_offset else _built
    cluster, fleet = build(name, dialect, float(step), dcgm_counters, seed_offset)
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
    seeds: int = 1,
    seed_offset: int = 0,
) -> list[dict[str, Any]]:
    """Simulate each scenario, analyze it in ``dialect`` and judge the findings of ``kinds`` (detector
    settings: the ``site`` config's, then ``config``); ``seeds`` runs of each, seed offsets
    ``seed_offset`` .. ``seed_offset + seeds - 1`` (0: the scenario file's own seed)."""
    out = []
    for name, offset in scenario_runs(names, seeds, seed_offset):
        cluster, fleet = named_scenario_fleet(name, dialect, step, dcgm_counters=dcgm_counters, seed_offset=offset)
        findings = detect(fleet, kinds, site, config)
        res = evaluate(findings, cluster.ground_truth(), kinds, fleet)
        res.update(scenario=name, seed=cluster.scenario.seed, dialect=dialect, step=step, notes=list(fleet.notes),
                   dcgm_counters=dcgm_counters if dialect == "dcgm" else None)
        out.append(res)
    return out


def scenario_runs(names: Iterable[str] | None, seeds: int = 1, seed_offset: int = 0) -> list[tuple[str, int]]:
    """(scenario, seed offset) pairs: every scenario (all bundled ones by default) once per seed."""
    from exporter.simulator.scenario import list_scenarios

    if seeds < 1 or seed_offset < 0:
        raise ValueError(f"seeds must be >= 1 and the seed offset >= 0, got {seeds} and {seed_offset}")
    chosen = list(names) if names is not None else list_scenarios()
    return [(name, seed_offset + k) for k in range(seeds) for name in chosen]


# -- replay: time to detect, the way `serve` sees history ----------------------------------------
def replay_cuts(start: float, end: float, step: float, interval: float) -> list[float]:
    """Ends of the windows a service started at ``start`` analyzes until ``end``: one run every
    ``interval``, its window ending at the run time aligned down to the step (as the loop does), so an
    interval shorter than the step brings no new rows and adds no cut."""
    from analyzer.service.loop import aligned_end

    if step <= 0 or interval <= 0:
        raise ValueError("step and interval must be > 0")
    cuts: list[float] = []
    for k in range(1, int((end - start) / interval + 1e-9) + 1):
        cut = aligned_end(start + k * interval + 1e-6, step)
        if cut > start and (not cuts or cut > cuts[-1]):
            cuts.append(cut)
    return cuts


@dataclasses.dataclass
class _Seen:
    """A finding id over the replay: its kind, whether it ever matched a truth, its first sighting and
    the highest severity any run gave it (a suspected finding confirmed later pages at that severity)."""

    kind: str
    first_cut: float
    finding: Finding
    true: bool = False
    severity_max: str = "info"


def replay(
    fleet: Fleet,
    truth: Iterable[Mapping[str, Any]],
    kinds: Sequence[str] = DEFAULT_KINDS,
    *,
    interval: float,
    window: float,
    site: SiteConfig | None = None,
    config: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, Any]:
    """Re-run the analysis over ``fleet`` the way ``serve`` would have, and time each detection.

    Every cut (:func:`replay_cuts`) analyzes ``[cut - window, cut)`` (``Fleet.between``), carries the
    ids of the last window's findings and the detectors' memory over like the service
    (:class:`analyzer.findings.IdMemory`, :class:`analyzer.detectors.Memory`) and
    matches the cut's findings to the truth (:func:`matches`, open ends at the cut). A truth's time to
    detect is the first cut holding a matching finding minus its onset (missed when none does); ``withdrawn``
    counts the cuts where a problem still going on lost every matching finding it had at the cut before
    (an alert on it resolves, or its ``for:`` starts over: a flap, whatever the id), ``downgraded`` those where
    its most urgent matching finding became less urgent (the alert rule of that severity resolves). The
    findings of the replay are the distinct ids: an id is true when it ever matched a truth, so a false
    finding counts once however many runs show it. ``ids`` per problem counts the distinct ids that
    matched it: more than one is either several devices of a node- or rack-level problem or an id that
    did not carry over (an alert that would have flapped). Scrape lag and the rules' ``for:`` come on top.
    """
    from analyzer.detectors import Memory
    from analyzer.findings import IdMemory

    cuts = replay_cuts(fleet.start, fleet.end, fleet.step, interval)
    truth = _clip_truth(truth, fleet.start, cuts[-1]) if cuts else []
    racks = host_racks(fleet)
    first: dict[int, float] = {}
    ids_of: dict[int, set[str]] = {}
    seen: dict[str, _Seen] = {}
    shown: dict[int, int] = {}  # problems a finding matched at the last cut: the most urgent one's SEVERITY_ORDER
    withdrawn: dict[int, int] = {}
    downgraded: dict[int, int] = {}
    ids, memory = IdMemory(window), Memory()
    for cut in cuts:
        found = detect(fleet.between(cut - window, cut), kinds, site, config, memory=memory)
        ids.carry(found, cut)
        now: dict[int, int] = {}
        for f in found:
            rec = seen.setdefault(f.id, _Seen(f.kind, cut, f, severity_max=f.severity))
            if SEVERITY_ORDER[f.severity] < SEVERITY_ORDER[rec.severity_max]:
                rec.severity_max = f.severity
            for j, t in enumerate(truth):
                if matches(f, t, cut, racks):
                    rec.true = True
                    first.setdefault(j, cut)
                    ids_of.setdefault(j, set()).add(f.id)
                    now[j] = min(now.get(j, len(SEVERITY_ORDER)), SEVERITY_ORDER[f.severity])
        for j, order in shown.items():  # while the problem goes on: gone, its alert resolves (a firing one) or
            if truth[j]["end"] is None or cut < float(truth[j]["end"]):  # restarts its for:; less urgent, the
                if j not in now:  # alert of its severity resolves and one of the lower starts
                    withdrawn[j] = withdrawn.get(j, 0) + 1
                elif now[j] > order:
                    downgraded[j] = downgraded.get(j, 0) + 1
        shown = now
    gpu_hours = fleet_gpu_hours(fleet)
    result: dict[str, Any] = {"window": [fleet.start, fleet.end], "gpu_hours": gpu_hours, "cuts": len(cuts),
                              "interval": interval, "analysis_window": window, "kinds": {}}
    for kind in kinds:
        problems = [
            {**_brief_truth(t), "attribution": t.get("attribution"), "slowdown": t.get("slowdown"),
             "ttd_s": first[j] - float(t["start"]) if j in first else None, "ids": len(ids_of.get(j, ())),
             "withdrawn": withdrawn.get(j, 0), "downgraded": downgraded.get(j, 0),
             "unobservable": unobservable(t, fleet)}
            for j, t in enumerate(truth) if t["kind"] == kind
        ]
        ids = [r for r in seen.values() if r.kind == kind]
        result["kinds"][kind] = _replay_counts(problems, ids, gpu_hours)
    return result


def _replay_counts(every: list[dict[str, Any]], ids: list[_Seen], gpu_hours: float) -> dict[str, Any]:
    problems = [p for p in every if not p["unobservable"]]
    tp = sum(1 for r in ids if r.true)
    paged = sum(1 for r in ids if not r.true and SEVERITY_ORDER[r.severity_max] <= SEVERITY_ORDER["warning"])
    detected = sum(1 for p in problems if p["ttd_s"] is not None)
    ttd = [p["ttd_s"] for p in problems]
    return {
        "findings": len(ids), "tp": tp, "fp": len(ids) - tp, "fp_paged": paged, "truth": len(problems),
        "detected": detected, "missed": len(problems) - detected, "unobservable": len(every) - len(problems),
        "precision": _ratio(tp, len(ids)), "recall": _ratio(detected, len(problems)),
        **ttd_summary(ttd),
        "ids_max": max((p["ids"] for p in problems), default=0),
        "withdrawn": sum(p["withdrawn"] for p in problems),
        "downgraded": sum(p["downgraded"] for p in problems),
        "false_per_1000_gpu_hours": (len(ids) - tp) / gpu_hours * 1000.0 if gpu_hours else None,
        "problems": problems,
        "unobservable_problems": [p for p in every if p["unobservable"]],
        "false_findings": [{**_brief_finding(r.finding), "first_cut": r.first_cut, "severity_max": r.severity_max}
                           for r in ids if not r.true],
    }


def ttd_quantile(ttd: Sequence[float | None], q: float) -> float | None:
    """Nearest-rank quantile of times to detect, a missed problem (None) ranking above every time: None
    when the quantile falls on a missed problem (or there is none), else a time that was measured."""
    if not ttd:
        return None
    ranked = sorted(ttd, key=lambda x: (x is None, x or 0.0))
    return ranked[max(math.ceil(q * len(ranked)), 1) - 1]


def ttd_summary(ttd: Sequence[float | None]) -> dict[str, float | None]:
    """p50/p95 (None: "missed", see :func:`ttd_quantile`) and the slowest detection of ``ttd``."""
    found = [x for x in ttd if x is not None]
    return {"ttd_p50_s": ttd_quantile(ttd, 0.5), "ttd_p95_s": ttd_quantile(ttd, 0.95),
            "ttd_max_s": max(found) if found else None}


def _replay_one(job: tuple[Any, ...]) -> dict[str, Any]:
    name, offset, dialect, step, interval, window, kinds, counters, site, config = job
    cluster, fleet = named_scenario_fleet(name, dialect, step, dcgm_counters=counters, seed_offset=offset)
    res = replay(fleet, cluster.ground_truth(), kinds, interval=interval, window=window, site=site, config=config)
    res.update(scenario=name, seed=cluster.scenario.seed, dialect=dialect, step=step,
               dcgm_counters=counters if dialect == "dcgm" else None)
    return res


def replay_scenarios(
    names: Iterable[str] | None = None,
    dialect: str = "truegpu",
    kinds: Sequence[str] = DEFAULT_KINDS,
    *,
    step: float | None = None,
    interval: float | None = None,
    window: float | None = None,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    dcgm_counters: str = "all",
    site: SiteConfig | None = None,
    seeds: int = 1,
    seed_offset: int = 0,
    jobs: int = 1,
) -> list[dict[str, Any]]:
    """:func:`replay` of every scenario run (:func:`scenario_runs`), each simulated once and cut into
    windows; step, interval and window default to ``serve``'s. ``jobs`` > 1 replays runs in parallel
    processes (the replay is CPU-bound: one analysis per cut)."""
    from analyzer.service.loop import DEFAULT_INTERVAL, DEFAULT_STEP, DEFAULT_WINDOW

    step, interval = float(step or DEFAULT_STEP), float(interval or DEFAULT_INTERVAL)
    window = float(window or DEFAULT_WINDOW)
    if window < step:
        raise ValueError(f"window ({window:g}s) must be at least one step ({step:g}s)")
    work = [(name, offset, dialect, step, interval, window, list(kinds), dcgm_counters, site, config)
            for name, offset in scenario_runs(names, seeds, seed_offset)]
    if jobs <= 1 or len(work) <= 1:
        return [_replay_one(w) for w in work]
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=min(jobs, len(work))) as pool:
        return list(pool.map(_replay_one, work))


def pooled_replay(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, Any]]:
    """Per (dialect, kind) over scenario runs: distinct findings and problems pooled (like :func:`pooled`),
    time to detect p50/p95 over every problem, and per attribution (the fault that caused it)."""
    acc: dict[tuple[str, str], dict[str, Any]] = {}
    for r in results:
        for kind, k in r["kinds"].items():
            a = acc.setdefault((str(r.get("dialect", "-")), kind),
                               {"findings": 0, "tp": 0, "fp_paged": 0, "truth": 0, "detected": 0, "unobservable": 0,
                                "withdrawn": 0, "downgraded": 0, "ids_max": 0, "problems": []})
            for key in ("findings", "tp", "fp_paged", "truth", "detected", "unobservable", "withdrawn", "downgraded"):
                a[key] += k[key]
            a["ids_max"] = max(a["ids_max"], k["ids_max"])
            a["problems"] += k["problems"]
    for a in acc.values():
        problems = a.pop("problems")
        a.update(precision=_ratio(a["tp"], a["findings"]), recall=_ratio(a["detected"], a["truth"]),
                 missed=a["truth"] - a["detected"], **ttd_summary([p["ttd_s"] for p in problems]))
        causes: dict[str, list[float | None]] = {}
        for p in problems:
            causes.setdefault(str(p.get("attribution") or "-"), []).append(p["ttd_s"])
        a["by_attribution"] = {c: {"truth": len(v), **ttd_summary(v)} for c, v in sorted(causes.items())}
        bands: dict[str, list[float | None]] = {}
        for p in problems:
            if p.get("slowdown") is not None:
                bands.setdefault(_slowdown_band(float(p["slowdown"])), []).append(p["ttd_s"])
        a["by_slowdown"] = {b: {"truth": len(v), **ttd_summary(v)} for b, v in bands.items()}
    return acc


#: Slowdown bands of the straggler targets (issue 12: >= 20 % within 5 min, >= 10 % within 10 min).
SLOWDOWN_BANDS: tuple[tuple[float, str], ...] = ((0.2, "slowdown >= 20%"), (0.1, "slowdown 10-20%"),
                                                 (0.0, "slowdown < 10%"))


def _slowdown_band(s: float) -> str:
    """The band of a straggler's real gang slowdown (the truth's, after the gang's healthy chip spread)."""
    return next(name for low, name in SLOWDOWN_BANDS if s >= low - 1e-9)


def _ttd(x: float | None, truth: int) -> str:
    return "-" if not truth else "missed" if x is None else f"{x:.0f}"


def format_replay(results: Sequence[Mapping[str, Any]]) -> str:
    """Replay results pooled per (dialect, kind), with the time to detect per attribution under each kind."""
    head = ("dialect", "kind", "problems", "found", "unobs", "prec", "recall", "ttd p50 s", "ttd p95 s",
            "ttd max s", "ids/problem max", "withdrawn", "downgraded", "FP", "FP paged")
    rows = [head]
    for (dialect, kind), a in sorted(pooled_replay(results).items()):
        rows.append((dialect, kind, str(a["truth"]), str(a["detected"]), str(a["unobservable"]),
                     f"{a['precision']:.3f}", f"{a['recall']:.3f}", _ttd(a["ttd_p50_s"], a["truth"]),
                     _ttd(a["ttd_p95_s"], a["truth"]), _num(a["ttd_max_s"], ".0f"), str(a["ids_max"]),
                     str(a["withdrawn"]), str(a["downgraded"]), str(a["findings"] - a["tp"]), str(a["fp_paged"])))
        parts = [*(a["by_attribution"].items() if len(a["by_attribution"]) > 1 else ()),
                 *((b, a["by_slowdown"][b]) for _, b in SLOWDOWN_BANDS if b in a["by_slowdown"])]
        for name, c in parts:
            rows.append(("", f"  {name}", str(c["truth"]), "", "", "", "", _ttd(c["ttd_p50_s"], c["truth"]),
                         _ttd(c["ttd_p95_s"], c["truth"]), _num(c["ttd_max_s"], ".0f"), "", "", "", "", ""))
    return _columns(rows, 2)


def _columns(rows: Sequence[Sequence[str]], left: int) -> str:
    """Fixed-width columns, the first ``left`` left-aligned, a rule under the header."""
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i < left else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
             for row in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    return "\n".join(lines)


def _num(x: float | None, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(results: Sequence[Mapping[str, Any]]) -> str:
    """Results of ``evaluate_scenarios`` as a fixed-width table, one line per scenario and kind."""
    head = ("scenario", "dialect", "kind", "found", "truth", "TP", "FP", "FN", "unobs", "prec", "recall", "F1",
            "onset med s", "onset max s", "cover", "FP/1kGPUh")
    rows = [head]
    for r in results:
        for kind, k in r["kinds"].items():
            rows.append((
                r.get("scenario", "-"), r.get("dialect", "-"), kind, str(k["findings"]), str(k["truth"]),
                str(k["tp"]), str(k["fp"]), str(k["missed"]), str(k["unobservable"]), f"{k['precision']:.3f}",
                f"{k['recall']:.3f}", f"{k['f1']:.3f}", _num(k["onset_median_s"], ".0f"), _num(k["onset_max_s"], ".0f"),
                _num(k["coverage_mean"], ".2f"), _num(k["false_per_1000_gpu_hours"], ".2f"),
            ))
    return _columns(rows, 3)


def pooled(results: Sequence[Mapping[str, Any]]) -> dict[tuple[str, str], dict[str, float]]:
    """Micro-averaged precision/recall per (dialect, kind) over scenarios: the CI gate's numbers.

    Pooling counts (not averaging per-scenario ratios) keeps a scenario with one truth from
    weighing as much as one with twenty.
    """
    acc: dict[tuple[str, str], dict[str, float]] = {}
    for r in results:
        for kind, k in r["kinds"].items():
            a = acc.setdefault((str(r.get("dialect", "-")), kind),
                               {"findings": 0, "tp": 0, "truth": 0, "detected": 0, "unobservable": 0})
            for key in a:
                a[key] += k[key]
    for a in acc.values():
        a["precision"] = _ratio(a["tp"], a["findings"])
        a["recall"] = _ratio(a["detected"], a["truth"])
    return acc


__all__ = ["DEFAULT_KINDS", "EVIDENCE", "evaluate", "evaluate_scenarios", "fleet_gpu_hours", "format_replay",
           "format_table", "matches", "named_scenario_fleet", "pooled", "pooled_replay", "replay", "replay_cuts",
           "replay_scenarios", "scenario_fleet", "scenario_runs", "ttd_quantile", "ttd_summary",
           "unobservable"]
