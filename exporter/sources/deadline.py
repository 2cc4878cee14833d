"""Bound how long a scrape waits for a real source.

NVML calls can hang for seconds (a GPU in recovery, a wedged driver) and an HTTP source can
stall. The collection must still finish in time, for the other sources and for a scrape that
collects, so every real source is wrapped: the inner collection runs on a worker thread, and
when it overruns the deadline the collection gets the last good values marked stale instead of
nothing. At most one inner collection runs at a time, so a hung source never piles up threads.
"""

from __future__ import annotations

import logging
import threading
import time

from exporter.sources.base import Reading, Source

log = logging.getLogger(__name__)

TIMEOUT = "timeout"
SOURCE_FAILED = "source_failed"


class _Run:
    """One inner collection in flight on its own thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.reading: Reading | None = None
        self.error: BaseException | None = None


class DeadlineSource(Source):
    """Runs ``inner.collect()`` with a deadline; serves the last good Reading (stale) on overrun.

    The collector reads ``stale`` (True while the values served are old) and
    ``last_success`` (unix time of the last complete inner collection, 0.0 before the first).
    """

    def __init__(self, inner: Source, deadline: float) -> None:
        if deadline <= 0:
            raise ValueError("deadline must be > 0 seconds")
        self.inner = inner
        self.name = inner.name  # type: ignore[misc]  # the wrapper speaks for its inner source
        self.deadline = float(deadline)
        self.stale = False
        self.last_success = 0.0
        self._lock = threading.Lock()
        self._run: _Run | None = None
        self._last_good: Reading | None = None
        # One long-lived worker instead of a thread per collection: starting a thread costs more
        # than a whole collection of some sources, and collections come every few seconds.
        self._wake = threading.Event()
        self._closed = False
        self._worker: threading.Thread | None = None

    def _work(self, run: _Run) -> None:
        try:
            reading = self.inner.collect()
        except BaseException as exc:
            run.error = exc
        else:
            run.reading = reading
            with self._lock:
                self._last_good = reading
                self.last_success = time.time()
        finally:
            run.done.set()

    def _loop(self) -> None:
        while True:
            self._wake.wait()
            self._wake.clear()
            if self._closed:
                return
            run = self._run
            if run is not None and not run.done.is_set():
                self._work(run)

    def _current_run(self) -> _Run:
        """The collection in flight, or a new one when none is (never two at once)."""
        with self._lock:
            if self._run is None or self._run.done.is_set():
                self._run = _Run()
                if self._worker is None:
                    self._worker = threading.Thread(target=self._loop, name=f"collect-{self.name}", daemon=True)
                    self._worker.start()
                self._wake.set()
            return self._run

    def collect(self) -> Reading:
        run = self._current_run()
        if run.done.wait(self.deadline):
            if run.error is not None:
                self.stale = False
                reading = Reading()
                reading.fail(SOURCE_FAILED, f"{self.name} collection raised {run.error!r}")
                log.warning("source %s raised: %r", self.name, run.error)
                return reading
            self.stale = False
            assert run.reading is not None
            return run.reading
        with self._lock:
            last = self._last_good
        self.stale = True
        reading = Reading(samples=dict(last.samples) if last is not None else {})
        reading.fail(
            TIMEOUT,
            f"{self.name} collection did not finish within {self.deadline:g} s; "
            + ("serving the last good values" if last is not None else "no earlier values to serve"),
        )
        return reading

    def close(self) -> None:
        self._closed = True
        self._wake.set()
        self.inner.close()
