"""Durations and points in time as people type them on command lines and in scenario files."""

from __future__ import annotations

import math
import re
import time
from datetime import UTC, datetime
from typing import Any

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h|d|w)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_RELATIVE = re.compile(r"now\s*(?:-\s*(.+))?")


def parse_duration(value: Any) -> float:
    """Seconds (>= 0) from a number or ``"90"``, ``"90s"``, ``"15m"``, ``"2h"``, ``"1d"``, ``"1h30m"``, ``"500ms"``."""
    if isinstance(value, bool):
        raise ValueError(f"not a duration: {value!r}")
    if isinstance(value, int | float):
        total = float(value)
    elif isinstance(value, str):
        text = value.strip().lower().replace(" ", "")
        if _NUMBER.fullmatch(text):
            total = float(text)
        else:
            total, pos = 0.0, 0
            for m in _PART.finditer(text):
                if m.start() != pos:
                    break
                total += float(m.group(1)) * _UNITS[m.group(2)]
                pos = m.end()
            if not text or pos != len(text):
                raise ValueError(f"bad duration {value!r}: use a number with a unit, e.g. 90s, 15m, 2h, 1d")
    else:
        raise ValueError(f"not a duration: {value!r}")
    if not (math.isfinite(total) and total >= 0):
        raise ValueError(f"bad duration {value!r}: must be a finite number of seconds >= 0")
    return total


def parse_positive_duration(value: Any) -> float:
    """As parse_duration, but zero is an error (a step, a window length)."""
    seconds = parse_duration(value)
    if seconds <= 0:
        raise ValueError(f"bad duration {value!r}: must be greater than zero")
    return seconds


def parse_time(value: Any, *, now: float | None = None) -> float:
    """Unix seconds from a number, ``"now"``, ``"now-6h"``, or ISO 8601 (no zone means UTC)."""
    if isinstance(value, bool):
        raise ValueError(f"not a time: {value!r}")
    if isinstance(value, int | float):
        return float(value)
    if isinstance(value, datetime):
        return (value if value.tzinfo else value.replace(tzinfo=UTC)).timestamp()
    if not isinstance(value, str):
        raise ValueError(f"not a time: {value!r}")
    text = value.strip()
    if _NUMBER.fullmatch(text):
        return float(text)
    rel = _RELATIVE.fullmatch(text.lower())
    if rel:
        base = time.time() if now is None else now
        return base - (parse_duration(rel.group(1)) if rel.group(1) else 0.0)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"bad time {value!r}: use unix seconds, ISO 8601 (2024-05-01T12:00:00Z) or now-6h"
        ) from None
    return (dt if dt.tzinfo else dt.replace(tzinfo=UTC)).timestamp()


def iso(t: float) -> str:
    """RFC 3339 UTC with a Z, to the second."""
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
