"""GET /api/jobs and /api/jobs/{name}: the jobs of the latest window and one job's report (``truegpu job``)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated

from fastapi import APIRouter, Depends, HTTPException, Path, Query
from fastapi.responses import Response

from analyzer.findings import json_ready, rfc3339
from analyzer.service.cost_source import CostSource
from analyzer.service.deps import (
    API_ERRORS,
    TEXT_MAX,
    CostsDep,
    Current,
    Scope,
    ScopeDep,
    ServiceDep,
    answer,
    api_auth,
    current,
    need_scores,
    reject_unknown,
)
from analyzer.service.errors import CostError
from analyzer.service.models import ErrorOut, JobOut, JobsOut
from exporter.schema import WORKLOAD

if TYPE_CHECKING:
    from analyzer.report.job import JobReport
    from analyzer.service.loop import AnalyzerService

router = APIRouter(tags=["api"])


@router.get("/api/jobs", response_model=JobsOut, responses=API_ERRORS,
            dependencies=[Depends(api_auth), Depends(reject_unknown("below", "finished"))])
def jobs(
    service: ServiceDep,
    scope: ScopeDep,
    below: Annotated[float | None, Query(gt=0, le=1, description="Only jobs under this effective utilization")]
    = None,
    finished: Annotated[bool, Query(description="Only jobs that ended within the window")] = False,
) -> Response:
    """The latest window's jobs, lowest effective utilization first (unknown never counts as below)."""
    from analyzer.report.job_list import job_list

    cur = current(service)
    fleet, scores = need_scores(cur)
    table = job_list(fleet, scores, below, finished)
    visible = scope.jobs(fleet)
    if visible is not None:
        table = table[table["job"].isin(visible)]
    rows = [{**r, "first_seen": rfc3339(r["first_seen"]), "last_seen": rfc3339(r["last_seen"])}
            for r in table.to_dict("records")]
    body = {**cur.meta(), "below": below, "finished_only": finished, "count": len(rows), "jobs": json_ready(rows)}
    return answer(JobsOut, body, cur)


@router.get("/api/jobs/{name}", response_model=JobOut,
            responses={**API_ERRORS, 404: {"model": ErrorOut, "description": "No such workload, Slurm job or pod"}},
            dependencies=[Depends(api_auth), Depends(reject_unknown())])
def job(
    service: ServiceDep,
    costs: CostsDep,
    scope: ScopeDep,
    name: Annotated[str, Path(max_length=TEXT_MAX, description="Workload name, Slurm job id or pod name")],
) -> Response:
    """One job's report over the latest window: what its GPUs really did and what to change (its page for a
    browser: ``/jobs/{name}``)."""
    from analyzer.report.job import to_json

    cur, report = job_of(service, costs, name, scope)
    return answer(JobOut, {**cur.meta(), "job": to_json(report)}, cur)


def job_of(service: AnalyzerService, costs: CostSource, name: str, scope: Scope) -> tuple[Current, JobReport]:
    """The latest analysis and the report of the job ``name`` names (404 when none, or not in ``scope``: a
    scoped token learns nothing of other namespaces' jobs, not even that they exist)."""
    from analyzer.report import job as J

    cur = current(service)
    fleet, scores = need_scores(cur)
    visible = scope.jobs(fleet)
    try:
        cost = costs.latest(cur.analysis, WORKLOAD)
    except CostError:  # no prices configured: the cost is unknown, the rest is not
        cost = None
    hidden = f"no workload, Slurm job or pod named {name!r} in the namespaces this token sees"
    try:
        job = J.resolve(fleet, name)
    except LookupError as exc:  # its message lists the window's workloads: not for a scoped token
        raise HTTPException(404, str(exc).strip("'\"") if visible is None else hidden) from None
    if visible is not None and job not in visible:
        raise HTTPException(404, hidden)
    return cur, J.job_report(fleet, scores, list(cur.analysis.findings), job, cost)
