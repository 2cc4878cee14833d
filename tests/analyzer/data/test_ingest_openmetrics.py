"""OpenMetrics / Prometheus text history files -> long frame: exact frames, bad lines, units, gzip."""

from __future__ import annotations

import gzip
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from analyzer.data.ingest import IngestReport, MetricFilter, metric_filter, read_openmetrics
from analyzer.data.ingest.openmetrics import parse_sample_line, unescape_label_value
from exporter import schema
from exporter.simulator.history import sample_times, write_openmetrics

T0 = 1_700_000_000
UTIL = schema.GPU_UTILIZATION.name
ENERGY = schema.ENERGY.name
DCGM_UTIL = schema.GPU_UTILIZATION.dcgm[0].field
DCGM_UTIL_LEGACY = schema.GPU_UTILIZATION.dcgm[0].spellings[1]


def _write(tmp_path: Path, text: str, name: str = "in.om") -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode("utf-8"))
    return path


def _rows(frame: pd.DataFrame) -> list[dict]:
    """Frame rows as dicts without absent labels; NaN values as the string 'nan' (comparable)."""
    out = []
    for rec in frame.to_dict("records"):
        row = {k: v for k, v in rec.items() if not (k not in ("value",) and isinstance(v, float) and math.isnan(v))}
        if math.isnan(row["value"]):
            row["value"] = "nan"
        out.append(row)
    return out


OPENMETRICS = f"""\
# TYPE {UTIL} gauge
# UNIT {UTIL} ratio
# HELP {UTIL} GPU util with a \\\\ backslash and \\n newline in help.
{UTIL}{{hostname="node-a",gpu="0",uuid="GPU-0"}} 0.5 {T0}.0
{UTIL}{{hostname="node-a",gpu="0",uuid="GPU-0"}} 0.75 {T0}.25
{UTIL}{{uuid="GPU-1",gpu="1",hostname="node-a"}} 1 {T0 + 15}
# TYPE truegpu_energy_joules counter
{ENERGY}{{hostname="node-a",gpu="0",uuid="GPU-0"}} 1.5e3 {T0}.5 # {{trace_id="x y"}} 1 {T0}
{ENERGY}{{hostname="node-a",gpu="0",uuid="GPU-0"}} +Inf {T0 + 15}
# TYPE truegpu_gpu_allocation_info gauge
truegpu_gpu_allocation_info{{hostname="node-a",pod="a \\"q\\" b\\\\c\\nd # {{x}}, y",namespace=""}} 1 {T0}
# EOF
"""


def test_openmetrics_file_exact_frame(tmp_path):
    frame, report = read_openmetrics(_write(tmp_path, OPENMETRICS))
    assert list(frame.columns) == ["metric", "timestamp", "value", "hostname", "gpu", "uuid", "pod"]
    assert frame["metric"].dtype == "category" and frame["hostname"].dtype == "category"
    assert frame["timestamp"].dtype == np.float64 and frame["value"].dtype == np.float64
    g0 = {"hostname": "node-a", "gpu": "0", "uuid": "GPU-0"}
    assert _rows(frame) == [
        {"metric": UTIL, "timestamp": T0 + 0.0, "value": 0.5, **g0},
        {"metric": UTIL, "timestamp": T0 + 0.25, "value": 0.75, **g0},
        {"metric": UTIL, "timestamp": T0 + 15.0, "value": 1.0, "hostname": "node-a", "gpu": "1", "uuid": "GPU-1"},
        {"metric": ENERGY, "timestamp": T0 + 0.5, "value": 1500.0, **g0},
        # +Inf parses, but no counter is infinite: unknown, and counted.
        {"metric": ENERGY, "timestamp": T0 + 15.0, "value": "nan", **g0},
        # empty label value = label absent (Prometheus semantics)
        {"metric": "truegpu_gpu_allocation_info", "timestamp": float(T0), "value": 1.0,
         "hostname": "node-a", "pod": 'a "q" b\\c\nd # {x}, y'},
    ]  # fmt: skip
    assert (report.samples, report.series, report.bad_line_count) == (6, 4, 0)
    assert report.exemplars_ignored == 1
    assert report.out_of_range == {ENERGY: 1} and "1 out-of-range values -> NaN" in report.summary()
    assert report.metric_types == {UTIL: "gauge", "truegpu_energy_joules": "counter",
                                   "truegpu_gpu_allocation_info": "gauge"}  # fmt: skip
    assert report.files == [str(tmp_path / "in.om")]


