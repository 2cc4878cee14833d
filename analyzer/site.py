"""The site config: one YAML file for what differs from one site to the next.

Sections (each optional; a missing section keeps the defaults):

``workload_classes``: what a healthy workload of each class attains, so the GPU-hour
partition (analyzer.analysis.partition) can tell the normal headroom of healthy work from recoverable
under-use. A list, checked in order, before the built-in classes (an entry named like a
built-in one replaces it)::

    workload_classes:
      - name: training
        match: {workload: ["*train*", "*sft*"], namespace: ["research-*"]}   # globs per allocation label
        floor: 0.45                    # effective utilization healthy work of the class attains
      - name: inference
        match: {namespace: ["serving", "*-inference"]}
        floor: {default: 0.10, "*H100*": 0.12}                         # per GPU model (globs)

A workload's class is the first class with a glob matching its workload, namespace or pod name
(case-insensitive). Workloads no class matches are *unclassified*: their gap is reported as
such, never as headroom or as waste.

``selectors``: how this site's Prometheus labels the data (the monitoring mixins' ``_config``)::

    selectors:
      cluster_label: k8s_cluster          # kept through every rule grouping and dashboard ("" = one cluster)
      exporter_job: gpu-exporter          # scrape job names (defaults: truegpu-exporter, ...)
      analyzer_job: truegpu-analyzer
      dcgm_job: dcgm-exporter

``thresholds``: limits and hold times shared by the alert rules and the analyzer's detectors, so
an alert and a finding about the same GPU agree on when it starts and how severe it is::

    thresholds:
      gpu_temp_limit_celsius: 85          # die temperature at the slowdown point (critical)
      memory_temp_limit_celsius: 95       # HBM throttle point (critical)
      thermal_limit_for_seconds: 60       # at the limit this long: GpuThermalThrottling / thermal finding
      thermal_warn_for_seconds: 300       # hot this long: GpuNearThermalLimit / hot-GPU finding

``detectors``: any documented setting of a detector (its dataclass fields, see each module of
``analyzer/detectors``), for analyze, serve, report and evaluate alike::

    detectors:
      straggler: {min_duration_s: 300}
      idle_masking: {sm_max: 0.25}

``alerting``: what ``python -m alerts --site FILE --out DIR`` generates for this site::

    alerting:
      runbook_base: https://wiki.example/gpu-runbooks
      dashboard_base: https://grafana.example       # dashboard_url: <base>/d/<uid>?var-...
      receivers:                          # Alertmanager receiver -> webhook URL ("*": all others)
        "*": https://alerts.example/hook
        serving-oncall: https://pager.example/serving
      owners:                             # hardware alerts of GPUs these namespaces hold
        - {namespace: "serving|inference-.*", receiver: serving-oncall}

``access``: API tokens scoped to namespaces (or Slurm accounts), for job owners (``truegpu serve``'s
``--api-token-file`` token is the admin's and sees everything). A scoped token sees the findings, workload
and namespace scores, cost groups and job reports of its namespaces (globs) or accounts only, and nothing
fleet-wide; the config holds the token's SHA-256 (``printf %s TOKEN | sha256sum``) or a file to read it
from, never the token itself::

    access:
      tokens:
        - {name: llm-team, sha256: 2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae,
           namespaces: ["llm", "research-*"]}
        - {name: physics, token_file: /etc/truegpu/tokens/physics, accounts: ["phys-*"]}   # Slurm accounts

Built-in floors (calibration: AcmeTrace, NSDI 2024, production DCGM telemetry of two LLM
clusters: busy GPUs run at ~60 % SM activity while reporting ~95 % GPU util):

* training 0.45 = three quarters of the busy-GPU median: synchronous data-parallel training
  spends the rest in communication, launch and input; below it a job is held back by
  something it can fix (small batches, a slow loader, a memory-bound phase).
* inference 0.10: services are sized for peak traffic and latency, so they run below peak by
  design (a service at 30-50 % of its load runs at SM 0.15-0.25); below 0.10 the replicas are
  over-provisioned for the traffic they get.
"""

from __future__ import annotations

import fnmatch
import hashlib
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from analyzer.data.signals import ALLOCATION_COLUMN_OF
from exporter import schema as S

