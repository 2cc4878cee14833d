"""Write simulated series as an OpenMetrics text file with timestamps.

That file is what ``promtool tsdb create-blocks-from openmetrics`` backfills into
Prometheus and what the analyzer reads offline, so the writer follows the rules promtool
enforces: one ``# TYPE``/``# HELP`` (and ``# UNIT`` only where the unit is a suffix of
the family name) per family, every series of a family contiguous, counter samples named
``<family>_total``, samples of a series in time order, ``# EOF`` last. A NaN value means
"no sample then" and is skipped, never written as 0.

``Mess`` (``write_history(..., mess=Mess(...))``) writes the ingestion mess real fleets
have, so detectors can be judged on it: whole-node scrape gaps, exporter restarts that
reset the exporter's counters, repeated samples, an HA Prometheus pair (every series once
per replica, told apart by a replica label), exporters in two scrape jobs (``job``/``instance``
apart), targets scraped at their own phases with jitter, and pods restarted under new names.

Formatting is the hot path (millions of lines for a day of a fleet): the timestamp
strings are built once per file, each series' label set once, and values are rendered
with ``repr`` over ``ndarray.tolist()`` (shortest round-trip text, bulk ``str.join``).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol, TextIO

import numpy as np

from exporter import schema as S
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


def write_openmetrics(out: TextIO, series: Iterable[SeriesItem], times: np.ndarray, *,
                      repeat_every: int = 0,
                      stamp: Callable[[Mapping[str, str]], tuple[np.ndarray, list[str]] | None] | None = None
                      ) -> WriteStats:
    """Stream ``(family, labels, values)`` series, values aligned with ``times``, to ``out``.

    Series must arrive grouped by family (promtool rejects interleaved families); a family
    seen again after another one raises ValueError. Families with no sample at all are
    left out entirely. Writes the closing ``# EOF``. ``repeat_every`` k > 0 writes every
    k-th sample of each series twice (same series, time and value: a repeated sample).
    ``stamp(labels)``: the times a series is stamped with instead (its target's scrapes'; values stay
    those of ``times``) and their ``_timestamp_suffixes``, or None for ``times``.
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
        if repeat_every > 0:  # every repeat_every-th sample written twice (a target scraped twice)
            idx = np.repeat(idx, 1 + (np.arange(idx.size) % repeat_every == 0))
        if not header_written:
            out.write(_header(family))
            header_written = True
            stats.families += 1
        sample_name = name + "_total" if family.type == "counter" else name
        prefix = sample_name + format_labels(labels) + " "
        own = stamp(labels) if stamp is not None else None
        at, sufs_all = own if own is not None else (times, suffixes)
        if idx.size == values.size:
            vals, sufs = values.tolist(), sufs_all
        else:
            vals, sufs = values[idx].tolist(), [sufs_all[i] for i in idx.tolist()]
        text = [_format_value(v) for v in vals] if np.isinf(values[idx]).any() else list(map(repr, vals))
        lines = [v + s for v, s in zip(text, sufs, strict=True)]
        out.write(prefix + prefix.join(lines))
        stats.series += 1
        stats.samples += len(lines)
        stats.min_time = min(stats.min_time, float(at[idx[0]]))
        stats.max_time = max(stats.max_time, float(at[idx[-1]]))
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


