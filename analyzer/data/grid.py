"""A Fleet's frame as dense (device x step) arrays and back, and two of them spliced in time.

normalize lays the frame out as every device at every step, devices in ``device_order`` and each
device's rows in time order (analyzer.data.frame), so every column reshapes to (devices, steps).
Identity (DEVICE_COLUMNS, PLACEMENT_COLUMNS, gpu_share) is one value per device; allocation
columns are category codes (-1 unallocated); every other column is float (NaN unknown). The
incremental service window (analyzer.data.window) keeps one of these between ticks.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analyzer.data.coverage import hold_allocations
from analyzer.data.frame import category_codes, device_order
from analyzer.data.signals import ALLOCATION_COLUMNS, DEVICE_COLUMNS, NAMES, PLACEMENT_COLUMNS

#: Per-device columns, in frame order (gpu_share follows them).
IDENTITY: tuple[str, ...] = (*DEVICE_COLUMNS, *PLACEMENT_COLUMNS)
#: What tells devices apart.
KEY: tuple[str, ...] = ("hostname", "gpu", "gpu_instance")


@dataclass(frozen=True)
class Grid:
    """Rows ``[start, start + T * step)`` of ``devices``; arrays are never changed in place."""

    start: float
    step: float
    #: One row per device: IDENTITY as str and gpu_share, in frame order.
    devices: pd.DataFrame
    #: ALLOCATION column -> (codes (devices, T), categories).
    alloc: dict[str, tuple[np.ndarray, pd.Index]]
    #: Every other column -> (devices, T) float64, in frame order.
    values: dict[str, np.ndarray]

    @property
    def T(self) -> int:
        return self.alloc["job"][0].shape[1]

    @property
    def end(self) -> float:
        return self.start + self.T * self.step

    def index(self, t: float) -> int:
        """Row position of time ``t`` (on the grid)."""
        return round((t - self.start) / self.step)

    def keys(self) -> pd.MultiIndex:
        return pd.MultiIndex.from_frame(self.devices[list(KEY)])

    def observed(self) -> np.ndarray:
        """(devices, T): rows where any telemetry signal has a value (analyzer.data.coverage)."""
        out = np.zeros((len(self.devices), self.T), bool)
        for name, arr in self.values.items():
            if name in NAMES:
                out |= ~np.isnan(arr)
        return out

    def take(self, rows: np.ndarray) -> Grid:
        """Only the devices at ``rows`` (positions or a mask)."""
        return replace(self, devices=self.devices.iloc[rows].reset_index(drop=True),
                       alloc={c: (codes[rows], cats) for c, (codes, cats) in self.alloc.items()},
                       values={c: v[rows] for c, v in self.values.items()})

    def compact(self) -> Grid:
        """Allocation categories cut to the values in use."""
        alloc = {}
        for c, (codes, cats) in self.alloc.items():
            used = np.zeros(len(cats) + 1, bool)
            used[codes.reshape(-1) + 1] = True
            remap = np.cumsum(used[1:]) - 1
            alloc[c] = (np.where(codes >= 0, remap[np.maximum(codes, 0)] if len(cats) else -1, -1), cats[used[1:]])
        return replace(self, alloc=alloc)

    def with_alloc(self, codes: dict[str, np.ndarray]) -> Grid:
        return replace(self, alloc={c: (codes[c], cats) for c, (_, cats) in self.alloc.items()})

    def unheld(self) -> Grid:
        """Allocations on rows with telemetry only: what hold_allocations started from, where
        allocations come with telemetry (the window module's documented assumption)."""
        seen = self.observed()
        return self.with_alloc({c: np.where(seen, codes, -1) for c, (codes, _) in self.alloc.items()})

    def held(self) -> Grid:
        """hold_allocations over these rows (from the unheld allocations)."""
        n, T = len(self.devices), self.T
        if not self.alloc or not n:
            return self
        dev = np.repeat(np.arange(n), T)
        slim = pd.DataFrame({"timestamp": np.tile(self.start + self.step * np.arange(T), n),
                             "hostname": dev, "gpu": dev, "gpu_instance": dev})
        for c, (codes, cats) in self.alloc.items():
            slim[c] = pd.Categorical.from_codes(codes.reshape(-1), cats)
        out = hold_allocations(slim, self.observed().reshape(-1))
        if out is slim:
            return self
        return self.with_alloc({c: category_codes(out[c]).reshape(n, T) for c in self.alloc})

    def frame(self) -> pd.DataFrame:
        """The Fleet frame of this grid (the layout normalize builds)."""
        n, T = len(self.devices), self.T
        cols: dict[str, object] = {"timestamp": np.tile(self.start + self.step * np.arange(T), n)}
        for c in IDENTITY:
            cats, codes = np.unique(self.devices[c].to_numpy(dtype=object).astype(str), return_inverse=True)
            cols[c] = pd.Categorical.from_codes(np.repeat(codes, T), cats)
        cols["gpu_share"] = np.repeat(self.devices["gpu_share"].to_numpy(dtype=np.float64), T)
        for c, (codes, cats) in self.alloc.items():
            cols[c] = pd.Categorical.from_codes(codes.reshape(-1), cats)
        for c, arr in self.values.items():
            cols[c] = arr.reshape(-1)
        return pd.DataFrame(cols)


def to_grid(frame: pd.DataFrame, start: float, end: float, step: float) -> Grid:
    """The grid of a Fleet frame over ``[start, end)``; ValueError where the frame is not every device at
    every step in frame order (the layout normalize builds)."""
    T = round((end - start) / step)
    n, rem = divmod(len(frame), T) if T > 0 else (0, len(frame))
    times = start + step * np.arange(T)
    if T <= 0 or rem or not np.array_equal(frame["timestamp"].to_numpy(dtype=np.float64).reshape(n, T),
                                           np.broadcast_to(times, (n, T))):
        raise ValueError(f"the frame is not every device at every {step:g}s step of [{start:.0f}, {end:.0f})")
    first = frame.iloc[::T]
    devices = pd.DataFrame({c: first[c].astype(object).fillna("").astype(str).to_numpy(dtype=object)
                            for c in IDENTITY})
    devices["gpu_share"] = first["gpu_share"].to_numpy(dtype=np.float64)
    if not np.array_equal(device_order(*(devices[c].to_numpy() for c in KEY)), np.arange(n)):
        raise ValueError("the frame's devices are not in frame order")
    alloc = {}
    for c in ALLOCATION_COLUMNS:
        col = frame[c] if isinstance(frame[c].dtype, pd.CategoricalDtype) else frame[c].astype("category")
        alloc[c] = (category_codes(col).reshape(n, T), pd.Index(col.cat.categories.astype(str)))
    fixed = {"timestamp", "gpu_share", *IDENTITY, *ALLOCATION_COLUMNS}
    values = {c: frame[c].to_numpy(dtype=np.float64).reshape(n, T) for c in frame.columns if c not in fixed}
    return Grid(float(start), float(step), devices, alloc, values)


def _value_order(names: list[str]) -> list[str]:
    """Other columns first (as they come), then signals in analyzer.data.signals order."""
    rank = {n: i for i, n in enumerate(NAMES)}
    return sorted(dict.fromkeys(names), key=lambda c: (c in rank, rank.get(c, 0)))


def splice(old: Grid, new: Grid, start: float, cut: float, end: float) -> Grid:
    """Rows ``[start, cut)`` from ``old`` and ``[cut, end)`` from ``new`` over the devices of both (identity
    from ``new`` where both have a device); a device's rows in the part that lacks it are unknown (NaN,
    unallocated). Both must be on one step grid and cover their part."""
    step = new.step
    T, c = round((end - start) / step), round((cut - start) / step)
    a0, b0 = old.index(start), new.index(cut)
    if not (0 <= c <= T and a0 >= 0 and a0 + c <= old.T and b0 >= 0 and b0 + T - c <= new.T):
        raise ValueError(f"cannot splice [{start:.0f}, {cut:.0f}) of [{old.start:.0f}, {old.end:.0f}) with "
                         f"[{cut:.0f}, {end:.0f}) of [{new.start:.0f}, {new.end:.0f})")
    both = pd.concat([new.devices, old.devices], ignore_index=True).drop_duplicates(list(KEY), ignore_index=True)
    devices = both.iloc[device_order(*(both[k].to_numpy() for k in KEY))].reset_index(drop=True)
    keys = pd.MultiIndex.from_frame(devices[list(KEY)])
    io, inew = keys.get_indexer(old.keys()), keys.get_indexer(new.keys())
    n = len(devices)
    values = {}
    for name in _value_order([*old.values, *new.values]):
        out = np.full((n, T), np.nan)
        if name in old.values:
            out[io, :c] = old.values[name][:, a0:a0 + c]
        if name in new.values:
            out[inew, c:] = new.values[name][:, b0:b0 + T - c]
        values[name] = out
    alloc = {}
    for name in ALLOCATION_COLUMNS:
        (oc, ocats), (nc, ncats) = old.alloc[name], new.alloc[name]
        cats = ocats.union(ncats)
        out = np.full((n, T), -1, dtype=np.int64)
        for rows, codes, own, part in ((io, oc[:, a0:a0 + c], ocats, slice(0, c)),
                                       (inew, nc[:, b0:b0 + T - c], ncats, slice(c, T))):
            remap = cats.get_indexer(own)
            out[rows, part] = np.where(codes >= 0, remap[np.maximum(codes, 0)] if len(remap) else -1, -1)
        alloc[name] = (out, cats)
    return Grid(float(start), step, devices, alloc, values).compact()
