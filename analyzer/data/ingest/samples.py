"""The compact ingest form both readers build and normalize reads: a series table and per-metric blocks.

A long frame (one row per sample, a categorical column per label) costs ~40 bytes a sample and
normalize used to re-derive series from it; here a sample costs its timestamp (an index into the
block's distinct times: 1 byte for up to 256 of them, as an hour of 15 s scrapes has, 2 bytes up
to 65,536; float64 where most are distinct) and its value (float32 where every value of the
metric survives the round trip exactly, else float64: an energy counter in mJ keeps all its
digits). Which series a sample belongs to is implied by its position: a block holds one metric's
samples sorted by series, then time, and the sample offset of each series, so no per-sample label
or series-id column exists.

Canonical order, the same whichever way Samples are made: blocks in the order their metric first
appears in the input, series within a block in the order they first appear, samples within a series
by time (ties in input order). ``Samples.frame`` is the long frame in that order;
``Samples.from_frame`` turns any long frame back into Samples, so normalize has one code path.
"""

from __future__ import annotations

from collections.abc import Collection, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

#: Fixed columns of the long frame; label columns follow.
FRAME_COLUMNS: tuple[str, ...] = ("metric", "timestamp", "value")
#: Samples compared per pass where a whole block's temporaries are not needed.
_SLICE = 1 << 20


