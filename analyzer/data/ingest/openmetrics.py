"""Read OpenMetrics / Prometheus text files with timestamps into the long frame.

These are history files (what ``promtool tsdb create-blocks-from openmetrics`` backfills,
and what ``truegpu simulate`` writes): millions of lines in which the same few thousand
series keys repeat. The fast path therefore works on bytes, a chunk of lines at a time:
each line is split at its last two spaces into series key / value / timestamp, the key
is looked up in a dict of already-parsed keys, and values and timestamps are converted
to float64 in bulk with numpy. Anything the fast path does not recognise (comments, a
new key, label values with spaces and no timestamp, exemplars, odd whitespace, missing
timestamps, garbage) goes to a careful per-line parser, which either reads the sample or
reports a bad line with its line number. One bad line never stops the file.

Timestamp unit, decided per file (``timestamp_unit="auto"``):

- a file that ends with ``# EOF`` is OpenMetrics, whose timestamps are seconds;
- otherwise it is the Prometheus text format, whose timestamps are milliseconds, unless
  they are obviously seconds: if the largest absolute timestamp is below 1e11 the file
  is read as seconds (1e11 s is the year 5138; 1e11 ms is March 1973, so real data of
  either kind lands on the right side).

An OpenMetrics file whose timestamps look like milliseconds is still read as seconds
(the format says so) with a warning in the report; pass ``timestamp_unit="ms"`` or
``"s"`` to force a unit. Lines without a timestamp take ``default_timestamp`` (unix
seconds) or are bad lines when none is given.
"""

from __future__ import annotations

import gzip
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from itertools import compress
from pathlib import Path
from typing import BinaryIO, Literal

import numpy as np
import pandas as pd

from analyzer.data.ingest._common import FrameBuilder, IngestReport, MetricFilter

TimestampUnit = Literal["auto", "s", "ms"]

#: Above this an auto-detected Prometheus-text timestamp is milliseconds (see module doc).
MS_THRESHOLD = 1e11
#: The latest timestamp any unit can mean (9999-12-31 in milliseconds): later ones are bad lines.
MAX_TIMESTAMP = 253_402_300_799_999.0
DEFAULT_CHUNK_BYTES = 1 << 22

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,?)[ \t]*', re.S)
_ESCAPE_RE = re.compile(r"\\(.)", re.S)
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
_INVALID = -4  # not a valid series key
_MISS = -3  # key not (yet) in the cache
_SKIP = -2  # line carries no sample we keep (comment, blank, bad)
_FILTERED = -1  # a sample of a metric the filter did not select


class ParseError(ValueError):
    """A line that is not a valid sample; the message says what is wrong."""


def unescape_label_value(value: str) -> str:
    """OpenMetrics label-value unescaping (``\\\\``, ``\\"``, ``\\n``); other escapes stay as written."""
    if "\\" not in value:
        return value
    return _ESCAPE_RE.sub(lambda m: _ESCAPES.get(m.group(1), m.group(0)), value)


def parse_series(text: str, pos: int = 0) -> tuple[str, list[tuple[str, str]], int]:
    """Parse ``name{label="value",...}`` at ``pos``; return name, labels and the end position."""
    m = _NAME_RE.match(text, pos)
    if m is None:
        raise ParseError("no metric name")
    name, pos = m.group(0), m.end()
    labels: list[tuple[str, str]] = []
    if pos < len(text) and text[pos] == "{":
        pos += 1
        seen: set[str] = set()
        while True:
            while pos < len(text) and text[pos] in " \t":
                pos += 1
            if pos < len(text) and text[pos] == "}":
                pos += 1
                break
            lm = _LABEL_RE.match(text, pos)
            if lm is None:
                raise ParseError(f"bad label set at column {pos + 1}")
            label = lm.group(1)
            if label in seen:
                raise ParseError(f"duplicate label {label!r}")
            seen.add(label)
            labels.append((label, unescape_label_value(lm.group(2))))
            pos = lm.end()
            if not lm.group(3):
                if pos < len(text) and text[pos] == "}":
                    pos += 1
                    break
                raise ParseError(f"expected ',' or '}}' at column {pos + 1}")
    return name, labels, pos


