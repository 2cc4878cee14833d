"""``truegpu serve --web-config-file``: the exporter's web config file works for the analyzer: TLS on its
socket, the file's headers on every answer, basic auth on /metrics, /healthz and /readyz, bearer tokens
still on the API."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest
import requests

from tests.pki import PASSWORD, USER, web_config


def _serve(argv: list[str]) -> tuple[threading.Event, threading.Thread, dict]:
    from analyzer.cli import serve as serve_cli
    from truegpu.cli import build_parser

    args = build_parser(["serve", *argv]).parse_args(["serve", *argv])
    stop, started, holder = threading.Event(), threading.Event(), {}

    def ready(service, bound) -> None:
        holder["url"] = f"https://127.0.0.1:{bound[1]}"
        started.set()

    def target() -> None:
        holder["rc"] = serve_cli.run(args, stop=stop, ready=ready)
        started.set()

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    assert started.wait(30) and "url" in holder, f"truegpu serve exited with {holder.get('rc')}"
    return stop, thread, holder


def test_serve_over_tls_with_basic_auth_on_scrapes_and_tokens_on_the_api(pki: Path, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("api-token\n")
    web = web_config(pki)
    stop, thread, holder = _serve(["--prometheus", "http://127.0.0.1:9", "--listen", "127.0.0.1:0",
                                   "--interval", "1h", "--api-token-file", str(token), "--web-config-file", str(web)])
    url, ca = holder["url"], str(pki / "ca.crt")
    try:
        scraped = requests.get(url + "/metrics", verify=ca, auth=(USER, PASSWORD), timeout=10)
        assert scraped.status_code == 200 and "truegpu_analyzer_runs_total" in scraped.text
        assert scraped.headers["Strict-Transport-Security"] == "max-age=31536000"
        for path in ("/metrics", "/healthz", "/readyz"):
            refused = requests.get(url + path, verify=ca, auth=(USER, "wrong"), timeout=10)
            assert refused.status_code == 401 and refused.headers["WWW-Authenticate"].startswith("Basic"), path
        assert requests.get(url + "/healthz", verify=ca, auth=(USER, PASSWORD), timeout=10).status_code == 200
        # the API keeps its bearer token (no results yet: 503 once authenticated, 401 without)
        assert requests.get(url + "/api/findings", verify=ca, timeout=10).status_code == 401
        api = requests.get(url + "/api/findings", verify=ca, headers={"Authorization": "Bearer api-token"}, timeout=10)
        assert api.status_code == 503 and api.headers["Strict-Transport-Security"] == "max-age=31536000"
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(url + "/metrics", verify=str(pki / "other-ca.crt"), auth=(USER, PASSWORD), timeout=10)
        with pytest.raises(requests.exceptions.RequestException):
            requests.get(url.replace("https", "http") + "/metrics", timeout=10)
    finally:
        stop.set()
        thread.join(30)
    assert holder["rc"] == 0


def test_serve_refuses_a_bad_web_config(tmp_path: Path) -> None:
    from analyzer.cli import serve as serve_cli
    from truegpu.cli import build_parser

    bad = tmp_path / "web.yml"
    bad.write_text("tls_server_config: {cert_file: nope.crt, key_file: nope.key}\n")
    argv = ["serve", "--prometheus", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--web-config-file", str(bad)]
    assert serve_cli.run(build_parser(argv).parse_args(argv)) == 2
