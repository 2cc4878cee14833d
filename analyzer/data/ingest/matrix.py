"""Decode a ``query_range`` answer (a JSON matrix) straight into numpy arrays.

An answer is almost all points, ``[1700000000,"0.5"]`` pairs, which a general JSON decoder
turns into a list, a number and a string each before numpy sees them (~1 µs a point, the
biggest single cost of reading Prometheus). Prometheus, Thanos, Mimir and VictoriaMetrics
all write the matrix compactly, so the points of every series are cut out of the bytes and
parsed in one pass by pandas' C reader (correctly rounded float64, ~0.2 µs a point), and
orjson decodes what is left: labels, status, warnings. An answer that does not look exactly
like that (whitespace, a malformed pair) is decoded the general way, which also words the
errors; both ways give the same arrays.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np
import orjson
import pandas as pd

#: The key that opens a series' points in a compact answer. It cannot occur inside a JSON
#: string (a quote there is escaped), so every match opens one series' points.
_VALUES = re.compile(rb'"values":\[')
_METRIC = b'{"metric":'


@dataclass
class Matrix:
    """The series of one answer: labels per series, their points back to back."""

    #: Per series, its labels: decoded, or (the fast way) the answer's JSON object of them, decoded when
    #: asked (``labels``) or looked up as it is (analyzer.data.ingest._common.LabelSets: a series read again
    #: has the same bytes, and decoding ~600 k label objects was most of the decoding).
    raw_labels: list[dict[str, str]] | list[bytes]
    #: Points per series (series i owns the slice after the sum of counts[:i]).
    counts: np.ndarray
    timestamps: np.ndarray
    values: np.ndarray
    #: Series holding native histograms (not read).
    histograms: int = 0

    @cached_property
    def labels(self) -> list[dict[str, str]]:
        return [labels_of(k, f"data.result[{i}]") if isinstance(k, bytes) else k
                for i, k in enumerate(self.raw_labels)]  # fmt: skip

    def series(self) -> Iterator[tuple[dict[str, str], np.ndarray, np.ndarray]]:
        """(labels, timestamps, values) of each series, in order (views, not copies)."""
        ends = np.cumsum(self.counts).tolist()
        for labels, n, end in zip(self.labels, self.counts.tolist(), ends, strict=True):
            yield labels, self.timestamps[end - n:end], self.values[end - n:end]


@dataclass(frozen=True)
class Cut:
    """A compact answer split: the JSON with every series replaced by 0, the points' spans and the series'
    label objects (JSON bytes)."""

    skeleton: bytes
    spans: list[tuple[int, int]]
    metrics: list[bytes]


def labels_of(raw: bytes, where: str) -> dict[str, str]:
    """The labels in one series' JSON object; ValueError naming ``where`` when it is not names to strings."""
    try:
        labels = orjson.loads(raw)
    except orjson.JSONDecodeError:
        labels = None
    return _checked(labels, where, f" ({raw[:200]!r})")


def _checked(labels: Any, where: str, shown: str = "") -> dict[str, str]:
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise ValueError(f"malformed answer: {where}: 'metric' must map label names to strings{shown}")
    return labels