#: Labels a class can match on, as the site file names them (wire labels: ``workload``, not ``job``).
MATCH_LABELS: tuple[str, ...] = (S.WORKLOAD, "namespace", "pod")
#: Sections a site config may hold (a typo is an error, never silently ignored).
SECTIONS: tuple[str, ...] = ("workload_classes", "selectors", "thresholds", "detectors", "alerting", "access")
#: Threshold keys that are ratios (0..1); the others are non-negative numbers.
_RATIOS = frozenset({"busy_utilization"})
_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
#: The class of workloads no class matches.
UNCLASSIFIED = "unclassified"


@dataclass(frozen=True)
class WorkloadClass:
    """A class of workloads and the effective utilization its healthy members attain."""

    name: str
    #: frame column (analyzer.data.signals.ALLOCATION_COLUMN_OF of a match label) -> globs (case-insensitive).
    match: Mapping[str, tuple[str, ...]]
    #: Effective utilization healthy work of this class attains at least (0..1).
    floor: float
    #: (GPU model glob, floor) overrides, first match wins.
    model_floors: tuple[tuple[str, float], ...] = ()

    def matches(self, label: str, value: str) -> bool:
        v = value.lower()
        return any(fnmatch.fnmatchcase(v, g.lower()) for g in self.match.get(label, ()))

    def floor_for(self, model: str | None) -> float:
        m = (model or "").lower()
        for pattern, floor in self.model_floors:
            if fnmatch.fnmatchcase(m, pattern.lower()):
                return floor
        return self.floor


DEFAULT_CLASSES: tuple[WorkloadClass, ...] = (
    WorkloadClass("training", {
        "job": ("*train*", "*finetune*", "*fine-tune*", "*sft*", "*rlhf*", "*dpo*"),
        "namespace": ("*train*", "*research*"),
    }, 0.45),
    WorkloadClass("inference", {
        "job": ("*serve*", "*serving*", "*infer*", "*vllm*", "*triton*", "*tgi*"),
        "namespace": ("*serving*", "*infer*"),
    }, 0.10),
)


@dataclass(frozen=True)
class Selectors:
    """How this site's Prometheus labels the data."""

    #: The label telling clusters apart in a multi-cluster Prometheus/Thanos/Mimir (an external or
    #: target label): every rule grouping and join keeps it, dashboards have a variable for it.
    #: Where it is absent the groupings behave as without it; "" leaves it out altogether.
    cluster_label: str = "cluster"
    #: Prometheus scrape job names the health alerts select (deploy/prometheus.yml).
    exporter_job: str = "truegpu-exporter"
    analyzer_job: str = "truegpu-analyzer"
    dcgm_job: str = "dcgm-exporter"


@dataclass(frozen=True)
class Thresholds:
    """Limits shared by alert rules and detectors (each names who reads it).

    The slowdown points: H100s manage clocks from their 87 C maximum operating temperature and
    slow down hard around 85-90 C on the die; HBM3 throttles at ~95 C. One minute at the limit
    is lost work (a single 15-60 s sample is a transient); heatsinks lag power by 1-3 minutes, so
    five minutes of running hot rules out load transients.
    """

    #: Die temperature counted as "at the limit" where throttle reasons are not collected
    #: (rules: GpuThermalThrottling; thermal detector: ``at_limit_c``; straggler: ``thermal_celsius``,
    #: the cause it names for a slow GPU that hot; degraded_gpu: ``throttle_c``, above which heat is thermal's).
    gpu_temp_limit_celsius: float = 85.0
    #: HBM temperature at its throttle point (rules: GpuThermalThrottling; detector: ``mem_limit_c``).
    memory_temp_limit_celsius: float = 95.0
    #: At the limit this long is critical (rules: GpuThermalThrottling ``for``; detector: ``min_throttle_s``).
    thermal_limit_for_seconds: float = 60.0
    #: Running hot this long is a warning (rules: GpuNearThermalLimit ``for``; detector: ``min_hot_s``).
    thermal_warn_for_seconds: float = 300.0
    #: Rules only (the analyzer judges a hot GPU against its peers at the same load instead): die and
    #: HBM temperatures that mean "close to slowing down" whatever the load (GpuNearThermalLimit).
    gpu_temp_near_celsius: float = 83.0
    memory_temp_near_celsius: float = 90.0
    #: Rules only: a GPU counts as busy above this utilization (GpuPcieLinkDowngraded: idle GPUs
    #: legitimately drop their PCIe link to a lower generation to save power).
    busy_utilization: float = 0.2

    def detector_settings(self) -> dict[str, dict[str, float]]:
        """The detectors' fields these thresholds set (``run_detectors`` overrides)."""
        return {"thermal": {"at_limit_c": self.gpu_temp_limit_celsius, "mem_limit_c": self.memory_temp_limit_celsius,
                            "min_throttle_s": self.thermal_limit_for_seconds,
                            "min_hot_s": self.thermal_warn_for_seconds},
                "straggler": {"thermal_celsius": self.gpu_temp_limit_celsius},
                "degraded_gpu": {"throttle_c": self.gpu_temp_limit_celsius}}