@dataclass(frozen=True)
class Mess:
    """Ingestion mess to write on request; times are seconds after the history's start.

    - ``node_gaps``: ``(hostname, start, duration)``: no sample at all from that node then (a
      whole-node scrape failure: node-exporter, kubelet or network trouble);
    - ``exporter_restarts``: ``(hostname, at)``: the node's exporter restarts: the sample at
      ``at`` is lost and the exporter's own counters (truegpu dialect; dcgm-exporter reports
      DCGM's counters, which survive it) start again from 0;
    - ``repeat_every``: every k-th sample of every series written twice (0: none);
    - ``replicas``: every series written once per replica with ``replica_label`` = the
      replica's name (an HA Prometheus pair federated or remote-written without dedup);
    - ``pod_restarts``: ``(pod, at)``: the pod is recreated under a new name at ``at`` (a
      Deployment's or Job's pod: its random suffix changes; a StatefulSet's keeps its name);
    - ``workload_restarts``: ``(workload, at)``: every pod of that workload recreated so at ``at`` (a Job's
      pods after a failure: a scenario file cannot know the pods' generated names);
    - ``slow_scrapes``: ``(hostname, every)``: the node is scraped at every ``every``-th sample
      time only (its own scrape job with a longer interval: fleets mix them);
    - ``scrape_jitter_ms``: > 0: each node is scraped at its own phase in the step (Prometheus spreads
      its targets over the interval; each HA replica and scrape job at its own), each scrape up to this many
      ms early or late (agents that do not align timestamps to the interval): every sample time moves, no
      value does;
    - ``scrape_jobs``: every series written once per scrape job, with Prometheus' target labels ``job`` =
      the job's name and ``instance`` (the exporter scraped by two jobs: a ServiceMonitor and a static config).
    """

    node_gaps: tuple[tuple[str, float, float], ...] = ()
    exporter_restarts: tuple[tuple[str, float], ...] = ()
    repeat_every: int = 0
    replicas: tuple[str, ...] = ()
    replica_label: str = "prometheus_replica"
    pod_restarts: tuple[tuple[str, float], ...] = ()
    workload_restarts: tuple[tuple[str, float], ...] = ()
    slow_scrapes: tuple[tuple[str, int], ...] = ()
    scrape_jitter_ms: float = 0.0
    scrape_jobs: tuple[str, ...] = ()


_SAFE = "bcdfghjklmnpqrstvwxz2456789"
_SUFFIX = re.compile(rf"-[{_SAFE}]{{5}}$")


