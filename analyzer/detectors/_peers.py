"""Peer groups as matrices: robust "compared with its peers" statistics without per-row Python.

Detectors that compare a device with its peers (the other members of its job, of the same
role and GPU model) need, at every timestamp, the peers' median and spread of a signal.
The tidy frame is device-major on a regular time grid, so a peer group is a set of
*slots* (one device while it belongs to the group) and each signal becomes a
``(slots, T)`` matrix; group statistics are then a ``nanmedian`` over a contiguous block
of slot rows (slots are ordered by group), one numpy call per group and signal.

Reference choice (the "peers" of a member):

* 3 or more members: the group median, including the member itself. With a minority of
  outliers the median is the healthy level (a leave-one-out median differs by at most one
  order statistic, a fraction of the spread);
* 2 members: the *other* member. The median of two is their mean, which would halve any
  difference and call both members half-odd.

Spread is the MAD (median absolute deviation from the median) scaled by 1.4826 to a
standard deviation of normal noise; a floor (``mad_floor``) keeps a perfectly quiet group
(simulated, or integer-rounded telemetry) from turning a negligible difference into a
huge z-score.
"""

from __future__ import annotations

import functools
import re
import warnings
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import pandas as pd

from analyzer.analysis.episodes import column
from analyzer.data.coverage import held_rows
from analyzer.data.frame import Fleet, category_codes

#: MAD -> standard deviation of normally distributed noise.
MAD_TO_SIGMA = 1.4826


def _combine(codes: list[np.ndarray]) -> np.ndarray:
    """One int64 per row for a tuple of code columns (mixed radix; re-factorized only when the
    radix would overflow)."""
    out = np.zeros(len(codes[0]) if codes else 0, np.int64)
    span = 1
    for c in codes:
        radix = int(c.max()) + 2 if len(c) else 1
        if span * radix >= 2**62:
            out = pd.factorize(out)[0].astype(np.int64)
            span = int(out.max()) + 1
        out = out * radix + (c + 1)
        span *= radix
    return out


