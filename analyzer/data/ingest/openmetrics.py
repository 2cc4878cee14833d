"""Read OpenMetrics / Prometheus text files with timestamps into the long frame.

These are history files (what ``promtool tsdb create-blocks-from openmetrics`` backfills,
and what ``truegpu simulate`` writes): millions of lines in which the same few thousand
series keys repeat. The fast path therefore works on bytes, ~128 KiB of lines at a time
(small enough to stay in the CPU cache): one split on spaces gives every line's series
key / value / timestamp (a key in several parts where label values hold spaces, as
dcgm-exporter's ``modelName`` does), each run of lines with one key (files written series by series)
is looked up once and other keys in a dict of already-parsed keys, and values and
timestamps are converted to float64 in bulk (one orjson call per column: its C number
parser rounds exactly like ``float()`` and is ~6x faster per token). At ~2 M samples/s
nearly all the time is in C. Anything the fast path does not recognise (comments, a
new key, label values with spaces and no timestamp, exemplars, odd whitespace, missing
timestamps, garbage) goes to a careful per-line parser, which either reads the sample or
reports a bad line with its line number. One bad line never stops the file. A big plain file is
cut into byte ranges, and several files are read at once, by forked workers on the other cores, merged
in file order, exactly as one process reads them (analyzer.data.ingest.split).

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
from functools import partial
from itertools import chain, compress, groupby, repeat
from operator import itemgetter
from pathlib import Path
from typing import Any, BinaryIO, Literal

import numpy as np
import orjson
import pandas as pd

from analyzer.data.ingest import split
from analyzer.data.ingest._common import FrameBuilder, IngestReport, MetricFilter
from analyzer.data.ingest.samples import Samples

TimestampUnit = Literal["auto", "s", "ms"]

#: Above this an auto-detected Prometheus-text timestamp is milliseconds (see module doc).
MS_THRESHOLD = 1e11
#: The latest timestamp any unit can mean (9999-12-31 in milliseconds): later ones are bad lines.
MAX_TIMESTAMP = 253_402_300_799_999.0
DEFAULT_CHUNK_BYTES = 1 << 22
#: The bulk path takes a run of lines this many bytes at a time: its tokens then stay in the CPU
#: cache while they are converted (2x faster than 4 MiB at once), and an odd line sends only its
#: own piece to the line-by-line parser.
FAST_BYTES = 1 << 17
#: Fewer lines of one series key in a row than this are looked up line by line (a run costs a bisection).
MIN_RUN = 32
#: A bulk piece whose lines change their field count more often than this is read line by line.
MAX_STRETCHES = 8
#: What a newline becomes in the bulk path's token list.
_MARK = b"\x00"
#: Samples are handed to the FrameBuilder about this many at a time (pieces are ~1,000 lines each).
BUILDER_BATCH = 1 << 16

_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_RE = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,?)[ \t]*', re.S)
#: A key the careful parser reads the same way: no escapes, no whitespace around its parts (duplicates checked after).
_SIMPLE_LABEL = r'[a-zA-Z_][a-zA-Z0-9_]*="[^"\\]*"'
_SIMPLE_KEY_RE = re.compile(rf"([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{{((?:{_SIMPLE_LABEL}(?:,{_SIMPLE_LABEL})*,?)?)\}})?")
_SIMPLE_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="([^"]*)"')
_ESCAPE_RE = re.compile(r"\\(.)", re.S)
_ESCAPES = {"\\": "\\", '"': '"', "n": "\n"}
#: What a plain decimal number token is made of (JSON whitespace included: CRLF files end
#: their timestamps with ``\r``, which float() strips too).
_DECIMAL_BYTES = b"0123456789.eE+-\r\t"
#: ``-0`` as a whole JSON number (an integer: orjson reads it as +0, float() as -0.0).
_INT_NEGATIVE_ZERO = re.compile(rb"-0(?![0-9.eE])")
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


def parse_key(key: bytes) -> tuple[str, list[tuple[str, str]]] | None:
    """A whole series key's name and labels, or None where it is not one. Keys without escapes or whitespace
    between their parts (nearly all) are read by two C-speed regexes, ~4x faster than the careful parser."""
    try:
        text = key.decode("utf-8")
    except UnicodeDecodeError:
        return None
    m = _SIMPLE_KEY_RE.fullmatch(text)
    if m is not None:
        labels = _SIMPLE_LABEL_RE.findall(m.group(2)) if m.group(2) else []
        if len({k for k, _ in labels}) == len(labels):
            return m.group(1), labels
    try:
        name, labels, end = parse_series(text)
    except ParseError:
        return None
    return (name, labels) if end == len(text) else None


def _parse_float(token: str, what: str) -> float:
    try:
        return float(token)
    except ValueError:
        raise ParseError(f"bad {what} {token[:40]!r}") from None


def _floats(tokens: list[bytes]) -> np.ndarray:
    """Number tokens to float64 exactly as ``float()`` reads them; ValueError if one is not a number.

    Plain decimals (nearly every value and timestamp) are read by orjson in one call. JSON has
    no NaN, Inf, ``+1`` or ``1_000`` (they fail it) and reads ``-0`` as the integer 0 (it is
    kept off): those lists go through ``float()`` per token, as everything did before.
    """
    text = b"[" + b",".join(tokens) + b"]"
    negative_zero = b"-" in text and _INT_NEGATIVE_ZERO.search(text)  # memchr first: '-' is rare
    if len(text.translate(None, _DECIMAL_BYTES)) == len(tokens) + 1 and not negative_zero:
        try:
            numbers = orjson.loads(text)
        except orjson.JSONDecodeError:
            pass
        else:
            if len(numbers) == len(tokens):  # one empty token reads as "[]": the per-token path says it is none
                return np.array(numbers, dtype=np.float64)
    return np.array(tokens, dtype=np.float64)


def _times_valid(ts: np.ndarray) -> np.ndarray:
    """Timestamps between 1970 and 9999 in any unit (NaN is not)."""
    return (ts >= 0.0) & (ts <= MAX_TIMESTAMP)


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
    if magic == split.GZIP_MAGIC:
        return gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[return-value]
    return raw


def _read_blocks(f: BinaryIO, chunk_bytes: int) -> Iterator[tuple[bytes, int, int]]:
    """Yield ``(buffer, start, end)``: complete lines ``buffer[start:end]`` (without the last newline) of roughly
    ``chunk_bytes`` each. Each read is yielded as it is (copying it into a block of whole lines was a tenth of
    the read): the line a read cut comes whole in a small buffer of its own."""
    carry = b""
    while True:
        data = f.read(chunk_bytes)
        if not data:
            break
        cut = data.rfind(b"\n")
        if cut < 0:
            carry += data
            continue
        start = 0
        if carry:
            start = data.find(b"\n") + 1
            yield carry + data[: start - 1], 0, len(carry) + start - 1
        if start <= cut:
            yield data, start, cut
        carry = data[cut + 1 :]
    if carry:
        yield carry, 0, len(carry)


def _comment_line(block: bytes, pos: int, end: int) -> int:
    """Start of the first line in ``block[pos:end]`` (``pos`` a line start) that begins with '#', or -1.

    Looks for '#' alone (a memchr-fast search; a two-byte one is ~30x slower) and skips the few
    inside lines (exemplars, label values)."""
    while True:
        i = block.find(b"#", pos, end)
        if i <= pos or block[i - 1] == 0x0A:  # none, at ``pos`` itself, or just after a newline
            return i
        pos = i + 1


class _KeyCache(dict[bytes, int]):
    """Series-key bytes -> series id (or _FILTERED); a miss parses the key (C-speed hits).

    A key that does not parse is answered _INVALID and not remembered: its lines go to the
    line-by-line parser, which reports them.
    """

    def __init__(self, key_ids: Callable[[list[tuple[str, list[tuple[str, str]]]]], list[int]]) -> None:
        super().__init__()
        self._key_ids = key_ids

    def __missing__(self, key: bytes) -> int:
        return self.learn([key])[0]

    def learn(self, keys: list[bytes]) -> list[int]:
        """Ids of distinct keys not cached yet, numbered together: a 10,000-GPU file brings ~600 k series,
        and numbering them one call each was a tenth of its read."""
        out = [_INVALID] * len(keys)
        at, parsed = [], []
        for i, key in enumerate(keys):
            series = parse_key(key)
            if series is not None:
                at.append(i)
                parsed.append(series)
        for i, sid in zip(at, self._key_ids(parsed), strict=True):
            out[i] = self[keys[i]] = sid
        return out


class _FileState:
    """Per-file parse state: the format evidence, the largest explicit timestamp and the samples without
    one. Samples with a timestamp go to the builder as they are parsed (a file is never held whole); the
    unit, known only at the end of the file, is applied there (``FrameBuilder.divide_times``)."""

    def __init__(self, source: str, builder: FrameBuilder) -> None:
        self.source = source
        self.eof_line = 0
        #: Lines after the ``# EOF`` line that carried something (all bad lines).
        self.after_eof = 0
        self.builder = builder
        self.mark = builder.mark()
        self.biggest = 0.0
        self.defaulted: list[tuple[np.ndarray, np.ndarray]] = []
        self._batch: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._batched = 0

    def add(self, sids: np.ndarray, ts: np.ndarray, vals: np.ndarray, defaulted: np.ndarray | None = None) -> None:
        """Keep samples; ``defaulted`` marks those whose timestamp is the default one (none if None)."""
        if defaulted is not None and defaulted.any():
            self.defaulted.append((sids[defaulted], vals[defaulted]))
            sids, ts, vals = sids[~defaulted], ts[~defaulted], vals[~defaulted]
        if len(ts):
            self._batch.append((sids, ts, vals))
            self._batched += len(ts)
            if self._batched >= BUILDER_BATCH:
                self.flush()

    def flush(self) -> None:
        """Hand the batched samples to the builder (in one call: its per-call costs are paid per batch)."""
        if not self._batch:
            return
        sids, ts, vals = (np.concatenate(c) for c in zip(*self._batch, strict=True))
        self._batch, self._batched = [], 0
        self.biggest = max(self.biggest, abs(float(ts.max())), abs(float(ts.min())))
        self.builder.add(sids, ts, vals)


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
        workers: int | None = None,
        min_part_bytes: int | None = None,
    ) -> None:
        """``workers``: processes reading a big plain file in ranges and several files at once
        (analyzer.data.ingest.split; None: the CPUs this process may use), each piece at least ``min_part_bytes``
        (None: split.MIN_PART_BYTES)."""
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
        self._keys = _KeyCache(self._key_ids)
        self._seen_names: set[str] = set()
        self._pending_bad: list[tuple[int, str, str, bytes]] = []
        self.workers = split.default_workers() if workers is None else int(workers)
        self.min_part_bytes = split.MIN_PART_BYTES if min_part_bytes is None else int(min_part_bytes)

    # -- public ------------------------------------------------------------------------
    def read(self, path: str | Path) -> None:
        """Read one file (plain or gzip) into the pending frame."""
        self.read_all([path])

    def read_all(self, paths: Iterable[str | Path]) -> None:
        """Read files (plain or gzip) into the pending frame, in order; with ``workers``, on several cores: a big
        plain file in byte ranges, several files at once (analyzer.data.ingest.split). Each piece a worker read is
        added in file order, as if read here."""
        tasks = split.plan([Path(p) for p in paths], self.workers, self.min_part_bytes)
        running: dict[int, split.Worker] = {}
        files: dict[int, tuple[_FileState, int]] = {}
        try:
            for i, task in enumerate(tasks):
                for j in range(i + 1, min(i + self.workers, len(tasks))):  # the next pieces, on the other cores
                    if len(running) < self.workers - 1 and tasks[j].to_worker and j not in running:
                        running[j] = split.Worker(partial(self._read_part, tasks[j].path, tasks[j].span))
                state, lineno = files.get(task.index) or (_FileState(str(task.path), self.builder), 0)
                worker = running.pop(i, None)
                lineno += (self._take(worker, task.path, task.span, lineno, state) if worker is not None else
                           self._read_range(task.path, task.span, lineno, state))
                files[task.index] = (state, lineno)
                if task.last:
                    self._finish_file(state)
                    self.report.files.append(str(task.path))
        finally:
            for worker in running.values():
                worker.stop()

    def _read_range(self, path: Path, span: tuple[int, int] | None, lineno: int, state: _FileState) -> int:
        """Parse the lines of bytes ``span`` of ``path`` (None: all of it, plain or gzip), numbered after
        ``lineno``; return how many there were."""
        first = lineno
        with _open_binary(path) if span is None else split.RangeFile(path, *span) as f:
            try:
                for buffer, start, end in _read_blocks(f, self.chunk_bytes):
                    lineno += self._parse_block(buffer, start, end, lineno, state)
            except (OSError, EOFError, zlib.error) as e:  # truncated or corrupt gzip
                self.report.add_bad(state.source, lineno + 1, f"unreadable from here on: {type(e).__name__}: {e}", b"")
        return lineno - first

    def _read_part(self, path: Path, span: tuple[int, int] | None) -> tuple[split.Part, dict[str, list[Any]]]:
        """(In a worker.) Bytes ``span`` of ``path`` (None: all of it) read as a file of their own, for ``_take``."""
        reader = OpenMetricsReader(self.filter, default_timestamp=self.default_timestamp,
                                   timestamp_unit=self.timestamp_unit, chunk_bytes=self.chunk_bytes,
                                   max_bad_examples=self.report.max_examples, sentinels=self.builder.sentinels,
                                   workers=1)
        state = _FileState(str(path), reader.builder)
        lines = reader._read_range(path, span, 0, state)
        state.flush()
        got = reader.builder.export()
        return split.Part(got._replace(pieces={}), reader.report, lines, state.eof_line, state.after_eof,
                          state.biggest, state.defaulted, reader._seen_names), got.pieces

    def _take(self, worker: split.Worker, path: Path, span: tuple[int, int] | None, lineno: int,
              state: _FileState) -> int:
        """A worker's range, its lines numbered after ``lineno``: its part added as if read here, or read here
        where it follows a ``# EOF`` or the worker failed; return how many lines it had."""
        part = worker.part() if not state.eof_line else None
        if isinstance(part, split.Part) and not part.after_eof:
            state.flush()  # what came before it arrives first
            remap = self.builder.absorb(part.builder, worker.pieces())
            self.report.add(part.report, line_offset=lineno)
            self.report.worker_parts += 1
            self._seen_names |= part.seen
            state.biggest = max(state.biggest, part.biggest)
            if part.eof_line:  # the ranges after it are read here, as content after # EOF
                state.eof_line = lineno + part.eof_line
            state.defaulted += [(remap[sids], vals) for sids, vals in part.defaulted]
            return part.lines
        if isinstance(part, str):
            what = "it" if span is None else f"bytes {span[0]}-{span[1]}"
            self.report.warnings.append(f"{path}: the worker reading {what} failed ({part}); read by the main process")
        worker.stop()
        return self._read_range(path, span, lineno, state)

    def samples(self) -> Samples:
        """The compact Samples of everything read so far (and fill ``report.missing``)."""
        if self.filter is not None:
            self.report.missing = sorted(n for n in self.filter.names if n not in self._seen_names)
        return self.builder.samples()

    def frame(self) -> pd.DataFrame:
        """The long frame of everything read so far (Samples.frame)."""
        return self.samples().frame()

    # -- parsing ---------------------------------------------------------------------
    def _bad(self, source: str, line_number: int, reason: str, text: bytes) -> None:
        self._pending_bad.append((line_number, source, reason, text))

    def _flush_bad(self) -> None:
        """Report a block's bad lines in line order, however they were found."""
        for line_number, source, reason, text in sorted(self._pending_bad, key=lambda b: b[0]):
            self.report.add_bad(source, line_number, reason, text)
        self._pending_bad.clear()

    def _parse_block(self, block: bytes, pos: int, size: int, first_lineno: int, state: _FileState) -> int:
        """Parse the lines of ``block[pos:size]``; return how many there were. Comment lines (family headers,
        # EOF) cut it into runs of samples."""
        try:
            lineno = first_lineno
            while True:
                start = _comment_line(block, pos, size)
                if start < 0:
                    return lineno + self._parse_run(block, pos, size, lineno, state) - first_lineno
                if start > pos:
                    lineno += self._parse_run(block, pos, start - 1, lineno, state)
                end = block.find(b"\n", start, size)
                end = size if end < 0 else end
                self._parse_lines([block[start:end]], lineno, state)
                lineno += 1
                if end == size:
                    return lineno - first_lineno
                pos = end + 1
        finally:
            self._flush_bad()

    def _parse_run(self, block: bytes, pos: int, size: int, first_lineno: int, state: _FileState) -> int:
        """The lines of ``block[pos:size]``, without comments, FAST_BYTES at a time: the bulk path, or line by
        line where it cannot."""
        bulk = not state.eof_line and block.find(b"\x00", pos, size) < 0
        lineno = first_lineno
        while True:
            end = block.find(b"\n", pos + FAST_BYTES, size) if size - pos > FAST_BYTES else -1
            piece = block[pos:size] if end < 0 else block[pos:end]
            n = self._fast_run(piece, state) if bulk else 0
            if not n:
                lines = piece.split(b"\n")
                self._parse_lines(lines, lineno, state)
                n = len(lines)
            lineno += n
            if end < 0:
                return lineno - first_lineno
            pos = end + 1

    def _fast_run(self, run: bytes, state: _FileState) -> int:
        """Read a run of plain ``key value timestamp`` lines in bulk; return 0 (nothing done) if it isn't one.

        Newlines become a `` \\x00 `` token (the run has no NUL byte), so after one split on
        spaces a stretch of lines with f fields each has its newline markers every f + 1 tokens:
        the last two fields are value and timestamp, the first f - 2 the series key (more than one
        where label values hold spaces, as dcgm-exporter's ``modelName="NVIDIA H100 80GB HBM3"``).
        """
        marked = run.replace(b"\n", b" \x00 ")
        toks = marked.split(b" ")
        n = (len(marked) - len(run)) // 2 + 1  # each newline grew by two bytes
        stretches = _stretches(toks, n - 1)
        if stretches is None:
            return 0
        sids_l, vals_l, ts_l = [], [], []
        for start, stop, fields in stretches:
            step = fields + 1
            pieces = [toks[start + j:stop:step] for j in range(fields - 2)]
            if fields > 3 and self._keys[b" ".join(p[0] for p in pieces)] == _INVALID:
                return 0  # e.g. spaced label values and no timestamp: not worth looking up line by line
            sids = self._series_ids(pieces)
            if (sids == _INVALID).any():
                return 0
            sids_l.append(sids)
            vals_l.append(toks[start + fields - 2:stop:step])
            ts_l.append(toks[start + fields - 1:stop:step])
        if len(stretches) == 1:
            (sids,), (vals_b,), (ts_b,) = sids_l, vals_l, ts_l
        else:
            sids, vals_b, ts_b = np.concatenate(sids_l), list(chain(*vals_l)), list(chain(*ts_l))
        keep = sids >= 0
        n_keep = int(np.count_nonzero(keep))
        if n_keep != n:
            mask = keep.tolist()
            vals_b, ts_b, sids = list(compress(vals_b, mask)), list(compress(ts_b, mask)), sids[keep]
        try:
            vals = _floats(vals_b)
            ts = _floats(ts_b)
        except ValueError:
            return 0
        if not _times_valid(ts).all():
            return 0
        self.report.filtered_samples += n - n_keep
        if n_keep:
            state.add(sids, ts, vals)
        return n

    def _series_ids(self, pieces: list[list[bytes]]) -> np.ndarray:
        """Series ids of key tokens (_INVALID where one does not parse); ``pieces`` holds the keys'
        space-separated parts, one list per part (one list where keys have no spaces).

        Files written series by series repeat one key for hundreds of lines: such a run is found by
        bisection and checked with one ``list.count`` (a memcmp per line, ~5x cheaper than
        hashing a new 100-byte token for the dict); the rest is looked up token by token.
        """
        rows: list[Any] = pieces[0] if len(pieces) == 1 else list(zip(*pieces, strict=True))
        n = len(rows)
        runs: list[tuple[int, int]] = []  # (start, end) of each run of one key
        i = 0
        while i < n:
            key = rows[i]
            lo, hi = i + 1, n
            while lo < hi:  # first index past the run, were the key's lines contiguous
                mid = (lo + hi) // 2
                if rows[mid] == key:
                    lo = mid + 1
                else:
                    hi = mid
            if lo - i < MIN_RUN or rows[i:lo].count(key) != lo - i:
                break
            runs.append((i, lo))
            i = lo
        heads, rest = [rows[a] for a, _ in runs], rows[i:]
        if len(pieces) > 1:
            heads, rest = [b" ".join(h) for h in heads], list(map(b" ".join, rest))
        got = np.fromiter(map(self._keys.get, chain(heads, rest), repeat(_MISS)), np.int64, len(heads) + len(rest))
        miss = got == _MISS
        if miss.any():  # new keys, numbered together in the order they come
            missed = list(compress(chain(heads, rest), miss.tolist()))
            new = list(dict.fromkeys(missed))
            learnt = dict(zip(new, self._keys.learn(new), strict=True))
            got[miss] = [learnt[k] for k in missed]
        # the runs cover [0, i) one after another; the rest is one id a token
        return np.concatenate([np.repeat(got[:len(runs)], [b - a for a, b in runs]), got[len(runs):]])

    def _parse_lines(self, lines: list[bytes], first_lineno: int, state: _FileState) -> None:
        parts = [line.rsplit(b" ", 2) for line in lines]
        get = self._keys.get
        # A known key on a line of two fields (no timestamp) is the slow parser's line, not the bulk one's.
        sids = np.array([get(p[0], _MISS) if len(p) == 3 else _MISS for p in parts], dtype=np.int64)
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
        state.add(kept_sids, ts, vals, defaulted)

    def _after_eof(self, sids: np.ndarray, lines: list[bytes], first_lineno: int, state: _FileState) -> None:
        """Samples the fast path accepted after ``# EOF`` are bad lines, like every line there."""
        start = max(state.eof_line - first_lineno, 0)
        late = np.flatnonzero(sids[start:] >= _FILTERED) + start
        state.after_eof += len(late)
        for i in late.tolist():
            self._bad(state.source, first_lineno + i + 1, f"content after '# EOF' (line {state.eof_line})", lines[i])
        sids[late] = _SKIP

    def _convert(self, parts: list[list[bytes]]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Values and timestamps to float64 in bulk (per item only where the bulk call fails); which are bad."""
        bad = np.zeros(len(parts), dtype=bool)
        vals = _floats_marking_bad([p[1] for p in parts], bad)
        ts = _floats_marking_bad([p[2] for p in parts], bad)
        late = ~_times_valid(ts) & ~bad
        if late.any():
            ts[late] = np.nan
            bad |= late
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
            state.after_eof += 1
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
        sid = self._key_ids([(name, labels)])[0]
        if sid < 0:
            return sid, None
        if timestamp is None and self.default_timestamp is None:
            self._bad(source, lineno, "no timestamp (and no default_timestamp given)", raw)
            return _SKIP, None
        return sid, (value, timestamp)

    def _key_ids(self, keys: list[tuple[str, list[tuple[str, str]]]]) -> list[int]:
        """Series ids (or _FILTERED) of parsed keys, each run of one metric's numbered in one call."""
        out: list[int] = []
        canon = self.builder.labelsets.get
        for name, run in groupby(keys, key=itemgetter(0)):
            if self.filter is not None and not self.filter.matches(name):
                out.extend(_FILTERED for _ in run)
                continue
            self._seen_names.add(name)
            out.extend(self.builder.series_ids(name, [canon(tuple(labels)) for _, labels in run]))
        return out

    def _comment(self, text: str, lineno: int, state: _FileState) -> None:
        if text == "# EOF":
            state.eof_line = lineno
            return
        fields = text.split(None, 3)
        if len(fields) >= 4 and fields[1] == "TYPE":
            self.report.metric_types[fields[2]] = fields[3].strip()
        # HELP, UNIT and free comments carry no samples.

    def _finish_file(self, state: _FileState) -> None:
        state.flush()
        biggest = state.biggest
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
            self.builder.divide_times(state.mark, 1000.0)
        for sids, vals in state.defaulted:
            self.builder.add(sids, np.full(len(sids), self.default_timestamp), vals)


def _stretches(toks: list[bytes], markers: int) -> list[tuple[int, int, int]] | None:
    """Cut a marked token list (see _fast_run) into stretches of lines with one field count:
    ``(first token, end, fields)`` each; None where a line has fewer than three fields or the
    count changes more than MAX_STRETCHES times (that piece is read line by line).

    A stretch's k lines have their markers at every ``fields + 1``-th token and no others, checked
    with two ``list.count`` calls; where the rest of the run is not one stretch, its length in lines
    is found by bisection."""
    out: list[tuple[int, int, int]] = []
    pos, total = 0, len(toks)
    while len(out) < MAX_STRETCHES:
        try:
            fields = toks.index(_MARK, pos) - pos
        except ValueError:
            fields = total - pos
        if fields < 3:
            return None
        step = fields + 1
        lines = (total - pos + 1) // step
        if lines * step == total - pos + 1 and toks[pos + fields:total:step].count(_MARK) == markers:
            out.append((pos, total, fields))
            return out
        lo, hi = 1, min(lines, markers)  # the first ``lo`` lines have ``fields`` fields each
        while lo < hi:
            mid = (lo + hi + 1) // 2
            end = pos + mid * step  # past line mid's marker
            if toks[pos + fields:end:step].count(_MARK) == mid == toks[pos:end].count(_MARK):
                lo = mid
            else:
                hi = mid - 1
        out.append((pos, pos + lo * step - 1, fields))
        markers -= lo
        pos += lo * step
    return None


def _floats_marking_bad(tokens: list[bytes], bad: np.ndarray) -> np.ndarray:
    """``_floats``, or per token where one is not a number: NaN there and ``bad`` set."""
    try:
        return _floats(tokens)
    except ValueError:
        out = np.empty(len(tokens))
        for i, token in enumerate(tokens):
            try:
                out[i] = float(token)
            except ValueError:
                out[i] = np.nan
                bad[i] = True
        return out


def read_openmetrics(
    paths: str | Path | Iterable[str | Path],
    *,
    metric_filter: MetricFilter | None = None,
    default_timestamp: float | None = None,
    timestamp_unit: TimestampUnit = "auto",
    chunk_bytes: int = DEFAULT_CHUNK_BYTES,
    max_bad_examples: int = 20,
    sentinels: bool = True,
    compact: bool = False,
    workers: int | None = None,
    min_part_bytes: int | None = None,
) -> tuple[pd.DataFrame | Samples, IngestReport]:
    """Read OpenMetrics / Prometheus text files (plain or gzip) into the long frame.

    Returns the frame (``metric``, ``timestamp`` in unix seconds, ``value`` with DCGM
    sentinels as NaN, one categorical column per label), or with ``compact`` the Samples
    normalize reads, and the IngestReport. Missing files raise FileNotFoundError before
    anything is read; bad lines never do.
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
        workers=workers,
        min_part_bytes=min_part_bytes,
    )
    reader.read_all(paths)
    return (reader.samples() if compact else reader.frame()), reader.report
