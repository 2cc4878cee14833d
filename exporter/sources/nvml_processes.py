"""Per-process use of one shared GPU, scrape after scrape: how much each of its holders used.

When several pods or jobs hold one GPU at once (Kubernetes time-slicing or MPS replicas, Slurm jobs
sharing a GPU), the GPU's own utilization cannot say who used it; NVML's per-process calls can.
``nvmlDeviceGetProcessUtilization`` returns the driver's recent per-process samples newer than a
timestamp (``smUtil``: percent of a sample period a kernel of that process ran), and
``nvmlDeviceGetComputeRunningProcesses`` plus ``nvmlDeviceGetMPSComputeRunningProcesses`` (MPS clients,
where the binding has it) list the processes with their memory. A :class:`ProcessSampler` keeps one
GPU's ``lastSeenTimeStamp`` (microseconds) between scrapes and, each scrape:

- a PID's utilization is its ``smUtil`` / 100 summed over the sample times since the last scrape and
  divided by their number (the driver samples only processes that ran: one absent at a sample time ran
  nothing then, so a process busy in bursts is not read as busy all along, and holders compare by what
  each ran); a holder's is the sum over its PIDs, clipped to 1. NVML_ERROR_NOT_FOUND (no sample newer)
  means no process ran a kernel since the last scrape: every holder's utilization is 0. The driver keeps
  seconds of samples, so the first scrape of a newly shared GPU averages what it still holds;
- where the driver cannot sample per process (NotSupported) but keeps accounting stats (``nvidia-smi
  -am 1``), a PID's utilization is its accounting ``gpuUtilization``: the share of its lifetime a kernel
  of it ran (coarser: an average since it started, yet holders still compare by what each ran);
- a holder's memory is the sum of its processes' ``usedGpuMemory``; unknown (None) when one of them is
  unknown: NVML does not know it, or the PID was sampled but not listed (it exited between the calls,
  or a binding without the MPS call cannot list MPS clients);
- PID -> holder through ``<proc root>/<pid>/cgroup`` (world-readable: the pod's UID, matched with the
  holder's UID from the API server when pod labels are read, ``--kube-api``; Slurm's ``job_<id>``), else
  ``<proc root>/<pid>/environ`` (``HOSTNAME``: the pod's name, as Kubernetes sets it; ``SLURM_JOB_ID``;
  another user's environment needs root). NVML reports host PIDs: a containerised exporter runs in the
  host's PID namespace (``hostPID: true``) or gets the host's /proc mounted (``--proc-root``). A PID that
  cannot be read (another PID namespace, a process gone meanwhile), matches no holder or several goes to
  :data:`UNATTRIBUTED`, never spread over the others: so do, without a UID, pods whose hostname is not
  their name (``spec.hostname``, ``hostNetwork``), and two containers of one pod sharing the GPU. /proc is
  read once per process (PID and start time, so a reused PID is read anew), and PIDs gone from the GPU are
  forgotten.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

from exporter.attribution.base import Allocation

#: The holder standing for processes no pod or job could be found for (every owner label empty).
UNATTRIBUTED = Allocation("", "", "", "")
#: A process environment is read this far (a real one is a few KiB).
MAX_ENVIRON_BYTES = 1 << 20
#: Kubernetes cuts a pod's hostname to a DNS label: 63 characters, then drops trailing "-" and ".".
_HOSTNAME_MAX = 63
#: Slurm's cgroup of a job's processes (v1 .../job_<id>/step_0, v2 .../slurmstepd.scope/job_<id>/...).
_CGROUP_JOB = re.compile(r"/job_(\d+)(?=/|$)")
#: A Kubernetes pod's cgroup (cgroupfs .../pod<uid>/..., systemd ...-pod<uid with _ for ->.slice/...).
_CGROUP_POD = re.compile(r"pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})", re.I)
#: /proc/<pid>/stat field 22 (start time, ticks since boot), counted from field 3 after the ")" of the name.
_START_TIME = 22 - 3

#: The source's NVML call, ``ask(key, fn, *args)``: the result, or None when unsupported (then never asked
#: again, by ``key``) or failed (reported); a lost GPU raises.
Ask = Callable[..., Any]


@dataclass(frozen=True)
class Use:
    """One holder's use of a shared GPU since the last scrape."""

    utilization: float  # 0..1
    memory_bytes: int | None  # None: the memory of one of its processes is unknown


@dataclass(frozen=True)
class _Owner:
    """Who a process says it runs for: its pod's UID (cgroup) and hostname (environment), its Slurm job ids."""

    hostname: str
    jobs: frozenset[str]
    pod_uid: str = ""