@dataclass
class PeerGroups:
    """Slots (device x group) of a fleet as rows of (slots, T) matrices.

    ``slot_of_row`` (-1 for rows outside any group: unallocated devices) and ``ti`` map
    frame rows onto matrix cells; ``bounds[g]:bounds[g + 1]`` are group g's slot rows.
    ``slot_host``/``slot_gpu``/``slot_uuid``/``slot_instance`` name each slot's device,
    ``group_labels`` the group's key values (e.g. job, container, model).
    """

    fleet: Fleet
    slot_of_row: np.ndarray
    ti: np.ndarray
    n_slots: int
    T: int
    slot_group: np.ndarray
    bounds: np.ndarray
    slot_host: np.ndarray
    slot_gpu: np.ndarray
    slot_uuid: np.ndarray
    slot_instance: np.ndarray
    slot_share: np.ndarray
    group_labels: list[dict[str, str | None]]
    blocks: Blocks

    @property
    def n_groups(self) -> int:
        return len(self.bounds) - 1

    def matrix(self, values: np.ndarray | str) -> np.ndarray:
        """(slots, T) float64 matrix of a per-row array or a signal name; NaN where unknown or absent."""
        v = column(self.fleet, values) if isinstance(values, str) else np.asarray(values, dtype=np.float64)
        out = np.full((self.n_slots, self.T), np.nan)
        sel = self.slot_of_row >= 0
        out[self.slot_of_row[sel], self.ti[sel]] = v[sel]
        return out

    @functools.cached_property
    def held(self) -> np.ndarray:
        """(slots, T) True where the value repeats the device's last sample (analyzer.data.coverage.HELD): a
        device scraped less often than the step. Levels may use it; a change against peers at one instant may
        not (a value of minutes ago reads as a lead its peers lost)."""
        return self.matrix(held_rows(self.fleet.frame)) > 0

    def fresh(self, values: np.ndarray | str) -> np.ndarray:
        """``matrix`` with the held cells unknown: for a change against peers at one instant (see ``held``)."""
        return np.where(self.held, np.nan, self.matrix(values))

    def to_rows(self, m: np.ndarray, fill: float = np.nan) -> np.ndarray:
        """A (slots, T) matrix back onto the frame's rows (``fill`` outside any group)."""
        out = np.full(len(self.slot_of_row), fill)
        sel = self.slot_of_row >= 0
        out[sel] = m[self.slot_of_row[sel], self.ti[sel]]
        return out

    def reference(self, m: np.ndarray, spread: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Per cell: the peers' reference level (median, or the other member of a pair) and the
        group's robust spread (MAD x 1.4826; all NaN unless ``spread``), both (slots, T)."""
        return self.blocks.robust(m, spread)


class Blocks:
    """Sets of slot rows (a job's members, a node's GPUs), batched by size so that a statistic
    over every set is a few vectorized numpy calls (sort along the member axis), never a
    Python loop per set or ``np.nanmedian`` (masked arrays, slow on small sets)."""

    def __init__(self, sets: Sequence[np.ndarray], n_slots: int) -> None:
        by: dict[int, list[np.ndarray]] = {}
        for st in sets:
            if len(st):
                by.setdefault(len(st), []).append(np.asarray(st, np.int64))
        self.batches = [np.stack(v) for v in by.values()]
        self.n_slots = n_slots

    def sizes(self) -> np.ndarray:
        """Every slot's set size (0 outside any set)."""
        out = np.zeros(self.n_slots, np.int64)
        for idx in self.batches:
            out[idx] = idx.shape[1]
        return out

    def median(self, m: np.ndarray) -> np.ndarray:
        """Every member gets its set's NaN-skipping median (NaN outside any set)."""
        out = np.full((self.n_slots, m.shape[1]), np.nan)
        for idx in self.batches:
            med, _ = _nanmedian(m[idx])
            out[idx] = med[:, None, :]
        return out

    def robust(self, m: np.ndarray, spread: bool = True) -> tuple[np.ndarray, np.ndarray]:
        """Reference and spread of every member against its set (see the module docstring)."""
        ref = np.full((self.n_slots, m.shape[1]), np.nan)
        sp_out = np.full_like(ref, np.nan)
        for idx in self.batches:
            x = m[idx]  # (sets, k, T)
            med, n = _nanmedian(x)
            r = np.broadcast_to(med[:, None, :], x.shape).copy()
            pair = np.broadcast_to((n == 2)[:, None, :], x.shape)
            other = np.nansum(x, axis=1)[:, None, :] - x  # the other member of a pair
            r = np.where(pair, other, r)
            r = np.where(np.broadcast_to((n < 2)[:, None, :], x.shape), np.nan, r)  # no peer
            ref[idx] = r
            if spread:
                mad, _ = _nanmedian(np.abs(x - med[:, None, :]))
                sp = np.where(n >= 3, mad * MAD_TO_SIGMA, np.nan)  # two values have no meaningful spread
                sp_out[idx] = sp[:, None, :]
        return ref, sp_out


def _nanmedian(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Median over axis 1 of (sets, k, T) skipping NaN, and the count of known values."""
    s = np.sort(x, axis=1)  # NaN sort last
    n = np.sum(~np.isnan(x), axis=1)
    lo = np.maximum((n - 1) // 2, 0)[:, None, :]
    hi = np.maximum(n // 2, 0)[:, None, :]
    hi = np.minimum(hi, x.shape[1] - 1)
    a = np.take_along_axis(s, lo, axis=1)[:, 0]
    b = np.take_along_axis(s, hi, axis=1)[:, 0]
    return np.where(n > 0, (a + b) / 2.0, np.nan), n


def peer_groups(fleet: Fleet, keys: Sequence[str] = ("job", "container", "model", "mig_profile"),
                require: str = "job") -> PeerGroups:
    """Group allocated devices by ``keys`` (rows whose ``require`` label is unknown stay out)."""
    f = fleet.frame
    n = len(f)
    ts = f["timestamp"].to_numpy(dtype=np.float64) if n else np.zeros(0)
    ti = np.rint((ts - fleet.start) / fleet.step).astype(np.int64) if n else np.zeros(0, np.int64)
    T = int(ti.max()) + 1 if n else 0
    keys = [k for k in keys if k in f.columns]
    dev_keys = [k for k in ("uuid", "gpu_instance") if k in f.columns] or ["hostname", "gpu"]
    ok = (category_codes(f[require]) >= 0) if require in f.columns else np.zeros(n, bool)
    empty = PeerGroups(fleet, np.full(n, -1, np.int64), ti, 0, T, np.zeros(0, np.int64), np.zeros(1, np.int64),
                       *(np.zeros(0, object) for _ in range(4)), np.zeros(0), [], Blocks([], 0))
    if not ok.any():
        return empty
    gcode = _combine([category_codes(f[k])[ok] for k in keys])
    dcode = _combine([category_codes(f[k])[ok] for k in dev_keys])
    # Group id, then slot id = (group, device); slots sorted by group so each group is a block.
    g_inv, g_uni = pd.factorize(gcode, sort=True)
    dcode = pd.factorize(dcode)[0].astype(np.int64)
    s_inv, s_uni = pd.factorize(g_inv.astype(np.int64) * (int(dcode.max()) + 1) + dcode, sort=True)
    s_inv, s_uni = s_inv.astype(np.int64), np.asarray(s_uni, np.int64)
    slot_of_row = np.full(n, -1, np.int64)
    slot_of_row[ok] = s_inv
    slot_group = s_uni // (int(dcode.max()) + 1)
    bounds = np.searchsorted(slot_group, np.arange(len(g_uni) + 1))
    first = np.full(len(s_uni), -1, np.int64)
    rows_ok = np.flatnonzero(ok)
    first[s_inv[::-1]] = rows_ok[::-1]  # first frame row of each slot

    def names(col: str) -> np.ndarray:
        if col not in f.columns:
            return np.full(len(first), None, object)
        vals = f[col].iloc[first].astype(object).to_numpy()
        return np.array([None if v is None or (isinstance(v, float) and np.isnan(v)) else str(v) for v in vals],
                        dtype=object)

    share = f["gpu_share"].to_numpy(dtype=np.float64)[first] if "gpu_share" in f.columns else np.ones(len(first))
    grp_first = first[bounds[:-1]]
    lab_cols = {k: f[k].iloc[grp_first].astype(object).to_numpy() for k in (*keys, "namespace") if k in f.columns}
    labels = [{k: (None if pd.isna(v[i]) else str(v[i])) for k, v in lab_cols.items()} for i in range(len(grp_first))]
    blocks = Blocks([np.arange(bounds[g], bounds[g + 1]) for g in range(len(g_uni))], len(s_uni))
    return PeerGroups(fleet, slot_of_row, ti, len(s_uni), T, slot_group, bounds, names("hostname"), names("gpu"),
                      names("uuid"), names("gpu_instance"), share, labels, blocks)


def rolling_count(m: np.ndarray, window: int) -> np.ndarray:
    """Centered count of True cells over ``window`` steps along time, per slot row (bool (S, T) input)."""
    if window <= 1:
        return m.astype(np.int64)
    return np.rint(_window_sum(m.astype(np.float64), window)).astype(np.int64)


def rolling_mean(m: np.ndarray, window: int) -> np.ndarray:
    """Centered NaN-skipping mean over ``window`` steps along time, per slot row (NaN where none known)."""
    if window <= 1:
        return m
    known = ~np.isnan(m)
    sums = _window_sum(np.where(known, m, 0.0), window)
    counts = _window_sum(known.astype(np.float64), window)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(counts > 0, sums / counts, np.nan)


def trailing_median(m: np.ndarray, window: int) -> np.ndarray:
    """NaN-skipping median of the ``window`` steps *before* each step, per slot row (NaN where fewer than
    half of them are known): a level to compare the step with that the step itself cannot move.

    The rows are laid end to end, each behind ``window`` NaNs (no window reaches into the row before), and
    rolled as one series: one pass of pandas' skiplist instead of one per row (4x faster at 10,000 rows)."""
    S, T = m.shape
    flat = np.full((S, window + T), np.nan)
    flat[:, window:] = m
    med = pd.Series(flat.ravel()).rolling(window, min_periods=max(1, window // 2)).median().to_numpy()
    return np.pad(med.reshape(S, window + T)[:, window:], ((0, 0), (1, 0)), constant_values=np.nan)[:, :-1]


def _window_sum(m: np.ndarray, window: int) -> np.ndarray:
    c = np.cumsum(np.pad(m, ((0, 0), (1, 0))), axis=1)
    T = m.shape[1]
    idx = np.arange(T)
    lo = np.clip(idx - window // 2, 0, T)
    hi = np.clip(idx + window - window // 2, 0, T)
    return c[:, hi] - c[:, lo]


def persistent(cond: np.ndarray, window: int, k: int) -> np.ndarray:
    """k-of-n persistence of a (S, T) tristate condition (1/0/NaN): 1 where at least the share
    ``k / window`` of the known steps of the ``window`` centered steps hold, 0 where fewer hold,
    NaN where fewer than half of the steps that exist are known.

    The share is of the *known* steps: at the edges of the data the centered window is cut short
    (a problem still going at the end of a window stays open whatever the step: 12 of 20 could
    never hold in the last 10 steps at 15 s), and a scrape gap is unknown, neither for nor against
    (a whole-node gap of a few minutes must not turn a straggler off and split its finding: the
    episode bridges it). Half the window known is the least that still says something: a window
    of one known step among missing ones decides nothing.
    """
    true = rolling_count(cond == 1.0, window)
    known = rolling_count(~np.isnan(cond), window)
    present = rolling_count(np.ones((1, cond.shape[1]), dtype=bool), window)
    need = np.ceil(k * known / window - 1e-9)
    judged = np.where(true >= need, 1.0, 0.0)
    return np.where((known > 0) & (2 * known >= present), judged, np.nan)


def block_max(blocks: Blocks, m: np.ndarray) -> np.ndarray:
    """Every member gets its set's NaN-skipping maximum (NaN where the set has no known value or
    outside any set): "is this member the busiest of its job" without a loop per job."""
    out = np.full((blocks.n_slots, m.shape[1]), np.nan)
    for idx in blocks.batches:
        x = m[idx]  # (sets, k, T)
        mx = np.where(np.isnan(x), -np.inf, x).max(axis=1)
        out[idx] = np.where(np.isinf(mx), np.nan, mx)[:, None, :]
    return out


#: Pods of a declared gang: Kubeflow PyTorchJob/TFJob/MPIJob members (-master-0, -worker-3, -chief-0,
#: -ps-1, -launcher) and the -trainer-N / -rank-N conventions of other launchers.
GANG_POD = re.compile(r"-(?:worker|master|chief|trainer|rank|ps|launcher)(?:-\d+)?$")


@dataclass(frozen=True)
class Communication:
    """Whether the members of one workload talk to each other, and why we think so.

    ``communicating``: True (a sign below), False (signals known, no sign), None (nothing to
    judge by: no NVLink counter, SM/util unknown, fewer than two members at a time).
    ``evidence``: ``declared`` (gang pod names), ``nvlink``, ``synchronized`` or ``none``.
    """

    job: str
    communicating: bool | None
    evidence: str
    concurrent_pods: int
    members: int
    nvlink_bps: float | None
    sync: float | None


def communicating(fleet: Fleet, *, nvlink_bps: float = 1e9, sync_min: float = 0.5, busy_min: float = 0.8,
                  min_steps: int = 10, busy: np.ndarray | None = None) -> dict[str, Communication]:
    """Per workload (``job``): do its members communicate, i.e. could they be one synchronous job?

    A shared name is no such sign (independent replicas ``name-0..N`` share one), nor is being
    busy. Signs, any of which suffices:

    - ``declared``: a pod named as a gang member (:data:`GANG_POD`: the training operators set
      up the rendezvous of such pods, so they are one collective by construction);
    - ``nvlink``: two or more members move NVLink traffic >= ``nvlink_bps`` (1 GB/s) at the
      same time. A gang on NVLink moves 10-40 GB/s per GPU; idle links move ~0. PCIe bytes are
      no sign: DCGM's PCIe counters include the host<->device copies every inference server
      makes, and cannot be told from peer traffic;
    - ``synchronized``: the members' busy/wait phases move together. Per member, the
      step-to-step changes of SM activity (kernel-resident time where SM is not collected);
      their average pairwise correlation, ``(k var(mean) / mean(var) - 1) / (k - 1)``, is ~0
      for independent members and 1 for lock-step ones; >= ``sync_min`` 0.5 (more than half
      of each member's movement shared) counts, over >= ``min_steps`` 10 steps with two or
      more members known. Only where the members are steadily busy (median kernel-resident
      time >= ``busy_min`` 0.8, analyzer.analysis.bottleneck's BUSY_UTIL): request-driven
      replicas also move together when one load balancer feeds them a shared daily load, but
      then their util follows the load and is not steadily high.

    ``busy``: per-row kernel-resident time (``analyzer.detectors.gpu_busy``, derived from the fleet); ``gpu_util``
    when None. Vectorized per workload: one numpy pass over its (members, T) block. Memoised per fleet and
    settings (``Fleet.memo``): idle_masking and topology both ask.
    """
    key = ("communicating", nvlink_bps, sync_min, busy_min, min_steps, busy is None)
    return fleet.memo(key, lambda: _communicating(fleet, nvlink_bps, sync_min, busy_min, min_steps, busy))


def _communicating(fleet: Fleet, nvlink_bps: float, sync_min: float, busy_min: float, min_steps: int,
                   busy: np.ndarray | None) -> dict[str, Communication]:
    f = fleet.frame
    if not len(f) or "job" not in f.columns or not f["job"].notna().any():
        return {}
    pg = peer_groups(fleet, keys=("job",))
    util = pg.matrix(column(fleet, "gpu_util") if busy is None else busy)
    sm = pg.matrix("sm_active")
    nvl = pg.matrix("nvlink_bps")
    alloc = f["job"].notna().to_numpy()
    pods = (f["pod"].astype(object).where(f["pod"].notna(), "") if "pod" in f.columns
            else pd.Series("", index=f.index, dtype=object))[alloc]
    per_t = pd.DataFrame({"job": f["job"].astype(object).to_numpy()[alloc], "t": f["timestamp"].to_numpy()[alloc],
                          "pod": pods.to_numpy()})
    concurrent = per_t[per_t["pod"] != ""].groupby(["job", "t"])["pod"].nunique().groupby(level="job").max()
    declared = per_t.drop_duplicates(["job", "pod"]).assign(g=lambda d: d["pod"].str.contains(GANG_POD)) \
        .groupby("job")["g"].any()
    out: dict[str, Communication] = {}
    for g in range(pg.n_groups):
        job = pg.group_labels[g].get("job")
        if job is None:
            continue
        sl = slice(int(pg.bounds[g]), int(pg.bounds[g + 1]))
        k = sl.stop - sl.start
        talking = np.nansum(nvl[sl] >= nvlink_bps, axis=0) if k else np.zeros(0)
        nv_known = bool(np.isfinite(nvl[sl]).any())
        act = sm[sl] if np.isfinite(sm[sl]).any() else util[sl]
        steady = bool(np.nanmedian(util[sl]) >= busy_min) if np.isfinite(util[sl]).any() else False
        sync = _sync_score(act, min_steps) if k >= 2 else None
        if bool(declared.get(job, False)):
            yes, why = True, "declared"
        elif nv_known and bool((talking >= 2).any()):
            yes, why = True, "nvlink"
        elif sync is not None and steady and sync >= sync_min:
            yes, why = True, "synchronized"
        elif k < 2 or (sync is None and not nv_known):
            yes, why = None, "none"
        else:
            yes, why = False, "none"
        peak = float(np.nanmax(nvl[sl])) if nv_known else None
        out[str(job)] = Communication(str(job), yes, why, int(concurrent.get(job, 0)), k, peak, sync)
    return out


def _sync_score(act: np.ndarray, min_steps: int) -> float | None:
    """Average pairwise correlation of the members' step-to-step changes (rows: members; NaN unknown)."""
    d = np.diff(act, axis=1)
    known = ~np.isnan(d)
    cols = known.sum(axis=0) >= 2
    if cols.sum() < min_steps:
        return None
    d = d[:, cols]
    known = known[:, cols]
    with np.errstate(invalid="ignore", divide="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # members with no known change: NaN, dropped below
        centred = d - np.nanmean(d, axis=1, keepdims=True)
        var_each = np.nanmean(centred ** 2, axis=1)
        ok = np.isfinite(var_each) & (var_each > 0)
        if ok.sum() < 2:
            return None
        c = np.where(known[ok], centred[ok], np.nan)
        k = np.sum(~np.isnan(c), axis=0)
        mean_t = np.nanmean(c, axis=0)
        # Var of the members' mean, scaled back by the members known at each step (k var(mean) / mean(var)).
        r = float(np.nanmean(k * mean_t ** 2) / np.nanmean(var_each[ok]))
    n = int(ok.sum())
    return float(np.clip((r - 1.0) / (n - 1.0), -1.0, 1.0))
