"""Read samples from a Prometheus-compatible HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics).

Only the documented ``/api/v1`` endpoints every one of them serves are used
(``query_range``, ``series``, ``label/__name__/values``), sent as form-encoded POST where the
API allows it so long selectors never hit URL length limits. What keeps big fleets cheap and
inside the server's limits:

- aggregation is pushed down into PromQL (``avg_over_time`` per step for gauges, ``increase``
  for counters), so the server returns one point per step instead of every scrape;
- each metric's query is planned (``analyzer.data.ingest.plan``): where one instant count shows
  it may come near ``max_samples`` (the server's ``--query.max-samples``), its series per host
  are looked up and it is cut by host and by time to stay under it, and every request stays
  under 11,000 points per series; a request refused anyway ("too many samples") is halved and
  retried, down to one host and one step;
- requests run ``concurrency`` at a time, and their answers are decoded straight into numpy
  (``analyzer.data.ingest.matrix``) and put together in one order whatever order they come in.

Every user-supplied value that ends up in PromQL goes through ``promql_string`` and every
label or metric name is validated, so a value such as ``a"}) or vector(1) #`` stays a
string literal.
"""

from __future__ import annotations

import ipaddress
import math
import re
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import closing
from dataclasses import dataclass
from itertools import islice
from typing import Any, TypeVar
from urllib.parse import urlsplit

import numpy as np
import orjson
import pandas as pd
import requests
from requests.adapters import HTTPAdapter

from analyzer.data.ingest import matrix as mx
from analyzer.data.ingest._common import FrameBuilder, IngestReport, LabelSets, MetricFilter
from analyzer.data.ingest.plan import (
    MAX_POINTS,
    MAX_SAMPLES,
    SHARD_LABELS,
    Plan,
    Shard,
    chunk_windows,
    cost,
    halve_window,
    steps_in,
)
from analyzer.data.ingest.plan import plan as plan_requests
from analyzer.data.ingest.samples import Samples
from exporter import schema

_METRIC_NAME_RE = re.compile(r"[a-zA-Z_:][a-zA-Z0-9_:]*")
_LABEL_NAME_RE = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")
_OPS = ("=", "!=", "=~", "!~")
#: Range functions ``aggregate_query`` accepts.
RANGE_FUNCTIONS = frozenset({
    "avg_over_time", "min_over_time", "max_over_time", "sum_over_time", "count_over_time",
    "last_over_time", "stddev_over_time", "quantile_over_time", "present_over_time",
    "rate", "irate", "increase", "delta", "idelta", "deriv", "changes", "resets",
})  # fmt: skip
_RETRY_STATUS = frozenset({500, 502, 503, 504})
#: The largest answer read (bytes): past it the query is refused with advice, not decoded into GBs.
MAX_RESPONSE_BYTES = 256 * 1024 * 1024
#: The most series one answer may hold (one query chunk).
MAX_SERIES_PER_ANSWER = 200_000
#: Points one planned request asks for at most, whatever the server allows: ~35 MB of JSON, so
#: ``concurrency`` answers in flight stay small next to the data they bring.
ANSWER_POINTS = 1_000_000
#: Requests in flight at once by default.
CONCURRENCY = 4
#: Prometheus' default lookback: a raw selector at t sees the last sample in (t - 5m, t].
LOOKBACK = 300.0
_NARROW = "narrow the query: --matcher on a host/namespace, a shorter window or a coarser --step"
#: VictoriaMetrics rounds a cacheable range of 50+ points to multiples of step, moving every point
#: off the instant asked for (one ms before a row's end); ``nocache`` keeps them. Others ignore it.
_EXACT_STEPS = {"nocache": "1"}
#: A refusal that a smaller request avoids: Prometheus/Thanos/Mimir's "query processing would load
#: too many samples" and "exceeded maximum resolution of 11,000 points", Mimir's "maximum number of
#: series/samples", VictoriaMetrics' -search.maxSamplesPerQuery / maxPointsPerTimeseries /
#: maxUniqueTimeseries, and this client's own answer-size caps (``_TOO_LARGE``).
_TOO_BIG = re.compile(r"too many (?:samples|points)|maximum resolution|maximum number of (?:samples|series|points)"
                      r"|max(?:SamplesPerQuery|PointsPerTimeseries|UniqueTimeseries)", re.IGNORECASE)
_TOO_LARGE = "answer_too_large"
_T = TypeVar("_T")
_R = TypeVar("_R")


