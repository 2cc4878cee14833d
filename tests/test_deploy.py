"""The shipped stack files are valid for the real tools that will read them."""

from __future__ import annotations

import subprocess

import yaml

from tests.conftest import ROOT


def test_prometheus_config_passes_promtool(promtool: str):
    result = subprocess.run(
        [promtool, "check", "config", str(ROOT / "deploy" / "prometheus.yml")], capture_output=True, text=True
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_compose_exporter_command_parses_with_our_cli():
    from truegpu.cli import build_parser

    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    command = compose["services"]["exporter"]["command"]
    assert command[0] == "truegpu"
    args = build_parser().parse_args(command[1:])
    assert args.command == "exporter"
