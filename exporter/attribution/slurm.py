"""Slurm/HPC attribution from a job-mapping directory (dcgm-exporter's HPC convention).

A Slurm prolog writes one file per GPU the job gets and the epilog removes it:
``<dir>/<gpu index>`` for a whole GPU, ``<dir>/<gpu index>.<gpu instance>`` for a MIG
instance; each non-empty line is a job id. Other names are ignored, so the directory
may hold the prolog's own state.

Several job ids on one GPU (shared GPUs, or a stale id the epilog missed) become one
label: the distinct ids sorted (numerically where they are numbers) and joined with
``","``, so the series is stable and nothing is hidden. An empty file means the GPU is
free. Only ``job`` is set; namespace/pod/container are empty.
"""

from __future__ import annotations

import errno
import os
import re
import stat
import time
from collections.abc import Callable

from exporter.attribution.base import Allocation, AttributionError, CachedAttributor

_NAME = re.compile(r"^(?P<gpu>\d+)(?:\.(?P<gi>\d+))?$")
#: A mapping file is a handful of job ids; anything larger is not one.
MAX_FILE_BYTES = 64 * 1024

_Key = tuple[str, str | None]


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


class SlurmAttributor(CachedAttributor[dict[_Key, Allocation]]):
    """GPU and MIG holders from a directory of per-GPU job-id files."""

    name = "slurm"

    def __init__(
        self, directory: str, ttl: float = 10.0, max_stale: float = 60.0, clock: Callable[[], float] = time.monotonic
    ):
        super().__init__(ttl=ttl, max_stale=max_stale, clock=clock)
        self.directory = directory

    def _load(self, errors: list[AttributionError]) -> dict[_Key, Allocation] | None:
        try:
            entries = sorted(os.scandir(self.directory), key=lambda e: e.name)
        except FileNotFoundError:
            errors.append(AttributionError("slurm_dir_missing", f"job mapping directory {self.directory} not found"))
            return None
        except OSError as exc:
            errors.append(AttributionError(
                "slurm_dir_unreadable", f"job mapping directory {self.directory}: {exc.strerror or exc}"))
            return None
        table: dict[_Key, Allocation] = {}
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
                table[(str(int(match["gpu"])), None if match["gi"] is None else str(int(match["gi"])))] = Allocation(
                    "", "", "", ",".join(jobs))
        return table

    def _lookup(
        self, table: dict[_Key, Allocation], uuid: str, gpu: str, gpu_instance: str | None, mig_uuid: str | None
    ) -> Allocation | None:
        if gpu_instance is not None and (found := table.get((gpu, gpu_instance))):
            return found
        return table.get((gpu, None))  # a job holding the whole GPU holds its MIG instances
