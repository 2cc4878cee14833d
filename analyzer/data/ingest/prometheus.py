"""Read samples from a Prometheus-compatible HTTP API (Prometheus, Thanos, Mimir, VictoriaMetrics).

Only the documented ``/api/v1`` endpoints every one of them serves are used
(``query_range``, ``label/__name__/values``), sent as form-encoded POST where the API
allows it so long selectors never hit URL length limits. Two things keep big fleets
cheap: aggregation is pushed down into PromQL (``avg_over_time`` per step for gauges,
``increase`` for counters) so the server returns one point per step instead of every
scrape, and ranges are cut into chunks of at most ``max_points`` steps (Prometheus
refuses more than 11,000 points per series and query).

Every user-supplied value that ends up in PromQL goes through ``promql_string`` and every
label or metric name is validated, so a value such as ``a"}) or vector(1) #`` stays a
string literal.
"""

from __future__ import annotations

import json
import math
import re
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import requests

from analyzer.data.ingest._common import FrameBuilder, IngestReport, MetricFilter
from exporter import schema

#: Prometheus' limit on points per series in one range query.
MAX_POINTS = 11_000
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
_NARROW = "narrow the query: --matcher on a host/namespace, a shorter window or a coarser --step"


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


def chunk_windows(start: float, end: float, step: float, max_points: int = MAX_POINTS) -> list[tuple[float, float]]:
    """Split [start, end] into step-aligned windows of at most ``max_points`` points, no overlap."""
    if step <= 0 or not math.isfinite(step):
        raise ValueError(f"step must be positive, not {step!r}")
    if end < start:
        raise ValueError(f"end {end!r} is before start {start!r}")
    if max_points < 1:
        raise ValueError("max_points must be at least 1")
    total = math.floor((end - start) / step + 1e-9) + 1
    windows = []
    for first in range(0, total, max_points):
        last = min(first + max_points, total) - 1
        windows.append((start + first * step, start + last * step))
    return windows


# Answers -------------------------------------------------------------------------------------
def _list(value: Any, where: str, what: str) -> list:
    """``value`` when it is a list (None is an empty one); else the answer is malformed."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise PrometheusError(f"{where}: malformed answer: {what} is a {type(value).__name__}, not a list")
    return value


def _matrix_series(item: Any, where: str) -> tuple[dict[str, str], np.ndarray, np.ndarray, int]:
    """(labels, timestamps, values, 1 if it holds native histograms) of one matrix series."""
    if not isinstance(item, dict):
        raise PrometheusError(f"{where}: malformed answer: a series is a {type(item).__name__}, not an object")
    labels = item.get("metric") or {}
    if not isinstance(labels, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in labels.items()):
        raise PrometheusError(f"{where}: malformed answer: 'metric' must map label names to strings")
    values = _list(item.get("values"), where, "values")
    try:
        ts = np.array([p[0] for p in values], dtype=np.float64)
        vs = np.array([float(p[1]) for p in values], dtype=np.float64)  # Prometheus sends values as strings
        if any(len(p) != 2 for p in values) or not np.isfinite(ts).all():
            raise ValueError("not [timestamp, value] pairs")
    except (TypeError, ValueError, IndexError, KeyError) as exc:
        raise PrometheusError(f"{where}: malformed answer: values must be [timestamp, \"value\"] pairs ({exc})") \
            from None
    return labels, ts, vs, int(bool(item.get("histograms")))


# Client --------------------------------------------------------------------------------------
@dataclass
class RangeResult:
    """Series of one range query (all chunks merged) and the server's warnings."""

    series: list[tuple[dict[str, str], np.ndarray, np.ndarray]]
    warnings: list[str]
    skipped_histograms: int = 0


