"""A scripted HTTP peer on loopback for tests of what our clients do with its answers."""

from __future__ import annotations

import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.conftest import free_port


class Endpoint:
    """An HTTP peer on loopback (a dcgm-exporter page, a Prometheus API answer): serves ``body``
    with ``status`` and ``content_type`` after ``delay`` seconds, to GET and POST alike."""

    def __init__(self) -> None:
        self.body = b""
        self.status = 200
        self.delay = 0.0
        self.content_type = "text/plain; version=0.0.4; charset=utf-8"
        self.hits = 0
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}/metrics"
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                endpoint.hits += 1
                if endpoint.delay:
                    time.sleep(endpoint.delay)
                body = endpoint.body
                try:
                    self.send_response(endpoint.status)
                    self.send_header("Content-Type", endpoint.content_type)
                    self.send_header("Content-Length", str(len(body)))
                    self.end_headers()
                    self.wfile.write(body)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client gave up (timeout test)

            def do_POST(self) -> None:
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.do_GET()

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self.server.daemon_threads = True
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def serve(self, body: str | bytes | Path, status: int = 200) -> None:
        if isinstance(body, Path):
            body = body.read_bytes()
        self.body = body.encode() if isinstance(body, str) else body
        self.status = status

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
