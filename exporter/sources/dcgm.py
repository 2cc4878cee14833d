"""The ``dcgm`` source: scrape a node-local NVIDIA dcgm-exporter and map it onto the contract.

Many clusters already run dcgm-exporter (GPU operator); this source lets truegpu reuse it
instead of opening NVML a second time. It reads all three label dialects (current
``hostname``, older ``Hostname``, 1.x lower-case ``dcgm_fi_*``/``uuid``/``pod_name``),
converts units with the contract's DcgmField.scale, turns per-second rates into counters,
decodes the clock-event bitmask, counts XIDs, and moves pod labels off the hot series into
truegpu_gpu_allocation_info. Anything DCGM cannot tell (sentinels, NaN, fields not
enabled) is left out, never reported as 0. Nothing here raises out of collect().
"""

from __future__ import annotations

import argparse
import logging
import re
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

import requests
from urllib3.exceptions import ReadTimeoutError

from exporter.attribution.jobs import derive_job
from exporter.schema import (
    CLOCK_EVENT_ACTIVE,
    CLOCK_EVENT_REASONS,
    DCGM_BY_FIELD,
    DCGM_EXPORTER_POD,
    DCGM_FB_FREE,
    DCGM_FB_RESERVED,
    DCGM_SENTINEL_RANGES,
    DCGM_XID_COUNT,
    GPU,
    GPU_ALLOCATION_INFO,
    GPU_INFO,
    GPU_INSTANCE,
    HOSTNAME,
    MEMORY_TOTAL,
    MEMORY_USED,
    MIB,
    MIG_PROFILE,
    PER_MIG_INSTANCE,
    UUID,
    WORKLOAD,
    XID_ERRORS,
    Metric,
    dcgm_spellings,
    is_dcgm_sentinel,
)
from exporter.sources import DEFAULT_DCGM_URL, promtext
from exporter.sources.base import Labels, Reading, Source, SourceError

log = logging.getLogger(__name__)

DEFAULT_URL: Final = DEFAULT_DCGM_URL

# Error kinds (bounded: they become the ``kind`` label of truegpu_exporter_errors_total).
UNREACHABLE: Final = "unreachable"
TIMEOUT: Final = "timeout"
HTTP_ERROR: Final = "http_error"
PARSE_ERROR: Final = "parse_error"
#: Some lines of an otherwise good body were skipped (the source stays up).
BAD_LINE: Final = "bad_line"
#: A mapped DCGM field without gpu/UUID labels, or an XID count without an xid label.
BAD_SAMPLE: Final = "bad_sample"
#: GPUs without a UUID label, or one UUID on several GPUs: published, told apart by host and index.
NO_UUID: Final = "no_uuid"
DUPLICATE_UUID: Final = "duplicate_uuid"
#: The same series twice in one page (the first value is kept).
DUPLICATE_SERIES: Final = "duplicate_series"
# Reasons of truegpu_exporter_ignored_series.
NOT_IN_CONTRACT: Final = "not_in_contract"
DUPLICATE: Final = "duplicate"
BLANK: Final = "blank"
#: A whole-GPU field that dcgm-exporter repeats on every MIG instance's line: published once per GPU.
MIG_REPEAT: Final = "mig_repeat"
PARTIAL: Final = "partial"
INTERNAL_ERROR: Final = "internal_error"

# dcgm-exporter fields and labels that are not contract mappings of their own.
#: dcgm-exporter's own XID counter: XIDs seen within its sliding window, labelled by xid.
XID_COUNT: Final = DCGM_XID_COUNT
_HOST_LABELS = ("hostname", "Hostname")
_UUID_LABELS = ("UUID", "uuid")
_DRIVER_LABELS = ("DCGM_FI_DRIVER_VERSION", "dcgm_fi_driver_version")
_GI_LABELS = ("GPU_I_ID", "gpu_i_id")
_PROFILE_LABELS = ("GPU_I_PROFILE", "gpu_i_profile")

_ACCEPT: Final = {"Accept": "text/plain"}
_SENTINEL_MIN = min(lo for lo, _ in DCGM_SENTINEL_RANGES)

