"""The daily cost rollups a long-running ``truegpu serve`` keeps, and cost reports read back from them.

:class:`RollupWriter` is the service loop's after-run hook: it analyzes the current UTC day
and replaces that day's rows in the rollup store (:mod:`analyzer.finops.store`), so a cost
report over 30 days reads 30 days of rows rather than 30 days of raw telemetry.

A day is analyzed in pieces of at most ``PIECE_S`` (one hour), each loaded with ``CONTEXT_S`` of data
either side for the detectors and counted over its own hour only (rollup rows are additive, so the day is
their sum). A piece whose context after it is complete is final and kept until its day is written for the
last time: each write analyzes the newest one or two pieces, not the day so far. Why: the day so far at
serve's 60 s step is 14 M rows at 10,000 GPUs by midnight, re-read every hour; a piece with its context is
at most two hours whatever the time of day. A finding is classified with the half hour before and after
its piece (idle_allocated and degraded_gpu need 30 minutes of history); one longer than that is judged
per piece, as the service's own 30-minute window judges it, and claims in each piece the share of its lost
GPU-hours that falls there. The day's devices are counted in every piece: where a piece has no data of a
device (an hour nobody reported, a GPU gone) its hours are unknown, with the allocation it last had while
its workload lives on in that piece. A day in pieces equals the day at once (tests/analyzer/finops/
test_rollups.py) but for one approximation: a device silent since before a piece's context keeps its
allocation there only when the piece lacks it entirely, not when the loader returns its rows empty
(mixed-fleet: one GPU-hour of a lost GPU's unknown hours under "(unallocated)" rather than its namespace).
:func:`rollup_report` turns stored rows back into a :class:`~analyzer.finops.costs.CostReport`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any

import numpy as np
import pandas as pd

from analyzer.data.frame import Fleet, merged_accounting
from analyzer.data.load import NoTelemetry
from analyzer.data.signals import ALLOCATION_COLUMNS, DEVICE_COLUMNS, PLACEMENT_COLUMNS
from analyzer.service.fmt import short_error
from exporter.timeparse import iso

if TYPE_CHECKING:
    from analyzer.findings import Finding
    from analyzer.service.loop import Analysis, Loader
    from analyzer.site import SiteConfig

log = logging.getLogger(__name__)


#: Attempts at writing a closed day's final rollup before giving up on it (logged each time).
MAX_ROLLUP_ATTEMPTS = 5
#: Longest piece of a day analyzed at once, and the data loaded either side of it for the detectors.
PIECE_S = 3600.0
CONTEXT_S = 1800.0
#: What names a device, and what a device keeps in an hour without data (identity, placement, the
#: gpu_share its GPU-hours are weighted by, and its last allocation).
_DEVICE_KEY = ["hostname", "gpu", "gpu_instance"]
_IDENTITY = (*DEVICE_COLUMNS, *PLACEMENT_COLUMNS, "gpu_share", *ALLOCATION_COLUMNS)


@dataclass(frozen=True)
class _Piece:
    """One analyzed piece of a day: its rollup rows, its devices (identity columns, allocation at their last
    row), the workloads it saw, and its frame's columns (no rows), step and dialect for the rows of devices
    it lacks."""

    rows: pd.DataFrame
    devices: pd.DataFrame
    jobs: frozenset[str]
    columns: pd.DataFrame
    step: float
    dialect: str
    #: Slurm accounting of its workloads (Fleet.accounting): a device's unknown hours keep its job's user/account.
    accounting: pd.DataFrame


def _keys(devices: pd.DataFrame) -> pd.Index:
    return pd.MultiIndex.from_frame(devices[_DEVICE_KEY].astype(str))


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
        #: Final pieces (their context after them complete), by piece start.
        self.final: dict[float, _Piece] = {}

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
        """Analyze [start, end) (within one UTC day) piece by piece and replace its day's rollups; the rows
        written."""
        from analyzer.finops import ROLLUP_KEY_COLUMNS

        t0 = time.perf_counter()
        pieces: list[tuple[float, float, _Piece | None]] = []
        for a in np.arange(start, end, PIECE_S):
            a, b = float(a), min(float(a) + PIECE_S, end)
            piece = self.final[a] if a in self.final else self._piece(a, b, end)
            if piece is not None and b - a >= PIECE_S and b + CONTEXT_S <= end:
                self.final[a] = piece
            pieces.append((a, b, piece))
        self.final = {a: p for a, p in self.final.items() if a >= start - 86400.0}  # today's and yesterday's
        seen = [p for _, _, p in pieces if p is not None]
        if not seen:
            log.warning("rollup: no data for %s .. %s; not written", iso(start), iso(end))
            return 0
        # The day's devices are in every piece: unknown where a piece's window had no data of them, with the
        # allocation they last had while its workload lives on there (as a whole-day load holds it), never
        # left out of the day's GPU-hours.
        day = pd.concat([p.devices for p in seen], ignore_index=True).drop_duplicates(_DEVICE_KEY, keep="last")
        rows, last = [p.rows for p in seen], day.iloc[:0]
        accounting = merged_accounting(*(p.accounting for p in seen))
        for a, b, piece in pieces:
            missing = day[~_keys(day).isin(_keys(piece.devices))] if piece is not None else day
            if len(missing):
                held = last.set_index(_keys(last)).reindex(_keys(missing))
                lives = held["job"].isin(piece.jobs).to_numpy() if piece is not None and "job" in held else False
                for c in (c for c in ALLOCATION_COLUMNS if c in missing.columns):
                    missing = missing.assign(**{c: np.where(lives, held[c].to_numpy(dtype=object), None)})
                rows.append(self._unknown(missing, seen[0], a, b, accounting))
            if piece is not None:
                last = pd.concat([last, piece.devices], ignore_index=True).drop_duplicates(_DEVICE_KEY, keep="last")
        rows = pd.concat(rows, ignore_index=True)
        sums = [c for c in rows.columns if c not in ROLLUP_KEY_COLUMNS]
        day_rows = rows.groupby(list(ROLLUP_KEY_COLUMNS), sort=True)[sums].sum().reset_index()
        day_rows.attrs = dict(seen[0].rows.attrs)
        from analyzer.finops.store import open_store

        with open_store(self.store) as store:
            store.write_rollups(day_rows)
        self.writes += 1
        log.info("rollup: wrote %d row(s) for %s .. %s to %s in %.1fs (%d piece(s))", len(day_rows), iso(start),
                 iso(end), self.store, time.perf_counter() - t0, len(pieces))
        return len(day_rows)

    def _piece(self, a: float, b: float, end: float) -> _Piece | None:
        """Rollup rows of [a, b), analyzed with up to CONTEXT_S either side (not past ``end``); None: no data."""
        from analyzer.pipeline import detect

        try:
            fleet = self.loader(a - CONTEXT_S, min(b + CONTEXT_S, end))
        except NoTelemetry:  # an hour nobody reported: its devices are unknown there (``write``)
            return None
        if fleet.frame.empty:
            return None
        # An open finding runs to the end of the data it was found in, not to the end of the piece: its
        # lost GPU-hours are split over that span (analysis.partition).
        findings = [f if f.end is not None else replace(f, end=fleet.end) for f in detect(fleet, self.kinds,
                                                                                          self.site)]
        own = fleet.between(a, b)
        if own.frame.empty:
            return None
        identity = [c for c in own.frame.columns if c in _IDENTITY]
        devices = own.frame.drop_duplicates(_DEVICE_KEY, keep="last")[identity].reset_index(drop=True)
        jobs = frozenset(own.frame["job"].dropna().astype(str)) if "job" in own.frame.columns else frozenset()
        return _Piece(self._rows(own, findings), devices, jobs, own.frame.iloc[:0].copy(), own.step, own.dialect,
                      own.accounting)

    def _rows(self, fleet: Fleet, findings: Sequence[Finding]) -> pd.DataFrame:
        """The rollup rows of ``fleet`` (every group-by), its rows classified with ``findings``."""
        from analyzer.analysis.scores import compute_scores
        from analyzer.finops import ROLLUP_GROUP_BY, cost_report, daily_rollups

        scores = compute_scores(fleet)
        parts = [daily_rollups(cost_report(fleet, scores, findings, self.catalog, group_by=group_by,
                                           team_map=self.team_map, site=self.site))
                 for group_by in self.group_bys or ROLLUP_GROUP_BY]
        out = pd.concat(parts, ignore_index=True)
        out.attrs = dict(parts[0].attrs)
        return out

    def _unknown(self, missing: pd.DataFrame, like: _Piece, a: float, b: float,
                 accounting: pd.DataFrame) -> pd.DataFrame:
        """Rollup rows of devices (identity and allocation columns) with nothing known over [a, b)."""
        times = np.arange(a, b, like.step)
        frame = missing.loc[missing.index.repeat(len(times))].reset_index(drop=True).astype(
            {c: "category" for c in missing.columns if c != "gpu_share"})
        frame["timestamp"] = np.tile(times, len(missing))
        for c, dtype in like.columns.dtypes.items():
            if c not in frame.columns:
                frame[c] = pd.Series(np.nan, index=frame.index, dtype="category" if dtype == "category" else "float64")
        fleet = Fleet(frame=frame[list(like.columns.columns)], step=like.step, start=a, end=b, dialect=like.dialect,
                      accounting=accounting)
        return self._rows(fleet, [])


def rollup_report(rows: Any, group_by: str, start_day: Any, end_day: Any, catalog: Any,
                  until: float | None = None) -> Any:
    """A CostReport over stored daily rollups (per day, group and model).

    SKU and list unit price are today's catalog entry for each stored model (rows written before
    the store kept models have model "" and none); the dollars are those stored when the day was written.

    ``until`` ends the report before the end of ``end_day`` (today's rollup covers up to now, not
    up to midnight: a charge period never ends in the future)."""
    from datetime import UTC, datetime, time, timedelta

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
