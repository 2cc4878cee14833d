"""What both readers share: the report, the metric filter and the builder of the compact Samples.

The builder keeps one row per distinct series (metric + labels) and, per sample, only the series
id, timestamp and value as numpy arrays, grouped by metric as they arrive; ``samples()`` turns them
into analyzer.data.ingest.samples.Samples (no per-sample label column ever exists) and ``build()``
into the long frame for those who want one.
"""

from __future__ import annotations

import ctypes
import ctypes.util
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field, replace
from itertools import groupby
from operator import itemgetter
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from analyzer.data.ingest.matrix import labels_of
from analyzer.data.ingest.samples import FRAME_COLUMNS, Block, Samples, encode_times, narrow, sort_by_series
from exporter import schema

#: Labels that tell the members of a highly-available Prometheus pair apart (Prometheus Operator's
#: ``prometheus_replica``, the Thanos/Cortex/Mimir conventions ``replica`` and ``__replica__``, Thanos
#: Ruler's ``rule_replica``): both members scrape the same targets, so the series of one target from
#: two replicas are one series. The reader drops these labels, so the copies fall into one series and
#: their repeated samples are deduplicated (never twice the GPU-hours).
REPLICA_LABELS: frozenset[str] = frozenset({"replica", "prometheus_replica", "__replica__", "rule_replica"})
#: A series merged from HA replicas whose shorter gap of two is below this share of the longer one (median pair)
#: holds the replicas' own scrapes interleaved (``_interleaved``); at the same instants the two are equal.
INTERLEAVED = 0.8
#: Pairs of consecutive gaps a series needs for that judgement.
MIN_PAIRS = 8


@dataclass(frozen=True)
class BadLine:
    """One input line (or response) that could not be read, with where and why."""

    source: str
    line_number: int
    reason: str
    text: str


@dataclass
class IngestReport:
    """What an ingest read, skipped and changed, so nothing is lost silently."""

    samples: int = 0
    series: int = 0
    files: list[str] = field(default_factory=list)
    bad_lines: list[BadLine] = field(default_factory=list)
    bad_line_count: int = 0
    #: metric name -> DCGM sentinel values turned into NaN.
    sentinels: dict[str, int] = field(default_factory=dict)
    #: metric name -> values outside the contract's valid range (or +-Inf) turned into NaN.
    out_of_range: dict[str, int] = field(default_factory=dict)
    #: metric name -> samples whose value was NaN as given (unknown, like a missing sample).
    nans: dict[str, int] = field(default_factory=dict)
    #: metric name -> (series, time) pairs given more than once with different values (averaged).
    conflicts: dict[str, int] = field(default_factory=dict)
    #: The first conflict, as "metric{labels} at T: v1 vs v2", for the note.
    conflict_example: str = ""
    #: metric name -> samples repeated exactly (one series, one time, one value): all but one dropped.
    duplicates: dict[str, int] = field(default_factory=dict)
    #: HA replica label -> the replica values merged (REPLICA_LABELS).
    replicas: dict[str, set[str]] = field(default_factory=dict)
    #: Samples of HA replicas that scraped at their own times: all but one per scrape interval dropped.
    replica_samples: int = 0
    warnings: list[str] = field(default_factory=list)
    #: ``# TYPE`` declarations seen in files (family name -> type).
    metric_types: dict[str, str] = field(default_factory=dict)
    #: Samples dropped on purpose because the metric filter did not select them.
    filtered_samples: int = 0
    #: OpenMetrics exemplars seen (and ignored: they are not samples).
    exemplars_ignored: int = 0
    #: Requested metrics (exact names) that produced no sample at all.
    missing: list[str] = field(default_factory=list)
    #: Prometheus: metric name -> the PromQL that fetched it.
    queries: dict[str, str] = field(default_factory=dict)
    #: Byte ranges of files that other processes read (analyzer.data.ingest.split); 0: one process read it all.
    worker_parts: int = 0
    max_examples: int = 20

    def add_bad(self, source: str, line_number: int, reason: str, text: str | bytes) -> None:
        """Count a bad line; keep the first ``max_examples`` as examples."""
        self.bad_line_count += 1
        if len(self.bad_lines) < self.max_examples:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "backslashreplace")
            self.bad_lines.append(BadLine(source, line_number, reason, text[:200]))

    def add(self, other: IngestReport, line_offset: int = 0) -> None:
        """Count ``other``'s reading in too (another read, or a worker's part of this file whose line numbers
        start after ``line_offset`` lines); examples stay the first ``max_examples``."""
        self.samples += other.samples
        self.series += other.series
        self.bad_line_count += other.bad_line_count
        room = max(self.max_examples - len(self.bad_lines), 0)
        self.bad_lines += [replace(b, line_number=b.line_number + line_offset) for b in other.bad_lines[:room]]
        for mine, theirs in ((self.sentinels, other.sentinels), (self.out_of_range, other.out_of_range),
                             (self.nans, other.nans),
                             (self.conflicts, other.conflicts), (self.duplicates, other.duplicates)):
            for k, v in theirs.items():
                mine[k] = mine.get(k, 0) + v
        self.conflict_example = self.conflict_example or other.conflict_example
        for k, values in other.replicas.items():
            self.replicas.setdefault(k, set()).update(values)
        self.replica_samples += other.replica_samples
        self.warnings += other.warnings
        self.metric_types.update(other.metric_types)
        self.filtered_samples += other.filtered_samples
        self.exemplars_ignored += other.exemplars_ignored
        self.missing += [m for m in other.missing if m not in self.missing]
        self.queries.update(other.queries)
        self.worker_parts += other.worker_parts

    @property
    def sentinel_count(self) -> int:
        return sum(self.sentinels.values())

    def summary(self) -> str:
        """One line for logs and the CLI."""
        parts = [f"{self.samples} samples", f"{self.series} series"]
        if self.files:
            parts.append(f"{len(self.files)} files")
        if self.bad_line_count:
            parts.append(f"{self.bad_line_count} bad lines")
        if self.sentinels:
            parts.append(f"{self.sentinel_count} DCGM sentinel values -> NaN")
        if self.out_of_range:
            parts.append(f"{sum(self.out_of_range.values())} out-of-range values -> NaN")
        if self.nans:
            parts.append(f"{sum(self.nans.values())} NaN values")
        if self.conflicts:
            parts.append(f"{sum(self.conflicts.values())} conflicting duplicate samples")
        if self.duplicates:
            parts.append(f"{sum(self.duplicates.values())} repeated samples dropped")
        if self.replicas:
            merged = ", ".join(f"{k} ({len(v)})" for k, v in sorted(self.replicas.items()))
            parts.append(f"HA replicas merged: {merged}")
        if self.replica_samples:
            parts.append(f"{self.replica_samples} samples of other replicas in the same scrape interval dropped")
        if self.filtered_samples:
            parts.append(f"{self.filtered_samples} samples filtered out")
        if self.missing:
            parts.append(f"missing: {', '.join(self.missing)}")
        if self.warnings:
            parts.append(f"{len(self.warnings)} warnings")
        return ", ".join(parts)


