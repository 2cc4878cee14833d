"""The findings contract: one record per continuous problem, the analyzer's main output.

A finding names what is wrong (``kind``), how bad (``severity``, ``score``), where
(hostname/gpu/uuid, and job/namespace/pod when the device was allocated; rack for
cooling problems), when (``start``; ``end`` is None while the problem is still going on at
the end of the data), why (``evidence``: the numbers that justify it) and what to do
(``summary``: one sentence a person can act on).

Every finding carries a stable ``id``: the same problem keeps it across re-analyses and as it is
confirmed, extended or closed, so alerts, tickets and API clients can follow it. A fresh id is
derived from the kind, the entity and the start (:func:`finding_id`); a service re-analyzing a
sliding window carries the previous run's id over to the finding of the same kind and entity whose
time span touches it (:func:`carry_ids`), because the start of a problem that began before the
window moves with the window; :class:`IdMemory` remembers the findings of the last window, so a
problem missing from one run keeps its id too.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from datetime import UTC, datetime
from typing import Any, Literal

from analyzer.data.signals import ALLOCATION_LABELS

#: Version of the JSON truegpu writes (analyze --json, the API): 2 names the workload ``workload``
#: (``job`` in 1) in findings, filters, levels and cost groups. Fields added since (each finding's ``id``)
#: do not change the version: an added field is backward compatible, readers ignore what they do not know.
JSON_SCHEMA_VERSION = 2

Severity = Literal["critical", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}
#: How long a finding keeps the most urgent severity its detector last gave it (IdMemory).
HOLD_SEVERITY_S = 900.0

#: The built-in finding kinds (DESIGN.md): detectors, rules and dashboards name a kind with these constants,
#: never their own strings. The list of kinds is the detector registry's (analyzer.detectors.kinds()).
IDLE_MASKING = "idle_masking"
IDLE_ALLOCATED = "idle_allocated"
STRAGGLER = "straggler"
DEGRADED_GPU = "degraded_gpu"
GPU_FAULT = "gpu_fault"
THERMAL = "thermal"
TOPOLOGY = "topology"


@dataclass
class Finding:
    kind: str
    severity: Severity
    summary: str
    start: float
    end: float | None
    score: float
    hostname: str | None = None
    gpu: int | None = None
    uuid: str | None = None
    gpu_instance: str | None = None
    #: The workload (training job, deployment, Slurm job id): ``workload`` in JSON, labels and the API.
    job: str | None = None
    namespace: str | None = None
    pod: str | None = None
    rack: str | None = None
    #: "high" when the primary signal was available, "low" for a fallback (e.g. no SM activity).
    confidence: Literal["high", "low"] = "high"
    evidence: dict[str, Any] = field(default_factory=dict)
    #: Stable id of the problem (see the module doc); "" until assigned (:func:`assign_ids`), and
    #: :func:`finding_id` then stands in.
    id: str = ""

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict: RFC 3339 UTC times, ``gpu`` an integer or null, finite numbers only. The
        workload is ``workload`` (the attribute is ``job``), as on every label and API field."""
        out: dict[str, Any] = {"id": self.id or finding_id(self)}
        out.update((ALLOCATION_LABELS.get(k, k), v) for k, v in asdict(self).items() if k != "id")
        out["start"] = rfc3339(self.start)
        out["end"] = None if self.end is None else rfc3339(self.end)
        out["evidence"] = json_ready(self.evidence, digits=4)
        out["score"] = json_ready(float(self.score), digits=4)
        return out


#: What names the entity of a finding for its id: not the uuid (missing from some inputs) nor the pod
#: (a restarted pod gets a new name), not severity or score (they change as a problem is confirmed).
_ENTITY = ("hostname", "gpu", "gpu_instance", "rack", "namespace", "job")


def entity_key(f: Finding) -> tuple[str, ...]:
    """(kind, hostname, gpu, gpu_instance, rack, namespace, workload) as strings, "" where not set."""
    return (f.kind, *("" if getattr(f, k) is None else str(getattr(f, k)) for k in _ENTITY))


