"""The HTTP API of `truegpu serve`: findings, scores, cost reports, the overview page, auth.

Every answer is computed from ONE snapshot of the analysis loop (analyzer/service.py), so a
response never mixes two runs. Filters are applied in memory to the last good results:
nothing a client sends reaches PromQL.

* ``/api/findings``, ``/api/scores``, ``/api/reports/cost`` and ``/`` (the overview, which shows
  cost) need ``Authorization: Bearer TOKEN`` (``/`` also takes HTTP Basic with the token as the
  password, so a browser can log in). Tokens are compared in constant time; a missing or bad
  token answers 401 with ``WWW-Authenticate``. With no token configured and no explicit
  ``no_auth`` the API is disabled (403), never open. ``/metrics`` and ``/healthz`` are open
  unless ``protect_metrics`` / ``protect_healthz``.
* Before the first good analysis the API answers 503 (JSON, ``Retry-After``). After a failed
  run (Prometheus down or slow) it keeps serving the last good results marked
  ``"stale": true`` with ``as_of``, and the ``X-Truegpu-Stale`` / ``X-Truegpu-As-Of`` headers.
* Bad parameters answer 422 with FastAPI's ``detail`` list plus one readable ``message``;
  unknown query parameters are rejected too (a typo must not silently widen a filter).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import logging
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Annotated, Any, Literal

import swagger_ui_bundle
from fastapi import Depends, FastAPI, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from fastapi.staticfiles import StaticFiles
from pydantic import BaseModel, ConfigDict, Field

from analyzer.findings import JSON_SCHEMA_VERSION, KINDS, Finding, rfc3339, sort_findings
from analyzer.finops.costs import GROUP_BY
from analyzer.signals import ALLOCATION_COLUMN_OF, ALLOCATION_LABELS
from exporter.schema import WORKLOAD

if TYPE_CHECKING:
    from analyzer.service import Analysis, AnalyzerService, Snapshot

log = logging.getLogger(__name__)

Level = Literal["gpu", "node", "workload", "namespace", "model", "fleet"]
GroupBy = Literal[GROUP_BY]  # the one list, analyzer.finops.costs.GROUP_BY
Severity = Literal["critical", "warning", "info"]
CostFormat = Literal["json", "csv", "html"]
Kind = Literal[KINDS]  # type: ignore[valid-type]

#: Free-text filter values (host, job, namespace names): printable, bounded.
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]+$"
TEXT_MAX = 253
#: A cost window: a whole number > 0 and a unit, e.g. 1d, 30d, 12h (at most 999 days / 99 weeks).
WINDOW_PATTERN = r"^([1-9][0-9]{0,4}s|[1-9][0-9]{0,3}m|[1-9][0-9]{0,2}h|[1-9][0-9]{0,2}d|[1-9][0-9]?w)$"
MAX_FINDINGS = 10_000
STALE_HEADER, AS_OF_HEADER = "X-Truegpu-Stale", "X-Truegpu-As-Of"
REALM = "truegpu"
#: Declares the bearer scheme in the OpenAPI spec; Auth does the checking.
BEARER = HTTPBearer(auto_error=False, description="the token of --api-token-file")


@dataclass(frozen=True)
class ApiSettings:
    """How the API authenticates and where cost data comes from.

    ``token`` None and ``no_auth`` False: the API (and the overview) answer 403, disabled.
    ``catalog`` is a finops price catalog (None: cost reports answer 400, "no --prices");
    ``store`` the URL or path of the finops rollup store, read for cost windows longer than the loop's window.
    """

    token: str | None = None
    no_auth: bool = False
    protect_metrics: bool = False
    protect_healthz: bool = False
    catalog: Any = None
    team_map: Mapping[str, str] | None = None
    store: Any = None

    def __post_init__(self) -> None:
        if self.token is not None and not self.token:
            raise ValueError("the API token is empty")
        if self.no_auth and self.token is not None:
            raise ValueError("--no-auth and --api-token-file exclude each other")
        if (self.protect_metrics or self.protect_healthz) and self.token is None:
            raise ValueError("--protect-metrics/--protect-healthz need --api-token-file")

    @property
    def api_enabled(self) -> bool:
        return self.no_auth or self.token is not None


# ---------------------------------------------------------------- response models


class Window(BaseModel):
    start: str = Field(description="Start of the analyzed window, RFC 3339 UTC (inclusive)")
    end: str = Field(description="End of the analyzed window, RFC 3339 UTC (exclusive)")


class ResultMeta(BaseModel):
    schema_version: int = Field(JSON_SCHEMA_VERSION, description="Version of these answers' schema (2: the "
                                "workload is ``workload``, not ``job``)")
    as_of: str = Field(description="When the analysis these results come from finished, RFC 3339 UTC")
    stale: bool = Field(description="True when the latest analysis run failed (or the results are older than "
                        "the service's stale-after): these are the last good results")
    last_error: str | None = Field(None, description="Why the latest run failed, when it did")
    window: Window


class FindingOut(BaseModel):
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


class ErrorOut(BaseModel):
    detail: str


class UnavailableOut(BaseModel):
    detail: str
    last_error: str | None = None
    retry_after_seconds: float


class ValidationErrorOut(BaseModel):
    message: str = Field(description="All problems in one line")
    detail: list[dict[str, Any]]


# ---------------------------------------------------------------- helpers


def _text(value: Any) -> str | None:
    """A label-like field as str, None for None/NaN."""
    if value is None:
        return None
    if isinstance(value, float) and math.isnan(value):
        return None
    if hasattr(value, "dtype") or isinstance(value, float):
        from analyzer.service import label_value

        return label_value(value) or None
    return str(value)


def _int(value: Any) -> int | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return int(f) if math.isfinite(f) else None


def _num(value: Any) -> float | None:
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def finding_out(f: Finding) -> dict[str, Any]:
    out = f.to_json()
    for key in ("hostname", "uuid", "gpu_instance", WORKLOAD, "namespace", "pod", "rack"):
        out[key] = _text(out[key])
    out["gpu"] = _int(out["gpu"])
    out["score"] = _num(out["score"])
    out["evidence"] = jsonable_encoder(out["evidence"] or {}, custom_encoder={float: _num})
    return out


class NoResults(Exception):
    """No good analysis yet: the API answers 503."""

    def __init__(self, detail: str, last_error: str | None, retry_after: float) -> None:
        super().__init__(detail)
        self.detail, self.last_error, self.retry_after = detail, last_error, retry_after


@dataclass(frozen=True)
class Current:
    """One snapshot as the API serves it."""

    analysis: Analysis
    stale: bool
    last_error: str | None

    def meta(self) -> dict[str, Any]:
        a = self.analysis
        return {"as_of": rfc3339(a.finished), "stale": self.stale, "last_error": self.last_error,
                "window": {"start": rfc3339(a.start), "end": rfc3339(a.end)}}

    def headers(self) -> dict[str, str]:
        h = {STALE_HEADER: "true" if self.stale else "false", AS_OF_HEADER: rfc3339(self.analysis.finished)}
        if self.stale:
            h["Warning"] = '110 truegpu "Response is Stale"'
        return h


def current(service: AnalyzerService, snap: Snapshot | None = None) -> Current:
    """The latest good results and whether they are stale; NoResults before the first."""
    snap = snap or service.snapshot()
    h = snap.health
    if snap.analysis is None:
        why = f"the last run failed: {h.last_error}" if h.last_error else "the first run has not finished"
        raise NoResults(f"no analysis results yet ({why}); retry in {service.interval:g}s", h.last_error,
                        service.interval)
    stale = h.last_error is not None or h.stale(service.clock(), service.stale_after)
    return Current(snap.analysis, stale, h.last_error)


def _need_scores(cur: Current) -> tuple[Any, Any]:
    a = cur.analysis
    if a.fleet is None or a.scores is None:
        raise NoResults("the latest results hold no scores", None, 0.0)
    return a.fleet, a.scores


def validation_message(errors: list[dict[str, Any]]) -> str:
    parts = []
    for e in errors:
        loc = ".".join(str(x) for x in e.get("loc", ()) if x not in ("query", "path", "header"))
        value = e.get("input")
        shown = f" (got {value!r})" if isinstance(value, str | int | float) and value != "" else ""
        parts.append(f"{loc or 'request'}: {e.get('msg', 'invalid')}{shown}")
    return "invalid request: " + "; ".join(parts)


def _reject_unknown(*known: str) -> Callable[[Request], None]:
    allowed = frozenset(known)

    def check(request: Request) -> None:
        extra = sorted(set(request.query_params.keys()) - allowed)
        if extra:
            raise RequestValidationError([
                {"type": "extra_forbidden", "loc": ("query", name),
                 "msg": f"unknown query parameter; known: {', '.join(sorted(allowed)) or 'none'}",
                 "input": request.query_params.get(name)}
                for name in extra
            ])

    return check


def _digest(text: str) -> bytes:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()


class Auth:
    """Bearer (and, for the HTML page, Basic) token check; constant time over the token's hash."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self._want = _digest(settings.token) if settings.token is not None else None

    def matches(self, supplied: str | None) -> bool:
        if self._want is None or supplied is None:
            return False
        return hmac.compare_digest(_digest(supplied), self._want)

    def require(self, request: Request, *, basic: bool = False, open_unless: bool = False) -> None:
        """Raise 401/403 unless the request may pass. ``open_unless``: endpoints open by default."""
        if self.settings.no_auth:
            return
        if self._want is None:
            raise HTTPException(403, "the API is disabled: start truegpu serve with --api-token-file FILE "
                                "(or --no-auth to serve it without authentication)")
        scheme, _, cred = request.headers.get("authorization", "").partition(" ")
        supplied = None
        if scheme.lower() == "bearer":
            supplied = cred.strip()
        elif basic and scheme.lower() == "basic":
            try:
                supplied = base64.b64decode(cred.strip(), validate=True).decode("utf-8").partition(":")[2]
            except (binascii.Error, UnicodeDecodeError):
                supplied = None
        if self.matches(supplied):
            return
        challenge = f'Basic realm="{REALM}", charset="UTF-8"' if basic else f'Bearer realm="{REALM}"'
        if scheme:
            detail = "invalid token"
            if not basic:
                challenge += ', error="invalid_token"'
        else:
            detail = "missing token: send Authorization: Bearer TOKEN"
        raise HTTPException(401, detail, headers={"WWW-Authenticate": challenge})


