"""The API's response models: the OpenAPI schema clients code against."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from analyzer.findings import JSON_SCHEMA_VERSION, Severity
from analyzer.finops.costs import GROUP_BY

Level = Literal["gpu", "node", "workload", "namespace", "model", "fleet"]
GroupBy = Literal[GROUP_BY]  # the one list, analyzer.finops.costs.GROUP_BY


class Window(BaseModel):
    start: str = Field(description="Start of the analyzed window, RFC 3339 UTC (inclusive)")
    end: str = Field(description="End of the analyzed window, RFC 3339 UTC (exclusive)")


class ResultMeta(BaseModel):
    schema_version: int = Field(JSON_SCHEMA_VERSION, description="Version of these answers' schema (2: the "
                                "workload is ``workload``, not ``job``; fields added within a version, like "
                                "each finding's ``id``, are backward compatible)")
    as_of: str = Field(description="When the analysis these results come from finished, RFC 3339 UTC")
    stale: bool = Field(description="True when the latest analysis run failed (or the results are older than "
                        "the service's stale-after): these are the last good results")
    last_error: str | None = Field(None, description="Why the latest run failed, when it did")
    window: Window


class FindingOut(BaseModel):
    id: str = Field(description="Stable id of the problem: the same across the service's re-analyses while the "
                    "problem lasts and as it is confirmed, extended or closed (added within schema 2: an added "
                    "field is backward compatible)")
    kind: str
    severity: Severity
    summary: str
    start: str = Field(description="RFC 3339 UTC")
    end: str | None = Field(description="RFC 3339 UTC; null while the problem is still going on")
    score: float | None = Field(description="How bad, 0..1")
    hostname: str | None = None
    gpu: int | None = None
    uuid: str | None = None
    gpu_instance: str | None = None
    workload: str | None = None
    namespace: str | None = None
    pod: str | None = None
    rack: str | None = None
    confidence: Literal["high", "low"] | None = None
    evidence: dict[str, Any] = Field(default_factory=dict)


class FindingsOut(ResultMeta):
    total: int = Field(description="Findings matching the filters")
    count: int = Field(description="Findings in this answer (at most limit)")
    findings: list[FindingOut]


class ScoreRow(BaseModel):
    """One group of a level: its key columns (only those of the level are present) and its scores."""

    model_config = ConfigDict(protected_namespaces=())

    uuid: str | None = None
    gpu_instance: str | None = None
    hostname: str | None = None
    workload: str | None = None
    namespace: str | None = None
    model: str | None = None
    gpu_hours: float | None = None
    allocated_gpu_hours: float | None = None
    unallocated_gpu_hours: float | None = None
    reported_util: float | None = None
    effective_util: float | None = None
    effective_tensor: float | None = None
    masking_gap: float | None = None
    effective_gpu_hours: float | None = None
    allocated_effective_gpu_hours: float | None = None
    unused_gpu_hours: float | None = None
    waste_gpu_hours: float | None = Field(None, description="Recoverable waste (fleet, job and namespace levels)")
    normal_gpu_hours: float | None = Field(None, description="Normal headroom of healthy work: not waste")
    unclassified_gpu_hours: float | None = Field(None, description="Unused hours of workloads of no known class")
    idle_gpu_hours: float | None = None
    unknown_gpu_hours: float | None = None
    low_confidence_share: float | None = None


class ScoresOut(ResultMeta):
    level: Level
    allocated_only: bool
    count: int
    rows: list[ScoreRow]
    notes: list[str] = Field(description="Why a score is weaker than it could be")


class CostReportOut(BaseModel):
    """analyzer.finops.outputs.to_json: totals and groups carry the cost identity's GPU-hours and dollars."""

    model_config = ConfigDict(extra="allow")

    group_by: str
    start: str
    end: str
    currency: str
    cluster: str | None = None
    catalog_source: str | None = None
    totals: dict[str, float | None]
    groups: list[dict[str, Any]]
    unpriced_models: dict[str, float | None] = Field(default_factory=dict)
    notes: list[str] = Field(default_factory=list)
    detail: list[dict[str, Any]] = Field(default_factory=list, description="Per (day, group, model)")


class CostOut(ResultMeta):
    """A cost report (analyzer.finops) as JSON; ``source`` says where its numbers come from."""

    source: Literal["latest", "rollup"] = Field(description="latest: the loop's last results; rollup: the "
                                                "daily rollup store")
    group_by: GroupBy
    requested_window: str
    report: CostReportOut


class JobReportOut(BaseModel):
    """analyzer.report.job.to_json: one job's scores, GPU-hour parts, per-GPU rows, timeline, findings, advice."""

    model_config = ConfigDict(extra="allow")

    workload: str
    namespaces: list[str]
    running: bool
    gpus: int
    scores: dict[str, float | None]
    parts: dict[str, float | None]
    advice: list[dict[str, Any]]
    per_gpu: list[dict[str, Any]]
    findings: list[dict[str, Any]]


class JobOut(ResultMeta):
    job: JobReportOut


class JobsOut(ResultMeta):
    below: float | None = Field(description="Only jobs under this effective utilization (null: every job)")
    finished_only: bool
    count: int
    jobs: list[dict[str, Any]] = Field(description="analyzer.report.job_list.LIST_COLUMNS per job, lowest "
                                       "effective utilization first; times RFC 3339 UTC")


class ErrorOut(BaseModel):
    detail: str


class UnavailableOut(BaseModel):
    detail: str
    last_error: str | None = None
    retry_after_seconds: float


class ValidationErrorOut(BaseModel):
    message: str = Field(description="All problems in one line")
    detail: list[dict[str, Any]]