@dataclass(frozen=True)
class MetricFilter:
    """Which metric names to keep: exact ``names`` and/or name ``prefixes`` (empty = nothing).

    Names are matched as written in the input (``DCGM_FI_DEV_GPU_UTIL`` and
    ``dcgm_fi_dev_gpu_util`` are different names; counters carry ``_total``).
    """

    names: frozenset[str] = frozenset()
    prefixes: tuple[str, ...] = ()
    #: Kept when present, never reported absent: auxiliary series only some inputs need
    #: (kube_pod_info, read only when hosts are dcgm-exporter pod names).
    optional: frozenset[str] = frozenset()

    def matches(self, name: str) -> bool:
        return name in self.names or name in self.optional or (bool(self.prefixes) and name.startswith(self.prefixes))

    @classmethod
    def for_metrics(cls, metrics: Iterable[schema.Metric], dcgm: bool = True) -> MetricFilter:
        """The contract families ``metrics`` plus, with ``dcgm``, every dcgm-exporter field
        (both spellings) that feeds them: what the normalize step needs to read them."""
        metrics = tuple(metrics)
        names = {m.name for m in metrics}
        if dcgm:
            wanted = {m.name for m in metrics}
            names |= {field_name for field_name, (m, _f) in schema.DCGM_BY_FIELD.items() if m.name in wanted}
        return cls(frozenset(names))


def metric_filter(names: Iterable[str] = (), prefixes: Iterable[str] = ()) -> MetricFilter:
    """Build a MetricFilter from exact names and name prefixes."""
    return MetricFilter(frozenset(names), tuple(prefixes))


def is_dcgm_name(name: str) -> bool:
    """DCGM sentinels only mean "blank" in dcgm-exporter series, never in truegpu's own."""
    return name in schema.DCGM_BY_FIELD or name[:8].lower() == "dcgm_fi_"


def sentinel_mask(values: np.ndarray) -> np.ndarray:
    """Vectorised ``schema.is_dcgm_sentinel`` (same ranges, from the contract)."""
    mask = np.zeros(values.shape, dtype=bool)
    for lo, hi in schema.DCGM_SENTINEL_RANGES:
        mask |= (values >= lo) & (values <= hi)
    return mask


class _Grow:
    """A numpy array extended as values arrive (capacity doubled when full): per-series attributes that
    vectorized code indexes by series id while new series keep arriving."""

    def __init__(self, dtype: Any, fill: Any) -> None:
        self._a = np.full(1024, fill, dtype=dtype)
        self._fill = fill
        self.n = 0

    def extend(self, values: Sequence[Any]) -> None:
        need = self.n + len(values)
        if need > len(self._a):
            grown = np.full(max(need, 2 * len(self._a)), self._fill, dtype=self._a.dtype)
            grown[: self.n] = self._a[: self.n]
            self._a = grown
        if len(values) == 1:  # a file's series come one at a time: an item is set 4x faster than a slice
            self._a[self.n] = values[0]
        else:
            self._a[self.n:need] = values
        self.n = need

    @property
    def array(self) -> np.ndarray:
        """The values so far (a view: writes go to the attribute)."""
        return self._a[: self.n]


class _Canon(NamedTuple):
    """A raw label set as a series knows it: ``name`` from ``__name__`` (None: the metric asked for), its pairs
    (given order, no empty value, no replica label), the same sorted (its identity), the replica pairs dropped;
    ``raw`` the label set itself, as LabelSets keeps it (pairs, or an answer's JSON object of them)."""

    raw: tuple[tuple[str, str], ...] | bytes
    name: str | None
    pairs: tuple[tuple[str, str], ...]
    key: tuple[tuple[str, str], ...]
    replicas: tuple[tuple[str, str], ...]


