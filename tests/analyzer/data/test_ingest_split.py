"""One file read by several processes (analyzer.data.ingest.split) gives exactly what one process reads:
the frame, every report field and every line number, wherever the cuts fall."""

from __future__ import annotations

import dataclasses
import gzip
import os
import subprocess
import sys
import threading
from pathlib import Path

import pandas as pd
import pytest

from analyzer.data.ingest import read_openmetrics, split
from analyzer.data.ingest.openmetrics import OpenMetricsReader
from analyzer.data.ingest.split import byte_ranges
from analyzer.data.load import load_files, metric_filter
from exporter import schema
from exporter.simulator import Cluster, load_scenario
from exporter.simulator.history import Mess, write_history

T0 = 1_700_000_000
UTIL = schema.GPU_UTILIZATION.name
TEMP = schema.TEMPERATURE.name
DCGM_TEMP = schema.TEMPERATURE.dcgm[0].field


def _messy(eof_at: float | None = None, ms_from: float | None = None) -> str:
    """A history with what a cut can fall among: HA copies, repeats and conflicts of one sample, DCGM sentinels,
    out-of-range values, bad lines, a sample without a timestamp, an exemplar, a family the filter drops, series
    first seen late; ``# EOF`` after the first ``eof_at`` of the lines (content after it), timestamps in ms from
    the ``ms_from`` share of the lines on."""
    lines = [f"# TYPE {UTIL} gauge"]
    for t in range(40):
        for gpu in range(4):
            labels = f'hostname="n1",gpu="{gpu}"'
            lines.append(f"{UTIL}{{{labels}}} {0.5 + 0.01 * gpu} {T0 + 15 * t}")
            if gpu == 0:  # an HA pair, the second replica 5 s later
                lines.append(f'{UTIL}{{{labels},replica="b"}} 0.6 {T0 + 15 * t + 5}')
        if t % 7 == 3:
            lines.append(f'{UTIL}{{hostname="n1",gpu="1"}} 0.51 {T0 + 15 * t}')  # repeated exactly
            lines.append(f'{UTIL}{{hostname="n1",gpu="2"}} 0.9 {T0 + 15 * t}')  # a conflict
        if t == 11:
            lines += [f'{UTIL}{{hostname="n1",gpu="3"}} nope {T0}', f'{UTIL}{{hostname="n1" 1 {T0}',
                      f'{UTIL}{{hostname="n1",gpu="3"}} 0.2 {T0 + 15 * t} # {{trace_id="x"}} 1']
        if t == 23:
            lines += [f'{UTIL}{{hostname="n9",gpu="0"}} 0.3', f"{UTIL}{{hostname=\"n1\",gpu=\"0\"}} 7 {T0 + 15 * t}"]
    lines.append(f"# TYPE {DCGM_TEMP} gauge")
    for t in range(40):
        for gpu in range(3):
            value = "9223372036854775794" if (t, gpu) == (5, 1) else f"{40 + t % 5}"
            lines.append(f'{DCGM_TEMP}{{Hostname="n2",gpu="{gpu}",modelName="H100"}} {value} {T0 + 15 * t}')
        lines.append(f'unrelated_total{{x="{t}"}} {t} {T0 + 15 * t}')
        if t in (20, 38):
            lines.append(f'{DCGM_TEMP}{{Hostname="n2",gpu="0"}} 41 {T0 + 15 * t}x')
    lines.append(f'{TEMP}{{hostname="n3",gpu="0"}} 55 {T0 + 600}')
    if ms_from is not None:
        cut = int(len(lines) * ms_from)
        lines[cut:] = [_in_ms(line) for line in lines[cut:]]
    if eof_at is not None:
        lines.insert(int(len(lines) * eof_at), "# EOF")
    return "\n".join(lines) + "\n"


def _in_ms(line: str) -> str:
    parts = line.rsplit(" ", 1)
    return line if line.startswith("#") or not parts[1].isdigit() else f"{parts[0]} {int(parts[1]) * 1000}"


def _read(path: Path, workers: int, part_bytes: int = 1) -> tuple[pd.DataFrame, dict]:
    frame, report = read_openmetrics(path, metric_filter=metric_filter(), default_timestamp=T0 + 900,
                                     workers=workers, min_part_bytes=part_bytes)
    return frame, dataclasses.asdict(report)


def _same(path: Path, workers: int, part_bytes: int) -> dict:
    """Read ``path`` in one process and in ``workers``; assert the frames and reports equal; the split report."""
    frame, report = _read(path, 1)
    split_frame, split_report = _read(path, workers, part_bytes)
    pd.testing.assert_frame_equal(split_frame, frame)
    assert report.pop("worker_parts") == 0
    parts = split_report.pop("worker_parts")
    assert split_report == report
    split_report["worker_parts"] = parts
    return split_report


