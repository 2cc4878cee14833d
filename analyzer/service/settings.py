"""How the HTTP API authenticates and where cost data comes from (no FastAPI import)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


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
    #: API tokens scoped to namespaces (analyzer.site.ScopedToken, the site config's ``access``).
    tokens: tuple[Any, ...] = ()

    def __post_init__(self) -> None:
        if self.token is not None and not self.token:
            raise ValueError("the API token is empty")
        if self.no_auth and self.token is not None:
            raise ValueError("--no-auth and --api-token-file exclude each other")
        if (self.protect_metrics or self.protect_healthz) and self.token is None:
            raise ValueError("--protect-metrics/--protect-healthz need --api-token-file")
        if self.tokens and self.token is None:
            raise ValueError("the site config's scoped access tokens need --api-token-file (the admin token); "
                             "--no-auth would show every namespace to anyone")

    @property
    def api_enabled(self) -> bool:
        return self.no_auth or self.token is not None


__all__ = ["ApiSettings"]
