"""Thermal: GPUs that throttle for heat, run hotter than their peers at the same load, or
heat up towards the slowdown point; and racks/nodes whose cooling fails under many GPUs.

Physics first. A GPU's die temperature is its cooling's inlet temperature plus its power
times the thermal resistance from die to air: ``temp ~ inlet + R x power`` (H100 SXM ~0.07-0.1
K/W). Hot *because busy* is the R x power term, the same for every healthy GPU of a model;
hot *at the same load* is a cooling problem: a higher inlet (rack/node: CRAC/CDU, doors,
blanking panels, recirculation) or a higher R (one GPU: fan, heatsink, thermal paste).
H100s start managing clocks at their 87 C maximum operating temperature and slow down
hard around 85-90 C; HBM3 throttles at ~95 C.

Per-row rules (all vectorized on a dense device x time grid, one physical GPU per row of
the grid; MIG instances repeat their GPU's temperature and are judged once, on the GPU):

1. *At the limit* (``limit``): the thermal clock-event flag (sw/hw thermal slowdown) is set;
   or, when throttle reasons are not collected (dcgm-exporter's default counters omit
   DCGM_FI_DEV_CLOCKS_EVENT_REASONS; temperature is still there), the die is at or above
   ``at_limit_c`` 85 C, the low end of H100's slowdown range (confidence "low"); or HBM
   is at or above ``mem_limit_c`` 95 C, its throttle point. A GPU at the limit for
   ``min_throttle_s`` 60 s or more is reported: one sample of a 15-60 s scrape is a
   transient, a full minute of lower clocks is lost work.
2. *Hot at the same load* (``excess``): the power-corrected temperature ``temp - R x power``
   (R per model: the median slope of temperature on power between GPUs of one node at one
   instant, which share an inlet; throttled rows excluded, clipped to 0..0.5 K/W; 0 when no
   node ever shows 25 W of power spread, i.e. raw temperatures of like-loaded peers) minus
   the median of its peers' (same model; the other GPUs of its node when there are 2 or
   more, else of its rack). ``excess_c`` 5 C is ~2.5x the GPU-to-GPU spread of healthy GPUs
   sharing an inlet (paste/heatsink tolerance ~6% of R x power ~ 2 C at 400 W).
3. *Rising* (``slope``): least-squares slope of the excess over the last ``trend_window_s``
   15 min (enough samples to average the ~1 C sensor quantization: slope noise
   ~0.03 C/min), and the ETA to the ``slowdown_c`` 87 C point at that rate. Rising means
   at least ``min_slope_c_per_min`` 0.2 C/min (12 C/h): no healthy room drifts that fast at
   constant load; a failed CRAC or stopped fan ramps at 0.5-1 C/min. Only a *ramp* counts:
   each third of the window must rise at half the window's rate, so a step (a GPU that
   simply runs hotter since some instant) is not read as a 15-minute trend.

A hot-at-same-load GPU is reported only when the excess is *urgent*: the die is within
``warn_c`` 79 C (8 C, i.e. 10-15 min at a failing cooler's 0.5-1 C/min, before the slowdown
point), at the limit, or rising with an ETA within ``eta_horizon_s`` 30 min; and the
condition holds ``min_hot_s`` 5 min (heatsinks lag power by 1-3 min; a 5 min persistence
rules out load transients). A GPU running 10-15 C hotter than its peers far below the
slowdown point (thermal paste drying out slowly, no throttling) is left to ``degraded_gpu``:
it is a maintenance item, not a thermal emergency, and the evaluator counts a thermal
finding on such a GPU as false (its truth is ``degraded_gpu``; scenario degraded-gpus,
multi-fault). Once it throttles it is thermal too.

Groups. A node's level is the median power-corrected temperature of its GPUs, a rack's the
median of its nodes'; each is compared with its peers (the other nodes of the rack, else of
the fleet; the other racks of the fleet; "the other" always leaving the unit itself out, so
the reference stays cool up to a hot half: 3 hot nodes of 6 are still found), with the
same 5 C / urgency / 5 min rules on the group's hottest GPU and the slope of the group's
excess; a rack is urgent only through two of its nodes (the second-hottest node near the limit,
or two nodes at it): one GPU throttling for a fault of its own in a rack that runs a few degrees
warm is that GPU's finding, not a rack's (7 false critical rack findings over 20 never-used seeds
before). Without rack labels (dcgm-exporter data) nodes are compared with the fleet's. "The fleet"
(R, the nodes and racks compared with) is its reference hosts (analyzer.data.reference: all of
them up to 64 hosts per model), so a sharded analyzer reads a bounded sample, not every host.
Several nodes of one rack found hot together become one rack finding. GPU-level findings
inside a node or rack finding (same host/rack, overlapping in time) are folded into it and
listed in its evidence: one cooling problem, one finding; a service's runs also fold in a GPU finding that
began inside a span an earlier run's node or rack finding covered and has ended (``_tails``: the window cuts
the group's episode to its last minutes, which only the GPU rule still passes), and hold a node or rack finding
from where it began while its excess stays >= ``excess_c``, until ``hold_s`` 10 min after it was last urgent
(``_held``: its urgency, re-judged by each run, flickers at a ramp's start). A node or rack finding starts where its
excess left its usual level (within ``onset_c`` 1 C, the sensor's quantization, of the median over the
half hour before its last trend window), not where it became urgent (``urgent_from`` in the evidence): a
failing cooler ramps for 10-20 minutes before the ETA is under 30 minutes, and the operator needs to know
when it began (onset error on rack-cooling 780-1200 s before, 120-180 s since). Where its own level
(power-corrected, not against peers) left usual earlier, that is the start: nodes heating together with
half the fleet lift the median they are compared with while they climb through it (dcgm data, no racks:
onset errors over 5 min at 3 of 12 rack-cooling and multi-fault runs (6 seeds), 3 min at most since).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analysis.episodes import (
    MAX_UNKNOWN_S,
    EarlierRuns,
    Episodes,
    carried_totals,
    column,
    find_episodes,
    format_duration,
    union_spans,
)
from analyzer.data.frame import Fleet, category_codes
from analyzer.detectors import Paging, register
from analyzer.findings import THERMAL, Finding
from analyzer.site import THRESHOLDS

#: Smallest power spread (W) between GPUs of one node that gives a usable slope: ~2 C of
#: temperature difference at 0.08 K/W, above the sensor's 1 C quantization.
_MIN_POWER_SPREAD_W = 25.0
#: Physical range of die-to-air thermal resistance (K/W) for data-center GPUs.
_R_MAX = 0.5


def _nanmedian(a: np.ndarray, axis: int) -> np.ndarray:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmedian(a, axis=axis)


def _pad(m: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows of ``m`` (units x time) laid out per group: (groups x max size x time), NaN padded; and where."""
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    sizes = np.bincount(g, minlength=n_groups)
    first = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    pos = np.empty(len(g), np.int64)
    pos[order] = np.arange(len(g)) - first[g]
    pad = np.full((n_groups, max(int(sizes.max()), 1), m.shape[1]), np.nan)
    pad[groups, pos] = m
    return pad, groups, pos