class PrometheusError(RuntimeError):
    """A Prometheus API call failed; the message names the URL and what the server said."""

    def __init__(
        self, message: str, *, url: str = "", status: int | None = None, error_type: str = "", error: str = ""
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status = status
        self.error_type = error_type
        self.error = error

    @property
    def too_big(self) -> bool:
        """The request was refused for its size: a smaller one may pass."""
        return self.error_type == _TOO_LARGE or (self.status in (400, 422) and bool(_TOO_BIG.search(self.error)))


# PromQL building ---------------------------------------------------------------------------
def promql_string(value: str) -> str:
    """``value`` as a double-quoted PromQL string literal that cannot be broken out of."""
    out = ['"']
    for ch in str(value):
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\r":
            out.append("\\r")
        elif ch == "\t":
            out.append("\\t")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{ord(ch):02x}")
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def _regex_escape(value: str) -> str:
    """Escape RE2 metacharacters so the value matches only itself."""
    return re.sub(r"([\\.+*?()|\[\]{}^$])", r"\\\1", value)


@dataclass(frozen=True)
class Matcher:
    """An explicit label matcher: ``op`` is one of ``=``, ``!=``, ``=~``, ``!~``."""

    op: str
    value: str


MatcherValue = str | Matcher | Sequence[str]


def _matcher(label: str, spec: MatcherValue) -> str:
    if not _LABEL_NAME_RE.fullmatch(label):
        raise ValueError(f"invalid label name {label!r} in matchers")
    if isinstance(spec, Matcher):
        if spec.op not in _OPS:
            raise ValueError(f"invalid matcher operator {spec.op!r} for label {label!r}; use one of {_OPS}")
        return f"{label}{spec.op}{promql_string(spec.value)}"
    if isinstance(spec, str):
        return f"{label}={promql_string(spec)}"
    values = list(spec)
    if not values or not all(isinstance(v, str) for v in values):
        raise ValueError(f"matcher for label {label!r} must be a string, a Matcher or a non-empty list of strings")
    return f"{label}=~{promql_string('|'.join(_regex_escape(v) for v in values))}"


def selector(metric: str | None, matchers: Mapping[str, MatcherValue] | None = None) -> str:
    """``metric{label="value",...}``; a list value means "any of these" (an escaped regex)."""
    if metric is not None and not _METRIC_NAME_RE.fullmatch(metric):
        raise ValueError(f"invalid metric name {metric!r}")
    parts = [_matcher(label, spec) for label, spec in (matchers or {}).items()]
    if metric is None:
        if not parts:
            raise ValueError("a selector needs a metric name or at least one matcher")
        return "{" + ",".join(parts) + "}"
    return metric + ("{" + ",".join(parts) + "}" if parts else "")


def duration(seconds: float) -> str:
    """PromQL duration for ``seconds`` (``60s``, ``1500ms``); must be a positive whole ms."""
    ms = round(seconds * 1000)
    if not math.isfinite(seconds) or seconds <= 0 or abs(ms - seconds * 1000) > 1e-6:
        raise ValueError(f"duration {seconds!r}s must be a positive whole number of milliseconds")
    return f"{ms // 1000}s" if ms % 1000 == 0 else f"{ms}ms"


def default_function(metric: str) -> str:
    """The range function that summarises one step of ``metric`` honestly.

    Gauges are averaged; counters become the increase per step; DCGM bitmasks and
    "last event" fields (which an average would corrupt) keep their last value; DCGM
    fields that are really rates (NVLink/PCIe bytes) are averaged even if declared counters.
    """
    if metric in schema.BY_NAME:
        return "increase" if schema.BY_NAME[metric].type == "counter" else "avg_over_time"
    if metric in schema.DCGM_BY_FIELD:
        contract, dcgm_field = schema.DCGM_BY_FIELD[metric]
        if dcgm_field.kind in ("bitmask", "last"):
            return "last_over_time"
        if dcgm_field.kind == "rate":
            return "avg_over_time"
        return "increase" if contract.type == "counter" else "avg_over_time"
    return "increase" if metric.endswith("_total") else "avg_over_time"


def aggregate_query(
    metric: str,
    step: float,
    matchers: Mapping[str, MatcherValue] | None = None,
    function: str | None = None,
    window: float | None = None,
) -> str:
    """``function(selector[window])``: one value per step computed by the server.

    ``function`` defaults to ``default_function(metric)``. ``window`` defaults to one
    millisecond less than ``step``, so consecutive points tile the range, each covering
    the step that ends at it, both on Prometheus 2.x (closed ranges ``[t-w, t]``, where a
    full-step window would count a boundary sample twice) and on 3.x (``(t-w, t]``).
    ``increase``/``rate`` need two samples in the window: keep step >= 2 scrape intervals
    or pass a longer ``window``.
    """
    function = function or default_function(metric)
    if function not in RANGE_FUNCTIONS:
        raise ValueError(f"unsupported range function {function!r}; use one of {sorted(RANGE_FUNCTIONS)}")
    if function == "quantile_over_time":
        raise ValueError("quantile_over_time needs a quantile argument; write the PromQL yourself")
    if window is None:
        window = step - 0.001 if step > 0.001 else step
    return f"{function}({selector(metric, matchers)}[{duration(window)}])"


# Client --------------------------------------------------------------------------------------
@dataclass
class RangeResult:
    """Series of one range query (all chunks merged) and the server's warnings."""

    series: list[tuple[dict[str, str], np.ndarray, np.ndarray]]
    warnings: list[str]
    skipped_histograms: int = 0


@dataclass
class Answer:
    """One ``query_range`` answer: its matrix and the server's warnings (infos prefixed ``info:``)."""

    matrix: mx.Matrix
    warnings: list[str]


def _loopback(url: str) -> bool:
    """Whether ``url``'s host is this machine (localhost or a loopback address)."""
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class PrometheusClient:
    """Thin, retrying client of the Prometheus HTTP API shared by Prometheus-compatible servers.

    ``max_samples`` is the server's limit on samples one query may hold (``--query.max-samples``,
    50 M by default; tell a lower one to skip the refused tries) and ``concurrency`` the requests
    in flight at once. Safe to use from several threads.

    Answers come gzip-compressed (requests asks for it), except from a server on this machine (a loopback
    address): there compression saves no network and costs both sides CPU, a fifth of Prometheus' CPU for
    serve's ticks (1.3 s -> 1.05 s a tick at 2,000 GPUs). A ``headers`` Accept-Encoding decides either way.
    """

    def __init__(
        self,
        url: str,
        timeout: float = 30.0,
        retries: int = 3,
        bearer_token: str | None = None,
        basic_auth: tuple[str, str] | None = None,
        verify: bool | str = True,
        headers: Mapping[str, str] | None = None,
        *,
        backoff: float = 0.5,
        max_points: int = MAX_POINTS,
        max_response_bytes: int = MAX_RESPONSE_BYTES,
        max_samples: int = MAX_SAMPLES,
        concurrency: int = CONCURRENCY,
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL must start with http:// or https://, not {url!r}")
        if bearer_token and basic_auth:
            raise ValueError("give either bearer_token or basic_auth, not both")
        if int(max_samples) < 1 or int(concurrency) < 1:
            raise ValueError(f"max_samples ({max_samples!r}) and concurrency ({concurrency!r}) must be at least 1")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.max_points = max_points
        self.max_response_bytes = max_response_bytes
        self.max_samples = int(max_samples)
        self.concurrency = int(concurrency)
        #: HTTP requests sent, and requests refused for their size (then split and sent again).
        self.requests_made = 0
        self.refusals = 0
        self._lock = threading.Lock()
        self.session = requests.Session()
        adapter = HTTPAdapter(pool_maxsize=max(10, self.concurrency))
        self.session.mount("http://", adapter)
        self.session.mount("https://", adapter)
        self.session.verify = verify
        self.session.headers["User-Agent"] = "truegpu-analyzer"
        if _loopback(self.url):
            self.session.headers["Accept-Encoding"] = "identity"
        if headers:
            self.session.headers.update(headers)
        if bearer_token:
            self.session.headers["Authorization"] = f"Bearer {bearer_token}"
        if basic_auth:
            self.session.auth = basic_auth

    @property
    def budget(self) -> int:
        """Samples one planned request may hold: the server's limit, or less to keep answers small."""
        return min(self.max_samples, ANSWER_POINTS)

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def imap(self, fn: Callable[[_T], _R], items: Iterable[_T]) -> Iterator[_R]:
        """``fn(item)`` for each item, yielded in order while ``concurrency`` run at once; at most
        2 x ``concurrency`` results wait ahead of the consumer, so answers do not pile up in memory."""
        items = iter(items)
        if self.concurrency == 1:
            yield from map(fn, items)
            return
        with ThreadPoolExecutor(self.concurrency, thread_name_prefix="prometheus") as pool:
            ahead = deque(pool.submit(fn, item) for item in islice(items, 2 * self.concurrency))
            try:
                while ahead:
                    result = ahead.popleft().result()
                    ahead.extend(pool.submit(fn, item) for item in islice(items, 1))
                    yield result
            finally:
                for future in ahead:
                    future.cancel()

    def _send(self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, Any]], method: str
              ) -> tuple[requests.Response, bytes]:
        """The answer (not yet decoded) to ``/api/v1/<path>``: connection errors, timeouts and 5xx
        answers are retried with exponential backoff, other answers returned as they are."""
        url = f"{self.url}/api/v1/{path}"
        last: str = ""
        t0 = time.monotonic()
        attempts = 0
        for attempt in range(self.retries + 1):
            if attempt:
                pause = self.backoff * 2 ** (attempt - 1)
                if time.monotonic() - t0 + pause > 2 * self.timeout:
                    break  # a hung server: give up after about two timeouts, not retries x timeout
                time.sleep(pause)
            with self._lock:
                self.requests_made += 1
            attempts += 1
            try:
                if method == "GET":
                    resp = self.session.get(url, params=params, timeout=self.timeout, stream=True)
                else:
                    resp = self.session.post(url, data=params, timeout=self.timeout, stream=True)
                with resp:
                    content = self._read(resp, url)
            except requests.exceptions.SSLError as e:
                raise PrometheusError(f"TLS error talking to Prometheus at {self.url}: {e}", url=url) from e
            except (requests.ConnectionError, requests.Timeout, requests.exceptions.ChunkedEncodingError) as e:
                # ChunkedEncodingError: the answer broke off (Prometheus restarted mid-reply), as transient.
                last = f"cannot reach Prometheus at {self.url} ({type(e).__name__}: {e})"
                continue
            if resp.status_code in _RETRY_STATUS:
                last = self._http_error_text(resp, content, url)
                continue
            return resp, content
        raise PrometheusError(
            f"{last} [gave up after {attempts} attempts in {time.monotonic() - t0:.0f} s]", url=url)

    def api(self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, Any]], method: str = "POST") -> dict:
        """Call ``/api/v1/<path>``; return the decoded ``{"status": "success", ...}`` body.

        Connection errors, timeouts and 5xx answers are retried with exponential backoff;
        everything else raises PrometheusError at once.
        """
        resp, content = self._send(path, params, method)
        url = f"{self.url}/api/v1/{path}"
        return self._check(resp, self._loads(resp, content, url), url)

    def _read(self, resp: requests.Response, url: str) -> bytes:
        """The body, refused past MAX_RESPONSE_BYTES before it is all in memory."""
        declared = resp.headers.get("Content-Length", "")
        if declared.isdigit() and int(declared) > self.max_response_bytes:
            raise self._too_large(url, int(declared))
        chunks, size = [], 0
        for chunk in resp.iter_content(1 << 20):
            size += len(chunk)
            if size > self.max_response_bytes:
                raise self._too_large(url, size)
            chunks.append(chunk)
        return b"".join(chunks)

    def _too_large(self, url: str, size: int) -> PrometheusError:
        return PrometheusError(
            f"Prometheus {url} answered more than {self.max_response_bytes / 2**20:.0f} MiB "
            f"({size / 2**20:.0f} MiB so far): {_NARROW}", url=url, error_type=_TOO_LARGE)

    @staticmethod
    def _http_error_text(resp: requests.Response, content: bytes, url: str) -> str:
        try:
            body = orjson.loads(content)
            detail = f"{body.get('errorType', '?')}: {body.get('error', '')}"
        except (ValueError, AttributeError):
            detail = content[:200].decode("utf-8", "replace").strip()
        return f"Prometheus {url} answered HTTP {resp.status_code}: {detail}"

    @staticmethod
    def _loads(resp: requests.Response, content: bytes, url: str) -> Any:
        try:
            return orjson.loads(content)
        except ValueError:
            raise PrometheusError(
                f"Prometheus {url} returned invalid JSON (HTTP {resp.status_code}, "
                f"Content-Type {resp.headers.get('Content-Type', '?')}): {content[:200]!r}",
                url=url,
                status=resp.status_code,
            ) from None

    @staticmethod
    def _check(resp: requests.Response, body: Any, url: str) -> dict:
        """``body`` when it is a success; else the error the server gave, as PrometheusError."""
        if not isinstance(body, dict) or body.get("status") != "success" or resp.status_code >= 400:
            error_type = body.get("errorType", "") if isinstance(body, dict) else ""
            error = body.get("error", "") if isinstance(body, dict) else ""
            detail = f"{error_type}: {error}" if (error_type or error) else repr(body)[:200]
            raise PrometheusError(
                f"Prometheus {url} answered HTTP {resp.status_code}: {detail}",
                url=url,
                status=resp.status_code,
                error_type=str(error_type),
                error=str(error),
            )
        return body

    def range_query(self, promql: str, start: float, end: float, step: float) -> Answer:
        """One ``query_range`` request (no chunking, no splitting), decoded into numpy."""
        resp, content = self._send("query_range", {"query": promql, "start": repr(start), "end": repr(end),
                                                   "step": repr(float(step)), **_EXACT_STEPS}, "POST")  # fmt: skip
        url = f"{self.url}/api/v1/query_range"
        cut = mx.cut(content) if resp.status_code == 200 else None
        try:
            body = orjson.loads(cut.skeleton) if cut else self._loads(resp, content, url)
        except ValueError:  # not the compact form after all: decode it whole
            cut, body = None, self._loads(resp, content, url)
        body = self._check(resp, body, url)
        where = f"Prometheus {self.url}: answer to {promql!r} at {start:.0f}..{end:.0f}"
        try:
            warnings = [str(w) for w in mx.as_list(body.get("warnings"), "warnings")]
            warnings += [f"info: {w}" for w in mx.as_list(body.get("infos"), "infos")]
            matrix = mx.decode(content, cut, body)
        except ValueError as exc:
            raise PrometheusError(f"{where}: {exc}", url=self.url) from None
        if len(matrix.counts) > MAX_SERIES_PER_ANSWER:
            raise PrometheusError(
                f"{where}: {len(matrix.counts):,} series, over the limit of {MAX_SERIES_PER_ANSWER:,}: {_NARROW}",
                url=self.url, error_type=_TOO_LARGE)
        return Answer(matrix, warnings)

    def range_split(
        self, build: Callable[[Shard], str], shard: Shard, start: float, end: float, step: float
    ) -> list[Answer]:
        """The answers to ``build(shard)`` over [start, end]; refused for its size, the request is halved
        (``shard``'s hosts, else the window) and retried, down to one host and one step."""
        promql = build(shard)
        try:
            return [self.range_query(promql, start, end, step)]
        except PrometheusError as exc:
            if not exc.too_big:
                raise
            with self._lock:
                self.refusals += 1
            halves = shard.halves()
            parts = [(h, start, end) for h in halves] if halves else \
                [(shard, *w) for w in halve_window(start, end, step) or ()]
            if not parts:
                raise PrometheusError(
                    f"{exc} [{promql!r} from {start:.3f} to {end:.3f} is refused even at the smallest split "
                    f"(one host, one step); requests were planned under max_samples={self.max_samples:,} and "
                    f"{self.max_points:,} points a series: raise the server's limit or {_NARROW}]",
                    url=exc.url, status=exc.status, error_type=exc.error_type, error=exc.error) from exc
        return [a for s, ws, we in parts for a in self.range_split(build, s, ws, we, step)]

    def query_range(self, promql: str, start: float, end: float, step: float) -> RangeResult:
        """Run ``promql`` over [start, end] every ``step`` seconds, in chunks of ``max_points`` steps
        (halved further when refused for size)."""
        windows = chunk_windows(start, end, step, self.max_points)
        parts = self.imap(lambda w: self.range_split(lambda _shard: promql, Shard(), w[0], w[1], step), windows)
        merged: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], list[np.ndarray], list[np.ndarray]]] = {}
        warnings: list[str] = []
        histograms = 0
        for answer in (a for part in parts for a in part):
            warnings += answer.warnings
            m = answer.matrix
            histograms += m.histograms
            for labels, ts, vs in m.series():
                if len(ts):
                    entry = merged.setdefault(tuple(sorted(labels.items())), (labels, [], []))
                    entry[1].append(ts)
                    entry[2].append(vs)
        series = [(labels, np.concatenate(ts), np.concatenate(vs)) for labels, ts, vs in merged.values()]
        return RangeResult(series, warnings, histograms)

    def series(self, match: Sequence[str], start: float, end: float) -> list[dict[str, str]]:
        """Label sets of the series matching any of ``match`` in [start, end] (an index lookup: no samples)."""
        params = [("match[]", m) for m in match] + [("start", repr(float(start))), ("end", repr(float(end)))]
        body = self.api("series", params)
        where = f"Prometheus {self.url}: answer to series {list(match)!r}"
        try:
            found = mx.as_list(body.get("data"), "data")
        except ValueError as exc:
            raise PrometheusError(f"{where}: {exc}", url=self.url) from None
        if not all(isinstance(s, dict) and all(isinstance(v, str) for v in s.values()) for s in found):
            raise PrometheusError(f"{where}: malformed answer: series must map label names to strings", url=self.url)
        return found

    def series_counts(
        self, names: Sequence[str], matchers: Mapping[str, MatcherValue] | None, at: float
    ) -> dict[str, int] | None:
        """Series of each of ``names`` at ``at`` (one instant ``count by (__name__)``: it loads one sample
        a series); None when the server refuses even that for its size."""
        sel = selector(None, {**(matchers or {}), "__name__": Matcher("=~", "|".join(map(_regex_escape, names)))})
        try:
            body = self.api("query", {"query": f"count by (__name__) ({sel})", "time": repr(float(at))})
        except PrometheusError as exc:
            if exc.too_big:
                return None
            raise
        try:
            data = body.get("data")
            return {item["metric"]["__name__"]: int(float(item["value"][1]))
                    for item in mx.as_list(data.get("result") if isinstance(data, dict) else data, "data.result")}
        except (ValueError, TypeError, KeyError, IndexError) as exc:
            raise PrometheusError(f"Prometheus {self.url}: answer to {sel!r} counted by name: malformed answer "
                                  f"({type(exc).__name__}: {exc})", url=self.url) from None

    def metric_names(
        self, match: Sequence[str] = (), start: float | None = None, end: float | None = None
    ) -> list[str]:
        """Metric names known to the server, optionally limited by ``match[]`` selectors and time."""
        params: list[tuple[str, Any]] = [("match[]", m) for m in match]
        if start is not None:
            params.append(("start", repr(float(start))))
        if end is not None:
            params.append(("end", repr(float(end))))
        body = self.api("label/__name__/values", params, method="GET")
        try:
            names = mx.as_list(body.get("data"), "data")
        except ValueError as exc:
            raise PrometheusError(f"Prometheus {self.url}: answer to label/__name__/values: {exc}") from None
        if not all(isinstance(n, str) for n in names):
            raise PrometheusError(f"Prometheus {self.url}: malformed answer: metric names must be strings")
        return names

    def existing_metrics(
        self,
        names: Iterable[str],
        matchers: Mapping[str, MatcherValue] | None = None,
        start: float | None = None,
        end: float | None = None,
    ) -> list[str]:
        """Which of ``names`` have at least one series (in [start, end], matching ``matchers``).

        Lets the normalize step say plainly "DCGM_FI_PROF_SM_ACTIVE is not collected".
        """
        names = list(dict.fromkeys(names))
        if not names:
            return []
        extra = dict(matchers or {})
        extra["__name__"] = Matcher("=~", "|".join(_regex_escape(n) for n in names))
        for n in names:
            if not _METRIC_NAME_RE.fullmatch(n):
                raise ValueError(f"invalid metric name {n!r}")
        found = set(self.metric_names([selector(None, extra)], start, end))
        return [n for n in names if n in found]


