"""Query planning within a server's limits: cut one metric's range query by series and by time.

Prometheus refuses a range query that would hold more than ``--query.max-samples`` points at
once (50 M by default: "query processing would load too many samples") or more than 11,000
points per series, and Thanos, Mimir and VictoriaMetrics have limits of the same kinds. A range
query's peak is its series x its steps (Prometheus 2.42's ``stats=all`` reports series x steps
+ 1), so, knowing how many series each host has (the series API: an index lookup that loads no
samples), the planner cuts the hosts into groups and the range into windows so each request
stays under the budget. A group is a regex on the host label; the last group is the complement
of all the others, so a series without the label, or of a host that appeared after the lookup,
is still read exactly once. A request the server refuses anyway is halved (``Shard.halves``,
then ``halve_window``) down to one host and one step.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from itertools import accumulate

from exporter import schema

#: Prometheus' limit on points per series in one range query.
MAX_POINTS = 11_000
#: Prometheus' default ``--query.max-samples``: samples one query may hold at once.
MAX_SAMPLES = 50_000_000
#: Labels a series can be split on (the one with most values wins, ties to the first): the host
#: in truegpu's and dcgm-exporter's spellings, then the scrape target.
SHARD_LABELS: tuple[str, ...] = (schema.HOSTNAME, "Hostname", "instance")


def steps_in(start: float, end: float, step: float) -> int:
    """Points of a range query over [start, end] every ``step`` s (both ends included)."""
    return math.floor((end - start) / step + 1e-9) + 1


def chunk_windows(start: float, end: float, step: float, max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Split [start, end] into step-aligned windows of at most ``max_points`` points, no overlap."""
    if step <= 0 or not math.isfinite(step):
        raise ValueError(f"step must be positive, not {step!r}")
    if end < start:
        raise ValueError(f"end {end!r} is before start {start!r}")
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    total = steps_in(start, end, step)
    windows = []
    for first in range(0, total, max_points):
        last = min(first + max_points, total) - 1
        windows.append((start + first * step, start + last * step))
    return windows


def cost(series: int, steps: int) -> int:
    """Samples a range query of ``series`` x ``steps`` holds at its peak (+1 a series: the raw
    samples of the one being evaluated)."""
    return series * (steps + 1)


@dataclass(frozen=True)
class Shard:
    """The series of one request: those whose ``label`` is one of ``hosts``, or (``rest``) every
    series whose ``label`` is none of ``others`` (``hosts`` then lists the ones known to be there)."""

    label: str | None = None
    hosts: tuple[str, ...] = ()
    #: Known series per host (aligned with ``hosts``): where to halve.
    counts: tuple[int, ...] = ()
    others: tuple[str, ...] = ()
    rest: bool = True

    def halves(self) -> tuple[Shard, Shard] | None:
        """Two shards reading the same series, about half each (by known series); None below two hosts."""
        if self.label is None or len(self.hosts) < 2:
            return None
        runs = list(accumulate(self.counts))
        cut = min(next(i for i, run in enumerate(runs, 1) if 2 * run >= runs[-1]), len(self.hosts) - 1)
        first = Shard(self.label, self.hosts[:cut], self.counts[:cut], rest=False)
        second = Shard(self.label, self.hosts[cut:], self.counts[cut:],
                       self.others + self.hosts[:cut] if self.rest else (), self.rest)  # fmt: skip
        return first, second


def halve_window(start: float, end: float, step: float) -> tuple[tuple[float, float], tuple[float, float]] | None:
    """[start, end] (step-aligned) as two windows of about half the steps each; None for one step."""
    steps = steps_in(start, end, step)
    if steps < 2:
        return None
    first = steps // 2
    return (start, start + (first - 1) * step), (start + first * step, end)


@dataclass(frozen=True)
class Plan:
    """The requests of one metric: every shard over every window."""

    shards: tuple[Shard, ...]
    windows: tuple[tuple[float, float], ...]
    #: Series the lookup found; the peak samples the largest request is estimated to hold.
    series: int = 0
    peak: int = 0

    @property
    def requests(self) -> list[tuple[Shard, tuple[float, float]]]:
        return [(shard, window) for window in self.windows for shard in self.shards]


def shard_label(series: Sequence[Mapping[str, str]], candidates: Iterable[str] = SHARD_LABELS) -> str | None:
    """The candidate label with the most distinct values over ``series`` (two at least), else None."""
    best, most = None, 1
    for label in candidates:
        n = len({s[label] for s in series if s.get(label)})
        if n > most:
            best, most = label, n
    return best


def plan(
    series: Sequence[Mapping[str, str]],
    start: float,
    end: float,
    step: float,
    budget: int,
    *,
    max_points: int = MAX_POINTS,
    max_series: int | None = None,
    candidates: Iterable[str] = SHARD_LABELS,
) -> Plan:
    """Requests covering ``series`` (label sets from the series API) over [start, end] every ``step``
    s, each under ``budget`` samples (``cost``), ``max_points`` steps and ``max_series`` series.

    Whole windows of ``max_points`` steps are kept while one host's series fit in them; hosts are
    then packed in sorted order. A host too big for the budget even over one step still gets a
    request of its own (the server may allow more than we were told; if not, it is refused).
    """
    windows = chunk_windows(start, end, step, max_points)
    steps = steps_in(*windows[0], step)
    label = shard_label(series, candidates)
    per_host = Counter(s.get(label, "") for s in series) if label else Counter({"": len(series)})
    unlabelled = per_host.pop("", 0)  # read by the last shard, which no host split can divide
    total, limit = len(series), len(series)
    if cost(total, steps) > budget or total > (max_series or total):
        biggest = max([*per_host.values(), unlabelled])
        if cost(biggest, steps) > budget:  # one host over the budget: shorter windows
            steps = max(1, budget // biggest - 1)
            windows = chunk_windows(start, end, step, steps)
        limit = min(budget // (steps + 1), max_series or total)
    groups: list[list[str]] = [[]]
    load = 0
    for host in sorted(per_host):
        if groups[-1] and load + per_host[host] > limit:
            groups.append([])
            load = 0
        groups[-1].append(host)
        load += per_host[host]
    if unlabelled and groups[-1] and load + unlabelled > limit:
        groups.append([])  # the rest: what has no host label (or a host not seen yet) on its own
    shards = [Shard(label, tuple(g), tuple(per_host[h] for h in g), rest=False) for g in groups[:-1]]
    listed = tuple(h for g in groups[:-1] for h in g)
    shards.append(Shard(label, tuple(groups[-1]), tuple(per_host[h] for h in groups[-1]), listed))
    peak = max(cost(sum(s.counts) + (unlabelled if s.rest else 0), steps) for s in shards)
    return Plan(tuple(shards), tuple(windows), total, peak)
