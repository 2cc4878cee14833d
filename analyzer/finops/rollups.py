"""The daily cost rollups a long-running ``truegpu serve`` keeps, and cost reports read back from them.

:class:`RollupWriter` is the service loop's after-run hook: it re-analyzes the current UTC day
and replaces that day's rows in the rollup store (:mod:`analyzer.finops.store`), so a cost
report over 30 days reads 30 days of rows rather than 30 days of raw telemetry.
:func:`rollup_report` turns stored rows back into a :class:`~analyzer.finops.costs.CostReport`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from analyzer.service.fmt import short_error
from exporter.timeparse import iso

if TYPE_CHECKING:
    from analyzer.service.loop import Analysis, Loader
    from analyzer.site import SiteConfig

log = logging.getLogger(__name__)


#: Attempts at writing a closed day's final rollup before giving up on it (logged each time).
MAX_ROLLUP_ATTEMPTS = 5


class RollupWriter:
    """After-run hook writing the daily cost rollups (analyzer.finops) to a rollup store.

    Every ``every`` seconds of data it re-analyzes the current UTC day so far, ``[midnight, end)``
    of the latest run, and replaces that day in the store (``write_day`` is idempotent: a rerun,
    a restart or a second replica rewrites the same rows). When a run lands on a new day, the
    day that closed is written once more over all its 24 hours first (its final numbers); on the
    first run after start-up the previous day is written too when the store lacks it. A day
    without any data is never written (an outage must not erase a day already stored).

    Runs in the loop thread (the store connection is opened and closed per write, as SQLite
    connections belong to their thread); errors are logged by the service and retried next run.
    """

    def __init__(
        self, loader: Loader, store: str, catalog: Any, *, team_map: Mapping[str, str] | None = None,
        kinds: Sequence[str] | None = None, every: float = 3600.0, group_bys: Sequence[str] | None = None,
        site: SiteConfig | None = None,
    ) -> None:
        self.loader, self.store, self.catalog, self.site = loader, store, catalog, site
        self.team_map = dict(team_map) if team_map else None
        self.kinds = list(kinds) if kinds is not None else None
        self.every = float(every)
        self.group_bys = tuple(group_bys) if group_bys is not None else None
        #: End of the data last written, and the start of the day it belongs to.
        self.last_end: float | None = None
        self.last_day: float | None = None
        #: Closed days still to write (start of day), and failed attempts per day.
        self.pending: list[float] = []
        self.failures: dict[float, int] = {}
        self.writes = 0

    def __call__(self, analysis: Analysis) -> None:
        end = float(analysis.end)
        day = math.floor(end / 86400.0) * 86400.0
        first = self.last_day is None
        if not first and self.last_day == day and end - (self.last_end or 0.0) < self.every:
            return
        if first:
            previous = day - 86400.0
            try:
                if not self._has_day(previous):
                    self.write(previous, day)
            except Exception as exc:  # best effort: Prometheus may not hold yesterday at all
                log.warning("rollup: yesterday (%s) not written: %s", iso(previous), short_error(exc))
        elif self.last_day is not None and self.last_day < day:
            self.pending.append(self.last_day)  # the closed day, once more over all its hours
        for closed in list(self.pending):
            try:
                self.write(closed, closed + 86400.0)
                self.pending.remove(closed)
            except Exception as exc:
                self.failures[closed] = self.failures.get(closed, 0) + 1
                if self.failures[closed] >= MAX_ROLLUP_ATTEMPTS:
                    self.pending.remove(closed)
                log.error("rollup: closed day %s not written (attempt %d of %d): %s", iso(closed),
                          self.failures[closed], MAX_ROLLUP_ATTEMPTS, short_error(exc))
        self.last_day = day
        if end > day:
            self.write(day, end)  # errors reach the service's log; retried on the next run
        self.last_end = end

    def _has_day(self, day_start: float) -> bool:
        from datetime import UTC, datetime

        from analyzer.finops.store import open_store

        with open_store(self.store) as store:
            return datetime.fromtimestamp(day_start, UTC).date() in store.days("namespace")

    def write(self, start: float, end: float) -> int:
        """Analyze [start, end) (within one UTC day) and replace its day's rollups; the rows written."""
        from analyzer.finops import ROLLUP_GROUP_BY, cost_report, daily_rollups
        from analyzer.finops.store import open_store
        from analyzer.pipeline import analyze

        t0 = time.perf_counter()
        fleet = self.loader(start, end)
        if fleet.frame.empty:
            log.warning("rollup: no data for %s .. %s; not written", iso(start), iso(end))
            return 0
        result = analyze(fleet, self.kinds, self.site, partition=False)
        written = 0
        with open_store(self.store) as store:
            for group_by in self.group_bys or ROLLUP_GROUP_BY:
                report = cost_report(fleet, result.scores, result.findings, self.catalog, group_by=group_by,
                                     team_map=self.team_map, site=self.site)
                rows = daily_rollups(report)
                for day, part in rows.groupby("day", sort=True):
                    extra = [c for c in part.columns if c in ("cluster", "currency")]  # text: not stored
                    store.write_day(str(day), group_by, part.drop(columns=extra))
                    written += len(part)
        self.writes += 1
        log.info("rollup: wrote %d row(s) for %s .. %s to %s in %.1fs", written, iso(start), iso(end), self.store,
                 time.perf_counter() - t0)
        return written


