"""Bounded work: refuse a window, step or answer that would not fit, before querying or allocating.

An analysis holds one row per device and step (``analyzer.data.frame``), about 40 float columns, so
its memory is rows x ~330 bytes. The limits below keep one analysis inside a 24 GB machine and
say what to change when a request is over them; they bound a request, not the fleet (the scale
work splits larger fleets by series and time).
"""

from __future__ import annotations

import math

from exporter.timeparse import iso

#: Steps per series in one analysis: 30 days at 15 s (172,800) fits; a year at 1 min does not.
MAX_STEPS = 200_000
#: Device rows x steps in one frame: 10,000 GPUs x 1 h at 15 s is 2.4 M; 20 M is ~7 GB of frame.
MAX_ROWS = 20_000_000
#: The latest time a window may reach (9999-12-31T23:59:59Z).
MAX_TIME = 253_402_300_799.0
#: The smallest step: below the fastest scrape interval anyone runs, rows would only repeat samples.
MIN_STEP = 1.0


class BudgetError(ValueError):
    """A request over the work budget; the message says what to change."""


def _duration(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds / size:g}{unit}"
    return f"{seconds:g}s"


def check_window(start: float, end: float, step: float) -> int:
    """The number of steps in ``[start, end)``; BudgetError when the grid is impossible or too long."""
    if not (0.0 <= start <= MAX_TIME and 0.0 <= end <= MAX_TIME):
        raise BudgetError(f"the window {start!r} .. {end!r} (unix seconds) is not between 1970 and 9999")
    if not math.isfinite(step) or step < MIN_STEP:
        raise BudgetError(f"step {step!r} s is below the minimum of {MIN_STEP:g} s: use --step 15s or coarser")
    span = end - start
    if span <= 0:
        raise BudgetError(f"the window {iso(start)} .. {iso(end)} is empty: --end must be after --start")
    if step > span:
        raise BudgetError(
            f"step {_duration(step)} is longer than the window {iso(start)} .. {iso(end)} ({_duration(span)}): "
            f"use a step of at most {_duration(span)}"
        )
    steps = math.ceil(span / step - 1e-9)
    if steps > MAX_STEPS:
        coarser = math.ceil(span / MAX_STEPS)
        raise BudgetError(
            f"{iso(start)} .. {iso(end)} at step {_duration(step)} is {steps:,} steps per series, over the "
            f"budget of {MAX_STEPS:,}: use --step {_duration(coarser)} or coarser, or a shorter window"
        )
    return steps


def check_rows(devices: int, steps: int, step: float) -> None:
    """BudgetError when ``devices x steps`` rows would not fit in one analysis."""
    rows = devices * steps
    if rows > MAX_ROWS:
        factor = math.ceil(rows / MAX_ROWS)
        raise BudgetError(
            f"{devices:,} GPUs x {steps:,} steps is {rows:,} rows, over the budget of {MAX_ROWS:,}: "
            f"use --step {_duration(step * factor)} or coarser, a window {factor}x shorter, "
            f"or --matcher to analyze part of the fleet at a time"
        )
