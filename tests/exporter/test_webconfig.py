"""``--web-config-file``: the exporter over TLS with client certificates and bcrypt basic auth, in the
exporter-toolkit format, scraped by a real Prometheus; wrong credentials, a wrong CA and a missing
client certificate are refused; bad files are errors naming the key."""

from __future__ import annotations

import socket
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import pytest
import requests
import yaml

from exporter.webconfig import WebConfigError, load_web_config
from tests.conftest import ROOT, free_port
from tests.pki import PASSWORD, USER, web_config
from tests.realprom import running

TRUEGPU = str(ROOT / ".venv" / "bin" / "truegpu")


@contextmanager
def _exporter(web: Path, log: Path) -> Iterator[str]:
    port = free_port()
    proc = subprocess.Popen([TRUEGPU, "exporter", "--source", "simulated", "--scenario", "healthy-fleet",
                             "--listen", f"127.0.0.1:{port}", "--web-config-file", str(web)],
                            stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"https://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, log.read_text()
            try:
                requests.get(url + "/healthz", timeout=2, verify=str(web.parent / "ca.crt"))
                break
            except requests.exceptions.SSLError:  # TLS answers (and refuses a client without a certificate)
                break
            except requests.ConnectionError:
                assert time.monotonic() < deadline, log.read_text()
                time.sleep(0.1)
        yield url
    finally:
        proc.terminate()
        proc.wait(15)


def test_requests_need_tls_the_ca_a_client_certificate_and_the_password(pki: Path, tmp_path: Path) -> None:
    web = web_config(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file="ca.crt")
    client = (str(pki / "client.crt"), str(pki / "client.key"))
    with _exporter(web, tmp_path / "exporter.log") as url:
        ok = requests.get(url + "/metrics", verify=pki / "ca.crt", cert=client, auth=(USER, PASSWORD), timeout=10)
        assert ok.status_code == 200 and "truegpu_exporter_source_up" in ok.text
        assert ok.headers["Strict-Transport-Security"] == "max-age=31536000"
        wrong = requests.get(url + "/metrics", verify=pki / "ca.crt", cert=client, auth=(USER, "nope"), timeout=10)
        assert wrong.status_code == 401 and wrong.headers["WWW-Authenticate"].startswith("Basic")
        assert requests.get(url + "/healthz", verify=pki / "ca.crt", cert=client, timeout=10).status_code == 401
        with pytest.raises(requests.exceptions.SSLError):
            requests.get(url + "/metrics", verify=pki / "other-ca.crt", cert=client, auth=(USER, PASSWORD), timeout=10)
        with pytest.raises(requests.exceptions.RequestException):  # mTLS: no client certificate, no handshake
            requests.get(url + "/metrics", verify=pki / "ca.crt", auth=(USER, PASSWORD), timeout=10)
        with pytest.raises(requests.exceptions.RequestException):  # plain HTTP on the TLS port
            requests.get(url.replace("https", "http") + "/metrics", timeout=10)
        host, port = url.removeprefix("https://").rsplit(":", 1)
        socket.create_connection((host.strip("[]"), int(port)), timeout=10).close()  # a kubelet tcpSocket probe
        # the exporter keeps serving after refusing all of those
        again = requests.get(url + "/metrics", verify=pki / "ca.crt", cert=client, auth=(USER, PASSWORD), timeout=10)
        assert again.status_code == 200
    logged = (tmp_path / "exporter.log").read_text()
    refused = [line for line in logged.splitlines() if "TLS handshake" in line]
    assert any("UNKNOWN_CA" in line for line in refused) and any("HTTP_REQUEST" in line for line in refused)
    assert not any("EOF" in line for line in refused), refused  # a TCP probe is routine: debug, not info


def test_real_prometheus_scrapes_over_tls_with_basic_auth(pki: Path, tmp_path: Path, prometheus_bin: str) -> None:
    """Prometheus' own TLS and basic-auth client: the right settings give up=1, each wrong one up=0."""
    web = web_config(pki, client_auth_type="RequireAndVerifyClientCert", client_ca_file="ca.crt",
                      min_version="TLS12")
    with _exporter(web, tmp_path / "exporter.log") as url:
        target = url.removeprefix("https://")
        good_tls = {"ca_file": str(pki / "ca.crt"), "cert_file": str(pki / "client.crt"),
                    "key_file": str(pki / "client.key")}
        jobs = {
            "good": {"tls_config": good_tls, "basic_auth": {"username": USER, "password": PASSWORD}},
            "bad-password": {"tls_config": good_tls, "basic_auth": {"username": USER, "password": "nope"}},
            "wrong-ca": {"tls_config": {**good_tls, "ca_file": str(pki / "other-ca.crt")},
                         "basic_auth": {"username": USER, "password": PASSWORD}},
            "no-client-cert": {"tls_config": {"ca_file": str(pki / "ca.crt")},
                               "basic_auth": {"username": USER, "password": PASSWORD}},
        }
        config = {"global": {"scrape_interval": "1s", "scrape_timeout": "900ms"},
                  "scrape_configs": [{"job_name": name, "scheme": "https", "static_configs": [{"targets": [target]}],
                                      **settings} for name, settings in jobs.items()]}
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump(config))
        port = free_port()
        argv = [prometheus_bin, f"--config.file={tmp_path / 'prometheus.yml'}",
                f"--storage.tsdb.path={tmp_path / 'db'}", f"--web.listen-address=127.0.0.1:{port}"]
        with running(argv, tmp_path / "prometheus.log", f"http://127.0.0.1:{port}/-/ready"):
            health: dict[str, tuple[str, str]] = {}
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                targets = requests.get(f"http://127.0.0.1:{port}/api/v1/targets", timeout=5).json()["data"]
                health = {t["labels"]["job"]: (t["health"], t["lastError"]) for t in targets["activeTargets"]}
                if len(health) == len(jobs) and all(h != "unknown" for h, _ in health.values()):
                    break
                time.sleep(0.5)
    assert health["good"] == ("up", ""), health
    assert health["bad-password"][0] == "down" and "401" in health["bad-password"][1]
    assert health["wrong-ca"][0] == "down" and "certificate" in health["wrong-ca"][1]
    assert health["no-client-cert"][0] == "down", health


