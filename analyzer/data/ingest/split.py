"""History files read on several cores: a large plain file in byte ranges cut at line ends, several files at
once, each piece past the one the reader reads itself read by a worker process and merged into the reader's
builder in file order.

Reading is ~95 % of ``analyze --input`` on a big file and runs at ~2 M samples/s on one core, Python-bound
(the GIL keeps threads from helping). A worker reads its range as the reader reads a whole file (the same
code, a fresh builder) and sends what it read back: its series, its pieces one metric at a time, its report
and what the file-level decisions need (its largest timestamp, its ``# EOF`` line, samples without a
timestamp). ``FrameBuilder.absorb`` adds them as if read in order, so the Samples, the report and every
line number are those of one process reading the file: tests compare them field by field.

Only plain files of at least two ``MIN_PART_BYTES`` ranges are cut (gzip streams cannot be entered in the
middle); a whole file goes to a worker from ``MIN_PART_BYTES`` of text on (``text_bytes``). Workers only start
from a process with no other thread running: the workers are forked (no re-import, and
no ``if __name__ == "__main__"`` needed in a caller's script), and forking a threaded process could copy a
lock another thread held. A range after a ``# EOF`` line, or a worker that failed, is read by the reader
itself: slower, never different. ``IngestReport.worker_parts`` counts the ranges workers read.

Memory: a worker holds what it read (~6 bytes a kept sample) until the reader takes it, a metric at a time,
so a read holds about what one process reading it all would, plus the workers' own copy-on-write pages (the
10,000-GPU file read by 2: the PSS of both together never above the reader's own peak, bench/bench_e2e.py).
"""

from __future__ import annotations

import multiprocessing
import os
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from itertools import pairwise
from pathlib import Path
from types import TracebackType
from typing import Any, NamedTuple

import numpy as np

from analyzer.data.ingest._common import BuilderPart, IngestReport

#: A range a worker reads is at least this big: below it, starting the worker costs more than it saves.
MIN_PART_BYTES = 256 << 20
#: Workers (reader included) at most, whatever the CPUs.
MAX_WORKERS = 8