# How one field is handled; the last three are per-series outcomes of the line cache: a sample
# that is not DCGM's, a DCGM field outside the contract, a contract field without gpu/UUID.
_VALUE, _USED, _MEM, _RATE, _BITMASK, _LAST, _XID_COUNT, _SKIP, _IGNORED, _NO_IDENT = range(10)
#: Bound of the per-series caches (label churn: pods come and go).
_MAX_CACHED: Final = 65536


class ScrapeError(Exception):
    """Fetching the endpoint failed; ``kind`` is one of the error kinds above."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind
        self.message = message


@dataclass(frozen=True, slots=True)
class _Field:
    how: int
    metric: Metric | None = None
    extra: tuple[tuple[str, str], ...] = ()
    scale: float = 1.0  # multiply, then
    div: float = 1.0  # divide (DcgmField.factors: exact percent)
    part: str = ""  # memory part for _MEM


def _field_table() -> dict[str, _Field]:
    """Every dcgm-exporter field name (both spellings) this source understands -> how to map it."""
    how_of = {"value": _VALUE, "rate": _RATE, "bitmask": _BITMASK, "last": _LAST}
    table: dict[str, _Field] = {}
    for name, (metric, f) in DCGM_BY_FIELD.items():
        table[name] = _Field(how_of[f.kind], metric, f.labels, *f.factors)
    # Memory total is FB_TOTAL or FB_USED + FB_FREE + FB_RESERVED, so the parts are gathered per GPU.
    parts = {MEMORY_TOTAL.dcgm[0].field: "total", DCGM_FB_FREE: "free", DCGM_FB_RESERVED: "reserved"}
    for base, part in parts.items():
        for name in dcgm_spellings(base):
            table[name] = _Field(_MEM, part=part)
    for name in MEMORY_USED.dcgm[0].spellings:
        table[name] = _Field(_USED, MEMORY_USED, (), *MEMORY_USED.dcgm[0].factors, part="used")
    for name in dcgm_spellings(XID_COUNT):
        table[name] = _Field(_XID_COUNT, XID_ERRORS)
    return table


_FIELDS: Final = _field_table()
#: Memory part -> its dcgm-exporter field (named in truegpu_exporter_ignored_series when no total forms).
_MEM_FIELDS: Final = {"total": MEMORY_TOTAL.dcgm[0].field, "free": DCGM_FB_FREE, "reserved": DCGM_FB_RESERVED}


@dataclass(frozen=True, slots=True)
class _Ident:
    """Who a sample is about, derived once per distinct label block."""

    key: tuple[str, ...]  # hostname, gpu, uuid, gpu_instance, mig_profile
    gpu_key: tuple[str, str, str]  # hostname, gpu, uuid
    labels: Labels  # contract identity labels (+ MIG labels on MIG instances); never mutated
    info: tuple[str, str, str]  # model, driver_version, pci_bus_id
    alloc: tuple[str, str, str, str] | None  # namespace, pod, container, job


def _first(labels: dict[str, str], names: tuple[str, ...]) -> str:
    for n in names:
        v = labels.get(n)
        if v:
            return v
    return ""


@dataclass
class _Page:
    """What one dcgm-exporter page gathered while its lines were read, for the steps that need it whole."""

    now: float
    label_cache: dict[str, dict[str, str]] = field(default_factory=lambda: {"": {}})
    types: dict[str, str] = field(default_factory=dict)
    bad: list[promtext.BadLine] = field(default_factory=list)
    seen: dict[tuple[str, ...], _Ident] = field(default_factory=dict)
    mem: dict[tuple[str, ...], dict[str, float]] = field(default_factory=dict)
    bitmask_done: set[tuple[str, ...]] = field(default_factory=set)
    rates_done: set[object] = field(default_factory=set)
    xid_counted: set[tuple[str, ...]] = field(default_factory=set)  # GPUs whose XIDs came from DCGM_EXP_XID_COUNT
    last_xid: dict[tuple[str, ...], int] = field(default_factory=dict)
    allocs: dict[tuple[tuple[str, ...], tuple[str, str, str, str]], None] = field(default_factory=dict)  # ordered
    no_identity: list[int] = field(default_factory=list)
    series: set[str] = field(default_factory=set)  # series of this page, to find a series printed twice
    repeats: set[tuple] = field(default_factory=set)  # whole-GPU fields already taken from one of its MIG instances
    duplicates: list[int] = field(default_factory=list)
    n_samples: int = 0
    dcgm_samples: int = 0


class DcgmSource(Source):
    """Scrapes dcgm-exporter's /metrics and publishes contract samples.

    ``timeout`` bounds one HTTP attempt; failed attempts (connection refused, timeout, 5xx)
    are retried up to ``retries`` times with exponential ``backoff`` while the whole fetch
    stays within ``budget`` seconds. ``hostname`` is used when samples carry no host label
    (1.x exporters), or always with ``force_hostname``; a host label that is dcgm-exporter's own
    pod name (``dcgm-exporter-6ldbb``, as the GPU operator's DaemonSet often writes it) is replaced
    by ``hostname`` too, so a node's history does not split each time the DaemonSet rolls. Rates are
    integrated over the time between scrapes, but never across a gap longer than ``max_gap`` seconds.
    ``clock`` (monotonic seconds) exists so tests can drive the integration deterministically.
    """

    name = "dcgm"

    def __init__(
        self,
        url: str = DEFAULT_URL,
        *,
        timeout: float = 2.0,
        retries: int = 2,
        backoff: float = 0.1,
        budget: float = 5.0,
        hostname: str | None = None,
        force_hostname: bool = False,
        max_gap: float = 300.0,
        clock: Callable[[], float] = time.monotonic,
        session: requests.Session | None = None,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"dcgm-exporter URL must be http(s)://..., got {url!r}")
        for what, v in (("timeout", timeout), ("budget", budget), ("max_gap", max_gap)):
            if not v > 0:
                raise ValueError(f"{what} must be > 0, got {v!r}")
        if retries < 0 or backoff < 0:
            raise ValueError(f"retries and backoff must be >= 0, got {retries!r}, {backoff!r}")
        self.url = url
        self.timeout = float(timeout)
        self.retries = int(retries)
        self.backoff = float(backoff)
        self.budget = float(budget)
        self.hostname = hostname or socket.gethostname()
        self.force_hostname = force_hostname
        self._pod_hosts: set[str] = set()
        self.max_gap = float(max_gap)
        self._clock = clock
        #: Our own session's GET, prepared once (see fetch); None for a caller's session.
        self._prepared: requests.PreparedRequest | None = None
        if session is None:
            session = requests.Session()
            # Node-local endpoint: an HTTP(S)_PROXY from the environment must not capture it.
            session.trust_env = False
            self._prepared = session.prepare_request(requests.Request("GET", url, headers=_ACCEPT))
        self._session = session
        self._idents: dict[str, _Ident | None] = {}
        #: line prefix (everything before the value) -> mapped entry (see _entry); for a comment
        #: line known to be harmless (not a bad ``# TYPE``), the whole line
        self._lines: dict[str, tuple | str] = {}
        #: rate series -> [counter, last rate, last time]
        self._rates: dict[tuple[tuple[str, ...], str, tuple[tuple[str, str], ...]], list[float]] = {}
        self._xid_last: dict[tuple[str, ...], int] = {}
        self._xid_window: dict[tuple[tuple[str, ...], str], float] = {}
        self._xid_counts: dict[tuple[str, ...], dict[str, float]] = {}
        #: DCGM fields seen but not in the contract (logged once each).
        self.ignored_fields: set[str] = set()

    # -- HTTP ---------------------------------------------------------------------------
    def fetch(self) -> str:
        """GET the endpoint with retries inside the budget; ScrapeError naming the URL when it fails."""
        deadline = time.monotonic() + self.budget
        attempt = 0
        while True:
            attempt += 1
            per_try = max(min(self.timeout, deadline - time.monotonic()), 0.001)
            try:
                prepared = self._prepared
                if prepared is not None and not self._session.cookies:
                    # What session.get() would send (no env settings, no cookies to merge),
                    # without preparing the same request again on every scrape.
                    resp = self._session.send(prepared.copy(), timeout=per_try)
                else:
                    resp = self._session.get(self.url, timeout=per_try, headers=_ACCEPT)
                if resp.status_code == 200:
                    return resp.content.decode("utf-8", "replace")
                snippet = resp.text[:200].strip().replace("\n", " ")
                err = ScrapeError(HTTP_ERROR, f"GET {self.url} returned HTTP {resp.status_code} {resp.reason}"
                                  + (f": {snippet}" if snippet else ""))
                retry = resp.status_code >= 500 or resp.status_code == 429
            except requests.Timeout:
                err, retry = ScrapeError(TIMEOUT, f"GET {self.url} timed out after {per_try:.3g}s"), True
            except requests.RequestException as exc:
                if _is_read_timeout(exc):
                    err = ScrapeError(TIMEOUT, f"GET {self.url} timed out reading the body after {per_try:.3g}s")
                else:
                    err = ScrapeError(UNREACHABLE, f"GET {self.url} failed: {_short(exc)}")
                retry = True
            pause = self.backoff * 2 ** (attempt - 1)
            if not retry or attempt > self.retries or time.monotonic() + pause >= deadline:
                if attempt > 1:
                    err.message += f" (after {attempt} attempts)"
                raise err
            time.sleep(pause)

    # -- Source -------------------------------------------------------------------------
    def collect(self) -> Reading:
        reading = Reading()
        try:
            text = self.fetch()
        except ScrapeError as exc:
            reading.fail(exc.kind, exc.message)
            return reading
        try:
            self.convert(text, reading)
        except Exception as exc:  # a bug here must cost this scrape, not the exporter
            log.exception("dcgm: converting the output of %s failed", self.url)
            reading = Reading()
            reading.fail(INTERNAL_ERROR, f"converting the output of {self.url} failed: {exc!r}")
        return reading

    def close(self) -> None:
        self._session.close()

    # -- mapping ------------------------------------------------------------------------
    def convert(self, text: str, reading: Reading | None = None) -> Reading:
        """Parse one dcgm-exporter body and add its contract samples to ``reading``.

        State (rate counters, XID counts) advances, so call it once per scrape. Steps: read every line
        into ``reading`` and the page state, report what was wrong with the page, then derive what needs
        the whole page (memory totals, XID counters, identity and allocation series).
        """
        if reading is None:
            reading = Reading()
        if len(self._lines) > _MAX_CACHED:  # label churn (pods come and go): keep the caches bounded
            self._lines.clear()
            self._idents.clear()
        page = _Page(now=self._clock())
        for lineno, line in enumerate(text.splitlines(), 1):
            hit = self._lookup(line, lineno, page)
            if hit is not None and self._admit(hit, line, lineno, reading, page):
                self._apply(hit, line, lineno, reading, page)
        if not self._report_page(page, reading):
            return reading
        self._check_uuids(page.seen, reading)
        self._count_last_xids(page.last_xid, page.xid_counted)
        self._add_memory_totals(page, reading)
        self._add_identity(page, reading)
        self._add_allocations(page, reading)
        return reading

    def _lookup(self, line: str, lineno: int, page: _Page) -> tuple[tuple, float, str] | None:
        """(mapping entry, value, series) of a sample line; None for comments and bad lines.

        A line seen before (same name and labels, only the value differs) is a lookup and a float();
        see promtext.parse_line for why the prefix is a safe key.
        """
        cache = self._lines
        prefix, _, vt = line.rpartition(" ")
        series = prefix  # name and labels: the series, to find one printed twice
        ent = cache.get(prefix)
        value = 0.0
        if ent is not None:
            if ent.__class__ is str:  # a comment line seen before (the entry is the whole line)
                if ent == line:
                    return None
                ent = None
            else:
                try:
                    value = float(vt)
                except ValueError:
                    ent = None
                else:
                    if "_" in vt:
                        ent = None
        if ent is None:
            r = promtext.parse_line(line, page.label_cache, page.types)
            if r is None:
                if line[:1] == "#" and prefix:
                    cache[prefix] = line  # HELP/TYPE lines repeat every scrape too
                return None
            if r.__class__ is str:
                page.bad.append(promtext.BadLine(lineno, r, line))  # type: ignore[arg-type]
                return None
            name, block, labels, value, prefix = r  # type: ignore[misc]
            ent = self._entry(name, block, labels)
            if prefix is not None:
                cache[prefix] = ent
        page.n_samples += 1
        return ent, value, series

    def _admit(self, hit: tuple[tuple, float, str], line: str, lineno: int, reading: Reading, page: _Page) -> bool:
        """Count the sample and decide whether it is used: not a field outside the contract, not blank, not
        printed twice, with an identity (which it records, with its holder)."""
        ent, value, series = hit
        how = ent[0]
        if how >= _SKIP:
            if how == _SKIP:
                return False
            page.dcgm_samples += 1
            if how == _IGNORED:
                reading.ignore(ent[1], NOT_IN_CONTRACT)
                if ent[1] not in self.ignored_fields:
                    self.ignored_fields.add(ent[1])
                    log.info("dcgm: field %s is not in truegpu's contract: counted in "
                             "truegpu_exporter_ignored_series, not published", ent[1])
                return False
        else:
            page.dcgm_samples += 1
        if value - value != 0 or (value >= _SENTINEL_MIN and is_dcgm_sentinel(value)):
            # NaN, +-Inf or DCGM's "blank"/not supported marker: unknown, never a value
            reading.ignore(_name_of(line), BLANK)
            return False
        if series in page.series:
            page.duplicates.append(lineno)
            reading.ignore(_name_of(line), DUPLICATE)
            return False
        page.series.add(series)
        if how == _NO_IDENT:
            page.no_identity.append(lineno)
            return False
        seen = page.seen
        key = ent[1]
        if key not in seen:
            seen[key] = ent[2]
        if ent[3] is not None:
            inst_key, holder, inst = ent[3]
            page.allocs[(inst_key, holder)] = None
            if inst_key not in seen:
                seen[inst_key] = inst
        return True

    def _apply(self, hit: tuple[tuple, float, str], line: str, lineno: int, reading: Reading, page: _Page) -> None:
        """Turn one admitted sample into contract samples (or page state), by how its field maps."""
        ent, value, _series = hit
        how, key = ent[0], ent[1]
        add = reading.add
        if how == _VALUE:  # reading.add, inlined
            if ent[9] is not None:
                if ent[9] in page.repeats:
                    reading.ignore(_name_of(line), MIG_REPEAT)
                    return
                page.repeats.add(ent[9])
            lst = reading.samples.get(ent[4])
            if lst is None:
                lst = reading.samples[ent[4]] = []
            lst.append((ent[5], value * ent[6] / ent[8]))
        elif how == _USED:
            add(MEMORY_USED, ent[5], value * ent[6] / ent[8])
            page.mem.setdefault(key, {})["used"] = value
        elif how == _MEM:
            page.mem.setdefault(key, {})[ent[4]] = value
        elif how == _RATE:
            rkey = ent[7]
            if rkey in page.rates_done:
                return
            page.rates_done.add(rkey)
            add(ent[4], ent[5], self._integrate(rkey, max(value * ent[6] / ent[8], 0.0), page.now))
        elif how == _BITMASK:
            if key in page.bitmask_done:
                return  # both the current name and its deprecated alias are present
            page.bitmask_done.add(key)
            mask = int(value)
            for bit, labels in ent[4]:
                add(CLOCK_EVENT_ACTIVE, labels, 1.0 if mask & bit else 0.0)
        elif how == _LAST:
            page.last_xid[key] = int(value)
        else:  # _XID_COUNT
            xid = ent[4]
            if not xid:
                page.no_identity.append(lineno)
                return
            page.xid_counted.add(key)
            wkey = (key, xid)
            prev = self._xid_window.get(wkey, 0.0)
            self._xid_window[wkey] = value
            if value > prev:
                counts = self._xid_counts.setdefault(key, {})
                counts[xid] = counts.get(xid, 0.0) + (value - prev)

    def _report_page(self, page: _Page, reading: Reading) -> bool:
        """Errors about the page as a whole; False when it holds nothing usable (the source failed)."""
        if not page.n_samples:
            reading.fail(PARSE_ERROR, f"no samples in the response of {self.url}" + _bad_summary(page.bad))
            return False
        if page.bad:
            reading.errors.append(SourceError(BAD_LINE, f"{self.url}: skipped {len(page.bad)} bad line(s)"
                                              + _bad_summary(page.bad)))
        if page.dcgm_samples == 0:
            reading.fail(PARSE_ERROR, f"no DCGM fields in the response of {self.url} (is it a dcgm-exporter?)")
            return False
        if page.no_identity:
            reading.errors.append(SourceError(
                BAD_SAMPLE, f"{self.url}: {len(page.no_identity)} DCGM sample(s) without gpu/UUID (or xid) labels "
                            f"skipped, line(s) {_lines(page.no_identity)}"))
        if page.duplicates:
            reading.errors.append(SourceError(
                DUPLICATE_SERIES, f"{self.url}: {len(page.duplicates)} series printed twice (first value kept), "
                                  "line(s) " + _lines(page.duplicates)))
        return True

    def _add_memory_totals(self, page: _Page, reading: Reading) -> None:
        """FB_TOTAL where given, else FB_USED + FB_FREE (+ FB_RESERVED); a part without FB_USED is partial."""
        for key, parts in page.mem.items():
            total = parts.get("total")
            if total is None and "used" in parts and "free" in parts:
                # Drivers before FB_RESERVED existed counted reserved memory inside "used".
                total = parts["used"] + parts["free"] + parts.get("reserved", 0.0)
            if total is not None:
                reading.add(MEMORY_TOTAL, dict(page.seen[key].labels), total * MIB)
            else:  # FB_FREE or FB_RESERVED without FB_USED: no total can be formed
                for part in parts.keys() - {"used"}:
                    reading.ignore(_MEM_FIELDS.get(part, part), PARTIAL)

    def _add_identity(self, page: _Page, reading: Reading) -> None:
        """Each identity's XID counters, and one GPU_INFO per physical GPU seen on the page."""
        infos: set[tuple[str, str, str]] = set()
        for key, ident in page.seen.items():
            for xid, n in self._xid_counts.get(key, {}).items():
                labels = dict(ident.labels)
                labels["xid"] = xid
                reading.add(XID_ERRORS, labels, n)
            if ident.gpu_key not in infos:
                infos.add(ident.gpu_key)
                host, gpu, uuid = ident.gpu_key
                model, driver, pci = ident.info
                reading.add(GPU_INFO, {HOSTNAME: host, GPU: gpu, UUID: uuid, "model": model, "driver_version": driver,
                                       "pci_bus_id": pci, "numa_node": ""}, 1.0)

    def _add_allocations(self, page: _Page, reading: Reading) -> None:
        """One series per (GPU, holder): time-sliced GPUs carry one label block per pod."""
        for key, (ns, pod, container, job) in page.allocs:
            labels = dict(page.seen[key].labels)
            labels.update({"namespace": ns, "pod": pod, "container": container, WORKLOAD: job})
            reading.add(GPU_ALLOCATION_INFO, labels, 1.0)

    def _entry(self, name: str, block: str, labels: dict[str, str]) -> tuple:
        """How every sample of one series (field name + label block) is mapped; built once, then cached.

        Label dicts in an entry are shared by every scrape's Reading: consumers only read them.
        """
        spec = _FIELDS.get(name)
        if spec is None:
            return (_IGNORED, name) if name[:5] in ("DCGM_", "dcgm_") else (_SKIP,)
        idents = self._idents
        ident = idents.get(block, False)
        if ident is False:
            if len(idents) > _MAX_CACHED:
                idents.clear()
            ident = idents[block] = self._ident(labels)
        if ident is None:
            return (_NO_IDENT,)
        # the holder of a MIG instance holds that instance, whatever family the line is of
        alloc = (ident.key, ident.alloc, ident) if ident.alloc is not None else None
        how = spec.how
        repeat = None
        if ident.labels.get(GPU_INSTANCE) is not None and how not in (_USED, _MEM) \
                and spec.metric not in PER_MIG_INSTANCE:
            ident = self._whole(ident)  # a whole-GPU field repeated on the instance's line: once per GPU
            repeat = (ident.key, spec.metric.name, spec.extra)
        key = ident.key
        if how in (_VALUE, _USED, _RATE):
            out = dict(ident.labels)
            out.update(spec.extra)
            rkey = (key, spec.metric.name, spec.extra) if how == _RATE else None
            return how, key, ident, alloc, spec.metric, out, spec.scale, rkey, spec.div, repeat
        if how == _MEM:
            return how, key, ident, alloc, spec.part
        if how == _BITMASK:
            return how, key, ident, alloc, tuple(
                (bit, {**ident.labels, "reason": reason}) for bit, reason in CLOCK_EVENT_REASONS.items())
        if how == _LAST:
            return how, key, ident, alloc
        return how, key, ident, alloc, labels.get("xid", "")  # _XID_COUNT

    def _whole(self, ident: _Ident) -> _Ident:
        """The whole GPU a MIG instance belongs to (identity labels without the MIG ones)."""
        host, gpu, uuid = ident.gpu_key
        return _Ident(key=(host, gpu, uuid, "", ""), gpu_key=ident.gpu_key,
                      labels={HOSTNAME: host, GPU: gpu, UUID: uuid}, info=ident.info, alloc=None)

    def _ident(self, labels: dict[str, str]) -> _Ident | None:
        gpu = labels.get("gpu", "")
        uuid = _first(labels, _UUID_LABELS)
        if not gpu and not uuid:
            return None
        host = self.hostname if self.force_hostname else (_first(labels, _HOST_LABELS) or self.hostname)
        if host != self.hostname and DCGM_EXPORTER_POD.fullmatch(host):
            if host not in self._pod_hosts:
                self._pod_hosts.add(host)
                log.warning("dcgm: host label %r is dcgm-exporter's pod name, not a node: using %r (set "
                            "--dcgm-hostname to the node name, e.g. from the downward API)", host, self.hostname)
            host = self.hostname
        gi = _first(labels, _GI_LABELS)
        profile = _first(labels, _PROFILE_LABELS)
        ident_labels = {HOSTNAME: host, GPU: gpu, UUID: uuid}
        if gi or profile:
            ident_labels[GPU_INSTANCE] = gi
            ident_labels[MIG_PROFILE] = profile
        pod = labels.get("pod") or labels.get("pod_name") or ""
        hpc_job = labels.get("hpc_job") or ""
        alloc = None
        if pod or hpc_job:
            alloc = (
                labels.get("namespace") or labels.get("pod_namespace") or "",
                pod,
                labels.get("container") or labels.get("container_name") or "",
                hpc_job or derive_job(pod),
            )
        return _Ident(
            key=(host, gpu, uuid, gi, profile),
            gpu_key=(host, gpu, uuid),
            labels=ident_labels,
            info=(labels.get("modelName", ""), _first(labels, _DRIVER_LABELS), labels.get("pci_bus_id", "")),
            alloc=alloc,
        )

    def _check_uuids(self, seen: dict[tuple[str, ...], _Ident], reading: Reading) -> None:
        """GPUs without a UUID, or a UUID on several GPUs, are still published (told apart by host and
        index) but said so: the UUID is what identifies a GPU across hosts and reboots."""
        gpus = {ident.gpu_key for ident in seen.values()}
        missing = sorted(f"{host}/{gpu}" for host, gpu, uuid in gpus if not uuid)
        if missing:
            reading.errors.append(SourceError(NO_UUID, f"{self.url}: {len(missing)} GPU(s) without a UUID label "
                                              f"({', '.join(missing[:5])}): told apart by host and gpu index"))
        holders: dict[str, list[str]] = {}
        for host, gpu, uuid in gpus:
            if uuid:
                holders.setdefault(uuid, []).append(f"{host}/{gpu}")
        shared = {u: sorted(h) for u, h in holders.items() if len(h) > 1}
        if shared:
            u, h = sorted(shared.items())[0]
            reading.errors.append(SourceError(
                DUPLICATE_UUID, f"{self.url}: {len(shared)} UUID(s) on more than one GPU (e.g. {u} on "
                                f"{', '.join(h)}): told apart by host and gpu index"))

    def _integrate(self, rkey: tuple, rate: float, now: float) -> float:
        """Counter for a rate series: trapezoid of the rates between scrapes; starts at 0, never decreases."""
        state = self._rates.get(rkey)
        if state is None:
            self._rates[rkey] = [0.0, rate, now]
            return 0.0
        total, last_rate, last_t = state
        dt = now - last_t
        if 0 < dt <= self.max_gap:
            total += (last_rate + rate) / 2 * dt
        state[0], state[1], state[2] = total, rate, now
        return total

    def _count_last_xids(self, last_xid: dict[tuple[str, ...], int], skip: set[tuple[str, ...]]) -> None:
        """DCGM_FI_DEV_XID_ERRORS holds the last XID: each change to a new non-zero value is one event.

        An XID already showing at the first scrape counts once, so a GPU that failed before
        the exporter started is not invisible. GPUs whose XIDs dcgm-exporter counts itself
        (DCGM_EXP_XID_ERRORS_COUNT) are not counted twice.
        """
        for key, xid in last_xid.items():
            prev = self._xid_last.get(key)
            self._xid_last[key] = xid
            if xid != 0 and xid != prev and key not in skip:
                counts = self._xid_counts.setdefault(key, {})
                counts[str(xid)] = counts.get(str(xid), 0.0) + 1.0


def _name_of(line: str) -> str:
    """The field name of a sample line (what truegpu_exporter_ignored_series names)."""
    return line.split("{", 1)[0].split(" ", 1)[0]


def _lines(numbers: list[int], limit: int = 10) -> str:
    return ", ".join(map(str, numbers[:limit])) + (" ..." if len(numbers) > limit else "")


def _bad_summary(bad: list[promtext.BadLine], limit: int = 5) -> str:
    if not bad:
        return ""
    shown = "; ".join(f"line {b.line}: {b.reason}" for b in bad[:limit])
    return f" ({shown}{'; ...' if len(bad) > limit else ''})"


def _is_read_timeout(exc: BaseException) -> bool:
    """requests wraps a timeout while streaming the body in a ConnectionError; find it in the chain."""
    cur: BaseException | None = exc
    for _ in range(8):
        if cur is None:
            return False
        if isinstance(cur, ReadTimeoutError | TimeoutError):
            return True
        cur = cur.args[0] if cur.args and isinstance(cur.args[0], BaseException) else cur.__cause__
    return False


_ERRNO = re.compile(r"\[Errno -?\d+\] [^'\")]+")


def _short(exc: BaseException) -> str:
    """The useful part of a requests/urllib3 error ('[Errno 111] Connection refused')."""
    text = str(exc)
    m = _ERRNO.search(text)
    return m.group(0).strip() if m else text[:200]


# -- command line (for the source registry) ------------------------------------------------
def from_args(args: argparse.Namespace) -> DcgmSource:
    """Build the source from parsed ``add_arguments`` options (ValueError when they are unusable)."""
    return DcgmSource(
        getattr(args, "dcgm_url", DEFAULT_URL),
        timeout=getattr(args, "dcgm_timeout", 2.0),
        retries=getattr(args, "dcgm_retries", 2),
        budget=getattr(args, "dcgm_budget", 5.0),
        hostname=getattr(args, "dcgm_hostname", None),
        force_hostname=getattr(args, "dcgm_force_hostname", False),
    )