class _Answer(NamedTuple):
    """A metric's answers as one read took them (LabelSets.answer): the numbering it used, the positions of its
    series holding points and their canonical forms, their canonical order and their ids in that order."""

    space: _Space
    keep: list[int]
    canons: list[_Canon]
    order: list[int]
    sids: list[int]


class LabelSets:
    """Raw label sets (pairs, or an answer's JSON bytes) to their canonical form, and each metric's series, kept
    from one read to the next: `serve` reads the same series every tick, and working each out again was most of
    a tick. Two generations: a label set that neither the current nor the previous read (``turn``) named is
    forgotten, so churned pods don't pile up. Equal pairs and label sets are one object, so a fleet's series
    cost a few hundred bytes each, not a copy of every string and tuple (a GPU's labels repeat in every
    metric's series).
    ``remember=False`` (one read, whose reader already knows its series: a file): nothing is kept but that."""

    def __init__(self, remember: bool = True) -> None:
        self.remember = remember
        self._now: dict[tuple | bytes, _Canon] = {}
        self._before: dict[tuple | bytes, _Canon] = {}
        self._interned: dict[tuple, tuple] = {}
        #: Metric name -> its series in the current read, and in the one before it.
        self.series: dict[str, int] = {}
        self.series_before: dict[str, int] = {}
        #: Series numbering kept between reads (remembering), and the series the current read used; the
        #: numbering is kept while it holds at most twice the series the last read used, plus ``spare``.
        self.space = _Space()
        self.used = 0
        self.spare = 65536
        #: Metric name -> its answers' series as the current and the last read ordered and numbered them.
        self._answers: dict[str, _Answer] = {}
        self._answers_before: dict[str, _Answer] = {}

    def turn(self) -> None:
        """A new read begins: what the one before last named and the last did not is forgotten; the series
        numbering starts over once it holds more than twice the series the last read used (churned pods)."""
        self._before, self._now = self._now, {}
        self._interned = {}
        self.series_before, self.series = self.series, {}
        self._answers_before, self._answers = self._answers, {}
        if not self.remember or self.space.group.n > 2 * self.used + self.spare:
            self.space = _Space()
        self.used = 0

    def answer(self, metric: str, labels: Sequence[Any], keep: list[int]) -> _Answer | None:
        """The last read's ordering and numbering of ``metric``'s series when this read's answers name the same
        series in the same order (``labels`` of the series holding points, at ``keep``): Prometheus answers a
        tick's query as it answered the last, and ordering and numbering ~600 k series again was a second a
        10,000-GPU tick."""
        a = self._answers_before.get(metric)
        if (a is None or a.space is not self.space or a.keep != keep
                or [labels[i] for i in keep] != [c.raw for c in a.canons]):
            return None
        self._answers[metric] = a
        return a

    def keep_answer(self, metric: str, keep: list[int], canons: list[_Canon], order: list[int],
                    sids: list[int]) -> None:
        """Remember how this read ordered (``order``: positions in ``keep``) and numbered a metric's series."""
        if self.remember:
            self._answers[metric] = _Answer(self.space, keep, canons, order, sids)

    def get(self, raw: tuple[tuple[str, str], ...] | bytes) -> _Canon:
        """The canonical form of a label set: pairs, or an answer's JSON object of them (kept as it is)."""
        c = self._now.get(raw)
        if c is None:
            c = self._before.get(raw) or self._canonical(raw)
            if self.remember:
                self._now[c.raw] = c  # the key kept the first time, not this read's equal copy
        return c

    def _canonical(self, raw: tuple[tuple[str, str], ...] | bytes) -> _Canon:
        name, replicas, pairs = None, [], []
        shared = self._interned.setdefault
        for k, v in labels_of(raw, "a series").items() if isinstance(raw, bytes) else raw:
            if k == "__name__":
                name = v
            elif k in REPLICA_LABELS:
                if v != "":
                    replicas.append((k, v))
            elif v != "":
                pair = (k, v)
                pairs.append(shared(pair, pair))
        kept = tuple(pairs)
        key = tuple(sorted(kept))
        if self.remember and not isinstance(raw, bytes):  # kept as the key that finds it: its pairs shared
            raw = tuple(shared(p, p) for p in raw)
        return _Canon(raw, name, shared(kept, kept), shared(key, key), tuple(sorted(replicas)))


