"""``truegpu serve``: the analyzer as a service, re-analyzing Prometheus every interval.

Serves the latest results on /metrics (analyzer/output_schema.py), the loop's state on
/healthz, the JSON API (/api/findings, /api/scores, /api/reports/cost; analyzer/service/) and
an HTML overview on / through uvicorn; SIGTERM/SIGINT stop both cleanly (exit 0).

The API needs a bearer token (``--api-token-file``); ``--no-auth`` serves it open (logged as a
warning). With neither, the API answers 403 and only /metrics and /healthz work.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from analyzer.cli.analyze import (
    _arg,
    _client_kwargs,
    add_prometheus_arguments,
    add_range_arguments,
    add_shard_argument,
    add_site_argument,
)
from analyzer.data.budget import check_window
from analyzer.service.loop import DEFAULT_INTERVAL, DEFAULT_STEP, DEFAULT_WINDOW
from analyzer.site import load_site
from exporter.server import parse_listen
from exporter.timeparse import parse_positive_duration

if TYPE_CHECKING:
    from analyzer.service.state import StateFile

log = logging.getLogger(__name__)

DEFAULT_PORT = 9836
DEFAULT_LISTEN = f":{DEFAULT_PORT}"
DEFAULT_ROLLUP_INTERVAL = 3600.0


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "serve", help="run the analyzer as a service: analyze Prometheus every interval, serve /metrics and the API",
        description="Every --interval, analyze the last --window of GPU telemetry in a Prometheus-compatible "
        "API and publish the open findings, job and fleet utilization and the analyzer's health on /metrics "
        "(for Prometheus to scrape, alert on and graph) and /healthz; findings, scores and cost reports on "
        "/api/findings, /api/scores and /api/reports/cost (bearer token: --api-token-file; docs on /docs) and an "
        "overview page on /.",
    )
    p.add_argument("--prometheus", metavar="URL", required=True,
                   help="Prometheus, Thanos, Mimir or VictoriaMetrics base URL")
    p.add_argument("--listen", type=parse_listen, default=parse_listen(DEFAULT_LISTEN), metavar="[HOST]:PORT",
                   help=f"address to serve on: :PORT, HOST:PORT or [IPV6]:PORT (default {DEFAULT_LISTEN})")
    loop = p.add_argument_group("analysis")
    loop.add_argument("--interval", type=_arg(parse_positive_duration), default=DEFAULT_INTERVAL,
                      help=f"how often to analyze, e.g. 60s, 5m (default {DEFAULT_INTERVAL:g}s)")
    loop.add_argument("--window", type=_arg(parse_positive_duration), default=DEFAULT_WINDOW,
                      help=f"how much history each run analyzes, ending now (default {DEFAULT_WINDOW / 60:g}m)")
    loop.add_argument("--step", type=_arg(parse_positive_duration), default=DEFAULT_STEP,
                      help=f"analysis resolution (default {DEFAULT_STEP:g}s)")
    add_range_arguments(loop, "with --end: analyze this fixed past range once and serve it, e.g. backfilled "
                        "history; default: the last --window, every --interval", files=False)
    loop.add_argument("--kinds", type=lambda s: [k for k in s.split(",") if k], default=None,
                      help="comma-separated finding kinds to run (default: all)")
    loop.add_argument("--job-label", help="label naming the job (e.g. hpc_job); default: derived from the pod")
    add_site_argument(loop)
    add_shard_argument(loop)
    loop.add_argument("--stale-after", type=_arg(parse_positive_duration), default=None,
                      help="/healthz reports stale when the last good analysis is older (default 2 x interval + 60s)")
    loop.add_argument("--state-file", type=Path, metavar="FILE",
                      help="keep the findings' ids and the detectors' carried evidence here, rewritten after each "
                      "run, so a restart goes on where it stopped (default: none; a restart starts afresh)")
    api = p.add_argument_group("API and authentication")
    api.add_argument("--api-token-file", type=Path, metavar="FILE",
                     help="file holding the bearer token /api/* and / require (cost data is sensitive)")
    api.add_argument("--no-auth", action="store_true",
                     help="serve /api/* and / without authentication (trusted networks only; logged as a warning)")
    api.add_argument("--protect-metrics", action="store_true",
                     help="require the API token on /metrics too (default: open, for Prometheus)")
    api.add_argument("--protect-healthz", action="store_true",
                     help="require the API token on /healthz too (default: open, for probes)")
    api.add_argument("--web-config-file", metavar="FILE",
                     help="TLS (incl. mTLS), response headers and bcrypt basic-auth users for /metrics, /healthz "
                     "and /readyz, in the Prometheus exporter-toolkit format (the exporter's file works as is)")
    cost = p.add_argument_group("cost")
    cost.add_argument("--prices", type=Path, metavar="FILE",
                      help="price catalog YAML (default: the illustrative fixtures/prices/default.yaml)")
    cost.add_argument("--team-map", type=Path, metavar="FILE", help="namespace -> team map for group_by=team")
    cost.add_argument("--rollup-store", metavar="URL_OR_PATH",
                      help="keep daily cost rollups here (SQLite file, sqlite:///path or postgresql://...): the "
                      "current day is rewritten every --rollup-interval and each day once more after it closes; "
                      "/api/reports/cost reads it for windows longer than --window")
    cost.add_argument("--rollup-interval", type=_arg(parse_positive_duration), default=DEFAULT_ROLLUP_INTERVAL,
                      help="how often the current day's rollup is rewritten "
                      f"(default {DEFAULT_ROLLUP_INTERVAL / 60:g}m)")
    # The same Prometheus connection options as `truegpu analyze` (read by analyzer.cli.analyze._client_kwargs).
    add_prometheus_arguments(p.add_argument_group("Prometheus"))
    p.set_defaults(func=run)


def read_token(path: Path) -> str:
    """The API token: the file's content without surrounding whitespace; refuses an empty one."""
    try:
        token = path.read_text(encoding="utf-8").strip()
    except (OSError, UnicodeDecodeError) as exc:
        raise ValueError(f"--api-token-file {path}: cannot read: {exc}") from None
    if not token:
        raise ValueError(f"--api-token-file {path} is empty")
    if any(c.isspace() or ord(c) < 0x20 for c in token):
        raise ValueError(f"--api-token-file {path}: the token must be one word (no spaces or control characters)")
    return token


