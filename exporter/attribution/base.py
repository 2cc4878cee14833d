"""The small attribution interface and the caching/error-reporting machinery it shares.

Attribution answers "who holds this GPU" for truegpu_gpu_allocation_info. Sources call
``refresh()`` once per collection and then ``lookup()`` per GPU or MIG instance; ``holders()``
lists every holder of a shared device (time-slicing or MPS replicas, Slurm jobs sharing a GPU)
for the per-holder sharer families. Reading the kubelet or a job directory is slow next to a
scrape and changes rarely, so ``refresh()`` re-reads at most every ``ttl`` seconds. Nothing
here raises into the exporter: failures come back from ``refresh()`` as :class:`AttributionError`
values (a ``str`` carrying a bounded ``kind``) that the caller counts in
truegpu_exporter_errors_total, and each kind of failure is logged once until it clears.
"""

from __future__ import annotations

import logging
import threading
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from exporter.schema import WORKLOAD

log = logging.getLogger("truegpu.attribution")


@dataclass(frozen=True)
class Allocation:
    """Who holds one GPU (or MIG instance); empty strings for what the backend cannot know."""

    namespace: str
    pod: str
    container: str
    job: str
    #: Slurm accounting (user, account, partition) where the job-mapping file gives it.
    accounting: tuple[str, str, str] | None = None
    #: The pod's UID where the API server told it: per-process attribution matches it with a process's cgroup.
    uid: str = ""

    def labels(self) -> dict[str, str]:
        """The truegpu_gpu_allocation_info labels this allocation contributes."""
        return {"namespace": self.namespace, "pod": self.pod, "container": self.container, WORKLOAD: self.job}


class AttributionError(str):
    """One failure: the message as a ``str`` (so callers treating errors as text still
    work) plus ``kind``, a short bounded token fit for a metric label."""

    kind: str

    def __new__(cls, kind: str, message: str) -> AttributionError:
        self = super().__new__(cls, message)
        self.kind = kind
        return self

    @property
    def message(self) -> str:
        return str.__str__(self)

    def __repr__(self) -> str:
        return f"AttributionError({self.kind!r}, {self.message!r})"

    def __reduce__(self) -> tuple[type[AttributionError], tuple[str, str]]:
        return (AttributionError, (self.kind, self.message))