class _Space:
    """Series numbering and what is known per series and per label set: a read's own, or kept by serve's ticks'
    LabelSets from one read to the next (a tick names the same ~60 series a GPU as the last one: numbering
    them and building their label columns again was most of what a 10,000-GPU tick spent after decoding).
    Only the arrival of each series' first sample is per read (``first``, reset when a read begins)."""

    def __init__(self) -> None:
        self.ids: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        #: The distinct label sets (pairs in given order), and per series the index of its own.
        self.labelsets: dict[tuple[tuple[str, str], ...], int] = {}
        self.lsid = _Grow(np.int32, -1)
        #: Per series, indexed by id (arrays that grow with the series, never rebuilt from lists: a 10,000-GPU
        #: file brings ~600 k series a few at a time): its group (block, one per metric), arrival of its first
        #: sample (-1: none yet, for the canonical order).
        self.group = _Grow(np.int32, 0)
        self.first = _Grow(np.int64, -1)
        #: Metric name -> its group; per group, its name, a dcgm-exporter name? and the valid range of its values
        #: (the contract's; any finite value for others).
        self.groups: dict[str, int] = {}
        self.names: list[str] = []
        self.dcgm = np.zeros(0, dtype=bool)
        self.range = np.zeros((2, 0))
        #: Label name -> per label set its value (None: the set lacks it), for the label sets up to ``filled``.
        self.columns: dict[str, _Grow] = {}
        self.filled = 0
        #: Per set of metrics read together (one builder of a read: serve reads gauges and DCGM counters apart),
        #: the last series table, the series it was built for (order named, canonical order), the warnings it
        #: gave, and what readers kept from it (Samples.memo).
        self.tables: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, pd.DataFrame, list[str], dict]] = {}

    def fill(self) -> list[tuple[tuple[str, str], ...]]:
        """Write the label columns of the label sets added since the last call; returns every label set."""
        sets = list(self.labelsets)
        n = len(sets)
        for col in self.columns.values():
            col.extend([None] * (n - col.n))
        for i in range(self.filled, n):
            for k, v in sets[i]:
                col = self.columns.get(k)
                if col is None:
                    col = self.columns[k] = _Grow(object, None)
                    col.extend([None] * n)
                col.array[i] = v
        self.filled = n
        return sets


