"""The shipped stack (docker-compose.yml, deploy/, Dockerfile.*) is valid for the real tools that read it.

No container engine is needed: the compose file is checked structurally (services, mounts that
exist in the repository, ports, commands that parse with our CLI) and the files it mounts go
through the real promtool / amtool.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import subprocess
from pathlib import Path, PurePosixPath
from typing import Any

import pytest
import yaml

from alerts.rules import ANALYZER_JOB, EXPORTER_JOB
from tests.conftest import ROOT, find_binary

COMPOSE = ROOT / "docker-compose.yml"
PROMETHEUS_YML = ROOT / "deploy" / "prometheus.yml"
GRAFANA = ROOT / "deploy" / "grafana" / "provisioning"
GENERATED_RULES = ROOT / "alerts" / "generated"
DASHBOARDS = ROOT / "dashboards" / "generated"
SERVICES = {"exporter", "exporter-nvml", "analyzer", "prometheus", "alertmanager", "grafana"}


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def prometheus_config() -> dict[str, Any]:
    return yaml.safe_load(PROMETHEUS_YML.read_text())


def _mounts(service: dict[str, Any]) -> list[tuple[str, str]]:
    """(source, target) of every volume of a service (short syntax)."""
    out = []
    for volume in service.get("volumes", []):
        source, target, *_ = volume.split(":")
        out.append((source, target))
    return out


def _bind(service: dict[str, Any], target: str) -> Path:
    """The repository path mounted at ``target`` (or at the directory holding it)."""
    for source, mounted in _mounts(service):
        if source.startswith("./") and (target == mounted or target.startswith(mounted.rstrip("/") + "/")):
            return ROOT / source / PurePosixPath(target).relative_to(mounted)
    raise AssertionError(f"{target} is not mounted from the repository: {service.get('volumes')}")


def _flag(command: list[str], name: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in command if a.startswith(f"--{name}=")]
    return value


def _host_port(host_port: str) -> str:
    return host_port.rsplit(":", 1)[0]


# compose: services, mounts, ports, commands --------------------------------------------------------
def test_compose_has_the_whole_stack(services):
    assert set(services) == SERVICES
    for name in SERVICES - {"exporter-nvml"}:
        assert "profiles" not in services[name], f"{name} must start with a plain `docker compose up`"
    # The simulated exporter needs numpy: it runs from the analyzer image; real nodes get the slim one.
    images = {"exporter": "analyzer", "exporter-nvml": "exporter", "analyzer": "analyzer"}
    for name, image in images.items():
        assert services[name]["build"] == {"context": ".", "dockerfile": f"Dockerfile.{image}"}, name
        assert services[name]["image"] == f"truegpu-{image}:local", name
    for name in ("prometheus", "alertmanager", "grafana"):
        assert re.fullmatch(r"[\w./-]+:v?\d+\.\d+\.\d+", services[name]["image"]), "pin third-party images"


def test_nvml_profile_gets_the_gpus(services):
    nvml = services["exporter-nvml"]
    assert nvml["profiles"] == ["nvml"]
    assert nvml["command"][nvml["command"].index("--source") + 1] == "nvml"
    (device,) = nvml["deploy"]["resources"]["reservations"]["devices"]
    assert device["driver"] == "nvidia" and "gpu" in device["capabilities"]
    assert nvml["environment"]["NVIDIA_DRIVER_CAPABILITIES"] == "utility"  # NVML lives in "utility"


def test_every_mounted_host_path_exists(compose, services):
    named = set(compose.get("volumes") or {})
    for name, service in services.items():
        for source, target in _mounts(service):
            assert target.startswith("/"), f"{name}: {target}"
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts {source}, missing from the repository"
            else:
                assert source in named, f"{name}: named volume {source} is not declared"


def test_published_ports_do_not_collide(services):
    published = [(name, _host_port(p)) for name, s in services.items() for p in s.get("ports", [])]
    ports = [p for _, p in published]
    assert len(ports) == len(set(ports)), published


def test_truegpu_commands_parse_with_our_cli(services):
    from truegpu.cli import build_parser

    commands = {name: s["command"] for name, s in services.items() if "build" in s}
    docker_cmd = re.search(r"^CMD (.+)$", (ROOT / "Dockerfile.exporter").read_text(), re.M)
    assert docker_cmd, "Dockerfile.exporter has no CMD"
    commands["Dockerfile.exporter CMD"] = json.loads(docker_cmd.group(1))
    assert set(commands) == {"exporter", "exporter-nvml", "analyzer", "Dockerfile.exporter CMD"}
    for name, command in commands.items():
        assert command[0] == "truegpu", name
        args = build_parser(command[1:]).parse_args(command[1:])
        assert args.command == ("serve" if name == "analyzer" else "exporter"), name
        host, port = args.listen
        assert host == "", f"{name} must listen on every interface inside its container: {shlex.join(command)}"
        if name in services:
            assert [_host_port(p) for p in services[name]["ports"]] and all(
                p.rsplit(":", 1)[1] == str(port) for p in services[name]["ports"]
            ), f"{name}: published ports {services[name]['ports']} vs --listen :{port}"
        if getattr(args, "scenario", None):
            assert (ROOT / "fixtures" / "scenarios" / f"{args.scenario}.yaml").exists(), name
    serve = build_parser(commands["analyzer"][1:]).parse_args(commands["analyzer"][1:])
    assert serve.prometheus == "http://prometheus:9090"


# Prometheus -------------------------------------------------------------------------------------
@pytest.fixture
def prometheus_dir(services, tmp_path) -> Path:
    """deploy/prometheus.yml laid out as the compose file mounts it (config + rules/ beside it)."""
    prom = services["prometheus"]
    config = _flag(prom["command"], "config.file")
    assert _bind(prom, config) == PROMETHEUS_YML
    rules_dir = PurePosixPath(config).parent / "rules"
    assert _bind(prom, str(rules_dir)) == GENERATED_RULES
    shutil.copy(PROMETHEUS_YML, tmp_path / "prometheus.yml")
    (tmp_path / "rules").symlink_to(GENERATED_RULES, target_is_directory=True)
    return tmp_path


def test_prometheus_config_and_generated_rules_pass_promtool(prometheus_dir, prometheus_config, promtool):
    generated = sorted(p.name for p in GENERATED_RULES.glob("*.yaml"))
    assert generated and sorted(PurePosixPath(f).name for f in prometheus_config["rule_files"]) == generated
    assert all(f.startswith("rules/") for f in prometheus_config["rule_files"])
    result = subprocess.run(
        [promtool, "check", "config", str(prometheus_dir / "prometheus.yml")], capture_output=True, text=True
    )
    out = result.stdout + result.stderr
    assert result.returncode == 0, out
    for name in generated:  # promtool checked each rule file, not just the config
        assert re.search(rf"Checking .*rules/{re.escape(name)}\n\s+SUCCESS: [1-9]\d* rules found", out), out


def test_prometheus_scrapes_the_stack_without_honor_labels(prometheus_config, services):
    jobs = {j["job_name"]: j for j in prometheus_config["scrape_configs"]}
    # workloads are labelled `workload`: no target may overwrite Prometheus' job/instance
    assert not any(j.get("honor_labels") for j in prometheus_config["scrape_configs"])
    targets = {
        EXPORTER_JOB: [f"{n}:{d['port']}" for d in jobs[EXPORTER_JOB]["dns_sd_configs"] for n in d["names"]],
        ANALYZER_JOB: [t for s in jobs[ANALYZER_JOB]["static_configs"] for t in s["targets"]],
    }
    assert targets[EXPORTER_JOB] == ["exporter:9835", "exporter-nvml:9835"]
    assert targets[ANALYZER_JOB] == ["analyzer:9836"]
    (alertmanagers,) = prometheus_config["alerting"]["alertmanagers"]
    assert [t for s in alertmanagers["static_configs"] for t in s["targets"]] == ["alertmanager:9093"]
    for target in [*targets[EXPORTER_JOB], *targets[ANALYZER_JOB], "alertmanager:9093"]:
        assert target.split(":")[0] in services, target


# Alertmanager -----------------------------------------------------------------------------------
def test_alertmanager_config_passes_amtool(services):
    am = services["alertmanager"]
    config = _bind(am, _flag(am["command"], "config.file"))
    assert config == ROOT / "alerts" / "alertmanager.yml"
    result = subprocess.run(
        [find_binary("amtool"), "check-config", str(config)], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout


# Grafana ----------------------------------------------------------------------------------------
def test_grafana_provisioning_is_mounted(services):
    grafana = services["grafana"]
    for kind in ("datasources", "dashboards"):
        assert _bind(grafana, f"/etc/grafana/provisioning/{kind}") == GRAFANA / kind
        assert list((GRAFANA / kind).glob("*.yml")), f"no provisioning file in deploy/grafana/provisioning/{kind}"


def test_grafana_datasources_match_the_dashboards():
    (datasources,) = [yaml.safe_load(p.read_text()) for p in (GRAFANA / "datasources").glob("*.yml")]
    by_type = {d["type"]: d for d in datasources["datasources"]}
    prom = by_type["prometheus"]
    assert prom["url"] == "http://prometheus:9090" and prom["isDefault"] is True
    assert by_type["alertmanager"]["url"] == "http://alertmanager:9093"
    dashboards = [json.loads(p.read_text()) for p in sorted(DASHBOARDS.glob("*.json"))]
    assert dashboards
    for dash in dashboards:  # their `datasource` variable defaults to the provisioned datasource's name
        (var,) = [v for v in dash["templating"]["list"] if v["type"] == "datasource"]
        assert var["query"] == "prometheus" and var["current"]["value"] == prom["name"], dash["uid"]


def test_grafana_dashboard_provider_points_at_the_generated_dashboards(services):
    grafana = services["grafana"]
    (providers,) = [yaml.safe_load(p.read_text()) for p in (GRAFANA / "dashboards").glob("*.yml")]
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    path = provider["options"]["path"]
    assert _bind(grafana, path) == DASHBOARDS
    uids = [json.loads(p.read_text())["uid"] for p in DASHBOARDS.glob("*.json")]
    assert len(uids) == len(set(uids)) > 0
    home = grafana["environment"]["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]
    assert home.startswith(path + "/") and _bind(grafana, home).is_file()


# Dockerfiles: tests/deploy/test_images.py