# ---------------------------------------------------------------- cost


class CostError(Exception):
    """A cost request that cannot be served with this configuration (400)."""


class CostSource:
    """Cost reports over the latest results (cached per analysis) or the rollup store."""

    def __init__(self, service: AnalyzerService, settings: ApiSettings) -> None:
        self.service, self.settings = service, settings
        self._lock = threading.Lock()
        self._cache: dict[tuple[int, str, float], tuple[Analysis, Any]] = {}

    def latest(self, analysis: Analysis, group_by: str, seconds: float | None = None) -> Any:
        """CostReport of the latest results, the last ``seconds`` of them when shorter than the loop's window."""
        if self.settings.catalog is None:
            raise CostError("no prices configured: start truegpu serve with --prices FILE")
        key = (id(analysis), group_by, seconds or 0.0)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] is analysis:
                return hit[1]
        from analyzer.finops import cost_report

        a = _last(analysis, seconds) if seconds else analysis
        if a.fleet is None or a.scores is None:
            raise NoResults("the latest results hold no scores", None, 0.0)
        report = cost_report(a.fleet, a.scores, list(a.findings), self.settings.catalog, group_by=group_by,
                             team_map=dict(self.settings.team_map) if self.settings.team_map else None,
                             site=self.service.site)
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if v[0] is analysis}  # drop older analyses
            self._cache[key] = (analysis, report)
        return report

    def rollup(self, seconds: float, group_by: str, end: float) -> Any:
        """A CostReport from the rollup store over the UTC days covering [end - seconds, end)."""
        if self.settings.store is None:
            raise CostError(
                f"window {_fmt_seconds(seconds)} is longer than the analysis window "
                f"({_fmt_seconds(self.service.window)}) and no rollup store is configured: start truegpu serve "
                "with --rollup-store URL_OR_PATH, or ask for a window of at most "
                f"{_fmt_seconds(self.service.window)}")
        from datetime import UTC, datetime, timedelta

        end_day = datetime.fromtimestamp(end, UTC).date()
        days = max(1, math.ceil(seconds / 86400.0))
        start_day = end_day - timedelta(days=days - 1)
        from analyzer.finops.store import open_store

        try:  # one connection per request: SQLite connections belong to their thread
            with open_store(self.settings.store) as store:
                rows = store.read(start_day, end_day, group_by, per_day=True)
        except Exception as exc:
            log.error("rollup store %s: %s", self.settings.store, exc)
            raise HTTPException(503, f"the rollup store failed: {type(exc).__name__}: {exc}") from None
        return rollup_report(rows, group_by, start_day, end_day, self.settings.catalog, until=end)