class FrameBuilder:
    """Accumulates samples by series id and builds the compact Samples once at the end.

    Samples are buffered as they come and, every ``FLUSH`` samples, split by metric into pieces
    (series id int32, timestamp as an index into the flush's distinct times, value as float32 where
    exact), so holding them costs ~10 bytes a sample whatever the labels. ``samples()`` then makes
    one block per metric: pieces joined, series numbered in first-appearance order, sorted by series
    and time (only where they are not already), repeats deduplicated."""

    #: Samples buffered before they are split by metric.
    FLUSH = 1 << 18

    def __init__(self, report: IngestReport, sentinels: bool = True, labelsets: LabelSets | None = None) -> None:
        """``sentinels=False`` reads raw: no DCGM sentinel and no valid-range check; ``labelsets`` kept from
        earlier reads of the same series (by default, one for this read that keeps nothing)."""
        self.report = report
        self.sentinels = sentinels
        self.labelsets = labelsets if labelsets is not None else LabelSets(remember=False)
        self._space = self.labelsets.space
        self._space.first.array[:] = -1  # a read that failed half way left its arrivals
        #: This read's series in the order it first named them (the series table's label order is theirs).
        self._named: list[list[int]] = []
        self._pending: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._pending_n = 0
        #: Per group: its pieces in arrival order.
        self._pieces: dict[int, list[_Piece]] = {}
        self._arrived = 0
        #: Series id -> the replica label sets its copies came with (this read's; ``_interleaved``).
        self._replicas_of: dict[int, set[tuple[tuple[str, str], ...]]] = {}

    def series_id(self, metric: str, labels: Iterable[tuple[str, str]]) -> int:
        """Id of the series ``metric{labels}`` (label order and empty values don't matter; the HA
        replica labels of REPLICA_LABELS are dropped, so the replicas' copies are one series; a label
        ``__name__`` names the metric instead)."""
        return self.series_ids(metric, [self.labelsets.get(tuple(labels))])[0]

    def series_ids(self, metric: str, canons: Iterable[_Canon]) -> list[int]:
        """``series_id`` of each label set (as ``labelsets.get`` gives it), a whole answer at once: a read of
        Prometheus names ~60 series a GPU, and the arrays per series grow once per answer."""
        out: list[int] = []
        space = self._space
        ids, sets, base, new, lsid = space.ids, space.labelsets, space.group.n, [], []
        for c in canons:
            name = c.name or metric
            key = (name, c.key)
            sid = ids.get(key)
            if sid is None:
                sid = ids[key] = base + len(new)
                new.append(name)
                lsid.append(sets.setdefault(c.pairs, len(sets)))
            if c.replicas:
                for k, v in c.replicas:
                    self.report.replicas.setdefault(k, set()).add(v)
                self._replicas_of.setdefault(sid, set()).add(c.replicas)
            out.append(sid)
        if new:
            groups = {name: self._group_of(name) for name in dict.fromkeys(new)}  # an answer: one name, mostly
            space.group.extend([groups[name] for name in new])
            space.first.extend([-1] * len(new))
            space.lsid.extend(lsid)
        self._named.append(out)
        return out

    def named_again(self, canons: list[_Canon], sids: list[int]) -> None:
        """Series an earlier read numbered (LabelSets.answer), named by this one in the same order (``sids``;
        ``canons``, in any order, for their replica labels)."""
        self._named.append(sids)
        for c in canons:
            for k, v in c.replicas:
                self.report.replicas.setdefault(k, set()).add(v)

    def _group_of(self, metric: str) -> int:
        space = self._space
        group = space.groups.get(metric)
        if group is None:
            group = space.groups[metric] = len(space.groups)
            space.names.append(metric)
            space.dcgm = np.append(space.dcgm, is_dcgm_name(metric))
            space.range = np.column_stack([space.range, schema.valid_range_of(metric) or (-np.inf, np.inf)])
        return group

    def metric_of(self, sid: int) -> str:
        return self._space.names[self._space.group.array[sid]]

    def add(self, sids: np.ndarray, timestamps: np.ndarray, values: np.ndarray) -> None:
        """Append samples (arrays of equal length). Unless read raw (``sentinels=False``), NaN values as given
        are counted, and DCGM sentinels, then values outside the contract's valid range (+-Inf included), become
        NaN (unknown) and are counted."""
        if not len(sids):
            return
        values = np.array(values, dtype=np.float64)  # a copy: masked values are overwritten
        if self.sentinels:
            self._drop(values, sids, np.isnan(values), self.report.nans)
            group = self._space.group.array[sids]
            self._drop(values, sids, sentinel_mask(values) & self._space.dcgm[group], self.report.sentinels)
            lo, hi = self._space.range[:, group]
            with np.errstate(invalid="ignore"):
                bad = (values < lo) | (values > hi) | np.isinf(values)
            self._drop(values, sids, bad, self.report.out_of_range)
        self._pending.append((np.asarray(sids, dtype=np.int32), np.asarray(timestamps, dtype=np.float64), values))
        self._pending_n += len(values)
        if self._pending_n >= self.FLUSH:
            self._flush()

    def mark(self) -> dict[int, int]:
        """Where the samples added from now on start, for ``divide_times``."""
        self._flush()
        return {g: len(pieces) for g, pieces in self._pieces.items()}

    def divide_times(self, since: dict[int, int], divisor: float) -> None:
        """Divide the timestamps of the samples added since ``since`` (a ``mark``) by ``divisor``: a file's
        timestamp unit is known only at its end (analyzer.data.ingest.openmetrics), its samples earlier."""
        self._flush()
        tables = {id(p.times): p.times for g, pieces in self._pieces.items() for p in pieces[since.get(g, 0):]}
        for times in tables.values():  # a flush's pieces share its table of times: divided once
            np.divide(times, divisor, out=times)

    def _drop(self, values: np.ndarray, sids: np.ndarray, mask: np.ndarray, counts: dict[str, int]) -> None:
        """Set ``values[mask]`` to NaN and count them per metric name in ``counts``."""
        if not mask.any():
            return
        values[mask] = np.nan
        hit, n = np.unique(sids[mask], return_counts=True)
        for sid, count in zip(hit.tolist(), n.tolist(), strict=True):
            name = self.metric_of(sid)
            counts[name] = counts.get(name, 0) + count

    def _flush(self) -> None:
        """Split the buffered samples by metric into compact pieces."""
        if not self._pending:
            return
        sid, ts, val = (np.concatenate(c) for c in zip(*self._pending, strict=True))
        self._pending, self._pending_n = [], 0
        self._note_first(sid)
        g = self._space.group.array[sid]
        times, at = encode_times(ts, 1 << 16)
        del ts
        if (g == g[0]).all():
            self._pieces.setdefault(int(g[0]), []).append(_Piece(*_runs(sid), times, at, narrow(val)))
            return
        order = np.argsort(g, kind="stable")
        g, sid, val = g[order], sid[order], val[order]
        at, times = (at[order], times) if at is not None else (None, times[order])
        starts = np.flatnonzero(np.concatenate(([True], g[1:] != g[:-1])))
        for a, b in zip(starts.tolist(), [*starts[1:].tolist(), len(g)], strict=True):
            piece = _Piece(*_runs(sid[a:b]), times, at[a:b], narrow(val[a:b]).copy()) if at is not None else \
                _Piece(*_runs(sid[a:b]), times[a:b], None, narrow(val[a:b]).copy())
            self._pieces.setdefault(int(g[a]), []).append(piece)

    def _note_first(self, sid: np.ndarray) -> None:
        first = self._space.first.array
        new = np.flatnonzero(first[sid] < 0)
        if len(new):
            u, i = np.unique(sid[new], return_index=True)
            first[u] = self._arrived + new[i]
        self._arrived += len(sid)

    def samples(self) -> Samples:
        """Everything added so far as Samples (and counted in the report); the builder starts empty again."""
        self._flush()
        space = self._space
        first = space.first.array
        used = np.flatnonzero(first >= 0)
        # The used series in the order this read first named them: the numbering a read of its own gives them,
        # which the table's label order and the conflict example follow (a kept numbering is older reads').
        named = np.concatenate([np.zeros(0, np.int64), *(np.asarray(x, np.int64) for x in self._named)])
        _, at = np.unique(named, return_index=True)
        named = named[np.sort(at)]
        named = named[first[named] >= 0]
        rank_of = np.full(space.group.n, -1, dtype=np.int64)
        rank_of[named] = np.arange(len(named))
        by_arrival = used[np.argsort(first[used], kind="stable")]
        group = space.group.array[by_arrival] if len(used) else np.zeros(0, dtype=np.int32)
        _, at = np.unique(group, return_index=True)
        group_order = group[np.sort(at)]
        rank = np.zeros(len(space.groups), dtype=np.int64)
        rank[group_order] = np.arange(len(group_order))
        canonical = by_arrival[np.argsort(rank[group], kind="stable")]
        sizes = np.bincount(rank[group], minlength=len(group_order))
        local_of = np.full(space.group.n, -1, dtype=np.int32)
        copies = np.zeros(space.group.n, dtype=np.int64)  # per series, how many HA replicas it came from
        copies[np.fromiter(self._replicas_of, np.int64, len(self._replicas_of))] = np.fromiter(
            map(len, self._replicas_of.values()), np.int64, len(self._replicas_of))
        self._replicas_of = {}
        blocks, start, example = [], 0, None
        for g, size in zip(group_order.tolist(), sizes.tolist(), strict=True):
            ids = canonical[start:start + size]
            metric = space.names[g]
            local_of[ids] = np.arange(size, dtype=np.int32)
            sid, ts, val = _drain(self._pieces.pop(g))
            local, ts, val = sort_by_series(local_of[sid], ts, val)
            del sid
            keep, found = self._dedupe(metric, rank_of[ids], local, ts, val)
            thin = _interleaved(local, ts, copies[ids], keep)
            if thin is not None:
                self.report.replica_samples += int(np.count_nonzero(~thin if keep is None else keep & ~thin))
                keep = thin if keep is None else keep & thin
            if keep is not None:
                local, ts, val = local[keep], ts[keep], val[keep]
            if found is not None and (example is None or found[0] < example[0]):
                example = found
            blocks.append(Block.make(metric, start, size, local, ts, val))
            del local, ts, val
            _return_freed_memory()  # the pieces just joined were freed in scattered holes
            start += size
        if example is not None and not self.report.conflict_example:
            _key, r, t, lo, hi = example
            sid = int(named[r])
            labels = ",".join(f'{k}="{v}"' for k, v in list(space.labelsets)[space.lsid.array[sid]])
            self.report.conflict_example = f"{self.metric_of(sid)}{{{labels}}} at {t:.3f}: {lo:g} vs {hi:g}"
        self.report.samples += sum(len(b) for b in blocks)
        self.report.series += len(used)
        self.labelsets.used += len(used)
        table, memo = self._series_table(named, canonical, tuple(space.names[g] for g in group_order.tolist()))
        space.first.array[:] = -1
        self._named = []
        self._arrived = 0
        return Samples(table, tuple(blocks), memo)

    def export(self) -> BuilderPart:
        """Everything added so far, as another process's builder can ``absorb`` it (a worker's part of a file:
        analyzer.data.ingest.split)."""
        self._flush()
        space = self._space
        sets = list(space.labelsets)
        return BuilderPart([space.names[g] for g in space.group.array.tolist()],
                           [sets[i] for i in space.lsid.array.tolist()], space.first.array.copy(), self._arrived,
                           self._replicas_of, {space.names[g]: pieces for g, pieces in self._pieces.items()})

    def absorb(self, part: BuilderPart, pieces: Iterable[tuple[str, list[_Piece]]]) -> np.ndarray:
        """Add what another builder exported (``part``; its pieces per metric as ``pieces`` yields them, so a
        worker's part need not be held twice) as if its samples came here after all so far; returns its series'
        ids here. The Samples are then exactly those of one builder given everything in that order."""
        self._flush()
        canon = self.labelsets.get
        remap = np.zeros(len(part.metrics), dtype=np.int32)
        at = 0
        for metric, run in groupby(zip(part.metrics, part.pairs, strict=True), key=itemgetter(0)):
            sids = self.series_ids(metric, [canon(pairs) for _, pairs in run])
            remap[at:at + len(sids)] = sids
            at += len(sids)
        for sid, sets in part.replicas_of.items():
            self._replicas_of.setdefault(int(remap[sid]), set()).update(sets)
        first = self._space.first.array
        came = np.flatnonzero(part.first >= 0)
        new = came[first[remap[came]] < 0]
        first[remap[new]] = self._arrived + part.first[new]
        self._arrived += part.arrived
        for metric, group in pieces:
            self._pieces.setdefault(self._group_of(metric), []).extend(p._replace(sid=remap[p.sid]) for p in group)
        return remap

    def build(self) -> pd.DataFrame:
        """The long frame: metric, timestamp, value, then one categorical column per label (Samples.frame)."""
        return self.samples().frame()

    def _series_table(self, named: np.ndarray, canonical: np.ndarray,
                      metrics: tuple[str, ...]) -> tuple[pd.DataFrame, dict[Any, Any] | None]:
        """One row per series in canonical order: metric, then the labels in the order the series (``named``:
        in the order this read first named them) first name them; a label called like a frame column is renamed
        ``exported_<name>``. Remembering, the last table of these ``metrics`` when it has the same series, and
        the memo kept with it (Samples.memo); else None."""
        space = self._space
        last = space.tables.get(metrics)
        if last is not None and np.array_equal(last[0], named) and np.array_equal(last[1], canonical):
            self.report.warnings.extend(last[3])
            return last[2], last[4]
        warnings: list[str] = []
        sets = space.fill()
        lsid = space.lsid.array
        in_order = lsid[named]
        _, at = np.unique(in_order, return_index=True)
        in_order = in_order[np.sort(at)]  # label sets in the order the series first name them
        first_at: dict[str, tuple[int, int]] = {}
        for name, col in space.columns.items():
            has = ~pd.isna(col.array[in_order])
            if has.any():
                i = int(has.argmax())
                first_at[name] = (i, [k for k, _v in sets[in_order[i]]].index(name))
        metric_of_group = np.empty(len(space.names), dtype=object)
        metric_of_group[:] = space.names
        columns: dict[str, np.ndarray] = {"metric": metric_of_group[space.group.array[canonical]]}
        of_series = lsid[canonical]
        for name in sorted(first_at, key=first_at.__getitem__):
            column = name
            if column in FRAME_COLUMNS:
                column = "exported_" + name
                warnings.append(f"label {name!r} collides with a frame column; renamed to {column!r}")
            columns[column] = space.columns[name].array[of_series]
        self.report.warnings.extend(warnings)
        table = pd.DataFrame({k: pd.Series(v, dtype=object) for k, v in columns.items()})
        if not self.labelsets.remember:
            return table, None
        memo: dict[Any, Any] = {}
        space.tables[metrics] = (named, canonical, table, warnings, memo)
        return table, memo

    def _dedupe(self, metric: str, ids: np.ndarray, local: np.ndarray, ts: np.ndarray,
                val: np.ndarray) -> tuple[np.ndarray | None, tuple | None]:
        """Samples of one metric (sorted by series, time) to keep: a (series, millisecond, value) given more
        than once (a target scraped twice, an HA pair, a file read twice) is kept once and counted in
        ``report.duplicates``; repeats with different values are conflicts: kept (averaged downstream) and
        counted in ``report.conflicts``. Returns (keep mask or None: keep all, the first conflict as
        (key, series id, time, low, high) or None)."""
        if not _repeats(local, ts):
            return None, None
        ms = np.rint(ts * 1000.0).astype(np.int64)
        start = np.concatenate(([True], (local[1:] != local[:-1]) | (ms[1:] != ms[:-1])))
        run = np.cumsum(start) - 1
        idx = np.flatnonzero(np.bincount(run)[run] > 1)
        r, v = run[idx], val[idx].astype(np.float64)
        same = pd.DataFrame({"r": r, "v": v}).duplicated(keep="first").to_numpy() & ~np.isnan(v)
        keep = np.ones(len(local), dtype=bool)
        keep[idx[same]] = False
        if same.any():
            self.report.duplicates[metric] = self.report.duplicates.get(metric, 0) + int(same.sum())
        c = idx[~same]  # conflicts can only be among the repeats still kept
        spread = pd.DataFrame({"r": run[c], "v": val[c].astype(np.float64)}).groupby("r")["v"].agg(["min", "max"])
        # NaN copies (a sentinel through an HA pair) are unknown, not a value to conflict with.
        bad = spread[spread["min"].notna() & (spread["min"] != spread["max"])]
        if bad.empty:
            return keep, None
        self.report.conflicts[metric] = self.report.conflicts.get(metric, 0) + len(bad)
        first_of_run = c[np.searchsorted(run[c], bad.index.to_numpy())]
        sids = ids[local[first_of_run]].astype(np.int64)  # the read's own numbering (rank in ``samples``)
        keys = sids * (1 << 42) + ms[first_of_run] % (1 << 42)
        k = int(np.argmin(keys))
        return keep, (int(keys[k]), int(sids[k]), float(ts[first_of_run[k]]), float(bad["min"].iloc[k]),
                      float(bad["max"].iloc[k]))


