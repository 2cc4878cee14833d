"""``--web-config-file``: TLS, client certificates, basic auth and response headers, in the
Prometheus exporter-toolkit format, so the file a site already writes for node_exporter works
here unchanged::

    tls_server_config:
      cert_file: /etc/truegpu/tls.crt
      key_file: /etc/truegpu/tls.key
      client_auth_type: RequireAndVerifyClientCert   # mTLS; default NoClientCert
      client_ca_file: /etc/truegpu/ca.crt
      min_version: TLS12                             # default TLS12 (TLS10/TLS11 refused: obsolete)
    http_server_config:
      headers: {Strict-Transport-Security: max-age=31536000}
    basic_auth_users:
      prometheus: $2y$10$...                         # bcrypt hash (htpasswd -nBC 10 "" | tr -d ':\\n')

Every key is checked: an unknown key, a missing certificate or a hash that is not bcrypt is an
error naming the file and the key, never a silently open endpoint. Basic auth answers 401 to
everything without valid credentials (the exporter's /healthz too, as exporter-toolkit does);
a bcrypt check costs tens of milliseconds by design, so a successful (user, password) pair is
remembered by its SHA-256 for the process' life (Prometheus sends the same pair every scrape).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import ssl
import threading
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

#: exporter-toolkit's client_auth_type -> (verify mode, a CA file needed).
CLIENT_AUTH: dict[str, tuple[ssl.VerifyMode, bool]] = {
    "NoClientCert": (ssl.CERT_NONE, False),
    "RequestClientCert": (ssl.CERT_OPTIONAL, False),
    "RequireAnyClientCert": (ssl.CERT_REQUIRED, False),
    "VerifyClientCertIfGiven": (ssl.CERT_OPTIONAL, True),
    "RequireAndVerifyClientCert": (ssl.CERT_REQUIRED, True),
}
VERSIONS: dict[str, ssl.TLSVersion] = {"TLS12": ssl.TLSVersion.TLSv1_2, "TLS13": ssl.TLSVersion.TLSv1_3}
#: Go's names of the TLS 1.2 AEAD suites (exporter-toolkit's cipher_suites) -> OpenSSL's.
CIPHERS: dict[str, str] = {
    "TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256": "ECDHE-ECDSA-AES128-GCM-SHA256",
    "TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384": "ECDHE-ECDSA-AES256-GCM-SHA384",
    "TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256": "ECDHE-RSA-AES128-GCM-SHA256",
    "TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384": "ECDHE-RSA-AES256-GCM-SHA384",
    "TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-ECDSA-CHACHA20-POLY1305",
    "TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256": "ECDHE-RSA-CHACHA20-POLY1305",
}
#: Response headers exporter-toolkit lets a site set.
HEADERS = ("Strict-Transport-Security", "X-Content-Type-Options", "X-Frame-Options", "X-XSS-Protection",
           "Content-Security-Policy")
_TLS_KEYS = ("cert_file", "key_file", "client_auth_type", "client_ca_file", "min_version", "max_version",
             "cipher_suites", "prefer_server_cipher_suites", "curve_preferences")
REALM = "truegpu"


class WebConfigError(ValueError):
    """A web config that cannot be served as written (the message names the file and key)."""


@dataclass(frozen=True)
class WebConfig:
    """What the HTTP server enforces; ``WebConfig()`` is plain HTTP without auth."""

    tls: ssl.SSLContext | None = None
    #: user -> bcrypt hash.
    users: Mapping[str, bytes] = field(default_factory=dict)
    headers: Mapping[str, str] = field(default_factory=dict)
    #: TLS paths, for the files the caller serves (uvicorn takes paths, not a context).
    cert_file: str | None = None
    key_file: str | None = None
    client_ca_file: str | None = None
    client_verify: ssl.VerifyMode = ssl.CERT_NONE

    @property
    def scheme(self) -> str:
        return "https" if self.tls is not None else "http"


def _mapping(value: Any, where: str, keys: Iterable[str]) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise WebConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    unknown = sorted(set(value) - set(keys))
    if unknown:
        raise WebConfigError(f"{where}: unknown key(s) {', '.join(map(str, unknown))} (known: {', '.join(keys)})")
    return value


def _file(base: Path, value: Any, where: str) -> str:
    if not isinstance(value, str) or not value:
        raise WebConfigError(f"{where}: expected a file path")
    path = (base / value) if not Path(value).is_absolute() else Path(value)  # relative to the config, as the toolkit
    if not path.is_file():
        raise WebConfigError(f"{where}: {path} does not exist")
    return str(path)


def _tls(raw: Mapping[str, Any], base: Path, where: str) -> tuple[ssl.SSLContext, dict[str, Any]]:
    if "cert_file" not in raw or "key_file" not in raw:
        raise WebConfigError(f"{where}: cert_file and key_file are both required for TLS")
    cert, key = _file(base, raw["cert_file"], f"{where}.cert_file"), _file(base, raw["key_file"], f"{where}.key_file")
    auth = raw.get("client_auth_type", "NoClientCert")
    if auth not in CLIENT_AUTH:
        raise WebConfigError(f"{where}.client_auth_type: {auth!r} is not one of {', '.join(CLIENT_AUTH)}")
    verify, needs_ca = CLIENT_AUTH[auth]
    ca = _file(base, raw["client_ca_file"], f"{where}.client_ca_file") if raw.get("client_ca_file") else None
    if needs_ca and ca is None:
        raise WebConfigError(f"{where}: client_auth_type {auth} needs client_ca_file")
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    try:
        ctx.load_cert_chain(cert, key)
        if ca:
            ctx.load_verify_locations(ca)
    except (ssl.SSLError, OSError) as exc:
        raise WebConfigError(f"{where}: cannot load the certificate or key: {exc}") from None
    for bound, attr, default in (("min_version", "minimum_version", "TLS12"), ("max_version", "maximum_version", None)):
        name = raw.get(bound, default)
        if name is None:
            continue
        if name not in VERSIONS:
            raise WebConfigError(f"{where}.{bound}: {name!r} is not one of {', '.join(VERSIONS)} "
                                 "(TLS 1.0 and 1.1 are obsolete and refused)")
        setattr(ctx, attr, VERSIONS[name])
    suites = raw.get("cipher_suites")
    if suites:
        bad = [s for s in suites if s not in CIPHERS]
        if bad:
            raise WebConfigError(f"{where}.cipher_suites: {', '.join(map(str, bad))} not supported (TLS 1.2 AEAD "
                                 f"suites only: {', '.join(CIPHERS)}; TLS 1.3 suites are fixed)")
        ctx.set_ciphers(":".join(CIPHERS[s] for s in suites))
    if raw.get("curve_preferences"):
        raise WebConfigError(f"{where}.curve_preferences: not supported (OpenSSL's defaults X25519, P-256 apply)")
    if raw.get("prefer_server_cipher_suites", True):
        ctx.options |= ssl.OP_CIPHER_SERVER_PREFERENCE
    ctx.verify_mode = verify
    return ctx, {"cert_file": cert, "key_file": key, "client_ca_file": ca, "client_verify": verify}


def _users(raw: Any, where: str) -> dict[str, bytes]:
    if raw is None:
        return {}
    if not isinstance(raw, Mapping):
        raise WebConfigError(f"{where}: expected user -> bcrypt hash")
    out = {}
    for user, hashed in raw.items():
        if not isinstance(hashed, str) or not hashed.startswith(("$2a$", "$2b$", "$2y$")):
            raise WebConfigError(f"{where}.{user}: expected a bcrypt hash ($2y$...), never a plain password")
        out[str(user)] = hashed.encode()
    return out


def load_web_config(path: str | Path | None) -> WebConfig:
    """The web config in ``path`` (exporter-toolkit YAML); plain HTTP for None."""
    if path is None:
        return WebConfig()
    import yaml  # only when a web config is given: the exporter's start-up stays lean

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise WebConfigError(f"web config {path}: {exc}") from None
    top = _mapping(data, f"web config {path}", ("tls_server_config", "http_server_config", "basic_auth_users"))
    where = f"web config {path}"
    tls_raw = _mapping(top.get("tls_server_config"), f"{where}: tls_server_config", _TLS_KEYS)
    ctx, paths = _tls(tls_raw, path.parent, f"{where}: tls_server_config") if tls_raw else (None, {})
    http = _mapping(top.get("http_server_config"), f"{where}: http_server_config", ("http2", "headers"))
    headers = _mapping(http.get("headers"), f"{where}: http_server_config.headers", HEADERS)
    return WebConfig(tls=ctx, users=_users(top.get("basic_auth_users"), f"{where}: basic_auth_users"),
                     headers={str(k): str(v) for k, v in headers.items()}, **paths)


class BasicAuth:
    """Checks ``Authorization: Basic`` against the bcrypt hashes; remembers pairs that passed."""

    def __init__(self, users: Mapping[str, bytes]) -> None:
        import bcrypt

        self._check = bcrypt.checkpw
        self.users = dict(users)
        self._good: set[bytes] = set()
        self._lock = threading.Lock()
        # An unknown user still costs one bcrypt check, so timing does not tell which users exist.
        self._decoy = bcrypt.hashpw(b"decoy", bcrypt.gensalt(rounds=10))

    def allows(self, header: str | None) -> bool:
        scheme, _, cred = (header or "").partition(" ")
        if scheme.lower() != "basic":
            return False
        try:
            user, sep, password = base64.b64decode(cred.strip(), validate=True).decode("utf-8").partition(":")
        except (binascii.Error, UnicodeDecodeError):
            return False
        if not sep:
            return False
        key = hashlib.sha256(f"{user}\x00{password}".encode("utf-8", "surrogatepass")).digest()
        with self._lock:
            if any(hmac.compare_digest(key, good) for good in self._good):
                return True
        hashed = self.users.get(user)
        ok = self._check(password.encode("utf-8", "surrogatepass"), hashed or self._decoy) and hashed is not None
        if ok:
            with self._lock:
                self._good.add(key)
        return ok


def protect(app: WsgiApp, config: WebConfig) -> WsgiApp:
    """``app`` behind the config's basic auth, with its response headers on every answer."""
    auth = BasicAuth(config.users) if config.users else None
    extra = list(config.headers.items())

    def protected(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        def respond(status: str, headers: list[tuple[str, str]], exc_info: Any = None) -> Any:
            return start_response(status, headers + extra, exc_info) if exc_info else \
                start_response(status, headers + extra)

        if auth is not None and not auth.allows(environ.get("HTTP_AUTHORIZATION")):
            respond("401 Unauthorized", [("Content-Type", "text/plain; charset=utf-8"),
                                         ("WWW-Authenticate", f'Basic realm="{REALM}", charset="UTF-8"')])
            return [b"Unauthorized\n"]
        return app(environ, respond)

    return protected