class ProcessSampler:
    """One shared GPU's per-holder use, scrape after scrape (see the module doc)."""

    def __init__(self, proc_root: str | Path = "/proc") -> None:
        self.proc_root = Path(proc_root)
        self.last_seen = 0  # NVML's lastSeenTimeStamp: the newest sample read (us)
        self._owners: dict[int, tuple[int, _Owner]] = {}  # pid -> (start time, what its /proc said)

    def sample(
        self, nv: ModuleType, handle: object, holders: Sequence[Allocation], ask: Ask,
        unsupported: Callable[[str], bool] = lambda key: False,
    ) -> dict[Allocation, Use] | None:
        """Each holder's use (``holders`` order, then UNATTRIBUTED when some PID is nobody's); None when NVML
        could not say (the call was unsupported or failed, ``ask`` dealt with it). ``unsupported(key)``: whether
        ``ask`` gave up on a call for good (then accounting stats stand in, where enabled)."""
        samples = ask("process_utilization", _samples_since, nv, handle, self.last_seen)
        if samples is None and not (unsupported("process_utilization") and _accounting_on(nv, handle, ask)):
            return None
        memory = _processes(nv, handle, ask)
        if memory is None:
            return None
        if samples is None:
            utilization = _accounting_utilization(nv, handle, memory, ask)
        else:
            self.last_seen = max((int(s.timeStamp) for s in samples), default=self.last_seen)
            utilization = _mean_utilization(samples)
        owners = self._holders_of(memory.keys() | utilization.keys(), holders)
        return _per_holder(holders, owners, memory, utilization)

    def _holders_of(self, pids: Iterable[int], holders: Sequence[Allocation]) -> dict[int, Allocation]:
        """Each PID's holder; what /proc said of PIDs not among ``pids`` is forgotten."""
        found = {pid: _match(self._owner(pid), holders) for pid in pids}
        self._owners = {pid: seen for pid, seen in self._owners.items() if pid in found}
        return found

    def _owner(self, pid: int) -> _Owner | None:
        """What /proc says of ``pid``, read once per process; None when it has no readable entry."""
        base = self.proc_root / str(pid)
        start = _start_time(base)
        if start is None:
            return None
        seen = self._owners.get(pid)
        if seen is None or seen[0] != start:
            seen = self._owners[pid] = (start, _read_owner(base))
        return seen[1]


def _samples_since(nv: ModuleType, handle: object, timestamp: int) -> list:
    """The driver's per-process samples newer than ``timestamp``; [] when it has none (NOT_FOUND)."""
    try:
        return nv.nvmlDeviceGetProcessUtilization(handle, timestamp)
    except nv.NVMLError_NotFound:
        return []


def _processes(nv: ModuleType, handle: object, ask: Ask) -> dict[int, int | None] | None:
    """PID -> used memory (None: unknown) of the GPU's compute processes and MPS clients; None when the
    compute processes could not be listed (without the MPS list the compute one still counts)."""
    compute = _listed(nv, handle, ask, "processes", "nvmlDeviceGetComputeRunningProcesses")
    if compute is None:
        return None
    mps = _listed(nv, handle, ask, "mps_processes", "nvmlDeviceGetMPSComputeRunningProcesses") or []
    memory: dict[int, int | None] = {}
    for process in [*compute, *mps]:
        used = process.usedGpuMemory
        memory.setdefault(int(process.pid), None if used is None else int(used))
    return memory


def _listed(nv: ModuleType, handle: object, ask: Ask, key: str, name: str) -> list | None:
    """One process list, or None. A binding newer than the driver raises NVMLLibraryMismatchError (not an
    NVMLError) for the unversioned call: that is asked as FunctionNotFound, so the source stops asking."""
    fn = getattr(nv, name, None)
    if fn is None:
        return None
    mismatch = getattr(nv, "NVMLLibraryMismatchError", ())

    def listed(device: object) -> list:
        try:
            return fn(device)
        except mismatch:
            raise nv.NVMLError(nv.NVML_ERROR_FUNCTION_NOT_FOUND) from None

    return ask(key, listed, handle)


def _accounting_on(nv: ModuleType, handle: object, ask: Ask) -> bool:
    """Whether the GPU keeps accounting stats (``nvidia-smi -am 1``; off by default)."""
    return ask("accounting_mode", nv.nvmlDeviceGetAccountingMode, handle) == nv.NVML_FEATURE_ENABLED


