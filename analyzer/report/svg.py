"""Tiny inline-SVG charts for the HTML report: no plotting library, no external files.

Every chart is a self-contained ``<svg>`` element (well-formed XML, no namespace URL so the
page holds no external reference) with a ``<title>``/``<desc>`` for screen readers, axes,
ticks, axis labels with units and a legend. Every string is escaped here: callers pass raw
text (job names come from users).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

import numpy as np

WIDTH, HEIGHT = 920, 300
MARGIN_LEFT, MARGIN_RIGHT, MARGIN_TOP, MARGIN_BOTTOM = 64, 20, 34, 46
AXIS, GRID, TEXT, MUTED = "#333333", "#e3e3e3", "#222222", "#666666"

Formatter = Callable[[float], str]


def esc(text: object) -> str:
    """Text or attribute value, escaped for HTML and XML alike."""
    return escape(str(text), quote=True)


def pct(v: float) -> str:
    return f"{v * 100:.0f}%"


def _num(v: float) -> str:
    return f"{v:.1f}".rstrip("0").rstrip(".") if abs(v) < 1000 else f"{v:,.0f}"


def nice_ticks(lo: float, hi: float, target: int = 5) -> np.ndarray:
    """Round tick values covering [lo, hi] (steps of 1, 2, 2.5 or 5 x 10^k)."""
    if not (math.isfinite(lo) and math.isfinite(hi)) or hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(target, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step + 1e-9) * step
    last = math.ceil(hi / step - 1e-9) * step
    return np.round(np.arange(first, last + step / 2, step), 10)


#: Candidate time-tick spacings in seconds (1 min .. 4 weeks).
_TIME_STEPS = (60, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400, 172800, 604800, 2419200)


def time_ticks(lo: float, hi: float, target: int = 7) -> tuple[np.ndarray, str]:
    """Tick times aligned on UTC multiples of a round spacing, and the strftime format."""
    span = max(hi - lo, 1.0)
    step = next((s for s in _TIME_STEPS if span / s <= target), _TIME_STEPS[-1])
    first = math.ceil(lo / step) * step
    ticks = np.arange(first, hi + 1e-6, step, dtype=float)
    if step >= 86400:
        fmt = "%m-%d"
    elif span > 86400:
        fmt = "%m-%d %H:%M"
    else:
        fmt = "%H:%M"
    return ticks, fmt


def _utc(ts: float, fmt: str) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime(fmt)


@dataclass
class Line:
    """One series of a line chart; NaN values leave a gap (unknown is not drawn as 0)."""

    label: str
    x: np.ndarray
    y: np.ndarray
    color: str
    dashed: bool = False
    area: bool = False


class _Frame:
    """Plot area geometry and the data -> pixel mappings."""

    def __init__(self, x0: float, x1: float, y0: float, y1: float, width: int, height: int, left: int = MARGIN_LEFT):
        self.left, self.right = left, width - MARGIN_RIGHT
        self.top, self.bottom = MARGIN_TOP, height - MARGIN_BOTTOM
        self.x0, self.x1 = x0, (x1 if x1 > x0 else x0 + 1.0)
        self.y0, self.y1 = y0, (y1 if y1 > y0 else y0 + 1.0)

    def px(self, x: np.ndarray | float) -> np.ndarray:
        return self.left + (np.asarray(x, float) - self.x0) / (self.x1 - self.x0) * (self.right - self.left)

    def py(self, y: np.ndarray | float) -> np.ndarray:
        return self.bottom - (np.asarray(y, float) - self.y0) / (self.y1 - self.y0) * (self.bottom - self.top)


def _open(chart_id: str, title: str, desc: str, width: int, height: int) -> list[str]:
    cid = esc(chart_id)
    return [
        f'<svg class="chart" width="{width}" height="{height}" viewBox="0 0 {width} {height}" role="img" '
        f'aria-labelledby="{cid}-t {cid}-d" font-family="system-ui, -apple-system, Segoe UI, sans-serif" '
        f'font-size="12">',
        f'<title id="{cid}-t">{esc(title)}</title>',
        f'<desc id="{cid}-d">{esc(desc)}</desc>',
        f'<text x="{MARGIN_LEFT}" y="18" font-size="14" font-weight="600" fill="{TEXT}">{esc(title)}</text>',
    ]


def _y_axis(f: _Frame, ticks: np.ndarray, fmt: Formatter, label: str) -> list[str]:
    out = []
    for t in ticks:
        y = float(f.py(t))
        out.append(f'<line x1="{f.left}" y1="{y:.1f}" x2="{f.right}" y2="{y:.1f}" stroke="{GRID}"/>')
        out.append(f'<text x="{f.left - 6}" y="{y + 4:.1f}" text-anchor="end" fill="{MUTED}">{esc(fmt(t))}</text>')
    mid = (f.top + f.bottom) / 2
    out.append(f'<text x="14" y="{mid:.1f}" transform="rotate(-90 14 {mid:.1f})" text-anchor="middle" '
               f'fill="{TEXT}">{esc(label)}</text>')
    out.append(f'<line x1="{f.left}" y1="{f.top}" x2="{f.left}" y2="{f.bottom}" stroke="{AXIS}"/>')
    return out


def _x_axis(f: _Frame, ticks: np.ndarray, labels: Sequence[str], label: str, width: int, height: int) -> list[str]:
    out = [f'<line x1="{f.left}" y1="{f.bottom}" x2="{f.right}" y2="{f.bottom}" stroke="{AXIS}"/>']
    for t, text in zip(ticks, labels, strict=True):
        x = float(f.px(t))
        out.append(f'<line x1="{x:.1f}" y1="{f.bottom}" x2="{x:.1f}" y2="{f.bottom + 5}" stroke="{AXIS}"/>')
        out.append(f'<text x="{x:.1f}" y="{f.bottom + 18}" text-anchor="middle" fill="{MUTED}">{esc(text)}</text>')
    out.append(f'<text x="{(f.left + f.right) / 2:.1f}" y="{height - 8}" text-anchor="middle" '
               f'fill="{TEXT}">{esc(label)}</text>')
    return out


def _legend(items: Sequence[tuple[str, str, str]], right: float) -> list[str]:
    """Legend entries (label, color, style "line" | "dash" | "box") right-aligned on the title row."""
    out, x = [], right
    for label, color, style in reversed(items):
        w = 7 * len(label) + 34
        x -= w
        if style == "box":
            out.append(f'<rect x="{x + 4:.0f}" y="8" width="14" height="12" fill="{color}"/>')
        else:
            dash = ' stroke-dasharray="6 4"' if style == "dash" else ""
            out.append(f'<line x1="{x:.0f}" y1="14" x2="{x + 22:.0f}" y2="14" stroke="{color}" '
                       f'stroke-width="3"{dash}/>')
        out.append(f'<text x="{x + 27:.0f}" y="18" fill="{TEXT}">{esc(label)}</text>')
    return out


def _segments(x: np.ndarray, y: np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
    """Runs of consecutive known points (NaN breaks the line)."""
    known = ~np.isnan(y)
    if not known.any():
        return []
    edges = np.flatnonzero(np.diff(np.concatenate(([0], known.astype(np.int8), [0]))))
    return [(x[a:b], y[a:b]) for a, b in zip(edges[::2], edges[1::2], strict=True)]


def empty_chart(chart_id: str, title: str, message: str, width: int = WIDTH, height: int = 120) -> str:
    """A placeholder in place of a chart whose data is unknown or empty (said so, not drawn as 0)."""
    out = _open(chart_id, title, message, width, height)
    out.append(f'<rect x="{MARGIN_LEFT}" y="{MARGIN_TOP}" width="{width - MARGIN_LEFT - MARGIN_RIGHT}" '
               f'height="{height - MARGIN_TOP - 12}" fill="#f6f6f6" stroke="{GRID}"/>')
    out.append(f'<text x="{width / 2:.0f}" y="{(MARGIN_TOP + height) / 2 + 2:.0f}" text-anchor="middle" '
               f'fill="{MUTED}">{esc(message)}</text>')
    out.append("</svg>")
    return "\n".join(out)


def line_chart(
    chart_id: str,
    lines: Sequence[Line],
    *,
    title: str,
    desc: str,
    y_label: str,
    x_range: tuple[float, float],
    y_range: tuple[float, float] | None = None,
    y_fmt: Formatter = pct,
    x_label: str = "time (UTC)",
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Lines over time (x in unix seconds). ``y_range`` is widened to hold the data."""
    ys = [ln.y[~np.isnan(ln.y)] for ln in lines]
    ys = [y for y in ys if len(y)]
    lo, hi = y_range if y_range is not None else (0.0, 0.0)
    if ys:
        lo, hi = min(lo, *(float(y.min()) for y in ys)), max(hi, *(float(y.max()) for y in ys))
    yt = nice_ticks(lo, hi)
    f = _Frame(x_range[0], x_range[1], float(yt[0]), float(yt[-1]), width, height)
    xt, xfmt = time_ticks(*x_range)
    out = _open(chart_id, title, desc, width, height)
    out += _y_axis(f, yt, y_fmt, y_label)
    out += _x_axis(f, xt, [_utc(t, xfmt) for t in xt], x_label, width, height)
    zero = float(f.py(0.0)) if yt[0] < 0 < yt[-1] else None
    if zero is not None:
        out.append(f'<line x1="{f.left}" y1="{zero:.1f}" x2="{f.right}" y2="{zero:.1f}" stroke="{AXIS}"/>')
    base = float(f.py(max(f.y0, 0.0)))
    for ln in lines:
        for sx, sy in _segments(np.asarray(ln.x, float), np.asarray(ln.y, float)):
            px, py = f.px(sx), f.py(sy)
            pts = " ".join(f"{a:.1f},{b:.1f}" for a, b in zip(px, py, strict=True))
            if ln.area:
                out.append(f'<polygon points="{px[0]:.1f},{base:.1f} {pts} {px[-1]:.1f},{base:.1f}" '
                           f'fill="{ln.color}" fill-opacity="0.12" stroke="none"/>')
            dash = ' stroke-dasharray="6 4"' if ln.dashed else ""
            if len(sx) == 1:
                out.append(f'<circle cx="{px[0]:.1f}" cy="{py[0]:.1f}" r="2.5" fill="{ln.color}"/>')
            else:
                out.append(f'<polyline points="{pts}" fill="none" stroke="{ln.color}" stroke-width="2" '
                           f'stroke-linejoin="round"{dash}/>')
    out += _legend([(ln.label, ln.color, "dash" if ln.dashed else "line") for ln in lines], f.right)
    out.append("</svg>")
    return "\n".join(out)


