"""Slurm/HPC attribution from a job-mapping directory (dcgm-exporter's HPC convention).

A Slurm prolog writes one file per GPU the job gets and the epilog removes it:
``<dir>/<gpu index>`` for a whole GPU, ``<dir>/<gpu index>.<gpu instance>`` for a MIG
instance; each non-empty line is a job id. Other names are ignored, so the directory
may hold the prolog's own state.

Several job ids on one GPU (shared GPUs, or a stale id the epilog missed) become one
label for ``lookup``: the distinct ids sorted (numerically where they are numbers) and joined
with ``","``, so the series is stable and nothing is hidden; ``holders`` lists one holder per
job in that order (each with its own accounting). An empty file means the GPU is free. Only
``job`` is set; namespace/pod/container are empty.

Accounting: the prolog (deploy/slurm/truegpu-prolog.sh) also writes ``<meta dir>/<job id>.env`` with
``user=``, ``account=`` and ``partition=`` lines, apart from the mapping files so dcgm-exporter never
reads them; the meta directory defaults to ``slurm-meta`` beside the mapping directory (the prolog's
``/run/truegpu/slurm-jobs`` and ``/run/truegpu/slurm-meta``). Those become ``truegpu_slurm_job_info``;
several jobs on one GPU join their distinct values with ``","`` like their ids. A job without a meta
file has no accounting (never an empty user).
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable
from typing import NamedTuple

from exporter.attribution.base import Allocation, AttributionError, CachedAttributor

_NAME = re.compile(r"^(?P<gpu>\d+)(?:\.(?P<gi>\d+))?$")
#: A mapping file is a handful of job ids; anything larger is not one.
MAX_FILE_BYTES = 64 * 1024

_Key = tuple[str, str | None]
#: The prolog's metadata directory, beside the mapping directory; a job's file there holds these keys.
META_DIR = "slurm-meta"
ACCOUNTING = ("user", "account", "partition")
#: A Slurm job id as the prolog accepts it (array and het jobs: 123_4, 123.0): safe as a file name.
_JOB_ID = re.compile(r"^[0-9][0-9_.]*$")


class _Held(NamedTuple):
    """One device's jobs: as one joined holder (``lookup``) and one holder per job (``holders``)."""

    joined: Allocation
    each: tuple[Allocation, ...]


def _job_sort_key(job: str) -> tuple[int, int, str]:
    return (0, int(job), "") if job.isdigit() else (1, 0, job)


def _read_small(path: str) -> str:
    """Read a mapping file without ever blocking: a FIFO or device under a GPU's name
    would hang a plain open(), so open non-blocking and accept regular files only."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):
            raise IsADirectoryError(path)
        if not stat.S_ISREG(mode):
            raise OSError(errno.EINVAL, "not a regular file")
        return os.read(fd, MAX_FILE_BYTES).decode("utf-8", errors="replace")
    finally:
        os.close(fd)


class SlurmAttributor(CachedAttributor[dict[_Key, _Held]]):
    """GPU and MIG holders from a directory of per-GPU job-id files."""

    name = "slurm"

    def __init__(
        self, directory: str, ttl: float = 10.0, max_stale: float = 60.0, clock: Callable[[], float] = time.monotonic,
        meta_directory: str | None = None,
    ):
        super().__init__(ttl=ttl, max_stale=max_stale, clock=clock)
        self.directory = directory
        self.meta_directory = meta_directory or os.path.join(os.path.dirname(os.path.abspath(directory)), META_DIR)

    def _load(self, errors: list[AttributionError]) -> dict[_Key, _Held] | None:
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except FileNotFoundError:
            errors.append(AttributionError("slurm_dir_missing", f"job mapping directory {self.directory} not found"))
            return None
        except OSError as exc:
            errors.append(AttributionError(
                "slurm_dir_unreadable", f"job mapping directory {self.directory}: {exc.strerror or exc}"))
            return None
        table: dict[_Key, _Held] = {}
        meta: dict[str, dict[str, str]] = {}  # job -> its meta file's values, read once per refresh
        for entry in entries:
            match = _NAME.match(entry.name)
            if not match:
                continue
            try:
                text = _read_small(entry.path)
            except FileNotFoundError:  # removed by the epilog since the listing: the GPU is free
                continue
            except IsADirectoryError:
                continue
            except OSError as exc:
                errors.append(AttributionError("slurm_file_unreadable", f"{entry.path}: {exc.strerror or exc}"))
                continue
            jobs = sorted({line.strip() for line in text.splitlines() if line.strip()}, key=_job_sort_key)
            if jobs:
                key = (str(int(match["gpu"])), None if match["gi"] is None else str(int(match["gi"])))
                table[key] = _Held(self._holder(jobs, meta), tuple(self._holder([job], meta) for job in jobs))
        return table

    def _holder(self, jobs: list[str], meta: dict[str, dict[str, str]]) -> Allocation:
        return Allocation("", "", "", ",".join(jobs), self._accounting(jobs, meta))

    def _accounting(self, jobs: list[str], meta: dict[str, dict[str, str]]) -> tuple[str, str, str] | None:
        """(user, account, partition) of ``jobs`` from their meta files (``meta``: those read this refresh),
        distinct values joined with ","; None where no job has one (a missing or unreadable file is no
        accounting: the job is still attributed)."""
        found: dict[str, set[str]] = {k: set() for k in ACCOUNTING}
        for job in jobs:
            if job not in meta:
                meta[job] = self._meta(job)
            for key, value in meta[job].items():
                found[key].add(value)
        if not any(found.values()):
            return None
        user, account, partition = (",".join(sorted(found[k])) for k in ACCOUNTING)
        return user, account, partition

    def _meta(self, job: str) -> dict[str, str]:
        """The ACCOUNTING keys of ``job``'s meta file that have a value; {} without one."""
        if not _JOB_ID.match(job):
            return {}
        try:
            text = _read_small(os.path.join(self.meta_directory, f"{job}.env"))
        except OSError:
            return {}
        pairs = (line.partition("=") for line in text.splitlines())
        return {k.strip(): v.strip() for k, sep, v in pairs if sep and k.strip() in ACCOUNTING and v.strip()}

    def _lookup(
        self, table: dict[_Key, _Held], uuid: str, gpu: str, gpu_instance: str | None, mig_uuid: str | None
    ) -> Allocation | None:
        held = _find(table, gpu, gpu_instance)
        return None if held is None else held.joined

    def _holders(
        self, table: dict[_Key, _Held], uuid: str, gpu: str, gpu_instance: str | None, mig_uuid: str | None
    ) -> tuple[Allocation, ...]:
        held = _find(table, gpu, gpu_instance)
        return () if held is None else held.each


def _find(table: dict[_Key, _Held], gpu: str, gpu_instance: str | None) -> _Held | None:
    if gpu_instance is not None and (found := table.get((gpu, gpu_instance))):
        return found
    return table.get((gpu, None))  # a job holding the whole GPU holds its MIG instances