#: The built-in thresholds (detector dataclass defaults read them).
THRESHOLDS = Thresholds()


@dataclass(frozen=True)
class Alerting:
    """What ``python -m alerts --site FILE`` generates for this site (None: the generator's default)."""

    #: Where ``runbook_url`` and ``dashboard_url`` (Grafana) annotations point.
    runbook_base: str | None = None
    dashboard_base: str | None = None
    #: Alertmanager receiver -> webhook URL ("*" for every receiver not named).
    receivers: Mapping[str, str] = field(default_factory=dict)
    #: (namespace regex, receiver): hardware alerts of GPUs those namespaces hold go to that receiver.
    owners: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class ScopedToken:
    """An API token that sees the namespaces its globs match (``access`` section)."""

    name: str
    #: SHA-256 of the token.
    digest: bytes = field(repr=False)
    namespaces: tuple[str, ...]
    #: Slurm accounts (globs) whose jobs it sees too (analyzer.data.frame.ACCOUNTING_COLUMNS).
    accounts: tuple[str, ...] = ()

    def sees(self, namespace: str | None) -> bool:
        return bool(namespace) and any(fnmatch.fnmatchcase(str(namespace), g) for g in self.namespaces)

    def sees_account(self, account: str | None) -> bool:
        return bool(account) and any(fnmatch.fnmatchcase(str(account), g) for g in self.accounts)


@dataclass(frozen=True)
class SiteConfig:
    """Everything site-specific; ``default_site()`` when no file is given."""

    workload_classes: tuple[WorkloadClass, ...] = DEFAULT_CLASSES
    selectors: Selectors = field(default_factory=Selectors)
    thresholds: Thresholds = THRESHOLDS
    #: kind -> {setting: value}: the detectors' documented dataclass fields (checked against the
    #: registry by analyzer.pipeline.detector_settings, which also merges the thresholds).
    detectors: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    alerting: Alerting = field(default_factory=Alerting)
    #: API tokens scoped to namespaces (the admin token is serve's --api-token-file).
    tokens: tuple[ScopedToken, ...] = ()
    #: Where it came from (a path, or "defaults").
    source: str = "defaults"

    def class_names(self) -> list[str]:
        return [c.name for c in self.workload_classes]


def default_site() -> SiteConfig:
    return SiteConfig()


def _ratio(value: Any, where: str, what: str = "floor") -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)) \
            or not 0.0 <= float(value) <= 1.0:
        raise ValueError(f"{where}: {what} must be a number in 0..1, got {value!r}")
    return float(value)


def _globs(value: Any, where: str) -> tuple[str, ...]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, Sequence) or not items or not all(isinstance(g, str) and g for g in items):
        raise ValueError(f"{where}: expected a glob or a list of globs, got {value!r}")
    return tuple(items)


def _workload_class(raw: Any, where: str) -> WorkloadClass:
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping with name, match and floor, got {raw!r}")
    unknown = set(raw) - {"name", "match", "floor"}
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {sorted(unknown)} (allowed: name, match, floor)")
    name = raw.get("name")
    if not isinstance(name, str) or not name or name == UNCLASSIFIED:
        raise ValueError(f"{where}: name must be a non-empty string other than {UNCLASSIFIED!r}, got {name!r}")
    where = f"{where} ({name})"
    match = raw.get("match")
    if not isinstance(match, Mapping) or not match:
        raise ValueError(f"{where}: match must map one of {', '.join(MATCH_LABELS)} to globs")
    bad = [k for k in match if k not in MATCH_LABELS]
    if bad:
        raise ValueError(f"{where}: match on {bad} is not supported (use {', '.join(MATCH_LABELS)})")
    floor = raw.get("floor")
    model_floors: list[tuple[str, float]] = []
    if isinstance(floor, Mapping):
        if "default" not in floor:
            raise ValueError(f"{where}: a floor per GPU model needs a 'default' entry")
        model_floors = [(str(k), _ratio(v, f"{where} floor[{k}]")) for k, v in floor.items() if k != "default"]
        floor = floor["default"]
    return WorkloadClass(name, {ALLOCATION_COLUMN_OF[k]: _globs(v, f"{where} match.{k}") for k, v in match.items()},
                         _ratio(floor, where), tuple(model_floors))