def api_settings(args: argparse.Namespace, loader: Any, site: Any = None) -> tuple[Any, Any]:
    """(ApiSettings, the after-run rollup hook or None) from the flags; ValueError on a bad combination."""
    from analyzer.finops.rollups import RollupWriter
    from analyzer.service.settings import ApiSettings

    if args.no_auth and args.api_token_file:
        raise ValueError("--no-auth and --api-token-file exclude each other")
    token = read_token(args.api_token_file) if args.api_token_file else None
    if (args.protect_metrics or args.protect_healthz) and token is None:
        raise ValueError("--protect-metrics/--protect-healthz need --api-token-file")
    from analyzer.finops import load_catalog, load_team_map

    catalog = load_catalog(args.prices)  # CatalogError is a ValueError
    team_map = load_team_map(args.team_map) if args.team_map else None
    rollup = None
    if args.rollup_store:
        from analyzer.finops.store import open_store

        try:
            open_store(args.rollup_store).close()  # fail at start-up, not at midnight
        except Exception as exc:  # StoreError, sqlite3/psycopg errors, a missing driver
            raise ValueError(f"--rollup-store {args.rollup_store}: {exc}") from None
        rollup = RollupWriter(loader, args.rollup_store, catalog, team_map=team_map, kinds=args.kinds,
                              every=args.rollup_interval, site=site)
    settings = ApiSettings(token=token, no_auth=args.no_auth, protect_metrics=args.protect_metrics,
                           protect_healthz=args.protect_healthz, catalog=catalog, team_map=team_map,
                           store=args.rollup_store, tokens=site.tokens)
    return settings, rollup


def state_file(args: argparse.Namespace) -> StateFile | None:
    """The StateFile of ``--state-file`` (None without, or for a fixed range); ValueError when unwritable."""
    if args.state_file is None or args.start is not None or args.end is not None:
        return None
    from analyzer.service.state import StateFile

    state = StateFile(args.state_file, {"window": args.window, "step": args.step, "job_label": args.job_label,
                                        "kinds": sorted(args.kinds) if args.kinds else None,
                                        "shard": str(args.shard) if args.shard else None})
    state.check_writable()
    state.claim()
    return state


