"""The service's window kept between ticks, so each tick loads only the steps it has not seen.

``WindowLoader(loader)`` is a Loader ``(start, end) -> Fleet`` (analyzer.service.loop) for a window that
slides forward. It keeps the last window (analyzer.data.grid) and on the next call loads only
``[previous end - overlap steps, end)``, keeps the older rows still inside ``[start, end)`` and rebuilds
what depends on the whole window. The result is the Fleet a full load of ``[start, end)`` gives
(tests/analyzer/service/test_incremental.py checks it tick by tick against a real Prometheus):

- rows from the new load's start on come from it: its first rows are re-read because the previous load
  saw them with an incomplete next sample (counter rates, XID increases) and late samples;
- allocations held over rows without data (analyzer.data.coverage.hold_allocations) are recomputed over
  the whole window from the allocations of rows with telemetry;
- XID events before the new load's start are the kept ones, from its start on the new load's;
- the window has the devices, signal columns and topology a full load would see in ``[start, end)``;
  the missing-signal reasons are the new load's where the window's signals look the same; the notes
  are those of the loads that gave the window's rows (their counts are per load);
- a device back from a scrape gap that began before the new load's start is read again from its last
  row before the gap: a counter's first sample after the gap would otherwise look like a new series.

A full load instead: the first call; a window that no longer overlaps the kept one (a gap since the
last good tick longer than the window), or another step, window length or grid; and whenever the splice
cannot be known to equal a full load: a device's identity (UUID, model, MIG layout, placement), topology
or a pod's workload changed, the dialect or the signals' presence changed, a signal or a device seen
only through other series than telemetry whose last sample may or may not be inside the window (last
seen in a load straddling the window start), allocations on rows without telemetry, or a device scraped
less often than the step (its rows between samples hold its last one: analyzer.data.coverage.HELD; a few
new steps hold too few of its samples to know its spacing). Two things are
assumed, as truegpu's exporter and dcgm-exporter give them: a device's allocation and its other series
come with its telemetry (one scrape), so a device seen with telemetry stopped reporting with it.
Samples arriving later than the overlap are not re-read (Prometheus ingests in order).

One known difference, a fault of the full load: a window starting inside a GPU's scrape gap reads its
XID counter's first sample after the gap as a new series, an XID that did not happen (for the ticks
the window start is there); the kept window has the counter's samples before the gap.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd

from analyzer.data.coverage import HELD, held_rows
from analyzer.data.frame import EVENT_COLUMNS, TOPOLOGY_COLUMNS, Fleet, merged_accounting, timed_between
from analyzer.data.grid import IDENTITY, Grid, splice, to_grid
from analyzer.data.mig import with_uncarved, without_uncarved
from analyzer.data.signals import SIGNALS

log = logging.getLogger(__name__)

#: Steps before the previous end that each tick reads again.
OVERLAP = 2


class Reload(Exception):
    """This tick needs a full load; the message says why."""


@dataclass(frozen=True)
class _Seen:
    """Per device: its last sample lies after ``since`` (the start of the last load that had it) and before
    ``gone`` (the start of the first load after that without it; inf: the newest load has it); ``quiet``:
    that load had it without telemetry (other series only)."""

    since: np.ndarray
    gone: np.ndarray
    quiet: np.ndarray

    def take(self, rows: np.ndarray) -> _Seen:
        return _Seen(self.since[rows], self.gone[rows], self.quiet[rows])


@dataclass(frozen=True)
class _Kept:
    """The window between ticks: rows with the allocations of rows with telemetry (held ones recomputed)."""

    grid: Grid
    #: When loads saw each device of ``grid``.
    seen: _Seen
    #: Value column -> (since, gone), as for devices.
    columns: dict[str, tuple[float, float]]
    events: pd.DataFrame
    topology: pd.DataFrame
    #: Slurm accounting of the window's workloads (Fleet.accounting).
    accounting: pd.DataFrame
    #: Holders of shared GPUs per step (Fleet.shares).
    shares: pd.DataFrame
    dialect: str
    missing: dict[str, str]
    #: (first row it gave, its notes) per load that gave rows of the window.
    notes: tuple[tuple[float, tuple[str, ...]], ...]
    #: False: the last full load had allocations without telemetry, which a splice cannot reproduce.
    exact: bool
    #: The last full load held a device's samples over rows without one of their own.
    held: bool = False


class WindowLoader:
    """A Loader that keeps the window between calls and loads only what it has not seen (module doc).

    ``loader(start, end)`` loads ``[start, end)`` in full (e.g. analyzer.service.loop.prometheus_loader);
    ``full_loads``, ``incremental_loads`` and ``last_reason`` say how calls were served.
    """

    def __init__(self, loader: Callable[[float, float], Fleet], *, overlap: int = OVERLAP) -> None:
        if overlap < 1:
            raise ValueError(f"overlap must be at least 1 step, not {overlap}")
        self.loader = loader
        self.overlap = int(overlap)
        self.full_loads = 0
        self.incremental_loads = 0
        self.last_reason: str | None = None
        self._kept: _Kept | None = None

    def __call__(self, start: float, end: float) -> Fleet:
        start, end = float(start), float(end)
        reason = self._why_full(start, end)
        if reason is None:
            assert self._kept is not None
            try:
                fleet, self._kept = self._advance(self._kept, start, end)
            except Reload as why:
                reason = str(why)
            else:
                self.incremental_loads += 1
                return fleet
        fleet = self.loader(start, end)
        self._kept = _kept_of_full(fleet, start, end)
        self.full_loads += 1
        self.last_reason = reason
        log.log(logging.DEBUG if self.full_loads == 1 else logging.INFO, "full load of the window: %s", reason)
        return fleet

    def _why_full(self, start: float, end: float) -> str | None:
        kept = self._kept
        if kept is None:
            return "nothing kept yet"
        if not kept.exact:
            return "the last full load had allocations on rows without telemetry"
        if kept.held:
            return "a device is scraped less often than the step: its held rows need the whole window"
        g = kept.grid
        if not math.isclose(end - start, g.end - g.start) or not math.isclose(g.index(start) * g.step, start - g.start):
            return "another window length or step grid"
        if start < g.start or end < g.end:
            return "the window moved back"
        if g.end - self.overlap * g.step < start:
            return "the window no longer overlaps the kept one"
        return None

    def _advance(self, kept: _Kept, start: float, end: float) -> tuple[Fleet, _Kept]:
        step = kept.grid.step
        cut = fresh_cut = kept.grid.end - self.overlap * step
        fresh: Grid | None = None
        while True:
            chunk = self.loader(cut, end)
            if chunk.step != step or chunk.start != cut or chunk.end != end:
                raise Reload(f"the load of [{cut:.0f}, {end:.0f}) came back as [{chunk.start:.0f}, {chunk.end:.0f}) "
                             f"at step {chunk.step:g}s")
            if HELD in chunk.frame.columns:
                raise Reload("a device is scraped less often than the step: its held rows need the whole window")
            new = _grid(chunk, cut, end)
            fresh = new if fresh is None else fresh
            back = _returning(kept.grid, new, start, cut)
            if back is None:
                break
            cut = back
        grid = _compose(kept, new, start, cut, end)
        grid, seen = _devices_in_window(kept, fresh, grid, start, fresh_cut)
        grid, columns = _columns_in_window(kept, fresh, grid, start, fresh_cut)
        fleet, topology, notes = _finish(kept, grid, chunk, new, start, cut, end)
        return fleet, replace(kept, grid=grid, seen=seen, columns=columns, events=fleet.events, topology=topology,
                              accounting=fleet.accounting, shares=fleet.shares, missing=dict(fleet.missing),
                              notes=notes)


def _grid(fleet: Fleet, start: float, end: float) -> Grid:
    """The load's grid, checked to be one a splice reproduces."""
    try:
        grid = to_grid(without_uncarved(fleet.frame), start, end, fleet.step)
    except ValueError as exc:
        raise Reload(str(exc)) from None
    if not _alloc_with_telemetry(grid):
        raise Reload("allocations on rows without telemetry")
    return grid