def parse_site(data: Any, origin: str = "site config") -> SiteConfig:
    """A SiteConfig from parsed YAML; errors name the file and the entry."""
    if data is None:
        return SiteConfig(source=origin)
    if not isinstance(data, Mapping):
        raise ValueError(f"{origin}: expected a mapping of sections, got {type(data).__name__}")
    unknown = [k for k in data if k not in SECTIONS]
    if unknown:
        raise ValueError(f"{origin}: unknown section(s) {unknown} (known: {', '.join(SECTIONS)})")
    raw = data.get("workload_classes", [])
    if not isinstance(raw, list):
        raise ValueError(f"{origin}: workload_classes must be a list")
    mine = [_workload_class(r, f"{origin}: workload_classes[{i}]") for i, r in enumerate(raw)]
    names = [c.name for c in mine]
    if len(set(names)) != len(names):
        raise ValueError(f"{origin}: workload class names repeat: {names}")
    classes = (*mine, *(c for c in DEFAULT_CLASSES if c.name not in names))
    return SiteConfig(workload_classes=classes,
                      selectors=_section(Selectors, data.get("selectors"), f"{origin}: selectors"),
                      thresholds=_section(Thresholds, data.get("thresholds"), f"{origin}: thresholds"),
                      detectors=_detectors(data.get("detectors"), f"{origin}: detectors"),
                      alerting=_alerting(data.get("alerting"), f"{origin}: alerting"),
                      tokens=_access(data.get("access"), f"{origin}: access"), source=origin)


def _detectors(raw: Any, where: str) -> dict[str, dict[str, Any]]:
    """``{kind: {setting: number or bool}}``; kinds and settings are checked against the registry later."""
    if raw is None:
        return {}
    if not isinstance(raw, Mapping) or not all(isinstance(v, Mapping) for v in raw.values()):
        raise ValueError(f"{where}: expected kind -> {{setting: value}}, got {raw!r}")
    out: dict[str, dict[str, Any]] = {}
    for kind, settings in raw.items():
        for name, value in settings.items():
            if not isinstance(value, bool | int | float) or (not isinstance(value, bool) and not math.isfinite(value)):
                raise ValueError(f"{where}.{kind}.{name}: expected a finite number or true/false, got {value!r}")
        out[str(kind)] = dict(settings)
    return out


def _section(cls: type, raw: Any, where: str) -> Any:
    """A flat section of typed keys (the dataclass' fields): unknown keys and wrong types are errors."""
    if raw is None:
        return cls()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping")
    defaults = cls()
    known = [f.name for f in fields(cls)]
    unknown = [k for k in raw if k not in known]
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} (known: {', '.join(known)})")
    out: dict[str, Any] = {}
    for k, v in raw.items():
        at = f"{where}.{k}"
        if k == "cluster_label":
            if not isinstance(v, str) or (v and not _LABEL_NAME.fullmatch(v)):
                raise ValueError(f"{at}: expected a Prometheus label name (or \"\" for none), got {v!r}")
            out[k] = v
        elif isinstance(getattr(defaults, k), str):
            out[k] = _text(v, at)
        elif k in _RATIOS:
            out[k] = _ratio(v, at, "a ratio")
        elif isinstance(v, bool) or not isinstance(v, int | float) or not math.isfinite(v) or v < 0:
            raise ValueError(f"{at}: expected a non-negative number, got {v!r}")
        else:
            out[k] = float(v)
    return cls(**out)


