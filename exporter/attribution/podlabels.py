"""Pod labels from the Kubernetes API server, for the ``job`` of truegpu_gpu_allocation_info.

The kubelet pod-resources API names the pods holding each GPU but carries no labels, so
a job label (``--job-pod-label training.kubeflow.org/job-name``, a team label, or the
well-known operator labels of :data:`~exporter.attribution.jobs.KNOWN_JOB_LABELS`)
needs ``GET /api/v1/namespaces/{namespace}/pods/{name}`` on the API server.
:class:`KubeApiPodLabels` is that lookup, as the ``pod_labels`` callable of
:class:`~exporter.attribution.kubernetes.KubernetesAttributor`:

* in-cluster by default: ``https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT``,
  the service-account token (re-read on every request, as bound tokens rotate) and CA;
* each pod's labels are cached for ``ttl`` seconds, so the API server sees at most one
  request per GPU-holding pod per ``ttl`` from each node;
* it never raises: on any failure the lookup returns the pod's last good labels (for up
  to ``max_stale`` seconds) or None, and the job falls back to the pod-name derivation.
  Failures that concern every pod (unreachable, timeout, 401/403, 5xx) also pause all
  requests for ``backoff`` seconds, so a dead API server costs one timeout per backoff,
  not one per pod per collection. Each failure is logged once per kind until a request
  succeeds, and :meth:`KubeApiPodLabels.refresh` hands the failures since its last call
  back as :class:`~exporter.attribution.base.AttributionError` (kinds ``kube_api_*``),
  which the exporter counts in truegpu_exporter_errors_total.

The exporter's service account needs ``get`` on pods, nothing more (the node's own pods
only would be tighter, but RBAC cannot express that for plain get)::

    apiVersion: rbac.authorization.k8s.io/v1
    kind: ClusterRole
    metadata:
      name: truegpu-exporter-pod-reader
    rules:
      - apiGroups: [""]
        resources: ["pods"]
        verbs: ["get"]
    ---
    apiVersion: rbac.authorization.k8s.io/v1
    kind: ClusterRoleBinding
    metadata:
      name: truegpu-exporter-pod-reader
    roleRef:
      apiGroup: rbac.authorization.k8s.io
      kind: ClusterRole
      name: truegpu-exporter-pod-reader
    subjects:
      - kind: ServiceAccount
        name: truegpu-exporter
        namespace: monitoring

Namespace and pod names come from the kubelet (ultimately from users), so each is
percent-escaped as one path segment (``/``, ``?``, ``#``, ``%`` included) before it is
put in the URL; the dot segments ``.`` and ``..`` (which HTTP clients and proxies collapse,
and which are no valid names) are never asked for.

``requests`` is imported on the first lookup, never at import time.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from urllib.parse import quote

from exporter.attribution.base import Allocation, AttributionError

log = logging.getLogger("truegpu.attribution")

SERVICE_ACCOUNT_DIR = "/var/run/secrets/kubernetes.io/serviceaccount"
DEFAULT_TOKEN_FILE = f"{SERVICE_ACCOUNT_DIR}/token"
DEFAULT_CA_FILE = f"{SERVICE_ACCOUNT_DIR}/ca.crt"
#: Most failures kept for refresh() between two calls (one scrape); the rest are dropped.
MAX_PENDING_ERRORS = 100


def in_cluster_url(environ: Mapping[str, str] | None = None) -> str | None:
    """The API server URL from the service environment Kubernetes injects into every pod."""
    env = os.environ if environ is None else environ
    host = env.get("KUBERNETES_SERVICE_HOST", "").strip()
    if not host:
        return None
    port = env.get("KUBERNETES_SERVICE_PORT", "").strip() or "443"
    if ":" in host and not host.startswith("["):  # IPv6 literal
        host = f"[{host}]"
    return f"https://{host}:{port}"


def pod_path(namespace: str, pod: str) -> str:
    """``/api/v1/namespaces/{namespace}/pods/{pod}`` with each name escaped as one segment."""
    return f"/api/v1/namespaces/{_segment(namespace)}/pods/{_segment(pod)}"


def _segment(name: str) -> str:
    escaped = quote(name, safe="")
    # "." and ".." survive quote() but are dot segments that clients and proxies collapse;
    # requests even turns %2E back into ".", so KubeApiPodLabels never asks for those names.
    return escaped.replace(".", "%2E") if escaped in _DOT_SEGMENTS else escaped


_DOT_SEGMENTS = frozenset({"", ".", ".."})
#: Failures that concern one pod and are remembered for ttl like an answer.
_PER_POD_ANSWERS = frozenset({"kube_api_not_found", "kube_api_invalid_name"})


@dataclass
class _Entry:
    labels: dict[str, str] | None  # None: the pod was not found
    fetched_at: float
    uid: str = ""  # metadata.uid: what the pod's cgroup paths carry


class _Failure(Exception):
    """One failed request: ``kind`` for the metric; ``global_`` when it concerns every pod."""

    def __init__(self, kind: str, message: str, global_: bool = True):
        super().__init__(message)
        self.kind = kind
        self.global_ = global_


class KubeApiPodLabels:
    """``(namespace, pod) -> labels`` from the Kubernetes API server, cached; never raises.

    Also an :class:`~exporter.attribution.base.Attributor` that attributes nothing: its
    ``refresh()`` returns the lookup failures since the previous call, so putting it
    after the KubernetesAttributor in a CompositeAttributor counts them per collection.
    """

    name = "kube-api"

    def __init__(
        self,
        api_url: str | None = None,
        token_file: str | None = DEFAULT_TOKEN_FILE,
        ca_file: str | None = DEFAULT_CA_FILE,
        timeout: float = 2.0,
        ttl: float = 60.0,
        max_stale: float = 600.0,
        backoff: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.api_url = (api_url or in_cluster_url() or "").rstrip("/")
        self.token_file = token_file
        self.ca_file = ca_file
        self.timeout = timeout
        self.ttl = ttl
        self.max_stale = max(max_stale, ttl)
        self.backoff = min(ttl, 30.0) if backoff is None else backoff
        self._clock = clock
        self._lock = threading.Lock()
        self._cache: dict[tuple[str, str], _Entry] = {}
        self._paused_until: float | None = None
        self._session = None  # requests.Session, made on first use
        self._pending: list[AttributionError] = []
        self._failing: set[str] = set()  # kinds logged and not yet cleared by a success
        self.requests = 0  # HTTP requests sent (for tests and debugging)

    # -- the pod_labels callable -------------------------------------------------------

    def __call__(self, namespace: str, pod: str) -> dict[str, str] | None:
        try:
            with self._lock:
                return self._labels(namespace, pod)
        except Exception as exc:  # a bug here must never break attribution
            self._fail(_Failure("kube_api_error", f"{type(exc).__name__}: {exc}", global_=False))
            return None

    def uid(self, namespace: str, pod: str) -> str:
        """The pod's UID ("" when unknown), from the same cached request as its labels: per-process attribution
        on shared GPUs matches it with the pod UID in a process's cgroup path."""
        try:
            with self._lock:
                entry = self._entry(namespace, pod)
                return entry.uid if entry is not None else ""
        except Exception as exc:  # a bug here must never break attribution
            self._fail(_Failure("kube_api_error", f"{type(exc).__name__}: {exc}", global_=False))
            return ""

    def _labels(self, namespace: str, pod: str) -> dict[str, str] | None:
        entry = self._entry(namespace, pod)
        return entry.labels if entry is not None else None

    def _entry(self, namespace: str, pod: str) -> _Entry | None:
        """The pod's cached answer, asked anew after ttl; a stale one (up to max_stale) while the API fails."""
        key = (namespace, pod)
        now = self._clock()
        entry = self._cache.get(key)
        if entry is not None and now - entry.fetched_at < self.ttl:
            return entry
        stale = entry if entry is not None and now - entry.fetched_at < self.max_stale else None
        if self._paused_until is not None and now < self._paused_until:
            return stale
        try:
            labels, uid = self._fetch(namespace, pod)
        except _Failure as failure:
            self._fail(failure, now)
            if failure.kind not in _PER_POD_ANSWERS:
                return stale
            # E.g. the pod went away between the kubelet's list and this request: ask again after ttl.
            self._cache[key] = _Entry(None, now)
            return None
        entry = self._cache[key] = _Entry(labels, now, uid)
        self._recovered()
        return entry

    def _fetch(self, namespace: str, pod: str) -> tuple[dict[str, str], str]:
        """The pod's labels ({} when it has none) and UID; _Failure when they cannot be had."""
        where = f"{namespace}/{pod}"
        if not self.api_url:
            raise _Failure("kube_api_unconfigured",
                           "no API server: not in a cluster (KUBERNETES_SERVICE_HOST unset) and no --kube-api")
        if namespace in _DOT_SEGMENTS or pod in _DOT_SEGMENTS:
            raise _Failure("kube_api_invalid_name", f"pod {where!r}: not a Kubernetes name, not asked", global_=False)
        try:
            import requests
        except ImportError as exc:  # pragma: no cover - requests is a dependency
            raise _Failure("kube_api_error", f"pod labels need requests ({exc})") from None
        if self._session is None:
            session = requests.Session()
            session.headers["Accept"] = "application/json"
            if self.api_url.startswith("https:") and self.ca_file and os.path.exists(self.ca_file):
                session.verify = self.ca_file
            self._session = session
        headers = {}
        token = self._token()
        if token:
            headers["Authorization"] = f"Bearer {token}"
        url = self.api_url + pod_path(namespace, pod)
        self.requests += 1
        try:
            reply = self._session.get(url, headers=headers, timeout=self.timeout, allow_redirects=False)
        except requests.Timeout:
            raise _Failure("kube_api_timeout", f"GET pod {where}: no reply within {self.timeout:g}s") from None
        except requests.RequestException as exc:
            raise _Failure("kube_api_unavailable", f"GET pod {where}: {type(exc).__name__}: {exc}") from None
        status = reply.status_code
        if status == 404:
            raise _Failure("kube_api_not_found", f"GET pod {where}: 404 Not Found", global_=False)
        if status in (401, 403):
            kind = "kube_api_forbidden" if status == 403 else "kube_api_unauthorized"
            raise _Failure(kind, f"GET pod {where}: {status} {_reason(reply)} "
                           "(the exporter's service account needs RBAC get on pods)")
        if status != 200:
            raise _Failure("kube_api_error", f"GET pod {where}: HTTP {status} {_reason(reply)}", global_=status >= 500)
        try:
            body = reply.json()
            meta = body.get("metadata") or {}
            labels = meta.get("labels") or {}
            if not isinstance(labels, dict):
                raise TypeError(f"metadata.labels is {type(labels).__name__}")
        except (ValueError, TypeError, AttributeError) as exc:
            raise _Failure("kube_api_error", f"GET pod {where}: not a Pod object ({exc})", global_=False) from None
        return {str(k): str(v) for k, v in labels.items()}, str(meta.get("uid") or "")

    def _token(self) -> str | None:
        if not self.token_file:
            return None
        try:
            with open(self.token_file, encoding="utf-8") as fh:
                return fh.read().strip() or None
        except OSError:
            return None

    # -- errors ------------------------------------------------------------------------

    def _fail(self, failure: _Failure, now: float | None = None) -> None:
        if failure.global_ and now is not None:
            self._paused_until = now + self.backoff
        error = AttributionError(failure.kind, f"{self.name}: {failure}")
        if len(self._pending) < MAX_PENDING_ERRORS:
            self._pending.append(error)
        if failure.kind in self._failing:
            log.debug("%s (still failing)", error)
        else:
            self._failing.add(failure.kind)
            log.warning("pod labels: %s [%s]; jobs fall back to the pod name (logged once until it recovers)",
                        error, failure.kind)

    def _recovered(self) -> None:
        """A request succeeded: the API server is back (per-pod 404s stay logged once for good)."""
        self._paused_until = None
        for kind in sorted(self._failing - _PER_POD_ANSWERS):
            log.info("pod labels recovered from %s", kind)
        self._failing &= _PER_POD_ANSWERS

    # -- the Attributor face ------------------------------------------------------------

    def refresh(self) -> list[str]:
        """Failures since the last call (each an AttributionError); drops long-expired cache entries."""
        with self._lock:
            errors, self._pending = self._pending, []
            now = self._clock()
            for key in [k for k, e in self._cache.items() if now - e.fetched_at >= self.max_stale]:
                del self._cache[key]
            return list(errors)

    def lookup(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> Allocation | None:
        return None

    def holders(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> tuple[Allocation, ...]:
        return ()


def _reason(reply) -> str:
    """The reason of an HTTP error reply: the Status object's message when there is one."""
    try:
        body = reply.json()
        if isinstance(body, dict) and body.get("message"):
            return str(body["message"])[:200]
    except ValueError:
        pass
    return str(reply.reason or "")[:200]