def as_list(value: Any, what: str) -> list:
    """``value`` when it is a list (None is an empty one); ValueError naming ``what`` otherwise."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise ValueError(f"malformed answer: {what} is a {type(value).__name__}, not a list")
    return value


def cut(content: bytes) -> Cut | None:
    """Split a compact answer (every series exactly ``{"metric":{...},"values":[...]}``) into skeleton, point
    spans and label objects; None when it is not one (the general way then reads it)."""
    spans, metrics, parts, pos = [], [], [], 0
    for match in _VALUES.finditer(content):
        at, start = match.start(), match.end()
        # a quote inside a JSON string is escaped, so neither key can be found inside a label value
        opened = content.rfind(_METRIC, pos, at)
        if opened < 0 or content[opened - 1:opened] not in (b"[", b",") or content[at - 2:at] != b"},":
            return None
        if content[start:start + 1] == b"]":
            end = start
        else:
            end = content.find(b"]]", start)
            if end < 0:
                return None
            end += 1
        if content[end + 1:end + 2] != b"}":
            return None
        labels = content[opened + len(_METRIC):at - 1]
        if b'},"' in labels:  # another key between the labels and the points (or a value ending so): the general way
            return None
        parts += (content[pos:opened], b"0")
        spans.append((start, end))
        metrics.append(labels)
        pos = end + 2
    if not spans:
        return None
    parts.append(content[pos:])
    return Cut(b"".join(parts), spans, metrics)


def decode(content: bytes, cut_: Cut | None, body: Any) -> Matrix:
    """The matrix of an answer whose JSON (``cut_.skeleton`` when cut, else ``content``) decoded to
    ``body``, a successful ``query_range`` answer; ValueError("malformed answer: ...") otherwise."""
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
        raise ValueError(f"expected a matrix from query_range, got {got!r}")
    result = as_list(data.get("result"), "data.result")
    if cut_ is not None:
        fast = _fast(content, cut_, result)
        if fast is not None:
            return fast
        try:
            whole = orjson.loads(content)
        except orjson.JSONDecodeError as exc:
            raise ValueError(f"malformed answer: invalid JSON ({exc})") from None
        return decode(content, None, whole)
    return _general(result)


def _labels(item: Any, i: int) -> dict[str, str]:
    if not isinstance(item, dict):
        raise ValueError(f"malformed answer: data.result[{i}] is a {type(item).__name__}, not an object")
    return _checked(item.get("metric") or {}, f"data.result[{i}]")


def _fast(content: bytes, cut_: Cut, result: list) -> Matrix | None:
    """The points parsed in one pass, or None when the answer is not exactly the compact form."""
    if len(result) != len(cut_.spans) or result.count(0) != len(result):
        return None
    counts = np.fromiter((content.count(b"[", s, e) for s, e in cut_.spans), np.int64, len(cut_.spans))
    total = int(counts.sum())
    # ",t,"v"],t,"v"]...": one line per point ending at its "]", each exactly two commas (checked
    # below with the count: no line can have fewer without another having more, which fails to parse).
    view = memoryview(content)  # slices without copies
    text = b",".join([b"", *(view[s:e] for s, e in cut_.spans if e > s)]).translate(None, b"[")
    if text.count(b",") != 2 * total:
        return None
    if not total:
        return Matrix(cut_.metrics, counts, np.zeros(0), np.zeros(0))
    try:
        frame = pd.read_csv(io.BytesIO(text), header=None, names=["_", "t", "v"], usecols=["t", "v"], index_col=False,
                            lineterminator="]", dtype=np.float64, keep_default_na=False, na_values=["NaN"],
                            engine="c")  # fmt: skip
    except ValueError:  # a pair that is not [number, "number"]: the general way says which
        return None
    ts, vs = frame["t"].to_numpy(), frame["v"].to_numpy()
    if len(ts) != total or not np.isfinite(ts).all():
        return None
    return Matrix(cut_.metrics, counts, ts, vs)


def _general(result: list) -> Matrix:
    """Series by series from decoded JSON, with an error naming the series at fault."""
    labels, ts_parts, vs_parts, histograms = [], [], [], 0
    for i, item in enumerate(result):
        labels.append(_labels(item, i))
        values = as_list(item.get("values"), f"data.result[{i}].values")
        try:
            ts = np.array([p[0] for p in values], dtype=np.float64)
            vs = np.array([float(p[1]) for p in values], dtype=np.float64)  # values are sent as strings
            if any(len(p) != 2 for p in values) or not np.isfinite(ts).all():
                raise ValueError("not [timestamp, value] pairs")
        except (TypeError, ValueError, IndexError, KeyError) as exc:
            raise ValueError(f"malformed answer: data.result[{i}]: values must be [timestamp, \"value\"] pairs "
                             f"({exc})") from None
        ts_parts.append(ts)
        vs_parts.append(vs)
        histograms += bool(item.get("histograms"))
    counts = np.array([len(t) for t in ts_parts], dtype=np.int64)
    if not ts_parts:
        return Matrix(labels, counts, np.zeros(0), np.zeros(0), histograms)
    return Matrix(labels, counts, np.concatenate(ts_parts), np.concatenate(vs_parts), histograms)
