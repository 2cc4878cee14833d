"""A throw-away PKI for TLS tests (the real openssl CLI): a CA, a server certificate for 127.0.0.1, a
client certificate, an unrelated CA; and an exporter-toolkit web config using them."""

from __future__ import annotations

import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import bcrypt
import yaml

USER, PASSWORD = "prometheus", "s3cret-scrape"


def _openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True, timeout=60)


def _ca(d: Path, name: str) -> None:
    _openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
             "-keyout", f"{name}.key", "-out", f"{name}.crt", cwd=d)


def _leaf(d: Path, name: str, ca: str, ext: str) -> None:
    (d / f"{name}.ext").write_text(ext)
    _openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}", "-keyout", f"{name}.key",
             "-out", f"{name}.csr", cwd=d)
    _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{ca}.crt", "-CAkey", f"{ca}.key", "-CAcreateserial",
             "-days", "2", "-extfile", f"{name}.ext", "-out", f"{name}.crt", cwd=d)


@contextmanager
def made_pki() -> Iterator[Path]:
    """A CA, a server certificate for 127.0.0.1, a client certificate, and an unrelated CA."""
    with tempfile.TemporaryDirectory(prefix="tg-pki-") as tmp:
        d = Path(tmp)
        _ca(d, "ca")
        _ca(d, "other-ca")
        _leaf(d, "server", "ca", "subjectAltName=IP:127.0.0.1\nextendedKeyUsage=serverAuth\n")
        _leaf(d, "client", "ca", "extendedKeyUsage=clientAuth\n")
        yield d


def web_config(d: Path, **tls: str) -> Path:
    hashed = bcrypt.hashpw(PASSWORD.encode(), bcrypt.gensalt(rounds=4)).decode().replace("$2b$", "$2y$", 1)
    cfg = {"tls_server_config": {"cert_file": "server.crt", "key_file": "server.key", **tls},
           "http_server_config": {"headers": {"Strict-Transport-Security": "max-age=31536000"}},
           "basic_auth_users": {USER: hashed}}
    path = d / "web.yml"
    path.write_text(yaml.safe_dump(cfg))
    return path
