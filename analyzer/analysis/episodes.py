"""Per-row conditions -> continuous episodes per device: the shared backbone of the detectors.

A detector says, for every row of the tidy frame, whether its condition holds there:
True, False, or unknown (NaN: the signals it needs were not reported). This module turns
that into one episode per continuous problem on one device (uuid + MIG instance, split
when the device changes hands, i.e. when ``job`` changes), so every detector reports
"one finding per continuous problem" the same way:

- a run of True rows starts an episode at its first True row;
- a following True run on the same device continues it when the rows in between hold at
  most ``max_gap_steps`` False rows and unknown rows (NaN rows, or steps with no row at
  all) lasting at most ``max(max_unknown_steps x step, max_unknown_s)``: telemetry that
  is missing is unknown, never a reason to end nor to extend a problem on its own;
- ``max_unknown_s`` (:data:`MAX_UNKNOWN_S`, 300 s) makes that bridge a matter of time, not
  of the analysis step: scrape gaps of a few intervals (a whole node's scrape failing for
  a few minutes, an exporter or Prometheus restart, a rolling upgrade: typically 1-4
  minutes) never split an episode nor restart a detector's timer, whatever the step
  (5 steps at 60 s, 20 at 15 s). Longer silences (a node down for good, hours of lost
  data) do split: nothing says the problem was still there;
- bridged unknown time is not evidence: an episode is kept only when its *known* time
  (``evidence_s``: first True row to the end of the last True row's step, less the
  unknown steps inside) lasts ``min_duration_s``, and ``gpu_hours`` counts that known
  time only (a gap is unknown, not idle);
- an episode is *open* (``end`` None in the finding) when nothing known contradicts it up
  to the end of the data: no False row after it and the data ending within the same
  unknown bridge after it.

Vectorized: run-length encoding with numpy on device-sorted rows; the only Python loops
are per episode (in the detectors), never per row.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analyzer.data.frame import Fleet, category_codes, optional_labels

#: Unknown time (a scrape gap) that never splits an episode, whatever the step: a few scrape
#: intervals of a whole node (failed scrapes, exporter or Prometheus restarts, a rolling
#: upgrade) last 1-4 minutes; 5 minutes covers them and is still shorter than the shortest
#: ``min_duration_s`` of any detector, so a gap can never be most of an episode's evidence.
MAX_UNKNOWN_S = 300.0
#: Identity of a device (a whole GPU or a MIG instance) in the tidy frame.
DEVICE_KEY: tuple[str, ...] = ("hostname", "gpu", "uuid", "gpu_instance")
#: Copied onto each episode from its first True row.
_CARRIED: tuple[str, ...] = ("hostname", "gpu", "uuid", "gpu_instance", "mig_profile", "model", "site", "rack",
                             "namespace", "pod", "container", "job")


def tristate(condition: np.ndarray | pd.Series | Sequence[object]) -> np.ndarray:
    """A condition as float64: 1.0 True, 0.0 False, NaN unknown (accepts bool, float or nullable boolean)."""
    if isinstance(condition, pd.Series):
        return condition.astype("Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    arr = np.asarray(condition)
    if arr.dtype == object:
        return pd.array(arr, dtype="Float64").to_numpy(dtype=np.float64, na_value=np.nan)
    return arr.astype(np.float64)


def column(fleet: Fleet, name: str) -> np.ndarray:
    """A signal column as float64, all NaN (unknown) when the input does not provide it."""
    if name in fleet.frame.columns:
        return fleet.frame[name].to_numpy(dtype=np.float64, na_value=np.nan)
    return np.full(len(fleet.frame), np.nan)


@dataclass
class Episodes:
    """Episodes found in a fleet: ``table`` has one row per episode.

    ``table`` columns: the device identity and allocation of the first True row (strings,
    None when unknown), ``start`` (unix s), ``end`` (unix s, NaN when open), ``open``,
    ``duration_s`` (to ``fleet.end`` when open), ``true_steps``, ``unknown_steps`` (inside
    the episode), ``evidence_s`` (known time: duration less every unknown step, the trailing
    ones of an open episode included), ``gpu_share`` and ``gpu_hours`` (evidence_s x share).
    """

    table: pd.DataFrame
    #: Frame row positions in device-then-time order.
    order: np.ndarray
    #: Per sorted row: the episode it belongs to (-1 outside any), and the condition.
    member: np.ndarray
    cond: np.ndarray

    def __len__(self) -> int:
        return len(self.table)

    def sum(self, values: np.ndarray) -> np.ndarray:
        """Per-episode sum of ``values`` (one per frame row) over every row of its span, NaN as 0."""
        v = np.asarray(values, dtype=np.float64)[self.order]
        sel = self.member >= 0
        return np.bincount(self.member[sel], weights=np.nan_to_num(v[sel]), minlength=len(self.table))

    def last(self, values: np.ndarray) -> np.ndarray:
        """Per-episode value of ``values`` at its latest row that has one (NaN when none): where an open
        episode stands now, which its mean over the whole span lags behind."""
        v = np.asarray(values, dtype=np.float64)[self.order]
        pos = np.flatnonzero((self.member >= 0) & ~np.isnan(v))
        latest = np.full(len(self.table), -1, dtype=np.int64)
        np.maximum.at(latest, self.member[pos], pos)
        return np.where(latest >= 0, v[np.maximum(latest, 0)], np.nan) if len(v) else np.full(len(self.table), np.nan)

    def max(self, values: np.ndarray) -> np.ndarray:
        """Per-episode maximum of ``values`` over every row of its span, NaN skipped (NaN when none)."""
        v = np.asarray(values, dtype=np.float64)[self.order]
        sel = (self.member >= 0) & ~np.isnan(v)
        out = np.full(len(self.table), -np.inf)
        np.maximum.at(out, self.member[sel], v[sel])
        return np.where(np.isneginf(out), np.nan, out)

    def mean(self, values: np.ndarray, where: str = "true") -> np.ndarray:
        """Per-episode mean of ``values`` (one per frame row), NaN skipped.

        ``where="true"``: over the rows where the condition held (what the finding is
        about); ``"all"``: over every row from the episode's first to last True row.
        """
        v = np.asarray(values, dtype=np.float64)[self.order]
        sel = self.member >= 0
        if where == "true":
            sel &= self.cond == 1.0
        sel &= ~np.isnan(v)
        n = len(self.table)
        sums = np.bincount(self.member[sel], weights=v[sel], minlength=n)
        counts = np.bincount(self.member[sel], minlength=n)
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(counts > 0, sums / np.maximum(counts, 1), np.nan)


def begun_earlier(ep: Any, seconds: float) -> Any:
    """Episode ``ep`` (a row of ``Episodes.table``) begun ``seconds`` earlier: a detector's evidence says the
    time before was the same problem (a change point, an earlier spell, earlier runs of a service), so it counts
    toward its duration and evidence too."""
    if seconds <= 0:
        return ep
    return ep._replace(start=float(ep.start) - seconds, duration_s=float(ep.duration_s) + seconds,
                       evidence_s=float(ep.evidence_s) + seconds)


class EarlierRuns:
    """The episodes a service's previous run showed, per entity key (a detector's memory part, ``episodes``:
    ``start``, ``end`` and what the detector keeps), and this run's, kept for the next. Only the previous run's
    count: a run that no longer shows an episode saw it end. None of it without a service (``memory`` None: a
    whole-history analysis holds its episodes whole)."""

    def __init__(self, memory: dict | None) -> None:
        self.before: dict[str, dict[str, Any]] = {} if memory is None else memory.get("episodes", {})
        self.now: dict[str, dict[str, Any]] | None = None if memory is None else {}
        if memory is not None:
            memory["episodes"] = self.now

    def continued(self, key: str, ep: Any, fleet: Fleet, gap_s: float) -> dict[str, Any] | None:
        """The previous run's episode that ``ep`` continues, or None: ``ep`` opens this window (begins within
        ``gap_s`` of its start) and the earlier one reached its start. Why: serve's window cuts every long problem
        at its start, so without this a finding's start, duration and hours moved with the window (a notebook
        idle for hours read "idle for 30 min"), though nothing had changed; the caller counts the time before
        with ``begun_earlier``: the same finding a whole-history analysis gives."""
        entry = self.before.get(key)
        if entry is None or float(ep.start) > fleet.start + gap_s or entry["end"] < float(ep.start):
            return None
        return entry if entry["start"] < float(ep.start) else None

    def keep(self, key: str, ep: Any, fleet: Fleet, **kept: Any) -> None:
        """Remember ``ep`` (as shown: after ``begun_earlier``) for the next run."""
        if self.now is not None:
            self.now[key] = {"start": float(ep.start), "end": fleet.end if ep.open else float(ep.end), **kept}


def device_key(ep: Any) -> str:
    """An episode's device and holder as one key of ``EarlierRuns`` (episodes split where the job changes)."""
    return f"{ep.hostname}/{ep.gpu}/{ep.gpu_instance}/{ep.job}"


