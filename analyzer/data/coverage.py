"""Coverage: which GPU-hours of a window have data, so that hours without data are unknown.

The grid gives every device seen anywhere in the input a row at every step of the window.
A row is *observed* when any telemetry signal has a value there. A row without one is
**unknown** in the GPU-hour partition (analyzer.analysis.partition): never unallocated, never idle,
never zero. Hours before a GPU first reports, after it stops, inside scrape gaps and outside
the data's time span are therefore unknown.

A GPU that stops reporting (lost, its exporter down) keeps the allocation it last had
(``hold_allocations``): its hours stay with that workload, as unknown, for as long as the
workload is still seen anywhere in the fleet (the job/pod is not gone). After that they are
unknown capacity that belongs to nobody.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
import pandas as pd

from analyzer.data.frame import UNCARVED, category_codes, instance_rows
from analyzer.data.signals import ALLOCATION_COLUMNS, NAMES

#: Below this share of the window with data, every output says the window is mostly empty.
MOSTLY_EMPTY = 0.5
#: Optional frame column (float, 0..1, NaN = not measured): the share of a row's step that samples
#: cover. normalize sets it, so a row at the edge of the data (a 7-minute step holding 4 minutes of
#: samples) counts 4/7 observed and 3/7 unknown; frames without it count a row with data whole.
DATA_SHARE = "data_share"
#: Optional frame column (float, 1 = held): the row's values repeat the device's last sample, its device
#: scraped less often than the step (analyzer.data.normalize); absent where no device is. Shares and sums
#: read held values as Prometheus' lookback does; comparisons of devices at one instant must not (a value
#: minutes old reads as a change its peers show and it does not: analyzer.detectors._peers).
HELD = "held"


def held_rows(frame: pd.DataFrame) -> np.ndarray:
    """Per row, True where its values are held from an earlier sample (``HELD``); all False without the column."""
    if HELD not in frame.columns:
        return np.zeros(len(frame), bool)
    return frame[HELD].to_numpy(np.float64) > 0


def observed_rows(frame: pd.DataFrame) -> np.ndarray:
    """True on rows where any telemetry signal has a value, and on a MIG GPU's uncarved capacity where the GPU
    is seen (analyzer.data.mig: its DATA_SHARE > 0)."""
    out = np.zeros(len(frame), bool)
    for name in NAMES:
        if name in frame.columns:
            out |= frame[name].notna().to_numpy()
    if DATA_SHARE in frame.columns:
        out |= instance_rows(frame, UNCARVED) & (frame[DATA_SHARE].to_numpy(np.float64) > 0)
    return out


def observed_share(frame: pd.DataFrame) -> np.ndarray:
    """Per row, the share of its GPU-hours with data: 0 without any, else DATA_SHARE (1 where unmeasured)."""
    seen = observed_rows(frame).astype(np.float64)
    if DATA_SHARE in frame.columns:
        share = frame[DATA_SHARE].to_numpy(dtype=np.float64)
        seen = np.where(seen > 0, np.where(np.isnan(share), 1.0, np.clip(share, 0.0, 1.0)), 0.0)
    return seen


def hold_allocations(frame: pd.DataFrame, observed: np.ndarray | None = None) -> pd.DataFrame:
    """Carry a device's last allocation over its rows without data while the workload lives on.

    The workload is the row's ``job`` (else ``pod``, else ``namespace``); it lives on up to the
    last observed row that carries it anywhere in the fleet. Rows must be sorted by device,
    then time (the Fleet's order). Returns the frame with its allocation columns replaced.
    """
    cols = [c for c in ALLOCATION_COLUMNS if c in frame.columns]
    if not cols or not len(frame):
        return frame
    seen = observed_rows(frame) if observed is None else observed
    codes = {c: category_codes(frame[c]) for c in cols}
    held = np.zeros(len(frame), bool)
    for c in cols:
        held |= codes[c] >= 0
    candidates = ~seen & ~held
    if not candidates.any():
        return frame
    dev_keys = [frame[c] for c in ("hostname", "gpu", "gpu_instance") if c in frame.columns]
    dev = pd.MultiIndex.from_arrays(dev_keys).factorize()[0] if dev_keys else np.zeros(len(frame), np.int64)
    n = len(frame)
    pos = np.arange(n)
    first = np.r_[True, dev[1:] != dev[:-1]]
    dev_start = np.maximum.accumulate(np.where(first, pos, 0))
    src = np.maximum.accumulate(np.where(held, pos, -1))
    fill = candidates & (src >= dev_start)
    if not fill.any():
        return frame
    # The workload a row carries, and the last time it is observed anywhere.
    key = np.full(n, -1, dtype=np.int64)
    for c in reversed([c for c in ("namespace", "pod", "job") if c in cols]):
        key = np.where(key >= 0, key, np.where(codes[c] >= 0, codes[c] + (ALLOCATION_COLUMNS.index(c) << 40), -1))
    ts = frame["timestamp"].to_numpy(dtype=np.float64)
    live = seen & (key >= 0)
    last = pd.Series(ts[live]).groupby(key[live]).max()
    src_key = key[np.maximum(src, 0)]
    until = last.reindex(src_key).to_numpy(dtype=np.float64)
    fill &= ts <= np.nan_to_num(until, nan=-np.inf)
    if not fill.any():
        return frame
    out = frame.copy()
    for c in cols:
        new = codes[c].copy()
        new[fill] = codes[c][src[fill]]
        cats = frame[c].cat.categories if isinstance(frame[c].dtype, pd.CategoricalDtype) else \
            pd.Index(pd.unique(frame[c].dropna()))
        out[c] = pd.Categorical.from_codes(new, cats)
    return out


@dataclass(frozen=True)
class Coverage:
    """How much of the window's capacity has data, and when the data is."""

    capacity_gpu_hours: float
    observed_gpu_hours: float
    #: First and last observed row (unix seconds; the last row's end), None without data.
    data_start: float | None
    data_end: float | None

    @property
    def ratio(self) -> float | None:
        """Share of the capacity with data (None for an empty window)."""
        return self.observed_gpu_hours / self.capacity_gpu_hours if self.capacity_gpu_hours > 0 else None

    def message(self) -> str | None:
        """A plain sentence when the window is mostly empty, else None."""
        r = self.ratio
        if r is None or r >= MOSTLY_EMPTY:
            return None
        if self.data_start is None or self.data_end is None:
            return "0% of this window has data: every GPU-hour in it is unknown"
        span = f"{_minute(self.data_start)}–{_minute(self.data_end)}"
        return f"{100 * r:.0f}% of this window has data ({span} UTC): the rest is counted as unknown"

    @classmethod
    def from_dict(cls, data: dict[str, float | None]) -> Coverage:
        """Inverse of ``as_dict`` (the derived ratio is recomputed)."""
        return cls(float(data["capacity_gpu_hours"] or 0.0), float(data["observed_gpu_hours"] or 0.0),
                   data.get("data_start"), data.get("data_end"))

    def as_dict(self) -> dict[str, float | None]:
        return {"capacity_gpu_hours": self.capacity_gpu_hours, "observed_gpu_hours": self.observed_gpu_hours,
                "ratio": self.ratio, "data_start": self.data_start, "data_end": self.data_end}


def coverage_unknown() -> Coverage:
    """The coverage of nothing (an empty window, or a report that does not say)."""
    return Coverage(0.0, 0.0, None, None)


def _minute(t: float) -> str:
    return datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%d %H:%M")


def coverage(frame: pd.DataFrame, step: float, observed: np.ndarray | None = None) -> Coverage:
    """Capacity and observed GPU-hours of a frame (rows weigh ``step * gpu_share / 3600``; ``observed``
    is each row's share with data, ``observed_share``)."""
    obs = observed_share(frame) if observed is None else observed
    if not len(frame):
        return Coverage(0.0, 0.0, None, None)
    w = frame["gpu_share"].to_numpy(dtype=np.float64) * (step / 3600.0)
    ts = frame["timestamp"].to_numpy(dtype=np.float64)
    seen = obs > 0
    has = bool(seen.any())
    return Coverage(
        capacity_gpu_hours=float(w.sum()), observed_gpu_hours=float((w * obs).sum()),
        data_start=float(ts[seen].min()) if has else None, data_end=float(ts[seen].max()) + step if has else None,
    )