def finding_id(f: Finding) -> str:
    """A fresh id from kind, entity and start (whole seconds): the same input gives the same id in
    every process, so analyzing the same data twice names the same problems the same way."""
    text = "\x1f".join((*entity_key(f), str(math.floor(f.start))))
    return f"{f.kind}-{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def _unique(wanted: str, used: set[str]) -> str:
    out, n = wanted, 2
    while out in used:
        out, n = f"{wanted}-{n}", n + 1
    used.add(out)
    return out


def assign_ids(findings: Sequence[Finding]) -> None:
    """Give every finding without an id its :func:`finding_id`, unique within the list (two findings
    of one kind, entity and start, which no detector emits today, get ``-2``, ``-3`` suffixes)."""
    used = {f.id for f in findings if f.id}
    for f in findings:
        if not f.id:
            f.id = _unique(finding_id(f), used)


def _span_touch(a: Finding, a_end: float, b: Finding, b_end: float, gap_s: float = 0.0) -> float | None:
    """Overlap of two findings' spans (open ends at their analysis' end; negative: the gap between
    them); None when they are more than ``gap_s`` apart."""
    a1 = a_end if a.end is None else a.end
    b1 = b_end if b.end is None else b.end
    overlap = min(a1, b1) - max(a.start, b.start)
    return overlap if overlap >= -gap_s else None


def carry_ids(previous: Sequence[Finding], previous_end: float, current: Sequence[Finding],
              current_end: float, gap_s: float = 0.0) -> None:
    """Give ``current`` findings (one analysis, window ending ``current_end``) the ids of the
    ``previous`` analysis' findings of the same kind and entity whose spans touch or overlap theirs
    (or lie at most ``gap_s`` apart: a problem that recurs).

    Each previous id goes to one current finding at most (the one overlapping it most, earliest
    first): a problem that split keeps its id on one part. The rest keep or get a fresh id, never
    one already taken, so two distinct problems never share an id."""
    by_entity: dict[tuple[str, ...], list[Finding]] = {}
    for p in previous:
        by_entity.setdefault(entity_key(p), []).append(p)
    taken: set[str] = set()
    carried: set[int] = set()
    for i, f in sorted(enumerate(current), key=lambda x: x[1].start):
        best, best_overlap = None, -math.inf
        for p in by_entity.get(entity_key(f), ()):
            p_id = p.id or finding_id(p)
            overlap = _span_touch(p, previous_end, f, current_end, gap_s)
            if p_id not in taken and overlap is not None and overlap > best_overlap:
                best, best_overlap = p_id, overlap
        if best is not None:
            f.id = best
            taken.add(best)
            carried.add(i)
    for i, f in enumerate(current):
        if i not in carried:
            f.id = _unique(finding_id(f) if not f.id or f.id in taken else f.id, taken)


