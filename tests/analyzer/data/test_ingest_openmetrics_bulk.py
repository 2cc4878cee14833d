"""The OpenMetrics reader's bulk paths (runs of one series key, whole pieces split on spaces, numbers
through orjson) against the careful line-by-line parser: same samples bit for bit, same bad lines."""

from __future__ import annotations

import math
import string
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from analyzer.data.ingest import openmetrics, read_openmetrics
from analyzer.data.ingest.openmetrics import ParseError, parse_sample_line

T0 = 1_700_000_000

# Keys the fast paths (the simple-key regex too) must read (or hand on) exactly as the careful parser does:
# label values with a space, '}', '"', '\\', '#', ',', an escaped newline, non-ASCII, empty values, spaces
# in the label set.
_KEYS = [
    "m",
    "x:y_total",
    'm{a="1",b="2"}',
    'm{b="2",a="1"}',
    'm{a="with space"}',
    'm{modelName="NVIDIA H100 80GB HBM3",gpu="0"}',  # dcgm-exporter's: three spaces in a key
    'm{a="two  spaces",b=" edge "}',
    'm{a="x y"} 1',  # a key with a space and a number in it: looks like one more field
    'm{a="brace } here"}',
    r'm{a="quote \" here",b="back\\slash",c="new\nline"}',
    'm{a="# hash, comma"}',
    'm{a="caf\u00e9"}',
    'm{a="",b="x"}',
    'm{a="1", b="2"}',
    "m{}",
    'm{a="1",}',
    'm{a="x",a="y"}',  # duplicate label: bad
    'm{a="open}',  # unterminated: bad
    'm{a="1"b="2"}',  # no comma between labels: bad
    "m{,}",  # a comma and no label: bad
    'm{a="tab\there",b="=,{}"}',
    "9m",  # no metric name: bad
]
_VALUES = st.one_of(
    st.floats(allow_nan=False, allow_infinity=False).map(repr),
    st.integers(-(10**25), 10**25).map(str),
    st.sampled_from([
        "0", "-0", "-0.0", "0.0", "1e+06", "1E5", "-1e-400", "1e400", "4.9e-324", "0.30000000000000004",
        "18446744073709551616", "NaN", "+Inf", "-Inf", "+1", "1_000", ".5", "5.", "01", "0x10",
        "abc", "true", "null", '"1"', "[1]", "1,2",
    ]),
)  # fmt: skip


def _times(i: int) -> st.SearchStrategy[str]:
    """Timestamp tokens for line ``i``: unique per line (no duplicate samples), in many spellings."""
    t = T0 + i
    return st.sampled_from([
        str(t), f"{t}.5", f"{t}.125", f"{t}000", f"{t}123.5", f"{t / 1e9!r}e9", f"{t}e0",
        "", "NaN", "-1", "x", "1e30", "+Inf",
    ])  # fmt: skip


@st.composite
def _history(draw: st.DrawFn) -> bytes:
    """Runs of lines that share a key (as history files are written), with oddities in between."""
    lines: list[str] = []
    for _ in range(draw(st.integers(1, 8))):
        key = draw(st.sampled_from(_KEYS))
        for _ in range(draw(st.sampled_from([1, 2, 5, 40, 70]))):
            i = len(lines)
            value, ts = draw(_VALUES), draw(_times(i))
            line = f"{key} {value} {ts}".rstrip() if draw(st.integers(0, 9)) else f"{key}\t{value}  {ts}"
            odd = draw(st.integers(0, 40))
            if odd == 0:
                line += ' # {trace_id="a b"} 1'
            elif odd == 1:
                line += "\r"
            elif odd == 2:
                line = "# TYPE m gauge"
            elif odd == 3:
                line = ""
            elif odd == 4:
                line = "# EOF"
            lines.append(line)
    return ("\n".join(lines) + draw(st.sampled_from(["", "\n"]))).encode()