def check_split_reads_exactly_what_one_process_reads(tmp_path: Path, workers: int) -> None:
    path = tmp_path / "h.prom"
    path.write_text(_messy())
    size = path.stat().st_size
    for shift in (0, 37, 411):  # cuts in other places: inside HA pairs, repeats, bad lines, the DCGM family
        report = _same(path, workers, size // workers - shift)
        assert report["worker_parts"] == workers - 1
    assert report["duplicates"] and report["conflicts"] and report["sentinels"] and report["out_of_range"]
    assert report["replicas"] == {"replica": {"b"}} and report["filtered_samples"] == 40
    assert report["exemplars_ignored"] == 1 and report["bad_line_count"] == 4
    assert [b["line_number"] for b in report["bad_lines"]] == [66, 67, 304, 377]


def check_split_timestamp_unit_decided_over_the_whole_file(tmp_path: Path) -> None:
    """Only the last range holds millisecond timestamps: the file is in ms, the first range's divided too."""
    path = tmp_path / "h.prom"
    path.write_text(_messy(ms_from=0.8))
    report = _same(path, 2, path.stat().st_size // 2)
    assert report["worker_parts"] == 1
    frame, _ = _read(path, 2, path.stat().st_size // 2)
    assert frame["timestamp"].iloc[0] == T0 / 1000  # the first range's seconds divided too


def check_split_content_after_eof_is_reported_as_one_process_does(tmp_path: Path, eof_at: float) -> None:
    path = tmp_path / "h.om"
    path.write_text(_messy(eof_at=eof_at))
    report = _same(path, 3, path.stat().st_size // 3)
    assert report["bad_line_count"] > 3 and "after '# EOF'" in report["bad_lines"][-1]["reason"]
    # the range holding # EOF and content after it, and those after it, are read by the reader itself
    assert report["worker_parts"] == (1 if eof_at == 0.95 else 0)


def check_split_eof_at_the_end_is_an_openmetrics_file(tmp_path: Path) -> None:
    path = tmp_path / "h.om"
    path.write_text(_messy() + "# EOF\n")
    report = _same(path, 2, path.stat().st_size // 2)
    assert report["worker_parts"] == 1 and report["warnings"] == []


def check_a_failed_worker_range_is_read_by_the_reader(tmp_path: Path, how: str) -> None:
    path = tmp_path / "h.prom"
    path.write_text(_messy())

    def broken(self, path, span):
        if how == "dies":
            os._exit(3)
        raise RuntimeError("disk on fire")

    frame, report = _read(path, 1)
    OpenMetricsReader._read_part = broken  # a fresh process: nothing else reads after this
    split_frame, split_report = _read(path, 2, path.stat().st_size // 2)
    pd.testing.assert_frame_equal(split_frame, frame)
    assert split_report["worker_parts"] == 0
    (warning,) = split_report.pop("warnings")
    report.pop("warnings")
    assert split_report == report  # every count and line number as read in one process
    assert ("disk on fire" if how == "raises" else "exit code 3") in warning and "read by the main process" in warning


def check_a_worker_dying_half_way_through_sending_fails_loudly(tmp_path: Path) -> None:
    """Killed (for memory) after sending part of what it read: the read fails and says what to do, never a
    silently shorter read."""
    path = tmp_path / "h.prom"
    path.write_text(_messy())
    real = OpenMetricsReader._read_part

    class Dying(dict):
        def items(self):
            yield next(iter(super().items()))
            os._exit(9)

    def dying(self, path, span):
        part, pieces = real(self, path, span)
        return part, Dying(pieces)

    OpenMetricsReader._read_part = dying  # a fresh process: nothing else reads after this
    with pytest.raises(RuntimeError, match=r"exit code 9\): read with one process \(--workers 1\)"):
        _read(path, 2, path.stat().st_size // 2)

def check_no_split_for_gzip_small_files_or_a_threaded_process(tmp_path: Path) -> None:
    text = _messy().encode()
    plain, packed = tmp_path / "h.prom", tmp_path / "h.prom.gz"
    plain.write_bytes(text)
    packed.write_bytes(gzip.compress(text))
    assert len(byte_ranges(plain, 4, 1000)) == 4
    assert byte_ranges(plain, 4, len(text)) == [(0, len(text))]  # a range would be smaller than asked
    assert byte_ranges(packed, 4, 1) == [(0, packed.stat().st_size)]
    assert byte_ranges(plain, 1, 1) == [(0, len(text))]
    assert split.text_bytes(plain) == len(text) and split.text_bytes(packed) >= len(text)  # its recorded size
    cuts = byte_ranges(plain, 4, 1000)
    assert all(text[a - 1:a] == b"\n" for a, _ in cuts[1:]) and cuts[-1][1] == len(text)
    done = threading.Event()
    other = threading.Thread(target=done.wait)
    other.start()
    try:  # forking now could copy a lock the other thread holds
        assert byte_ranges(plain, 4, 1000) == [(0, len(text))]
    finally:
        done.set()
        other.join()


def check_load_files_split_gives_the_same_fleet(tmp_path: Path) -> None:
    """The analyzer's whole read of a messy simulated history (HA pair, two scrape jobs, gaps, repeats), in one
    process and in three."""
    scenario = load_scenario("messy-telemetry")
    cluster = Cluster(scenario)
    path = tmp_path / "messy.om"
    write_history(path, cluster, cluster.start, cluster.start + 1800, 15.0, mess=Mess(**scenario.mess))
    one = load_files(path, workers=1)
    split.MIN_PART_BYTES = path.stat().st_size // 4  # a fresh process
    assert read_openmetrics(path, workers=3)[1].worker_parts == 2
    three = load_files(path, workers=3)
    pd.testing.assert_frame_equal(three.frame, one.frame)
    assert three.notes == one.notes and three.step == one.step and three.missing == one.missing


def check_several_files_read_at_once(tmp_path: Path) -> None:
    """Several files, each whole or in ranges, read on several cores: a gzip one (whole, by a worker), a plain
    one cut in ranges, an OpenMetrics one with content after its ``# EOF``, one in milliseconds: what one process
    reads, file by file (each its own unit and ``# EOF``), in order."""
    texts = [_messy(), _messy(eof_at=0.5), _messy(ms_from=0.0), _messy() + "# EOF\n"]
    paths = [tmp_path / "a.prom.gz", tmp_path / "b.om", tmp_path / "c.prom", tmp_path / "d.om"]
    paths[0].write_bytes(gzip.compress(texts[0].encode()))
    for path, text in zip(paths[1:], texts[1:], strict=True):
        path.write_text(text)
    small = min(p.stat().st_size for p in paths) // 2

    def read(workers: int) -> tuple[pd.DataFrame, dict]:
        frame, report = read_openmetrics(paths, metric_filter=metric_filter(), default_timestamp=T0 + 900,
                                         workers=workers, min_part_bytes=small)
        return frame, dataclasses.asdict(report)

    frame, report = read(1)
    for workers in (2, 3):
        split_frame, split_report = read(workers)
        pd.testing.assert_frame_equal(split_frame, frame)
        assert split_report.pop("worker_parts") > 0
        assert {**split_report, "worker_parts": 0} == report
    assert report["files"] == [str(p) for p in paths] and report["bad_line_count"] > 8

# The checks run in a fresh interpreter each: pytest-xdist's workers run threads, and the reader never forks a
# process with other threads running (split.byte_ranges), so in a worker it would read every file in one process.
ROOT = Path(__file__).resolve().parents[3]


def _fresh(tmp_path: Path, check: str, *args: object) -> None:
    code = ("import sys; from pathlib import Path; sys.path.insert(0, sys.argv[1]); "
            f"from tests.analyzer.data import test_ingest_split as t; t.{check}(Path(sys.argv[2]), *{args!r})")
    done = subprocess.run([sys.executable, "-c", code, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                          timeout=600, cwd=ROOT)
    assert done.returncode == 0, f"{check}{args}:\n{done.stdout[-3000:]}{done.stderr[-6000:]}"


@pytest.mark.parametrize("workers", [2, 3, 5])
def test_split_reads_exactly_what_one_process_reads(tmp_path, workers):
    _fresh(tmp_path, "check_split_reads_exactly_what_one_process_reads", workers)


def test_split_timestamp_unit_decided_over_the_whole_file(tmp_path):
    _fresh(tmp_path, "check_split_timestamp_unit_decided_over_the_whole_file")


@pytest.mark.parametrize("eof_at", [0.2, 0.6, 0.95])
def test_split_content_after_eof_is_reported_as_one_process_does(tmp_path, eof_at):
    _fresh(tmp_path, "check_split_content_after_eof_is_reported_as_one_process_does", eof_at)


def test_split_eof_at_the_end_is_an_openmetrics_file(tmp_path):
    _fresh(tmp_path, "check_split_eof_at_the_end_is_an_openmetrics_file")


@pytest.mark.parametrize("how", ["raises", "dies"])
def test_a_failed_worker_range_is_read_by_the_reader(tmp_path, how):
    _fresh(tmp_path, "check_a_failed_worker_range_is_read_by_the_reader", how)


def test_no_split_for_gzip_small_files_or_a_threaded_process(tmp_path):
    _fresh(tmp_path, "check_no_split_for_gzip_small_files_or_a_threaded_process")


def test_load_files_split_gives_the_same_fleet(tmp_path):
    _fresh(tmp_path, "check_load_files_split_gives_the_same_fleet")


def test_several_files_read_at_once(tmp_path):
    _fresh(tmp_path, "check_several_files_read_at_once")


def test_a_worker_dying_half_way_through_sending_fails_loudly(tmp_path):
    _fresh(tmp_path, "check_a_worker_dying_half_way_through_sending_fails_loudly")