def carried_totals(runs: EarlierRuns, ep: Any, fleet: Fleet, gap_s: float,
                   **totals: float) -> tuple[Any, dict[str, float]]:
    """``ep`` and its ``totals`` (GPU-hours, throttled seconds) with the previous run's episode it continues counted
    in (``EarlierRuns.continued``: its time before this window, each total at the rate earlier runs counted it),
    kept for the next run under the episode's ``device_key``."""
    key = device_key(ep)
    entry = runs.continued(key, ep, fleet, gap_s)
    if entry is not None:
        before = float(ep.start) - entry["start"]
        span = max(entry["end"] - entry["start"], fleet.step)
        totals = {k: v + before * entry[k] / span for k, v in totals.items()}
        ep = begun_earlier(ep, before)
    runs.keep(key, ep, fleet, **totals)
    return ep, totals


def union_spans(spans: list[list[float]]) -> list[list[float]]:
    """[start, end] spans sorted, those that overlap or touch joined (what a service's runs saw, kept apart)."""
    out: list[list[float]] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def bridge_steps(step: float, steps: int, seconds: float = MAX_UNKNOWN_S) -> int:
    """How many missing steps an episode bridges: ``steps``, or as many as fit in ``seconds`` (a few
    minutes of scrape gap whatever the step)."""
    return max(int(steps), int(np.floor(max(seconds, 0.0) / step + 1e-6)))


