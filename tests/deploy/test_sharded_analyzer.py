"""components/sharded-analyzer: the base's analyzer as a StatefulSet of `serve --shard $(POD_NAME)/N`.

Rendered with the real `kubectl kustomize` (the base plus the component, as the README's "Sharding"
section installs it), validated against the Kubernetes schemas and scanned with checkov; its pod is
the base Deployment's pod but for what sharding adds, and each replica's arguments pick its own shard.
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.conftest import ROOT
from tests.deploy.conftest import KUBE, checkov, kubectl
from tests.deploy.test_kubernetes import KUBERNETES_VERSIONS, _generator, _one, _parse


@pytest.fixture(scope="module")
def objects(tmp_path_factory) -> list[dict[str, Any]]:
    tmp = tmp_path_factory.mktemp("sharded")
    kube = os.path.relpath(KUBE, tmp)  # kustomize takes relative paths only
    (tmp / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization", "resources": [f"{kube}/base"],
        "components": [f"{kube}/components/sharded-analyzer"]}))
    proc = subprocess.run([kubectl(), "kustomize", str(tmp)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    (tmp / "rendered.yaml").write_text(proc.stdout)
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    docs.append({"_dir": str(tmp)})
    return docs


def _objs(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [o for o in objects if "kind" in o]


def _base() -> list[dict[str, Any]]:
    proc = subprocess.run([kubectl(), "kustomize", "deploy/kubernetes/base"], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return [d for d in yaml.safe_load_all(proc.stdout) if d]


def test_one_statefulset_replaces_the_deployment_and_its_volume(objects):
    objs = _objs(objects)
    kinds = [o["kind"] for o in objs]
    assert "Deployment" not in kinds and "PersistentVolumeClaim" not in kinds
    sts = _one(objs, "StatefulSet", "truegpu-analyzer")
    shards = _generator().SHARDS
    assert sts["spec"]["replicas"] == shards and sts["spec"]["podManagementPolicy"] == "Parallel"
    assert all(o["metadata"].get("namespace") == "truegpu" for o in objs if o["kind"] not in
               ("Namespace", "ClusterRole", "ClusterRoleBinding"))
    assert all(o["metadata"]["labels"]["app.kubernetes.io/part-of"] == "truegpu" for o in objs
               if o["kind"] in ("StatefulSet", "Service"))
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    assert container["image"] == _one(_base(), "Deployment")["spec"]["template"]["spec"]["containers"][0]["image"]


def test_each_replica_analyzes_the_shard_its_ordinal_names(objects):
    from analyzer.data.shard import Shard

    sts = _one(_objs(objects), "StatefulSet")
    (container,) = sts["spec"]["template"]["spec"]["containers"]
    (env,) = [e for e in container["env"] if e["name"] == "POD_NAME"]
    assert env["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    replicas = sts["spec"]["replicas"]
    seen = set()
    for ordinal in range(replicas):  # Kubernetes expands $(POD_NAME) to <statefulset>-<ordinal>
        pod = {**container, "args": [a.replace("$(POD_NAME)", f"{sts['metadata']['name']}-{ordinal}")
                                     for a in container["args"]]}
        args = _parse(pod)
        assert args.command == "serve" and args.shard == Shard(ordinal, replicas)
        seen.add(args.shard)
    assert len(seen) == replicas


def test_the_pod_is_the_base_deployments_but_for_sharding(objects):
    """Generated from the base, so a change there reaches the shards (generate.py --check fails until)."""
    sts = _one(_objs(objects), "StatefulSet")
    base = _one(_base(), "Deployment")
    template, want = copy.deepcopy(sts["spec"]["template"]), copy.deepcopy(base["spec"]["template"])
    (c,), (w,) = template["spec"]["containers"], want["spec"]["containers"]
    assert c.pop("args")[:-1] == w.pop("args") and [e["name"] for e in c.pop("env")] == ["POD_NAME"]
    (claim,) = sts["spec"]["volumeClaimTemplates"]
    (data,) = [v for v in want["spec"]["volumes"] if v["name"] == claim["metadata"]["name"]]
    want["spec"]["volumes"].remove(data)  # each replica's rollups on its own volume
    assert template == want
    pvc = _one(_base(), "PersistentVolumeClaim", data["persistentVolumeClaim"]["claimName"])
    assert claim["spec"] == pvc["spec"]
    assert sts["spec"]["selector"] == base["spec"]["selector"]


def test_replicas_are_named_by_a_headless_service_that_no_monitor_scrapes(objects):
    objs = _objs(objects)
    sts = _one(objs, "StatefulSet")
    svc = _one(objs, "Service", sts["spec"]["serviceName"])
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()
    monitor = yaml.safe_load((KUBE / "components" / "prometheus-operator" / "servicemonitor.yaml").read_text())
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    scraped = _one(objs, "Service", "truegpu-analyzer")  # the one the monitor scrapes: every replica behind it
    assert scraped["spec"]["selector"].items() <= sts["spec"]["template"]["metadata"]["labels"].items()


def test_every_object_validates_and_scans_clean(objects):
    for obj in _objs(objects):
        for version in KUBERNETES_VERSIONS:
            try:
                kubernetes_validate.validate(obj, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{obj['kind']} {obj['metadata']['name']} (Kubernetes {version}): {exc.message}")
    out = subprocess.run([checkov(), "-f", f"{objects[-1]['_dir']}/rendered.yaml", "--framework", "kubernetes",
                          "--output", "json", "--compact", "--skip-download"],
                         capture_output=True, text=True, timeout=600)
    report = json.loads(out.stdout)
    report = report[0] if isinstance(report, list) else report
    failed = [(r["resource"], r["check_id"]) for r in report["results"]["failed_checks"]]
    assert not failed, failed
    skipped = {(r["resource"], r["check_id"]) for r in report["results"]["skipped_checks"]}
    assert ("StatefulSet.truegpu.truegpu-analyzer", "CKV_K8S_43") in skipped  # the base's stated reason, kept
    assert report["summary"]["passed"] > 150