def _alloc_with_telemetry(grid: Grid) -> bool:
    """Whether the held allocations follow from those of rows with telemetry alone."""
    again = grid.unheld().held()
    return all(np.array_equal(again.alloc[c][0], codes) for c, (codes, _) in grid.alloc.items())


def _kept_of_full(fleet: Fleet, start: float, end: float) -> _Kept | None:
    try:
        grid = to_grid(without_uncarved(fleet.frame), start, end, fleet.step)
    except ValueError:
        return None  # not a normalized window: every call loads in full
    n = len(grid.devices)
    seen = _Seen(np.full(n, start), np.full(n, np.inf), ~grid.observed().any(axis=1))
    return _Kept(
        grid=grid.unheld(), seen=seen,
        columns=dict.fromkeys(grid.values, (start, np.inf)), events=fleet.events, topology=fleet.topology,
        accounting=fleet.accounting, shares=fleet.shares, dialect=fleet.dialect, missing=dict(fleet.missing),
        notes=((start, tuple(fleet.notes)),),
        exact=_alloc_with_telemetry(grid),
        held=bool(held_rows(fleet.frame).any()),
    )  # fmt: skip


def _returning(old: Grid, new: Grid, start: float, cut: float) -> float | None:
    """The earliest last row before a scrape gap of the devices whose gap spans ``cut``: they have rows with
    telemetry in ``[start, cut)`` and none in the new load's first two rows (its samples there may start
    later, up to its last point after ``end``: a counter's first sample that late reads as a new series in
    normalize's XID logic). None when there is none."""
    seen = old.observed()[:, old.index(start):old.index(cut)]
    at = old.keys().get_indexer(new.keys())
    cand = ~new.observed()[:, :2].any(axis=1) & (at >= 0)
    cand[cand] = seen[at[cand]].any(axis=1)
    if not cand.any():
        return None
    last_idx = seen.shape[1] - 1 - seen[at[cand]][:, ::-1].argmax(axis=1)
    return start + float(last_idx.min()) * old.step