def _ellipsize(text: str, n: int) -> str:
    return text if len(text) <= n else text[: n - 1] + "…"


BAR_H, BAR_GAP = 20, 8


def _hbar_frame(
    chart_id: str, labels: Sequence[str], top: float, title: str, desc: str, x_label: str, width: int,
    label_chars: int,
) -> tuple[_Frame, list[str], list[float]]:
    """Frame, grid, value axis and row labels of a horizontal bar chart; returns the open SVG
    lines and each row's y so the caller only draws its bars."""
    height = MARGIN_TOP + 8 + len(labels) * (BAR_H + BAR_GAP) + MARGIN_BOTTOM
    left = 16 + 7 * min(label_chars, max((len(s) for s in labels), default=4))
    xt = nice_ticks(0.0, top)
    f = _Frame(0.0, float(xt[-1]), 0.0, 1.0, width - 90, height, left=left)
    out = _open(chart_id, title, desc, width, height)
    for t in xt:
        x = float(f.px(t))
        out.append(f'<line x1="{x:.1f}" y1="{f.top}" x2="{x:.1f}" y2="{f.bottom}" stroke="{GRID}"/>')
    out += _x_axis(f, xt, [_num(t) for t in xt], x_label, width, height)
    out.append(f'<line x1="{f.left}" y1="{f.top}" x2="{f.left}" y2="{f.bottom}" stroke="{AXIS}"/>')
    rows = [f.top + 8 + i * (BAR_H + BAR_GAP) for i in range(len(labels))]
    for y, label in zip(rows, labels, strict=True):
        out.append(f'<text x="{f.left - 6}" y="{y + 14}" text-anchor="end" fill="{TEXT}">'
                   f'<title>{esc(label)}</title>{esc(_ellipsize(label, label_chars))}</text>')
    return f, out, rows


