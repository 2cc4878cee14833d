"""The two images, as far as can be checked without a container engine.

The exporter's locked set installs in a fresh venv, runs the exporter (real HTTP server, dcgm
source) and stays small, without numpy/pandas/scikit-learn; the locks agree with pyproject.toml;
the Dockerfiles copy what exists, install the locks with --no-deps, run non-root with a health
check, and pass checkov's dockerfile checks (the run shared with test_kubernetes.py).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT, free_port

REQUIREMENTS = ROOT / "requirements"
HEAVY = {"numpy", "pandas", "scikit-learn", "scipy"}
#: Installed size of the exporter's dependencies (pip and setuptools not counted). About 30 MB today.
MAX_EXPORTER_MB = 60


def _pins(path: Path) -> dict[str, str]:
    pins = {}
    for line in path.read_text().splitlines():
        if line and not line.startswith("#"):
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def _requirements(lines: list[str]) -> dict[str, Requirement]:
    reqs = [Requirement(line) for line in lines if line.strip() and not line.startswith("#")]
    return {canonicalize_name(r.name): r for r in reqs}


def _pyproject_dependencies() -> dict[str, Requirement]:
    return _requirements(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"])


def test_locks_satisfy_their_inputs_and_the_exporter_stays_light():
    project = _pyproject_dependencies()
    exporter_in = _requirements((REQUIREMENTS / "exporter.in").read_text().splitlines())
    for name, req in exporter_in.items():
        assert str(project.get(name)) == str(req), f"exporter.in {req} differs from pyproject.toml {project.get(name)}"
    for lock, wanted in (("exporter.txt", exporter_in), ("analyzer.txt", project)):
        pins = _pins(REQUIREMENTS / lock)
        for name, req in wanted.items():
            assert name in pins, f"requirements/{lock} misses {name}: run requirements/lock.sh"
            assert req.specifier.contains(pins[name], prereleases=True), f"{lock}: {name}=={pins[name]} vs {req}"
    assert not HEAVY & set(_pins(REQUIREMENTS / "exporter.txt")), "the exporter image must stay slim"
    assert HEAVY - {"scipy"} <= set(_pins(REQUIREMENTS / "analyzer.txt"))


def test_exporter_lock_installs_in_a_fresh_venv_runs_and_stays_small(tmp_path):
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = venv / "bin" / "python"
    install = subprocess.run(
        [str(py), "-m", "pip", "install", "-q", "--no-deps", "-r", str(REQUIREMENTS / "exporter.txt")],
        capture_output=True, text=True, timeout=600,
    )
    assert install.returncode == 0, install.stdout + install.stderr
    check = subprocess.run([str(py), "-m", "pip", "check"], capture_output=True, text=True, timeout=120)
    assert check.returncode == 0, f"the lock is not a complete set:\n{check.stdout}"
    site = next((venv / "lib").glob("python3*/site-packages"))
    size = sum(p.stat().st_size for p in site.rglob("*") if p.is_file()
               and not re.match(r"(pip|setuptools|_distutils_hack|pkg_resources)\b", p.relative_to(site).parts[0]))
    print(f"exporter dependencies: {size / 1e6:.1f} MB installed")
    assert size < MAX_EXPORTER_MB * 1e6, f"{size / 1e6:.1f} MB"
    _exporter_serves_from(py, tmp_path)


def _exporter_serves_from(py: Path, tmp_path: Path) -> None:
    """The exporter (this checkout on PYTHONPATH, nothing else) imports every module a node needs and
    serves /healthz and /metrics with the dcgm source, with no heavy module loaded."""
    env = {"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    modules = ["exporter.server", "exporter.sources.nvml", "exporter.sources.dcgm", "exporter.attribution",
               "exporter.attribution.kubernetes", "exporter.attribution.podlabels",
               "exporter.attribution.podresources.api_pb2_grpc", "grpc", "bcrypt", "pynvml"]
    probe = (
        f"import sys, importlib, json\nfor m in {modules!r}:\n    importlib.import_module(m)\n"
        "heavy = ('numpy', 'pandas', 'sklearn', 'scipy')\n"
        "print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in heavy)))\n"
    )
    proc = subprocess.run([str(py), "-c", probe], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout) == [], f"heavy modules imported by the exporter: {proc.stdout}"
    port, dead = free_port(), free_port()
    server = subprocess.Popen(
        [str(py), "-m", "truegpu", "exporter", "--source", "dcgm", "--listen", f"127.0.0.1:{port}",
         "--dcgm-url", f"http://127.0.0.1:{dead}/metrics", "--dcgm-hostname", "gpu-node-1"],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        body = _get(f"http://127.0.0.1:{port}/healthz", server)
        assert body == "ok\n"
        metrics = _get(f"http://127.0.0.1:{port}/metrics", server)
        assert 'truegpu_exporter_source_up{source="dcgm"} 0.0' in metrics, metrics[:2000]
    finally:
        server.terminate()
        server.wait(timeout=10)


def _get(url: str, server: subprocess.Popen, deadline: float = 30.0) -> str:
    end = time.monotonic() + deadline
    while True:
        try:
            with urllib.request.urlopen(url, timeout=10) as response:
                return response.read().decode()
        except OSError:
            if server.poll() is not None or time.monotonic() > end:
                out = server.stdout.read() if server.poll() is not None else ""
                raise AssertionError(f"{url} did not answer; exporter exit {server.poll()}: {out}") from None
            time.sleep(0.2)


def _instructions(name: str) -> list[tuple[str, str]]:
    text = (ROOT / name).read_text().replace("\\\n", " ")
    return [(m[1], m[2].strip()) for m in re.finditer(r"^([A-Z]+) (.+)$", text, re.M)]


def test_dockerfiles_copy_what_exists_lock_their_set_run_non_root_with_a_health_check():
    from truegpu.cli import build_parser

    ignore = (ROOT / ".dockerignore").read_text().splitlines()
    for name, lock, packages in (("Dockerfile.exporter", "exporter.txt", {"truegpu", "exporter"}),
                                 ("Dockerfile.analyzer", "analyzer.txt",
                                  {"truegpu", "exporter", "analyzer", "dashboards", "alerts", "fixtures"})):
        ins = _instructions(name)
        copied = [w for op, arg in ins if op == "COPY" and "--from" not in arg for w in arg.split()[:-1]]
        for source in copied:
            assert (ROOT / source).exists(), f"{name}: COPY {source}"
            top = source.split("/")[0]
            assert any(line.lstrip("!").startswith(top) for line in ignore if line.startswith("!")), \
                f".dockerignore leaves {source} out of the build context"
        assert {s.rstrip("/") for s in copied if (ROOT / s).is_dir()} == packages, name
        assert f"requirements/{lock}" in copied, name
        runs = " ".join(arg for op, arg in ins if op == "RUN")
        assert re.search(r"pip install --no-deps -r \S*requirements", runs), f"{name}: install the lock with --no-deps"
        (user,) = [arg for op, arg in ins if op == "USER"]
        assert not user.startswith(("0", "root")), name
        assert [op for op, _ in ins].count("HEALTHCHECK") == 1 and "/healthz" in dict(ins)["HEALTHCHECK"]
        cmd = json.loads(dict(ins)["CMD"])
        assert cmd[0] == "truegpu"
        build_parser(cmd[1:]).parse_args(cmd[1:])
    assert not (ROOT / "Dockerfile").exists(), "one Dockerfile per image"


def test_dockerfiles_pass_checkov(checkov_report):
    report = checkov_report["dockerfile"]
    failed = [(r["file_path"], r["check_id"], r["check_name"]) for r in report["results"]["failed_checks"]]
    assert not failed and not report["results"]["skipped_checks"], failed
    assert report["summary"]["resource_count"] == 2 and report["summary"]["passed"] > 20
