"""Rendered Kubernetes overlays and one checkov run, shared by test_kubernetes.py and test_images.py.

The tools are real and never skipped: a missing kubectl or checkov fails with how to get it.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import ROOT

KUBE = ROOT / "deploy" / "kubernetes"
README = ROOT / "README.md"
#: checkov lives in its own venv (make test installs it): its pins would downgrade the project's packaging/pytest.
CHECKOV_VENV = ROOT / ".venv" / "checkov" / "bin" / "checkov"
#: libyaml when present: the rendered overlays are about 1 MB each.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
DOCKERFILES = ("Dockerfile.exporter", "Dockerfile.analyzer")


def readme_kubernetes_commands() -> list[str]:
    """The shell lines of the README's "Kubernetes" section (its fenced sh blocks), comments dropped."""
    text = README.read_text()
    section = re.search(r"^## Kubernetes\n(.*?)(?=^## )", text, re.M | re.S)
    assert section, "README.md has no '## Kubernetes' section"
    lines = []
    for block in re.findall(r"```sh\n(.*?)```", section.group(1), re.S):
        for line in block.splitlines():
            line = line.split(" #", 1)[0].strip()
            if line and not line.startswith("#"):
                lines.append(line)
    return lines


def installed_dirs() -> list[str]:
    """What the README installs: the directory of every `kubectl apply -k DIR` line."""
    return [line.split()[-1] for line in readme_kubernetes_commands() if line.startswith("kubectl apply -k ")]


def kubectl() -> str:
    path = shutil.which("kubectl")
    if not path:
        pytest.fail("kubectl is not installed (its built-in kustomize renders deploy/kubernetes); "
                    "install kubectl >= 1.27, e.g. `apt-get install kubectl` from the Kubernetes apt repository",
                    pytrace=False)
    return path


def checkov() -> str:
    if CHECKOV_VENV.exists():
        return str(CHECKOV_VENV)
    path = shutil.which("checkov")
    if not path:
        pytest.fail("checkov is not installed: run `make test` (it puts checkov, pinned in "
                    "requirements/checkov.txt, in .venv/checkov)", pytrace=False)
    return path


@pytest.fixture(scope="session")
def rendered(tmp_path_factory) -> dict[str, list[dict[str, Any]]]:
    """`kubectl kustomize DIR` of every directory the README installs -> its objects.

    The YAML is also written to rendered/<name>.yaml for checkov."""
    out = tmp_path_factory.mktemp("rendered")
    dirs = installed_dirs()
    procs = {rel: subprocess.Popen([kubectl(), "kustomize", rel], cwd=ROOT, stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True) for rel in dirs}
    result: dict[str, list[dict[str, Any]]] = {}
    for rel, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, f"kubectl kustomize {rel} failed:\n{stderr}"
        name = Path(rel).name
        (out / f"{name}.yaml").write_text(stdout)
        result[name] = [d for d in yaml.load_all(stdout, Loader=_LOADER) if d]
    result["_dir"] = out  # type: ignore[assignment]
    return result


@pytest.fixture(scope="session")
def checkov_report(rendered, tmp_path_factory) -> dict[str, Any]:
    """One checkov run over every rendered overlay (kubernetes) and both Dockerfiles (dockerfile):
    ``{framework: report}``, plus ``seconds``."""
    scan = tmp_path_factory.mktemp("scan")
    for path in Path(rendered["_dir"]).glob("*.yaml"):  # type: ignore[arg-type]
        shutil.copy(path, scan / path.name)
    for name in DOCKERFILES:
        shutil.copy(ROOT / name, scan / name)
    started = time.monotonic()
    proc = subprocess.run(
        [checkov(), "-d", str(scan), "--framework", "kubernetes", "dockerfile", "--output", "json",
         "--compact", "--skip-download"],
        capture_output=True, text=True, timeout=600,
    )
    seconds = time.monotonic() - started
    try:
        reports = json.loads(proc.stdout)
    except json.JSONDecodeError:
        pytest.fail(f"checkov printed no JSON (exit {proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}")
    reports = reports if isinstance(reports, list) else [reports]
    by_framework = {r["check_type"]: r for r in reports}
    assert set(by_framework) == {"kubernetes", "dockerfile"}, list(by_framework)
    return {**by_framework, "seconds": seconds}
