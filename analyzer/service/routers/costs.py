"""GET /api/reports/cost: GPU cost and waste, from the latest results or the daily rollup store."""

from __future__ import annotations

from dataclasses import replace
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Depends, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, Response

from analyzer.findings import rfc3339
from analyzer.finops import outputs
from analyzer.service.cost_source import report_json
from analyzer.service.deps import (
    API_ERRORS,
    CostsDep,
    Current,
    Scope,
    ScopeDep,
    ServiceDep,
    answer,
    api_auth,
    current,
    reject_unknown,
)
from analyzer.service.fmt import fmt_seconds
from analyzer.service.models import CostOut, ErrorOut, GroupBy
from exporter.schema import WORKLOAD
from exporter.timeparse import parse_positive_duration

CostFormat = Literal["json", "csv", "html"]
#: A cost window: a whole number > 0 and a unit, e.g. 1d, 30d, 12h (at most 999 days / 99 weeks).
WINDOW_PATTERN = r"^([1-9][0-9]{0,4}s|[1-9][0-9]{0,3}m|[1-9][0-9]{0,2}h|[1-9][0-9]{0,2}d|[1-9][0-9]?w)$"

RESPONSES: dict[int | str, dict[str, Any]] = {
    **API_ERRORS,
    200: {"content": {"text/csv": {"schema": {"type": "string"}}, "text/html": {"schema": {"type": "string"}}},
          "description": "The cost report: JSON (CostOut), CSV or HTML"},
    400: {"model": ErrorOut, "description": "Not servable with this configuration (no prices; window beyond "
          "the analysis window without a rollup store)"},
}

router = APIRouter(tags=["api"])


@router.get("/api/reports/cost", response_model=CostOut, responses=RESPONSES,
            dependencies=[Depends(api_auth), Depends(reject_unknown("window", "group_by", "format"))])
def cost(
    service: ServiceDep,
    costs: CostsDep,
    scope: ScopeDep,
    window: Annotated[str | None, Query(max_length=12, pattern=WINDOW_PATTERN, description=(
        "How far back, e.g. 1d, 30d (default: the analysis window). Within the analysis window the latest "
        "results are used; beyond it the daily rollup store (--rollup-store)."))] = None,
    group_by: Annotated[GroupBy, Query(description="Group costs by")] = "namespace",
    format: Annotated[CostFormat, Query(description="json, csv or html")] = "json",
) -> Response:
    """GPU cost and waste of the fleet, grouped (prices from --prices)."""
    if not scope.admin and group_by not in ("namespace", WORKLOAD, "account"):
        raise scope.refuse(f"cost grouped by {group_by}")
    cur = current(service)
    try:
        seconds = parse_positive_duration(window) if window is not None else None
    except ValueError as exc:
        raise RequestValidationError([{"type": "value_error", "loc": ("query", "window"), "msg": str(exc),
                                       "input": window}]) from None
    loop = cur.analysis.end - cur.analysis.start
    if seconds is None or seconds <= loop + 1e-6:
        report = costs.latest(cur.analysis, group_by, seconds if seconds and seconds < loop else None)
        source = "latest"
    else:
        report, source = costs.rollup(seconds, group_by, cur.analysis.end), "rollup"
    if not scope.admin:
        report = _scoped(report, scope, cur)
    if format == "json":
        body = {**cur.meta(), "window": {"start": rfc3339(report.start), "end": rfc3339(report.end)},
                "source": source, "group_by": group_by, "requested_window": window or fmt_seconds(loop),
                "report": report_json(report)}
        return answer(CostOut, body, cur)
    if format == "csv":
        return Response(outputs.to_focus_csv(report), media_type="text/csv; charset=utf-8", headers=cur.headers())
    return HTMLResponse(outputs.render_html(report), headers=cur.headers())


def _scoped(report: Any, scope: Scope, cur: Current) -> Any:
    """The report of the groups ``scope`` sees (its namespaces or accounts, or their workloads), totals over those
    alone. A rollup's workloads are judged by the namespaces they ran in within the latest window."""
    from analyzer.finops.costs import summarize

    detail = report.detail
    if report.group_by == "namespace":
        keep = detail["group"].map(scope.sees)
    elif report.group_by == "account":
        keep = detail["group"].map(lambda a: scope.token is not None and scope.token.sees_account(a))
    else:
        visible = scope.jobs(cur.analysis.fleet) if cur.analysis.fleet is not None else set()
        keep = detail["group"].isin(visible or set())
    detail = detail[keep.to_numpy(bool)].reset_index(drop=True)
    groups, totals = summarize(detail)
    return replace(report, detail=detail, groups=groups, totals=totals,
                   tags={k: v for k, v in report.tags.items() if k in set(groups["group"])},
                   straggler_findings_gpu_hours=totals["straggler_gpu_hours"], notes=[])
