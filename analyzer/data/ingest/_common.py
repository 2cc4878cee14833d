"""What both readers share: the report, the metric filter and the long-frame builder.

The builder keeps one row per distinct series (metric + labels) and, per sample, only
the series id, timestamp and value as numpy arrays; label columns are materialised once
at the end as categoricals (codes indexed by series id), so memory stays ~17 bytes per
sample plus a few bytes per label column whatever the number of labels.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from exporter import schema

#: Fixed columns of the long frame; label columns follow.
FRAME_COLUMNS: tuple[str, ...] = ("metric", "timestamp", "value")
#: Labels that tell the members of a highly-available Prometheus pair apart (Prometheus Operator's
#: ``prometheus_replica``, the Thanos/Cortex/Mimir conventions ``replica`` and ``__replica__``, Thanos
#: Ruler's ``rule_replica``): both members scrape the same targets, so the series of one target from
#: two replicas are one series. The reader drops these labels, so the copies fall into one series and
#: their repeated samples are deduplicated (never twice the GPU-hours).
REPLICA_LABELS: frozenset[str] = frozenset({"replica", "prometheus_replica", "__replica__", "rule_replica"})


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
    #: metric name -> (series, time) pairs given more than once with different values (averaged).
    conflicts: dict[str, int] = field(default_factory=dict)
    #: The first conflict, as "metric{labels} at T: v1 vs v2", for the note.
    conflict_example: str = ""
    #: metric name -> samples repeated exactly (one series, one time, one value): all but one dropped.
    duplicates: dict[str, int] = field(default_factory=dict)
    #: HA replica label -> the replica values merged (REPLICA_LABELS).
    replicas: dict[str, set[str]] = field(default_factory=dict)
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
    max_examples: int = 20

    def add_bad(self, source: str, line_number: int, reason: str, text: str | bytes) -> None:
        """Count a bad line; keep the first ``max_examples`` as examples."""
        self.bad_line_count += 1
        if len(self.bad_lines) < self.max_examples:
            if isinstance(text, bytes):
                text = text.decode("utf-8", "backslashreplace")
            self.bad_lines.append(BadLine(source, line_number, reason, text[:200]))

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
        if self.conflicts:
            parts.append(f"{sum(self.conflicts.values())} conflicting duplicate samples")
        if self.duplicates:
            parts.append(f"{sum(self.duplicates.values())} repeated samples dropped")
        if self.replicas:
            merged = ", ".join(f"{k} ({len(v)})" for k, v in sorted(self.replicas.items()))
            parts.append(f"HA replicas merged: {merged}")
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


class FrameBuilder:
    """Accumulates samples by series id and builds the long frame once at the end."""

    def __init__(self, report: IngestReport, sentinels: bool = True) -> None:
        """``sentinels=False`` reads raw: no DCGM sentinel and no valid-range check."""
        self.report = report
        self.sentinels = sentinels
        self._ids: dict[tuple[str, tuple[tuple[str, str], ...]], int] = {}
        self._metric: list[str] = []
        self._labels: list[tuple[tuple[str, str], ...]] = []
        self._dcgm: list[bool] = []
        self._dcgm_arr = np.zeros(0, dtype=bool)
        #: Per series: the valid range of its values (the contract's; any finite value for others).
        self._lo: list[float] = []
        self._hi: list[float] = []
        self._range_arr = np.zeros((2, 0))
        self._sids: list[np.ndarray] = []
        self._ts: list[np.ndarray] = []
        self._vals: list[np.ndarray] = []

    def series_id(self, metric: str, labels: Iterable[tuple[str, str]]) -> int:
        """Id of the series ``metric{labels}`` (label order and empty values don't matter; the HA
        replica labels of REPLICA_LABELS are dropped, so the replicas' copies are one series)."""
        labels = tuple(labels)
        if any(k in REPLICA_LABELS for k, _ in labels):
            for k, v in labels:
                if k in REPLICA_LABELS and v != "":
                    self.report.replicas.setdefault(k, set()).add(v)
            labels = tuple((k, v) for k, v in labels if k not in REPLICA_LABELS)
        key = (metric, tuple(sorted((k, v) for k, v in labels if v != "")))
        sid = self._ids.get(key)
        if sid is None:
            sid = self._ids[key] = len(self._metric)
            self._metric.append(metric)
            self._labels.append(tuple((k, v) for k, v in labels if v != ""))
            self._dcgm.append(is_dcgm_name(metric))
            lo, hi = schema.valid_range_of(metric) or (-np.inf, np.inf)
            self._lo.append(lo)
            self._hi.append(hi)
        return sid

    def metric_of(self, sid: int) -> str:
        return self._metric[sid]

    def add(self, sids: np.ndarray, timestamps: np.ndarray, values: np.ndarray) -> None:
        """Append samples (arrays of equal length). DCGM sentinels, then values outside the
        contract's valid range (+-Inf included), become NaN (unknown) and are counted."""
        if not len(sids):
            return
        values = np.array(values, dtype=np.float64)  # a copy: masked values are overwritten
        if self.sentinels:
            if len(self._dcgm_arr) != len(self._dcgm):
                self._dcgm_arr = np.array(self._dcgm, dtype=bool)
            self._drop(values, sids, sentinel_mask(values) & self._dcgm_arr[sids], self.report.sentinels)
            if self._range_arr.shape[1] != len(self._lo):
                self._range_arr = np.array([self._lo, self._hi], dtype=np.float64)
            lo, hi = self._range_arr[0][sids], self._range_arr[1][sids]
            with np.errstate(invalid="ignore"):
                bad = (values < lo) | (values > hi) | np.isinf(values)
            self._drop(values, sids, bad, self.report.out_of_range)
        self._append(sids, timestamps, values)

    def _append(self, sids: np.ndarray, timestamps: np.ndarray, values: np.ndarray) -> None:
        self._sids.append(np.asarray(sids, dtype=np.int64))
        self._ts.append(np.asarray(timestamps, dtype=np.float64))
        self._vals.append(values)

    def _drop(self, values: np.ndarray, sids: np.ndarray, mask: np.ndarray, counts: dict[str, int]) -> None:
        """Set ``values[mask]`` to NaN and count them per metric name in ``counts``."""
        if not mask.any():
            return
        values[mask] = np.nan
        self._count(sids[mask], counts)

    def _count(self, sids: np.ndarray, counts: dict[str, int]) -> None:
        """Add one per sample of ``sids`` to its metric name's count."""
        hit, n = np.unique(sids, return_counts=True)
        for sid, count in zip(hit.tolist(), n.tolist(), strict=True):
            name = self._metric[sid]
            counts[name] = counts.get(name, 0) + count

    def _dedupe(self, sids: np.ndarray, ts: np.ndarray, vals: np.ndarray) -> np.ndarray | None:
        """Samples to keep: a (series, time, value) given more than once (a target scraped twice, an HA
        pair, a file read twice) is kept once and counted in ``report.duplicates``; repeats with different
        values are conflicts (``_conflicts``: kept and averaged downstream, counted). None: keep all."""
        if len(sids) < 2:
            return None
        # One int64 key per (series, millisecond): hashing it is O(n); only the rare repeats are looked at.
        key = sids.astype(np.int64) * (1 << 42) + np.rint(ts * 1000.0).astype(np.int64) % (1 << 42)
        dup = pd.Series(key).duplicated(keep=False).to_numpy()
        if not dup.any():
            return None
        idx = np.flatnonzero(dup)
        same = pd.DataFrame({"k": key[idx], "v": vals[idx]}).duplicated(keep="first").to_numpy().copy()
        same &= ~np.isnan(vals[idx])  # unknown values (sentinels, out of range) stay as read: their raw values differed
        keep = np.ones(len(sids), bool)
        keep[idx[same]] = False
        self._count(sids[idx[same]], self.report.duplicates)
        c = idx[~same]  # conflicts can only be among the repeats still kept
        self._conflicts(sids[c], ts[c], vals[c], key[c])
        return keep

    def _conflicts(self, sids: np.ndarray, ts: np.ndarray, vals: np.ndarray, key: np.ndarray) -> None:
        """Count (series, time) pairs given more than once with different values: never silently merged."""
        dup = pd.Series(key).duplicated(keep=False).to_numpy()
        if not dup.any():
            return
        rep = pd.DataFrame({"k": key[dup], "s": sids[dup], "t": ts[dup], "v": vals[dup]})
        spread = rep.groupby("k").agg(s=("s", "first"), t=("t", "first"), lo=("v", "min"), hi=("v", "max"))
        # NaN copies (a sentinel through an HA pair) are unknown, not a value to conflict with.
        bad = spread[spread["lo"].notna() & (spread["lo"] != spread["hi"])]
        if bad.empty:
            return
        for sid, n in bad["s"].value_counts().items():
            name = self._metric[int(sid)]
            self.report.conflicts[name] = self.report.conflicts.get(name, 0) + int(n)
        if not self.report.conflict_example:
            first = bad.iloc[0]
            labels = ",".join(f'{k}="{v}"' for k, v in self._labels[int(first["s"])])
            self.report.conflict_example = (f"{self._metric[int(first['s'])]}{{{labels}}} at {first['t']:.3f}: "
                                            f"{first['lo']:g} vs {first['hi']:g}")

    def build(self) -> pd.DataFrame:
        """The long frame: metric, timestamp, value, then one categorical column per label."""
        sids = np.concatenate(self._sids) if self._sids else np.zeros(0, dtype=np.int64)
        ts = np.concatenate(self._ts) if self._ts else np.zeros(0)
        vals = np.concatenate(self._vals) if self._vals else np.zeros(0)
        self._sids, self._ts, self._vals = [], [], []
        keep = self._dedupe(sids, ts, vals)
        if keep is not None:
            sids, ts, vals = sids[keep], ts[keep], vals[keep]
        used = np.unique(sids)
        self.report.samples += len(sids)
        self.report.series += len(used)

        label_names: dict[str, None] = {}
        used_labels: list[dict[str, str]] = [{} for _ in self._labels]
        for sid in used.tolist():
            used_labels[sid] = dict(self._labels[sid])
            for k in used_labels[sid]:
                label_names.setdefault(k, None)
        metric_names: list[str | None] = [None] * len(self._metric)
        for sid in used.tolist():
            metric_names[sid] = self._metric[sid]
        columns: dict[str, object] = {
            "metric": _categorical(metric_names, sids),
            "timestamp": ts,
            "value": vals,
        }
        for name in label_names:
            per_series = [lab.get(name) for lab in used_labels]
            column = name
            if column in columns:
                column = "exported_" + name
                self.report.warnings.append(f"label {name!r} collides with a frame column; renamed to {column!r}")
            columns[column] = _categorical(per_series, sids)
        return pd.DataFrame(columns)


def _categorical(per_series: list[str | None], sids: np.ndarray) -> pd.Categorical:
    """Per-sample categorical from per-series values, without touching per-sample strings."""
    series_cat = pd.Categorical(per_series)
    codes = np.asarray(series_cat.codes)[sids] if len(per_series) else np.zeros(0, dtype=np.int8)
    return pd.Categorical.from_codes(codes, categories=series_cat.categories)
