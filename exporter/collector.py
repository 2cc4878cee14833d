"""One prometheus_client collector over all exporter sources.

Each collection asks every source for a fresh Reading and builds brand-new metric families
from the contract (exporter/schema.py), so a GPU that vanished disappears from /metrics
instead of lingering with its last value. Deployed, collections run on their own thread at a
fixed cadence (as dcgm-exporter does) and a scrape only renders the latest one: scrape
latency never depends on how fast NVML or an endpoint answers, and any number of scrapers
cost one NVML round per interval. Nothing a source does can fail a collection as a whole: a
raising source loses only its own families, a bad sample loses only itself, and both are
counted in truegpu_exporter_errors_total.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client.metrics_core import Metric as PromMetric
from prometheus_client.registry import CollectorRegistry
from prometheus_client.samples import Sample

from exporter.schema import (
    BY_NAME,
    COLLECT_DURATION,
    EXPORTER_ERRORS,
    GPU_INFO,
    GPU_INSTANCE,
    METRICS,
    MIG_LABELS,
    SELF_METRICS,
    SOURCE_IGNORED_SERIES,
    SOURCE_LAST_SUCCESS,
    SOURCE_STALE,
    SOURCE_UP,
    UUID,
    Metric,
)
from exporter.sources.base import Reading, Source

log = logging.getLogger(__name__)

#: errors_total kinds the collector itself assigns (sources add their own, e.g. gpu_lost).
SOURCE_FAILED = "source_failed"
BAD_SAMPLE = "bad_sample"
#: A finite value outside the family's valid range (schema.Metric.valid_range): dropped.
OUT_OF_RANGE = "out_of_range"

_new_sample = tuple.__new__  # Sample(...) without the namedtuple's Python-level __new__


@dataclass(frozen=True, slots=True)
class _Family:
    """Everything needed to turn one contract Metric into a prometheus_client family, computed once."""

    metric: Metric
    family_name: str
    sample_name: str
    type: str
    help: str
    unit: str
    keys: frozenset[str]
    #: Label names the samples must carry (canonical order).
    names: tuple[str, ...]
    mig_keys: frozenset[str] | None
    mig_names: tuple[str, ...]
    #: Labels naming "the same series" across sources (dedupe key): a GPU's uuid (fleet-unique,
    #: unlike a hostname that dcgm-exporter may spell differently) plus the family's own labels;
    #: for gpu_info only the uuid, since two sources may disagree on its descriptive labels.
    same: tuple[str, ...]
    mig_same: tuple[str, ...]
    #: Inclusive valid range of a value (the contract's).
    lo: float
    hi: float

    @classmethod
    def of(cls, metric: Metric) -> _Family:
        family_name = metric.family_name
        sample_name = family_name + "_total" if metric.type == "counter" else family_name
        # prometheus_client appends the unit to a name that lacks it; the contract name wins.
        unit = metric.unit if metric.unit and family_name.endswith("_" + metric.unit) else ""
        mig = metric.scope == "gpu"
        if mig:
            same = (UUID,) if metric is GPU_INFO else (UUID, *metric.labels)
            mig_same = (*same, GPU_INSTANCE)
        else:
            same = mig_same = metric.all_labels
        return cls(
            metric=metric,
            family_name=family_name,
            sample_name=sample_name,
            type=metric.type,
            help=metric.help,
            unit=unit,
            keys=frozenset(metric.all_labels),
            names=metric.all_labels,
            mig_keys=frozenset(metric.all_labels + MIG_LABELS) if mig else None,
            mig_names=metric.all_labels + MIG_LABELS if mig else (),
            same=same,
            mig_same=mig_same,
            lo=metric.valid_range[0],
            hi=metric.valid_range[1],
        )

    def new(self) -> PromMetric:
        return PromMetric(self.family_name, self.help, self.type, self.unit)


#: Contract families keyed by object identity: schema Metrics are singletons compared by
#: identity, and a pointer lookup is the cheapest per-family check there is.
_SOURCE_FAMILIES: dict[int, _Family] = {id(m): _Family.of(m) for m in METRICS if m not in SELF_METRICS}
_SELF = {m.name: _Family.of(m) for m in SELF_METRICS}


def _family_for(metric: object) -> _Family | None:
    """The contract family of ``metric``, or None unless it is one of the schema's source Metric objects."""
    fam = _SOURCE_FAMILIES.get(id(metric))
    return fam if fam is not None and fam.metric is metric else None


