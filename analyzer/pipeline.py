"""The one analysis: a Fleet into scores (with bottlenecks and the GPU-hour partition) and findings.

Every command (``analyze``, ``demo``, ``report``, ``evaluate``) and the service's loop and rollup
writer call these two functions, so a threshold set in the site config, a new detector or a new
score reaches every output the same way.

Detector settings come from the site config (:mod:`analyzer.site`): its ``thresholds`` (shared
with the alert rules) and its ``detectors`` section (``{kind: {setting: value}}``, the
detectors' documented dataclass fields), then any explicit ``overrides`` (``evaluate``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from analyzer.analysis.partition import attach
from analyzer.analysis.scores import Scores, compute_scores
from analyzer.analysis.shares import name_holders
from analyzer.data.frame import Fleet
from analyzer.data.shard import ShardFleet
from analyzer.detectors import Memory, make_detector, run_detectors
from analyzer.findings import Finding, assign_ids
from analyzer.site import SiteConfig, default_site

Settings = Mapping[str, Mapping[str, Any]]


@dataclass(frozen=True)
class Result:
    scores: Scores
    findings: list[Finding]


def detector_settings(site: SiteConfig | None, overrides: Settings | None = None) -> dict[str, dict[str, Any]]:
    """Per-kind detector settings of a site: its thresholds, its ``detectors`` section, then ``overrides``.

    A setting both sections give is an error (the shared threshold is the one to change: it moves the
    alert rules too); every kind and setting is checked against the registry, naming the file."""
    site = site or default_site()
    shared = site.thresholds.detector_settings()
    out: dict[str, dict[str, Any]] = {k: dict(v) for k, v in shared.items()}
    for kind, settings in site.detectors.items():
        clash = sorted(set(settings) & set(shared.get(kind, {})))
        if clash:
            raise ValueError(f"{site.source}: detectors.{kind}: {', '.join(clash)} come(s) from thresholds "
                             "(shared with the alert rules): set them there")
        out.setdefault(kind, {}).update(settings)
    for kind, settings in (overrides or {}).items():
        out.setdefault(kind, {}).update(settings)
    for kind, settings in out.items():
        try:
            make_detector(kind, settings)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"{site.source}: detectors: {exc}") from None
    return out


def detect(fleet: Fleet, kinds: Sequence[str] | None = None, site: SiteConfig | None = None,
           overrides: Settings | None = None, *, memory: Memory | None = None) -> list[Finding]:
    """Findings of ``kinds`` (every registered detector by default) with the site's settings, each
    with its stable id (analyzer.findings: the same data gives the same ids). A shard's fleet is judged
    with its read-only context and keeps the findings it owns (analyzer.data.shard). ``memory``: a
    service's, carried from its last runs (analyzer.detectors.Memory)."""
    shard = fleet if isinstance(fleet, ShardFleet) else None
    findings = run_detectors(shard.whole if shard else fleet, kinds, detector_settings(site, overrides), memory)
    if shard:
        findings = [f for f in findings if shard.owns(f)]
    name_holders(fleet, findings)
    assign_ids(findings)
    return findings


def analyze(fleet: Fleet, kinds: Sequence[str] | None = None, site: SiteConfig | None = None, *,
            partition: bool = True, progress: Callable[[str], None] | None = None,
            memory: Memory | None = None) -> Result:
    """Scores and findings of one fleet; ``partition``: attach the GPU-hour partition (cost reports
    compute their own per (day, group, model) and skip it); ``progress`` hears each step; ``memory``: a
    service's (``detect``)."""
    say = progress or (lambda _message: None)
    say(f"scoring {fleet.frame.shape[0]:,} rows ({fleet.gpu_count()} GPUs, step {fleet.step:g}s)")
    scores = compute_scores(fleet)
    say("running detectors")
    findings = detect(fleet, kinds, site, memory=memory)
    say(f"{len(findings)} finding(s)")
    if partition:
        attach(scores, fleet, findings, site, ran=kinds)
    return Result(scores, findings)
