"""``truegpu exporter``: serve the sources' metrics on /metrics.

This runs on every GPU node, so imports stay lean (stdlib + prometheus_client, and only
the sources asked for): start-up to the first scrape well under a second, RSS in tens of MB.
"""

from __future__ import annotations

import argparse
import contextlib
import html
import logging
import signal
import socket
import socketserver
import ssl
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer

from exporter import __version__
from exporter.sources import (
    DEFAULT_DEADLINE,
    SourceConfigError,
    add_source_arguments,
    describe_source,
    known_sources,
    source_name,
)
from exporter.webconfig import StartResponse, WebConfig, WebConfigError, WsgiApp, load_web_config, protect

if TYPE_CHECKING:
    from prometheus_client.registry import CollectorRegistry

    from exporter.collector import TruegpuCollector

log = logging.getLogger(__name__)

DEFAULT_PORT = 9835
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
#: Background collections every 5 s: a third of the usual 15 s scrape interval, so served
#: values are at most seconds old, while an 8-GPU NVML round (tens of ms on real drivers) costs
#: well under 1% of a core. GPM byte counters integrate every window whatever this is;
#: GPM ratios average the last one (set it to the scrape interval to cover all of it).
DEFAULT_COLLECT_INTERVAL = 5.0
#: Longest a client may take for the TLS handshake and each read of its request (seconds).
TLS_TIMEOUT = 10.0



def parse_listen(value: str) -> tuple[str, int]:
    """``:PORT`` (all interfaces), ``HOST:PORT`` or ``[IPV6]:PORT`` -> (host, port); host "" means all."""
    host, sep, port_s = value.rpartition(":")
    if not sep:
        raise argparse.ArgumentTypeError(f"--listen {value!r}: expected :PORT, HOST:PORT or [IPV6]:PORT")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise argparse.ArgumentTypeError(f"--listen {value!r}: put IPv6 addresses in brackets, e.g. [::1]:{port_s}")
    try:
        port = int(port_s)
    except ValueError:
        port = -1
    if not 0 <= port <= 65535:
        raise argparse.ArgumentTypeError(f"--listen {value!r}: port must be 0..65535")
    return host, port


def register(subparsers: argparse._SubParsersAction) -> None:
    """Add ``truegpu exporter`` to the CLI."""
    p = subparsers.add_parser(
        "exporter",
        help="run the per-node Prometheus exporter",
        description="Serve GPU metrics (the truegpu contract) on /metrics for Prometheus to scrape.",
    )
    p.add_argument(
        "--source", action="append", dest="sources", type=source_name, metavar="NAME",
        help=f"where metrics come from, repeatable, earlier wins on conflicts; one of: {', '.join(known_sources())}",
    )
    p.add_argument(
        "--listen", type=parse_listen, default=parse_listen(DEFAULT_LISTEN), metavar="[HOST]:PORT",
        help=f"address to serve on: :PORT, HOST:PORT or [IPV6]:PORT (default {DEFAULT_LISTEN})",
    )
    p.add_argument(
        "--deadline", type=float, default=DEFAULT_DEADLINE, metavar="SECONDS",
        help="longest a real source (nvml, dcgm) may take per collection before its last good values are "
        f"served, marked by truegpu_exporter_source_stale (default {DEFAULT_DEADLINE:g})",
    )
    p.add_argument(
        "--collect-interval", type=float, default=DEFAULT_COLLECT_INTERVAL, metavar="SECONDS",
        help="collect every source this often on a background thread; scrapes serve the latest "
        f"collection. 0 collects on every scrape instead (default {DEFAULT_COLLECT_INTERVAL:g})",
    )
    p.add_argument(
        "--precedence", action="append", type=parse_precedence, default=[], metavar="FAMILY=SRC[,SRC...]",
        help="which source serves a family when several provide it, e.g. "
        "truegpu_sm_active_ratio=dcgm,nvml (repeatable; default: the order of --source)",
    )
    p.add_argument(
        "--web-config-file", metavar="FILE",
        help="TLS (incl. client-certificate mTLS), bcrypt basic-auth users and response headers, in the "
        "Prometheus exporter-toolkit format (the same file as node_exporter's); default: plain HTTP",
    )
    add_source_arguments(p)
    p.set_defaults(func=run)


def parse_precedence(value: str) -> tuple[str, tuple[str, ...]]:
    """``FAMILY=SRC[,SRC...]`` -> (family, sources); the names are checked once the sources are known."""
    family, sep, order = value.partition("=")
    sources = tuple(s.strip() for s in order.split(",") if s.strip())
    if not sep or not family.strip() or not sources:
        raise argparse.ArgumentTypeError(f"--precedence {value!r}: expected FAMILY=SOURCE[,SOURCE...]")
    return family.strip(), sources