def test_prometheus_text_millisecond_timestamps(tmp_path):
    text = (
        "# HELP DCGM_FI_DEV_GPU_UTIL GPU utilization (in %).\n"
        "# TYPE DCGM_FI_DEV_GPU_UTIL gauge\n"
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",Hostname="n1",modelName="NVIDIA H100"}} 97 {T0}123\n'
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0",UUID="GPU-a",Hostname="n1",modelName="NVIDIA H100"}} 95 {T0 + 15}000\n'
        f'dcgm_fi_dev_gpu_util{{gpu="1",uuid="GPU-b",pod_name="p",pod_namespace="ns"}} 3 {T0}000\n'
    )
    frame, report = read_openmetrics(_write(tmp_path, text, "metrics.prom"))
    assert frame["timestamp"].tolist() == [T0 + 0.123, T0 + 15.0, float(T0)]
    assert frame["value"].tolist() == [97.0, 95.0, 3.0]
    assert frame["metric"].tolist() == [DCGM_UTIL, DCGM_UTIL, DCGM_UTIL_LEGACY]
    assert frame["UUID"].tolist()[:2] == ["GPU-a", "GPU-a"] and pd.isna(frame["UUID"].iloc[2])
    assert frame["pod_namespace"].tolist()[2] == "ns"
    assert report.warnings == [] and report.bad_line_count == 0


def test_unit_detection_rule_and_override(tmp_path):
    # Prometheus text (no # EOF) whose timestamps are below 1e11: seconds.
    seconds = _write(tmp_path, f"m 1 {T0}\nm 2 {T0 + 1}.5\n", "s.prom")
    assert read_openmetrics(seconds)[0]["timestamp"].tolist() == [T0, T0 + 1.5]
    # forced unit
    assert read_openmetrics(seconds, timestamp_unit="ms")[0]["timestamp"].tolist() == [T0 / 1000, (T0 + 1.5) / 1000]
    # OpenMetrics is seconds even when the numbers look like ms, with a warning saying so
    om_ms = _write(tmp_path, f"m 1 {T0}000\n# EOF\n", "ms.om")
    frame, report = read_openmetrics(om_ms)
    assert frame["timestamp"].tolist() == [T0 * 1000.0]
    assert len(report.warnings) == 1 and "milliseconds" in report.warnings[0] and "ms.om" in report.warnings[0]
    assert read_openmetrics(om_ms, timestamp_unit="ms")[0]["timestamp"].tolist() == [float(T0)]
    with pytest.raises(ValueError, match="timestamp_unit"):
        read_openmetrics(om_ms, timestamp_unit="us")  # type: ignore[arg-type]


def test_missing_timestamp_uses_default_or_is_a_bad_line(tmp_path):
    path = _write(tmp_path, f'm{{a="x"}} 1 {T0}000\nm{{a="y z"}} 2\nm 3\n')
    frame, report = read_openmetrics(path)
    assert frame["value"].tolist() == [1.0]
    assert [(b.line_number, b.reason) for b in report.bad_lines] == [
        (2, "no timestamp (and no default_timestamp given)"),
        (3, "no timestamp (and no default_timestamp given)"),
    ]
    frame, report = read_openmetrics(path, default_timestamp=T0 + 60)
    # the explicit timestamp is ms (Prometheus text); the default is unix seconds as given
    assert frame["timestamp"].tolist() == [T0, T0 + 60, T0 + 60]
    assert frame["value"].tolist() == [1.0, 2.0, 3.0]
    assert frame["a"].tolist()[:2] == ["x", "y z"]
    assert report.bad_line_count == 0


def test_a_series_seen_with_a_timestamp_then_without_one(tmp_path):
    """Found by the fuzz test: a key the block already knew, on a line without a timestamp, went to
    the bulk path that expects three fields (IndexError); it is the slow parser's line."""
    path = _write(tmp_path, f'm{{a="x"}} 1 {T0}000\nm{{a="x"}} 2\n')
    frame, report = read_openmetrics(path)
    assert frame["value"].tolist() == [1.0]
    assert [(b.line_number, b.reason) for b in report.bad_lines] == [
        (2, "no timestamp (and no default_timestamp given)")]
    frame, _ = read_openmetrics(path, default_timestamp=T0 + 60)
    assert frame["timestamp"].tolist() == [T0, T0 + 60] and frame["value"].tolist() == [1.0, 2.0]


