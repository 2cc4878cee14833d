"""GET /api/findings: the latest analysis' findings, filtered in memory (nothing reaches PromQL).

No ``from __future__ import annotations``: the ``kind`` enum is built per app from the detector
registry, and FastAPI must see the Literal object itself, not a name to resolve.
"""

from collections.abc import Sequence
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse

from analyzer.findings import Finding, Severity, sort_findings
from analyzer.service.deps import (
    API_ERRORS,
    TEXT_MAX,
    TEXT_PATTERN,
    ScopeDep,
    ServiceDep,
    answer,
    api_auth,
    current,
    reject_unknown,
)
from analyzer.service.fmt import integer, label_value, number, text
from analyzer.service.models import FindingsOut
from exporter.schema import WORKLOAD

MAX_FINDINGS = 10_000


def finding_out(f: Finding) -> dict[str, Any]:
    out = f.to_json()
    for key in ("hostname", "uuid", "gpu_instance", WORKLOAD, "namespace", "pod", "rack"):
        out[key] = text(out[key])
    out["gpu"] = integer(out["gpu"])
    out["score"] = number(out["score"])
    out["evidence"] = jsonable_encoder(out["evidence"] or {}, custom_encoder={float: number})
    return out


def router(kinds: Sequence[str]) -> APIRouter:
    """The findings route; ``kinds`` (the detector registry's) is the ``kind`` parameter's enum."""
    Kind = Literal[tuple(kinds)]  # type: ignore[valid-type]
    r = APIRouter(tags=["api"])

    @r.get("/api/findings", response_model=FindingsOut, responses=API_ERRORS,
           dependencies=[Depends(api_auth),
                         Depends(reject_unknown("kind", "severity", "hostname", WORKLOAD, "namespace", "open_only",
                                                "limit"))])
    def findings(
        service: ServiceDep,
        scope: ScopeDep,
        kind: Annotated[Kind | None, Query(description="Only this finding kind")] = None,
        severity: Annotated[Severity | None, Query(description="Only this severity")] = None,
        hostname: Annotated[str | None, Query(min_length=1, max_length=TEXT_MAX, pattern=TEXT_PATTERN)] = None,
        workload: Annotated[str | None, Query(min_length=1, max_length=TEXT_MAX, pattern=TEXT_PATTERN)] = None,
        namespace: Annotated[str | None, Query(min_length=1, max_length=TEXT_MAX, pattern=TEXT_PATTERN)] = None,
        open_only: Annotated[bool, Query(description="Only findings still going on at the end of the window")] = False,
        limit: Annotated[int, Query(ge=1, le=MAX_FINDINGS, description="At most this many, most urgent first")] = 1000,
    ) -> JSONResponse:
        """The latest analysis' findings, most urgent first (severity, then score)."""
        cur = current(service)
        visible = scope.jobs(cur.analysis.fleet) if cur.analysis.fleet is not None else set()  # None: all
        wanted = {"hostname": hostname, "job": workload, "namespace": namespace}  # Finding.job is the workload
        chosen = [
            f for f in cur.analysis.findings
            if (kind is None or f.kind == kind) and (severity is None or f.severity == severity)
            and (not open_only or f.end is None) and (visible is None or scope.sees(f.namespace) or f.job in visible)
            and all(v is None or label_value(getattr(f, k)) == v for k, v in wanted.items())
        ]
        ordered = sort_findings(chosen)
        body = {**cur.meta(), "total": len(ordered), "count": min(limit, len(ordered)),
                "findings": [finding_out(f) for f in ordered[:limit]]}
        return answer(FindingsOut, body, cur)

    return r