class PrometheusClient:
    """Thin, retrying client of the Prometheus HTTP API shared by Prometheus-compatible servers."""

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
    ) -> None:
        if not url.startswith(("http://", "https://")):
            raise ValueError(f"Prometheus URL must start with http:// or https://, not {url!r}")
        if bearer_token and basic_auth:
            raise ValueError("give either bearer_token or basic_auth, not both")
        self.url = url.rstrip("/")
        self.timeout = timeout
        self.retries = max(0, int(retries))
        self.backoff = backoff
        self.max_points = max_points
        self.max_response_bytes = max_response_bytes
        self.requests_made = 0
        self.session = requests.Session()
        self.session.verify = verify
        self.session.headers["User-Agent"] = "truegpu-analyzer"
        if headers:
            self.session.headers.update(headers)
        if bearer_token:
            self.session.headers["Authorization"] = f"Bearer {bearer_token}"
        if basic_auth:
            self.session.auth = basic_auth

    def close(self) -> None:
        self.session.close()

    def __enter__(self) -> PrometheusClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def api(self, path: str, params: Mapping[str, Any] | Sequence[tuple[str, Any]], method: str = "POST") -> dict:
        """Call ``/api/v1/<path>``; return the decoded ``{"status": "success", ...}`` body.

        Connection errors, timeouts and 5xx answers are retried with exponential backoff;
        everything else raises PrometheusError at once.
        """
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
            return self._decode(resp, content, url)
        raise PrometheusError(
            f"{last} [gave up after {attempts} attempts in {time.monotonic() - t0:.0f} s]", url=url)

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
            f"({size / 2**20:.0f} MiB so far): {_NARROW}", url=url)

    @staticmethod
    def _http_error_text(resp: requests.Response, content: bytes, url: str) -> str:
        try:
            body = json.loads(content)
            detail = f"{body.get('errorType', '?')}: {body.get('error', '')}"
        except (ValueError, AttributeError):
            detail = content[:200].decode("utf-8", "replace").strip()
        return f"Prometheus {url} answered HTTP {resp.status_code}: {detail}"

    def _decode(self, resp: requests.Response, content: bytes, url: str) -> dict:
        try:
            body = json.loads(content)
        except ValueError:
            raise PrometheusError(
                f"Prometheus {url} returned invalid JSON (HTTP {resp.status_code}, "
                f"Content-Type {resp.headers.get('Content-Type', '?')}): {content[:200]!r}",
                url=url,
                status=resp.status_code,
            ) from None
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

    def query_range(self, promql: str, start: float, end: float, step: float) -> RangeResult:
        """Run ``promql`` over [start, end] every ``step`` seconds, chunked under ``max_points``."""
        merged: dict[tuple[tuple[str, str], ...], tuple[dict[str, str], list[np.ndarray], list[np.ndarray]]] = {}
        warnings: list[str] = []
        histograms = 0
        for w_start, w_end in chunk_windows(start, end, step, self.max_points):
            body = self.api("query_range", {"query": promql, "start": repr(w_start), "end": repr(w_end),
                                            "step": repr(float(step))})  # fmt: skip
            where = f"Prometheus {self.url}: answer to {promql!r} at {w_start:.0f}..{w_end:.0f}"
            warnings.extend(str(w) for w in _list(body.get("warnings"), where, "warnings"))
            warnings.extend(f"info: {w}" for w in _list(body.get("infos"), where, "infos"))
            data = body.get("data")
            if not isinstance(data, dict) or data.get("resultType") != "matrix":
                got = data.get("resultType") if isinstance(data, dict) else type(data).__name__
                raise PrometheusError(f"{where}: expected a matrix from query_range, got {got!r}", url=self.url)
            result = _list(data.get("result"), where, "data.result")
            if len(result) > MAX_SERIES_PER_ANSWER:
                raise PrometheusError(
                    f"{where}: {len(result):,} series, over the limit of {MAX_SERIES_PER_ANSWER:,}: {_NARROW}",
                    url=self.url)
            for i, item in enumerate(result):
                labels, ts, vs, histogram = _matrix_series(item, f"{where}: data.result[{i}]")
                histograms += histogram
                if not len(ts):
                    continue
                key = tuple(sorted(labels.items()))
                entry = merged.setdefault(key, (labels, [], []))
                entry[1].append(ts)
                entry[2].append(vs)
        series = [(labels, np.concatenate(ts), np.concatenate(vs)) for labels, ts, vs in merged.values()]
        return RangeResult(series, warnings, histograms)

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
        names = _list(body.get("data"), f"Prometheus {self.url}: answer to label/__name__/values", "data")
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
) -> tuple[pd.DataFrame, IngestReport]:
    """Fetch ``metrics`` over [start, end] every ``step`` seconds into the long frame.

    With ``aggregate`` (default) each metric is summarised per step on the server
    (``functions[metric]`` or ``default_function``, over ``window``: see ``aggregate_query``);
    the ``metric`` column then holds the requested name. Without it the raw selector is
    evaluated at each step (the last sample within Prometheus' lookback) and ``metric``
    comes from ``__name__``. A MetricFilter's prefixes are resolved to names with
    ``metric_names`` first (its exact names are queried as given). Metrics that return
    nothing are listed in ``report.missing``; server warnings land in ``report.warnings``.
    Note: DCGM sentinels are turned into NaN after the server aggregated, so an average
    that mixed a sentinel with real values is not caught; use ``aggregate=False`` or a
    ``last_over_time``/``max_over_time`` function for such fields.
    """
    report = IngestReport(max_examples=max_bad_examples)
    builder = FrameBuilder(report, sentinels=sentinels)
    if isinstance(metrics, MetricFilter):
        names = sorted(metrics.names)
        if metrics.prefixes:
            match = [selector(None, {"__name__": Matcher("=~", _regex_escape(p) + ".*")}) for p in metrics.prefixes]
            found = client.metric_names(match, start, end)
            names += sorted(n for n in found if metrics.matches(n) and n not in metrics.names)
    else:
        names = list(dict.fromkeys(metrics))
    functions = dict(functions or {})
    for name in names:
        if aggregate:
            promql = aggregate_query(name, step, matchers, functions.get(name), window)
        else:
            promql = selector(name, matchers)
        report.queries[name] = promql
        result = client.query_range(promql, start, end, step)
        report.warnings.extend(f"{name}: {w}" for w in result.warnings)
        if result.skipped_histograms:
            report.warnings.append(f"{name}: {result.skipped_histograms} native-histogram series skipped")
        if not result.series:
            report.missing.append(name)
        for labels, ts, vals in result.series:
            metric = labels.pop("__name__", name)
            sid = builder.series_id(metric, labels.items())
            builder.add(np.full(len(ts), sid, dtype=np.int64), ts, vals)
    return builder.build(), report
