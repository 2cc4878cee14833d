"""deploy/kubernetes renders, validates, scans clean and says what it grants.

Every directory the README's "Kubernetes" section installs (`kubectl apply -k DIR`) is rendered with
the real `kubectl kustomize`; every object is validated against the Kubernetes schemas
(kubernetes-validate, strict) or, for the Prometheus Operator kinds, against the CRDs'
openAPIV3Schema in ../shared/reference/prometheus-operator-crds (Prometheus Operator 0.93), made
strict so a misspelt field fails here instead of being pruned by the API server.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from alerts.rules import ANALYZER_JOB, EXPORTER_JOB
from exporter.attribution import DEFAULT_CDI_DIRS
from tests.conftest import ROOT
from tests.deploy.conftest import KUBE, installed_dirs, kubectl, readme_kubernetes_commands

CRDS = ROOT.parent / "shared" / "reference" / "prometheus-operator-crds"
#: The Kubernetes minors validated against: kubectl's here and the newest kubernetes-validate knows.
KUBERNETES_VERSIONS = ("1.32", "1.37")
OVERLAYS = sorted(p.name for p in (KUBE / "overlays").iterdir() if p.is_dir())
#: Overlays that are the base plus more than one component (in this order); the others are base + their namesake.
COMPOSED = {"secure-endpoints-prometheus-operator": ["prometheus-operator", "secure-endpoints"]}
#: kubectl's client-side apply stores the object in an annotation, which may not pass 256 KiB.
MAX_APPLIED_BYTES = 262144
#: Accepted checkov findings per installed directory: (resource, check). Each carries its reason in a
#: checkov.io/skipN annotation beside the object; accepting one more takes a change here too.
IMAGE_DIGEST = {("DaemonSet.truegpu.truegpu-exporter", "CKV_K8S_43"),
                ("Deployment.truegpu.truegpu-analyzer", "CKV_K8S_43")}
ROOT_FOR_SOCKET = {("DaemonSet.truegpu.truegpu-exporter", c) for c in ("CKV_K8S_23", "CKV_K8S_40", "CKV_K8S_38")}
ACCEPTED = {
    "base": IMAGE_DIGEST | ROOT_FOR_SOCKET,
    "dcgm-exporter": IMAGE_DIGEST,
    "prometheus-operator": IMAGE_DIGEST | ROOT_FOR_SOCKET,
    "postgres-rollups": IMAGE_DIGEST | ROOT_FOR_SOCKET | {("Deployment.truegpu.truegpu-analyzer", "CKV_K8S_35")},
    "process-attribution": IMAGE_DIGEST | ROOT_FOR_SOCKET | {("DaemonSet.truegpu.truegpu-exporter", "CKV_K8S_17")},
    "secure-endpoints": IMAGE_DIGEST | ROOT_FOR_SOCKET,
    "secure-endpoints-prometheus-operator": IMAGE_DIGEST | ROOT_FOR_SOCKET,
}
#: --web-config-file in the secure-endpoints component: the Secret's volume, read-only.
WEB_CONFIG = "/etc/truegpu/web/web.yml"
WEB_SECRET, SCRAPE_SECRET = "truegpu-web-config", "truegpu-scrape-credentials"


def components(overlay: str) -> list[str]:
    return COMPOSED.get(overlay, [overlay])


SECURE = [o for o in OVERLAYS if "secure-endpoints" in components(o)]
OPERATOR = [o for o in OVERLAYS if "prometheus-operator" in components(o)]


def _one(objects: list[dict[str, Any]], kind: str, name: str | None = None) -> dict[str, Any]:
    found = [o for o in objects if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def _container(objects: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    (container,) = _one(objects, kind)["spec"]["template"]["spec"]["containers"]
    return container


def _strict(schema: Any) -> Any:
    """The CRD schema with additionalProperties: false wherever it lists properties and does not
    keep unknown fields, so a typo fails validation (the API server would silently prune it)."""
    if isinstance(schema, dict):
        out = {k: _strict(v) for k, v in schema.items()}
        if "properties" in out and "additionalProperties" not in out \
                and not out.get("x-kubernetes-preserve-unknown-fields"):
            out["additionalProperties"] = False
        return out
    if isinstance(schema, list):
        return [_strict(v) for v in schema]
    return schema


@pytest.fixture(scope="module")
def crd_schemas() -> dict[tuple[str, str], dict[str, Any]]:
    files = sorted(CRDS.glob("*.yaml"))
    if not files:
        pytest.fail(f"no Prometheus Operator CRDs in {CRDS} (the shared reference beside the repository)",
                    pytrace=False)
    schemas = {}
    for path in files:
        crd = yaml.safe_load(path.read_text())
        for version in crd["spec"]["versions"]:
            api = f"{crd['spec']['group']}/{version['name']}"
            schemas[(api, crd["spec"]["names"]["kind"])] = _strict(version["schema"]["openAPIV3Schema"])
    return schemas


# What is installed, and that it renders -----------------------------------------------------------
def test_readme_installs_the_base_and_every_overlay():
    dirs = installed_dirs()
    assert dirs == ["deploy/kubernetes/base", *[f"deploy/kubernetes/overlays/{o}" for o in OVERLAYS]], dirs
    assert {"dcgm-exporter", "prometheus-operator", "postgres-rollups", "process-attribution",
            "secure-endpoints", "secure-endpoints-prometheus-operator"} <= set(OVERLAYS)
    for overlay in OVERLAYS:  # each overlay is the base plus its component(s), so they compose
        k = yaml.safe_load((KUBE / "overlays" / overlay / "kustomization.yaml").read_text())
        assert k["resources"] == ["../../base"]
        assert k["components"] == [f"../../components/{c}" for c in components(overlay)]


def test_every_directory_renders_the_stack(rendered):
    for name in ["base", *OVERLAYS]:
        kinds = Counter(o["kind"] for o in rendered[name])
        assert kinds["DaemonSet"] == kinds["Deployment"] == 1, (name, kinds)
        assert kinds["NetworkPolicy"] == 2 and kinds["ConfigMap"] >= 1, (name, kinds)
        for obj in rendered[name]:
            if obj["kind"] not in ("Namespace", "ClusterRole", "ClusterRoleBinding"):
                assert obj["metadata"].get("namespace"), f"{name}: {obj['kind']} {obj['metadata']['name']}"
    monitoring = {"PodMonitor", "ServiceMonitor", "PrometheusRule"}
    for name in ["base", *OVERLAYS]:
        kinds = {o["kind"] for o in rendered[name]}
        assert monitoring <= kinds if name in OPERATOR else not monitoring & kinds, name


def test_every_object_validates(rendered, crd_schemas):
    unique: dict[str, tuple[str, dict[str, Any]]] = {}  # most objects are the same in every overlay
    for name in ["base", *OVERLAYS]:
        for obj in rendered[name]:
            unique.setdefault(json.dumps(obj, sort_keys=True), (name, obj))
    for text, (name, obj) in unique.items():
        where = f"{name}: {obj['kind']} {obj['metadata']['name']}"
        crd = crd_schemas.get((obj["apiVersion"], obj["kind"]))
        if crd is not None:
            errors = sorted(jsonschema.Draft7Validator(crd).iter_errors(obj), key=str)
            assert not errors, f"{where}: " + "; ".join(f"{list(e.path)}: {e.message}" for e in errors[:5])
            continue
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                pytest.fail(f"{where}: no Kubernetes {version} schema (and no CRD) for {obj['apiVersion']}")
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{where} (Kubernetes {version}): {exc.message} at {list(exc.path)}")
        assert len(text) < MAX_APPLIED_BYTES, f"{where}: {len(text)} bytes is too big for `kubectl apply`"


def test_validation_can_fail(crd_schemas):
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "x"},
                                      "spec": {"prots": []}}, KUBERNETES_VERSIONS[-1], strict=True)
    typo = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PodMonitor", "metadata": {"name": "x"},
            "spec": {"selector": {}, "podMetricsEndpoint": []}}
    assert list(jsonschema.Draft7Validator(crd_schemas[("monitoring.coreos.com/v1", "PodMonitor")]).iter_errors(typo))


# Generated content equals the generated files ---------------------------------------------------
def _generator():
    import importlib.util

    spec = importlib.util.spec_from_file_location("kube_generate", KUBE / "generate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_copies_are_up_to_date():
    gen = _generator()
    stale = gen.stale(gen.rendered())
    names = [str(p.relative_to(ROOT)) for p in stale]
    assert not stale, f"out of date: {names}; run python deploy/kubernetes/generate.py"


def test_prometheus_rules_equal_the_generated_rules(rendered):
    rules = {o["metadata"]["name"]: o for o in rendered["prometheus-operator"] if o["kind"] == "PrometheusRule"}
    generated = sorted((ROOT / "alerts" / "generated").glob("*.yaml"))
    assert sorted(rules) == sorted(f"truegpu-rules-{p.stem}" for p in generated)
    for path in generated:
        assert rules[f"truegpu-rules-{path.stem}"]["spec"]["groups"] == yaml.safe_load(path.read_text())["groups"]


def test_dashboard_configmaps_equal_the_generated_dashboards(rendered):
    for name in ["base", *OVERLAYS]:
        maps = [o for o in rendered[name] if o["kind"] == "ConfigMap"]
        assert all(m["metadata"]["labels"]["grafana_dashboard"] == "1" for m in maps)
        data = {k: v for m in maps for k, v in m["data"].items()}
        files = {p.name: p.read_text() for p in (ROOT / "dashboards" / "generated").glob("*.json")}
        assert data == files, f"{name}: dashboard ConfigMaps differ from dashboards/generated"


@pytest.mark.parametrize("name", OPERATOR)
def test_scrape_jobs_are_the_jobs_the_rules_select(rendered, name):
    objs = rendered[name]
    pod_monitor, service_monitor = _one(objs, "PodMonitor"), _one(objs, "ServiceMonitor")
    exporter_pod = _one(objs, "DaemonSet")["spec"]["template"]["metadata"]["labels"]
    assert exporter_pod[pod_monitor["spec"]["jobLabel"]] == EXPORTER_JOB
    assert pod_monitor["spec"]["selector"]["matchLabels"].items() <= exporter_pod.items()
    service = _one(objs, "Service", "truegpu-analyzer")
    assert service["metadata"]["labels"][service_monitor["spec"]["jobLabel"]] == ANALYZER_JOB
    assert service_monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    for monitor, port_names in ((pod_monitor["spec"]["podMetricsEndpoints"], _ports(objs, "DaemonSet")),
                                (service_monitor["spec"]["endpoints"], {p["name"] for p in service["spec"]["ports"]})):
        assert all(e["port"] in port_names and not e.get("honorLabels") for e in monitor)
    for kind in ("DaemonSet", "Deployment"):  # the monitors replace the scrape annotations
        assert "prometheus.io/scrape" not in _one(objs, kind)["spec"]["template"]["metadata"].get("annotations", {})


def _ports(objs: list[dict[str, Any]], kind: str) -> set[str]:
    return {p["name"] for p in _container(objs, kind)["ports"]}


# The exporter: arguments, probes, privilege ---------------------------------------------------------
def _parse(container: dict[str, Any]):
    from truegpu.cli import build_parser

    argv = [a.replace("$(NODE_NAME)", "gpu-node-1") for a in container["command"][1:] + container["args"]]
    assert container["command"][0] == "truegpu"
    return build_parser(argv).parse_args(argv)


def _handler(probe: dict[str, Any]) -> dict[str, Any]:
    """The probe's one handler (httpGet, tcpSocket, exec or grpc), without its timing."""
    handlers = {k: v for k, v in probe.items() if k in ("httpGet", "tcpSocket", "exec", "grpc")}
    assert len(handlers) == 1, probe
    return handlers