def find_episodes(
    fleet: Fleet,
    condition: np.ndarray | pd.Series,
    *,
    max_gap_steps: int = 2,
    max_unknown_steps: int = 2,
    min_duration_s: float = 300.0,
    split_on: Sequence[str] = ("job",),
    max_unknown_s: float = MAX_UNKNOWN_S,
    timer_unknown_s: float = 0.0,
) -> Episodes:
    """Merge per-row ``condition`` (True/False/NaN, aligned with ``fleet.frame``) into episodes.

    Unknown stretches up to ``max(max_unknown_steps x step, max_unknown_s)`` are bridged
    (module docstring); ``max_unknown_s=0`` gives the step-count rule alone. Kept: known time plus at
    most ``timer_unknown_s`` of the unknown time in it or joining it to an end of the data (``_unknown_ends``)
    reaching ``min_duration_s``, so a long timer runs on through a scrape gap (idle_allocated says why).

    ``split_on`` columns are part of the device key, so an allocation change (another job
    on the GPU) ends one episode and starts another: each finding names one owner.
    """
    frame, step = fleet.frame, float(fleet.step)
    n = len(frame)
    cond = tristate(condition)
    if cond.shape != (n,):
        raise ValueError(f"condition has {cond.shape} values for {n} rows")
    keys = [c for c in (*DEVICE_KEY, *split_on) if c in frame.columns]
    ts = frame["timestamp"].to_numpy(dtype=np.float64)
    dev = _device_ids(frame, keys)
    # The frame contract keeps rows device-major and time-ascending; sort only if not.
    if n > 1 and not (np.all(np.diff(dev) >= 0) and np.all((np.diff(dev) > 0) | (np.diff(ts) > 0))):
        order = np.lexsort((ts, dev))
    else:
        order = np.arange(n)
    d, t, c = dev[order], ts[order], cond[order]
    is_true = c == 1.0
    false_cum = np.cumsum(c == 0.0)

    same_prev = np.zeros(n, bool)
    if n > 1:
        same_prev[1:] = (d[1:] == d[:-1]) & (np.abs(t[1:] - t[:-1] - step) < 1e-6 * max(step, 1.0))
    same_next = np.zeros(n, bool)
    same_next[:-1] = same_prev[1:]
    prev_true = np.zeros(n, bool)
    prev_true[1:] = is_true[:-1]
    next_true = np.zeros(n, bool)
    next_true[:-1] = is_true[1:]
    run_first = np.flatnonzero(is_true & ~(same_prev & prev_true))
    run_last = np.flatnonzero(is_true & ~(same_next & next_true))

    empty = pd.DataFrame(columns=[*_CARRIED, "start", "end", "open", "duration_s", "true_steps", "unknown_steps",
                                  "evidence_s", "gpu_share", "gpu_hours"])
    if not len(run_first):
        return Episodes(empty, order, np.full(n, -1, np.int64), c)

    # Merge run k into run k-1 when on the same device and the gap is short.
    prev_last, next_first = run_last[:-1], run_first[1:]
    gap_steps = np.rint((t[next_first] - t[prev_last]) / step).astype(np.int64) - 1
    gap_false = false_cum[next_first] - false_cum[prev_last]
    gap_unknown = gap_steps - gap_false
    unknown_ok = bridge_steps(step, max_unknown_steps, max_unknown_s)
    merge = (d[next_first] == d[prev_last]) & (gap_false <= max_gap_steps) & (gap_unknown <= unknown_ok)
    new_ep = np.concatenate([[True], ~merge])
    ep_of_run = np.cumsum(new_ep) - 1
    first = run_first[new_ep]
    last = np.concatenate([run_last[:-1][~merge], run_last[-1:]])
    n_ep = len(first)
    run_len = run_last - run_first + 1
    true_steps = np.bincount(ep_of_run, weights=run_len, minlength=n_ep).astype(np.int64)

    start = t[first]
    end = t[last] + step
    is_open = _is_open(fleet, keys, order, d, t, false_cum, last, end, unknown_ok * step)
    duration = np.where(is_open, np.maximum(fleet.end, end), end) - start
    span_steps = np.rint((end - start) / step).astype(np.int64)
    unknown_steps = span_steps - true_steps - (false_cum[last] - false_cum[first])
    # Known time: the span less its unknown steps (an open episode's unknown tail is not known either).
    evidence = (end - start) - unknown_steps * step

    unknown = unknown_steps * step + _unknown_ends(fleet, d, t, c, first, end, is_open, unknown_ok * step)
    keep = evidence + np.minimum(unknown, timer_unknown_s) >= min_duration_s - 1e-6
    first, last, start, end, is_open = first[keep], last[keep], start[keep], end[keep], is_open[keep]
    duration, true_steps, unknown_steps = duration[keep], true_steps[keep], unknown_steps[keep]
    evidence = evidence[keep]

    member = np.full(n, -1, np.int64)
    if len(first):
        mark = np.zeros(n + 1, np.int64)
        np.add.at(mark, first, 1)
        np.add.at(mark, last + 1, -1)
        inside = np.cumsum(mark)[:n] > 0
        starts = np.zeros(n, np.int64)
        starts[first] = 1
        member = np.where(inside, np.cumsum(starts) - 1, -1)

    rows = order[first]
    table = pd.DataFrame(index=range(len(first)))
    for col in _CARRIED:
        if col in frame.columns:
            table[col] = optional_labels(frame[col].iloc[rows].astype(object), table.index)
        else:
            table[col] = None
    share = frame["gpu_share"].to_numpy(dtype=np.float64)[rows] if "gpu_share" in frame.columns else 1.0
    table["start"] = start
    table["end"] = np.where(is_open, np.nan, end)
    table["open"] = is_open
    table["duration_s"] = duration
    table["true_steps"] = true_steps
    table["unknown_steps"] = unknown_steps
    table["evidence_s"] = evidence
    table["gpu_share"] = np.broadcast_to(share, (len(first),)).astype(np.float64)
    table["gpu_hours"] = evidence * table["gpu_share"].to_numpy() / 3600.0
    # Stable output whatever the row order: by device, then time.
    perm = table.sort_values(["hostname", "gpu", "gpu_instance", "start"], kind="stable",
                             key=lambda s: s.fillna("") if s.dtype == object else s).index.to_numpy()
    rank = np.empty(len(perm), np.int64)
    rank[perm] = np.arange(len(perm))
    if len(perm):
        member = np.where(member >= 0, rank[np.maximum(member, 0)], -1)
    return Episodes(table.iloc[perm].reset_index(drop=True), order, member, c)


