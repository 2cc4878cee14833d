"""Detectors: one file per finding kind behind one small interface, and the runner.

A detector is a dataclass whose fields are its thresholds (with justified defaults) and
whose ``detect(fleet)`` returns findings of its ``kind``; its class attribute ``paging`` says
how the generated alert rules page on its findings (a :class:`Paging`, or None with the
reason in ``not_paged``). Registering is decorating the class with ``@register``; every
module in this package is imported on first use, so a new detector is one new file here (plus
its test): the registry is the one list of finding kinds, which the API's ``kind`` enum, the
alert rules (alerts.rules), the dashboards' finding filters, ``evaluate``, the site config's
``detectors`` section, docs/findings.md and the conformance suite (tests) all read.

``run_detectors`` runs the chosen kinds with optional per-kind overrides
(``{"idle_masking": {"sm_max": 0.25}}``); a detector that raises is logged and noted in
``fleet.notes`` and the others still run: one bug must not hide every other finding.

A service that re-analyzes a sliding window (``serve``, ``evaluate --replay``) passes one :class:`Memory`
to every run: a detector whose evidence takes longer to build than the window holds (``remembers = True``)
is called as ``detect(fleet, part)`` with its own part of it, and carries what the window lost from run to
run. Without one (``analyze`` of a whole history) it judges the data alone.
"""

from __future__ import annotations

import importlib
import logging
import pkgutil
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, fields, is_dataclass
from typing import Any, Protocol, TypeVar, runtime_checkable

import numpy as np
import pandas as pd

from analyzer.analysis.episodes import column
from analyzer.data.frame import Fleet
from analyzer.findings import Finding, sort_findings

log = logging.getLogger(__name__)


@dataclass(frozen=True, kw_only=True)
class Paging:
    """How the analyzer's alert rules page on a kind's open findings (alerts.rules builds them).

    ``says`` completes "GPU g on host (workload ns/w) ..." and may hold ``{score}``; ``severity``
    None pages with the finding's own severity (what the detector calls critical pages), a fixed
    one (FinOps waste: "warning") tickets; ``hold_s`` is the alert's ``for``, ``keep_s`` its ``keep_firing_for``
    (0: none): a finding that flickers (withdrawn for a run or a few, then back) keeps its alert firing instead of
    resolving and paging again."""

    alert: str
    team: str
    says: str
    severity: str | None = None
    hold_s: float = 300.0
    keep_s: float = 0.0
    #: The summary before "GPU g of host" (default: the alert name without "Gpu").
    summary: str | None = None


@runtime_checkable
class Detector(Protocol):
    """Finds one kind of problem; configured through dataclass fields with defaults."""

    kind: str
    paging: Paging | None

    def detect(self, fleet: Fleet) -> list[Finding]: ...


class Memory:
    """What the detectors of one service carry from run to run: per kind, a dict the detector owns.

    Bounded by the detectors (each drops what its next runs no longer read). Kept across restarts only in
    ``serve --state-file`` (analyzer.service.state), so a part holds plain data: numbers, text, lists, dicts
    and DataFrames; without it each detector starts again from its data alone."""

    def __init__(self, parts: dict[str, dict[Any, Any]] | None = None) -> None:
        self._parts: dict[str, dict[Any, Any]] = dict(parts or {})

    def part(self, kind: str) -> dict[Any, Any]:
        return self._parts.setdefault(kind, {})

    def parts(self) -> dict[str, dict[Any, Any]]:
        """Every kind's part (the service state saves them)."""
        return self._parts


#: kind -> detector class (constructed with keyword overrides of its fields).
DETECTORS: dict[str, type] = {}
_D = TypeVar("_D", bound=type)
_loaded = False


def register(cls: _D) -> _D:
    """Class decorator: make a detector available to ``run_detectors`` under its ``kind``."""
    kind = getattr(cls, "kind", None)
    if not isinstance(kind, str) or not kind:
        raise TypeError(f"{cls.__name__} needs a class attribute `kind`")
    if not is_dataclass(cls):
        raise TypeError(f"{cls.__name__} must be a dataclass (its fields are its configuration)")
    paging = getattr(cls, "paging", ...)
    if not (isinstance(paging, Paging) or (paging is None and getattr(cls, "not_paged", ""))):
        raise TypeError(f"{cls.__name__} needs a class attribute `paging` (a Paging, or None with the reason "
                        "in `not_paged`)")
    if kind in DETECTORS and DETECTORS[kind] is not cls:
        raise ValueError(f"two detectors for kind {kind!r}: {DETECTORS[kind].__name__} and {cls.__name__}")
    DETECTORS[kind] = cls
    return cls


def load_detectors() -> dict[str, type]:
    """Import every module of this package once (each registers its detector); the registry."""
    global _loaded
    if not _loaded:
        for mod in pkgutil.iter_modules(__path__):
            if not mod.name.startswith("_"):
                importlib.import_module(f"{__name__}.{mod.name}")
        _loaded = True
    return DETECTORS


