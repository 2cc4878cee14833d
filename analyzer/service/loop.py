"""The analyzer service: a loop that re-analyzes the last ``window`` of telemetry every ``interval``.

Each run loads ``[now - window, now)`` from a Prometheus-compatible API (``truegpu serve`` keeps
the window between runs and reads only the new steps: :mod:`analyzer.data.window`), scores it and
runs the detectors (:mod:`analyzer.pipeline`); a complete run is swapped in as one immutable
:class:`Analysis`, so readers (/metrics, and the HTTP API of :mod:`analyzer.service.app`)
always see one consistent result set. No FastAPI here: the loop runs without the web app.
A failed run (Prometheus down, slow, or returning nothing) is logged with the URL and
recorded in :class:`Health`; the last good analysis keeps being served, and the next tick
retries. Nothing a run does can stop the loop. Each run's findings take the ids of the findings of
the same problem that the runs of the last window showed (:class:`analyzer.findings.IdMemory`), so
a problem keeps its id while the window slides over it, across failed runs and runs it was missing
from too. Detectors whose evidence takes longer to build than the window holds (degraded_gpu's CUSUM and a
GPU's own earlier level) carry it from run to run in one :class:`analyzer.detectors.Memory`. Both survive a
restart only through a state file (:mod:`analyzer.service.state`, ``serve --state-file``); without one a
restarted service derives ids afresh from kind, entity and start, and its first window's worth of runs judge
their data alone.

Heavy imports (pandas via the analyzer) happen in the loop thread, not at import time.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from analyzer.findings import IdMemory
from analyzer.service.fmt import label_value, number, short_error
from exporter.timeparse import iso

if TYPE_CHECKING:
    from analyzer.analysis.scores import Scores
    from analyzer.data.frame import Fleet
    from analyzer.findings import Finding
    from analyzer.service.state import StateFile
    from analyzer.site import SiteConfig

log = logging.getLogger(__name__)

DEFAULT_INTERVAL = 60.0
DEFAULT_WINDOW = 1800.0
DEFAULT_STEP = 60.0

#: (start, end) -> Fleet; the production loader wraps load_prometheus.
Loader = Callable[[float, float], "Fleet"]


def aligned_end(now: float, step: float) -> float:
    """The end of the window a run at ``now`` analyzes: ``now`` aligned down to the step, so rows line
    up from run to run (``truegpu evaluate --replay`` cuts history the same way)."""
    return math.floor(now / step) * step


@dataclass(frozen=True)
class JobUtilization:
    namespace: str
    job: str
    effective_util: float | None
    reported_util: float | None
    allocated_gpus: float | None


@dataclass(frozen=True)
class Analysis:
    """One complete run's results; never mutated once published."""

    #: Window analyzed, [start, end).
    start: float
    end: float
    step: float
    #: Unix time the run finished.
    finished: float
    duration: float
    findings: tuple[Finding, ...]
    jobs: tuple[JobUtilization, ...] = ()
    #: allocation ("allocated" | "all") -> utilization; None where unknown.
    fleet_effective: Mapping[str, float | None] = field(default_factory=dict)
    fleet_reported: Mapping[str, float | None] = field(default_factory=dict)
    #: GPU-hours per part of the partition: fleet (part -> hours) and per namespace ((namespace, part) -> hours).
    fleet_parts: Mapping[str, float] = field(default_factory=dict)
    namespace_parts: Mapping[tuple[str, str], float] = field(default_factory=dict)
    #: The full inputs/outputs, for the HTTP API (findings, scores, cost reports).
    fleet: Fleet | None = None
    scores: Scores | None = None

    @property
    def open_findings(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.end is None)

    @classmethod
    def build(
        cls, fleet: Fleet, scores: Scores, findings: Sequence[Finding], *, finished: float, duration: float
    ) -> Analysis:
        """Derive what /metrics publishes from one run's fleet, scores and findings."""
        return cls(
            start=float(fleet.start), end=float(fleet.end), step=float(fleet.step),
            finished=finished, duration=duration, findings=tuple(findings),
            jobs=_job_rows(fleet, scores),
            fleet_effective=_fleet_values(scores, "effective_util"),
            fleet_reported=_fleet_values(scores, "reported_util"),
            **_part_values(scores),
            fleet=fleet, scores=scores,
        )


