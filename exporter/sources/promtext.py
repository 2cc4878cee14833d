"""A small, forgiving parser for the Prometheus text exposition format (0.0.4).

Why not prometheus_client.parser: it raises on the first bad line, so one mangled
sample would cost every GPU its data, and it cannot say *where* the body went wrong.
This parser keeps every good sample, skips bad lines and records each one with its
line number and the reason, and parses each distinct label block only once (dcgm-exporter
repeats the same ``{gpu=...,UUID=...}`` block for every field of a GPU), which makes it
several times faster than a general parser on exporter output.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import NamedTuple

_SAMPLE = re.compile(
    r"([a-zA-Z_:][a-zA-Z0-9_:]*)[ \t]*(?:\{(.*)\})?[ \t]*?[ \t]([^ \t]+)(?:[ \t]+([^ \t]+))?[ \t]*"
)
_LABEL = re.compile(r'[ \t]*([a-zA-Z_][a-zA-Z0-9_]*)[ \t]*=[ \t]*"((?:[^"\\]|\\.)*)"[ \t]*(,|$)')
_UNESCAPE = re.compile(r"\\(.)")
_ESCAPES = {"n": "\n", "\\": "\\", '"': '"'}
_TYPES = frozenset(("counter", "gauge", "histogram", "summary", "untyped", "unknown", "info", "stateset",
                    "gaugehistogram"))


class Sample(NamedTuple):
    """One sample line. ``labels`` is shared by every sample with the same label block: do not mutate it."""

    name: str
    #: The label block exactly as written (without braces); a cheap, exact identity key.
    raw_labels: str
    labels: dict[str, str]
    value: float
    line: int


class BadLine(NamedTuple):
    line: int
    reason: str
    text: str


@dataclass
class ParseResult:
    samples: list[Sample] = field(default_factory=list)
    bad: list[BadLine] = field(default_factory=list)
    #: metric family name -> declared TYPE.
    types: dict[str, str] = field(default_factory=dict)


def _unescape(value: str) -> str:
    return _UNESCAPE.sub(lambda m: _ESCAPES.get(m.group(1), "\\" + m.group(1)), value)


def parse_labels(block: str) -> dict[str, str]:
    """Parse the inside of ``{...}``; ValueError naming the offending spot when malformed."""
    labels: dict[str, str] = {}
    pos, end = 0, len(block)
    while pos < end:
        m = _LABEL.match(block, pos)
        if m is None:
            if not block[pos:].strip():
                break
            raise ValueError(f"malformed label at column {pos + 1}: {block[pos:pos + 40]!r}")
        name, value = m.group(1), m.group(2)
        if name in labels:
            raise ValueError(f"duplicate label {name!r}")
        labels[name] = _unescape(value) if "\\" in value else value
        pos = m.end()
        if not m.group(3):  # matched at end of block without a comma
            break
    return labels


def parse_value(text: str) -> float:
    """A sample value as Prometheus accepts it (float literal, NaN, +Inf, -Inf)."""
    if "_" in text:  # float() accepts 1_000, Prometheus does not
        raise ValueError(f"invalid value {text!r}")
    try:
        return float(text)
    except ValueError:
        raise ValueError(f"invalid value {text!r}") from None


def parse_line(
    line: str, label_cache: dict[str, dict[str, str]], types: dict[str, str]
) -> tuple[str, str, dict[str, str], float, str | None] | str | None:
    """One line of a body: None for a blank or comment line (a ``# TYPE`` is recorded in ``types``),
    the reason as a str for a bad line, else ``(name, label block, labels, value, prefix)``.

    ``prefix`` is ``line[:line.rfind(" ")]`` when the line is exactly ``prefix + " " + value``
    without a timestamp, else None. Such a prefix is a cheap cache key for the next scrape:
    any ``prefix + " " + v`` where ``v`` has no "_" and ``float(v)`` succeeds parses to the
    same name, block and labels with value ``float(v)`` (``v`` holds no brace or quote, and
    no space by construction), so callers may skip this function for those lines.
    """
    if not line or line.isspace():
        return None
    if line[0] == "#":
        parts = line.split(None, 3)
        if len(parts) >= 3 and parts[1] == "TYPE":
            kind = parts[3].strip() if len(parts) == 4 else ""
            if kind not in _TYPES:
                return f"unknown metric type {kind!r}"
            types[parts[2]] = kind
        return None  # HELP lines, comments, OpenMetrics '# EOF'
    m = _SAMPLE.fullmatch(line.strip())
    if m is None:
        return "not a sample line (expected 'name{labels} value [timestamp]')"
    name, block, value_text, ts = m.groups()
    if block is None:
        block = ""
    labels = label_cache.get(block)
    if labels is None:
        try:
            labels = parse_labels(block)
        except ValueError as exc:
            return str(exc)
        label_cache[block] = labels
    try:
        value = float(value_text) if "_" not in value_text else parse_value(value_text)
    except ValueError:
        return f"invalid value {value_text!r}"
    if ts is not None:
        try:
            parse_value(ts)
        except ValueError:
            return f"invalid timestamp {ts!r}"
        return name, block, labels, value, None
    n = len(value_text) + 1
    prefix = line[:-n] if line[-n] == " " and line.endswith(value_text) else None
    return name, block, labels, value, prefix


def parse(text: str) -> ParseResult:
    """Parse an exposition body; never raises for bad content, reports it in ``bad`` instead."""
    result = ParseResult()
    samples, bad, types = result.samples, result.bad, result.types
    label_cache: dict[str, dict[str, str]] = {"": {}}
    for lineno, line in enumerate(text.splitlines(), 1):
        r = parse_line(line, label_cache, types)
        if r is None:
            continue
        if r.__class__ is str:
            bad.append(BadLine(lineno, r, line))  # type: ignore[arg-type]
            continue
        samples.append(Sample(r[0], r[1], r[2], r[3], lineno))  # type: ignore[index]
    return result