def test_an_empty_field_is_a_bad_value_not_a_crash(tmp_path):
    """Found by the fuzz test: two spaces before the value left one empty token, which the bulk number reader
    read as the empty JSON list "[]" (no value at all), and the line's arrays no longer lined up (IndexError)."""
    path = _write(tmp_path, f'm{{a="x"}} 2 {T0}000\n# TYPE m gauge\nm{{a="x"}}  NaN\n')
    frame, report = read_openmetrics(path)
    assert frame["value"].tolist() == [2.0]
    assert [(b.line_number, b.reason) for b in report.bad_lines] == [(3, "bad value ''")]


def test_bad_lines_reported_with_line_numbers_and_never_abort(tmp_path):
    good = f'{UTIL}{{gpu="0"}}'
    lines = [
        f"{good} 0.1 {T0}",  # 1 ok
        "this is not a sample",  # 2
        f"{good} abc {T0}",  # 3 bad value on a known key
        f"{good} 0.2 yesterday",  # 4 bad timestamp
        f"{good} 0.3 NaN",  # 5 non-finite timestamp
        f'{UTIL}{{gpu="0",gpu="1"}} 1 {T0}',  # 6 duplicate label
        f'{UTIL}{{gpu="0}}}} 1 {T0}',  # 7 unterminated label value
        f"{good} 0.4 {T0} extra",  # 8 trailing garbage
        "NOT-UTF8",  # 9 replaced by invalid bytes below
        "",  # 10 blank: ignored, not bad
        f"{good} 0.5 {T0 + 1}",  # 11 ok
        "# EOF",  # 12
        f"{good} 0.6 {T0 + 2}",  # 13 after EOF
    ]
    path = tmp_path / "bad.om"
    path.write_bytes(("\n".join(lines) + "\n").encode().replace(b"NOT-UTF8", b'm{a="\xff"} 1 1'))
    frame, report = read_openmetrics(path, max_bad_examples=100)
    assert frame["value"].tolist() == [0.1, 0.5]
    got = [(b.line_number, b.reason) for b in report.bad_lines]
    assert [ln for ln, _ in got] == [2, 3, 4, 5, 6, 7, 8, 9, 13]
    reasons = dict(got)
    assert reasons[3] == "bad value 'abc'"
    assert reasons[4] == "bad timestamp 'yesterday'"
    assert "not finite" in reasons[5] or "timestamp" in reasons[5]
    assert reasons[6] == "duplicate label 'gpu'"
    assert "label" in reasons[7]
    assert "after the timestamp" in reasons[8]
    assert reasons[9].startswith("not UTF-8")
    assert reasons[13] == "content after '# EOF' (line 12)"
    assert report.bad_lines[0].source == str(path) and report.bad_lines[0].text == "this is not a sample"
    assert report.bad_line_count == 9

    # examples are capped, the count is not
    _frame, capped = read_openmetrics(path, max_bad_examples=2)
    assert capped.bad_line_count == 9 and [b.line_number for b in capped.bad_lines] == [2, 3]


def test_fields_that_only_line_up_across_lines_are_still_bad(tmp_path):
    # 3 + 3 tokens over two lines, but line 2 has 5 and line 3 has 1: both bad, not two samples
    frame, report = read_openmetrics(_write(tmp_path, f"a 1 {T0}\nb 2 {T0} c 3\n{T0}\na 4 {T0}\n"))
    assert frame["metric"].tolist() == ["a", "a"] and frame["value"].tolist() == [1.0, 4.0]
    assert [b.line_number for b in report.bad_lines] == [2, 3]


def test_long_bad_line_text_is_truncated(tmp_path):
    _frame, report = read_openmetrics(_write(tmp_path, "x" * 1000 + " y z\n"))
    assert report.bad_line_count == 1 and len(report.bad_lines[0].text) == 200