def _compose(kept: _Kept, new: Grid, start: float, cut: float, end: float) -> Grid:
    """The kept rows before ``cut`` and the new load's after it, checked to be what a full load gives."""
    _check_identity(kept.grid, new)
    grid = splice(kept.grid, new.unheld(), start, cut, end)
    _check_mig(grid)
    _check_workloads(grid, grid.index(cut))
    return grid


def _finish(kept: _Kept, grid: Grid, chunk: Fleet, new: Grid, start: float, cut: float,
            end: float) -> tuple[Fleet, pd.DataFrame, tuple[tuple[float, tuple[str, ...]], ...]]:
    """The window's Fleet over ``grid`` (its rows, devices and columns), its topology and its notes per load."""
    if chunk.dialect != kept.dialect:
        raise Reload(f"the dialect changed from {kept.dialect} to {chunk.dialect}")
    missing = _missing(grid, new, chunk)
    topology = _topology(kept, new, chunk, grid)
    events = _events(kept.events, chunk.events, start, cut)
    notes = (*_notes_in_window(kept.notes, start, cut), (cut, tuple(chunk.notes)))
    frame = with_uncarved(grid.held().frame())
    # Sharer rows are per step, like the frame's: the kept ones before the cut, the new load's after it.
    shares = pd.concat([t for t in (timed_between(kept.shares, start, cut), chunk.shares) if len(t)]
                       or [chunk.shares], ignore_index=True)
    fleet = Fleet(frame=frame, step=grid.step, start=start, end=end, events=events, topology=topology,
                  accounting=_accounting(kept.accounting, chunk.accounting, frame), shares=shares,
                  dialect=chunk.dialect,
                  missing=missing, notes=list(dict.fromkeys(n for _, ns in notes for n in ns)))
    return fleet, topology, notes


def _accounting(kept: pd.DataFrame, new: pd.DataFrame, frame: pd.DataFrame) -> pd.DataFrame:
    """The accounting of the workloads holding GPUs in the window: a job's info series come with its allocation
    (one scrape), so these are the jobs a full load reads it for; the newer load's row wins."""
    jobs = map(str, pd.unique(frame["job"].dropna())) if "job" in frame.columns else ()
    return merged_accounting(kept, new, jobs=jobs)