def _part_values(scores: Scores) -> dict[str, Any]:
    """The partition's GPU-hours per part, for the fleet and per namespace (empty when not attached)."""
    from analyzer.analysis.partition import PARTS

    p = scores.partition
    if p is None:
        return {}
    fleet = {part: p.fleet[f"{part}_gpu_hours"] for part in PARTS}
    per_ns: dict[tuple[str, str], float] = {}
    for ns, rec in p.namespace.iterrows():
        for part in PARTS:
            v = number(rec[f"{part}_gpu_hours"])
            if v is not None and v > 0:
                per_ns[(label_value(ns), part)] = v
    return {"fleet_parts": fleet, "namespace_parts": per_ns}


def _fleet_values(scores: Scores, column: str) -> dict[str, float | None]:
    out: dict[str, float | None] = {}
    for allocation, tables in (("allocated", scores.allocated), ("all", scores.levels)):
        table = tables.get("fleet")
        out[allocation] = number(table[column].iloc[0]) if table is not None and len(table) else None
    return out


def _job_rows(fleet: Fleet, scores: Scores) -> tuple[JobUtilization, ...]:
    """Allocated-only job table, each job with its namespace (the one most of its rows carry)."""
    table = scores.allocated.get("job")
    if table is None or table.empty:
        return ()
    frame = fleet.frame
    namespaces: dict[str, str] = {}
    if "job" in frame.columns and "namespace" in frame.columns:
        pairs = frame[["job", "namespace"]].astype(object).dropna()
        if not pairs.empty:
            counts = pairs.groupby(["job", "namespace"], sort=False).size().sort_values(ascending=False)
            for job, ns in counts.index:
                namespaces.setdefault(label_value(job), label_value(ns))
    hours = max(float(fleet.end) - float(fleet.start), 0.0) / 3600.0
    rows = []
    for rec in table.to_dict("records"):
        job = label_value(rec["job"])
        if not job:
            continue
        gpu_hours = number(rec["allocated_gpu_hours"])
        rows.append(JobUtilization(
            namespace=namespaces.get(job, ""), job=job,
            effective_util=number(rec["effective_util"]), reported_util=number(rec["reported_util"]),
            allocated_gpus=gpu_hours / hours if gpu_hours is not None and hours > 0 else None,
        ))
    return tuple(rows)


@dataclass(frozen=True)
class Health:
    """The loop's state: what /healthz and the analyzer_* metrics report."""

    started: float
    last_success: float | None = None
    last_error: str | None = None
    last_error_time: float | None = None
    last_attempt: float | None = None
    last_duration: float | None = None
    runs_ok: int = 0
    runs_error: int = 0
    #: serve --state-file (None without) and its writes after each good run: counts, the last one's error.
    state_file: str | None = None
    state_writes_ok: int = 0
    state_writes_error: int = 0
    state_error: str | None = None

    def stale(self, now: float, stale_after: float) -> bool:
        """No analysis yet, or the last good one is older than ``stale_after`` seconds."""
        return self.last_success is None or now - self.last_success > stale_after


@dataclass(frozen=True)
class Snapshot:
    """What readers get in one atomic read: the latest good analysis (None before the first) and health."""

    analysis: Analysis | None
    health: Health