def _reference(data: bytes, default_timestamp: float | None) -> tuple[list[tuple], list[int]]:
    """Every line through parse_sample_line: the samples (as comparable rows) and the bad line numbers."""
    rows, bad, eof = [], [], 0
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        if eof:
            bad.append(number)
            continue
        text = raw.decode("utf-8")
        if raw.strip().startswith(b"#"):
            eof = number if text.strip() == "# EOF" else 0
            continue
        try:
            name, labels, value, ts, _exemplar = parse_sample_line(text.rstrip("\r"))
        except ParseError:
            bad.append(number)
            continue
        if ts is None and default_timestamp is None:
            bad.append(number)
            continue
        rows.append(_row(name, {k: v for k, v in labels if v}, default_timestamp if ts is None else ts, value))
    return rows, bad


def _row(name: str, labels: dict[str, str], ts: float, value: float) -> tuple:
    # repr tells -0.0 from 0.0 and every bit of a float apart
    return name, tuple(sorted(labels.items())), repr(float(ts)), repr(float(value))


def _read_rows(path: Path, default_timestamp: float | None, chunk_bytes: int) -> tuple[list[tuple], list[int]]:
    frame, report = read_openmetrics(path, default_timestamp=default_timestamp, timestamp_unit="s",
                                     chunk_bytes=chunk_bytes, sentinels=False, max_bad_examples=10**6)  # fmt: skip
    label_cols = [c for c in frame.columns if c not in ("metric", "timestamp", "value")]
    rows = []
    for rec in frame.to_dict("records"):
        labels = {c: rec[c] for c in label_cols if isinstance(rec[c], str)}
        rows.append(_row(rec["metric"], labels, rec["timestamp"], rec["value"]))
    assert report.bad_line_count == len(report.bad_lines)
    return rows, [b.line_number for b in report.bad_lines], sum(report.duplicates.values())


def _assert_reads_like(got: tuple[list[tuple], list[int], int], want: tuple[list[tuple], list[int]]) -> None:
    """Same samples bit for bit and same bad lines. Lines without a timestamp all take the default one:
    the frame builder keeps one of equal values there (-0.0 == 0.0 too) and counts the rest, never loses one."""
    rows, bad, dropped = got
    assert bad == want[1]
    assert len(rows) + dropped == len(want[0])
    got_at, want_at = _by_series_and_time(rows), _by_series_and_time(want[0])
    assert got_at.keys() == want_at.keys()
    for at, values in want_at.items():
        assert got_at[at] == values if len(values) == 1 else set(got_at[at]) <= set(values), at


def _by_series_and_time(rows: list[tuple]) -> dict[tuple, list[str]]:
    out: dict[tuple, list[str]] = {}
    for name, labels, ts, value in rows:
        out.setdefault((name, labels, ts), []).append(value)
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=_history(), default=st.sampled_from([None, float(T0 - 60)]))
def test_bulk_paths_read_exactly_what_the_careful_parser_reads(tmp_path_factory, data, default):
    path = tmp_path_factory.mktemp("om") / "in.om"
    path.write_bytes(data)
    want = _reference(data, default)
    with pytest.MonkeyPatch.context() as mp:
        # tiny pieces and runs: every bulk path and every boundary between them is crossed
        mp.setattr(openmetrics, "FAST_BYTES", 97)
        mp.setattr(openmetrics, "MIN_RUN", 2)
        for chunk_bytes in (1, 61, 1 << 22):
            _assert_reads_like(_read_rows(path, default, chunk_bytes), want)
    _assert_reads_like(_read_rows(path, default, 1 << 22), want)


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "in.om"
    path.write_bytes(text.encode())
    return path