def _notes_in_window(notes: tuple[tuple[float, tuple[str, ...]], ...], start: float,
                     cut: float) -> tuple[tuple[float, tuple[str, ...]], ...]:
    """The kept loads' notes whose rows ``[first, next load's first)`` still reach into ``[start, cut)``."""
    ends = [t for t, _ in notes[1:]] + [cut]
    return tuple((t, n) for (t, n), until in zip(notes, ends, strict=True) if t < cut and min(until, cut) > start)


def _check_identity(old: Grid, new: Grid) -> None:
    """A device the kept rows and the new load share must have one identity: a full load would take the
    first series' (a swapped GPU, a node moved to another rack)."""
    at = old.keys().get_indexer(new.keys())
    both = at >= 0
    cols = [*IDENTITY, "gpu_share"]
    a = old.devices[cols].iloc[at[both]].reset_index(drop=True)
    b = new.devices[cols][both].reset_index(drop=True)
    diff = (a != b).any(axis=1).to_numpy()
    if diff.any():
        row = b.iloc[int(np.argmax(diff))]
        raise Reload(f"the identity of {row['hostname']}/{row['gpu']} changed")


def _check_mig(grid: Grid) -> None:
    """A GPU seen whole and as MIG instances: a full load lays it out as instances only."""
    d = grid.devices
    mig = d["gpu_instance"] != ""
    gpus = d[["hostname", "gpu"]]
    both = pd.MultiIndex.from_frame(gpus[mig]).intersection(pd.MultiIndex.from_frame(gpus[~mig]))
    if len(both):
        raise Reload(f"the MIG layout of {'/'.join(both[0])} changed")


def _check_workloads(grid: Grid, cut: int) -> None:
    """A pod must keep its workload across the cut: a derived one (dcgm-exporter pods, derive_job) depends
    on the pods of the whole window."""
    codes = [grid.alloc[c][0] for c in ("namespace", "pod", "job")]
    parts = []
    for part in (slice(0, cut), slice(cut, None)):
        ns, pod, job = (c[:, part].reshape(-1) for c in codes)
        ok = pod >= 0
        parts.append(pd.DataFrame({"ns": ns[ok], "pod": pod[ok], "job": job[ok]}).drop_duplicates())
    both = parts[0].merge(parts[1], on=["ns", "pod"], how="inner", suffixes=("_a", "_b"))
    pods = both.loc[both["job_a"] != both["job_b"], ["ns", "pod"]]
    if len(pods):
        name = grid.alloc["pod"][1][int(pods["pod"].iloc[0])]
        raise Reload(f"the workload of pod {name} changed")


def _presence(since: np.ndarray, gone: np.ndarray, evidence: np.ndarray, start: float) -> tuple[np.ndarray,
                                                                                             np.ndarray]:
    """(in the window, unknown): in when the newest load has it, when it has a value in the window or a
    load starting in the window had it; out when no load from ``gone`` on had it and ``gone <= start``."""
    keep = np.isinf(gone) | evidence | (since >= start)
    return keep, ~keep & (gone > start)


def _devices_in_window(kept: _Kept, fresh: Grid, grid: Grid, start: float, cut: float) -> tuple[Grid, _Seen]:
    """The devices a full load of the window has, from the kept ones and those of the load from ``cut``.
    One last seen in a load that straddles ``start`` with telemetry stopped reporting with its telemetry
    (a device's series come from one scrape); one seen there with other series only is unknown."""
    keys = grid.keys()
    n = len(keys)
    since, gone, quiet = np.full(n, cut), np.full(n, np.inf), np.zeros(n, bool)
    old = keys.get_indexer(kept.grid.keys())
    since[old], gone[old], quiet[old] = kept.seen.since, np.minimum(kept.seen.gone, cut), kept.seen.quiet
    now = keys.get_indexer(fresh.keys())
    since[now], gone[now], quiet[now] = cut, np.inf, ~fresh.observed().any(axis=1)
    keep, unknown = _presence(since, gone, grid.observed().any(axis=1), start)
    if (unknown & quiet).any():
        d = grid.devices.iloc[int(np.argmax(unknown & quiet))]
        raise Reload(f"unknown whether {d['hostname']}/{d['gpu']} reported in the window")
    return grid.take(keep), _Seen(since, gone, quiet).take(keep)