# Planned, parallel reading -------------------------------------------------------------------
def _shard_matchers(matchers: Mapping[str, MatcherValue] | None, shard: Shard) -> dict[str, MatcherValue]:
    """``matchers`` plus the one selecting ``shard``'s series (a regex over its hosts, or over the others')."""
    out = dict(matchers or {})
    if shard.label is not None and not (shard.rest and not shard.others):
        names = shard.others if shard.rest else shard.hosts
        out[shard.label] = Matcher("!~" if shard.rest else "=~", "|".join(_regex_escape(h) for h in names))
    return out


def _metric_names(client: PrometheusClient, metrics: Iterable[str] | MetricFilter, start: float, end: float
                  ) -> list[str]:
    """Exact names to query: a MetricFilter's prefixes resolved with ``metric_names`` (its names as given)."""
    if not isinstance(metrics, MetricFilter):
        return list(dict.fromkeys(metrics))
    names = sorted(metrics.names)
    if metrics.prefixes:
        match = [selector(None, {"__name__": Matcher("=~", _regex_escape(p) + ".*")}) for p in metrics.prefixes]
        found = client.metric_names(match, start, end)
        names += sorted(n for n in found if metrics.matches(n) and n not in metrics.names)
    return names


def _cat(arrays: list[np.ndarray], dtype: type) -> np.ndarray:
    """One array of ``arrays`` back to back (no copy for one)."""
    return arrays[0] if len(arrays) == 1 else np.concatenate(arrays) if arrays else np.zeros(0, dtype)