def test_basic_auth_without_tls(tmp_path: Path) -> None:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode()
    web = tmp_path / "web.yml"
    web.write_text(yaml.safe_dump({"basic_auth_users": {USER: hashed}}))
    config = load_web_config(web)
    assert config.tls is None and config.scheme == "http" and list(config.users) == [USER]


@pytest.mark.parametrize(("cfg", "message"), [
    ({"tls_config": {}}, r"unknown key\(s\) tls_config"),
    ({"basic_auth_users": {"u": "plain-password"}}, r"basic_auth_users.u: expected a bcrypt hash"),
    ({"tls_server_config": {"cert_file": "server.crt"}}, r"cert_file and key_file are both required"),
    ({"tls_server_config": {"cert_file": "missing.crt", "key_file": "server.key"}},
     r"tls_server_config.cert_file: .*missing.crt does not exist"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "client_auth_type": "RequireAndVerifyClientCert"}}, r"needs client_ca_file"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", "min_version": "TLS11"}},
     r"min_version: 'TLS11' is not one of TLS12, TLS13"),
    ({"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key",
                            "cipher_suites": ["TLS_RSA_WITH_RC4_128_SHA"]}}, r"cipher_suites: TLS_RSA_WITH_RC4"),
    ({"http_server_config": {"headers": {"X-Powered-By": "me"}}}, r"headers: unknown key\(s\) X-Powered-By"),
])
def test_bad_web_configs_name_the_key(pki: Path, cfg: dict, message: str) -> None:
    path = pki / "bad.yml"
    path.write_text(yaml.safe_dump(cfg))
    with pytest.raises(WebConfigError, match=message):
        load_web_config(path)


def test_the_exporter_refuses_to_start_on_a_badweb_config(tmp_path: Path) -> None:
    bad = tmp_path / "web.yml"
    bad.write_text("basic_auth_users: {u: plain}\n")
    out = subprocess.run([TRUEGPU, "exporter", "--source", "simulated", "--scenario", "healthy-fleet",
                          "--listen", "127.0.0.1:0",
                          "--web-config-file", str(bad)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "basic_auth_users.u: expected a bcrypt hash" in out.stderr