def _parse_float(token: str, what: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParseError(f"bad {what} {token[:40]!r}") from None


def parse_sample_line(text: str) -> tuple[str, list[tuple[str, str]], float, float | None, bool]:
    """Careful parse of one sample line: name, labels, value, timestamp (None if absent), exemplar seen."""
    name, labels, pos = parse_series(text)
    rest = text[pos:]
    if rest and rest[0] not in " \t":
        raise ParseError(f"unexpected {rest[:20]!r} after the series")
    tokens = rest.split(None, 2)
    if not tokens:
        raise ParseError("no value")
    value = _parse_float(tokens[0], "value")
    timestamp: float | None = None
    exemplar = False
    if len(tokens) > 1:
        if tokens[1].startswith("#"):
            exemplar = True
        else:
            timestamp = _parse_float(tokens[1], "timestamp")
            if not 0.0 <= timestamp <= MAX_TIMESTAMP:
                raise ParseError(f"timestamp {tokens[1][:40]!r} is not a time between 1970 and 9999")
            if len(tokens) > 2:
                if not tokens[2].startswith("#"):
                    raise ParseError(f"unexpected {tokens[2][:20]!r} after the timestamp")
                exemplar = True
    return name, labels, value, timestamp, exemplar


def _open_binary(path: Path) -> BinaryIO:
    """Open for reading, decompressing gzip recognised by its magic bytes (not its name)."""
    raw = open(path, "rb")  # noqa: SIM115 - returned to the caller, closed there
    magic = raw.read(2)
    raw.seek(0)
    if magic == b"\x1f\x8b":
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _read_blocks(f: BinaryIO, chunk_bytes: int) -> Iterator[bytes]:
    """Yield blocks of complete lines (without the last newline) of roughly ``chunk_bytes`` each."""
    carry = b""
    while True:
        data = f.read(chunk_bytes)
        if not data:
            break
        cut = data.rfind(b"\n")
        if cut < 0:
            carry += data
            continue
        block = carry + data[:cut] if carry else data[:cut]
        carry = data[cut + 1 :]
        yield block
    if carry:
        yield carry


class _KeyCache(dict[bytes, int]):
    """Series-key bytes -> series id (or _FILTERED); a miss parses the key (C-speed hits).

    A key that does not parse is answered _INVALID and not remembered: its lines go to the
    line-by-line parser, which reports them.
    """

    def __init__(self, key_id: Callable[[str, list[tuple[str, str]]], int]) -> None:
        super().__init__()
        self._key_id = key_id

    def __missing__(self, key: bytes) -> int:
        try:
            text = key.decode("utf-8")
            name, labels, end = parse_series(text)
        except (ParseError, UnicodeDecodeError):
            return _INVALID
        if end != len(text):
            return _INVALID
        sid = self[key] = self._key_id(name, labels)
        return sid


class _TimestampCache(dict[bytes, float]):
    """token -> finite float; a miss parses (C-speed hits through ``__getitem__``)."""

    def __missing__(self, token: bytes) -> float:
        t = float(token)
        if not 0.0 <= t <= MAX_TIMESTAMP:
            raise ValueError(f"timestamp {token!r} is not a time between 1970 and 9999")
        self[token] = t
        return t


class _FileState:
    """Per-file parse state: the format evidence and the file's samples before unit scaling."""

    def __init__(self, source: str) -> None:
        self.source = source
        self.eof_line = 0
        self.sids: list[np.ndarray] = []
        self.ts: list[np.ndarray] = []
        self.vals: list[np.ndarray] = []
        self.defaulted: list[np.ndarray] = []


class OpenMetricsReader:
    """Streaming reader; one instance may read many files into one frame."""

    def __init__(
        self,
        metric_filter: MetricFilter | None = None,
        default_timestamp: float | None = None,
        timestamp_unit: TimestampUnit = "auto",
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        max_bad_examples: int = 20,
        sentinels: bool = True,
    ) -> None:
        if timestamp_unit not in ("auto", "s", "ms"):
            raise ValueError(f"timestamp_unit must be 'auto', 's' or 'ms', not {timestamp_unit!r}")
        if chunk_bytes < 1:
            raise ValueError("chunk_bytes must be positive")
        self.filter = metric_filter
        self.default_timestamp = None if default_timestamp is None else float(default_timestamp)
        self.timestamp_unit = timestamp_unit
        self.chunk_bytes = chunk_bytes
        self.report = IngestReport(max_examples=max_bad_examples)
        self.builder = FrameBuilder(self.report, sentinels=sentinels)
        self._keys = _KeyCache(self._key_id)
        self._ts_cache = _TimestampCache()
        self._seen_names: set[str] = set()
        self._pending_bad: list[tuple[int, str, str, bytes]] = []

    # -- public ------------------------------------------------------------------------
    def read(self, path: str | Path) -> None:
        """Read one file (plain or gzip) into the pending frame."""
        path = Path(path)
        source = str(path)
        state = _FileState(source)
        lineno = 0
        with _open_binary(path) as f:
            try:
                for block in _read_blocks(f, self.chunk_bytes):
                    lineno += self._parse_block(block, lineno, state)
            except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt gzip
                self.report.add_bad(source, lineno + 1, f"unreadable from here on: {type(e).__name__}: {e}", b"")
        self._finish_file(state)
        self.report.files.append(source)

    def frame(self) -> pd.DataFrame:
        """Build the long frame of everything read so far (and fill ``report.missing``)."""
        if self.filter is not None:
            self.report.missing = sorted(n for n in self.filter.names if n not in self._seen_names)
        return self.builder.build()

    # -- parsing ---------------------------------------------------------------------
    def _bad(self, source: str, line_number: int, reason: str, text: bytes) -> None:
        self._pending_bad.append((line_number, source, reason, text))

    def _flush_bad(self) -> None:
        """Report a block's bad lines in line order, however they were found."""
        for line_number, source, reason, text in sorted(self._pending_bad, key=lambda b: b[0]):
            self.report.add_bad(source, line_number, reason, text)
        self._pending_bad.clear()

    def _parse_block(self, block: bytes, first_lineno: int, state: _FileState) -> int:
        """Parse one block of lines; return how many lines it had."""
        try:
            if block[:1] != b"#" and b"\n#" not in block:
                return self._parse_run(block, first_lineno, state)
            # Comment lines (family headers, # EOF) cut the block into runs of samples.
            pos, lineno, size = 0, first_lineno, len(block)
            while pos <= size:
                if block.startswith(b"#", pos):
                    end = block.find(b"\n", pos)
                    end = size if end < 0 else end
                    self._parse_lines([block[pos:end]], lineno, state)
                    lineno += 1
                else:
                    end = block.find(b"\n#", pos)
                    end = size if end < 0 else end
                    lineno += self._parse_run(block[pos:end], lineno, state)
                pos = end + 1
            return lineno - first_lineno
        finally:
            self._flush_bad()

    def _parse_run(self, run: bytes, first_lineno: int, state: _FileState) -> int:
        """Lines without comments: the bulk path, or line by line when it cannot take them."""
        if not state.eof_line and b"\x00" not in run:
            n = self._fast_run(run, state)
            if n:
                return n
        lines = run.split(b"\n")
        self._parse_lines(lines, first_lineno, state)
        return len(lines)

    def _fast_run(self, block: bytes, state: _FileState) -> int:
        """Read a run of plain ``key value timestamp`` lines in bulk; return 0 (nothing done) if it isn't one.

        Newlines become a `` \\x00 `` token (the run has no NUL byte), so after one split on
        spaces every newline marker sits at a position 3 mod 4 exactly when every line has
        exactly three space-separated fields.
        """
        toks = block.replace(b"\n", b" \x00 ").split(b" ")
        slots = len(toks) // 4
        if len(toks) % 4 != 3 or toks.count(b"\x00") != slots or toks[3::4].count(b"\x00") != slots:
            return 0
        n = slots + 1
        sids = list(map(self._keys.__getitem__, toks[0::4]))  # new keys are parsed by __missing__
        if _INVALID in sids:
            return 0
        sid_arr = np.array(sids, dtype=np.int64)
        keep = sid_arr >= 0
        n_keep = int(np.count_nonzero(keep))
        vals_b, ts_b = toks[1::4], toks[2::4]
        if n_keep != n:
            mask = keep.tolist()
            vals_b, ts_b, sid_arr = list(compress(vals_b, mask)), list(compress(ts_b, mask)), sid_arr[keep]
        try:
            vals = np.array(vals_b, dtype=np.float64)
            ts = self._timestamps(ts_b)
        except ValueError:
            return 0
        self.report.filtered_samples += n - n_keep
        if n_keep:
            state.sids.append(sid_arr)
            state.ts.append(ts)
            state.vals.append(vals)
            state.defaulted.append(np.zeros(n_keep, dtype=bool))
        return n

    def _timestamps(self, tokens: list[bytes]) -> np.ndarray:
        """Timestamps to float64 through a cache: history files repeat a few distinct ones."""
        cache = self._ts_cache
        if len(cache) > 1_000_000:  # jittered scrape times don't repeat: don't grow forever
            cache.clear()
        return np.array(list(map(cache.__getitem__, tokens)), dtype=np.float64)

    def _parse_lines(self, lines: list[bytes], first_lineno: int, state: _FileState) -> None:
        parts = [line.rsplit(b" ", 2) for line in lines]
        get = self._keys.get
        sids = np.array([get(p[0], _MISS) for p in parts], dtype=np.int64)
        slow: dict[int, tuple[float, float | None]] = {}
        for i in np.flatnonzero(sids == _MISS).tolist():
            known = get(parts[i][0], _MISS)  # a key first seen earlier in this block
            if known != _MISS and not state.eof_line and len(parts[i]) == 3:  # else: the slow parser's line
                sids[i] = known
                continue
            sid, sample = self._slow_line(lines[i], parts[i], first_lineno + i + 1, state)
            sids[i] = sid
            if sample is not None:
                slow[i] = sample
        if state.eof_line:
            self._after_eof(sids, lines, first_lineno, state)
        for i in slow:  # placeholders; the slow parser's numbers are patched in below
            parts[i] = [b"", b"0", b"0"]
        keep = sids >= 0
        n_keep = int(keep.sum())
        self.report.filtered_samples += int((sids == _FILTERED).sum())
        if n_keep == 0:
            return
        kept_idx = np.flatnonzero(keep) if n_keep != len(lines) else None
        kept_parts = parts if kept_idx is None else list(compress(parts, keep.tolist()))
        kept_sids = sids if kept_idx is None else sids[kept_idx]
        vals, ts, bad = self._convert(kept_parts)
        defaulted = np.zeros(n_keep, dtype=bool)
        if slow:
            line_idx = np.fromiter(slow, dtype=np.int64, count=len(slow))
            pos = line_idx if kept_idx is None else np.searchsorted(kept_idx, line_idx)
            for p, (v, t) in zip(pos.tolist(), slow.values(), strict=True):
                vals[p] = v
                if t is None:
                    defaulted[p] = True
                    ts[p] = 0.0
                else:
                    ts[p] = t
                bad[p] = False
        if bad.any():
            line_numbers = (np.flatnonzero(bad) if kept_idx is None else kept_idx[bad]) + first_lineno + 1
            for p, ln in zip(np.flatnonzero(bad).tolist(), line_numbers.tolist(), strict=True):
                self._bad(state.source, ln, self._bad_reason(kept_parts[p]), lines[ln - first_lineno - 1])
            good = ~bad
            kept_sids, ts, vals, defaulted = kept_sids[good], ts[good], vals[good], defaulted[good]
        state.sids.append(kept_sids)
        state.ts.append(ts)
        state.vals.append(vals)
        state.defaulted.append(defaulted)

    def _after_eof(self, sids: np.ndarray, lines: list[bytes], first_lineno: int, state: _FileState) -> None:
        """Samples the fast path accepted after ``# EOF`` are bad lines, like every line there."""
        start = max(state.eof_line - first_lineno, 0)
        late = np.flatnonzero(sids[start:] >= _FILTERED) + start
        for i in late.tolist():
            self._bad(state.source, first_lineno + i + 1, f"content after '# EOF' (line {state.eof_line})", lines[i])
        sids[late] = _SKIP

    def _convert(self, parts: list[list[bytes]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Values and timestamps to float64 in bulk; per item only when the bulk call fails."""
        n = len(parts)
        bad = np.zeros(n, dtype=bool)
        try:
            vals = np.array([p[1] for p in parts], dtype=np.float64)
        except ValueError:
            vals = np.empty(n)
            for i, p in enumerate(parts):
                try:
                    vals[i] = float(p[1])
                except ValueError:
                    vals[i] = np.nan
                    bad[i] = True
        try:
            ts = self._timestamps([p[2] for p in parts])
        except ValueError:
            ts = np.empty(n)
            for i, p in enumerate(parts):
                try:
                    ts[i] = self._ts_cache[p[2]]
                except ValueError:
                    ts[i] = np.nan
                    bad[i] = True
        return vals, ts, bad

    @staticmethod
    def _bad_reason(part: list[bytes]) -> str:
        try:
            float(part[1])
        except ValueError:
            return f"bad value {part[1][:40].decode('utf-8', 'backslashreplace')!r}"
        return f"bad timestamp {part[2][:40].decode('utf-8', 'backslashreplace')!r}"

    def _slow_line(
        self, raw: bytes, parts: list[bytes], lineno: int, state: _FileState
    ) -> tuple[int, tuple[float, float | None] | None]:
        """A line the fast path did not know: comment, new series key, or an odd sample line."""
        source = state.source
        stripped = raw.strip()
        if not stripped:
            return _SKIP, None
        if state.eof_line:
            self._bad(source, lineno, f"content after '# EOF' (line {state.eof_line})", raw)
            return _SKIP, None
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            self._bad(source, lineno, f"not UTF-8 ({e.reason} at byte {e.start})", raw)
            return _SKIP, None
        if stripped.startswith(b"#"):
            self._comment(text.strip(), lineno, state)
            return _SKIP, None
        if len(parts) == 3:  # maybe just a key not seen yet: parsed and remembered by the cache
            sid = self._keys[parts[0]]
            if sid != _INVALID:
                return sid, None  # value and timestamp go through the bulk conversion
        try:
            name, labels, value, timestamp, exemplar = parse_sample_line(text.rstrip("\r"))
        except ParseError as e:
            self._bad(source, lineno, str(e), raw)
            return _SKIP, None
        if exemplar:
            self.report.exemplars_ignored += 1
        sid = self._key_id(name, labels)
        if sid < 0:
            return sid, None
        if timestamp is None and self.default_timestamp is None:
            self._bad(source, lineno, "no timestamp (and no default_timestamp given)", raw)
            return _SKIP, None
        return sid, (value, timestamp)

    def _key_id(self, name: str, labels: list[tuple[str, str]]) -> int:
        if self.filter is not None and not self.filter.matches(name):
            return _FILTERED
        self._seen_names.add(name)
        return self.builder.series_id(name, labels)

    def _comment(self, text: str, lineno: int, state: _FileState) -> None:
        if text == "# EOF":
            state.eof_line = lineno
            return
        fields = text.split(None, 3)
        if len(fields) >= 4 and fields[1] == "TYPE":
            self.report.metric_types[fields[2]] = fields[3].strip()
        # HELP, UNIT and free comments carry no samples.

    def _finish_file(self, state: _FileState) -> None:
        if not state.sids:
            return
        sids = np.concatenate(state.sids)
        ts = np.concatenate(state.ts)
        vals = np.concatenate(state.vals)
        defaulted = np.concatenate(state.defaulted)
        explicit = ts[~defaulted] if defaulted.any() else ts
        biggest = max(abs(float(explicit.max())), abs(float(explicit.min()))) if explicit.size else 0.0
        unit = self.timestamp_unit
        if unit == "auto":
            if state.eof_line:
                unit = "s"
                if biggest >= MS_THRESHOLD:
                    self.report.warnings.append(
                        f"{state.source}: OpenMetrics file (ends with # EOF) read as seconds, but its timestamps "
                        f"look like milliseconds (up to {biggest:.0f}); pass timestamp_unit='ms' if they are"
                    )
            else:
                unit = "ms" if biggest >= MS_THRESHOLD else "s"
        if unit == "ms":
            ts = ts / 1000.0
        if defaulted.any():
            ts[defaulted] = self.default_timestamp
        self.builder.add(sids, ts, vals)


def read_openmetrics(
    paths: str | Path | Iterable[str | Path],
    *,
    metric_filter: MetricFilter | None = None,
    default_timestamp: float | None = None,
    timestamp_unit: TimestampUnit = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_bad_examples: int = 20,
    sentinels: bool = True,
) -> tuple[pd.DataFrame, IngestReport]:
    """Read OpenMetrics / Prometheus text files (plain or gzip) into the long frame.

    Returns the frame (``metric``, ``timestamp`` in unix seconds, ``value`` with DCGM
    sentinels as NaN, one categorical column per label) and the IngestReport. Missing
    files raise FileNotFoundError before anything is read; bad lines never do.
    """
    if isinstance(paths, str | Path):
        paths = [paths]
    paths = [Path(p) for p in paths]
    missing = [str(p) for p in paths if not p.is_file()]
    if missing:
        raise FileNotFoundError(f"OpenMetrics input not found: {', '.join(missing)}")
    reader = OpenMetricsReader(
        metric_filter=metric_filter,
        default_timestamp=default_timestamp,
        timestamp_unit=timestamp_unit,
        chunk_bytes=chunk_bytes,
        max_bad_examples=max_bad_examples,
        sentinels=sentinels,
    )
    for path in paths:
        reader.read(path)
    return reader.frame(), reader.report