def rollup_report(rows: Any, group_by: str, start_day: Any, end_day: Any, catalog: Any,
                  until: float | None = None) -> Any:
    """A CostReport over stored daily rollups (per day, group and model).

    SKU and list unit price are today's catalog entry for each stored model (rows written before
    the store kept models have model "" and none); the dollars are those stored when the day was written.

    ``until`` ends the report before the end of ``end_day`` (today's rollup covers up to now, not
    up to midnight: a charge period never ends in the future)."""
    from datetime import UTC, datetime, time, timedelta

    import numpy as np

    from analyzer.finops.costs import DETAIL_COLUMNS, ROLLUP_COST_COLUMNS, ROLLUP_HOUR_COLUMNS, CostReport, summarize

    detail = rows.rename(columns={"key": "group"}).copy()
    for c in (*ROLLUP_HOUR_COLUMNS, *ROLLUP_COST_COLUMNS):
        detail[c] = detail[c].astype(float).fillna(0.0) if c in detail.columns else 0.0
    detail["model"] = detail["model"].fillna("").astype(str) if "model" in detail.columns else ""
    entries = {m: catalog.lookup(m) if catalog is not None and m else None for m in set(detail["model"])}
    detail["sku"] = [getattr(entries[m], "key", None) for m in detail["model"]]
    detail["unit_price"] = np.array([getattr(entries[m], "price_per_gpu_hour", np.nan) for m in detail["model"]],
                                    dtype=np.float64)
    detail = detail[list(DETAIL_COLUMNS)].reset_index(drop=True)
    groups, totals = summarize(detail)
    start = datetime.combine(start_day, time(), UTC).timestamp()
    end = datetime.combine(end_day + timedelta(days=1), time(), UTC).timestamp()
    if until is not None:
        end = max(start, min(end, float(until)))
    days = sorted(set(detail["day"]))
    notes = [f"from the daily rollup store: {len(days)} of {math.ceil((end - start) / 86400 - 1e-9)} day(s) have data"]
    return CostReport(group_by=group_by, start=start, end=end, step=86400.0,
                      currency=getattr(catalog, "currency", ""), cluster=getattr(catalog, "cluster", None),
                      detail=detail, groups=groups, totals=totals, catalog_source="rollup store", notes=notes)