class TruegpuCollector:
    """Collects every source into fresh, validated, de-duplicated families: every ``interval``
    seconds on a background thread (scrapes serve the latest), or on each scrape when it is 0.

    When two sources emit the same series (same family, same GPU uuid and family labels)
    one wins and the other's sample is dropped silently. ``sources`` are in precedence
    order; ``precedence`` overrides it per family (``{"truegpu_sm_active_ratio": ["dcgm",
    "nvml"]}``): sources it names come first, in its order, the rest keep theirs.
    """

    def __init__(
        self,
        sources: Sequence[Source],
        precedence: Mapping[str, Sequence[str]] | None = None,
        *,
        interval: float = 0.0,
    ) -> None:
        names = [s.name for s in sources]
        if len(set(names)) != len(names):
            raise ValueError(f"source names must be unique, got {names}")
        if interval < 0:
            raise ValueError("the collection interval must be >= 0 seconds")
        for family, order in (precedence or {}).items():
            if family not in BY_NAME:
                raise ValueError(f"precedence names unknown family {family!r}")
            unknown = [n for n in order if n not in names]
            if unknown:
                raise ValueError(f"precedence for {family} names sources not configured: {', '.join(unknown)}")
        #: (family name, source) -> sort rank; unnamed pairs rank by source position (>= 0).
        self._rank: dict[tuple[str, str], int] = {
            (family, src): i - len(order) for family, order in (precedence or {}).items() for i, src in enumerate(order)
        }
        self.sources: tuple[Source, ...] = tuple(sources)
        # Cumulative across collections; (source, kind) -> count. source_failed starts at 0 so
        # that increase() sees the first failure.
        self._errors: dict[tuple[str, str], int] = {(n, SOURCE_FAILED): 0 for n in names}
        self._was_up: dict[str, bool] = dict.fromkeys(names, True)
        self._logged: set[tuple[str, ...]] = set()
        #: source -> (up, series served) of the latest collection; for start-up logs and / page.
        self.last: dict[str, tuple[bool, int]] = {}
        self._last_success: dict[str, float] = {}
        # Sources are not required to be thread-safe; collections never overlap.
        self._lock = threading.Lock()
        #: Seconds between background collections; 0 collects on every scrape instead.
        self.interval = float(interval)
        self._latest: list[PromMetric] = []
        self._collections = 0
        self._ready = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # prometheus_client calls describe() at register time; an empty answer keeps it from
    # calling collect() (and so every source) just to learn the names.
    def describe(self) -> list[PromMetric]:
        return []

    def collect(self) -> Iterator[PromMetric]:
        if self.interval <= 0:
            with self._lock:
                return iter(self._collect())
        self.start()
        # Only the very first scrape can wait here, and no longer than the sources' deadlines.
        self._ready.wait()
        return iter(self._latest)

    @property
    def generation(self) -> int | None:
        """How many background collections have landed; None when every scrape collects. What a
        scrape renders can only change when this does."""
        return self._collections if self.interval > 0 else None

    def start(self) -> None:
        """Start the background collections (no-op when already running or ``interval`` is 0)."""
        with self._lock:
            if self.interval <= 0 or self._thread is not None:
                return
            self._thread = threading.Thread(target=self._loop, name="collect", daemon=True)
            self._thread.start()

    def _loop(self) -> None:
        """Collect at a fixed cadence (start to start); a collection that overruns the interval
        is followed at once by the next, never by a burst of missed ones."""
        next_at = time.monotonic()
        while not self._stop.is_set():
            try:
                self._latest = self._collect()
                self._collections += 1
            except Exception:  # _collect contains source failures itself; this is a bug, not a source
                log.exception("collection failed; serving the previous one")
            self._ready.set()
            next_at = max(next_at + self.interval, time.monotonic())
            self._stop.wait(next_at - time.monotonic())

    def close(self) -> None:
        """Stop collecting and close every source; one failing close does not keep the others open."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        for source in self.sources:
            try:
                source.close()
            except Exception:
                log.exception("closing source %s failed", source.name)

    # ------------------------------------------------------------------------------
    def _collect(self) -> list[PromMetric]:
        families: dict[str, PromMetric] = {}
        # Series already served this scrape, per family, for first-source-wins.
        seen: dict[str, set[tuple[str, ...]]] = {}
        up: list[tuple[str, float]] = []
        durations: list[tuple[str, float]] = []
        stale: list[tuple[str, float]] = []
        ignored: dict[tuple[str, str, str], int] = {}
        contributions: list[tuple[int, str, object, list]] = []
        for pos, source in enumerate(self.sources):
            name = source.name
            start = time.perf_counter()
            try:
                reading = source.collect()
                if not isinstance(reading, Reading):
                    raise TypeError(f"collect() returned {type(reading).__name__}, not Reading")
            except Exception as exc:
                durations.append((name, time.perf_counter() - start))
                self._count(name, SOURCE_FAILED)
                up.append((name, 0.0))
                if self._was_up[name]:
                    log.warning("source %s failed, its families are omitted: %r", name, exc, exc_info=True)
                else:
                    log.debug("source %s still failing: %r", name, exc)
                self._was_up[name] = False
                self.last[name] = (False, 0)
                self._read_freshness(source, stale)
                continue
            durations.append((name, time.perf_counter() - start))
            self._read_freshness(source, stale)
            if not self._was_up[name] and reading.up:
                log.info("source %s recovered", name)
            self._was_up[name] = bool(reading.up)
            if reading.up and not hasattr(source, "last_success"):
                self._last_success[name] = time.time()
            up.append((name, 1.0 if reading.up else 0.0))
            self.last[name] = (bool(reading.up), 0)
            try:
                for err in reading.errors:
                    kind = str(err.kind)
                    self._count(name, kind)
                    self._log_once((name, "error", kind, str(err.gpu)), "source %s: %s%s: %s",
                                   name, kind, f" on gpu {err.gpu}" if err.gpu else "", err.message)
                for (field_name, reason), n in reading.ignored.items():
                    ignored[(name, str(field_name), str(reason))] = ignored.get((name, str(field_name), str(reason)),
                                                                                0) + int(n)
                contributions += [
                    (self._rank.get((getattr(metric, "name", ""), name), pos), name, metric, samples)
                    for metric, samples in reading.samples.items()
                ]
            except Exception:  # a Reading whose fields are not what base.py declares
                self._count(name, BAD_SAMPLE)
                self._log_once((name, "malformed"), "source %s returned a malformed Reading", name, exc_info=True)

        served: dict[str, int] = {}
        bad: dict[str, int] = {}
        contributions.sort(key=lambda c: c[0])  # stable: equal ranks keep source order
        for _rank, name, metric, samples in contributions:
            n_served, n_bad = self._add_samples(name, metric, samples, families, seen)
            served[name] = served.get(name, 0) + n_served
            bad[name] = bad.get(name, 0) + n_bad
        for name, n in bad.items():
            if n:
                self._count(name, BAD_SAMPLE, n)
        for name, n in served.items():
            self.last[name] = (self.last[name][0], n)

        out = [f for f in families.values() if f.samples]  # a family whose every sample was dropped is absent
        out.append(self._self_family(SOURCE_UP, up))
        out.append(self._self_family(COLLECT_DURATION, durations))
        if self._last_success:
            out.append(self._self_family(SOURCE_LAST_SUCCESS, list(self._last_success.items())))
        if stale:
            out.append(self._self_family(SOURCE_STALE, stale))
        if ignored:
            fam = _SELF[SOURCE_IGNORED_SERIES.name]
            prom = fam.new()
            prom.samples = [
                _new_sample(Sample, (fam.sample_name, {"source": s, "field": f, "reason": r}, float(n), None, None,
                                     None))
                for (s, f, r), n in sorted(ignored.items())
            ]
            out.append(prom)
        errors = _SELF[EXPORTER_ERRORS.name].new()
        sname = errors.name + "_total"
        errors.samples = [
            _new_sample(Sample, (sname, {"source": s, "kind": k}, float(n), None, None, None))
            for (s, k), n in sorted(self._errors.items())
        ]
        out.append(errors)
        return out

    def _read_freshness(self, source: Source, stale: list[tuple[str, float]]) -> None:
        """Sources that can serve old values (the deadline wrapper) expose ``stale`` and
        ``last_success`` themselves; for the others, a complete collection is a success now."""
        flag = getattr(source, "stale", None)
        if flag is not None:
            stale.append((source.name, 1.0 if flag else 0.0))
        last = getattr(source, "last_success", None)
        if isinstance(last, int | float) and last > 0:
            self._last_success[source.name] = float(last)

    def _add_samples(
        self, source: str, metric: object, samples: list, families: dict[str, PromMetric],
        seen: dict[str, set[tuple[str, ...]]],
    ) -> tuple[int, int]:
        """Validate and add one source's samples of one family; returns (series served, samples dropped)."""
        bad = served = 0
        try:
            fam = _family_for(metric)
            if fam is None:
                name = getattr(metric, "name", None)
                why = ("is a self-metric" if name in _SELF else
                       "is not the schema's Metric of that name" if name in BY_NAME else "is not in the contract")
                self._log_once((source, "family", repr(getattr(metric, "name", metric))),
                               "source %s: dropped %d samples of %r: it %s", source, len(samples),
                               getattr(metric, "name", metric), why)
                return 0, len(samples)
            prom = families.get(fam.family_name)
            if prom is None:
                prom = families[fam.family_name] = fam.new()
                keys_seen: set[tuple[str, ...]] = set()
                seen[fam.family_name] = keys_seen
            else:
                keys_seen = seen[fam.family_name]
            append = prom.samples.append
            sample_name = fam.sample_name
            keys, mig_keys, same, mig_same = fam.keys, fam.mig_keys, fam.same, fam.mig_same
            lo, hi = fam.lo, fam.hi
            for labels, value in samples:
                try:
                    lk = labels.keys()
                    if lk == keys:
                        key_names = same
                    elif lk == mig_keys:
                        key_names = mig_same
                    else:
                        bad += 1
                        self._log_bad(source, fam, labels, value, f"label names {sorted(lk)} != {sorted(keys)}")
                        continue
                    get = labels.__getitem__
                    "".join(labels.values())  # TypeError unless every label value is a str
                    if value - value != 0:  # NaN and +-Inf; TypeError for non-numbers
                        bad += 1
                        self._log_bad(source, fam, labels, value, "value is not finite")
                        continue
                    if not lo <= value <= hi:
                        self._count(source, OUT_OF_RANGE)
                        self._log_bad(source, fam, labels, value, f"outside the valid range [{lo:g}, {hi:g}]")
                        continue
                except (TypeError, AttributeError):
                    bad += 1
                    self._log_bad(source, fam, labels, value, "label values must be str and the value a number")
                    continue
                key = tuple(map(get, key_names))
                if key in keys_seen:
                    continue  # a source ranked earlier (or this one) already served this series
                keys_seen.add(key)
                served += 1
                append(_new_sample(Sample, (sample_name, labels, value, None, None, None)))
        except Exception:
            # Not (labels, value) pairs: keep what validated, drop the rest of this family.
            bad += 1
            self._log_once((source, "malformed", repr(getattr(metric, "name", metric))),
                           "source %s: malformed samples for %r", source, getattr(metric, "name", metric),
                           exc_info=True)
        return served, bad

    def _self_family(self, metric: Metric, values: list[tuple[str, float]]) -> PromMetric:
        fam = _SELF[metric.name]
        prom = fam.new()
        prom.samples = [
            _new_sample(Sample, (fam.sample_name, {"source": s}, v, None, None, None)) for s, v in values
        ]
        return prom

    def _count(self, source: str, kind: str, n: int = 1) -> None:
        key = (source, kind)
        self._errors[key] = self._errors.get(key, 0) + n

    def _log_bad(self, source: str, fam: _Family, labels: object, value: object, why: str) -> None:
        self._log_once((source, "bad", fam.metric.name, why),
                       "source %s: dropped bad sample %s%r = %r: %s", source, fam.metric.name, labels, value, why)

    def _log_once(self, key: tuple[str, ...], msg: str, *args: object, exc_info: bool = False) -> None:
        """WARNING the first time a problem shows up, DEBUG after: a scrape every 15 s must not flood the log."""
        level = logging.DEBUG if key in self._logged else logging.WARNING
        self._logged.add(key)
        log.log(level, msg, *args, exc_info=exc_info)


def build_registry(
    sources: Sequence[Source], precedence: Mapping[str, Sequence[str]] | None = None, *, interval: float = 0.0
) -> tuple[CollectorRegistry, TruegpuCollector]:
    """A registry holding only the truegpu collector.

    The default process/platform collectors are left out: they describe the exporter's
    Python process, not the GPUs, and would add series to every node for no GPU insight.
    """
    registry = CollectorRegistry(auto_describe=False)
    collector = TruegpuCollector(sources, precedence, interval=interval)
    registry.register(collector)
    return registry, collector
