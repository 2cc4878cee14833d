"""The Slurm prolog/epilog and the systemd unit of deploy/: the scripts run as slurmd runs them
(environment only) and the exporter's own reader attributes what they write; the unit passes
``systemd-analyze verify``."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from exporter.attribution import Allocation, build_attributor
from tests.conftest import ROOT, find_binary

SLURM = ROOT / "deploy" / "slurm"
UNIT = ROOT / "deploy" / "systemd" / "truegpu-exporter.service"


def _run(script: str, tmp: Path, job: str, gpus: str = "", **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "SLURM_JOB_ID": job, "SLURM_JOB_GPUS": gpus,
           "TRUEGPU_JOB_DIR": str(tmp / "jobs"), "TRUEGPU_JOB_META_DIR": str(tmp / "meta"), **extra}
    return subprocess.run(["sh", str(SLURM / script)], env=env, capture_output=True, text=True, timeout=30)


def _jobs(tmp: Path) -> dict[str, Allocation | None]:
    attributor = build_attributor(slurm_dir=str(tmp / "jobs"), slurm_meta_dir=str(tmp / "meta"), ttl=0.0)
    assert attributor is not None
    attributor.refresh()
    return {gpu: attributor.lookup(f"GPU-{gpu}", gpu) for gpu in "0123"}


def test_prolog_and_epilog_keep_the_job_mapping_the_exporter_reads(tmp_path: Path) -> None:
    assert _run("truegpu-prolog.sh", tmp_path, "101", "0,1", SLURM_JOB_USER="ada", SLURM_JOB_ACCOUNT="physics",
                SLURM_JOB_PARTITION="gpu").returncode == 0
    assert _run("truegpu-prolog.sh", tmp_path, "102", "1,3").returncode == 0  # GPU 1 shared by two jobs
    jobs = _jobs(tmp_path)
    assert {g: a.job if a else None for g, a in jobs.items()} == {"0": "101", "1": "101,102", "2": None, "3": "102"}
    # dcgm-exporter's format: a file per GPU index, a job id per line; metadata kept apart
    assert sorted(p.name for p in (tmp_path / "jobs").iterdir() if not p.name.startswith(".")) == ["0", "1", "3"]
    assert (tmp_path / "jobs" / "1").read_text() == "101\n102\n"
    assert (tmp_path / "meta" / "101.env").read_text() == "job=101\nuser=ada\naccount=physics\npartition=gpu\n"
    # the exporter reads the meta files beside the mapping: job 102's prolog had no accounting to write
    assert jobs["0"].accounting == ("ada", "physics", "gpu") and jobs["3"].accounting is None
    assert jobs["1"].accounting == ("ada", "physics", "gpu")  # 101 and 102 share GPU 1: 102 adds nothing
    # the prolog run twice (requeue) records the job once
    assert _run("truegpu-prolog.sh", tmp_path, "101", "0,1").returncode == 0
    assert (tmp_path / "jobs" / "1").read_text() == "102\n101\n"
    assert _run("truegpu-epilog.sh", tmp_path, "101").returncode == 0
    jobs = _jobs(tmp_path)
    assert {g: a.job if a else None for g, a in jobs.items()} == {"0": None, "1": "102", "2": None, "3": "102"}
    assert not (tmp_path / "jobs" / "0").exists() and not (tmp_path / "meta" / "101.env").exists()
    assert _run("truegpu-epilog.sh", tmp_path, "102").returncode == 0
    assert all(a is None for a in _jobs(tmp_path).values())


def test_prolog_ignores_jobs_without_gpus_and_bad_input(tmp_path: Path) -> None:
    assert _run("truegpu-prolog.sh", tmp_path, "7").returncode == 0 and not (tmp_path / "jobs").exists()
    bad = _run("truegpu-prolog.sh", tmp_path, "8", "0,x")
    assert bad.returncode == 0 and "GPU index 'x' skipped" in bad.stderr
    assert (tmp_path / "jobs" / "0").read_text() == "8\n"
    evil = _run("truegpu-prolog.sh", tmp_path, "9;rm -rf /", "1")
    assert evil.returncode == 0 and "is not a Slurm job id" in evil.stderr and not (tmp_path / "jobs" / "1").exists()
    missing = subprocess.run(["sh", str(SLURM / "truegpu-prolog.sh")], env={"PATH": os.environ["PATH"]},
                             capture_output=True, text=True, timeout=30)
    assert missing.returncode != 0 and "SLURM_JOB_ID is not set" in missing.stderr


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    analyze = find_binary("systemd-analyze")
    truegpu = ROOT / ".venv" / "bin" / "truegpu"
    unit = tmp_path / UNIT.name
    unit.write_text(UNIT.read_text().replace("/opt/truegpu/bin/truegpu", str(truegpu)))
    out = subprocess.run([analyze, "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr
    assert "Unknown" not in out.stderr and "ignoring" not in out.stderr.lower(), out.stderr
    text = UNIT.read_text()
    for hardening in ("DynamicUser=yes", "NoNewPrivileges=yes", "CapabilityBoundingSet=\n", "ProtectSystem=strict"):
        assert hardening in text


@pytest.mark.parametrize("script", ["truegpu-prolog.sh", "truegpu-epilog.sh"])
def test_scripts_are_posix_sh(script: str) -> None:
    """slurmd runs them with /bin/sh (dash on Debian): no bashisms (checked by dash itself)."""
    dash = find_binary("dash")
    assert subprocess.run([dash, "-n", str(SLURM / script)], capture_output=True, timeout=30).returncode == 0
    assert os.access(SLURM / script, os.X_OK)
