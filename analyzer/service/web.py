"""``truegpu serve --web-config-file``: the exporter-toolkit file (exporter.webconfig) for the
analyzer: TLS (incl. client-certificate mTLS) on the uvicorn socket, the file's response headers
on every answer, and its bcrypt basic-auth users on what Prometheus and probes read (/metrics,
/healthz, /readyz). The API (/api/*, /) keeps its own bearer tokens: one Authorization header
cannot carry both, and the API's tokens are what its clients hold.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from exporter.webconfig import REALM, BasicAuth, WebConfig

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: What basic auth guards: the scrape and probe endpoints.
GUARDED = ("/metrics", "/healthz", "/readyz")


def secured(app: ASGIApp, web: WebConfig) -> ASGIApp:
    """``app`` with the web config's headers on every response and its users on :data:`GUARDED`."""
    if not web.users and not web.headers:
        return app
    auth = BasicAuth(web.users) if web.users else None
    extra = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in web.headers.items()]

    async def guarded(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await app(scope, receive, send)
            return

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        if auth is not None and scope.get("path") in GUARDED:
            header = dict(scope.get("headers", [])).get(b"authorization", b"").decode("latin-1")
            if not auth.allows(header):
                await send_with_headers({"type": "http.response.start", "status": 401, "headers": [
                    (b"content-type", b"text/plain; charset=utf-8"),
                    (b"www-authenticate", f'Basic realm="{REALM}", charset="UTF-8"'.encode())]})
                await send({"type": "http.response.body", "body": b"Unauthorized\n"})
                return
        await app(scope, receive, send_with_headers)

    return guarded