def _error(message: str) -> int:
    print(f"truegpu serve: error: {message}", file=sys.stderr)
    return 2


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; "" is every interface (IPv6 dual stack when available)."""
    if host == "":
        try:
            sock = socket.socket(socket.AF_INET6, socket.SOCK_STREAM)
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
            addr: tuple[Any, ...] = ("::", port)
        except OSError:
            sock, addr = socket.socket(socket.AF_INET, socket.SOCK_STREAM), ("0.0.0.0", port)
    else:
        family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)[0][0]
        sock, addr = socket.socket(family, socket.SOCK_STREAM), (host, port)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(addr)
        sock.listen(128)
        sock.set_inheritable(True)
    except OSError:
        sock.close()
        raise
    return sock


def run(args: argparse.Namespace, stop: threading.Event | None = None,
        ready: Any = None) -> int:
    """Serve until SIGTERM/SIGINT (or ``stop`` is set); exit code 0 on a clean shutdown.

    ``ready(service, (host, port))`` is called once the HTTP server accepts connections (tests).
    """
    import uvicorn

    from analyzer.service import AnalyzerService, prometheus_loader
    from analyzer.service.app import create_app
    from analyzer.service.web import secured
    from exporter.webconfig import load_web_config

    try:
        fixed = None
        if args.start is not None or args.end is not None:
            if args.start is None or args.end is None:
                raise ValueError("a fixed range needs both --start and --end")
            fixed = (args.start, args.end)
        now = time.time()
        check_window(*(fixed or (now - args.window, now)), args.step)  # refuse at start, not at the first tick
        reading = {"matchers": dict(args.matcher) or None, "job_label": args.job_label, **_client_kwargs(args)}
        if args.shard:  # one replica of N: its workloads and hosts (analyzer.data.shard)
            from analyzer.data.shard import KeptReads, shard_loader

            loader = shard_loader(args.prometheus, args.step, args.shard, **reading)
        else:
            loader = prometheus_loader(args.prometheus, args.step, **reading)
        if args.kinds:
            from analyzer.detectors import load_detectors

            unknown = sorted(set(args.kinds) - set(load_detectors()))
            if unknown:
                raise ValueError(f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(sorted(load_detectors()))}")
        site = load_site(args.site)
        web = load_web_config(args.web_config_file)
        settings, rollup = api_settings(args, loader, site)  # the rollups read whole days: the plain loader
        ticks = loader
        if fixed is None and args.shard:  # each tick reads only its new steps (each of the shard's reads)
            ticks = shard_loader(args.prometheus, args.step, args.shard, kept=KeptReads(), **reading)
        elif fixed is None:
            from analyzer.data.window import WindowLoader

            ticks = WindowLoader(prometheus_loader(args.prometheus, args.step, remember=True, **reading))
        service = AnalyzerService(ticks, url=args.prometheus, interval=args.interval, window=args.window,
                                  step=args.step, kinds=args.kinds, stale_after=args.stale_after,
                                  on_result=rollup, fixed=fixed, site=site, state=state_file(args))
    except (ValueError, OSError) as exc:
        return _error(str(exc))
    if settings.no_auth:
        log.warning("--no-auth: /api/* and / (findings, scores, COST data) are served WITHOUT authentication")
    elif settings.token is None:
        log.warning("no --api-token-file: /api/* and / answer 403; only /metrics and /healthz are served")
    host, port = args.listen
    try:
        sock = bind(host, port)
    except OSError as exc:
        if service.state is not None:
            service.state.release()
        return _error(f"cannot listen on {host or '*'}:{port}: {exc}")

    config = uvicorn.Config(secured(create_app(service, settings), web), log_config=None, access_log=False,
                            lifespan="off", timeout_graceful_shutdown=5)
    if web.tls is not None:  # the web config's own context (minimum version, client CA), not uvicorn's defaults
        config.load()
        config.ssl = web.tls
    server = uvicorn.Server(config)
    http = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="http", daemon=True)

    stop = stop or threading.Event()
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda signum, frame: stop.set())
    http.start()
    service.start()
    bound = sock.getsockname()[:2]
    shown = f"[{bound[0]}]" if ":" in bound[0] else bound[0]
    try:
        while not server.started and http.is_alive() and not stop.wait(0.05):
            pass
        if not http.is_alive():
            return _error("HTTP server stopped unexpectedly; see the log above")
        log.info("truegpu serve: analyzing the last %gs of %s every %gs; listening on %s://%s:%d/metrics",
                 args.window, args.prometheus, args.interval, web.scheme, shown, bound[1])
        if ready is not None:
            ready(service, bound)
        while not stop.wait(1.0):
            if not http.is_alive():
                return _error("HTTP server stopped unexpectedly; see the log above")
    finally:
        log.info("shutting down")
        server.should_exit = True
        http.join(timeout=10)
        service.stop()
        sock.close()
        if service.state is not None:
            service.state.release()
    log.info("stopped")
    return 0