def test_dcgm_sentinels_become_nan_and_are_counted(tmp_path):
    text = "\n".join([
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0"}} 9223372036854775794 {T0}',  # INT64 NOT_SUPPORTED
        f'DCGM_FI_DEV_GPU_UTIL{{gpu="0"}} 42 {T0 + 1}',
        f'dcgm_fi_dev_gpu_temp{{gpu="0"}} 2147483632 {T0}',  # INT32 BLANK, legacy name
        f'DCGM_FI_DEV_POWER_USAGE{{gpu="0"}} 140737488355328 {T0}',  # FP64 BLANK
        f'DCGM_FI_DEV_SOMETHING_NEW{{gpu="0"}} 9223372036854775807 {T0}',  # unknown field, INT64 range
        f'{schema.MEMORY_USED.name}{{gpu="0"}} 2147483632 {T0}',  # a truegpu value: kept as is
    ]) + "\n"  # fmt: skip
    frame, report = read_openmetrics(_write(tmp_path, text))
    values = frame["value"].tolist()
    assert np.isnan(values[0]) and values[1] == 42.0 and np.isnan(values[2]) and np.isnan(values[3])
    assert np.isnan(values[4]) and values[5] == 2147483632.0
    assert report.sentinels == {"DCGM_FI_DEV_GPU_UTIL": 1, "dcgm_fi_dev_gpu_temp": 1,
                                "DCGM_FI_DEV_POWER_USAGE": 1, "DCGM_FI_DEV_SOMETHING_NEW": 1}  # fmt: skip
    assert report.sentinel_count == 4
    raw, raw_report = read_openmetrics(tmp_path / "in.om", sentinels=False)
    assert raw["value"].iloc[0] == 9223372036854775794.0 and raw_report.sentinels == {}


def test_gzip_is_recognised_by_magic_bytes_not_name(tmp_path):
    plain = _write(tmp_path, OPENMETRICS)
    disguised = tmp_path / "history.txt"
    disguised.write_bytes(gzip.compress(plain.read_bytes()))
    not_gz = tmp_path / "plain.om.gz"
    not_gz.write_bytes(plain.read_bytes())
    expected, _ = read_openmetrics(plain)
    for path in (disguised, not_gz):
        frame, report = read_openmetrics(path, chunk_bytes=64)
        pd.testing.assert_frame_equal(frame, expected)
        assert report.bad_line_count == 0


def test_truncated_gzip_keeps_what_was_read_and_reports_it(tmp_path):
    body = "".join(f'm{{i="{i}"}} {i} {T0 + i}\n' for i in range(5000)).encode()
    path = tmp_path / "cut.om.gz"
    path.write_bytes(gzip.compress(body)[:-200])
    frame, report = read_openmetrics(path, chunk_bytes=4096)
    assert 0 < len(frame) < 5000
    assert frame["value"].tolist() == [float(i) for i in range(len(frame))]
    assert report.bad_line_count == 1 and "unreadable from here on" in report.bad_lines[0].reason


def _messy_file() -> str:
    """Comments, escapes, bad lines, blank lines, exemplars, many series: stresses chunk edges."""
    out = [f"# TYPE {UTIL} gauge", f"# HELP {UTIL} util"]
    for t in range(40):
        for g in range(5):
            out.append(f'{UTIL}{{hostname="n \\"{g}\\"",gpu="{g}"}} {t * 0.01 + g} {T0 + 15 * t}.5')
        if t % 7 == 0:
            out.append(f"garbage line {t}")
            out.append("")
            out.append(f'{UTIL}{{hostname="with space",gpu="9"}} {t}')  # no timestamp
        if t % 11 == 0:
            out.append(f'{ENERGY}{{gpu="0"}} {t} {T0 + t} # {{trace_id="a b"}} 1')
            out.append("# a free comment")
    out.append("# EOF")
    return "\n".join(out) + "\n"


def test_chunk_size_does_not_change_the_result(tmp_path):
    path = _write(tmp_path, _messy_file())
    results = [read_openmetrics(path, chunk_bytes=c, default_timestamp=T0) for c in (1, 7, 64, 1000, 1 << 22)]
    frame, report = results[-1]
    assert len(frame) == 40 * 5 + 6 + 4 and report.bad_line_count == 6
    assert [b.line_number for b in report.bad_lines][:2] == [8, 48]
    for other, other_report in results[:-1]:
        pd.testing.assert_frame_equal(other, frame)
        assert other_report == report


