"""Per-row conditions -> episodes: gaps, minimum duration, open ends, unknown rows, MIG devices."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.analysis.episodes import find_episodes, format_duration, tristate
from analyzer.data.frame import Fleet
from tests.fleets import STEP, T0, timeline


def runs(pattern: str) -> list[float]:
    """'1' True, '0' False, '?' unknown."""
    return [{"1": 1.0, "0": 0.0, "?": np.nan}[ch] for ch in pattern]


def episodes_of(pattern: str, **kw: object) -> pd.DataFrame:
    fleet = timeline([{"gpu": 0}], len(pattern))
    return find_episodes(fleet, runs(pattern), **kw).table  # type: ignore[arg-type]


def steps_of(table: pd.DataFrame) -> list[tuple[int, int | None]]:
    """(start step, end step or None when open)."""
    return [(round((s - T0) / STEP), None if o else round((e - T0) / STEP))
            for s, e, o in zip(table["start"], table["end"], table["open"], strict=True)]


def test_one_run_is_one_closed_episode() -> None:
    t = episodes_of("0011111110", min_duration_s=300)
    assert steps_of(t) == [(2, 9)]
    assert t["duration_s"].tolist() == [7 * STEP]
    assert t["true_steps"].tolist() == [7]


def test_short_gaps_are_tolerated_long_gaps_split() -> None:
    assert steps_of(episodes_of("1111100111110", min_duration_s=60)) == [(0, 12)]
    assert steps_of(episodes_of("1111100011111", min_duration_s=60)) == [(0, 5), (8, None)]
    assert steps_of(episodes_of("1111100011111", max_gap_steps=3, min_duration_s=60)) == [(0, None)]
    assert steps_of(episodes_of("111110111110", max_gap_steps=0, min_duration_s=60)) == [(0, 5), (6, 11)]


def test_minimum_duration() -> None:
    assert steps_of(episodes_of("0111100", min_duration_s=300)) == []
    assert steps_of(episodes_of("01111100", min_duration_s=300)) == [(1, 6)]
    # Tolerated gaps count towards the duration (first True row to end of the last).
    assert steps_of(episodes_of("1100110", min_duration_s=360)) == [(0, 6)]


def test_open_end() -> None:
    assert steps_of(episodes_of("0001111111", min_duration_s=300)) == [(3, None)]
    assert steps_of(episodes_of("000111111?", min_duration_s=300)) == [(3, None)]  # unknown tail: still open
    assert steps_of(episodes_of("00011111110", min_duration_s=300)) == [(3, 10)]  # known False: closed
    # data lost for longer than the bridge: not open (3 minutes are within the 5-minute bridge)
    assert steps_of(episodes_of("0001111111???", min_duration_s=300)) == [(3, None)]
    assert steps_of(episodes_of("0001111111??????", min_duration_s=300)) == [(3, 10)]
    assert steps_of(episodes_of("0001111111???", min_duration_s=300, max_unknown_s=0)) == [(3, 10)]
    t = episodes_of("0001111111", min_duration_s=300)
    assert np.isnan(t["end"].iloc[0]) and bool(t["open"].iloc[0])


def test_unknown_rows_bridge_only_short_gaps_and_never_start_an_episode() -> None:
    assert steps_of(episodes_of("11111??111110", min_duration_s=60)) == [(0, 12)]
    assert steps_of(episodes_of("11111???11111", min_duration_s=60, max_unknown_s=0)) == [(0, 5), (8, None)]
    assert steps_of(episodes_of("11111??????11111", min_duration_s=60)) == [(0, 5), (11, None)]
    assert steps_of(episodes_of("??????????", min_duration_s=60)) == []
    t = episodes_of("11111??11111", min_duration_s=60)
    assert t["unknown_steps"].tolist() == [2]


def test_missing_rows_are_unknown_steps() -> None:
    fleet = timeline([{"gpu": 0}], 12, drop={0: [5, 6]})
    cond = np.ones(len(fleet.frame))
    t = find_episodes(fleet, cond, min_duration_s=60).table
    assert steps_of(t) == [(0, None)]
    fleet = timeline([{"gpu": 0}], 12, drop={0: [4, 5, 6]})
    t = find_episodes(fleet, np.ones(len(fleet.frame)), min_duration_s=60, max_unknown_s=0).table
    assert steps_of(t) == [(0, 4), (7, None)]


@pytest.mark.parametrize("step", [15.0, 60.0])
def test_scrape_gaps_up_to_five_minutes_are_bridged_whatever_the_step(step: float) -> None:
    """A 4-minute gap never splits nor restarts: one episode, its start the first True row; the gap is
    neither evidence (min_duration_s counts known time) nor GPU-hours; 6 minutes of silence do split."""
    n_gap = round(240 / step)
    pattern = "0" + "1" * round(1200 / step) + "?" * n_gap + "1" * round(600 / step) + "0"
    fleet = timeline([{"gpu": 0}], len(pattern), step=step)
    t = find_episodes(fleet, runs(pattern), min_duration_s=1800).table
    assert len(t) == 1 and t["start"].iloc[0] == T0 + step and t["unknown_steps"].iloc[0] == n_gap
    assert t["evidence_s"].iloc[0] == pytest.approx(1800.0)
    assert t["gpu_hours"].iloc[0] == pytest.approx(0.5)
    # Known time 29 minutes: not yet half an hour of evidence, though 33 minutes passed.
    short = "0" + "1" * round(1140 / step) + "?" * n_gap + "1" * round(600 / step) + "0"
    fleet = timeline([{"gpu": 0}], len(short), step=step)
    assert find_episodes(fleet, runs(short), min_duration_s=1800).table.empty
    long_gap = "0" + "1" * round(1200 / step) + "?" * round(360 / step) + "1" * round(1800 / step)
    fleet = timeline([{"gpu": 0}], len(long_gap), step=step)
    assert len(find_episodes(fleet, runs(long_gap), min_duration_s=600).table) == 2


def test_mig_instances_and_gpus_are_separate_devices() -> None:
    devs = [
        {"gpu": 0, "gpu_instance": "1", "mig_profile": "1g.10gb", "uuid": "GPU-x"},
        {"gpu": 0, "gpu_instance": "2", "mig_profile": "3g.40gb", "uuid": "GPU-x"},
        {"gpu": 1},
    ]
    fleet = timeline(devs, 10)
    cond = np.concatenate([runs("1111111111"), runs("0000011111"), runs("1111100000")])
    t = find_episodes(fleet, cond, min_duration_s=300).table.sort_values(["gpu", "gpu_instance"])
    assert t["gpu_instance"].tolist() == ["1", "2", ""]
    assert steps_of(t) == [(0, None), (5, None), (0, 5)]
    assert t["gpu_share"].tolist() == pytest.approx([1 / 7, 3 / 7, 1.0])
    assert t["gpu_hours"].tolist() == pytest.approx([10 / 60 / 7, 5 / 60 * 3 / 7, 5 / 60])
    # A run on one device never continues on the next one in row order.
    cond = np.concatenate([runs("0000000111"), runs("1110000000"), runs("0000000000")])
    assert find_episodes(fleet, cond, min_duration_s=60).table.shape[0] == 2


def test_allocation_change_splits_and_episode_carries_its_owner() -> None:
    jobs = ["a"] * 5 + ["b"] * 5
    fleet = timeline([{"gpu": 0, "job": jobs, "namespace": "ns", "pod": [f"pod-{j}" for j in jobs]}], 10)
    t = find_episodes(fleet, np.ones(10), min_duration_s=60).table
    assert t["job"].tolist() == ["a", "b"] and t["pod"].tolist() == ["pod-a", "pod-b"]
    assert t["namespace"].tolist() == ["ns", "ns"]
    assert steps_of(t) == [(0, 5), (5, None)]


def test_an_episode_without_an_owner_carries_none_beside_one_with_an_owner() -> None:
    """An unallocated GPU's episode (a GPU lost with its labels, unowned capacity) says None, not NaN, even next
    to an owned one (pandas 3 infers a string column whose missing value is NaN: "job nan" in a summary, and a
    crash where the CLI measured the column's width)."""
    fleet = timeline([{"gpu": 0, "job": None}, {"gpu": 1, "job": "a", "namespace": "ns", "pod": "pod-a"}], 10)
    t = find_episodes(fleet, np.ones(20), min_duration_s=60).table
    assert [(ep.gpu, ep.job, ep.namespace, ep.pod) for ep in t.itertuples(index=False)] == [
        ("0", None, None, None), ("1", "a", "ns", "pod-a")]


def test_unsorted_frame_gives_the_same_episodes() -> None:
    fleet = timeline([{"gpu": 0}, {"gpu": 1}], 12)
    cond = np.concatenate([runs("001111111100"), runs("111100111111")])
    want = find_episodes(fleet, cond, min_duration_s=60).table
    perm = np.random.default_rng(0).permutation(len(fleet.frame))
    shuffled = Fleet(frame=fleet.frame.iloc[perm].reset_index(drop=True), step=STEP, start=fleet.start, end=fleet.end)
    got = find_episodes(shuffled, cond[perm], min_duration_s=60).table
    pd.testing.assert_frame_equal(got.reset_index(drop=True), want.reset_index(drop=True))


def test_mean_over_true_rows_and_over_the_span() -> None:
    fleet = timeline([{"gpu": 0, "x": [1.0, 2.0, 3.0, 100.0, 5.0, None, 7.0, 0.0]}], 8)
    eps = find_episodes(fleet, runs("11101110"), min_duration_s=60)
    assert len(eps) == 1
    assert eps.mean(fleet.frame["x"].to_numpy()) == pytest.approx([(1 + 2 + 3 + 5 + 7) / 5])  # NaN skipped
    assert eps.mean(fleet.frame["x"].to_numpy(), where="all") == pytest.approx([(1 + 2 + 3 + 100 + 5 + 7) / 6])


def test_last_is_where_each_episode_stands_now() -> None:
    """The latest known value in each episode's span (what a suspected finding is judged on), NaN skipped."""
    fleet = timeline([{"gpu": 0, "x": [1.0, 2.0, 9.0, 0.0, 0.0, 4.0, 6.0, None]},
                      {"gpu": 1, "x": [None] * 8}], 8)
    eps = find_episodes(fleet, runs("11100111") + runs("11110000"), min_duration_s=60, max_gap_steps=0)
    assert len(eps) == 3
    last = eps.last(fleet.frame["x"].to_numpy())
    assert last[:2].tolist() == [9.0, 6.0] and np.isnan(last[2])  # the open one's last row is NaN: 6.0


def test_condition_length_is_checked_and_tristate_accepts_nullable_booleans() -> None:
    fleet = timeline([{"gpu": 0}], 5)
    with pytest.raises(ValueError, match="condition"):
        find_episodes(fleet, np.ones(4))
    got = tristate(pd.Series([True, False, None], dtype="boolean"))
    assert got[:2].tolist() == [1.0, 0.0] and np.isnan(got[2])


def test_format_duration() -> None:
    assert format_duration(45 * 60) == "45 min"
    assert format_duration(2.5 * 3600) == "2.5 h"
    assert format_duration(4 * 86400) == "4.0 d"
