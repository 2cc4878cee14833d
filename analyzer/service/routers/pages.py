"""The pages a browser opens: the / overview (HTTP Basic or Bearer), the API docs, robots.txt."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import HTMLResponse, PlainTextResponse, Response

from analyzer.service.deps import AuthDep, CostsDep, ServiceDep, SettingsDep, current, retry_after
from analyzer.service.errors import NoResults
from analyzer.service.overview import render_overview

log = logging.getLogger(__name__)

#: Where /docs loads Swagger UI's script and style from (the swagger-ui-bundle package, mounted by app.py).
DOCS_ASSETS = "/docs/assets"

router = APIRouter(include_in_schema=False)


@router.get("/")
def index(request: Request, service: ServiceDep, settings: SettingsDep, costs: CostsDep, auth: AuthDep) -> Response:
    auth.require(request, basic=True, admin=True)  # the whole fleet
    try:
        cur = current(service)
    except NoResults as exc:
        return HTMLResponse(render_overview(None, service=service, message=exc.detail), status_code=503,
                            headers=retry_after(exc.retry_after))
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


@router.get("/jobs/{name}")
def job_page(name: str, request: Request, service: ServiceDep, costs: CostsDep, auth: AuthDep) -> Response:
    """One job's page (the JSON is /api/jobs/{name}); linked from the overview's findings."""
    from analyzer.report.job_html import render_job
    from analyzer.service.routers.jobs import job_of

    scope = auth.require(request, basic=True)
    cur, report = job_of(service, costs, name, scope)
    return HTMLResponse(render_job(report), headers=cur.headers())


@router.get("/docs")
def docs(request: Request) -> HTMLResponse:
    app = request.app
    return get_swagger_ui_html(
        openapi_url=app.openapi_url or "/openapi.json", title=f"{app.title} - API docs",
        swagger_js_url=f"{DOCS_ASSETS}/swagger-ui-bundle.js", swagger_css_url=f"{DOCS_ASSETS}/swagger-ui.css",
        swagger_favicon_url=f"{DOCS_ASSETS}/favicon-32x32.png",
    )


@router.get("/robots.txt")
def robots() -> PlainTextResponse:
    return PlainTextResponse("User-agent: *\nDisallow: /\n")