def test_metric_filter_keeps_only_what_is_asked(tmp_path):
    path = _write(tmp_path, OPENMETRICS)
    frame, report = read_openmetrics(path, metric_filter=metric_filter(names=[ENERGY, DCGM_UTIL]))
    assert set(frame["metric"]) == {ENERGY} and list(frame["metric"].cat.categories) == [ENERGY]
    assert report.filtered_samples == 4 and report.missing == [DCGM_UTIL]
    frame, report = read_openmetrics(path, metric_filter=metric_filter(prefixes=["truegpu_gpu_"]))
    assert frame["metric"].tolist() == [UTIL, UTIL, UTIL, "truegpu_gpu_allocation_info"]
    assert "pod" in frame.columns and report.filtered_samples == 2 and report.missing == []
    f = MetricFilter.for_metrics([schema.GPU_UTILIZATION])
    assert f.matches(UTIL) and f.matches(DCGM_UTIL) and f.matches(DCGM_UTIL_LEGACY)
    assert not f.matches(ENERGY)


def test_missing_file_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match=r"nope\.om"):
        read_openmetrics([_write(tmp_path, OPENMETRICS), tmp_path / "nope.om"])


def test_several_files_share_series(tmp_path):
    a = _write(tmp_path, f'm{{g="0"}} 1 {T0}\n# EOF\n', "a.om")
    b = _write(tmp_path, f'm{{g="0"}} 2 {T0}001\n', "b.prom")
    frame, report = read_openmetrics([a, b])
    assert frame["timestamp"].tolist() == [T0, T0 + 0.001] and report.series == 1
    assert report.files == [str(a), str(b)]


def test_empty_input_gives_an_empty_frame(tmp_path):
    frame, report = read_openmetrics(_write(tmp_path, "# EOF\n"))
    assert list(frame.columns) == ["metric", "timestamp", "value"] and len(frame) == 0
    assert report == IngestReport(files=[str(tmp_path / "in.om")])


def test_label_unescaping_and_careful_parser():
    assert unescape_label_value(r"a\\b\"c\nd\te") == 'a\\b"c\nd\\te'
    name, labels, value, ts, exemplar = parse_sample_line('x{a="}",b="1 2"} -Inf 17 # {t="q"} 1')
    assert (name, labels, value, ts, exemplar) == ("x", [("a", "}"), ("b", "1 2")], -math.inf, 17.0, True)


def _simulated(dialect: str):
    from exporter.simulator.dcgm_dialect import DcgmOptions, to_dcgm
    from exporter.simulator.model import Cluster
    from exporter.simulator.scenario import load_scenario

    cluster = Cluster(load_scenario("mixed-fleet"), seed=11)
    times = sample_times(float(cluster.start), float(cluster.start) + 900, 60)
    series = list(cluster.series(times))
    if dialect == "dcgm":
        series = list(to_dcgm(series, times, DcgmOptions(legacy=True)))
    return series, times


@pytest.mark.parametrize("dialect", ["truegpu", "dcgm"])
def test_simulated_history_round_trips(tmp_path, dialect):
    series, times = _simulated(dialect)
    path = tmp_path / "sim.om.gz"
    with gzip.open(path, "wt", encoding="utf-8") as out:
        stats = write_openmetrics(out, series, times)
    frame, report = read_openmetrics(path, chunk_bytes=1 << 16)
    assert report.bad_line_count == 0 and report.samples == stats.samples == len(frame)
    assert report.series == stats.series
    label_cols = [c for c in frame.columns if c not in ("metric", "timestamp", "value")]
    got = {}
    keys = frame[["metric", *label_cols]].astype(object).where(frame[["metric", *label_cols]].notna(), None)
    for key, ts, v in zip(map(tuple, keys.to_numpy()), frame["timestamp"], frame["value"], strict=True):
        got.setdefault(key, {})[ts] = v
    checked = 0
    for family, labels, values in series:
        sample_name = family.family_name + ("_total" if family.type == "counter" else "")
        key = (sample_name, *(labels.get(c) or None for c in label_cols))
        pairs = zip(times.tolist(), np.asarray(values, float).tolist(), strict=True)
        want = {t: v for t, v in pairs if not math.isnan(v)}
        if not want:
            continue
        sentinel = dialect == "dcgm" and any(schema.is_dcgm_sentinel(v) for v in want.values())
        if sentinel:
            want = {t: (math.nan if schema.is_dcgm_sentinel(v) else v) for t, v in want.items()}
        assert got[key].keys() == want.keys(), key
        for t, v in want.items():
            assert (math.isnan(v) and math.isnan(got[key][t])) or got[key][t] == v, (key, t)
        checked += 1
    assert checked == stats.series