class IdMemory:
    """The findings recent analyses showed, so that a problem missing from one run gets its id back
    when it returns: a suspected straggler withdrawn for a minute, an intermittent one between
    spells, a run that failed. Carrying from the previous run only would give it a fresh id each
    time (an alert that flaps, an API client that loses track).

    Each remembered finding keeps the span it had when last shown (open ends closed at that run's
    end); entries last shown more than ``keep_s`` before the current run's end are forgotten, so the
    memory holds one window's worth of findings at most. A remembered finding gives its id to a finding
    of the same kind and entity within ``keep_s`` of its span even when they don't touch: the problem
    recurred (an intermittent straggler's next spells, an ECC storm flaring again), and one id keeps its
    alert and its API entry from flapping; a run that still shows the earlier episode keeps that id on it.

    A finding also keeps the most urgent severity its detector gave its id within the last ``hold_s``
    (evidence ``severity_held``): the alert rules are one per severity, so a straggler confirmed in its
    slow spells and only suspected between them (warning, info, warning) would resolve and re-page its
    warning each spell. Held for 15 minutes by default: a straggler's confirmation rests on its 15-minute
    lead, and a problem gone that long is a new page when it comes back."""

    def __init__(self, keep_s: float, hold_s: float = HOLD_SEVERITY_S) -> None:
        self.keep_s = float(keep_s)
        self.hold_s = float(hold_s)
        #: id -> (the finding as last shown, the end of the run that showed it)
        self._seen: dict[str, tuple[Finding, float]] = {}
        #: id -> (the most urgent severity its detector gave it lately, the end of the last run that gave it)
        self._urgent: dict[str, tuple[Severity, float]] = {}

    def carry(self, current: Sequence[Finding], current_end: float) -> None:
        """:func:`carry_ids` from every remembered finding, hold severities, then remember ``current``."""
        carry_ids([f for f, _ in self._seen.values()], current_end, current, current_end, gap_s=self.keep_s)
        for f in current:
            held = self._urgent.get(f.id)
            if held is None or SEVERITY_ORDER[f.severity] <= SEVERITY_ORDER[held[0]] or \
                    current_end - held[1] > self.hold_s:
                self._urgent[f.id] = (f.severity, current_end)
            else:
                f.evidence = {**f.evidence, "severity_held": {"severity": held[0], "given_until": rfc3339(held[1]),
                                                              "detector_says": f.severity}}
                f.severity = held[0]
            self._seen[f.id] = (f if f.end is not None else replace(f, end=current_end), current_end)
        horizon = current_end - self.keep_s
        self._seen = {k: seen for k, seen in self._seen.items() if seen[1] >= horizon}
        self._urgent = {k: held for k, held in self._urgent.items() if k in self._seen}

    def state(self) -> tuple[list[tuple[dict[str, Any], float]], list[tuple[str, str, float]]]:
        """What a restarted service needs (analyzer.service.state): each remembered finding's fields but its
        evidence (ids are carried on kind, entity and span) with the end of the run that showed it, and each
        held severity with the end of the last run that gave it."""
        seen = [({k: v for k, v in asdict(f).items() if k != "evidence"}, end) for f, end in self._seen.values()]
        return seen, [(i, sev, end) for i, (sev, end) in self._urgent.items()]

    def restore(self, seen: Sequence[Sequence[Any]], urgent: Sequence[Sequence[Any]]) -> None:
        """Take :meth:`state`'s output back (TypeError/ValueError on what does not fit, nothing restored)."""
        kept = {}
        for fields, end in seen:
            f = Finding(**fields)
            if not f.id or f.severity not in SEVERITY_ORDER:
                raise ValueError(f"remembered finding without an id or with severity {f.severity!r}")
            kept[f.id] = (f, float(end))
        held = {}
        for i, sev, end in urgent:
            if sev not in SEVERITY_ORDER:
                raise ValueError(f"held severity {sev!r}")
            held[str(i)] = (sev, float(end))
        self._seen, self._urgent = kept, held


def rfc3339(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def json_ready(value: Any, digits: int | None = None) -> Any:
    """Plain strict JSON: numpy scalars to Python, NaN/inf to None (unknown), floats rounded to
    ``digits`` when given. Every JSON output goes through it and ``json.dump(allow_nan=False)``."""
    if isinstance(value, dict):
        return {str(k): json_ready(v, digits) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [json_ready(v, digits) for v in value]
    if hasattr(value, "item") and not isinstance(value, str):
        value = value.item()
    if isinstance(value, float):
        if not math.isfinite(value):
            return None
        return round(value, digits) if digits is not None else value
    return value


def sort_findings(findings: list[Finding]) -> list[Finding]:
    """Most urgent first: severity, then score, then where and when (stable output)."""
    return sorted(
        findings,
        key=lambda f: (SEVERITY_ORDER[f.severity], -f.score, f.kind, f.hostname or "", f.gpu or -1, f.start),
    )
