"""Durations and times as typed on command lines and in scenario files."""

from __future__ import annotations

import pytest

from exporter.timeparse import iso, parse_duration, parse_positive_duration, parse_time


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("90", 90), ("90s", 90), ("15m", 900), ("2h", 7200), ("1d", 86400), ("1h30m", 5400), ("500ms", 0.5),
     ("1w", 604800), (" 2H ", 7200), (45, 45.0), ("0", 0.0)],
)
def test_durations(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("bad", ["", "2x", "h", "1h30", "-5m", "nan", True, None, [1]])
def test_bad_durations_name_the_value(bad):
    with pytest.raises(ValueError, match="duration"):
        parse_duration(bad)


def test_positive_duration_rejects_zero():
    with pytest.raises(ValueError, match="greater than zero"):
        parse_positive_duration("0s")


def test_times():
    assert parse_time("1700000000") == 1_700_000_000
    assert parse_time("2024-05-01T12:00:00Z") == parse_time("2024-05-01T12:00:00") == 1_714_564_800
    assert parse_time("2024-05-01T14:00:00+02:00") == 1_714_564_800
    assert parse_time("now", now=1000.0) == 1000.0
    assert parse_time("now-6h", now=100_000.0) == 100_000.0 - 6 * 3600
    assert iso(1_714_564_800) == "2024-05-01T12:00:00Z"
    with pytest.raises(ValueError, match="bad time 'yesterday'"):
        parse_time("yesterday")