def default_workers() -> int:
    """The CPUs this process may run on (its affinity, as a container's cpuset gives it), up to MAX_WORKERS."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = os.cpu_count() or 1
    return max(1, min(cpus, MAX_WORKERS))


#: The first bytes of a gzip stream (how a file is known to be gzip, whatever its name).
GZIP_MAGIC = b"\x1f\x8b"


def is_gzip(path: Path) -> bool:
    with open(path, "rb") as f:
        return f.read(2) == GZIP_MAGIC


def can_fork() -> bool:
    """Workers may be forked: the platform can, and no other thread runs (it could hold a lock the child needs)."""
    return threading.active_count() == 1 and "fork" in multiprocessing.get_all_start_methods()


def byte_ranges(path: Path, workers: int, min_bytes: int = MIN_PART_BYTES) -> list[tuple[int, int]]:
    """``[start, end)`` byte ranges of ``path``, each starting a line, at least ``min_bytes`` (one range for
    a gzip file or where a split would not pay)."""
    size = path.stat().st_size
    parts = min(max(workers, 1), size // max(min_bytes, 1))
    if parts < 2 or not can_fork() or is_gzip(path):
        return [(0, size)]
    cuts = [0]
    with open(path, "rb") as f:
        for i in range(1, parts):
            f.seek(i * size // parts)
            f.readline()  # to the start of the next line
            if cuts[-1] < f.tell() < size:
                cuts.append(f.tell())
    cuts.append(size)
    return list(pairwise(cuts))


class Task(NamedTuple):
    """One piece of a read: file ``index`` of the read (``path``), its bytes ``span`` (None: the whole file,
    plain or gzip), and whether a worker may read it (big enough to pay for one)."""

    index: int
    path: Path
    span: tuple[int, int] | None
    last: bool
    to_worker: bool


def plan(paths: list[Path], workers: int, min_bytes: int = MIN_PART_BYTES) -> list[Task]:
    """The pieces of reading ``paths`` in order: a big plain file in ranges (``byte_ranges``), every other file
    whole; with ``workers`` > 1, pieces of at least ``min_bytes`` may go to workers (several files read at once)."""
    can = workers > 1 and can_fork()
    tasks: list[Task] = []
    for i, path in enumerate(paths):
        ranges = byte_ranges(path, workers, min_bytes) if can else [(0, path.stat().st_size)]
        spans: list[tuple[int, int] | None] = [*ranges] if len(ranges) > 1 else [None]
        tasks += [Task(i, path, span, k == len(spans) - 1, can and (span is not None or text_bytes(path) >= min_bytes))
                  for k, span in enumerate(spans)]
    return tasks


#: A gzip file's text is at least this many times its size (Prometheus text compresses 10-40x).
GZIP_RATIO = 8


def text_bytes(path: Path) -> int:
    """About how much text ``path`` holds: its size, or a gzip file's recorded size (modulo 4 GiB) or
    ``GZIP_RATIO`` times its size, whichever is larger."""
    size = path.stat().st_size
    if size < 20 or not is_gzip(path):
        return size
    with open(path, "rb") as f:
        f.seek(-4, os.SEEK_END)  # ISIZE: the text's length modulo 4 GiB
        return max(GZIP_RATIO * size, int.from_bytes(f.read(4), "little"))


class RangeFile:
    """``path``'s bytes ``[start, end)`` as a binary file."""

    def __init__(self, path: Path, start: int, end: int) -> None:
        self._f = open(path, "rb")  # noqa: SIM115 - closed by close()
        self._f.seek(start)
        self._left = end - start

    def read(self, n: int = -1) -> bytes:
        n = self._left if n < 0 else min(n, self._left)
        data = self._f.read(n) if n > 0 else b""
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._f.close()

    def __enter__(self) -> RangeFile:
        return self

    def __exit__(self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


@dataclass
class Part:
    """What a worker read of its range, but its pieces (they follow one metric at a time): line numbers in
    ``report`` and ``eof_line`` count from the range's first line."""

    builder: BuilderPart
    report: IngestReport
    lines: int
    eof_line: int
    #: Lines after its ``# EOF`` that carried something (then the reader reads the range itself).
    after_eof: int
    biggest: float
    defaulted: list[tuple[np.ndarray, np.ndarray]]
    seen: set[str] = field(default_factory=set)


def _work(read: Callable[[], tuple[Part, dict[str, list[Any]]]], conn: Any) -> None:
    """A worker's body: read, send the part, then its pieces a metric at a time, then None; or ("error", why)."""
    try:
        part, pieces = read()
        conn.send(part)
        for item in pieces.items():
            conn.send(item)
        conn.send(None)
    except Exception as e:  # the reader reads the range itself
        conn.send(("error", f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


class Worker:
    """A forked process reading one range (``read`` runs there); the reader takes its part, then its pieces."""

    def __init__(self, read: Callable[[], tuple[Part, dict[str, list[Any]]]]) -> None:
        ctx = multiprocessing.get_context("fork")
        self._conn, child = ctx.Pipe(duplex=False)
        self._process = ctx.Process(target=_work, args=(read, child), daemon=True)
        self._process.start()
        child.close()

    def part(self) -> Part | str:
        """The worker's part, or why there is none."""
        try:
            got = self._conn.recv()
        except (EOFError, OSError) as e:
            self._process.join(10.0)  # its pipe closes as it ends: its exit code follows
            return f"the worker ended without an answer ({type(e).__name__}; exit code {self._process.exitcode})"
        return got if isinstance(got, Part) else str(got[1])

    def pieces(self) -> Iterator[tuple[str, list[Any]]]:
        """Its pieces, a metric at a time. A worker ending half way (killed for memory) leaves the read half
        merged: that fails loudly, never a silently shorter read."""
        try:
            while (item := self._conn.recv()) is not None:
                yield item
        except (EOFError, OSError) as e:
            self._process.join(10.0)
            raise RuntimeError(f"a worker reading history ended while sending what it read ({type(e).__name__}; "
                               f"exit code {self._process.exitcode}): read with one process (--workers 1)") from e

    def stop(self) -> None:
        if self._process.is_alive():
            self._process.terminate()
        self._process.join()
        self._conn.close()
