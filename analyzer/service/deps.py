"""What every route depends on: the service's current results, auth, request checks, answers.

Typed dependencies (``ServiceDep``, ``SettingsDep``, ``CostsDep``, ``AuthDep``) read what
:func:`analyzer.service.app.create_app` put on ``app.state``; routers declare them as parameters.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Annotated, Any

from fastapi import Depends, HTTPException, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel

from analyzer.analysis.shares import holder_rows
from analyzer.findings import rfc3339
from analyzer.report.data import namespace_pairs
from analyzer.service.cost_source import CostSource
from analyzer.service.errors import NoResults
from analyzer.service.loop import AnalyzerService
from analyzer.service.models import ErrorOut, ScoresOut, UnavailableOut, ValidationErrorOut
from analyzer.service.settings import ApiSettings

if TYPE_CHECKING:
    from analyzer.service.loop import Analysis, Snapshot
    from analyzer.site import ScopedToken

#: Free-text filter values (host, workload, namespace names): printable, bounded.
TEXT_PATTERN = r"^[^\x00-\x1f\x7f]+$"
TEXT_MAX = 253
STALE_HEADER, AS_OF_HEADER = "X-Truegpu-Stale", "X-Truegpu-As-Of"
REALM = "truegpu"
#: Declares the bearer scheme in the OpenAPI spec; Auth does the checking.
BEARER = HTTPBearer(auto_error=False, description="the token of --api-token-file")


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


def need_scores(cur: Current) -> tuple[Any, Any]:
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


def reject_unknown(*known: str) -> Callable[[Request], None]:
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


@dataclass(frozen=True)
class Scope:
    """What one request may see: everything (the admin token, or --no-auth), or the namespaces of a token the
    site config scopes (analyzer.site.ScopedToken): their findings, workload and namespace scores, cost
    groups and jobs; nothing fleet-wide."""

    token: ScopedToken | None = None

    @property
    def admin(self) -> bool:
        return self.token is None

    def sees(self, namespace: str | None) -> bool:
        return self.token is None or self.token.sees(namespace)

    def jobs(self, fleet: Any) -> set[str] | None:
        """The workloads this scope sees: every namespace they ran in is its, or their Slurm account is; None:
        all of them."""
        t = self.token
        if t is None:
            return None
        out: set[str] = set()
        if t.namespaces:
            pairs = namespace_pairs(holder_rows(fleet, ("job", "namespace")))  # a shared GPU's every holder
            seen = pairs["namespace"].map(t.sees).astype(bool)
            out |= set(seen.groupby(pairs["job"]).all().loc[lambda ok: ok].index)
        acct = fleet.accounting
        if t.accounts and len(acct):
            out |= {str(j) for j, a in zip(acct["job"], acct["account"], strict=True) if t.sees_account(a)}
        return out

    def refuse(self, what: str) -> HTTPException:
        """403 for a scoped token asking for ``what``, something fleet-wide."""
        t = self.token
        parts = [f"namespaces {', '.join(t.namespaces)}"] if t and t.namespaces else []
        parts += [f"Slurm accounts {', '.join(t.accounts)}"] if t and t.accounts else []
        who = f"token {t.name!r} sees {' and '.join(parts)} only" if t else "this token"
        return HTTPException(403, f"{who}: {what} needs the admin token")


ADMIN = Scope()


class Auth:
    """Bearer (and, for the HTML page, Basic) token check; constant time over the tokens' hashes."""

    def __init__(self, settings: ApiSettings) -> None:
        self.settings = settings
        self._want = _digest(settings.token) if settings.token is not None else None

    def matches(self, supplied: str | None) -> bool:
        if self._want is None or supplied is None:
            return False
        return hmac.compare_digest(_digest(supplied), self._want)

    def _scoped(self, supplied: str | None) -> ScopedToken | None:
        """The scoped token ``supplied`` is, comparing with every one (the time does not tell which)."""
        if supplied is None:
            return None
        digest, found = _digest(supplied), None
        for token in self.settings.tokens:
            if hmac.compare_digest(digest, token.digest):
                found = token
        return found

    def require(self, request: Request, *, basic: bool = False, admin: bool = False) -> Scope:
        """The request's Scope; 401/403 unless it may pass. ``admin``: fleet-wide endpoints (a scoped token
        gets 403)."""
        if self.settings.no_auth:
            return ADMIN
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
            return ADMIN
        scoped = self._scoped(supplied)
        if scoped is not None:
            scope = Scope(scoped)
            if admin:
                raise scope.refuse(request.url.path)
            return scope
        challenge = f'Basic realm="{REALM}", charset="UTF-8"' if basic else f'Bearer realm="{REALM}"'
        if scheme:
            detail = "invalid token"
            if not basic:
                challenge += ', error="invalid_token"'
        else:
            detail = "missing token: send Authorization: Bearer TOKEN"
        raise HTTPException(401, detail, headers={"WWW-Authenticate": challenge})


def retry_after(seconds: float) -> dict[str, str]:
    return {"Retry-After": str(max(1, math.ceil(seconds)))}


def get_service(request: Request) -> AnalyzerService:
    return request.app.state.service


def get_settings(request: Request) -> ApiSettings:
    return request.app.state.settings


def get_costs(request: Request) -> CostSource:
    return request.app.state.costs


def get_auth(request: Request) -> Auth:
    return request.app.state.auth


ServiceDep = Annotated[AnalyzerService, Depends(get_service)]
SettingsDep = Annotated[ApiSettings, Depends(get_settings)]
CostsDep = Annotated[CostSource, Depends(get_costs)]
AuthDep = Annotated[Auth, Depends(get_auth)]


def api_auth(request: Request, auth: AuthDep,
             _cred: Annotated[HTTPAuthorizationCredentials | None, Depends(BEARER)]) -> Scope:
    """The /api/* routes' token check (Bearer): the request's Scope."""
    return auth.require(request)


ScopeDep = Annotated[Scope, Depends(api_auth)]


#: Error answers every /api route documents.
API_ERRORS: dict[int | str, dict[str, Any]] = {
    401: {"model": ErrorOut, "description": "Missing or invalid token"},
    403: {"model": ErrorOut, "description": "The API is disabled (no token configured)"},
    422: {"model": ValidationErrorOut, "description": "Invalid parameters"},
    503: {"model": UnavailableOut, "description": "No analysis results yet"},
}


def answer(model: type[BaseModel], body: dict[str, Any], cur: Current) -> JSONResponse:
    """``body`` validated against ``model``, with the snapshot's staleness headers."""
    content = model.model_validate(body).model_dump(mode="json", exclude_unset=model is ScoresOut)
    return JSONResponse(content, headers=cur.headers())
