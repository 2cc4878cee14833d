"""Cost reports for the API: over the latest results (cached per analysis) or the rollup store."""

from __future__ import annotations

import logging
import math
import threading
from dataclasses import replace
from typing import TYPE_CHECKING, Any

from fastapi import HTTPException
from fastapi.encoders import jsonable_encoder

from analyzer.finops.rollups import rollup_report
from analyzer.service.errors import CostError, NoResults
from analyzer.service.fmt import fmt_seconds, number
from analyzer.service.settings import ApiSettings

if TYPE_CHECKING:
    from analyzer.service.loop import Analysis, AnalyzerService

log = logging.getLogger(__name__)


class CostSource:
    """Cost reports over the latest results (cached per analysis) or the rollup store."""

    def __init__(self, service: AnalyzerService, settings: ApiSettings) -> None:
        self.service, self.settings = service, settings
        self._lock = threading.Lock()
        self._cache: dict[tuple[int, str, float], tuple[Analysis, Any]] = {}

    def latest(self, analysis: Analysis, group_by: str, seconds: float | None = None) -> Any:
        """CostReport of the latest results, the last ``seconds`` of them when shorter than the loop's window."""
        if self.settings.catalog is None:
            raise CostError("no prices configured: start truegpu serve with --prices FILE")
        key = (id(analysis), group_by, seconds or 0.0)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and hit[0] is analysis:
                return hit[1]
        from analyzer.finops import cost_report

        a = last(analysis, seconds) if seconds else analysis
        if a.fleet is None or a.scores is None:
            raise NoResults("the latest results hold no scores", None, 0.0)
        report = cost_report(a.fleet, a.scores, list(a.findings), self.settings.catalog, group_by=group_by,
                             team_map=dict(self.settings.team_map) if self.settings.team_map else None,
                             site=self.service.site)
        with self._lock:
            self._cache = {k: v for k, v in self._cache.items() if v[0] is analysis}  # drop older analyses
            self._cache[key] = (analysis, report)
        return report

    def rollup(self, seconds: float, group_by: str, end: float) -> Any:
        """A CostReport from the rollup store over the UTC days covering [end - seconds, end)."""
        if self.settings.store is None:
            raise CostError(
                f"window {fmt_seconds(seconds)} is longer than the analysis window "
                f"({fmt_seconds(self.service.window)}) and no rollup store is configured: start truegpu serve "
                "with --rollup-store URL_OR_PATH, or ask for a window of at most "
                f"{fmt_seconds(self.service.window)}")
        from datetime import UTC, datetime, timedelta

        end_day = datetime.fromtimestamp(end, UTC).date()
        days = max(1, math.ceil(seconds / 86400.0))
        start_day = end_day - timedelta(days=days - 1)
        from analyzer.finops.store import open_store

        try:  # one connection per request: SQLite connections belong to their thread
            with open_store(self.settings.store) as store:
                rows = store.read(start_day, end_day, group_by, per_day=True)
        except Exception as exc:
            log.error("rollup store %s: %s", self.settings.store, exc)
            raise HTTPException(503, f"the rollup store failed: {type(exc).__name__}: {exc}") from None
        return rollup_report(rows, group_by, start_day, end_day, self.settings.catalog, until=end)


def last(analysis: Analysis, seconds: float) -> Analysis:
    """The analysis restricted to its last ``seconds`` (scores recomputed; findings that overlap)."""
    from analyzer.analysis.scores import compute_scores

    fleet = analysis.fleet
    if fleet is None:
        return analysis
    start = max(float(fleet.start), float(fleet.end) - seconds)
    sliced = fleet.between(start, fleet.end)
    scores = compute_scores(sliced)
    findings = tuple(f for f in analysis.findings if f.end is None or f.end > start)
    return replace(analysis, start=start, fleet=sliced, scores=scores, findings=findings)


def report_json(report: Any) -> dict[str, Any]:
    """A CostReport as a JSON-ready dict via the finops json output."""
    from analyzer.finops import outputs

    data = outputs.to_json(report)
    if isinstance(data, str | bytes):
        import json

        data = json.loads(data)
    return jsonable_encoder(data, custom_encoder={float: number})
