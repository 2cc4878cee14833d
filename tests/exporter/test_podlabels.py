"""Pod labels from a real HTTP server answering the pods API as the Kubernetes API server does.

The server is ``http.server`` on 127.0.0.1 in a thread; the end-to-end test adds the real
gRPC pod-resources server of test_attribution. Cache time is a fake clock; only the
timeout test waits (a fraction of a second).
"""

from __future__ import annotations

import json
import logging
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from exporter.attribution import (
    AttributionError,
    CompositeAttributor,
    KubeApiPodLabels,
    KubernetesAttributor,
    build_attributor,
    load_job_map,
)
from exporter.attribution.podlabels import in_cluster_url, pod_path
from tests.exporter.kit import GPU0, GPU1, MIG_C, TRAINING, FakeClock, pod

JOB_LABEL = "training.kubeflow.org/job-name"


class ApiServer:
    """The pods endpoint of an API server: ``pods[(ns, name)] = labels``; ``mode`` forces replies."""

    def __init__(self) -> None:
        self.pods: dict[tuple[str, str], dict[str, str]] = {}
        self.uids: dict[tuple[str, str], str] = {}  # metadata.uid where a test sets it
        self.mode = "ok"  # ok | forbidden | unauthorized | error | slow | garbage
        self.delay = 1.0
        self.seen: list[tuple[str, str | None]] = []  # (raw request path, Authorization header)
        self.lock = threading.Lock()
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                with api.lock:
                    api.seen.append((self.path, self.headers.get("Authorization")))
                api.answer(self)

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)

    def answer(self, h: BaseHTTPRequestHandler) -> None:
        from urllib.parse import unquote

        if self.mode == "slow":
            threading.Event().wait(self.delay)
        if self.mode == "forbidden":
            return self.reply(h, 403, status_object(
                403, "Forbidden", 'pods "x" is forbidden: User "system:serviceaccount:monitoring:truegpu" '
                'cannot get resource "pods" in API group "" in the namespace "train"'))
        if self.mode == "unauthorized":
            return self.reply(h, 401, status_object(401, "Unauthorized", "Unauthorized"))
        if self.mode == "error":
            return self.reply(h, 500, status_object(500, "InternalError", "etcdserver: request timed out"))
        if self.mode == "garbage":
            return self.reply(h, 200, b"<html>login</html>")
        parts = h.path.split("?", 1)[0].split("/")
        if len(parts) != 7 or parts[:4] != ["", "api", "v1", "namespaces"] or parts[5] != "pods":
            return self.reply(h, 404, status_object(404, "NotFound", "the server could not find the resource"))
        namespace, name = unquote(parts[4]), unquote(parts[6])
        labels = self.pods.get((namespace, name))
        if labels is None:
            return self.reply(h, 404, status_object(404, "NotFound", f'pods "{name}" not found'))
        body = {"kind": "Pod", "apiVersion": "v1",
                "metadata": {"name": name, "namespace": namespace, "uid": self.uids.get((namespace, name), "0b5c"),
                             "labels": labels},
                "spec": {"containers": [{"name": "pytorch"}]}, "status": {"phase": "Running"}}
        return self.reply(h, 200, json.dumps(body).encode())

    @staticmethod
    def reply(h: BaseHTTPRequestHandler, code: int, body: bytes) -> None:
        try:
            h.send_response(code)
            h.send_header("Content-Type", "application/json")
            h.send_header("Content-Length", str(len(body)))
            h.end_headers()
            h.wfile.write(body)
        except OSError:  # the client gave up (timeout test)
            pass

    def paths(self) -> list[str]:
        with self.lock:
            return [path for path, _ in self.seen]


def status_object(code: int, reason: str, message: str) -> bytes:
    return json.dumps({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                       "message": message, "reason": reason, "code": code}).encode()


@pytest.fixture
def token(tmp_path: Path) -> str:
    path = tmp_path / "token"
    path.write_text("eyJhbGciOi.test-token\n")
    return str(path)


def labels_for(api: ApiServer, token: str, clock: FakeClock | None = None, **kw) -> KubeApiPodLabels:
    return KubeApiPodLabels(api.url, token_file=token, ca_file=None, timeout=kw.pop("timeout", 2.0),
                            clock=clock or FakeClock(), **kw)


def kinds(errors: list[str]) -> list[str]:
    assert all(isinstance(e, AttributionError) for e in errors)
    return [e.kind for e in errors]