def _add(builder: FrameBuilder, name: str, answers: list[Answer]) -> int:
    """Add one metric's answers to ``builder`` in one canonical order (series by labels, then time),
    so the frame is the same however the requests were split and in whatever order they came back.
    Returns the series holding points."""
    matrices = [a.matrix for a in answers]
    labels = [lab for m in matrices for lab in m.raw_labels]
    counts = _cat([m.counts for m in matrices], np.int64)
    firsts = np.cumsum(counts) - counts
    bounds = np.cumsum([0, *(len(m.values) for m in matrices)])
    keep = np.flatnonzero(counts).tolist()
    sets = builder.labelsets
    known = sets.answer(name, labels, keep)
    if known is not None:  # the last read's answers named the same series in the same order
        sids = known.sids
        builder.named_again(known.canons, sids)
        order = known.order
    else:
        first_ts = _gather(matrices, bounds, firsts[keep])[0].tolist() if keep else []
        canons = [sets.get(lab if isinstance(lab, bytes) else tuple(lab.items())) for lab in (labels[i] for i in keep)]
        order = [j for *_, j in sorted(zip([(c.name or name, c.key, c.replicas) for c in canons], first_ts,
                                           range(len(keep)), strict=True))]
        sids = builder.series_ids(name, [canons[j] for j in order])
        if len(set(sids)) == len(sids):  # no series twice (an HA pair, a time split): the order is the labels'
            sets.keep_answer(name, keep, canons, order, sids)
    keep = np.asarray([keep[j] for j in order], dtype=np.int64)
    n = counts[keep]
    sids = np.asarray(sids, dtype=np.int32)
    # A few series at a time: the metric's points are never copied whole (a big metric's answers are ~1 M points
    # each, and the copies were most of the read's peak memory).
    ends = np.cumsum(n)
    cut = np.searchsorted(ends, np.arange(_ADD_CHUNK, int(ends[-1]) if len(ends) else 0, _ADD_CHUNK), side="right")
    for a, b in zip([0, *cut.tolist()], [*cut.tolist(), len(keep)], strict=True):
        if a == b:
            continue
        m = n[a:b]
        idx = np.arange(int(m.sum())) + np.repeat(firsts[keep[a:b]] - (np.cumsum(m) - m), m)
        builder.add(np.repeat(sids[a:b], m), *_gather(matrices, bounds, idx))
    found = builder.labelsets.series[name] = len(set(sids.tolist()))
    return found


