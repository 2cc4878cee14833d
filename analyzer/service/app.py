"""The HTTP API of `truegpu serve`: findings, scores, cost reports, the overview page, auth.

Every answer is computed from ONE snapshot of the analysis loop (analyzer/service/loop.py), so a
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

import swagger_ui_bundle
from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.staticfiles import StaticFiles

from analyzer.detectors import load_detectors
from analyzer.service.cost_source import CostSource
from analyzer.service.deps import Auth, retry_after, validation_message
from analyzer.service.errors import CostError, NoResults
from analyzer.service.loop import AnalyzerService
from analyzer.service.metrics import build_registry
from analyzer.service.routers import costs, findings, jobs, ops, pages, scores
from analyzer.service.settings import ApiSettings
from exporter import __version__


def create_app(service: AnalyzerService, settings: ApiSettings | None = None) -> FastAPI:
    """The service's HTTP app: /api/*, /, /metrics, /healthz, /readyz, /docs, /openapi.json.

    Without ``settings`` the API is disabled (403) and /metrics, /healthz are open. The findings
    route's ``kind`` enum is the detector registry's kinds at the time the app is built."""
    settings = settings or ApiSettings()
    app = FastAPI(
        title="truegpu analyzer", version=__version__,
        description="Findings, effective-utilization scores and cost reports of the GPU fleet, from the "
        "analysis loop's latest results. /api/* needs `Authorization: Bearer TOKEN`.",
        docs_url=None, redoc_url=None,
    )
    # Swagger UI from a Python package, not a CDN: /docs works on an air-gapped cluster.
    app.mount(pages.DOCS_ASSETS, StaticFiles(directory=swagger_ui_bundle.swagger_ui_path), name="docs-assets")
    app.state.service, app.state.settings = service, settings
    app.state.auth, app.state.costs = Auth(settings), CostSource(service, settings)
    app.state.registry = build_registry(service.snapshot, settings.catalog)

    @app.exception_handler(RequestValidationError)
    async def invalid(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{k: v for k, v in e.items() if k != "url"} for e in exc.errors()]
        return JSONResponse(status_code=422, content=jsonable_encoder(
            {"message": validation_message(errors), "detail": errors}))

    @app.exception_handler(NoResults)
    async def unavailable(request: Request, exc: NoResults) -> JSONResponse:
        return JSONResponse(status_code=503, headers=retry_after(exc.retry_after),
                            content={"detail": exc.detail, "last_error": exc.last_error,
                                     "retry_after_seconds": exc.retry_after})

    @app.exception_handler(CostError)
    async def cost_error(request: Request, exc: CostError) -> JSONResponse:
        return JSONResponse(status_code=400, content={"detail": str(exc)})

    for router in (findings.router(sorted(load_detectors())), scores.router, costs.router, jobs.router, pages.router,
                   ops.router):
        app.include_router(router)
    return app


__all__ = ["create_app"]