def test_labels_with_the_bearer_token(api: ApiServer, token: str) -> None:
    api.pods[("train", "llama-worker-0")] = {JOB_LABEL: "llama-pretrain", "team": "nlp"}
    api.pods[("train", "bare")] = {}
    lookup = labels_for(api, token)
    assert lookup("train", "llama-worker-0") == {JOB_LABEL: "llama-pretrain", "team": "nlp"}
    assert lookup("train", "bare") == {}
    assert api.seen == [("/api/v1/namespaces/train/pods/llama-worker-0", "Bearer eyJhbGciOi.test-token"),
                        ("/api/v1/namespaces/train/pods/bare", "Bearer eyJhbGciOi.test-token")]
    assert lookup.refresh() == []


def test_token_is_reread_and_optional(api: ApiServer, tmp_path: Path) -> None:
    api.pods[("a", "p")] = {}
    token = tmp_path / "token"
    token.write_text("one")
    clock = FakeClock()
    lookup = labels_for(api, str(token), clock, ttl=10)
    lookup("a", "p")
    token.write_text("two")  # the kubelet rotates bound service-account tokens in place
    clock.now += 10
    lookup("a", "p")
    assert [auth for _, auth in api.seen] == ["Bearer one", "Bearer two"]
    no_token = KubeApiPodLabels(api.url, token_file=str(tmp_path / "absent"), ca_file=None, clock=FakeClock())
    assert no_token("a", "p") == {}
    assert api.seen[-1][1] is None


def test_one_request_per_pod_per_ttl(api: ApiServer, token: str) -> None:
    api.pods[("train", "w-0")] = {"team": "a"}
    api.pods[("train", "w-1")] = {"team": "b"}
    clock = FakeClock()
    lookup = labels_for(api, token, clock, ttl=60)
    for _ in range(5):
        assert lookup("train", "w-0") == {"team": "a"}
        assert lookup("train", "w-1") == {"team": "b"}
        clock.now += 11  # 44 s in all: still inside the ttl
    assert len(api.seen) == 2
    api.pods[("train", "w-0")] = {"team": "c"}
    clock.now += 20
    assert lookup("train", "w-0") == {"team": "c"}
    assert len(api.seen) == 3


def test_hostile_names_are_escaped_as_one_segment(api: ApiServer, token: str) -> None:
    lookup = labels_for(api, token)
    assert lookup("train", "x/../../../../api/v1/secrets?watch=1#frag") is None
    assert lookup("a b", "p%2Fq") is None
    assert lookup("..", "w-0") is None  # a dot segment no escaping survives: never asked
    assert lookup("train", ".") is None
    assert api.paths() == [
        "/api/v1/namespaces/train/pods/x%2F..%2F..%2F..%2F..%2Fapi%2Fv1%2Fsecrets%3Fwatch%3D1%23frag",
        "/api/v1/namespaces/a%20b/pods/p%252Fq",
    ]
    assert all(len(p.split("/")) == 7 for p in api.paths())
    assert pod_path("..", ".") == "/api/v1/namespaces/%2E%2E/pods/%2E"
    assert kinds(lookup.refresh()) == ["kube_api_not_found"] * 2 + ["kube_api_invalid_name"] * 2


def test_label_wins_over_the_pod_name(api: ApiServer, token: str, kubelet) -> None:
    servicer, _, path = kubelet
    servicer.pods = TRAINING
    api.pods[("train", "llama-worker-0")] = {JOB_LABEL: "llama-7b-pretrain"}
    api.pods[("train", "llama-worker-1")] = {"team": "nlp"}  # no job label: derived from the name
    api.pods[("serve", "vllm-7d9c8b6f5-x2k9q")] = {JOB_LABEL: "ignored", "team": "serving"}
    attributor = KubernetesAttributor(path, timeout=5, pod_labels=labels_for(api, token))
    assert attributor.refresh() == []
    assert attributor.lookup(GPU0, "0").job == "llama-7b-pretrain"  # a well-known label, no --job-pod-label
    assert attributor.lookup(GPU1, "1").job == "llama-7b-pretrain"
    assert attributor.lookup("GPU-x", "2", "1", "MIG-aaaaaaaa-aaaa-bbbb-cccc-dddddddddddd").job == "llama"

    team = KubernetesAttributor(path, timeout=5, pod_labels=labels_for(api, token), job_label="team")
    team.refresh()
    served = team.lookup("GPU-x", "2", "2", MIG_C)
    assert (served.namespace, served.pod, served.container, served.job) == (
        "serve", "vllm-7d9c8b6f5-x2k9q", "vllm", "serving")
    assert team.lookup(GPU0, "0").job == "llama"  # the configured label only; the pod lacks it