def hbar_chart(
    chart_id: str,
    labels: Sequence[str],
    values: Sequence[float],
    *,
    title: str,
    desc: str,
    x_label: str,
    value_text: Sequence[str] | None = None,
    color: str = "#c0504d",
    legend: str | None = None,
    width: int = WIDTH,
    label_chars: int = 30,
) -> str:
    """Horizontal bars, one per label, top to bottom in the given order."""
    vals = np.asarray(values, float)
    top = float(np.nanmax(vals)) if len(labels) and np.isfinite(vals).any() else 1.0
    f, out, rows = _hbar_frame(chart_id, labels, top, title, desc, x_label, width, label_chars)
    texts = value_text if value_text is not None else [_num(v) for v in vals]
    for y, label, v, vt in zip(rows, labels, vals, texts, strict=True):
        w = float(f.px(v)) - f.left if np.isfinite(v) else 0.0
        out.append(f'<rect x="{f.left}" y="{y}" width="{max(w, 0.0):.1f}" height="{BAR_H}" fill="{color}">'
                   f'<title>{esc(label)}: {esc(vt)}</title></rect>')
        out.append(f'<text x="{f.left + max(w, 0.0) + 5:.1f}" y="{y + 14}" fill="{TEXT}">{esc(vt)}</text>')
    if legend:
        out += _legend([(legend, color, "box")], width - MARGIN_RIGHT)
    out.append("</svg>")
    return "\n".join(out)