def _group_median(m: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group and time: median of ``m``'s rows in that group (NaN skipped), and the count known."""
    if n_groups == 0 or not len(m):
        return np.full((n_groups, m.shape[1]), np.nan), np.zeros((n_groups, m.shape[1]), np.int64)
    pad, _, _ = _pad(m, groups, n_groups)
    return _nanmedian(pad, axis=1), np.sum(~np.isnan(pad), axis=1)


def _others_median(m: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per unit and time: median of the *other* units of its group (leave-one-out), and how many there are.

    Leaving the unit out keeps the reference right up to a hot half: of 6 nodes with 3 hot,
    a hot node's others are 2 hot + 3 cool (median cool), a cool node's 3 hot + 2 cool.
    """
    out = np.full(m.shape, np.nan)
    ok = groups >= 0
    if not ok.any():
        return out, np.zeros(m.shape, np.int64)
    pad, g, pos = _pad(m[ok], groups[ok], n_groups)
    order = np.argsort(pad, axis=1)  # NaN last
    s = np.take_along_axis(pad, order, axis=1)
    rank = np.argsort(order, axis=1)
    n = np.sum(~np.isnan(pad), axis=1, keepdims=True)
    rem = n - 1
    lo, hi = (rem - 1) // 2, rem // 2
    size = pad.shape[1]

    def pick(i: np.ndarray) -> np.ndarray:
        idx = np.clip(i + (i >= rank), 0, size - 1)
        return np.take_along_axis(s, idx, axis=1)

    with np.errstate(invalid="ignore"):
        med = np.where((rem >= 1) & ~np.isnan(pad), (pick(np.maximum(lo, 0)) + pick(np.maximum(hi, 0))) / 2, np.nan)
    out[ok] = med[g, pos]
    cnt = np.zeros(m.shape, np.int64)
    cnt[ok] = np.broadcast_to(rem, pad.shape)[g, pos]
    return out, np.where(np.isnan(m), 0, cnt)


def _peer_reference(level: np.ndarray, parent: np.ndarray, n_parents: int,
                    reference: np.ndarray | None = None) -> np.ndarray:
    """Per unit and time: the median level of the other units sharing ``parent`` (-1 = none), NaN alone;
    with ``reference`` (per unit), of the other reference units only (analyzer.data.reference)."""
    if reference is None or reference.all():
        ref, _ = _others_median(level, parent, n_parents)
        return ref
    out = np.full(level.shape, np.nan)
    sel = reference & (parent >= 0)
    out[sel], _ = _others_median(level[sel], parent[sel], n_parents)
    med, _ = _group_median(level[sel], parent[sel], n_parents)
    rest = ~reference & (parent >= 0)
    out[rest] = med[parent[rest]]
    return out


def _rolling_slope(y: np.ndarray, t: np.ndarray, k: int) -> np.ndarray:
    """Least-squares slope of each row of ``y`` (units x time) over its last ``k`` samples, per second."""
    U, T = y.shape
    if T < 3:
        return np.full((U, T), np.nan)
    known = ~np.isnan(y)
    tt = np.broadcast_to(t - t[0], (U, T))
    parts = [known.astype(float), np.where(known, tt, 0), np.where(known, y, 0), np.where(known, tt * tt, 0),
             np.where(known, tt * np.nan_to_num(y), 0)]
    sums = []
    for p in parts:
        c = np.cumsum(p, axis=1)
        c = np.concatenate([np.zeros((U, 1)), c], axis=1)
        lo = np.maximum(np.arange(T) + 1 - k, 0)
        sums.append(c[:, np.arange(T) + 1] - c[:, lo])
    n, st, sy, stt, sty = sums
    with np.errstate(invalid="ignore", divide="ignore"):
        var = stt - st * st / n
        slope = (sty - st * sy / n) / var
    return np.where((n >= max(3, k // 2)) & (var > 0), slope, np.nan)


def _steady_slope(y: np.ndarray, t: np.ndarray, k: int, candidates: np.ndarray | None = None) -> np.ndarray:
    """Slope over the last ``k`` samples (per minute) where the rise is a ramp, NaN elsewhere.

    A ramp (a failing cooler) rises in every third of the window; a step (a load change the
    power correction missed, a GPU that simply runs hotter since some instant) rises in one
    third only and would otherwise read as a 12 C / 15 min "trend" for a whole window. Each
    third's slope must be at least half the window's. Only units with some ``candidates``
    cell (where a slope could matter) are computed: the rest stay NaN.
    """
    out = np.full(y.shape, np.nan)
    rows = np.flatnonzero(np.any(candidates, axis=1)) if candidates is not None else np.arange(len(y))
    if not len(rows):
        return out
    y = y[rows]
    full = _rolling_slope(y, t, k) * 60.0
    k3 = max(3, k // 3)
    part = _rolling_slope(y, t, k3) * 60.0
    thirds = [part]
    for lag in (k3, 2 * k3):
        shifted = np.full(part.shape, np.nan)
        shifted[:, lag:] = part[:, :-lag] if lag < part.shape[1] else np.nan
        thirds.append(shifted)
    with np.errstate(invalid="ignore"):
        steady = np.all([th >= full / 2 for th in thirds], axis=0)
    out[rows] = np.where(steady, full, np.nan)
    return out


def _unit(level: str, name: object) -> str:
    """The memory's key of a node or rack (``level``) named ``name``."""
    return f"{level}:{name}"


def _overlaps(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Do two episodes (start, end or None = open) share time?"""
    a_end = np.inf if a["end"] is None else a["end"]
    b_end = np.inf if b["end"] is None else b["end"]
    return bool(a["start"] < b_end and b["start"] < a_end)


@dataclass
class _Grid:
    """Physical GPUs x time: dense matrices and what each device is."""

    times: np.ndarray
    row_dev: np.ndarray  # per frame row: device index, -1 for MIG instances after the first
    row_t: np.ndarray
    host: np.ndarray
    gpu: np.ndarray
    rack: np.ndarray
    model: np.ndarray

    #: True when the frame is exactly device-major x full time grid (the usual case): reshape, no scatter.
    dense: bool = False

    @classmethod
    def build(cls, fleet: Fleet) -> _Grid:
        f = fleet.frame
        n = len(f)
        ts = f["timestamp"].to_numpy(dtype=np.float64)
        t0 = float(ts.min())
        t_idx = np.rint((ts - t0) / fleet.step).astype(np.int64)
        T = int(t_idx.max()) + 1
        hc = category_codes(f["hostname"])
        gc = category_codes(f["gpu"])
        dev = pd.factorize(hc * (int(gc.max()) + 2) + gc)[0].astype(np.int64)
        row_dev = dev
        if _has_mig(f):
            # MIG instances repeat their GPU's device signals: keep one row per (GPU, time).
            _, first = np.unique(dev * T + t_idx, return_index=True)
            keep = np.zeros(n, bool)
            keep[first] = True
            row_dev = np.where(keep, dev, -1)
        D = int(dev.max()) + 1
        firsts = np.unique(dev, return_index=True)[1]

        def attr(col: str) -> np.ndarray:
            if col not in f.columns:
                return np.full(D, "", dtype=object)
            v = f[col].iloc[firsts].astype(object).to_numpy()
            return np.array(["" if x is None or (isinstance(x, float) and np.isnan(x)) else str(x) for x in v],
                            dtype=object)

        dense = n == D * T and bool(np.all(row_dev.reshape(D, T) == np.arange(D)[:, None])) and bool(
            np.all(t_idx.reshape(D, T) == np.arange(T)[None, :]))
        return cls(times=t0 + np.arange(T) * fleet.step, row_dev=row_dev, row_t=t_idx, host=attr("hostname"),
                   gpu=attr("gpu"), rack=attr("rack"), model=attr("model"), dense=dense)

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.host), len(self.times)

    def matrix(self, values: np.ndarray) -> np.ndarray:
        if self.dense:
            return np.asarray(values, dtype=np.float64).reshape(self.shape)
        m = np.full(self.shape, np.nan)
        ok = self.row_dev >= 0
        m[self.row_dev[ok], self.row_t[ok]] = values[ok]
        return m

    def rows(self, m: np.ndarray) -> np.ndarray:
        """Matrix values back onto frame rows (NaN for MIG instances after the first)."""
        if self.dense:
            return np.asarray(m, dtype=np.float64).reshape(-1)
        out = np.full(len(self.row_dev), np.nan)
        ok = self.row_dev >= 0
        out[ok] = m[self.row_dev[ok], self.row_t[ok]]
        return out


def _has_mig(f: pd.DataFrame) -> bool:
    """Does any row name a MIG instance (a non-empty gpu_instance)?"""
    if "gpu_instance" not in f.columns:
        return False
    s = f["gpu_instance"]
    if isinstance(s.dtype, pd.CategoricalDtype):
        codes = s.cat.codes.to_numpy()
        used = np.bincount(codes[codes >= 0], minlength=len(s.cat.categories)) > 0
        return any(str(c) != "" for c, u in zip(s.cat.categories, used, strict=True) if u)
    return bool((s.dropna().astype(str) != "").any())


def _group_reduce(m: np.ndarray, groups: np.ndarray, n_groups: int, how: str) -> np.ndarray:
    """Per group and time: max (NaN skipped; NaN for none known) or any of ``m``'s rows."""
    out = np.full((n_groups, m.shape[1]), np.nan if how == "max" else 0.0)
    if not len(m):
        return out if how == "max" else out.astype(bool)
    order = np.argsort(groups, kind="stable")
    g = groups[order]
    starts = np.flatnonzero(np.r_[True, g[1:] != g[:-1]])
    if how == "max":
        vals = np.where(np.isnan(m[order]), -np.inf, m[order])
        red = np.maximum.reduceat(vals, starts, axis=0)
        out[g[starts]] = np.where(np.isinf(red), np.nan, red)
        return out
    red = np.logical_or.reduceat(m[order].astype(bool), starts, axis=0)
    res = np.zeros((n_groups, m.shape[1]), bool)
    res[g[starts]] = red
    return res


def _second(hot: np.ndarray, lim: np.ndarray, groups: np.ndarray, n_groups: int) -> tuple[np.ndarray, np.ndarray]:
    """Per group and time, from its members' rows (temperature, at the limit): the second-hottest member's
    temperature (NaN below two known), and whether two or more members are at the limit."""
    if n_groups == 0 or not len(hot):
        return np.full((n_groups, hot.shape[1]), np.nan), np.zeros((n_groups, hot.shape[1]), bool)
    pad, _, _ = _pad(hot, groups, n_groups)
    hot2 = np.sort(np.where(np.isnan(pad), -np.inf, pad), axis=1)[:, -2] if pad.shape[1] >= 2 \
        else np.full((n_groups, hot.shape[1]), -np.inf)
    lim2 = np.zeros((n_groups, lim.shape[1]), np.int64)
    np.add.at(lim2, groups, lim.astype(np.int64))
    return np.where(np.isinf(hot2), np.nan, hot2), lim2 >= 2


@register
@dataclass
class Thermal:
    """Settings: see the module docstring; ``max_gap_steps``/``max_unknown_steps``/``max_unknown_s`` as in
    analyzer.analysis.episodes (one healthy scrape does not split a problem; scrape gaps of up to
    ``max_unknown_s`` 300 s, whatever the step, neither split it nor restart its timer, and are not
    counted as its evidence)."""

    kind = THERMAL
    paging = Paging(alert="GpuThermal", team="sre",
                    says="runs hot or throttles for heat (GPU, node or rack) ({score}); see the analyzer's finding "
                         "for the evidence.")
    remembers = True  #: a service's runs carry node and rack findings' spans and urgency (``_tails``, ``_held``)
    #: and the GPU episodes that run into the window (``EarlierRuns``: their start and throttled minutes)
    slowdown_c: float = 87.0
    #: Shared with the alert rules (analyzer.site.Thresholds; a site config sets both).
    at_limit_c: float = THRESHOLDS.gpu_temp_limit_celsius
    mem_limit_c: float = THRESHOLDS.memory_temp_limit_celsius
    warn_c: float = 79.0
    excess_c: float = 5.0
    min_slope_c_per_min: float = 0.2
    eta_horizon_s: float = 1800.0
    trend_window_s: float = 900.0
    min_throttle_s: float = THRESHOLDS.thermal_limit_for_seconds
    min_hot_s: float = THRESHOLDS.thermal_warn_for_seconds
    max_gap_steps: int = 2
    max_unknown_steps: int = 2
    max_unknown_s: float = MAX_UNKNOWN_S
    onset_c: float = 1.0
    hold_s: float = 600.0

    # -- physics ---------------------------------------------------------------------------
    def _resistance(self, g: _Grid, temp: np.ndarray, power: np.ndarray, usable: np.ndarray) -> dict[str, float]:
        """Per model: K/W from die to air, from GPUs of one node (one inlet) at one instant."""
        D, T = g.shape
        out: dict[str, float] = {}
        for model in np.unique(g.model):
            sel = g.model == model
            for unit_of in (g.host, np.zeros(D, dtype=object)):  # same node first, else the whole model
                codes, _ = pd.factorize(unit_of[sel])
                ok = usable[sel]
                key = (codes[:, None] * T + np.arange(T)[None, :])[ok]
                P, Y = power[sel][ok], temp[sel][ok]
                n_keys = int(codes.max() + 1) * T if len(codes) else 0
                n = np.bincount(key, minlength=n_keys)
                sp, sy = np.bincount(key, P, n_keys), np.bincount(key, Y, n_keys)
                spp, spy = np.bincount(key, P * P, n_keys), np.bincount(key, P * Y, n_keys)
                with np.errstate(invalid="ignore", divide="ignore"):
                    var = spp / n - (sp / n) ** 2
                    slope = (spy / n - sp * sy / n / n) / var
                good = (n >= 2) & (var >= _MIN_POWER_SPREAD_W**2) & np.isfinite(slope)
                if good.any():
                    out[str(model)] = float(np.clip(np.median(slope[good]), 0.0, _R_MAX))
                    break
            else:
                out[str(model)] = 0.0  # no power spread anywhere: compare raw temperatures of like-loaded peers
        return out

    def detect(self, fleet: Fleet, memory: dict | None = None) -> list[Finding]:
        if not len(fleet.frame) or not (fleet.has("temp") or fleet.has("thermal_throttle")):
            return []
        g = _Grid.build(fleet)
        temp, power = g.matrix(column(fleet, "temp")), g.matrix(column(fleet, "power"))
        flag, memt = g.matrix(column(fleet, "thermal_throttle")), g.matrix(column(fleet, "mem_temp"))
        clk, clkmax = g.matrix(column(fleet, "sm_clock")), g.matrix(column(fleet, "sm_clock_max"))
        flag_known = ~np.isnan(flag)
        proxy = ~flag_known & (temp >= self.at_limit_c)
        limit = (flag == 1.0) | proxy | (memt >= self.mem_limit_c)
        limit_known = flag_known | ~np.isnan(temp) | ~np.isnan(memt)

        # Power-corrected temperature (the inlet-related part) and peers at the same load.
        usable = ~limit & ~np.isnan(temp) & ~np.isnan(power)
        ref_dev = np.isin(g.host.astype(str), list(fleet.reference_hosts()))  # the fleet's references' hosts
        R = self._resistance(g, temp, power, usable & ref_dev[:, None])
        r_dev = np.array([R[str(m)] for m in g.model])
        # With R 0 (no power spread to learn it from) peers are compared on raw temperature.
        level = np.where(r_dev[:, None] > 0, temp - r_dev[:, None] * power, temp)

        node_key = pd.factorize(pd.Series(g.host + "\x00" + g.model.astype(str)))[0]
        rack_known = g.rack != ""
        rack_key = np.where(rack_known, pd.factorize(pd.Series(g.rack + "\x00" + g.model.astype(str)))[0], -1)
        n_node, n_rack = int(node_key.max()) + 1, int(rack_key.max()) + 1 if rack_known.any() else 0
        model_key = pd.factorize(pd.Series(g.model.astype(str)))[0]

        # GPU vs the other GPUs of its node (2 or more), else of its rack.
        node_ref_gpu, node_cnt_gpu = _others_median(level, node_key, n_node)
        peer = np.where(node_cnt_gpu >= 2, node_ref_gpu, np.nan)
        need = np.isnan(peer).all(axis=1) & (rack_key >= 0)
        if n_rack and need.any():  # nodes with fewer than 3 GPUs: compare with the rack's GPUs
            rack_ref_gpu, rack_cnt_gpu = _others_median(level, rack_key, n_rack)
            peer = np.where(np.isnan(peer) & (rack_cnt_gpu >= 2), rack_ref_gpu, peer)
        node_med, _ = _group_median(level, node_key, n_node)
        gpu_excess = level - peer

        step = float(fleet.step)
        k = max(6, round(self.trend_window_s / step))
        gpu_slope = _steady_slope(gpu_excess, g.times, k, gpu_excess >= self.excess_c)

        def urgent(hot_temp: np.ndarray, lim: np.ndarray, slope: np.ndarray) -> np.ndarray:
            eta = self._eta(hot_temp, slope)
            return (hot_temp >= self.warn_c) | lim | ((slope >= self.min_slope_c_per_min)
                                                      & (eta <= self.eta_horizon_s / 60.0))

        gpu_hot = (gpu_excess >= self.excess_c) & urgent(temp, limit, gpu_slope)
        gpu_cond = np.where(limit | gpu_hot, 1.0, np.where(limit_known, 0.0, np.nan))
        # Without peers (a lone GPU) "hot at the same load" is unknown: such rows are judged by the limit alone.

        # Nodes vs the other nodes of their rack (else of the fleet, same model); racks vs the other racks.
        node_dev = np.unique(node_key, return_index=True)[1]  # a device of each node unit
        node_rack = rack_key[node_dev]
        node_model = model_key[node_dev]
        in_rack_cnt = np.bincount(node_rack[node_rack >= 0], minlength=n_rack) if n_rack else np.zeros(0, np.int64)
        has_rack_peers = (node_rack >= 0) & (in_rack_cnt[np.maximum(node_rack, 0)] >= 2) if n_rack \
            else np.zeros(n_node, bool)
        node_parent = np.where(has_rack_peers, node_rack, -1)
        node_ref = _peer_reference(node_med, node_parent, n_rack)
        fleet_ref = _peer_reference(node_med, node_model, int(model_key.max()) + 1, ref_dev[node_dev])
        node_ref = np.where(node_parent[:, None] >= 0, node_ref, fleet_ref)
        node_excess = node_med - node_ref

        hot_by_node = _group_reduce(temp, node_key, n_node, "max")
        lim_by_node = _group_reduce(limit, node_key, n_node, "any")
        node_slope = _steady_slope(node_excess, g.times, k, node_excess >= self.excess_c)
        # A node is "hot together" when most of its GPUs are (median) and it has 2 or more GPUs; urgent as a node
        # through two of its GPUs, like a rack through two nodes: one GPU throttling for a fault of its own in a
        # node a few degrees warm is that GPU's finding (dcgm data, nodes against the fleet: 8 false node findings
        # in 10 seeds of dcgm-exporter's default counters before, each hiding the GPU's true one).
        node_size = np.bincount(node_key, minlength=n_node)
        gpu2, lim2_node = _second(temp, limit, node_key, n_node)
        node_cond = (node_excess >= self.excess_c) & urgent(gpu2, lim2_node, node_slope) & (node_size[:, None] >= 2)

        groups: list[dict[str, Any]] = []
        node_host = g.host[node_dev]
        rack_name = np.empty(n_rack, dtype=object)
        if n_rack:
            rack_dev = np.unique(rack_key[rack_known], return_index=True)
            rack_name[rack_dev[0]] = g.rack[rack_known][rack_dev[1]]
            rack_level, _ = _group_median(node_med[node_rack >= 0], node_rack[node_rack >= 0], n_rack)
            rack_model = np.zeros(n_rack, np.int64)
            rack_model[node_rack[node_rack >= 0]] = node_model[node_rack >= 0]
            rack_is_ref = np.zeros(n_rack, bool)
            rack_is_ref[node_rack[(node_rack >= 0) & ref_dev[node_dev]]] = True
            rack_ref = _peer_reference(rack_level, rack_model, int(model_key.max()) + 1, rack_is_ref)
            rack_excess = rack_level - rack_ref
            rk_dev = np.where(rack_known, rack_key, n_rack)
            hot_by_rack = _group_reduce(temp, rk_dev, n_rack + 1, "max")[:n_rack]
            lim_by_rack = _group_reduce(limit, rk_dev, n_rack + 1, "any")[:n_rack]
            rack_slope = _steady_slope(rack_excess, g.times, k, rack_excess >= self.excess_c)
            # Urgent as a rack: two of its nodes hot or at the limit, not one GPU with a fault of its own in a
            # rack that runs a few degrees warm (critical rack findings on 7 of 20 fresh seeds otherwise).
            hot2, lim2 = _second(hot_by_node[node_rack >= 0], lim_by_node[node_rack >= 0], node_rack[node_rack >= 0],
                                 n_rack)
            rack_cond = (rack_excess >= self.excess_c) & urgent(hot2, lim2, rack_slope) \
                & (in_rack_cnt[:, None] >= 2)
            # A rack's hot nodes: above the other racks' level by excess_c (listed in the evidence).
            node_hot_vs_fleet = np.where(node_rack[:, None] >= 0, node_med - rack_ref[np.maximum(node_rack, 0)],
                                         np.nan) >= self.excess_c

            def rack_members(u: int, sl: slice) -> list[str]:
                return sorted(str(h) for h in node_host[(node_rack == u) & node_hot_vs_fleet[:, sl].any(axis=1)])

            groups += self._group_episodes(fleet, g, "rack", rack_name, rack_cond, rack_excess, rack_level,
                                           rack_slope, hot_by_rack, lim_by_rack, members_of=rack_members, memory=memory)
        groups += self._group_episodes(fleet, g, "node", node_host, node_cond, node_excess, node_med, node_slope,
                                       hot_by_node, lim_by_node, memory=memory, rack_of=np.array(
                                           [rack_name[r] if r >= 0 else "" for r in node_rack], dtype=object))
        groups = self._merge_nodes_into_racks(groups)

        # GPU episodes.
        gpu_findings: list[Finding] = []
        if (gpu_cond == 1.0).any():
            eps = find_episodes(fleet, g.rows(gpu_cond), max_gap_steps=self.max_gap_steps,
                                max_unknown_steps=self.max_unknown_steps,
                                max_unknown_s=self.max_unknown_s, min_duration_s=self.min_throttle_s,
                                split_on=())
            gpu_findings = self._gpu_findings(fleet, g, eps, temp, power, limit, proxy, gpu_excess, gpu_slope, clk,
                                              clkmax, memt, EarlierRuns(memory))
        return self._fold(gpu_findings, groups, fleet, memory)

    # -- helpers ---------------------------------------------------------------------------
    def _eta(self, temp: np.ndarray, slope_c_per_min: np.ndarray) -> np.ndarray:
        """Minutes until ``slowdown_c`` at the current rate (inf when not rising, 0 when there)."""
        with np.errstate(invalid="ignore", divide="ignore"):
            eta = np.where(slope_c_per_min > 0, (self.slowdown_c - temp) / slope_c_per_min, np.inf)
        return np.where(temp >= self.slowdown_c, 0.0, eta)

    def _group_episodes(self, fleet: Fleet, g: _Grid, level: str, names: np.ndarray, cond: np.ndarray,
                        excess: np.ndarray, own: np.ndarray, slope: np.ndarray, hot: np.ndarray, lim: np.ndarray,
                        rack_of: np.ndarray | None = None,
                        members_of: Callable[[int, slice], list[str]] | None = None,
                        memory: dict | None = None) -> list[dict[str, Any]]:
        """Episodes of a group-level condition (units x time), as plain dicts for folding; ``memory``: the
        service's part for this kind (``_held``)."""
        U, T = cond.shape
        if memory is not None:
            cond = self._held(memory, level, names, cond, excess, g.times, fleet)
        if not U or not cond.any():
            return []
        known = ~np.isnan(excess)
        tri = np.where(cond, 1.0, np.where(known, 0.0, np.nan))
        frame = pd.DataFrame({
            "timestamp": np.tile(g.times, U),
            "hostname": pd.Categorical(np.repeat(np.arange(U).astype(str), T)),
            "gpu_share": 1.0,
        })
        pseudo = Fleet(frame=frame, step=fleet.step, start=fleet.start, end=fleet.end)
        eps = find_episodes(pseudo, tri.reshape(-1), max_gap_steps=self.max_gap_steps,
                            max_unknown_steps=self.max_unknown_steps,
                            max_unknown_s=self.max_unknown_s, min_duration_s=self.min_hot_s, split_on=())
        out = []
        for ep in eps.table.itertuples(index=False):
            u = int(ep.hostname)
            t0 = round((ep.start - g.times[0]) / fleet.step)
            t1 = T if ep.open else round((ep.end - g.times[0]) / fleet.step)
            sl = slice(t0, t1)
            on = cond[u, sl]
            start = min(self._rise_start(excess[u], t0, fleet.step), self._rise_start(own[u], t0, fleet.step))
            out.append({
                "level": level, "name": str(names[u]),
                "rack": str(rack_of[u]) if rack_of is not None else str(names[u]),
                "start": float(g.times[start]), "urgent_from": float(ep.start),
                "end": None if ep.open else float(ep.end),
                "excess_c": float(np.nanmean(excess[u, sl][on])), "excess_max_c": float(np.nanmax(excess[u, sl])),
                "slope_onset": float(slope[u, t0]) if np.isfinite(slope[u, t0]) else None,
                "temp_onset": float(hot[u, t0]) if np.isfinite(hot[u, t0]) else None,
                "temp_max": float(np.nanmax(hot[u, sl])),
                "limit_minutes": float(lim[u, sl].sum() * fleet.step / 60.0),
                "members": members_of(u, sl) if members_of is not None else [str(names[u])],
            })
        return out

    def _held(self, memory: dict, level: str, names: np.ndarray, cond: np.ndarray, excess: np.ndarray,
              times: np.ndarray, fleet: Fleet) -> np.ndarray:
        """``cond`` with the cells a recent finding of the unit holds: from where an earlier run's finding of it
        began, while its excess stays >= ``excess_c``, until ``hold_s`` after it was last urgent. Why: each run
        re-fits R and the fleet's reference, so a node's excess at one instant moves ~0.5 C from run to run, and
        the ramp test (each third of the trend window rising at half its rate) then fails at some samples: a
        ramping node's early warning came and went from one run to the next (dcgm-exporter's default counters,
        nodes against the fleet: 7 withdrawals over 9 rack-cooling runs)."""
        last = memory.setdefault("urgent_last", {})
        spans = memory.get("group_spans", {})
        index = {_unit(level, n): u for u, n in enumerate(names)}
        urgent = np.flatnonzero(cond.any(axis=1))
        for u in urgent:
            key = _unit(level, names[u])
            last[key] = max(last.get(key, -np.inf), float(times[np.flatnonzero(cond[u])[-1]]))
        out = cond
        for key, t_last in list(last.items()):
            if fleet.end - t_last > self.hold_s:
                del last[key]
            elif key in index and spans.get(key):
                u = index[key]
                hold = (times >= spans[key][-1][0]) & (times <= t_last + self.hold_s) & (excess[u] >= self.excess_c)
                if hold.any():
                    out = out.copy() if out is cond else out
                    out[u] |= hold
        return out

    def _rise_start(self, excess: np.ndarray, t0: int, step: float) -> int:
        """Where a group's excess left its usual level before it became urgent at ``t0``: the problem's start
        (a cooling failure ramps for 10-20 minutes before the ETA to the slowdown point is under
        ``eta_horizon_s``; the finding says when it began, not when it became urgent). The usual level is the
        median excess over the two trend windows before the one ending at ``t0``; the start is the sample after
        the last one (3-sample mean, for the 1 C sensor quantization) within ``onset_c`` of it. Without that
        history (the data begins inside the ramp) ``t0`` stays the start. Called with the excess over peers and
        with the group's own level; the earlier of the two is the start (module docstring)."""
        k = max(6, round(self.trend_window_s / step))
        lo, hi = max(0, t0 - 3 * k), max(0, t0 - k)
        smooth = pd.Series(excess[: t0 + 1]).rolling(3, center=True, min_periods=1).mean().to_numpy()
        if hi - lo < k or np.isnan(smooth[lo:hi]).all():
            return t0
        usual = float(np.nanmedian(smooth[lo:hi]))
        at_usual = np.flatnonzero(smooth[:t0] <= usual + self.onset_c)
        return int(at_usual[-1]) + 1 if len(at_usual) else t0

    @staticmethod
    def _merge_nodes_into_racks(groups: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Node episodes of one rack overlapping in time: one rack episode (several nodes hot together)."""
        racks = [x for x in groups if x["level"] == "rack"]
        nodes = []
        for n in (x for x in groups if x["level"] == "node"):  # a node inside a hot rack is part of it
            home = next((r for r in racks if r["name"] == n["rack"] and _overlaps(n, r)), None)
            if home is None:
                nodes.append(n)
                continue
            home["start"] = min(home["start"], n["start"])
            home["urgent_from"] = min(home["urgent_from"], n["urgent_from"])
            home["end"] = None if home["end"] is None or n["end"] is None else max(home["end"], n["end"])
            home["members"] = sorted({*home["members"], n["name"]})
            home["limit_minutes"] = max(home["limit_minutes"], n["limit_minutes"])
        out = list(racks)
        by_rack: dict[str, list[dict[str, Any]]] = {}
        for n in nodes:
            by_rack.setdefault(n["rack"], []).append(n)
        for rack, ns in by_rack.items():
            ns.sort(key=lambda x: x["start"])
            clusters: list[list[dict[str, Any]]] = []
            for n in ns:
                end = max((c["end"] if c["end"] is not None else np.inf) for c in clusters[-1]) if clusters else None
                if clusters and n["start"] < end:
                    clusters[-1].append(n)
                else:
                    clusters.append([n])
            for c in clusters:
                hosts = sorted({x["name"] for x in c})
                if len(hosts) < 2 or not rack:
                    out.extend(c)
                    continue
                ends = [x["end"] for x in c]
                out.append({
                    "level": "rack", "name": rack, "rack": rack, "start": min(x["start"] for x in c),
                    "urgent_from": min(x["urgent_from"] for x in c),
                    "end": None if any(e is None for e in ends) else max(ends),
                    "excess_c": float(np.mean([x["excess_c"] for x in c])),
                    "excess_max_c": max(x["excess_max_c"] for x in c),
                    "slope_onset": c[0]["slope_onset"], "temp_onset": c[0]["temp_onset"],
                    "temp_max": max(x["temp_max"] for x in c),
                    "limit_minutes": max(x["limit_minutes"] for x in c), "members": hosts,
                })
        return out

    def _gpu_findings(self, fleet: Fleet, g: _Grid, eps: Episodes, temp: np.ndarray, power: np.ndarray,
                      limit: np.ndarray, proxy: np.ndarray, excess: np.ndarray,
                      slope: np.ndarray, clk: np.ndarray, clkmax: np.ndarray, memt: np.ndarray,
                      runs: EarlierRuns) -> list[Finding]:
        """GPU findings; ``runs``: the episodes the service's previous run showed, which an episode opening the
        window continues (``carried_totals``: its start, minutes and throttled minutes as a whole history gives)."""
        if not len(eps):
            return []
        lim_rows = g.rows(limit.astype(float))
        lim_share = eps.mean(lim_rows)
        proxy_share = eps.mean(g.rows(proxy.astype(float)))
        means = {name: eps.mean(g.rows(m)) for name, m in
                 (("temp", temp), ("power", power), ("excess", excess), ("mem_temp", memt))}
        with np.errstate(invalid="ignore", divide="ignore"):
            clock_ratio = eps.mean(g.rows(np.where(limit, clk / clkmax, np.nan)))
        t_rows = g.rows(temp)
        # Peak temperature and slope at onset need per-episode rows: the sorted member array.
        tv = t_rows[eps.order]
        peak = np.full(len(eps), np.nan)
        sel = (eps.member >= 0) & ~np.isnan(tv)
        np.fmax.at(peak, eps.member[sel], tv[sel])
        slope_rows = g.rows(slope)[eps.order]
        first_pos = np.full(len(eps), -1)
        idx = np.flatnonzero(eps.member >= 0)
        first_pos[eps.member[idx[::-1]]] = idx[::-1]
        onset_slope = np.where(first_pos >= 0, slope_rows[np.maximum(first_pos, 0)], np.nan)
        onset_temp = np.where(first_pos >= 0, tv[np.maximum(first_pos, 0)], np.nan)
        out = []
        for i, ep in enumerate(eps.table.itertuples(index=False)):
            throttled = float(lim_share[i]) > 0
            if not throttled and float(ep.duration_s) < self.min_hot_s:
                continue  # hot-at-same-load without throttling must persist min_hot_s
            gap = max(self.max_gap_steps * fleet.step, self.max_unknown_s)
            ep, totals = carried_totals(runs, ep, fleet, gap,
                                        throttled_s=float(lim_share[i]) * float(ep.true_steps) * fleet.step)
            minutes, lim_min = float(ep.duration_s) / 60.0, totals["throttled_s"] / 60.0
            low = float(proxy_share[i]) > 0.5
            eta = float(self._eta(np.array(onset_temp[i]), np.array(onset_slope[i])))
            ev = {
                "minutes": minutes, "throttled_minutes": lim_min, "temp_c": float(means["temp"][i]),
                "temp_max_c": float(peak[i]), "mem_temp_c": float(means["mem_temp"][i]),
                "power_w": float(means["power"][i]), "excess_over_peers_c": float(means["excess"][i]),
                "sm_clock_ratio_while_throttled": float(clock_ratio[i]),
                "slope_c_per_min": float(onset_slope[i]), "eta_to_slowdown_min": eta if np.isfinite(eta) else None,
                "slowdown_c": self.slowdown_c,
                "signal": f"temperature >= {self.at_limit_c:g} C (throttle reasons not collected)" if low
                else "thermal clock-event flag" if throttled else "temperature vs peers at the same power",
            }
            out.append(Finding(
                kind=self.kind, severity="critical" if throttled else "warning",
                summary=self._gpu_summary(ep, ev, throttled),
                start=float(ep.start), end=None if ep.open else float(ep.end),
                score=float(np.clip(max(lim_min / max(minutes, 1e-9),
                                        (ev["excess_over_peers_c"] or 0.0) / 20.0 if np.isfinite(
                                            ev["excess_over_peers_c"]) else 0.0), 0.0, 1.0)),
                hostname=ep.hostname, gpu=int(ep.gpu) if ep.gpu and str(ep.gpu).isdigit() else None, uuid=ep.uuid,
                job=ep.job, namespace=ep.namespace, pod=ep.pod, rack=ep.rack or None,
                confidence="low" if low else "high", evidence=ev,
            ))
        return out

    def _gpu_summary(self, ep: Any, ev: dict[str, Any], throttled: bool) -> str:
        where = f"GPU {ep.gpu} on {ep.hostname}"
        exc = ev["excess_over_peers_c"]
        hot = f", {exc:.0f} C above its peers at the same power" if np.isfinite(exc) and exc >= self.excess_c else ""
        if throttled:
            clk = ev["sm_clock_ratio_while_throttled"]
            clk_s = f", SM clock at {clk:.0%} of max" if np.isfinite(clk) else ""
            what = "thermally throttled" if "flag" in ev["signal"] else (
                "sat at its thermal slowdown temperature (throttle reasons not collected)")
            return (f"{where} {what} for {format_duration(ev['throttled_minutes'] * 60)} (die up to "
                    f"{ev['temp_max_c']:.0f} C{hot}{clk_s}): check its fans, heatsink and thermal paste; drain it if "
                    f"it keeps throttling.")
        eta = ev["eta_to_slowdown_min"]
        trend = (f" and rising {ev['slope_c_per_min']:.1f} C/min, reaching the {self.slowdown_c:g} C slowdown point "
                 f"in ~{eta:.0f} min" if eta is not None and eta > 0 else "")
        return (f"{where} runs at {ev['temp_c']:.0f} C{hot}{trend}: check its fans, heatsink and thermal paste "
                f"before it throttles.")

    def _fold(self, gpu: list[Finding], groups: list[dict[str, Any]], fleet: Fleet,
              memory: dict | None = None) -> list[Finding]:
        """Group findings absorb the GPU findings inside them (same host/rack, overlapping in time); ``memory``:
        the service's part for this kind, where earlier runs' group findings absorb the tails of theirs
        (``_tails``)."""
        host_rack = {}
        if "rack" in fleet.frame.columns:
            pairs = fleet.frame[["hostname", "rack"]].drop_duplicates()
            host_rack = {str(h): str(r) for h, r in zip(pairs["hostname"], pairs["rack"], strict=True) if r == r}
        w_end = fleet.end
        kept: list[Finding] = []
        folded: dict[int, list[Finding]] = {i: [] for i in range(len(groups))}
        for f in gpu:
            home = None
            for i, gr in enumerate(groups):
                inside = (f.hostname == gr["name"]) if gr["level"] == "node" else (
                    host_rack.get(f.hostname or "") == gr["name"])
                g_end = w_end if gr["end"] is None else gr["end"]
                f_end = w_end if f.end is None else f.end
                if inside and f.start < g_end and gr["start"] < f_end:
                    home = i
                    break
            if home is None:
                kept.append(f)
            else:
                folded[home].append(f)
        found = [self._group_finding(gr, folded[i]) for i, gr in enumerate(groups)]
        return (kept if memory is None else self._tails(kept, found, host_rack, fleet, memory)) + found

    @staticmethod
    def _tails(gpu: list[Finding], groups: list[Finding], host_rack: dict[str, str], fleet: Fleet,
               memory: dict) -> list[Finding]:
        """The GPU findings less those an earlier run's node or rack finding held: ended, and begun inside the
        span that finding covered (its GPUs then). Why: serve's window cuts a long node episode to the minutes
        at its start, too few for the node rule (``min_hot_s`` 5 min) but enough for the GPU rule (60 s at the
        limit), so as a failed rack's cooling came back every GPU of it was a critical finding of its own with a
        new id for a run or two (24 in rack-cooling, dcgm-exporter's default counters). Spans are kept per node
        and rack while they reach into the window."""
        spans = memory.setdefault("group_spans", {})
        for g in groups:
            level = g.evidence["level"]
            key = _unit(level, g.hostname if level == "node" else g.rack)
            spans.setdefault(key, []).append([g.start, fleet.end if g.end is None else g.end])
        for key in list(spans):
            kept = [sp for sp in union_spans(spans[key]) if sp[1] >= fleet.start]
            if kept:
                spans[key] = kept
            else:
                del spans[key]

        def held(f: Finding) -> bool:
            rack = host_rack.get(f.hostname or "")
            homes = spans.get(_unit("node", f.hostname), []) + spans.get(_unit("rack", rack), [])
            return f.end is not None and any(a <= f.start <= b for a, b in homes)

        return [f for f in gpu if not held(f)]

    def _group_finding(self, gr: dict[str, Any], inner: list[Finding]) -> Finding:
        start = min([gr["start"], *(f.start for f in inner)])
        ends = [gr["end"], *(f.end for f in inner)]
        end = None if any(e is None for e in ends) else max(ends)
        throttled = gr["limit_minutes"] > 0 or any(f.severity == "critical" for f in inner)
        slope, t_on = gr["slope_onset"], gr["temp_onset"]
        eta = float(self._eta(np.array(t_on if t_on is not None else np.nan), np.array(
            slope if slope is not None else np.nan)))
        gpus = sorted({f"{f.hostname}/{f.gpu}" for f in inner})
        members = gr["members"] or sorted({f.hostname for f in inner if f.hostname})
        ev = {
            "level": gr["level"], "excess_over_peers_c": gr["excess_c"], "excess_max_c": gr["excess_max_c"],
            "temp_max_c": gr["temp_max"], "slope_c_per_min": slope,
            "eta_to_slowdown_min": eta if np.isfinite(eta) else None, "slowdown_c": self.slowdown_c,
            "throttled_minutes": gr["limit_minutes"], "nodes": members, "gpus_folded": gpus,
            "urgent_from": gr["urgent_from"],
        }
        if gr["level"] == "rack":
            who = f"rack {gr['name']}: the GPUs of {len(members)} node{'s' if len(members) != 1 else ''}" if members \
                else f"rack {gr['name']}: its GPUs"
            peers, action = "the other racks", "check the rack's cooling (CRAC/CDU, doors, blanking panels)"
        else:
            who, peers = f"node {gr['name']}: its GPUs", "the other nodes"
            action = "check the node's fans, airflow and inlet (blocked vents, failed fan module)"
        trend = ""
        if slope is not None and slope >= self.min_slope_c_per_min and np.isfinite(eta) and eta > 0:
            trend = (f" and rising {slope:.1f} C/min, reaching the {self.slowdown_c:g} C slowdown point in "
                     f"~{eta:.0f} min")
        thr = f"; {len(gpus)} GPU(s) thermally throttled" if throttled and gpus else (
            "; GPUs thermally throttled" if throttled else "")
        summary = (f"{who} {gr['excess_c']:.0f}-{gr['excess_max_c']:.0f} C above {peers} at the same power"
                   f"{trend}{thr}: {action}.")
        return Finding(
            kind=self.kind, severity="critical" if throttled else "warning", summary=summary, start=start, end=end,
            score=float(np.clip(gr["excess_max_c"] / 20.0, 0.0, 1.0)),
            hostname=gr["name"] if gr["level"] == "node" else None, gpu=None,
            rack=gr["rack"] or None, evidence=ev,
        )

