"""Write simulated series as an OpenMetrics text file with timestamps.

That file is what ``promtool tsdb create-blocks-from openmetrics`` backfills into
Prometheus and what the analyzer reads offline, so the writer follows the rules promtool
enforces: one ``# TYPE``/``# HELP`` (and ``# UNIT`` only where the unit is a suffix of
the family name) per family, every series of a family contiguous, counter samples named
``<family>_total``, samples of a series in time order, ``# EOF`` last. A NaN value means
"no sample then" and is skipped, never written as 0.

Formatting is the hot path (millions of lines for a day of a fleet): the timestamp
strings are built once per file, each series' label set once, and values are rendered
with ``repr`` over ``ndarray.tolist()`` (shortest round-trip text, bulk ``str.join``).
"""

from __future__ import annotations

import gzip
import io
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np

from exporter.simulator.dcgm_dialect import DcgmOptions, to_dcgm
from exporter.simulator.series import SeriesItem


class Family(Protocol):
    """What the writer needs of a family: ``exporter.schema.Metric`` fits, as does DcgmFamily."""

    @property
    def family_name(self) -> str: ...

    type: str
    unit: str
    help: str


@dataclass
class WriteStats:
    """What was written; tests compare it with what promtool loaded."""

    families: int = 0
    series: int = 0
    samples: int = 0
    min_time: float = math.inf
    max_time: float = -math.inf


def escape_label_value(value: str) -> str:
    """OpenMetrics label-value escaping: backslash, double quote and newline."""
    if "\\" in value or '"' in value or "\n" in value:
        value = value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return value


def escape_help(text: str) -> str:
    """OpenMetrics HELP escaping: backslash and newline (quotes stay as they are)."""
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def format_labels(labels: Mapping[str, str]) -> str:
    """``{a="x",b="y"}`` in the given order, or "" for no labels."""
    if not labels:
        return ""
    return "{" + ",".join(f'{k}="{escape_label_value(str(v))}"' for k, v in labels.items()) + "}"


def _format_value(v: float) -> str:
    if v == math.inf:
        return "+Inf"
    if v == -math.inf:
        return "-Inf"
    return repr(v)


def _timestamp_suffixes(times: np.ndarray) -> list[str]:
    """`` <ts>\\n`` per sample time, float seconds (``1700000000.0``, ``1700000000.25``)."""
    return [f" {t!r}\n" for t in np.asarray(times, dtype=np.float64).tolist()]


def _header(family: Family) -> str:
    name = family.family_name
    lines = [f"# TYPE {name} {family.type}\n"]
    if family.unit and name.endswith("_" + family.unit):
        lines.append(f"# UNIT {name} {family.unit}\n")
    if family.help:
        lines.append(f"# HELP {name} {escape_help(family.help)}\n")
    return "".join(lines)


def write_openmetrics(out: TextIO, series: Iterable[SeriesItem], times: np.ndarray) -> WriteStats:
    """Stream ``(family, labels, values)`` series, values aligned with ``times``, to ``out``.

    Series must arrive grouped by family (promtool rejects interleaved families); a family
    seen again after another one raises ValueError. Families with no sample at all are
    left out entirely. Writes the closing ``# EOF``.
    """
    times = np.asarray(times, dtype=np.float64)
    if times.ndim != 1:
        raise ValueError("times must be one-dimensional")
    if times.size > 1 and not np.all(np.diff(times) > 0):
        raise ValueError("times must be strictly increasing")
    suffixes = _timestamp_suffixes(times)
    stats = WriteStats()
    done: set[str] = set()
    current: str | None = None
    header_written = False
    finite_ts = np.isfinite(times)
    for family, labels, values in series:
        name = family.family_name
        if name != current:
            if name in done:
                raise ValueError(f"family {name} appears twice, interleaved with another family")
            if current is not None:
                done.add(current)
            current, header_written = name, False
        values = np.asarray(values, dtype=np.float64)
        if values.shape != times.shape:
            raise ValueError(f"{name}{dict(labels)}: {values.shape[0]} values for {times.shape[0]} times")
        present = ~np.isnan(values) & finite_ts
        idx = np.flatnonzero(present)
        if idx.size == 0:
            continue
        if not header_written:
            out.write(_header(family))
            header_written = True
            stats.families += 1
        sample_name = name + "_total" if family.type == "counter" else name
        prefix = sample_name + format_labels(labels) + " "
        if idx.size == values.size:
            vals, sufs = values.tolist(), suffixes
        else:
            vals, sufs = values[idx].tolist(), [suffixes[i] for i in idx.tolist()]
        text = [_format_value(v) for v in vals] if np.isinf(values[idx]).any() else list(map(repr, vals))
        out.write(prefix + prefix.join([v + s for v, s in zip(text, sufs, strict=True)]))
        stats.series += 1
        stats.samples += idx.size
        stats.min_time = min(stats.min_time, float(times[idx[0]]))
        stats.max_time = max(stats.max_time, float(times[idx[-1]]))
    out.write("# EOF\n")
    return stats


def sample_times(start: float, end: float, step: float) -> np.ndarray:
    """Sample times ``start, start+step, ...`` strictly before ``end`` (a half-open window)."""
    if step <= 0:
        raise ValueError("step must be positive")
    if end <= start:
        raise ValueError("end must be after start")
    n = math.ceil((end - start) / step - 1e-9)
    return start + np.arange(n, dtype=np.float64) * step


def open_text(path: str | Path, compresslevel: int = 6) -> TextIO:
    """Open ``path`` for writing text, gzip-compressed when it ends in ``.gz``."""
    path = Path(path)
    if path.suffix == ".gz":
        return io.TextIOWrapper(gzip.GzipFile(path, "wb", compresslevel=compresslevel), encoding="utf-8", newline="\n")
    return open(path, "w", encoding="utf-8", newline="\n", buffering=1 << 20)


def write_history(
    path: str | Path,
    cluster: Any,
    start: float,
    end: float,
    step: float,
    *,
    dialect: str = "truegpu",
    dcgm_options: DcgmOptions | None = None,
) -> WriteStats:
    """Sample ``cluster`` every ``step`` seconds over [start, end) and write the OpenMetrics file.

    ``dialect="dcgm"`` converts the contract series to what dcgm-exporter would have
    exposed (see ``exporter.simulator.dcgm_dialect``; ``dcgm_options`` a DcgmOptions).
    """
    times = sample_times(start, end, step)
    series: Iterable[SeriesItem] = cluster.series(times)
    if dialect == "dcgm":
        series = to_dcgm(series, times, dcgm_options or DcgmOptions())
    elif dialect != "truegpu":
        raise ValueError(f"unknown dialect {dialect!r} (truegpu or dcgm)")
    with open_text(path) as out:
        return write_openmetrics(out, series, times)
