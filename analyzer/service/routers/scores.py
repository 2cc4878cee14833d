"""GET /api/scores: time-weighted effective-utilization scores of the latest window at one level."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Depends, Query
from fastapi.responses import JSONResponse

from analyzer.analysis.scores import AGG_COLUMNS, LEVELS
from analyzer.data.signals import ALLOCATION_COLUMN_OF, ALLOCATION_LABELS
from analyzer.service.deps import (
    API_ERRORS,
    ScopeDep,
    ServiceDep,
    answer,
    api_auth,
    current,
    need_scores,
    reject_unknown,
)
from analyzer.service.fmt import number, text
from analyzer.service.models import Level, ScoresOut

router = APIRouter(tags=["api"])


#: The partition's columns the scores endpoint adds at the fleet, job and namespace levels.
SPLIT_COLUMNS = ("waste_gpu_hours", "normal_gpu_hours", "unclassified_gpu_hours")


def _split(partition: Any, level: str) -> dict[str | None, dict[str, float | None]]:
    """key (None for the fleet) -> the partition's waste/normal/unclassified hours of that group."""
    if partition is None:
        return {}
    if level == "fleet":
        return {None: {c: number(partition.fleet[c]) for c in SPLIT_COLUMNS}}
    table = getattr(partition, level, None) if level in ("job", "namespace") else None
    if table is None or table.empty:
        return {}
    return {str(k): {c: number(v) for c, v in rec.items()} for k, rec in table[list(SPLIT_COLUMNS)].iterrows()}


@router.get("/api/scores", response_model=ScoresOut, responses=API_ERRORS, response_model_exclude_unset=True,
            dependencies=[Depends(api_auth), Depends(reject_unknown("level", "allocated_only"))])
def scores(
    service: ServiceDep,
    scope: ScopeDep,
    level: Annotated[Level, Query(description="Aggregation level")] = "fleet",
    allocated_only: Annotated[bool, Query(description="Only allocated GPU-hours (groups that held a job)")] = False,
) -> JSONResponse:
    """Time-weighted effective-utilization scores of the latest window at one level."""
    if not scope.admin and level not in ("workload", "namespace"):
        raise scope.refuse(f"scores at level {level!r}")
    cur = current(service)
    fleet, sc = need_scores(cur)
    visible = scope.jobs(fleet)
    scores_level = ALLOCATION_COLUMN_OF.get(level, level)
    table = (sc.allocated if allocated_only else sc.levels).get(scores_level)
    rows: list[dict[str, Any]] = []
    split = _split(sc.partition, scores_level)
    if table is not None:
        keys = list(LEVELS[scores_level])
        for rec in table.to_dict("records"):
            if not (scope.admin or (scope.sees(text(rec.get("namespace"))) if level == "namespace"
                                    else text(rec.get("job")) in visible)):
                continue
            row: dict[str, Any] = {ALLOCATION_LABELS.get(k, k): text(rec.get(k)) for k in keys}
            row.update({c: number(rec.get(c)) for c in AGG_COLUMNS})
            row.update(split.get(text(rec.get(keys[0])) if keys else None, {}))
            rows.append(row)
    body = {**cur.meta(), "level": level, "allocated_only": allocated_only, "count": len(rows), "rows": rows,
            "notes": list(sc.notes)}
    return answer(ScoresOut, body, cur)
