"""A throwaway real PostgreSQL server for tests: initdb into a temp dir, serve on loopback, remove.

Never skipped: when Debian's server binaries (initdb, postgres) or the psycopg driver are
missing the test fails saying how to install them (``make test`` installs them). PostgreSQL
refuses to run as root, so as root the server runs as the ``postgres`` system user (Debian's
postgresql package creates it) in a directory chowned to it.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.conftest import free_port

INSTALL_HINT = (
    "run `make test` (installs Debian's postgresql) or `apt-get install -y postgresql`"
)
SERVER_USER = "postgres"


def find_pg_bindir() -> Path:
    """The directory holding initdb and postgres (Debian keeps them off PATH, per major version)."""
    candidates: list[Path] = []
    pg_config = shutil.which("pg_config")
    if pg_config:
        out = subprocess.run([pg_config, "--bindir"], capture_output=True, text=True)
        if out.returncode == 0 and out.stdout.strip():
            candidates.append(Path(out.stdout.strip()))
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=lambda p: int(Path(p).parent.name)
                      if Path(p).parent.name.isdigit() else 0, reverse=True)
    candidates += [Path(p) for p in versions]
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(Path(os.path.realpath(initdb)).parent)
    for bindir in candidates:
        if (bindir / "initdb").is_file() and (bindir / "postgres").is_file():
            return bindir
    pytest.fail(f"PostgreSQL server binaries (initdb, postgres) are not installed; {INSTALL_HINT}", pytrace=False)


def _require_psycopg():
    try:
        import psycopg
    except ImportError:
        pytest.fail("the psycopg 3 driver is not installed: pip install 'psycopg[binary]>=3.1' "
                    "(or `make install`)", pytrace=False)
    return psycopg


def _server_identity() -> dict:
    """Popen kwargs that drop root to the postgres user; nothing when already unprivileged."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam(SERVER_USER)
    except KeyError:
        pytest.fail(f"running as root and there is no {SERVER_USER!r} system user for PostgreSQL to run as; "
                    f"{INSTALL_HINT} (the package creates it)", pytrace=False)
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


def _wait_ready(psycopg, dsn: str, proc: subprocess.Popen, log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    last = ""
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(f"postgres exited with {proc.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with psycopg.connect(dsn, connect_timeout=2):
                return
        except psycopg.OperationalError as exc:
            last = str(exc)
        time.sleep(0.1)
    pytest.fail(f"postgres not ready after {timeout:g} s ({last}):\n{log.read_text()[-3000:]}")


@contextmanager
def postgres_server(dbname: str = "truegpu_test") -> Iterator[str]:
    """Start a fresh PostgreSQL, create ``dbname``; yields its ``postgresql://`` URL; always stops and removes it."""
    psycopg = _require_psycopg()
    bindir = find_pg_bindir()
    ident = _server_identity()
    # Our own dir under /tmp (not pytest's root-only tmp tree) so the postgres user can reach it.
    root = Path(tempfile.mkdtemp(prefix="truegpu-pg-"))
    data, sockdir, log = root / "data", root / "sock", root / "postgres.log"
    sockdir.mkdir()
    log.touch()
    if ident:
        for p in (root, sockdir, log):
            os.chown(p, ident["user"], ident["group"])
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    proc: subprocess.Popen | None = None
    try:
        init = subprocess.run(
            [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8",
             "--locale=C.UTF-8", "--no-sync"],
            capture_output=True, text=True, timeout=120, env=env, cwd=root, **ident,
        )
        if init.returncode != 0:
            pytest.fail(f"initdb failed ({init.returncode}):\n{init.stdout[-2000:]}\n{init.stderr[-2000:]}")
        port = free_port()
        with open(log, "a") as log_f:
            proc = subprocess.Popen(
                [str(bindir / "postgres"), "-D", str(data), "-k", str(sockdir), "-p", str(port),
                 "-h", "127.0.0.1", "-c", "max_connections=50", "-c", "fsync=on"],
                stdout=log_f, stderr=subprocess.STDOUT, env=env, cwd=root, **ident,
            )
        admin = f"postgresql://postgres@127.0.0.1:{port}/postgres"
        _wait_ready(psycopg, admin, proc, log)
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{dbname}"')  # dbname is ours, not user input
        yield f"postgresql://postgres@127.0.0.1:{port}/{dbname}"
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)  # "fast" shutdown: ends client sessions
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        shutil.rmtree(root, ignore_errors=True)


def create_database(server_url: str, name: str) -> str:
    """A new empty database on the server behind ``server_url``; returns its URL (``name`` is test-chosen)."""
    psycopg = _require_psycopg()
    with psycopg.connect(server_url, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return server_url.rsplit("/", 1)[0] + "/" + name