def rollup_report(rows: Any, group_by: str, start_day: Any, end_day: Any, catalog: Any,
                  until: float | None = None) -> Any:
    """A CostReport over stored daily rollups (per day, group and model).

    SKU and list unit price are today's catalog entry for each stored model (rows written before
    the store kept models have model "" and none); the dollars are those stored when the day was written.

    ``until`` ends the report before the end of ``end_day`` (today's rollup covers up to now, not
    up to midnight: a charge period never ends in the future)."""
    from datetime import UTC, datetime, time, timedelta

    import numpy as np

    from analyzer.finops.costs import DETAIL_COLUMNS, ROLLUP_COST_COLUMNS, ROLLUP_HOUR_COLUMNS, CostReport, summarize

    detail = rows.rename(columns={"key": "group"}).copy()
    for c in (*ROLLUP_HOUR_COLUMNS, *ROLLUP_COST_COLUMNS):
        detail[c] = detail[c].astype(float).fillna(0.0) if c in detail.columns else 0.0
    detail["model"] = detail["model"].fillna("").astype(str) if "model" in detail.columns else ""
    entries = {m: catalog.lookup(m) if catalog is not None and m else None for m in set(detail["model"])}
    detail["sku"] = [getattr(entries[m], "key", None) for m in detail["model"]]
    detail["unit_price"] = np.array([getattr(entries[m], "price_per_gpu_hour", np.nan) for m in detail["model"]],
                                    dtype=np.float64)
    detail = detail[list(DETAIL_COLUMNS)].reset_index(drop=True)
    groups, totals = summarize(detail)
    start = datetime.combine(start_day, time(), UTC).timestamp()
    end = datetime.combine(end_day + timedelta(days=1), time(), UTC).timestamp()
    if until is not None:
        end = max(start, min(end, float(until)))
    days = sorted(set(detail["day"]))
    notes = [f"from the daily rollup store: {len(days)} of {math.ceil((end - start) / 86400 - 1e-9)} day(s) have data"]
    return CostReport(group_by=group_by, start=start, end=end, step=86400.0,
                      currency=getattr(catalog, "currency", ""), cluster=getattr(catalog, "cluster", None),
                      detail=detail, groups=groups, totals=totals, catalog_source="rollup store", notes=notes)


__all__ = ["MAX_ROLLUP_ATTEMPTS", "RollupWriter", "rollup_report"]
