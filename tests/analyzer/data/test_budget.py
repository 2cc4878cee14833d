"""Bounded work: impossible or oversized windows and steps are refused before any query or
allocation, with a message that says what to change; the CLI exits 2."""

from __future__ import annotations

import time

import pytest

from analyzer.data import budget
from analyzer.data.budget import BudgetError, check_rows, check_window
from tests.conftest import free_port
from truegpu.cli import main

DAY = 86400.0


def test_window_and_step_limits() -> None:
    assert check_window(0.0, 3600.0, 15.0) == 240
    assert check_window(0.0, 30 * DAY, 15.0) == 172_800  # a 30-day window at 15 s fits
    with pytest.raises(BudgetError, match=r"below the minimum of 1 s: use --step 15s"):
        check_window(0.0, 1200.0, 0.001)
    with pytest.raises(BudgetError, match=r"over the budget of 200,000: use --step 12h or coarser"):
        check_window(0.0, 100_000 * DAY, 60.0)
    with pytest.raises(BudgetError, match=r"step 100000d is longer than the window .* use a step of at most 1h"):
        check_window(0.0, 3600.0, 100_000 * DAY)
    with pytest.raises(BudgetError, match=r"is empty"):
        check_window(10.0, 10.0, 15.0)
    for end in (float("inf"), float("nan"), 1e30):
        with pytest.raises(BudgetError, match=r"is not between 1970 and 9999"):
            check_window(0.0, end, 15.0)


def test_rows_limit_names_the_fleet_and_the_fix() -> None:
    check_rows(10_000, 240, 15.0)  # 10,000 GPUs x 1 h at 15 s
    with pytest.raises(BudgetError, match=r"100,000 GPUs x 240 steps is 24,000,000 rows.*--step 30s.*--matcher"):
        check_rows(100_000, 240, 15.0)


def test_analyze_refuses_a_millisecond_step_before_reading_much(tmp_path, capsys) -> None:
    path = tmp_path / "two.om"
    path.write_text(
        'truegpu_gpu_utilization_ratio{hostname="n",gpu="0",uuid="G0"} 0.5 1700000000\n'
        'truegpu_gpu_utilization_ratio{hostname="n",gpu="0",uuid="G0"} 0.5 1700001200\n'
    )
    t0 = time.perf_counter()
    assert main(["analyze", "--quiet", "--input", str(path), "--step", "1ms"]) == 2
    assert time.perf_counter() - t0 < 30  # refused, not 22 GB later
    err = capsys.readouterr().err
    assert "below the minimum of 1 s" in err and "Traceback" not in err


def test_analyze_refuses_a_huge_prometheus_window_before_any_query(capsys) -> None:
    # Nothing listens on this port: a query would fail with "cannot reach"; the budget refuses first.
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["analyze", "--quiet", "--prometheus", url, "--start", "now-20000d", "--end", "now",
                 "--step", "60s"]) == 2
    err = capsys.readouterr().err
    assert "steps per series, over the budget" in err and "cannot reach" not in err


def test_report_and_serve_refuse_before_starting(capsys) -> None:
    url = f"http://127.0.0.1:{free_port()}"
    assert main(["report", "--prometheus", url, "--window", "20000d", "--step", "1ms"]) == 2
    assert "below the minimum" in capsys.readouterr().err
    assert main(["serve", "--prometheus", url, "--window", "20000d", "--step", "1ms", "--no-auth",
                 "--listen", f"127.0.0.1:{free_port()}"]) == 2
    assert "below the minimum" in capsys.readouterr().err


def test_limits_are_documented_numbers() -> None:
    assert budget.MAX_STEPS >= 30 * DAY / 15 and budget.MAX_ROWS >= 10_000 * 240