def test_forbidden_falls_back_counts_once_and_backs_off(api: ApiServer, token: str, kubelet, caplog) -> None:
    servicer, _, path = kubelet
    servicer.pods = TRAINING
    api.mode = "forbidden"
    clock = FakeClock()
    lookup = labels_for(api, token, clock, ttl=60, backoff=30)
    attributor = CompositeAttributor([
        KubernetesAttributor(path, timeout=5, pod_labels=lookup, job_label=JOB_LABEL, clock=clock), lookup])
    with caplog.at_level(logging.INFO, logger="truegpu.attribution"):
        errors = attributor.refresh()
        assert kinds(errors) == ["kube_api_forbidden"]
        assert "cannot get resource" in errors[0] and "RBAC get on pods" in errors[0]
        assert attributor.lookup(GPU0, "0").job == "llama"  # derived from llama-worker-0
        assert attributor.lookup("GPU-x", "2", "2", MIG_C).job == "vllm"
        assert len(api.seen) == 1  # the other pods were not asked while backing off
        clock.now += 31
        api.mode = "ok"
        api.pods.update({(p.namespace, p.name): {} for p in TRAINING})
        api.pods[("train", "llama-worker-0")] = {JOB_LABEL: "llama-7b-pretrain"}
        assert attributor.refresh() == []
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "kube_api_forbidden" in warnings[0].getMessage()
    assert any("recovered from kube_api_forbidden" in r.getMessage() for r in caplog.records)
    assert attributor.lookup(GPU0, "0").job == "llama-7b-pretrain"


def test_not_found_is_counted_and_remembered(api: ApiServer, token: str) -> None:
    clock = FakeClock()
    lookup = labels_for(api, token, clock, ttl=60)
    assert lookup("train", "gone-worker-0") is None
    assert lookup("train", "gone-worker-0") is None
    assert len(api.seen) == 1
    errors = lookup.refresh()
    assert kinds(errors) == ["kube_api_not_found"] and "404" in errors[0]
    api.pods[("train", "other")] = {"a": "b"}
    assert lookup("train", "other") == {"a": "b"}  # a 404 does not pause the other pods


@pytest.mark.parametrize(("mode", "kind"), [
    ("unauthorized", "kube_api_unauthorized"),
    ("error", "kube_api_error"),
    ("garbage", "kube_api_error"),
])
def test_other_failures(api: ApiServer, token: str, mode: str, kind: str) -> None:
    api.mode = mode
    lookup = labels_for(api, token)
    assert lookup("train", "w-0") is None
    assert kinds(lookup.refresh()) == [kind]
    assert lookup.refresh() == []


def test_slow_api_server_times_out(api: ApiServer, token: str) -> None:
    api.mode, api.delay = "slow", 1.5
    clock = FakeClock()
    lookup = labels_for(api, token, clock, timeout=0.2, backoff=30)
    assert lookup("train", "w-0") is None
    assert lookup("train", "w-1") is None  # paused: no second timeout
    assert kinds(lookup.refresh()) == ["kube_api_timeout"]
    assert len(api.seen) == 1


def test_unreachable_and_stale_labels(api: ApiServer, token: str) -> None:
    api.pods[("train", "w-0")] = {JOB_LABEL: "run-1"}
    clock = FakeClock()
    lookup = labels_for(api, token, clock, ttl=60, max_stale=300, backoff=10)
    assert lookup("train", "w-0") == {JOB_LABEL: "run-1"}
    api.server.shutdown()
    api.server.server_close()
    clock.now += 61
    assert lookup("train", "w-0") == {JOB_LABEL: "run-1"}  # the last good labels, within max_stale
    assert kinds(lookup.refresh()) == ["kube_api_unavailable"]
    clock.now += 300
    assert lookup("train", "w-0") is None
    lookup.refresh()
    assert lookup._cache == {}  # pruned