def _columns_in_window(kept: _Kept, new: Grid, grid: Grid, start: float,
                       cut: float) -> tuple[Grid, dict[str, tuple[float, float]]]:
    columns = {}
    for name, arr in grid.values.items():
        since, gone = (cut, np.inf) if name in new.values else (kept.columns[name][0], min(kept.columns[name][1], cut))
        keep, unknown = _presence(np.array([since]), np.array([gone]), np.array([~np.isnan(arr).all()]), start)
        if unknown[0]:
            raise Reload(f"unknown whether {name} is in the window")
        if keep[0]:
            columns[name] = (since, gone)
    return replace(grid, values={c: v for c, v in grid.values.items() if c in columns}), columns


def _signal_status(grid: Grid) -> tuple:
    """What normalize's missing-signal reasons depend on, besides the dialect."""
    d = grid.devices
    all_mig = bool(len(d)) and bool((d["gpu_instance"] != "").all())
    return all_mig, tuple((s.name in grid.values, s.name in grid.values and not np.isnan(grid.values[s.name]).all())
                          for s in SIGNALS)


def _missing(grid: Grid, new: Grid, chunk: Fleet) -> dict[str, str]:
    if _signal_status(grid) != _signal_status(new):
        raise Reload("the signals in the window differ from those of the new steps")
    return dict(chunk.missing)


def _topology(kept: _Kept, new: Grid, chunk: Fleet, grid: Grid) -> pd.DataFrame:
    """Each GPU's links as last loaded, for the GPUs in the window; they must not change while a GPU reports."""
    def gpus(g: Grid) -> pd.MultiIndex:
        return pd.MultiIndex.from_frame(g.devices[["hostname", "gpu"]]).unique()

    def of(topo: pd.DataFrame, which: pd.MultiIndex) -> pd.DataFrame:
        return topo[pd.MultiIndex.from_frame(topo[["hostname", "gpu"]].astype(str)).isin(which)]

    shared = gpus(kept.grid).intersection(gpus(new))
    before, after = of(kept.topology, shared).astype(str), of(chunk.topology, shared).astype(str)
    if len(before) != len(after) or len(before.merge(after, how="inner").drop_duplicates()) != len(before):
        raise Reload("the topology of a GPU changed")
    rest = gpus(grid).difference(gpus(new))
    out = pd.concat([of(chunk.topology, gpus(grid)), of(kept.topology, rest)], ignore_index=True)
    if not len(out):
        return pd.DataFrame(columns=list(TOPOLOGY_COLUMNS))
    order = np.lexsort((_num(out["peer_gpu"]), _num(out["gpu"]), out["hostname"].to_numpy(dtype=str)))
    return out.iloc[order].reset_index(drop=True)[list(TOPOLOGY_COLUMNS)]


def _events(old: pd.DataFrame, new: pd.DataFrame, start: float, cut: float) -> pd.DataFrame:
    """Kept XID events in ``[start, cut]``, the new load's from ``cut`` on (at ``cut`` the new one's count wins)."""
    ts = old["timestamp"].to_numpy(dtype=np.float64)
    parts = [p for p in (new, old[(ts >= start) & (ts <= cut)]) if len(p)]
    if not parts:
        return pd.DataFrame(columns=list(EVENT_COLUMNS))
    ev = pd.concat(parts, ignore_index=True).drop_duplicates([c for c in EVENT_COLUMNS if c != "count"])
    order = np.lexsort((_num(ev["gpu"]), ev["hostname"].to_numpy(dtype=str), ev["timestamp"].to_numpy()))
    return ev.iloc[order].reset_index(drop=True)[list(EVENT_COLUMNS)]


def _num(values: pd.Series) -> np.ndarray:
    """Label values as numbers for sorting (non-numbers last), as normalize sorts topology and events."""
    return pd.to_numeric(values.astype(str), errors="coerce").fillna(1e18).to_numpy()


__all__ = ["OVERLAP", "Reload", "WindowLoader"]
