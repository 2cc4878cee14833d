"""XID and double-bit ECC events from an NVML event set, counted on a background thread.

XIDs are events, not values: polling cannot see them, so a thread blocks in
``nvmlEventSetWait_v2`` (with a timeout, so it notices close()) and counts each event per
GPU and XID code. The thread never dies of an NVML error: it logs, backs off and goes on.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections import Counter
from types import ModuleType

log = logging.getLogger(__name__)


def handle_key(handle: object) -> int:
    """A device handle's identity (its pointer value): event data carries the same pointer."""
    return ctypes.cast(handle, ctypes.c_void_p).value or 0


class EventWatcher:
    """Counts XID events per (GPU index, XID) and double-bit ECC events per GPU index."""

    def __init__(
        self,
        nvml: ModuleType,
        handles: dict[int, object],
        *,
        timeout_ms: int = 500,
        min_backoff: float = 0.5,
        max_backoff: float = 30.0,
    ) -> None:
        self._nv = nvml
        self._handles = dict(handles)
        self._by_key = {handle_key(h): index for index, h in handles.items()}
        self.timeout_ms = int(timeout_ms)
        self.min_backoff = min_backoff
        self.max_backoff = max_backoff
        self._stop = threading.Event()
        self._cond = threading.Condition()
        self._xids: Counter[tuple[int, int]] = Counter()
        self._dbe: Counter[int] = Counter()
        self.events_seen = 0
        self.wait_errors = 0
        self.registered: dict[int, int] = {}
        self._set: object | None = None
        self._thread = threading.Thread(target=self._run, name="nvml-events", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def xid_counts(self) -> dict[tuple[int, int], int]:
        """(GPU index, XID code) -> events since start."""
        with self._cond:
            return dict(self._xids)

    def dbe_counts(self) -> dict[int, int]:
        with self._cond:
            return dict(self._dbe)

    def wait_for_events(self, count: int, timeout: float) -> bool:
        """Block until ``count`` events were counted in total (False on timeout)."""
        with self._cond:
            return self._cond.wait_for(lambda: self.events_seen >= count, timeout)

    def _open(self) -> object | None:
        nv = self._nv
        wanted = nv.nvmlEventTypeXidCriticalError | nv.nvmlEventTypeDoubleBitEccError
        event_set = nv.nvmlEventSetCreate()
        registered: dict[int, int] = {}
        for index, handle in self._handles.items():
            try:
                mask = wanted & nv.nvmlDeviceGetSupportedEventTypes(handle)
                if mask:
                    nv.nvmlDeviceRegisterEvents(handle, mask, event_set)
                    registered[index] = mask
            except nv.NVMLError as exc:
                log.info("GPU %s delivers no XID/ECC events: %s", index, exc)
        self.registered = registered
        if not registered:
            nv.nvmlEventSetFree(event_set)
            return None
        return event_set

    def _record(self, data: object) -> None:
        nv = self._nv
        index = self._by_key.get(handle_key(data.device))
        if index is None:
            log.warning("NVML event for an unknown device handle ignored (type 0x%x)", data.eventType)
            return
        with self._cond:
            if data.eventType & nv.nvmlEventTypeXidCriticalError:
                self._xids[(index, int(data.eventData))] += 1
                log.warning("GPU %s: XID %d", index, data.eventData)
            elif data.eventType & nv.nvmlEventTypeDoubleBitEccError:
                self._dbe[index] += 1
                log.warning("GPU %s: double-bit ECC error", index)
            self.events_seen += 1
            self._cond.notify_all()

    def _run(self) -> None:
        nv = self._nv
        backoff = self.min_backoff
        try:
            while not self._stop.is_set():
                try:
                    if self._set is None:
                        self._set = self._open()
                        if self._set is None:
                            log.info("no GPU delivers XID events; the XID counter stays absent")
                            return
                    data = nv.nvmlEventSetWait_v2(self._set, self.timeout_ms)
                except nv.NVMLError_Timeout:
                    backoff = self.min_backoff
                    continue
                except Exception as exc:
                    self.wait_errors += 1
                    log.warning("NVML event wait failed (%s); retrying in %.1f s", exc, backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, self.max_backoff)
                    continue
                backoff = self.min_backoff
                self._record(data)
        finally:
            if self._set is not None:
                try:
                    nv.nvmlEventSetFree(self._set)
                except Exception as exc:
                    log.debug("nvmlEventSetFree: %s", exc)
                self._set = None

    def close(self, timeout: float = 5.0) -> None:
        """Stop the thread (it notices within one wait timeout) and free the event set."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout)

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()