def test_no_cluster_no_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    lookup = KubeApiPodLabels(clock=FakeClock())
    assert lookup("a", "b") is None
    assert kinds(lookup.refresh()) == ["kube_api_unconfigured"]
    assert in_cluster_url({"KUBERNETES_SERVICE_HOST": "10.96.0.1", "KUBERNETES_SERVICE_PORT": "443"}) == (
        "https://10.96.0.1:443")
    assert in_cluster_url({"KUBERNETES_SERVICE_HOST": "fd00::1"}) == "https://[fd00::1]:443"
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1")
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", "6443")
    assert KubeApiPodLabels().api_url == "https://10.96.0.1:6443"


def test_build_attributor_end_to_end(api: ApiServer, token: str, kubelet, tmp_path: Path) -> None:
    from exporter.attribution import publish_allocations, refresh_attribution
    from exporter.sources.base import Reading

    servicer, _, path = kubelet
    servicer.pods = [*TRAINING, pod("dev", "pinned", ("c", [("nvidia.com/gpu", ["GPU-pinned"])]))]
    api.pods[("train", "llama-worker-0")] = {"team": "nlp"}
    job_map = tmp_path / "jobs.yaml"
    job_map.write_text('dev/pinned: "hand-made"\n')
    attributor = build_attributor(path, ttl=10, static_jobs=load_job_map(str(job_map)), job_label="team",
                                  kube_api=api.url, kube_token_file=token)
    assert isinstance(attributor, CompositeAttributor)
    reading = Reading()
    refresh_attribution(reading, attributor)
    publish_allocations(reading, attributor, [({"gpu": "0", "UUID": GPU0}, GPU0, "0", None, None),
                                              ({"gpu": "9", "UUID": "GPU-pinned"}, "GPU-pinned", "9", None, None)])
    jobs = {labels["pod"]: labels["workload"] for samples in reading.samples.values() for labels, _ in samples}
    assert jobs == {"llama-worker-0": "nlp", "pinned": "hand-made"}
    assert "/api/v1/namespaces/dev/pods/pinned" not in api.paths()  # the job map needs no lookup
    assert {e.kind for e in reading.errors} == {"kube_api_not_found"}  # llama-worker-1, vllm, notebooks
    assert reading.up


def test_job_map_files(tmp_path: Path) -> None:
    good = tmp_path / "jobs.json"
    good.write_text(json.dumps({"train/w-0": "run-1", "train/w-1": 7}))
    assert load_job_map(str(good)) == {"train/w-0": "run-1", "train/w-1": "7"}
    (tmp_path / "empty.yaml").write_text("")
    assert load_job_map(str(tmp_path / "empty.yaml")) == {}
    for text in ("- a\n- b\n", "w-0: run\n", "train/w-0: ''\n", "a/b/c: x\n", "{unclosed\n"):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ValueError):
            load_job_map(str(bad))


def test_cli_flags(api: ApiServer, token: str, tmp_path: Path) -> None:
    from exporter.sources import describe_source
    from exporter.sources.nvml import from_args
    from truegpu.cli import build_parser

    job_map = tmp_path / "jobs.yaml"
    job_map.write_text("train/w-0: run-1\n")
    argv = ["exporter", "--source", "nvml", "--kubelet-socket", "/tmp/absent.sock", "--job-pod-label", JOB_LABEL,
            "--kube-api", api.url, "--kube-token-file", token, "--kube-ca-file", "/etc/ssl/ca.crt",
            "--job-map", str(job_map)]
    args = build_parser().parse_args(argv)
    assert (args.job_pod_label, args.kube_api, args.kube_token_file, args.kube_ca_file, args.job_map) == (
        JOB_LABEL, api.url, token, "/etc/ssl/ca.crt", str(job_map))
    assert f"job_pod_label={JOB_LABEL}" in describe_source("nvml", args)
    source = from_args(args)
    composite = source._attributor
    kube, lookup = composite.attributors
    assert isinstance(kube, KubernetesAttributor) and isinstance(lookup, KubeApiPodLabels)
    assert (kube.job_label, kube.static_jobs, kube.pod_labels) == (JOB_LABEL, {"train/w-0": "run-1"}, lookup)
    assert (lookup.api_url, lookup.token_file, lookup.ca_file) == (api.url, token, "/etc/ssl/ca.crt")

    plain = from_args(build_parser().parse_args(["exporter", "--source", "nvml", "--kubelet-socket", "/x.sock"]))
    assert isinstance(plain._attributor, KubernetesAttributor) and plain._attributor.pod_labels is None
    with pytest.raises(ValueError, match="--job-pod-label need --kubelet-socket"):
        from_args(build_parser().parse_args(["exporter", "--source", "nvml", "--job-pod-label", "team"]))