def _expected_probe(name: str, path: str, port_name: str) -> dict[str, Any]:
    """httpGet on the health endpoint; tcpSocket where basic auth guards it (secure-endpoints), since
    the kubelet could pass basic auth only with the password written into the pod spec."""
    if name in SECURE:
        return {"tcpSocket": {"port": port_name}}
    return {"httpGet": {"path": path, "port": port_name}}


def _listen_port(container: dict[str, Any]) -> int:
    host, port = _parse(container).listen
    assert host == "", "listen on every interface of the pod"
    (declared,) = [p for p in container["ports"] if p["containerPort"] == port]
    return declared["name"]


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_exporter_arguments_probes_and_node_name(rendered, name):
    objs = rendered[name]
    container = _container(objs, "DaemonSet")
    args = _parse(container)
    port_name = _listen_port(container)
    for probe in ("livenessProbe", "readinessProbe"):
        assert _handler(container[probe]) == _expected_probe(name, "/healthz", port_name), probe
    (node_env,) = [e for e in container["env"] if e["name"] == "NODE_NAME"]
    assert node_env["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert container["resources"]["requests"] and container["resources"]["limits"]
    pod = _one(objs, "DaemonSet")["spec"]["template"]["spec"]
    assert pod["nodeSelector"] and any(t["key"] == "nvidia.com/gpu" for t in pod["tolerations"])
    if name == "dcgm-exporter":
        assert args.sources == ["dcgm"] and args.dcgm_hostname == "gpu-node-1"
        svc = _one(objs, "Service", "truegpu-dcgm-exporter-local")
        assert svc["spec"]["internalTrafficPolicy"] == "Local", "each exporter must read its own node's dcgm-exporter"
        ns, port = svc["metadata"]["namespace"], svc["spec"]["ports"][0]["port"]
        assert args.dcgm_url == f"http://{svc['metadata']['name']}.{ns}.svc:{port}/metrics"
        assert "runtimeClassName" not in pod and args.kubelet_socket is None
    else:
        assert args.sources == ["nvml"] and args.nvml_hostname == "gpu-node-1"
        assert pod["runtimeClassName"] == "nvidia"
        (mount,) = [m for m in container["volumeMounts"] if args.kubelet_socket.startswith(m["mountPath"] + "/")]
        assert mount["readOnly"] is True
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["hostPath"]["path"] == mount["mountPath"] == "/var/lib/kubelet/pod-resources"


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_exporter_runs_with_the_least_privilege_its_overlay_states(rendered, name):
    ds = _one(rendered[name], "DaemonSet")
    pod = ds["spec"]["template"]["spec"]
    sc = _container(rendered[name], "DaemonSet")["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["allowPrivilegeEscalation"] is False
    assert sc["capabilities"] == {"drop": ["ALL"]} and sc.get("privileged") is False
    assert sc["seccompProfile"]["type"] == pod["securityContext"]["seccompProfile"]["type"] == "RuntimeDefault"
    assert not pod.get("hostNetwork") and not pod.get("hostIPC")
    host_paths = {v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v}
    grants = ds["spec"]["template"]["metadata"].get("annotations", {}).get("truegpu.dev/grants", "")
    if name == "process-attribution":
        assert pod["hostPID"] is True and "hostPID" in grants, "the overlay grants hostPID and says so on the pod"
    else:
        assert not pod.get("hostPID") and not grants
    if name == "dcgm-exporter":  # no socket: nobody, no token, no RBAC, restricted namespace
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65534 and not host_paths
        assert pod["automountServiceAccountToken"] is False
        assert not [o for o in rendered[name] if o["kind"] in ("ClusterRole", "ClusterRoleBinding", "Role")]
        labels = _one(rendered[name], "Namespace")["metadata"]["labels"]
        assert labels["pod-security.kubernetes.io/enforce"] == "restricted"
    else:  # UID 0 without capabilities, for the root-only kubelet socket; DRA's CDI specs read-only
        assert sc["runAsUser"] == 0 and host_paths == {"/var/lib/kubelet/pod-resources", "/var/run/cdi"}
        mounts = {m["name"]: m for m in _container(rendered[name], "DaemonSet")["volumeMounts"]}
        for volume in (v for v in pod["volumes"] if "hostPath" in v):
            mount = mounts[volume["name"]]
            assert mount["readOnly"] is True and mount["mountPath"] == volume["hostPath"]["path"], mount
        args = _parse(_container(rendered[name], "DaemonSet"))
        assert "/var/run/cdi" in (args.cdi_spec_dir or DEFAULT_CDI_DIRS)  # the exporter reads the mount


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_rbac_is_get_pods_for_the_exporter_only(rendered, name):
    objs = rendered[name]
    roles = [o for o in objs if o["kind"] in ("Role", "ClusterRole")]
    if name == "dcgm-exporter":
        assert not roles
        return
    (role,) = roles
    assert role["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]
    binding = _one(objs, "ClusterRoleBinding")
    assert binding["roleRef"]["name"] == role["metadata"]["name"]
    (subject,) = binding["subjects"]
    ds = _one(objs, "DaemonSet")
    assert (subject["name"], subject["namespace"]) == (ds["spec"]["template"]["spec"]["serviceAccountName"],
                                                       ds["metadata"]["namespace"])
    assert "--kube-api=https://kubernetes.default.svc" in _container(objs, "DaemonSet")["args"]


# The analyzer ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_analyzer_token_rollups_and_probes(rendered, name):
    objs = rendered[name]
    container = _container(objs, "Deployment")
    pod = _one(objs, "Deployment")["spec"]["template"]["spec"]
    args = _parse(container)
    assert args.command == "serve" and not args.no_auth
    port_name = _listen_port(container)
    assert _handler(container["livenessProbe"]) == _expected_probe(name, "/healthz", port_name)
    assert _handler(container["readinessProbe"]) == _expected_probe(name, "/readyz", port_name)
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    token_dir = str(Path(args.api_token_file).parent)
    assert volumes[mounts[token_dir]]["secret"]["secretName"] == "truegpu-api-token"
    assert Path(args.api_token_file).name == "token"
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    if name == "postgres-rollups":
        assert args.rollup_store == "$(TRUEGPU_ROLLUP_STORE)"
        env = {e["name"]: e["valueFrom"]["secretKeyRef"] for e in container["env"]}
        assert env["TRUEGPU_ROLLUP_STORE"] == {"name": "truegpu-rollup-store", "key": "url"}
        assert env["PGPASSWORD"]["key"] == "password"
        assert not [o for o in objs if o["kind"] == "PersistentVolumeClaim"] and "/data" not in mounts
    else:
        claim = volumes[mounts[str(Path(args.rollup_store).parent)]]["persistentVolumeClaim"]["claimName"]
        _one(objs, "PersistentVolumeClaim", claim)


def _secure_section(lang: str) -> str:
    """The fenced ``lang`` block of deploy/kubernetes/README.md's "Secure endpoints" section."""
    section = re.search(r"^## Secure endpoints\n(.*?)(?=^## )", (KUBE / "README.md").read_text(), re.M | re.S)
    assert section, "deploy/kubernetes/README.md has no '## Secure endpoints' section"
    (block,) = re.findall(rf"```{lang}\n(.*?)```", section.group(1), re.S)
    return block


@pytest.fixture(scope="module")
def secret_files(tmp_path_factory) -> Path:
    """A directory where deploy/kubernetes/README.md's secure-endpoints commands ran: web.yml, the
    certificate and key, Prometheus' password (python3 is the project's, which has bcrypt)."""
    out = tmp_path_factory.mktemp("secrets")
    proc = subprocess.run(["bash", "-euo", "pipefail", "-c", _secure_section("sh")], cwd=out, capture_output=True,
                          text=True, timeout=60, env={"PATH": f"{ROOT / '.venv' / 'bin'}:/usr/bin:/bin"})
    assert proc.returncode == 0, f"the documented commands failed:\n{proc.stderr}"
    return out


def _readme_secrets(cwd: Path) -> dict[str, dict[str, Any]]:
    """The README's `create secret` lines, run with --dry-run=client in ``cwd``: name -> Secret."""
    made = {}
    for line in readme_kubernetes_commands():
        if line.startswith("kubectl") and " create secret " in line:
            proc = subprocess.run(["bash", "-c", f"{line} --dry-run=client -o yaml"], cwd=cwd,
                                  capture_output=True, text=True, timeout=60,
                                  env={"PATH": str(Path(kubectl()).parent) + ":/usr/bin:/bin"})
            assert proc.returncode == 0, f"{line}\n{proc.stderr}"
            secret = yaml.safe_load(proc.stdout)
            made[secret["metadata"]["name"]] = secret
    return made


def test_readme_secret_commands_make_the_secrets_the_manifests_read(rendered, secret_files):
    made = {name: (s["metadata"]["namespace"], set(s["data"])) for name, s in _readme_secrets(secret_files).items()}
    assert made["truegpu-api-token"] == ("truegpu", {"token"})
    assert made["truegpu-rollup-store"] == ("truegpu", {"url", "password"})
    assert made[WEB_SECRET] == ("truegpu", {"web.yml", "tls.crt", "tls.key"})
    assert made[SCRAPE_SECRET] == ("truegpu", {"username", "password", "ca.crt"})
    for name in SECURE:  # every Secret the secure overlays read is one the README makes, with its keys
        for kind in ("DaemonSet", "Deployment"):
            volumes = _one(rendered[name], kind)["spec"]["template"]["spec"]["volumes"]
            assert WEB_SECRET in {v["secret"]["secretName"] for v in volumes if "secret" in v}
        for monitor in (o for o in rendered[name] if o["kind"] in ("PodMonitor", "ServiceMonitor")):
            for endpoint in monitor["spec"].get("podMetricsEndpoints", monitor["spec"].get("endpoints")):
                refs = [endpoint["tlsConfig"]["ca"]["secret"], *endpoint["basicAuth"].values()]
                assert {(r["name"], r["key"]) for r in refs} <= {(SCRAPE_SECRET, k) for k in made[SCRAPE_SECRET][1]}


def test_documented_web_config_loads_and_admits_the_scrape_credentials(secret_files, tmp_path):
    """The Secret's files, laid out as its volume lays them out, load with the exporter's own loader
    (which serve uses too): TLS from the relative paths, the hash matching Prometheus' password."""
    import base64

    from exporter.webconfig import BasicAuth, load_web_config

    secrets = _readme_secrets(secret_files)
    mounted = tmp_path / "etc-truegpu-web"  # what the pod sees at /etc/truegpu/web
    mounted.mkdir()
    for key, value in secrets[WEB_SECRET]["data"].items():
        (mounted / key).write_bytes(base64.b64decode(value))
    web = load_web_config(mounted / Path(WEB_CONFIG).name)
    assert web.scheme == "https" and web.tls.minimum_version.name == "TLSv1_2"
    assert web.headers["Strict-Transport-Security"]
    scrape = {k: base64.b64decode(v).decode() for k, v in secrets[SCRAPE_SECRET]["data"].items()}
    assert set(web.users) == {scrape["username"]} and len(scrape["password"]) >= 32
    auth = BasicAuth(web.users)
    basic = "Basic " + base64.b64encode(f"{scrape['username']}:{scrape['password']}".encode()).decode()
    assert auth.allows(basic) and not auth.allows(basic[:-4] + "AAAA")
    assert scrape["ca.crt"] == (mounted / "tls.crt").read_text()  # self-signed: Prometheus trusts the certificate
    cert = subprocess.run(["openssl", "x509", "-noout", "-ext", "subjectAltName"], input=scrape["ca.crt"],
                          capture_output=True, text=True, check=True).stdout
    for service in ("truegpu-exporter", "truegpu-analyzer"):  # the monitors' serverName
        assert f"DNS:{service}.truegpu.svc" in cert


def test_documented_scrape_config_is_valid_and_scrapes_the_rules_jobs(secret_files, tmp_path, promtool):
    """The plain-Prometheus scrape jobs of deploy/kubernetes/README.md pass `promtool check config`
    (with the documented file paths pointing at real files) and are the jobs the rules select.

    Debian's Prometheus build (the one here) has no Kubernetes discovery, so promtool gets
    static_configs in its place; the discovery blocks are checked against its documented keys here."""
    config = yaml.safe_load(_secure_section("yaml"))
    assert [j["job_name"] for j in config["scrape_configs"]] == [EXPORTER_JOB, ANALYZER_JOB]
    for job in config["scrape_configs"]:
        assert job["scheme"] == "https" and job["basic_auth"]["password_file"] and job["tls_config"]["ca_file"]
        assert job["tls_config"]["server_name"] == f"{job['job_name']}.truegpu.svc"
        (sd,) = job.pop("kubernetes_sd_configs")
        assert set(sd) <= {"role", "namespaces", "selectors"} and sd["role"] in ("pod", "endpoints")
        assert sd["namespaces"] == {"names": ["truegpu"]}
        assert all(set(s) <= {"role", "label", "field"} and s["role"] == sd["role"] for s in sd.get("selectors", []))
        job["static_configs"] = [{"targets": ["10.0.0.5:9835"]}]
    (tmp_path / "ca.crt").write_bytes((secret_files / "tls.crt").read_bytes())
    (tmp_path / "password").write_bytes((secret_files / "scrape-password").read_bytes())
    text = yaml.safe_dump(config).replace("/etc/prometheus/truegpu/", f"{tmp_path}/")
    (tmp_path / "prometheus.yml").write_text(text)
    proc = subprocess.run([promtool, "check", "config", str(tmp_path / "prometheus.yml")], capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_secure_endpoints_mount_the_web_config_read_only(rendered, name):
    """secure-endpoints: both containers read --web-config-file from the Secret's read-only volume (no
    subPath, so a rotated Secret arrives), readable by their user; no annotation-driven scraping."""
    for kind in ("DaemonSet", "Deployment"):
        template = _one(rendered[name], kind)["spec"]["template"]
        pod, container = template["spec"], _container(rendered[name], kind)
        path = _parse(container).web_config_file
        if name not in SECURE:
            assert path is None and not any("secret" in v and v["secret"]["secretName"] == WEB_SECRET
                                            for v in pod["volumes"]), name
            continue
        assert path == WEB_CONFIG, (name, kind)
        (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == str(Path(path).parent)]
        assert mount["readOnly"] is True and "subPath" not in mount
        (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
        assert volume["secret"] == {"secretName": WEB_SECRET, "defaultMode": 0o440}
        # The files are root's, mode 0440, group fsGroup (which the container's processes join).
        uid = container["securityContext"].get("runAsUser", pod["securityContext"].get("runAsUser"))
        assert uid == 0 or pod["securityContext"].get("fsGroup") is not None, (name, kind, uid)
        assert not any(k.startswith("prometheus.io/") for k in template["metadata"].get("annotations", {}))
        assert {p["containerPort"] for p in container["ports"]} == {9835 if kind == "DaemonSet" else 9836}


@pytest.mark.parametrize("name", OPERATOR)
def test_monitors_scrape_https_with_basic_auth_where_the_endpoints_need_it(rendered, name):
    objs = rendered[name]
    endpoints = {"truegpu-exporter": _one(objs, "PodMonitor")["spec"]["podMetricsEndpoints"],
                 "truegpu-analyzer": _one(objs, "ServiceMonitor")["spec"]["endpoints"]}
    for service, eps in endpoints.items():
        (endpoint,) = eps
        if name not in SECURE:
            assert endpoint.get("scheme", "http") == "http"
            assert "tlsConfig" not in endpoint and "basicAuth" not in endpoint
            continue
        namespace = _one(objs, "Service", service)["metadata"]["namespace"]
        assert endpoint["scheme"] == "https" and not endpoint["tlsConfig"].get("insecureSkipVerify")
        assert endpoint["tlsConfig"]["serverName"] == f"{service}.{namespace}.svc"
        assert endpoint["tlsConfig"]["ca"] == {"secret": {"name": SCRAPE_SECRET, "key": "ca.crt"}}
        assert endpoint["basicAuth"] == {"username": {"name": SCRAPE_SECRET, "key": "username"},
                                         "password": {"name": SCRAPE_SECRET, "key": "password"}}


@pytest.mark.parametrize("other", ["dcgm-exporter", "postgres-rollups", "process-attribution"])
def test_secure_endpoints_compose_with_the_other_components(other, tmp_path):
    """Your own overlay of base + another component + secure-endpoints renders, and keeps both."""
    kube = os.path.relpath(KUBE, tmp_path)  # kustomize takes relative paths only
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": [f"{kube}/base"],
        "components": [f"{kube}/components/{other}", f"{kube}/components/secure-endpoints"]}))
    proc = subprocess.run([kubectl(), "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    objs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    for kind in ("DaemonSet", "Deployment"):
        container = _container(objs, kind)
        assert _parse(container).web_config_file == WEB_CONFIG
        assert {"tcpSocket"} == set(_handler(container["livenessProbe"])) == set(_handler(container["readinessProbe"]))
    exporter = _parse(_container(objs, "DaemonSet"))
    if other == "dcgm-exporter":
        assert exporter.sources == ["dcgm"]  # its arguments, plus the appended --web-config-file
        pod = _one(objs, "DaemonSet")["spec"]["template"]["spec"]
        sc = _container(objs, "DaemonSet")["securityContext"]
        assert sc["runAsUser"] == 65534 and pod["securityContext"]["fsGroup"] == sc["runAsGroup"] == 65534
    if other == "process-attribution":
        assert _one(objs, "DaemonSet")["spec"]["template"]["spec"]["hostPID"] is True


# Network policies and the scan -------------------------------------------------------------------------
@pytest.mark.parametrize("name", ["base", *OVERLAYS])
def test_network_policies_select_the_pods_and_their_ports(rendered, name):
    objs = rendered[name]
    for kind in ("DaemonSet", "Deployment"):
        labels = _one(objs, kind)["spec"]["template"]["metadata"]["labels"]
        (policy,) = [p for p in objs if p["kind"] == "NetworkPolicy"
                     and p["spec"]["podSelector"]["matchLabels"].items() <= labels.items()]
        assert policy["spec"]["policyTypes"] == ["Ingress", "Egress"]
        (rule,) = policy["spec"]["ingress"]
        assert [p["port"] for p in rule["ports"]] == [p["name"] for p in _container(objs, kind)["ports"]]


def test_checkov_accepts_only_the_stated_findings(checkov_report):
    results = checkov_report["kubernetes"]["results"]
    failed = [(r["file_path"], r["resource"], r["check_id"], r["check_name"]) for r in results["failed_checks"]]
    assert not failed, f"checkov findings (fix them, or accept one with a checkov.io/skipN reason): {failed}"
    assert not results["parsing_errors"]
    skipped: dict[str, set[tuple[str, str]]] = {name: set() for name in ACCEPTED}
    for r in results["skipped_checks"]:
        reason = r["check_result"].get("suppress_comment", "")
        assert len(reason) > 30, f"{r['resource']} {r['check_id']}: say why it is accepted ({reason!r})"
        skipped[Path(r["file_path"]).stem].add((r["resource"], r["check_id"]))
    assert skipped == ACCEPTED
    assert checkov_report["kubernetes"]["summary"]["passed"] > 500
    print(f"checkov (kubernetes + dockerfile) took {checkov_report['seconds']:.1f} s")


def test_components_state_their_reason():
    for component in (KUBE / "components").iterdir():
        text = (component / "kustomization.yaml").read_text()
        assert re.match(r"(#.*\n){2,}", text), f"{component.name}: open with what it adds and why"
    assert "hostPID" in (KUBE / "components" / "process-attribution" / "kustomization.yaml").read_text()
    readme = (KUBE / "README.md").read_text()
    for overlay in OVERLAYS:
        assert f"overlays/{overlay}" in readme, f"deploy/kubernetes/README.md does not document {overlay}"