#: Points of one metric added to the builder at a time (``_add``).
_ADD_CHUNK = 1 << 18


def _gather(matrices: list[mx.Matrix], bounds: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(timestamps, values) at ``idx``, positions in the answers' points back to back (``bounds``: where each
    answer's start); no copy of one answer's contiguous run (Prometheus sorts one answer's series alike)."""
    lo, hi = int(idx[0]), int(idx[-1]) + 1
    a = int(np.searchsorted(bounds, lo, side="right")) - 1
    if hi <= bounds[a + 1] and hi - lo == len(idx) and (np.diff(idx) == 1).all():
        s = lo - int(bounds[a])
        return matrices[a].timestamps[s:s + len(idx)], matrices[a].values[s:s + len(idx)]
    ts, values = np.empty(len(idx)), np.empty(len(idx))
    which = np.searchsorted(bounds, idx, side="right") - 1
    for k in np.unique(which).tolist():
        at = which == k
        ts[at] = matrices[k].timestamps[idx[at] - bounds[k]]
        values[at] = matrices[k].values[idx[at] - bounds[k]]
    return ts, values


def query_prometheus(
    client: PrometheusClient,
    metrics: Iterable[str] | MetricFilter,
    start: float,
    end: float,
    step: float,
    matchers: Mapping[str, MatcherValue] | None = None,
    *,
    aggregate: bool = True,
    functions: Mapping[str, str] | None = None,
    window: float | None = None,
    max_bad_examples: int = 20,
    sentinels: bool = True,
    plan: bool = True,
    compact: bool = False,
    labelsets: LabelSets | None = None,
    label_filters: Mapping[str, Mapping[str, MatcherValue]] | None = None,
) -> tuple[pd.DataFrame | Samples, IngestReport]:
    """Fetch ``metrics`` over [start, end] every ``step`` seconds into the long frame (``compact``: Samples).

    With ``aggregate`` (default) each metric is summarised per step on the server
    (``functions[metric]`` or ``default_function``, over ``window``: see ``aggregate_query``);
    the ``metric`` column then holds the requested name. Without it the raw selector is
    evaluated at each step (the last sample within Prometheus' lookback) and ``metric``
    comes from ``__name__``. A MetricFilter's prefixes are resolved to names with
    ``metric_names`` first (its exact names are queried as given). Metrics that return
    nothing are listed in ``report.missing``; server warnings land in ``report.warnings``.
    With ``plan`` (default) one instant ``count`` (or the last read of ``labelsets``) gives each
    metric's series; a metric that may come near the client's budget (``max_samples``) has its
    series looked up and its query cut by host and time under it (``analyzer.data.ingest.plan``);
    the others, and all without ``plan``, are cut by time only (``max_points``). Either way a
    request refused for its size is halved and retried. Requests run ``client.concurrency`` at a
    time; the frame does not depend on how they were cut or in what order they came back.
    ``labelsets``: the series as earlier reads knew them (serve's ticks read the same ones).
    ``label_filters``: per metric, matchers its selector adds (``matchers`` win on a label both name).
    Note: DCGM sentinels are turned into NaN after the server aggregated, so an average
    that mixed a sentinel with real values is not caught; use ``aggregate=False`` or a
    ``last_over_time``/``max_over_time`` function for such fields.
    """
    report = IngestReport(max_examples=max_bad_examples)
    builder = FrameBuilder(report, sentinels=sentinels, labelsets=labelsets)
    names = _metric_names(client, metrics, start, end)
    functions = dict(functions or {})
    filters = label_filters or {}

    def of(name: str) -> dict[str, MatcherValue]:
        return {**filters.get(name, {}), **(matchers or {})}

    def build(name: str) -> Callable[[Shard], str]:
        def promql(shard: Shard) -> str:
            narrowed = _shard_matchers(of(name), shard)
            if aggregate:
                return aggregate_query(name, step, narrowed, functions.get(name), window)
            return selector(name, narrowed)

        return promql

    builders = {name: build(name) for name in names}
    reach = (window if window is not None else step) if aggregate else LOOKBACK
    candidates = [label for label in SHARD_LABELS if label not in (matchers or {})]

    whole = Plan((Shard(),), tuple(chunk_windows(start, end, step, client.max_points)))
    counts = None
    if plan and names:  # each metric's series as the last read of them found them, else asked for (a metric that
        # had no points may still have series that cost the server samples)
        known = labelsets.series_before if labelsets is not None else {}
        counts = {n: known[n] for n in names if known.get(n)}
        if len(counts) < len(names):
            counts = client.series_counts(names, matchers, end)
    steps = min(steps_in(start, end, step), client.max_points)

    def planned(name: str) -> Plan:
        # small by the count (twice it: series that ended before ``end`` are not counted): no lookup
        if not plan or (counts is not None and cost(2 * counts.get(name, 0), steps) <= client.budget):
            return whole
        found = client.series([selector(name, of(name))], start - reach, end)
        return plan_requests(found, start, end, step, client.budget, max_points=client.max_points,
                             max_series=MAX_SERIES_PER_ANSWER, candidates=candidates)  # fmt: skip

    plans = list(client.imap(planned, names))
    units = [(name, shard, w) for name, p in zip(names, plans, strict=True) for shard, w in p.requests]
    fetch = client.imap(lambda u: client.range_split(builders[u[0]], u[1], u[2][0], u[2][1], step), units)
    with closing(fetch) as answers:  # on an error, requests not sent yet are cancelled
        for name, p in zip(names, plans, strict=True):  # each metric added as soon as its answers are in
            report.queries[name] = builders[name](Shard())
            got = [a for _ in p.requests for a in next(answers)]
            report.warnings.extend(f"{name}: {w}" for w in dict.fromkeys(w for a in got for w in a.warnings))
            histograms = sum(a.matrix.histograms for a in got)
            if histograms:
                report.warnings.append(f"{name}: {histograms} native-histogram series skipped")
            try:
                added = _add(builder, name, got)
            except ValueError as exc:  # a series' labels, decoded only now
                raise PrometheusError(f"Prometheus {client.url}: answer to {report.queries[name]!r}: {exc}",
                                      url=client.url) from None
            if not added:
                report.missing.append(name)
    return (builder.samples() if compact else builder.build()), report
