"""Render the metric contract as Markdown (docs/metrics.md), so the reference never drifts.

Regenerate with ``python -m exporter.schema_doc > docs/metrics.md``; a test fails when the
committed file differs.
"""

from __future__ import annotations

from exporter import schema


def _dcgm(metric: schema.Metric) -> str:
    parts = []
    for f in metric.dcgm:
        extra = [f"{k}={v}" for k, v in f.labels]
        if f.scale != 1.0:
            extra.append(f"x{f.scale:g}")
        if f.kind != "value":
            extra.append(f.kind)
        parts.append(f"`{f.field}`" + (f" ({', '.join(extra)})" if extra else ""))
    return "<br>".join(parts) or "-"


def render() -> str:
    lines = [
        "# truegpu metric contract",
        "",
        "Generated from `exporter/schema.py` by `python -m exporter.schema_doc`; do not edit.",
        "",
        f"Per-GPU series carry `{'`, `'.join(schema.GPU_LABELS)}`; MIG instances add "
        f"`{'`, `'.join(schema.MIG_LABELS)}`. A source that cannot provide a family omits it: "
        "missing is unknown, never 0. A value outside its family's valid range (or not finite) is "
        "dropped and counted, in the exporter and at the analyzer's ingest.",
        "",
        "| metric | type | labels | valid range | help | NVML | dcgm-exporter |",
        "|---|---|---|---|---|---|---|",
    ]
    for m in schema.METRICS:
        labels = ", ".join(m.labels) or "-"
        lo, hi = m.valid_range
        valid = f"{lo:g} .. {hi:g}" if hi != float("inf") else f">= {lo:g}"
        lines.append(f"| `{m.name}` | {m.type} | {labels} | {valid} | {m.help} | {m.nvml_recipe or '-'} | {_dcgm(m)} |")
    lines += ["", "Clock-event reasons (`reason` label):", ""]
    lines += [f"- `0x{bit:x}` {name}" for bit, name in schema.CLOCK_EVENT_REASONS.items()]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    print(render(), end="")