class AnalyzerService:
    """Runs the analysis every ``interval`` seconds in a background thread and publishes the results.

    ``loader(start, end)`` returns the Fleet of ``[start, end)``; ``url`` only names the source
    in logs and /healthz. ``stale_after`` (default 2 x interval + 60 s) is how old the last good
    analysis may be before /healthz calls it stale.
    """

    def __init__(
        self,
        loader: Loader,
        *,
        url: str = "",
        interval: float = DEFAULT_INTERVAL,
        window: float = DEFAULT_WINDOW,
        step: float = DEFAULT_STEP,
        kinds: Sequence[str] | None = None,
        stale_after: float | None = None,
        clock: Callable[[], float] = time.time,
        on_result: Callable[[Analysis], None] | None = None,
        fixed: tuple[float, float] | None = None,
        site: SiteConfig | None = None,
        state: StateFile | None = None,
    ) -> None:
        if fixed is not None:
            window = fixed[1] - fixed[0]
        if interval <= 0 or window <= 0 or step <= 0:
            raise ValueError("interval, window and step must be > 0")
        if window < step:
            raise ValueError(f"window ({window:g}s) must be at least one step ({step:g}s)")
        self.loader = loader
        self.url = url
        self.interval = float(interval)
        self.window = float(window)
        self.step = float(step)
        self.kinds = list(kinds) if kinds is not None else None
        #: Workload classes etc. (analyzer.site) for the GPU-hour partition.
        self.site = site
        self.stale_after = float(stale_after) if stale_after is not None else 2 * self.interval + 60.0
        #: A fixed past range [start, end): analyzed until one run succeeds, then served as is (it
        #: cannot go stale). How people look at backfilled or historical data through the API.
        self.fixed = fixed
        if fixed is not None:
            self.stale_after = math.inf
        self.clock = clock
        #: Called in the loop thread after each good run (e.g. the daily cost rollup); its errors are logged.
        self.on_result = on_result
        #: Where the ids and the detectors' memory are kept across restarts (analyzer.service.state), or None.
        self.state = state if fixed is None else None
        self._snapshot = Snapshot(None, Health(started=clock(), state_file=None if self.state is None
                                               else str(self.state.path)))
        self._ids = IdMemory(self.window)  # a problem keeps its id as the window slides, or misses a run
        #: What detectors carry past the window (analyzer.detectors.Memory, made in the loop); a fixed range is
        #: its own whole history and carries nothing.
        self._memory: Any = None
        self._lock = threading.Lock()  # serialises writers; readers take the snapshot reference as is
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        #: Set after each run (ok or not), for tests and start-up waits.
        self.ran = threading.Condition()

    # -- reading ---------------------------------------------------------------------------
    def snapshot(self) -> Snapshot:
        return self._snapshot

    def health_json(self) -> dict[str, Any]:
        """/healthz and /readyz body: "starting" until a first good analysis, then "ok" (or "stale"
        when the last good one is older than ``stale_after``), plus the last run's state."""
        snap = self._snapshot
        h, now = snap.health, self.clock()
        a = snap.analysis
        stale = h.stale(now, self.stale_after)
        return {
            "status": "starting" if h.last_success is None else "stale" if stale else "ok",
            "prometheus": self.url,
            "last_success": None if h.last_success is None else iso(h.last_success),
            "last_success_age_seconds": None if h.last_success is None else round(now - h.last_success, 3),
            "last_error": h.last_error,
            "last_error_time": None if h.last_error_time is None else iso(h.last_error_time),
            "last_run_duration_seconds": None if h.last_duration is None else round(h.last_duration, 3),
            "stale": stale,
            "runs": {"ok": h.runs_ok, "error": h.runs_error},
            "interval_seconds": self.interval,
            "window_seconds": self.window,
            "open_findings": None if a is None else len(a.open_findings),
            "window": None if a is None else {"start": iso(a.start), "end": iso(a.end)},
            "state_file": None if h.state_file is None else {
                "path": h.state_file, "writes": {"ok": h.state_writes_ok, "error": h.state_writes_error},
                "last_error": h.state_error},
        }

    # -- running ---------------------------------------------------------------------------
    def window_at(self, now: float) -> tuple[float, float]:
        """[end - window, end) with end aligned down to the step, so rows line up from run to run;
        the fixed range when there is one."""
        if self.fixed is not None:
            return self.fixed
        end = aligned_end(now, self.step)
        return end - self.window, end

    def run_once(self) -> bool:
        """One analysis run; publishes the results on success, records the error otherwise. Never raises."""
        from analyzer.detectors import Memory
        from analyzer.pipeline import analyze

        if self._memory is None:
            self._memory = (self.state.load(self._ids) if self.state is not None else None) or Memory()
        t0 = time.perf_counter()
        now = self.clock()
        start, end = self.window_at(now)
        try:
            fleet = self.loader(start, end)
            result = analyze(fleet, self.kinds, self.site, memory=None if self.fixed else self._memory)
            self._ids.carry(result.findings, float(fleet.end))
            duration = time.perf_counter() - t0
            analysis = Analysis.build(fleet, result.scores, result.findings, finished=self.clock(), duration=duration)
        except Exception as exc:  # the loop must survive anything a run does
            duration = time.perf_counter() - t0
            message = short_error(exc)
            h = self._swap(lambda h: {"last_error": message, "last_error_time": self.clock(), "last_attempt": now,
                                      "last_duration": duration, "runs_error": h.runs_error + 1})
            kept = (f"keeping the results of {iso(h.last_success)} ({now - h.last_success:.0f}s old)"
                    if h.last_success is not None else "no results yet")
            log.error("analysis of %s failed after %.1fs: %s; %s; retrying in %gs",
                      self.url or "the source", duration, message, kept, self.interval,
                      exc_info=log.isEnabledFor(logging.DEBUG))
            self._notify()
            return False
        h = self._swap(lambda h: {"last_success": analysis.finished, "last_error": None, "last_attempt": now,
                                  "last_duration": duration, "runs_ok": h.runs_ok + 1}, analysis)
        if h.last_error is not None:
            log.info("analysis of %s works again", self.url or "the source")
        log.info("analyzed %s .. %s in %.1fs: %d finding(s), %d open",
                 iso(analysis.start), iso(analysis.end), duration, len(analysis.findings),
                 len(analysis.open_findings))
        self._keep_state(analysis.end)
        self._after(analysis)
        self._notify()
        return True

    def _keep_state(self, end: float) -> None:
        if self.state is None:
            return
        error = None
        try:
            self.state.save(self._ids, self._memory, end)
        except Exception as exc:  # a full disk must not stop the analysis; the next run tries again
            error = short_error(exc)
            log.error("cannot write the service state %s: %s", self.state.path, error,
                      exc_info=log.isEnabledFor(logging.DEBUG))
        self._swap(lambda h: {"state_error": error, "state_writes_ok": h.state_writes_ok + (error is None),
                              "state_writes_error": h.state_writes_error + (error is not None)})

    def _swap(self, change: Callable[[Health], dict[str, Any]], analysis: Analysis | None = None) -> Health:
        """Publish the health ``change(health)`` gives (and ``analysis``, when given) as one snapshot; the health
        before."""
        with self._lock:
            snap = self._snapshot
            self._snapshot = Snapshot(snap.analysis if analysis is None else analysis,
                                      replace(snap.health, **change(snap.health)))
        return snap.health

    def _after(self, analysis: Analysis) -> None:
        if self.on_result is None:
            return
        try:
            self.on_result(analysis)
        except Exception as exc:  # a failing hook (rollup store) must not stop the loop
            log.error("after-run hook failed: %s", short_error(exc), exc_info=log.isEnabledFor(logging.DEBUG))

    def _notify(self) -> None:
        with self.ran:
            self.ran.notify_all()

    def wait_for_run(self, timeout: float, runs: int = 1) -> bool:
        """Block until at least ``runs`` runs (ok or error) have finished in total; False on timeout."""
        deadline = time.monotonic() + timeout
        with self.ran:
            while True:
                h = self._snapshot.health
                if h.runs_ok + h.runs_error >= runs:
                    return True
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self.ran.wait(left)

    def _loop(self) -> None:
        while not self._stop.is_set():
            began = time.monotonic()
            if self.run_once() and self.fixed is not None:
                self._stop.wait()  # a fixed range is analyzed once: serve it until stopped
                return
            # Ticks are `interval` apart from run start; a run longer than that starts the next at once.
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - began)))

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("service already started")
        self._stop.clear()
        self._thread = threading.Thread(target=self._loop, name="analyzer-loop", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the loop; a run in progress finishes (its HTTP requests are bounded by their timeout)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            if self._thread.is_alive():
                log.warning("analysis run still in progress at shutdown; not waiting for it")
            self._thread = None


def prometheus_loader(
    url: str,
    step: float,
    *,
    matchers: Mapping[str, Any] | None = None,
    job_label: str | None = None,
    remember: bool = False,
    **client_kwargs: Any,
) -> Loader:
    """A Loader over ``load_prometheus`` with fixed step, matchers and client settings. ``remember``: the
    series' label sets are kept from one load to the next, for the loader of serve's ticks alone (each reads
    the series the last one did; a loader also reading other windows, the rollups' days, would push them out)."""
    kept: dict[str, Any] = {}

    def load(start: float, end: float) -> Fleet:
        from analyzer.data.ingest import LabelSets
        from analyzer.data.load import load_prometheus

        labelsets = kept.setdefault("labelsets", LabelSets()) if remember else None
        return load_prometheus(url, start, end, step, matchers=matchers, job_label=job_label, labelsets=labelsets,
                               **client_kwargs)  # fmt: skip

    return load


__all__ = ["Analysis", "AnalyzerService", "Health", "JobUtilization", "Loader", "Snapshot", "aligned_end",
           "prometheus_loader"]