def test_values_are_read_bit_for_bit_like_float(tmp_path):
    tokens = ["0.1", "0.30000000000000004", "2.2250738585072014e-308", "4.9e-324", "1e+06", "1E5", "-1e-400",
              "9007199254740993", "18446744073709551615", "123456789012345678901234567890", "1e22", "1e23",
              "-0", "-0.0", "0", "1_000", "NaN", "+Inf", "-Inf", "1e400", "-7.5"]  # fmt: skip
    text = "".join(f"m {tok} {T0 + i}\n" for i, tok in enumerate(tokens))
    frame, report = read_openmetrics(_write(tmp_path, text), sentinels=False)
    assert report.bad_line_count == 0
    assert [repr(v) for v in frame["value"]] == [repr(float(t)) for t in tokens]  # -0 stays -0.0


def test_a_long_run_of_numbers_json_would_misread_keeps_float_semantics(tmp_path):
    """orjson reads these lists happily (True -> 1.0, None -> NaN, "1" -> 1.0, "-0" -> +0.0): each must
    still be what float() says, a bad line or -0.0, even inside a run the bulk path takes whole."""
    for token, bad in (("true", True), ("null", True), ('"1"', True), ("[1]", True), ("1,2", True), ("-0", False)):
        lines = [f'm{{a="x"}} {token if i == 50 else i} {T0 + i}' for i in range(100)]
        frame, report = read_openmetrics(_write(tmp_path, "\n".join(lines) + "\n"))
        assert [b.line_number for b in report.bad_lines] == ([51] if bad else []), token
        if not bad:
            assert repr(float(frame["value"].iloc[50])) == "-0.0"


def test_negative_zero_before_a_carriage_return_is_still_negative(tmp_path):
    """``-0`` ends a CRLF line's timestamp as ``-0\\r``: orjson reads it as +0, float() as -0.0."""
    text = "".join(f'm{{a="{i}"}} {i} -0\r\n' for i in range(100))
    frame, report = read_openmetrics(_write(tmp_path, text), sentinels=False)
    assert report.bad_line_count == 0 and len(frame) == 100
    assert {repr(float(t)) for t in frame["timestamp"]} == {"-0.0"}


def test_timestamps_fractional_ms_and_crlf(tmp_path):
    text = f'm{{a="x"}} 1 {T0}123.5\r\nm{{a="x"}} 2 {T0}124\r\nm{{a="x"}} -Inf {T0}125\r\n'
    frame, report = read_openmetrics(_write(tmp_path, text), sentinels=False)
    assert report.bad_line_count == 0
    assert frame["timestamp"].tolist() == [T0 + 0.1235, T0 + 0.124, T0 + 0.125]
    assert frame["value"].tolist() == [1.0, 2.0, -math.inf] and frame["a"].tolist() == ["x"] * 3


def test_label_values_with_space_brace_and_quote(tmp_path):
    keys = ['m{a="one two"}', 'm{a="}"}', r'm{a="say \"hi\""}', 'm{a="# x, y"}']
    text = "".join(f"{k} {i} {T0 + i}\n" for i, k in enumerate(keys * 50))
    frame, report = read_openmetrics(_write(tmp_path, text))
    assert report.bad_line_count == 0 and report.series == 4 and len(frame) == 200
    got = dict(zip(frame["value"], frame["a"], strict=True))
    assert got == {float(i): ["one two", "}", 'say "hi"', "# x, y"][i % 4] for i in range(200)}