#: The partition's columns the scores endpoint adds at the fleet, job and namespace levels.
SPLIT_COLUMNS = ("waste_gpu_hours", "normal_gpu_hours", "unclassified_gpu_hours")


def _split(partition: Any, level: str) -> dict[str | None, dict[str, float | None]]:
    """key (None for the fleet) -> the partition's waste/normal/unclassified hours of that group."""
    if partition is None:
        return {}
    if level == "fleet":
        return {None: {c: _num(partition.fleet[c]) for c in SPLIT_COLUMNS}}
    table = getattr(partition, level, None) if level in ("job", "namespace") else None
    if table is None or table.empty:
        return {}
    return {str(k): {c: _num(v) for c, v in rec.items()} for k, rec in table[list(SPLIT_COLUMNS)].iterrows()}


def _last(analysis: Analysis, seconds: float) -> Analysis:
    """The analysis restricted to its last ``seconds`` (scores recomputed; findings that overlap)."""
    from analyzer.scores import compute_scores

    fleet = analysis.fleet
    if fleet is None:
        return analysis
    start = max(float(fleet.start), float(fleet.end) - seconds)
    frame = fleet.frame[fleet.frame["timestamp"] >= start] if "timestamp" in fleet.frame.columns else fleet.frame
    sliced = replace(fleet, frame=frame.reset_index(drop=True), start=start)
    scores = compute_scores(sliced)
    findings = tuple(f for f in analysis.findings if f.end is None or f.end > start)
    return replace(analysis, start=start, fleet=sliced, scores=scores, findings=findings)