def renamed_pod(pod: str, n: int = 1) -> str:
    """The name a controller gives ``pod``'s ``n``-th replacement: a new 5-character suffix."""
    h = int(hashlib.sha256(f"{pod}/{n}".encode()).hexdigest(), 16)
    suffix = "".join(_SAFE[(h // len(_SAFE) ** i) % len(_SAFE)] for i in range(5))
    return (_SUFFIX.sub("", pod) if _SUFFIX.search(pod) else pod) + "-" + suffix


def _contract_mess(series: Iterable[SeriesItem], times: np.ndarray, mess: Mess) -> Iterator[SeriesItem]:
    """Gaps, restarts and pod renames on the contract series (before any dialect conversion)."""
    t = times - times[0]
    gap: dict[str, np.ndarray] = {}
    for host, a, d in mess.node_gaps:
        gap[host] = gap.get(host, np.zeros(len(t), bool)) | ((t >= a) & (t < a + d))
    restarts: dict[str, list[int]] = {}
    for host, at in mess.exporter_restarts:
        i = int(np.searchsorted(t, at))
        if i < len(t):
            restarts.setdefault(host, []).append(i)
            gap[host] = gap.get(host, np.zeros(len(t), bool)) | (np.arange(len(t)) == i)
    renames = {pod: int(np.searchsorted(t, at)) for pod, at in mess.pod_restarts}
    restarted = {job: int(np.searchsorted(t, at)) for job, at in mess.workload_restarts}
    for family, labels, values in series:
        host = labels.get("hostname", "")
        values = np.asarray(values, dtype=np.float64)
        if host in restarts and getattr(family, "type", "") == "counter":
            values = values.copy()
            for i in sorted(restarts[host]):
                base = values[i] if np.isfinite(values[i]) else 0.0
                values[i:] = values[i:] - base  # counting again from 0 at the restart
        if host in gap:
            values = np.where(gap[host], np.nan, values)
        pod = labels.get("pod", "")
        i = renames.get(pod, restarted.get(labels.get(S.WORKLOAD, ""), 0)) if pod else 0
        if 0 < i < len(t):
            yield family, labels, np.where(np.arange(len(t)) < i, values, np.nan)
            yield family, {**labels, "pod": renamed_pod(pod)}, np.where(np.arange(len(t)) >= i, values, np.nan)
            continue
        yield family, labels, values


def _slow_scraped(series: Iterable[SeriesItem], times: np.ndarray, mess: Mess) -> Iterator[SeriesItem]:
    """The nodes of ``slow_scrapes`` sampled at every ``every``-th time only. After the dialect conversion:
    what a scrape reads (dcgm-exporter's own rates too) does not depend on how often it is scraped."""
    skip = {host: np.arange(len(times)) % every != 0 for host, every in mess.slow_scrapes}
    for family, labels, values in series:
        mask = skip.get(labels.get("hostname") or labels.get("Hostname") or "")
        yield family, labels, values if mask is None else np.where(mask, np.nan, np.asarray(values, np.float64))


def scrape_times(target: str, times: np.ndarray, jitter_ms: float) -> np.ndarray:
    """When ``target`` (a node, or ``node/replica``) is scraped for each of ``times``: at its own phase in the
    step (sha256 of its name, as Prometheus offsets its targets), each scrape up to ``jitter_ms`` early or late
    (a seeded draw per target), in whole milliseconds like Prometheus' timestamps."""
    step = float(times[1] - times[0]) if len(times) > 1 else 60.0
    seed = int.from_bytes(hashlib.sha256(target.encode()).digest()[:8], "big")
    rng = np.random.default_rng(seed)
    return np.round(times + (seed % 1_000_000) / 1e6 * step + rng.uniform(-jitter_ms, jitter_ms, len(times)) / 1e3, 3)


def _copied(series: Iterable[SeriesItem], mess: Mess) -> Iterator[SeriesItem]:
    """Every series once per HA replica and scrape job (consecutive, so each family stays contiguous)."""
    for family, labels, values in series:
        host = labels.get("hostname") or labels.get("Hostname")
        for name in mess.replicas or (None,):
            for job in mess.scrape_jobs or (None,):
                copy = dict(labels)
                if name is not None:
                    copy[mess.replica_label] = name
                if job is not None:
                    copy[S.SCRAPE_JOB] = job
                    if host:
                        copy[S.INSTANCE] = f"{host}:9400"
                yield family, copy, values


def write_history(
    path: str | Path,
    cluster: Any,
    start: float,
    end: float,
    step: float,
    *,
    dialect: str = "truegpu",
    dcgm_options: DcgmOptions | None = None,
    mess: Mess | None = None,
) -> WriteStats:
    """Sample ``cluster`` every ``step`` seconds over [start, end) and write the OpenMetrics file.

    ``dialect="dcgm"`` converts the contract series to what dcgm-exporter would have
    exposed (see ``exporter.simulator.dcgm_dialect``; ``dcgm_options`` a DcgmOptions).
    ``mess`` (a Mess) writes the ingestion mess it asks for.
    """
    times = sample_times(start, end, step)
    series: Iterable[SeriesItem] = cluster.series(times)
    if mess is not None:
        if dialect == "dcgm" and mess.exporter_restarts:  # DCGM's counters survive dcgm-exporter restarts
            mess = replace(mess, exporter_restarts=(),
                           node_gaps=mess.node_gaps + tuple((h, a, step) for h, a in mess.exporter_restarts))
        series = _contract_mess(series, times, mess)
    if dialect == "dcgm":
        series = to_dcgm(series, times, dcgm_options or DcgmOptions())
    elif dialect != "truegpu":
        raise ValueError(f"unknown dialect {dialect!r} (truegpu or dcgm)")
    if mess is not None and mess.slow_scrapes:
        series = _slow_scraped(series, times, mess)
    if mess is not None and (mess.replicas or mess.scrape_jobs):
        series = _copied(series, mess)
    with open_text(path) as out:
        return write_openmetrics(out, series, times, repeat_every=mess.repeat_every if mess else 0,
                                 stamp=_scrapes(times, mess) if mess and mess.scrape_jitter_ms > 0 else None)


def _scrapes(times: np.ndarray, mess: Mess) -> Callable[[Mapping[str, str]], tuple[np.ndarray, list[str]] | None]:
    """``write_openmetrics``'s ``stamp``: each node's scrapes (``scrape_times``), per HA replica and scrape job
    (each scrapes the node at its own phase), formatted once per target; series without a node keep the sample times."""
    known: dict[str, tuple[np.ndarray, list[str]]] = {}

    def stamp(labels: Mapping[str, str]) -> tuple[np.ndarray, list[str]] | None:
        host = labels.get("hostname") or labels.get("Hostname")
        if not host:
            return None
        copy_of = (mess.replica_label, *((S.SCRAPE_JOB,) if mess.scrape_jobs else ()))
        target = "/".join([host, *(labels[k] for k in copy_of if labels.get(k))])
        if target not in known:
            at = scrape_times(target, times, mess.scrape_jitter_ms)
            known[target] = at, _timestamp_suffixes(at)
        return known[target]

    return stamp