def _accounting_utilization(nv: ModuleType, handle: object, pids: Iterable[int], ask: Ask) -> dict[int, float]:
    """PID -> the share of its lifetime a kernel of it ran (accounting stats' ``gpuUtilization``): coarser than
    the per-scrape samples (an average since the process started), for GPUs whose driver cannot sample per
    process. A PID the accounting buffer does not hold, or without the value, is left out (ran nothing known)."""
    out = {}
    for pid in pids:
        stats = ask("accounting_stats", _stats, nv, handle, pid)
        if stats is not None and 0 <= int(stats.gpuUtilization) <= 100:  # NVML_VALUE_NOT_AVAILABLE: unknown
            out[pid] = int(stats.gpuUtilization) / 100
    return out


def _stats(nv: ModuleType, handle: object, pid: int) -> Any:
    """A process's accounting stats; None when the accounting buffer does not hold it (NOT_FOUND)."""
    try:
        return nv.nvmlDeviceGetAccountingStats(handle, pid)
    except nv.NVMLError_NotFound:
        return None


def _mean_utilization(samples: Iterable[Any]) -> dict[int, float]:
    """PID -> its smUtil over the sample times (absent = 0), as a ratio."""
    per_pid: dict[int, int] = {}
    times: set[int] = set()
    for s in samples:
        per_pid[int(s.pid)] = per_pid.get(int(s.pid), 0) + int(s.smUtil)
        times.add(int(s.timeStamp))
    return {pid: total / len(times) / 100 for pid, total in per_pid.items()}


def _per_holder(holders: Sequence[Allocation], owners: dict[int, Allocation], memory: dict[int, int | None],
                utilization: dict[int, float]) -> dict[Allocation, Use]:
    """Sum the PIDs' use per holder: every holder (0 without a process), UNATTRIBUTED only when it has one."""
    busy: dict[Allocation, float] = dict.fromkeys(holders, 0.0)
    used: dict[Allocation, int | None] = dict.fromkeys(holders, 0)
    for pid, holder in owners.items():
        busy[holder] = busy.get(holder, 0.0) + utilization.get(pid, 0.0)
        total, mine = used.get(holder, 0), memory.get(pid)
        used[holder] = None if total is None or mine is None else total + mine
    return {holder: Use(min(1.0, share), used[holder]) for holder, share in busy.items()}


def _match(owner: _Owner | None, holders: Sequence[Allocation]) -> Allocation:
    """The one holder ``owner`` names (a pod by the UID in its cgroup, else by its hostname; a Slurm job by its
    id), else UNATTRIBUTED."""
    if owner is None:
        return UNATTRIBUTED
    found = [h for h in holders if h.uid and h.uid == owner.pod_uid]
    if not found:
        found = [h for h in holders
                 if (h.pod and _pod_hostname(h.pod) == owner.hostname) or (not h.pod and h.job in owner.jobs)]
    return found[0] if len(found) == 1 else UNATTRIBUTED


def _pod_hostname(pod: str) -> str:
    """The HOSTNAME Kubernetes gives the pod's containers."""
    return pod[:_HOSTNAME_MAX].rstrip("-.") if len(pod) > _HOSTNAME_MAX else pod


def _start_time(base: Path) -> int | None:
    """The process's start time (field 22 of its stat); None when there is no such process here."""
    try:
        stat = (base / "stat").read_text(encoding="utf-8", errors="replace")
        return int(stat.rpartition(")")[2].split()[_START_TIME])
    except (OSError, IndexError, ValueError):
        return None


def _read_owner(base: Path) -> _Owner:
    """HOSTNAME and SLURM_JOB_ID from the environment, the pod UID and Slurm job ids from the cgroup (empty where
    unreadable: another user's environment needs root; the cgroup file is world-readable)."""
    env = _environ(base)
    cgroup = _read(base / "cgroup")
    jobs = set(_CGROUP_JOB.findall(cgroup))
    if env.get("SLURM_JOB_ID"):
        jobs.add(env["SLURM_JOB_ID"])
    pod = _CGROUP_POD.search(cgroup)
    return _Owner(env.get("HOSTNAME", ""), frozenset(jobs), pod.group(1).lower().replace("_", "-") if pod else "")


def _environ(base: Path) -> dict[str, str]:
    try:
        with open(base / "environ", "rb") as fh:
            raw = fh.read(MAX_ENVIRON_BYTES)
    except OSError:  # gone, or another user's process without the privilege to read it
        return {}
    pairs = (item.partition(b"=") for item in raw.split(b"\0"))
    return {k.decode(errors="replace"): v.decode(errors="replace") for k, sep, v in pairs if sep}


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""