def _fmt_seconds(seconds: float) -> str:
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def _report_json(report: Any) -> dict[str, Any]:
    """A CostReport as a JSON-ready dict via the finops json output."""
    from analyzer.finops import outputs

    data = outputs.to_json(report)
    if isinstance(data, str | bytes):
        import json

        data = json.loads(data)
    return jsonable_encoder(data, custom_encoder={float: _num})


# ---------------------------------------------------------------- app
#: Where /docs loads Swagger UI's script and style from (the swagger-ui-bundle package).
DOCS_ASSETS = "/docs/assets"



def create_app(service: AnalyzerService, settings: ApiSettings | None = None) -> FastAPI:
    """The service's HTTP app: /api/*, /, /metrics, /healthz, /docs, /openapi.json."""
    from prometheus_client.exposition import choose_encoder

    from analyzer.service_metrics import build_registry
    from exporter import __version__

    settings = settings or ApiSettings()
    auth = Auth(settings)
    costs = CostSource(service, settings)
    registry = build_registry(service.snapshot, settings.catalog)
    app = FastAPI(
        title="truegpu analyzer", version=__version__,
        description="Findings, effective-utilization scores and cost reports of the GPU fleet, from the "
        "analysis loop's latest results. /api/* needs `Authorization: Bearer TOKEN`.",
        docs_url=None, redoc_url=None,
    )
    # Swagger UI from a Python package, not a CDN: /docs works on an air-gapped cluster.
    app.mount(DOCS_ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")
    app.state.service, app.state.registry, app.state.settings = service, registry, settings
    def api_auth(request: Request, _cred: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> None:
        auth.require(request)

    api_errors: dict[int | str, dict[str, Any]] = {
        401: {"model": ErrorOut, "description": "Missing or invalid token"},
        403: {"model": ErrorOut, "description": "The API is disabled (no token configured)"},
        422: {"model": ValidationErrorOut, "description": "Invalid parameters"},
        503: {"model": UnavailableOut, "description": "No analysis results yet"},
    }

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k != "url"} for e in exc.errors()]
        return JSONResponse(status_code=422, content=jsonable_encoder(
            {"message": validation_message(errors), "detail": errors}))

    @app.exception_handler(NoResults)
    async def unavailable(request: Request, exc: NoResults) -> JSONResponse:
        return JSONResponse(status_code=503, headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))},
                            content={"detail": exc.detail, "last_error": exc.last_error,
                                     "retry_after_seconds": exc.retry_after})

    @app.exception_handler(CostError)
    async def cost_error(request: Request, exc: CostError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    def answer(model: type[BaseModel], body: dict[str, Any], cur: Current) -> JSONResponse:
        content = model.model_validate(body).model_dump(mode="json", exclude_unset=model is ScoresOut)
        return JSONResponse(content, headers=cur.headers())

    @app.get("/api/findings", response_model=FindingsOut, responses=api_errors, tags=["api"],
             dependencies=[Depends(api_auth),
                           Depends(_reject_unknown("kind", "severity", "hostname", WORKLOAD, "namespace", "open_only",
                                                   "limit"))])
    def findings(
        kind: Annotated[Kind | None, Query(description="Only this finding kind")] = None,
        severity: Annotated[Severity | None, Query(description="Only this severity")] = None,
        hostname: Annotated[str | None, Query(min_length=1, max_length=TEXT_MAX, pattern=TEXT_PATTERN)] = None,
        workload: Annotated[str | None, Query(min_length=1, max_length=TEXT_MAX, pattern=TEXT_PATTERN)] = None,
        namespace: Annotated[str | None, Query(min_length=1, max_length=TEXT_MAX, pattern=TEXT_PATTERN)] = None,
        open_only: Annotated[bool, Query(description="Only findings still going on at the end of the window")] = False,
        limit: Annotated[int, Query(ge=1, le=MAX_FINDINGS, description="At most this many, most urgent first")] = 1000,
    ) -> JSONResponse:
        """The latest analysis' findings, most urgent first (severity, then score)."""
        from analyzer.service import label_value

        cur = current(service)
        wanted = {"hostname": hostname, "job": workload, "namespace": namespace}  # Finding.job is the workload
        chosen = [
            f for f in cur.analysis.findings
            if (kind is None or f.kind == kind) and (severity is None or f.severity == severity)
            and (not open_only or f.end is None)
            and all(v is None or label_value(getattr(f, k)) == v for k, v in wanted.items())
        ]
        ordered = sort_findings(chosen)
        body = {**cur.meta(), "total": len(ordered), "count": min(limit, len(ordered)),
                "findings": [finding_out(f) for f in ordered[:limit]]}
        return answer(FindingsOut, body, cur)

    @app.get("/api/scores", response_model=ScoresOut, responses=api_errors, tags=["api"],
             response_model_exclude_unset=True,
             dependencies=[Depends(api_auth), Depends(_reject_unknown("level", "allocated_only"))])
    def scores(
        level: Annotated[Level, Query(description="Aggregation level")] = "fleet",
        allocated_only: Annotated[bool, Query(description="Only allocated GPU-hours (groups that held a job)")] = False,
    ) -> JSONResponse:
        """Time-weighted effective-utilization scores of the latest window at one level."""
        from analyzer.scores import AGG_COLUMNS, LEVELS

        cur = current(service)
        _, sc = _need_scores(cur)
        scores_level = ALLOCATION_COLUMN_OF.get(level, level)
        table = (sc.allocated if allocated_only else sc.levels).get(scores_level)
        rows: list[dict[str, Any]] = []
        split = _split(sc.partition, scores_level)
        if table is not None:
            keys = list(LEVELS[scores_level])
            for rec in table.to_dict("records"):
                row: dict[str, Any] = {ALLOCATION_LABELS.get(k, k): _text(rec.get(k)) for k in keys}
                row.update({c: _num(rec.get(c)) for c in AGG_COLUMNS})
                row.update(split.get(_text(rec.get(keys[0])) if keys else None, {}))
                rows.append(row)
        body = {**cur.meta(), "level": level, "allocated_only": allocated_only, "count": len(rows), "rows": rows,
                "notes": list(sc.notes)}
        return answer(ScoresOut, body, cur)

    cost_responses: dict[int | str, dict[str, Any]] = {
        **api_errors,
        200: {"content": {"text/csv": {"schema": {"type": "string"}}, "text/html": {"schema": {"type": "string"}}},
              "description": "The cost report: JSON (CostOut), CSV or HTML"},
        400: {"model": ErrorOut, "description": "Not servable with this configuration (no prices; window beyond "
              "the analysis window without a rollup store)"},
    }

    @app.get("/api/reports/cost", response_model=CostOut, responses=cost_responses, tags=["api"],
             dependencies=[Depends(api_auth), Depends(_reject_unknown("window", "group_by", "format"))])
    def cost(
        window: Annotated[str | None, Query(max_length=12, pattern=WINDOW_PATTERN, description=(
            "How far back, e.g. 1d, 30d (default: the analysis window). Within the analysis window the latest "
            "results are used; beyond it the daily rollup store (--rollup-store)."))] = None,
        group_by: Annotated[GroupBy, Query(description="Group costs by")] = "namespace",
        format: Annotated[CostFormat, Query(description="json, csv or html")] = "json",
    ) -> Response:
        """GPU cost and waste of the fleet, grouped (prices from --prices)."""
        from exporter.timeparse import parse_positive_duration

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
        headers = cur.headers()
        if format == "json":
            body = {**cur.meta(), "window": {"start": rfc3339(report.start), "end": rfc3339(report.end)},
                    "source": source, "group_by": group_by, "requested_window": window or _fmt_seconds(loop),
                    "report": _report_json(report)}
            return answer(CostOut, body, cur)
        from analyzer.finops import outputs

        if format == "csv":
            return Response(outputs.to_focus_csv(report), media_type="text/csv; charset=utf-8", headers=headers)
        return HTMLResponse(outputs.render_html(report), headers=headers)

    @app.get("/", include_in_schema=False)
    def index(request: Request) -> Response:
        from analyzer.overview import render_overview

        auth.require(request, basic=True)
        snap = service.snapshot()
        try:
            cur = current(service, snap)
        except NoResults as exc:
            return HTMLResponse(render_overview(None, service=service, message=exc.detail), status_code=503,
                                headers={"Retry-After": str(max(1, math.ceil(exc.retry_after)))})
        report, cost_note = None, None
        if settings.catalog is not None and cur.analysis.fleet is not None:
            try:
                report = costs.latest(cur.analysis, "namespace")
            except Exception as exc:  # the page must render without cost
                log.warning("overview: cost report failed: %s", exc)
                cost_note = f"cost report failed: {type(exc).__name__}: {exc}"
        else:
            cost_note = "no prices configured (--prices FILE)"
        return HTMLResponse(render_overview(cur, service=service, cost=report, cost_note=cost_note),
                            headers=cur.headers())

    @app.get("/metrics", include_in_schema=False)
    def metrics(request: Request) -> Response:  # sync: runs in the threadpool, not on the event loop
        if settings.protect_metrics:
            auth.require(request)
        encoder, content_type = choose_encoder(request.headers.get("accept", ""))
        return Response(encoder(registry), media_type=None, headers={"Content-Type": content_type})

    @app.get("/healthz", include_in_schema=False)
    def healthz(request: Request) -> JSONResponse:
        """Liveness: 200 while the process serves, "starting" in the body until a first good analysis."""
        if settings.protect_healthz:
            auth.require(request)
        return JSONResponse(service.health_json())

    @app.get("/readyz", include_in_schema=False)
    def readyz(request: Request) -> JSONResponse:
        """Readiness: 503 until the first good analysis, so no traffic reaches an empty service."""
        if settings.protect_healthz:
            auth.require(request)
        health = service.health_json()
        return JSONResponse(health, status_code=200 if health["last_success"] is not None else 503)

    @app.get("/docs", include_in_schema=False)
    def docs() -> HTMLResponse:
        return get_swagger_ui_html(
            openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API docs",
            swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
            swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
        )

    @app.get("/robots.txt", include_in_schema=False)
    def robots() -> PlainTextResponse:
        return PlainTextResponse("User-agent: *\nDisallow: /\n")

    return app


__all__ = [
    "ApiSettings", "Auth", "CostOut", "FindingOut", "FindingsOut", "ScoreRow", "ScoresOut", "create_app", "current",
    "finding_out",
]