@runtime_checkable
class Attributor(Protocol):
    """What the NVML and dcgm sources call."""

    def refresh(self) -> list[str]:
        """Re-read the backend if the cache is older than ``ttl``; return the errors
        (:class:`AttributionError`, a ``str`` with ``.kind``) since the last call."""
        ...

    def lookup(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> Allocation | None:
        """The holder of GPU ``uuid``/index ``gpu`` (MIG: ``gpu_instance``/``mig_uuid``), or None."""
        ...

    def holders(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> tuple[Allocation, ...]:
        """Every holder of that device in a stable order (``lookup``'s answer among them); empty when none."""
        ...


T = TypeVar("T")


class CachedAttributor(ABC, Generic[T]):
    """Rate-limited reload of a lookup table ``T``, keeping the last good table on failure.

    Subclasses implement ``_load`` (return the new table, or None when nothing could be
    read, and append errors) and ``_lookup`` on the table; tables that know several holders
    of one device also override ``_holders``. When a load fails outright the
    previous table is kept for ``max_stale`` seconds (a kubelet restart should not blank
    every GPU's owner), then dropped: stale owners are worse than unknown ones.
    """

    #: Name used in log lines.
    name = "attribution"

    def __init__(self, ttl: float = 10.0, max_stale: float = 60.0, clock: Callable[[], float] = time.monotonic):
        self.ttl = ttl
        self.max_stale = max_stale
        self._clock = clock
        self._lock = threading.Lock()
        self._table: T | None = None
        self._loaded_at: float | None = None  # when _table was last loaded successfully
        self._tried_at: float | None = None
        self._failing: set[str] = set()  # error kinds already logged and not yet cleared

    def refresh(self) -> list[str]:
        with self._lock:
            now = self._clock()
            if self._tried_at is not None and now - self._tried_at < self.ttl:
                return []
            self._tried_at = now
            errors: list[AttributionError] = []
            try:
                table = self._load(errors)
            except Exception as exc:  # a bug or an unexpected backend reply must not break the scrape
                table = None
                errors.append(AttributionError("attribution_failed", f"{self.name}: {type(exc).__name__}: {exc}"))
            if table is not None:
                self._table, self._loaded_at = table, now
            elif self._loaded_at is not None and now - self._loaded_at > self.max_stale:
                self._table = None
            self._log(errors)
            return list(errors)

    def lookup(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> Allocation | None:
        table = self._table
        if table is None:
            return None
        return self._lookup(table, *_device(uuid, gpu, gpu_instance, mig_uuid))

    def holders(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> tuple[Allocation, ...]:
        table = self._table
        if table is None:
            return ()
        return self._holders(table, *_device(uuid, gpu, gpu_instance, mig_uuid))

    @abstractmethod
    def _load(self, errors: list[AttributionError]) -> T | None:
        """Read the backend into a new table; append what went wrong to ``errors``."""

    @abstractmethod
    def _lookup(
        self, table: T, uuid: str, gpu: str, gpu_instance: str | None, mig_uuid: str | None
    ) -> Allocation | None:
        """Find an allocation in ``table``."""

    def _holders(
        self, table: T, uuid: str, gpu: str, gpu_instance: str | None, mig_uuid: str | None
    ) -> tuple[Allocation, ...]:
        """Every holder in ``table``; by default ``_lookup``'s one (tables keeping one holder per device)."""
        found = self._lookup(table, uuid, gpu, gpu_instance, mig_uuid)
        return () if found is None else (found,)

    def _log(self, errors: Sequence[AttributionError]) -> None:
        """Warn once per kind of failure; say when it clears; keep repeats at debug."""
        kinds = {e.kind for e in errors}
        for error in errors:
            if error.kind in self._failing:
                log.debug("%s: %s (still failing)", self.name, error)
            else:
                log.warning("%s attribution: %s [%s]; GPUs it would attribute stay unattributed "
                            "(logged once until it recovers)", self.name, error, error.kind)
                self._failing.add(error.kind)
        for kind in sorted(self._failing - kinds):
            log.info("%s attribution recovered from %s", self.name, kind)
        self._failing &= kinds


class CompositeAttributor:
    """Several attributors tried in order (e.g. Kubernetes then Slurm): first answer wins; for ``holders``
    the first non-empty one, never a merge (one backend owns a device)."""

    def __init__(self, attributors: Sequence[Attributor]):
        self.attributors = tuple(attributors)

    def refresh(self) -> list[str]:
        errors: list[str] = []
        for attributor in self.attributors:
            try:
                errors.extend(attributor.refresh())
            except Exception as exc:  # foreign attributors get the same no-raise guarantee
                errors.append(AttributionError("attribution_failed", f"{type(exc).__name__}: {exc}"))
        return errors

    def lookup(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> Allocation | None:
        return self._first("lookup", uuid, gpu, gpu_instance, mig_uuid)

    def holders(
        self, uuid: str, gpu: str, gpu_instance: str | None = None, mig_uuid: str | None = None
    ) -> tuple[Allocation, ...]:
        return self._first("holders", uuid, gpu, gpu_instance, mig_uuid) or ()

    def _first(self, method: str, *device: str | None) -> Any:
        """The first attributor's answer that is not empty (None, ())."""
        for attributor in self.attributors:
            try:
                found = getattr(attributor, method)(*device)
            except Exception:  # pragma: no cover - our attributors never raise here
                log.exception("attribution %s failed", method)
                continue
            if found:
                return found
        return None


def _device(
    uuid: str, gpu: str, gpu_instance: str | None, mig_uuid: str | None
) -> tuple[str, str, str | None, str | None]:
    """The device's ids as tables key them: indexes as text whatever the caller passed."""
    return uuid, str(gpu), None if gpu_instance is None else str(gpu_instance), mig_uuid
