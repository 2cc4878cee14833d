"""What operators and Prometheus read: /metrics, /healthz (liveness), /readyz (readiness)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, Response
from prometheus_client.exposition import choose_encoder

from analyzer.service.deps import AuthDep, ServiceDep, SettingsDep

router = APIRouter(include_in_schema=False)


@router.get("/metrics")
def metrics(request: Request, settings: SettingsDep, auth: AuthDep) -> Response:
    """Sync: runs in the threadpool, not on the event loop."""
    if settings.protect_metrics:
        auth.require(request, admin=True)
    encoder, content_type = choose_encoder(request.headers.get("accept", ""))
    return Response(encoder(request.app.state.registry), media_type=None, headers={"Content-Type": content_type})


@router.get("/healthz")
def healthz(request: Request, service: ServiceDep, settings: SettingsDep, auth: AuthDep) -> JSONResponse:
    """Liveness: 200 while the process serves, "starting" in the body until a first good analysis."""
    if settings.protect_healthz:
        auth.require(request, admin=True)
    return JSONResponse(service.health_json())


@router.get("/readyz")
def readyz(request: Request, service: ServiceDep, settings: SettingsDep, auth: AuthDep) -> JSONResponse:
    """Readiness: 503 until the first good analysis, so no traffic reaches an empty service."""
    if settings.protect_healthz:
        auth.require(request, admin=True)
    health = service.health_json()
    return JSONResponse(health, status_code=200 if health["last_success"] is not None else 503)