# HTTP -----------------------------------------------------------------------------------
class _Handler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        log.debug("%s " + format, self.address_string(), *args)


class _Server(socketserver.ThreadingMixIn, WSGIServer):
    """Thread per request, so a slow scrape does not block /healthz. With ``tls`` set (the web
    config's), the handshake runs in the request's thread, never in the accept loop: a client that
    stalls it only holds its own thread, for at most ``TLS_TIMEOUT`` seconds."""

    daemon_threads = True
    tls: ssl.SSLContext | None = None
    allow_reuse_address = True
    # socketserver's default backlog of 5 drops the SYNs of a burst of concurrent scrapers,
    # which then retry after a full second; a node may have several Prometheus replicas,
    # federation and ad-hoc curls hitting it at once.
    request_queue_size = 128

    def server_bind(self) -> None:
        # HTTPServer.server_bind resolves the FQDN of the bind address, which can hang on a
        # node with slow DNS; the name is only used for CGI-style environ fields.
        if self.address_family == socket.AF_INET6 and self.server_address[0] == "::":
            self.socket.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)  # dual stack
        socketserver.TCPServer.server_bind(self)
        host, port = self.server_address[:2]
        self.server_name, self.server_port = host, port
        self.setup_environ()


    def finish_request(self, request: Any, client_address: Any) -> None:
        if self.tls is None:
            super().finish_request(request, client_address)
            return
        request.settimeout(TLS_TIMEOUT)
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (ssl.SSLError, OSError) as exc:  # a wrong CA, plain HTTP on the TLS port, a scanner
            # A connection closed before any handshake is a TCP probe (kubelet tcpSocket, a load balancer):
            # routine, several a minute, so not worth a log line each; a refused handshake is.
            eof = isinstance(exc, ssl.SSLEOFError | ssl.SSLZeroReturnError | ConnectionResetError | BrokenPipeError)
            (log.debug if eof else log.info)("TLS handshake with %s %s: %s", client_address[0],
                                             "closed before it began" if eof else "refused", exc)
            return
        try:
            super().finish_request(conn, client_address)
        finally:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
            conn.close()


class _Server6(_Server):
    address_family = socket.AF_INET6


def make_server(host: str, port: int, app: WsgiApp, web: WebConfig | None = None) -> WSGIServer:
    """Bind ``host:port``; an empty host means every interface (IPv6 dual stack when available).
    ``web`` (``--web-config-file``): TLS, basic auth and response headers."""
    web = web or WebConfig()
    if host == "":
        try:
            server: WSGIServer = _Server6(("::", port), _Handler)
        except OSError:
            server = _Server(("0.0.0.0", port), _Handler)
    else:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        cls = _Server6 if family == socket.AF_INET6 else _Server
        server = cls((host, port), _Handler)
    server.tls = web.tls
    server.set_app(protect(app, web))
    return server


