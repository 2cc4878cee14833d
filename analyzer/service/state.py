"""What a restarted ``serve`` needs to go on where it stopped (``serve --state-file``).

A service carries two things from run to run: the findings of the last window, so a problem keeps its id
and its held severity (:class:`analyzer.findings.IdMemory`), and what detectors carry past the window
(:class:`analyzer.detectors.Memory`: degraded_gpu's CUSUM chain and each GPU's own earlier level). Lost on a
restart, every problem older than the window would get a new id (its start is then the window's), the
severities held would drop, and a quiet degraded GPU found only through carried evidence would vanish until
that evidence built again (up to 40 minutes): its alert resolves and fires again later.

The state is one JSON file, written after each good run by replacing it atomically (a crash mid-write
leaves the one before), read once, before the first run. Everything in it expires by its holder's own rules
(ids a window after they were last shown, a CUSUM state once its run has passed, a GPU's level after two
hours unseen), so a state from long ago carries nothing. A state written under another window, step, shard
or set of kinds is not used: its chains and ids would not line up. A file that cannot be read or does not
fit is logged and left: the service starts afresh, as without one, and overwrites it after its first run.
Two services given one file would overwrite each other's state after every run (the ids of one restored into
the other on a restart): each holds an exclusive lock on ``<file>.lock`` while it runs, and a second one is
refused at start-up (the lock goes with its process, a killed one's too).

Only plain data is stored (no pickle): None, booleans, numbers (NaN and infinities tagged: the file is
strict JSON), text, lists, dicts with text or integer keys, and DataFrames of numbers or text under a text
index.
"""

from __future__ import annotations

import fcntl
import json
import logging
import math
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from analyzer.detectors import Memory
from analyzer.findings import IdMemory
from exporter.timeparse import iso

log = logging.getLogger(__name__)

#: Bump when the encoding or the holders' contents change; a state of another format is not used.
FORMAT = 1


def encode(value: Any) -> Any:
    """``value`` as strict JSON: dicts (any text or integer keys), lists, frames and non-finite numbers tagged."""
    if value is None or isinstance(value, bool | str):
        return value
    if isinstance(value, int | np.integer):
        return int(value)
    if isinstance(value, float | np.floating):
        x = float(value)
        return x if math.isfinite(x) else {"$float": repr(x)}
    if isinstance(value, Mapping):
        return {"$dict": [[encode(k), encode(v)] for k, v in value.items()]}
    if isinstance(value, list | tuple):
        return [encode(v) for v in value]
    if isinstance(value, pd.DataFrame):
        return {"$frame": {"index": [str(i) for i in value.index],
                           "columns": [[str(c), _column(value[c])] for c in value.columns]}}
    raise TypeError(f"cannot keep a {type(value).__name__} in the service state")


def _column(col: pd.Series) -> dict[str, Any]:
    if pd.api.types.is_numeric_dtype(col) and not pd.api.types.is_bool_dtype(col):
        x = col.to_numpy(np.float64)
        out = x.tolist()
        for i in np.flatnonzero(~np.isfinite(x)):  # NaN as null, infinities as text (strict JSON)
            out[i] = None if math.isnan(x[i]) else repr(float(x[i]))
        return {"float": out}
    return {"text": [None if pd.isna(v) else str(v) for v in col]}


def decode(value: Any) -> Any:
    """The inverse of :func:`encode` (tuples come back as lists, tuple keys as tuples)."""
    if isinstance(value, list):
        return [decode(v) for v in value]
    if not isinstance(value, dict):
        return value
    if "$float" in value:
        return float(value["$float"])
    if "$dict" in value:
        return {_key(decode(k)): decode(v) for k, v in value["$dict"]}
    if "$frame" in value:
        frame = value["$frame"]
        cols = {name: np.array(c["float"], np.float64) if "float" in c else np.array(c["text"], dtype=object)
                for name, c in frame["columns"]}  # null -> NaN, "inf" -> inf
        return pd.DataFrame(cols, index=pd.Index(frame["index"], dtype=object))
    raise ValueError(f"unknown value in the service state: keys {sorted(value)}")


def _key(k: Any) -> Any:
    if isinstance(k, list):
        return tuple(k)
    return k


class StateFile:
    """One service's state file; ``config`` names what the state depends on (window, step, shard, kinds)."""

    def __init__(self, path: str | Path, config: Mapping[str, Any]) -> None:
        self.path = Path(path)
        self.config = {"format": FORMAT, **json.loads(json.dumps(dict(config)))}
        self._lock: int | None = None

    def check_writable(self) -> None:
        """At start-up: ValueError when the state cannot be written (no such folder, not writable)."""
        folder = self.path.parent
        if not folder.is_dir():
            raise ValueError(f"--state-file {self.path}: folder {folder} does not exist")
        if not os.access(folder, os.W_OK | os.X_OK):
            raise ValueError(f"--state-file {self.path}: folder {folder} is not writable")
        if self.path.exists() and not self.path.is_file():
            raise ValueError(f"--state-file {self.path}: not a regular file")

    def claim(self) -> None:
        """At start-up: lock the state for this service (module docstring); ValueError when another holds it."""
        lock = self.path.with_name(self.path.name + ".lock")
        fd = os.open(lock, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode("ascii", "replace").strip() or "?"
            os.close(fd)
            raise ValueError(f"--state-file {self.path}: in use by another truegpu serve (pid {holder}, lock "
                             f"{lock}); give each service, each shard, a file of its own") from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode("ascii"))
        self._lock = fd

    def release(self) -> None:
        """Let the state go (the service stopped); a no-op when not claimed."""
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def load(self, ids: IdMemory) -> Memory | None:
        """Restore ``ids`` and give the detectors' memory from the file; None (``ids`` untouched, logged) when
        there is no usable state."""
        try:
            raw = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            log.info("no service state at %s yet: starting afresh", self.path)
            return None
        except (OSError, UnicodeDecodeError) as exc:
            log.warning("cannot read the service state %s (%s): starting afresh", self.path, exc)
            return None
        try:
            doc = json.loads(raw)
            if not isinstance(doc, dict) or doc.get("config") != self.config:
                was = doc.get("config") if isinstance(doc, dict) else None
                log.warning("service state %s was written under %s, this service runs %s: starting afresh",
                            self.path, was, self.config)
                return None
            seen, urgent, parts = (decode(doc[k]) for k in ("seen", "urgent", "memory"))
            ids.restore(seen, urgent)
            memory = Memory(parts)
        except (ValueError, KeyError, TypeError) as exc:
            ids.restore([], [])
            log.warning("service state %s is not usable (%s): starting afresh", self.path, exc)
            return None
        log.info("service state of %s restored from %s: %d finding id(s), detector memory of %s",
                 doc.get("written_for", "?"), self.path, len(seen), ", ".join(sorted(parts)) or "none")
        return memory

    def save(self, ids: IdMemory, memory: Memory, end: float) -> None:
        """Write the state after the run that ended at ``end``: a new file renamed over the old one."""
        seen, urgent = ids.state()
        doc = {"config": self.config, "written_for": iso(end), "seen": encode(seen), "urgent": encode(urgent),
               "memory": encode(memory.parts())}
        fd, tmp = tempfile.mkstemp(prefix=f".{self.path.name}.", dir=self.path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(doc, out, allow_nan=False, separators=(",", ":"))
                out.flush()
                os.fsync(out.fileno())
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


__all__ = ["FORMAT", "StateFile", "decode", "encode"]