@dataclass(frozen=True)
class Block:
    """The samples of one metric: series ``first .. first + n_series - 1``, each a run sorted by time."""

    metric: str
    #: Id (row of ``Samples.series``) of the block's first series.
    first: int
    #: Sample offsets (int64, n_series + 1): series ``first + i`` holds samples ``bounds[i]:bounds[i + 1]``.
    bounds: np.ndarray
    #: The distinct timestamps, sorted, indexed by ``at``; or, where ``at`` is None, every sample's.
    times: np.ndarray
    at: np.ndarray | None
    val: np.ndarray

    @classmethod
    def make(cls, metric: str, first: int, n_series: int, local: np.ndarray, ts: np.ndarray,
             val: np.ndarray) -> Block:
        """A block from samples already sorted by ``local`` series index (0..n_series-1), then time."""
        counts = np.bincount(local, minlength=n_series)
        bounds = np.zeros(n_series + 1, dtype=np.int64)
        np.cumsum(counts, out=bounds[1:])
        times, at = encode_times(ts, len(ts) // 2)
        return cls(metric, first, bounds, times, at, val)

    @property
    def n_series(self) -> int:
        return len(self.bounds) - 1

    def __len__(self) -> int:
        return len(self.val)

    @property
    def nbytes(self) -> int:
        return self.bounds.nbytes + self.times.nbytes + (self.at.nbytes if self.at is not None else 0) + \
            self.val.nbytes

    def timestamps(self, sel: slice | np.ndarray = slice(None)) -> np.ndarray:
        """The float64 timestamps of samples ``sel``."""
        return self.times[self.at[sel]] if self.at is not None else self.times[sel]

    def series_index(self) -> np.ndarray:
        """Per sample, its series' index within the block (0..n_series-1)."""
        return np.repeat(np.arange(self.n_series, dtype=np.int64), np.diff(self.bounds))


@dataclass(frozen=True)
class Samples:
    """Ingested samples: ``series`` has one row per series (``metric``, then one column per label, None
    where a series lacks it), in block order; ``blocks`` hold the samples (module docstring)."""

    series: pd.DataFrame
    blocks: tuple[Block, ...] = ()
    #: What readers worked out from ``series`` (normalize's per-series tables), kept with it where a reader
    #: hands out the same table again (serve's ticks: LabelSets' series space); None: nothing is kept.
    memo: dict[Any, Any] | None = field(default=None, compare=False, repr=False)

    def __len__(self) -> int:
        return sum(len(b) for b in self.blocks)

    @property
    def nbytes(self) -> int:
        """Bytes held by the per-sample arrays."""
        return sum(b.nbytes for b in self.blocks)

    @property
    def label_names(self) -> list[str]:
        return [c for c in self.series.columns if c != "metric"]

    def frame(self, metrics: Collection[str] | None = None) -> pd.DataFrame:
        """The long frame (``metric``, ``timestamp``, ``value``, one categorical per label present) of
        every metric, or of ``metrics`` only, in canonical order."""
        blocks = [b for b in self.blocks if metrics is None or b.metric in metrics]
        rows = np.concatenate([np.arange(b.first, b.first + b.n_series) for b in blocks]) if blocks else \
            np.zeros(0, dtype=np.int64)
        offsets = np.cumsum([0] + [b.n_series for b in blocks[:-1]])
        at = (np.concatenate([o + b.series_index() for o, b in zip(offsets, blocks, strict=True)]) if blocks
              else np.zeros(0, dtype=np.int64))  # fmt: skip
        table = self.series.iloc[rows] if len(rows) < len(self.series) else self.series
        columns: dict[str, object] = {
            "metric": _categorical(table["metric"].to_numpy(dtype=object), at),
            "timestamp": np.concatenate([b.timestamps() for b in blocks]) if blocks else np.zeros(0),
            "value": np.concatenate([b.val.astype(np.float64) for b in blocks]) if blocks else np.zeros(0),
        }
        for name in self.label_names:
            per_series = table[name].to_numpy(dtype=object)
            if metrics is None or pd.notna(per_series).any():
                columns[name] = _categorical(per_series, at)
        return pd.DataFrame(columns)

    @classmethod
    def empty(cls) -> Samples:
        return cls(pd.DataFrame({"metric": pd.Series(dtype=object)}))

    @classmethod
    def from_frame(cls, long: pd.DataFrame) -> Samples:
        """Samples of a long frame (rows without a metric dropped; no deduplication: a long frame is
        taken as it is). A series is a distinct (metric, label values) row; label values become strings."""
        mcodes, names = _codes(long["metric"])
        rows = np.flatnonzero(mcodes >= 0)
        whole = len(rows) == len(long)
        label_cols = [c for c in long.columns if c not in FRAME_COLUMNS]
        cols = [(mcodes if whole else mcodes[rows], names)]
        for c in label_cols:
            codes, cats = _codes(long[c])
            cols.append((codes if whole else codes[rows], cats))
        ts = long["timestamp"].to_numpy(dtype=np.float64)
        val = long["value"].to_numpy(dtype=np.float64)
        if not whole:
            ts, val = ts[rows], val[rows]
        sid, first = _series_ids([c for c, _ in cols])
        del cols[0]  # the metric codes of the series come from ``first``
        metric_of_series = mcodes[rows[first] if not whole else first]
        # blocks in metric first-appearance order; series keep their first-appearance order within one
        block_of_metric = np.full(len(names), -1, dtype=np.int64)
        seen = pd.unique(metric_of_series)
        block_of_metric[seen] = np.arange(len(seen))
        series_block = block_of_metric[metric_of_series]
        canonical = np.argsort(series_block, kind="stable")
        new_id = np.empty(len(canonical), dtype=np.int64)
        new_id[canonical] = np.arange(len(canonical))
        table = {"metric": np.asarray(names, dtype=object)[metric_of_series[canonical]]}
        for name, (codes, cats) in zip(label_cols, cols, strict=True):
            c = codes[first[canonical]]
            per = np.full(len(c), None, dtype=object)
            per[c >= 0] = cats[c[c >= 0]]
            table[name] = per
        sample_block = series_block[sid]
        order = np.argsort(sample_block, kind="stable")
        edges = np.searchsorted(sample_block[order], np.arange(len(seen) + 1))
        starts = np.searchsorted(series_block[canonical], np.arange(len(seen) + 1))
        blocks = []
        for k in range(len(seen)):
            idx = order[edges[k]:edges[k + 1]]
            local = new_id[sid[idx]] - starts[k]
            local, t, v = sort_by_series(local, ts[idx], val[idx])
            blocks.append(Block.make(str(names[seen[k]]), int(starts[k]), int(starts[k + 1] - starts[k]),
                                     local, t, narrow(v)))
        return cls(pd.DataFrame({k: pd.Series(v, dtype=object) for k, v in table.items()}), tuple(blocks))

    @classmethod
    def concat(cls, parts: Sequence[Samples]) -> Samples:
        """One Samples of several (e.g. one per query), as concatenating their long frames would give."""
        parts = [p for p in parts if p.blocks]
        if not parts:
            return cls.empty()
        if len(parts) == 1:
            return parts[0]
        names = [b.metric for p in parts for b in p.blocks]
        if len(set(names)) < len(names):  # a metric in two parts: its series may repeat across them
            return cls.from_frame(pd.concat([p.frame() for p in parts], ignore_index=True))
        blocks, offset = [], 0
        for p in parts:
            blocks += [replace(b, first=b.first + offset) for b in p.blocks]
            offset += len(p.series)
        return cls(pd.concat([p.series for p in parts], ignore_index=True), tuple(blocks), _joint_memo(parts))


def _joint_memo(parts: Sequence[Samples]) -> dict[Any, Any] | None:
    """The memo of parts joined (``concat``): kept in the first part's while every part's table is the one it
    was made for (the tables themselves are held, so none is taken for a new one at the same address)."""
    if any(p.memo is None for p in parts):
        return None
    tables, key = tuple(p.series for p in parts), ("concat", len(parts))
    kept = parts[0].memo.get(key)
    if kept is None or not all(a is b for a, b in zip(kept[0], tables, strict=True)):
        kept = parts[0].memo[key] = (tables, {})
    return kept[1]


def narrow(values: np.ndarray) -> np.ndarray:
    """``values`` as float32 when every one survives the round trip exactly (NaN included), else float64."""
    with np.errstate(over="ignore", invalid="ignore"):
        v32 = values.astype(np.float32)
    return v32 if np.array_equal(v32, values, equal_nan=True) else np.asarray(values, dtype=np.float64)


def encode_times(ts: np.ndarray, most: int) -> tuple[np.ndarray, np.ndarray | None]:
    """(sorted distinct times, per-sample uint8/uint16/int32 index into them), or (ts, None) where there
    are more than ``most`` distinct times (the index would not pay)."""
    codes, uniq = pd.factorize(ts, use_na_sentinel=False)
    if len(uniq) > most:
        return ts, None
    order = np.argsort(uniq, kind="stable")
    rank = np.empty(len(uniq), dtype=np.min_scalar_type(max(len(uniq) - 1, 0)) if len(uniq) <= 1 << 16 else np.int32)
    rank[order] = np.arange(len(uniq))
    return np.asarray(uniq, dtype=np.float64)[order], rank[codes]


def sort_by_series(local: np.ndarray, ts: np.ndarray, *columns: np.ndarray) -> tuple[np.ndarray, ...]:
    """The arrays ordered by (series index, time), ties in input order; returned as given when they
    already are (files and Prometheus answers mostly are), so no permutation is built."""
    if _sorted(local, ts):
        return (local, ts, *columns)
    order = np.lexsort((ts, local))
    return tuple(a[order] for a in (local, ts, *columns))


def _sorted(local: np.ndarray, ts: np.ndarray) -> bool:
    for a in range(0, max(len(local) - 1, 0), _SLICE):
        b = min(a + _SLICE + 1, len(local))
        dl = np.diff(local[a:b].astype(np.int64))
        if (dl < 0).any() or ((dl == 0) & (np.diff(ts[a:b]) < 0)).any():
            return False
    return True


def _categorical(per_series: np.ndarray, at: np.ndarray) -> pd.Categorical:
    """Per-sample categorical from per-series values (None/NaN: absent), without per-sample strings."""
    series_cat = pd.Categorical(per_series)
    return pd.Categorical.from_codes(np.asarray(series_cat.codes)[at], categories=series_cat.categories)


def _codes(col: pd.Series) -> tuple[np.ndarray, np.ndarray]:
    """(per-row int codes, -1 = missing; category values as strings)."""
    if isinstance(col.dtype, pd.CategoricalDtype):
        return np.asarray(col.cat.codes, dtype=np.int64), np.asarray(col.cat.categories.astype(str), dtype=object)
    codes, uniques = pd.factorize(col, use_na_sentinel=True)
    return codes.astype(np.int64), np.asarray(pd.Index(uniques).astype(str), dtype=object)


def _series_ids(codes: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Per-row series id over all code columns (first-appearance order), and each series' first row."""
    n = len(codes[0])
    key = np.zeros(n, dtype=np.int64)
    for c in codes:
        width = int(c.max()) + 2 if n else 1
        if n and (int(key.max()) + 1) * width >= 2**62:
            key = pd.factorize(key)[0].astype(np.int64)
        key = key * width + (c + 1)
    sid = pd.factorize(key)[0].astype(np.int64)
    first = np.empty(int(sid.max()) + 1 if n else 0, dtype=np.int64)
    first[sid[::-1]] = np.arange(n)[::-1]
    return sid, first


__all__ = ["FRAME_COLUMNS", "Block", "Samples", "encode_times", "narrow", "sort_by_series"]