def kinds() -> list[str]:
    """Every registered finding kind, sorted: the one list the API, rules, dashboards and docs use."""
    return sorted(load_detectors())


def paging_table() -> list[dict[str, Any]]:
    """Per kind: the alert that pages on its findings (team, severity policy, hold) or why none does."""
    rows = []
    for kind in kinds():
        cls = DETECTORS[kind]
        p: Paging | None = cls.paging
        rows.append({"kind": kind, "detector": f"{cls.__module__}.{cls.__name__}",
                     "alert": p.alert if p else None, "team": p.team if p else None,
                     "severity": (p.severity or "the finding's") if p else None,
                     "hold_s": p.hold_s if p else None, "not_paged": None if p else cls.not_paged})
    return rows


def make_detector(kind: str, config: Mapping[str, Any] | None = None) -> Detector:
    """A detector of ``kind`` with ``config`` overriding its defaults (unknown keys are an error)."""
    registry = load_detectors()
    if kind not in registry:
        raise ValueError(f"no detector for kind {kind!r} (available: {', '.join(sorted(registry))})")
    cls = registry[kind]
    config = dict(config or {})
    defaults = {f.name: f.default for f in fields(cls)}
    unknown = sorted(set(config) - set(defaults))
    if unknown:
        raise ValueError(f"{kind}: unknown setting(s) {', '.join(unknown)} (known: {', '.join(sorted(defaults))})")
    for name, value in config.items():
        if not _same_type(defaults[name], value):
            raise ValueError(f"{kind}.{name}: expected {type(defaults[name]).__name__} like {defaults[name]!r}, "
                             f"got {value!r}")
    return cls(**config)


def _same_type(default: Any, value: Any) -> bool:
    """A setting's value fits its field: bools are bools, numbers finite numbers (ints integral)."""
    if isinstance(default, bool) or isinstance(value, bool):
        return isinstance(default, bool) and isinstance(value, bool)
    if isinstance(default, int | float):
        if not isinstance(value, int | float) or not np.isfinite(value):
            return False
        return not isinstance(default, int) or float(value).is_integer()
    return True


def gpu_busy(fleet: Fleet) -> np.ndarray:
    """Fraction of time a kernel was resident: GPU util, else DCGM's GR engine activity, else NaN.

    NVML/DCGM report no GPU util for MIG instances; DCGM_FI_PROF_GR_ENGINE_ACTIVE is the
    profiling-level measure of the same thing (graphics/compute engine busy time), reported
    per MIG instance and in dcgm-exporter's default counters.
    """
    u = column(fleet, "gpu_util")
    gr = column(fleet, "gr_active")
    return np.where(np.isnan(u), gr, u)


def clock_max(fleet: Fleet) -> np.ndarray:
    """Per row: the GPU's max SM clock; where not reported (dcgm-exporter's default counters lack
    DCGM_FI_DEV_MAX_SM_CLOCK), the highest SM clock any GPU of the same model reached in the data of the
    fleet's reference hosts (analyzer.data.reference): busy GPUs of one model boost to the same clock, so
    that is their unthrottled clock. Without it a capped or clock-locked GPU has no clock deficit to show."""
    mx = column(fleet, "sm_clock_max")
    missing = np.isnan(mx)
    if not missing.any() or not fleet.has("sm_clock"):
        return mx
    clk = column(fleet, "sm_clock")
    f = fleet.frame
    model = f["model"] if "model" in f.columns else pd.Series(np.zeros(len(f)))
    codes = pd.factorize(model)[0]
    best = pd.Series(np.where(fleet.reference_rows(), clk, np.nan)).groupby(codes).max()
    return np.where(missing, best.reindex(codes).to_numpy(dtype=np.float64), mx)


def run_detectors(
    fleet: Fleet,
    kinds: Iterable[str] | None = None,
    config: Mapping[str, Mapping[str, Any]] | None = None,
    memory: Memory | None = None,
) -> list[Finding]:
    """Findings of every requested kind (all registered ones by default), most urgent first; ``memory``: the
    calling service's (module docstring)."""
    registry = load_detectors()
    config = config or {}
    chosen = list(kinds) if kinds is not None else sorted(registry)
    detectors = [make_detector(k, config.get(k)) for k in chosen]  # bad kinds/settings fail loudly, before work
    out: list[Finding] = []
    for det in detectors:
        try:
            if memory is not None and getattr(det, "remembers", False):
                found = det.detect(fleet, memory.part(det.kind))
            else:
                found = det.detect(fleet)
        except Exception as e:  # one broken detector must not hide the others' findings
            log.exception("detector %s failed", det.kind)
            fleet.notes.append(f"detector {det.kind} failed: {type(e).__name__}: {e}")
            continue
        out.extend(found)
    return sort_findings(out)


__all__ = ["DETECTORS", "Detector", "Memory", "Paging", "gpu_busy", "kinds", "load_detectors", "make_detector",
           "paging_table", "register", "run_detectors"]
