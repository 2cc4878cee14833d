"""The findings contract: one record per continuous problem, the analyzer's main output.

A finding names what is wrong (``kind``), how bad (``severity``, ``score``), where
(hostname/gpu/uuid, and job/namespace/pod when the device was allocated; rack for
cooling problems), when (``start``; ``end`` is None while the problem is still going on at
the end of the data), why (``evidence``: the numbers that justify it) and what to do
(``summary``: one sentence a person can act on).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from analyzer.data.signals import ALLOCATION_LABELS

#: Version of the JSON truegpu writes (analyze --json, the API): 2 names the workload ``workload``
#: (``job`` in 1) in findings, filters, levels and cost groups.
JSON_SCHEMA_VERSION = 2

Severity = Literal["critical", "warning", "info"]
SEVERITY_ORDER: dict[str, int] = {"critical": 0, "warning": 1, "info": 2}

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

    def to_json(self) -> dict[str, Any]:
        """JSON-ready dict: RFC 3339 UTC times, ``gpu`` an integer or null, finite numbers only. The
        workload is ``workload`` (the attribute is ``job``), as on every label and API field."""
        out = {ALLOCATION_LABELS.get(k, k): v for k, v in asdict(self).items()}
        out["start"] = rfc3339(self.start)
        out["end"] = None if self.end is None else rfc3339(self.end)
        out["evidence"] = json_ready(self.evidence, digits=4)
        out["score"] = json_ready(float(self.score), digits=4)
        return out


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