class BuilderPart(NamedTuple):
    """A builder's samples as ``FrameBuilder.export`` hands them to another process: per series (its numbering)
    the metric and label pairs, when its first sample arrived (-1: none) and its HA replicas' label sets; how many
    samples arrived; the pieces per metric (sent apart: ``absorb`` takes them one metric at a time)."""

    metrics: list[str]
    pairs: list[tuple[tuple[str, str], ...]]
    first: np.ndarray
    arrived: int
    replicas_of: dict[int, set[tuple[tuple[str, str], ...]]]
    pieces: dict[str, list[_Piece]]


class _Piece(NamedTuple):
    """Samples of one group from one flush: series ids (one per run of ``runs`` samples where not None),
    times (``times[at]``, or ``times`` where ``at`` is None), values."""

    sid: np.ndarray
    runs: np.ndarray | None
    times: np.ndarray
    at: np.ndarray | None
    val: np.ndarray


def _runs(sid: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
    """(series id per run, run lengths) where the samples come in runs of one series (Prometheus answers and most
    files do: a read then holds a few bytes per series, not four per sample); else (``sid``, None)."""
    starts = np.flatnonzero(np.concatenate(([True], sid[1:] != sid[:-1]))) if len(sid) else np.zeros(0, np.int64)
    if 4 * len(starts) > len(sid):
        return sid, None
    return sid[starts], np.diff(np.append(starts, len(sid))).astype(np.int32)


def _drain(pieces: list[_Piece]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Series ids, float64 times and values of the pieces, joined; each piece is released once copied
    (the peak is one block, not two)."""
    n = sum(len(p.val) for p in pieces)
    sid = np.empty(n, dtype=np.int32)
    ts = np.empty(n, dtype=np.float64)
    val = np.empty(n, dtype=np.result_type(*(p.val for p in pieces)))
    pos = 0
    pieces.reverse()
    while pieces:
        p = pieces.pop()
        end = pos + len(p.val)
        sid[pos:end] = p.sid if p.runs is None else np.repeat(p.sid, p.runs)
        ts[pos:end] = p.times[p.at] if p.at is not None else p.times
        val[pos:end] = p.val
        pos = end
    return sid, ts, val


def _glibc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:  # not glibc
        return None


_LIBC = _glibc()
_TRIM: Callable[[int], int] | None = _LIBC.malloc_trim if _LIBC is not None else None
#: glibc's M_ARENA_MAX. The Prometheus client decodes answers on several threads; each thread got a malloc arena
#: of its own, and what one freed the others could not reuse: the peak of analyze from Prometheus at 1,000 GPUs
#: was 760-805 MB with 4 threads, 485 MB with one; one arena for all gives 522 MB with 4 (the threads share it
#: under the GIL anyway). Set once, before the first thread starts.
_M_ARENA_MAX = -8
if _LIBC is not None:
    _LIBC.mallopt(_M_ARENA_MAX, 1)


def _return_freed_memory() -> None:
    """Hand free heap pages back to the OS. A block is one array made from many small pieces: glibc can
    reuse neither the pieces' holes for it nor give them back by itself, so without this the resident
    memory after building is the pieces plus the blocks, twice the samples."""
    if _TRIM is not None:
        _TRIM(0)


def _interleaved(local: np.ndarray, ts: np.ndarray, copies: np.ndarray, keep: np.ndarray | None) -> np.ndarray | None:
    """Keep mask of one metric's samples (sorted by series, time; ``keep``: those still kept) where series merged
    from ``copies[local]`` >= 2 HA replicas hold each replica's own scrapes: one sample per scrape interval, or
    None (nothing to drop).

    Two Prometheus replicas scrape a target independently, each at its own offset in the interval: merged, a
    series held samples 7 s and 53 s apart, its spacing read as 7 s and 3/4 of the GPU-hours as unknown.
    Copies at the same instants (a third of a series' samples or more sharing a millisecond with their
    neighbour: two aligned replicas give a half; one target scraped twice now and then, far fewer) are
    ``_dedupe``'s; interleaved ones alternate a short and a long gap, the short one below ``INTERLEAVED`` of the
    long one (the median pair, of ``MIN_PAIRS`` at least). Such a series' interval is the median time ``k``
    samples span (``k`` replicas); each sample counts whole intervals from the series' first, rounded, and the
    one nearest the interval's nominal time counts: the first sample's replica, the other filling its gaps
    (Thanos' deduplication sticks to one replica too). Replicas half an interval apart look like one target
    scraped twice as often and are left so: their rows are all observed."""
    idx = np.flatnonzero(copies[local] >= 2)
    if len(idx) < 3:
        return None
    s, t = local[idx], ts[idx]
    ms = np.rint(t * 1000.0)
    same = s[1:] == s[:-1]
    # Copies at the same instants (Prometheus' answers, files of replicas aligned to the interval) are _dedupe's.
    aligned = np.bincount(s[1:][same & (ms[1:] == ms[:-1])], minlength=len(copies)) * 3 >= \
        np.bincount(s, minlength=len(copies))
    on = ~aligned[s] if keep is None else ~aligned[s] & keep[idx]
    s, t, idx = s[on], t[on], idx[on]
    gap = np.diff(t)
    same = s[1:] == s[:-1]
    pair = same[1:] & same[:-1]
    lo = np.minimum(gap[1:], gap[:-1])[pair]
    hi = np.maximum(gap[1:], gap[:-1])[pair]
    by = pd.DataFrame({"s": s[2:][pair], "lo": lo, "hi": hi}).groupby("s")
    med = by.median()[by.size() >= MIN_PAIRS]  # a few samples (a tick's new steps) tell nothing
    if med.empty:
        return None
    interval = pd.Series(np.nan, index=med.index)
    for n in np.unique(copies[med.index.to_numpy()]).tolist():  # the time n samples span, n replicas
        ok = (s[n:] == s[:-n]) & (copies[s[n:]] == n)
        interval.update(pd.Series(t[n:] - t[:-n])[ok].groupby(s[n:][ok]).median())
    interval = interval.to_numpy()
    with np.errstate(invalid="ignore", divide="ignore"):
        pick = (med["lo"].to_numpy() < INTERLEAVED * med["hi"].to_numpy()) & (interval > 0)
    if not pick.any():
        return None
    width = pd.Series(interval[pick], index=med.index[pick])
    inside = np.isin(s, width.index.to_numpy())
    s, t, idx = s[inside], t[inside], idx[inside]
    out = np.ones(len(local), dtype=bool)
    out[idx] = one_per_interval(s, t, width.reindex(s).to_numpy())
    return out if not out.all() else None


def one_per_interval(s: np.ndarray, t: np.ndarray, width: np.ndarray) -> np.ndarray:
    """Keep mask of samples (sorted by series ``s``, time ``t``) of copies scraped at their own times: per series,
    the one sample nearest each interval's nominal time (whole ``width``s from the series' first sample, rounded).
    That is the first sample's copy whenever it has one there, the other only in its gaps: keeping the first
    in each interval instead put a copy scraping over half an interval later an interval late (a node a row
    behind its peers). A NaN width keeps every sample of its series."""
    first = np.concatenate(([True], s[1:] != s[:-1]))
    origin = t[np.flatnonzero(first)][np.cumsum(first) - 1]
    steps = (t - origin) / width
    slot = np.floor(steps + 0.5)
    order = np.lexsort((np.abs(steps - slot), slot, s))
    s_o, slot_o = s[order], slot[order]
    new = np.concatenate(([True], (s_o[1:] != s_o[:-1]) | (slot_o[1:] != slot_o[:-1])))
    keep = np.ones(len(s), dtype=bool)
    keep[order[~new]] = False
    return keep | np.isnan(width)


def _repeats(local: np.ndarray, ts: np.ndarray) -> bool:
    """Whether two neighbours (sorted by series, time) share a series and a millisecond."""
    for a in range(0, max(len(local) - 1, 0), 1 << 20):
        b = min(a + (1 << 20) + 1, len(local))
        ms = np.rint(ts[a:b] * 1000.0)
        if ((local[a + 1:b] == local[a:b - 1]) & (ms[1:] == ms[:-1])).any():
            return True
    return False