def make_app(registry: CollectorRegistry, collector: TruegpuCollector) -> WsgiApp:
    """/metrics (prometheus_client exposition, OpenMetrics negotiation, gzip), / and /healthz."""
    from prometheus_client.exposition import make_wsgi_app

    metrics = _rendered_once_per_collection(make_wsgi_app(registry), collector)

    def app(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        path = environ.get("PATH_INFO") or "/"
        if path == "/metrics":
            return metrics(environ, start_response)
        if environ.get("REQUEST_METHOD", "GET") not in ("GET", "HEAD"):
            start_response("405 Method Not Allowed", [("Allow", "GET, HEAD"), ("Content-Type", "text/plain")])
            return [b"method not allowed\n"]
        if path == "/healthz":
            # Liveness of the process and HTTP server; source health is truegpu_exporter_source_up.
            start_response("200 OK", [("Content-Type", "text/plain; charset=utf-8")])
            return [b"ok\n"]
        if path == "/":
            rows = "".join(
                f"<li>{html.escape(name)}: {'up' if up else 'DOWN'}, {n} series</li>"
                for name, (up, n) in collector.last.items()
            )
            body = (
                f"<html><head><title>truegpu exporter</title></head><body><h1>truegpu exporter {__version__}</h1>"
                f'<p><a href="/metrics">/metrics</a> &middot; <a href="/healthz">/healthz</a></p>'
                f"<p>Sources at the last collection:</p><ul>{rows}</ul></body></html>\n"
            )
            start_response("200 OK", [("Content-Type", "text/html; charset=utf-8")])
            return [body.encode()]
        start_response("404 Not Found", [("Content-Type", "text/plain")])
        return [b"not found; metrics are on /metrics\n"]

    return app


def _rendered_once_per_collection(app: WsgiApp, collector: TruegpuCollector) -> WsgiApp:
    """Between two background collections /metrics cannot change, so each distinct request
    (Accept, Accept-Encoding, query) is rendered once per collection and the bytes reused:
    HA Prometheus pairs, federation and ad-hoc curls hitting a node together share one render."""
    lock = threading.Lock()
    cache: dict[tuple[str, str, str], tuple[str, list[tuple[str, str]], bytes]] = {}
    rendered_for: int | None = None

    def cached(environ: dict[str, Any], start_response: StartResponse) -> Iterable[bytes]:
        nonlocal rendered_for
        generation = collector.generation
        if generation is None or environ.get("REQUEST_METHOD") != "GET":
            return app(environ, start_response)
        key = (environ.get("HTTP_ACCEPT", ""), environ.get("HTTP_ACCEPT_ENCODING", ""), environ.get("QUERY_STRING", ""))
        with lock:
            if rendered_for != generation:
                cache.clear()
                rendered_for = generation
            hit = cache.get(key)
            if hit is None:
                started: list[tuple[str, list[tuple[str, str]]]] = []
                body = b"".join(app(environ, lambda status, headers, exc_info=None: started.append((status, headers))))
                hit = (started[0][0], started[0][1], body)
                if len(cache) < _MAX_RENDERINGS:  # odd clients must not grow it without bound
                    cache[key] = hit
        start_response(hit[0], list(hit[1]))
        return [hit[2]]

    return cached


#: Distinct request shapes kept per collection; Prometheus sends one, curl and browsers a few more.
_MAX_RENDERINGS = 16


# Command ----------------------------------------------------------------------------------
def _error(msg: str) -> int:
    print(f"truegpu exporter: error: {msg}", file=sys.stderr)
    return 2


def run(args: argparse.Namespace, stop: threading.Event | None = None) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set); exit code 0 on a clean shutdown."""
    from exporter.collector import build_registry
    from exporter.sources import create_source

    names: Sequence[str] = args.sources or ()
    if not names:
        return _error(f"at least one --source is required; known sources: {', '.join(known_sources())}")
    if len(set(names)) != len(names):
        return _error(f"--source given twice: {' '.join(names)}")

    try:  # before any source starts: a bad web config must not leave a half-started exporter
        web = load_web_config(getattr(args, "web_config_file", None))
    except WebConfigError as exc:
        return _error(str(exc))
    sources = []
    try:
        for name in names:
            t0 = time.perf_counter()
            sources.append(create_source(name, args))
            log.info("source %s: %s, ready in %.0f ms", name, describe_source(name, args),
                     (time.perf_counter() - t0) * 1000)
    except (SourceConfigError, ValueError, KeyError, OSError, ImportError) as exc:
        for s in sources:
            s.close()
        return _error(f"source {name}: {exc}")

    try:
        interval = getattr(args, "collect_interval", DEFAULT_COLLECT_INTERVAL)
        if interval < 0:
            raise ValueError("--collect-interval must be >= 0")
        registry, collector = build_registry(sources, dict(getattr(args, "precedence", ())), interval=interval)
    except ValueError as exc:
        for s in sources:
            s.close()
        return _error(str(exc))
    host, port = args.listen
    try:
        server = make_server(host, port, make_app(registry, collector), web)
    except OSError as exc:
        collector.close()
        return _error(f"cannot listen on {host or '*'}:{port}: {exc}")

    # The first collection before serving: says in the log whether each source works, and the
    # first scrape gets data instead of waiting for it (collect() starts the background thread).
    list(registry.collect())
    for name, (up, series) in collector.last.items():
        (log.info if up else log.warning)("source %s: %s, %d series", name, "up" if up else "DOWN", series)

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.2}, name="http", daemon=True)
    thread.start()
    bound_host, bound_port = server.server_address[:2]
    shown = f"[{bound_host}]" if ":" in bound_host else bound_host
    log.info("truegpu exporter %s listening on %s://%s:%d/metrics%s", __version__, web.scheme, shown, bound_port,
             " (basic auth)" if web.users else "")
    try:
        while not stop.wait(1.0):
            pass
    finally:
        log.info("shutting down")
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
        collector.close()
    log.info("stopped")
    return 0