def _unknown_ends(fleet: Fleet, d: np.ndarray, t: np.ndarray, c: np.ndarray, first: np.ndarray, end: np.ndarray,
                  is_open: np.ndarray, reach_s: float) -> np.ndarray:
    """Per episode, unknown time joining it to either end of the data within bridging reach (``reach_s``): an open
    episode's tail (its device's unknown rows after it, not the time to the cut: serve's cuts fall on its clock's
    minutes, the rows on the data's), and a head of unknown rows of its device (and owner) from the data's start
    (rows of no owner before it are another key: an allocation's start is no gap)."""
    step = float(fleet.step)
    dev_first = np.searchsorted(d, d[first], side="left")
    known_cum = np.concatenate(([0], np.cumsum(~np.isnan(c))))
    head = np.where((dev_first < first) & (known_cum[first] == known_cum[dev_first])
                    & (t[dev_first] - fleet.start < step) & (t[first] - t[dev_first] <= reach_s + 1e-6),
                    t[first] - t[dev_first], 0.0)
    dev_last = np.searchsorted(d, d[first], side="right") - 1
    return head + np.where(is_open, np.maximum(t[dev_last] + step - end, 0.0), 0.0)


def _is_open(fleet: Fleet, keys: Sequence[str], order: np.ndarray, d: np.ndarray, t: np.ndarray,
             false_cum: np.ndarray, last: np.ndarray, end: np.ndarray, bridge_s: float) -> np.ndarray:
    """Open: no False row after the episode on its device, the data ending within ``bridge_s`` after it,
    and the device not held by another owner later (then it changed hands: closed, not unknown)."""
    frame = fleet.frame
    dev_last = np.searchsorted(d, d[last], side="right") - 1
    is_open = (false_cum[dev_last] - false_cum[last] == 0) & (fleet.end - end <= bridge_s + 1e-6)
    if len(keys) > len(phys_keys := [k for k in DEVICE_KEY if k in frame.columns]):
        phys = _device_ids(frame, phys_keys)[order]
        phys_last_t = pd.Series(t).groupby(phys).transform("max").to_numpy()
        is_open &= t[dev_last] >= phys_last_t[last] - 1e-6
    return is_open


def _device_ids(frame: pd.DataFrame, keys: Sequence[str]) -> np.ndarray:
    """One int64 per row identifying (device, split_on...) in the order devices appear."""
    if not keys or not len(frame):
        return np.zeros(len(frame), np.int64)
    codes = [category_codes(frame[k]) + 1 for k in keys]  # NaN (-1) -> 0
    combined = codes[0]
    for c in codes[1:]:  # re-factorize after each key so the combined code never overflows
        combined = pd.factorize(combined * (int(c.max()) + 1) + c, sort=False)[0].astype(np.int64)
    return pd.factorize(combined, sort=False)[0].astype(np.int64)


def format_duration(seconds: float) -> str:
    """``45 min``, ``2.5 h``, ``3.2 d``: durations in summaries."""
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} d"