def _text(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ValueError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _alerting(raw: Any, where: str) -> Alerting:
    if raw is None:
        return Alerting()
    if not isinstance(raw, Mapping):
        raise ValueError(f"{where}: expected a mapping")
    keys = ("runbook_base", "dashboard_base", "receivers", "owners")
    unknown = [k for k in raw if k not in keys]
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {unknown} (known: {', '.join(keys)})")
    receivers = raw.get("receivers") or {}
    if not isinstance(receivers, Mapping):
        raise ValueError(f"{where}.receivers: expected receiver -> webhook URL")
    for name, url in receivers.items():
        if not _text(url, f"{where}.receivers.{name}").startswith(("http://", "https://")):
            raise ValueError(f"{where}.receivers.{name}: a webhook URL starts with http:// or https://, got {url!r}")
    owners = []
    for i, entry in enumerate(raw.get("owners") or []):
        at = f"{where}.owners[{i}]"
        if not isinstance(entry, Mapping) or set(entry) != {"namespace", "receiver"}:
            raise ValueError(f"{at}: expected {{namespace: REGEX, receiver: NAME}}, got {entry!r}")
        pattern, receiver = _text(entry["namespace"], at), _text(entry["receiver"], at)
        try:
            re.compile(pattern)
        except re.error as exc:
            raise ValueError(f"{at}: namespace is not a valid regular expression: {exc}") from None
        if receiver not in receivers and "*" not in receivers:
            raise ValueError(f"{at}: receiver {receiver!r} has no webhook URL under receivers")
        owners.append((pattern, receiver))
    links = {k: _text(raw[k], f"{where}.{k}") for k in ("runbook_base", "dashboard_base") if raw.get(k) is not None}
    return Alerting(**links, receivers={str(k): str(v) for k, v in receivers.items()}, owners=tuple(owners))


_SHA256 = re.compile(r"[0-9a-f]{64}")


def _access(raw: Any, where: str) -> tuple[ScopedToken, ...]:
    """The scoped tokens: name, sha256 (hex) or token_file, namespaces (globs); names and tokens unique."""
    if raw is None:
        return ()
    if not isinstance(raw, Mapping) or set(raw) - {"tokens"}:
        raise ValueError(f"{where}: expected {{tokens: [...]}}, got {raw!r}")
    out: list[ScopedToken] = []
    for i, entry in enumerate(raw.get("tokens") or []):
        at = f"{where}.tokens[{i}]"
        if not isinstance(entry, Mapping):
            raise ValueError(f"{at}: expected {{name, sha256 or token_file, namespaces}}, got {entry!r}")
        unknown = set(entry) - {"name", "sha256", "token_file", "namespaces", "accounts"}
        if unknown:
            raise ValueError(f"{at}: unknown key(s) {sorted(unknown)} (known: name, sha256, token_file, namespaces, "
                             "accounts)")
        name = _text(entry.get("name"), f"{at}.name")
        at = f"{at} ({name})"
        if ("sha256" in entry) == ("token_file" in entry):
            raise ValueError(f"{at}: give sha256 (the token's SHA-256 in hex) or token_file, one of them")
        if "sha256" in entry:
            hexd = str(entry["sha256"]).strip().lower()
            if not _SHA256.fullmatch(hexd):
                raise ValueError(f"{at}.sha256: expected 64 hex digits (printf %s TOKEN | sha256sum)")
            digest = bytes.fromhex(hexd)
        else:
            path = Path(_text(entry["token_file"], f"{at}.token_file"))
            try:
                token = path.read_text(encoding="utf-8").strip()
            except OSError as exc:
                raise ValueError(f"{at}.token_file: cannot read {path}: {exc.strerror or exc}") from None
            if not token:
                raise ValueError(f"{at}.token_file: {path} is empty")
            digest = hashlib.sha256(token.encode("utf-8")).digest()
        if not entry.get("namespaces") and not entry.get("accounts"):
            raise ValueError(f"{at}: give the namespaces (globs) or Slurm accounts it sees")
        scopes = {k: _globs(entry[k], f"{at}.{k}") if entry.get(k) is not None else () for k in ("namespaces",
                                                                                                 "accounts")}
        out.append(ScopedToken(name, digest, **scopes))
    for what, values in (("names", [t.name for t in out]), ("tokens", [t.digest for t in out])):
        if len(set(values)) != len(values):
            raise ValueError(f"{where}: scoped token {what} repeat")
    return tuple(out)


def load_site(path: str | Path | None) -> SiteConfig:
    """The site config in ``path`` (YAML), or the defaults when ``path`` is None."""
    if path is None:
        return default_site()
    from analyzer.yamlfile import read_yaml

    return parse_site(read_yaml(path, "site config"), str(path))