def test_spaced_label_values_are_read_in_bulk_whatever_their_count(tmp_path, monkeypatch):
    """dcgm-exporter's keys hold spaces (``modelName="NVIDIA H100 80GB HBM3"``), and a mixed fleet
    changes their count from host to host: such lines were all read one at a time (half the speed)."""
    models = ["NVIDIA H100 80GB HBM3", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S", "Tesla T4 (PCIe)  x"]
    lines = [f'DCGM_FI_DEV_POWER_USAGE{{gpu="{g}",modelName="{models[g // 8 % 4]}",Hostname="h{g // 8}"}} '
             f"{g + i / 8} {T0 + 15 * i}" for g in range(64) for i in range(40)]  # fmt: skip
    path = _write(tmp_path, "\n".join(lines) + "\n")
    by_line: list[int] = []
    careful = openmetrics.OpenMetricsReader._parse_lines
    monkeypatch.setattr(openmetrics.OpenMetricsReader, "_parse_lines",
                        lambda self, lines, *a: by_line.append(len(lines)) or careful(self, lines, *a))  # fmt: skip
    monkeypatch.setattr(openmetrics, "FAST_BYTES", 4096)  # pieces that cross from one model to the next
    frame, report = read_openmetrics(path, timestamp_unit="s")
    assert by_line == [] and report.bad_line_count == 0 and report.series == 64 and len(frame) == 64 * 40
    got = frame.set_index(["gpu", "timestamp"])
    assert got.loc[("9", float(T0 + 15 * 3)), "value"] == 9 + 3 / 8
    assert dict(zip(frame["gpu"], frame["modelName"], strict=True)) == {str(g): models[g // 8 % 4] for g in range(64)}


def test_series_written_one_after_another_and_a_key_that_breaks_a_run(tmp_path):
    """Runs of one key are found by bisection: a different key inside what looks like one run (A x40,
    B, A x40) and a run cut by a piece boundary must still give every line its own series."""
    lines = [f'a{{g="0"}} {i} {T0 + i}' for i in range(40)] + [f'b{{g="0"}} 40 {T0 + 40}']
    lines += [f'a{{g="0"}} {i} {T0 + i}' for i in range(41, 81)]
    lines += [f'c{{g="{i // 300}"}} {i} {T0 + i}' for i in range(81, 2000)]
    path = _write(tmp_path, "\n".join(lines) + "\n")
    frame, report = read_openmetrics(path)
    assert report.bad_line_count == 0 and len(frame) == 2000
    metric = dict(zip(frame["timestamp"] - T0, frame["metric"], strict=True))
    assert metric[40] == "b" and {metric[i] for i in range(40)} == {"a"} and metric[80] == "a"
    g = dict(zip(frame["timestamp"] - T0, frame["g"], strict=True))
    assert all(g[i] == str(i // 300) for i in range(81, 2000))
    for chunk_bytes in (1000, 1 << 16):
        other, _ = read_openmetrics(path, chunk_bytes=chunk_bytes)
        assert np.array_equal(other["value"].to_numpy(), frame["value"].to_numpy())
        assert other["metric"].tolist() == frame["metric"].tolist()


def test_a_line_split_across_read_blocks(tmp_path):
    label = "".join(string.ascii_lowercase)
    lines = [f'm{{a="{label} {i}"}} {i}.25 {T0 + i}' for i in range(300)]
    path = _write(tmp_path, "\n".join(lines) + "\n")
    want = {f"{label} {i}": (i + 0.25, float(T0 + i)) for i in range(300)}
    for chunk_bytes in (13, 50, 4099, 1 << 22):  # cuts fall inside keys, values and timestamps
        frame, report = read_openmetrics(path, chunk_bytes=chunk_bytes)
        assert report.bad_line_count == 0
        assert dict(zip(frame["a"], zip(frame["value"], frame["timestamp"], strict=True), strict=True)) == want


def test_a_known_series_without_a_timestamp_in_a_later_block(tmp_path):
    """Found by the property test: the key was known from an earlier block, so the line-by-line path sent
    ``key value`` to the three-field conversion (IndexError, the whole read aborted)."""
    path = _write(tmp_path, f'm{{a="x"}} 1 {T0}\nm{{a="x"}} 2\r\n')
    for chunk_bytes in (1, 30, 1 << 22):
        frame, report = read_openmetrics(path, chunk_bytes=chunk_bytes)
        assert frame["value"].tolist() == [1.0]
        assert [(b.line_number, b.reason) for b in report.bad_lines] == [
            (2, "no timestamp (and no default_timestamp given)")
        ]
        frame, _ = read_openmetrics(path, chunk_bytes=chunk_bytes, default_timestamp=T0 + 60)
        assert frame["value"].tolist() == [1.0, 2.0] and frame["timestamp"].tolist() == [T0, T0 + 60]