def histogram(
    chart_id: str,
    edges: np.ndarray,
    heights: np.ndarray,
    *,
    title: str,
    desc: str,
    x_label: str,
    y_label: str,
    x_fmt: Formatter = pct,
    y_fmt: Formatter = _num,
    color: str = "#4f81bd",
    legend: str | None = None,
    markers: Sequence[tuple[float, str, str]] = (),
    width: int = WIDTH,
    height: int = HEIGHT,
) -> str:
    """Bars over contiguous bins ``edges[i]..edges[i+1]``; ``markers`` are (x, label, color) vertical lines."""
    yt = nice_ticks(0.0, float(np.max(heights)) if len(heights) and np.max(heights) > 0 else 1.0)
    f = _Frame(float(edges[0]), float(edges[-1]), 0.0, float(yt[-1]), width, height)
    out = _open(chart_id, title, desc, width, height)
    out += _y_axis(f, yt, y_fmt, y_label)
    xt = nice_ticks(float(edges[0]), float(edges[-1]), target=10)
    out += _x_axis(f, xt, [x_fmt(t) for t in xt], x_label, width, height)
    for a, b, h in zip(edges[:-1], edges[1:], heights, strict=True):
        x0, x1, y = float(f.px(a)), float(f.px(b)), float(f.py(h))
        out.append(f'<rect x="{x0 + 1:.1f}" y="{y:.1f}" width="{max(x1 - x0 - 2, 0.5):.1f}" '
                   f'height="{f.bottom - y:.1f}" fill="{color}">'
                   f'<title>{esc(x_fmt(a))}–{esc(x_fmt(b))}: {esc(y_fmt(h))} {esc(y_label)}</title></rect>')
    items = [(legend, color, "box")] if legend else []
    for x, label, mcolor in markers:
        if math.isfinite(x):
            px = float(f.px(x))
            out.append(f'<line x1="{px:.1f}" y1="{f.top}" x2="{px:.1f}" y2="{f.bottom}" stroke="{mcolor}" '
                       f'stroke-width="2" stroke-dasharray="6 4"/>')
            items.append((label, mcolor, "dash"))
    out += _legend(items, f.right)
    out.append("</svg>")
    return "\n".join(out)


def stacked_hbar_chart(
    chart_id: str,
    labels: Sequence[str],
    stacks: Sequence[tuple[str, str, Sequence[float]]],
    *,
    title: str,
    desc: str,
    x_label: str,
    value_fmt: Callable[[float], str] | None = None,
    width: int = WIDTH,
    label_chars: int = 30,
) -> str:
    """Horizontal bars stacked left to right from ``stacks`` = (label, color, one value per bar):
    one bar per group with its parts (cost: effective vs each kind of waste)."""
    n = len(labels)
    vals = np.array([np.nan_to_num(np.asarray(v, float)) for _, _, v in stacks]).reshape(len(stacks), n)
    totals = vals.sum(axis=0) if len(stacks) else np.zeros(n)
    fmt = value_fmt or _num
    top = float(totals.max()) if n and totals.max() > 0 else 1.0
    f, out, rows = _hbar_frame(chart_id, labels, top, title, desc, x_label, width, label_chars)
    for i, (y, label) in enumerate(zip(rows, labels, strict=True)):
        x0 = 0.0
        for (name, color, _), v in zip(stacks, vals[:, i], strict=True):
            if v <= 0:
                continue
            a, b = float(f.px(x0)), float(f.px(x0 + v))
            out.append(f'<rect x="{a:.1f}" y="{y}" width="{max(b - a, 0.0):.1f}" height="{BAR_H}" fill="{color}">'
                       f'<title>{esc(label)}: {esc(name)} {esc(fmt(v))}</title></rect>')
            x0 += v
        out.append(f'<text x="{float(f.px(x0)) + 5:.1f}" y="{y + 14}" fill="{TEXT}">{esc(fmt(totals[i]))}</text>')
    legend = _legend([(name, color, "box") for name, color, _ in stacks], width - MARGIN_RIGHT)
    # The legend shares the title row: with many entries it goes on a row of its own below the title.
    out += [s.replace(' y="8"', ' y="22"').replace(' y="18"', ' y="32"') for s in legend]
    out.append("</svg>")
    return "\n".join(out)
