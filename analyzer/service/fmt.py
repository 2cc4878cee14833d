"""Values as the service shows them: label values, numbers, one-line errors, durations.

A leaf (no analyzer imports): the loop, /metrics, the API and the overview page all format
through here, so a NaN is "" in a label, None in JSON and never "nan" anywhere.
"""

from __future__ import annotations

import math
import re
from typing import Any


def label_value(value: Any) -> str:
    """A finding/job field as a label value: "" for None/NaN, integral floats without ".0"."""
    if value is None:
        return ""
    if isinstance(value, float) or hasattr(value, "dtype"):
        try:
            f = float(value)
        except (TypeError, ValueError):
            return str(value)
        if math.isnan(f):
            return ""
        if f.is_integer():
            return str(int(f))
        return str(f)
    return str(value)


def text(value: Any) -> str | None:
    """A label-like field as str for JSON, None for None/NaN/""."""
    if value is None:
        return None
    if isinstance(value, float) or hasattr(value, "dtype"):
        return label_value(value) or None
    return str(value)


def integer(value: Any) -> int | None:
    """A whole number for JSON (a GPU index), None when not a finite number."""
    f = number(value)
    return None if f is None else int(f)


def number(value: Any) -> float | None:
    """A finite float for JSON, None for anything else (NaN, inf, not a number)."""
    try:
        f = float(value)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


_QUERY = re.compile(r"(/api/v1/[\w/]*)\?\S*")


def short_error(exc: BaseException, limit: int = 600) -> str:
    """One readable line: the exception without the (long) query strings of the URLs it quotes."""
    line = _QUERY.sub(r"\1?...", f"{type(exc).__name__}: {exc}".strip())
    line = " ".join(line.split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def fmt_seconds(seconds: float) -> str:
    """A duration in the largest whole unit: ``30d``, ``12h``, ``90s``."""
    for unit, size in (("w", 604800), ("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"
