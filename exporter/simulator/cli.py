"""``truegpu simulate``: write a scenario's history (OpenMetrics) and ground truth to a folder.

The files feed ``promtool tsdb create-blocks-from openmetrics`` (backfill), the analyzer's
offline mode and its tests; the printed summary is the quick look at what a scenario
contains (and, before any analysis, how far GPU util overstates real work).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from exporter.timeparse import iso, parse_positive_duration, parse_time


def _arg_type(parse):  # argparse turns ValueError from a type into "invalid ... value"; keep our message
    def convert(text: str):
        try:
            return parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = parse.__name__.removeprefix("parse_")
    return convert


def register(subparsers: Any) -> None:
    """Add ``simulate`` to the ``truegpu`` command line."""
    p = subparsers.add_parser(
        "simulate",
        help="write a simulated cluster's metric history (OpenMetrics) and ground truth",
        description="Sample a scenario of the cluster simulator and write DIR/metrics.om (backfill it with "
        "`promtool tsdb create-blocks-from openmetrics`), DIR/ground_truth.json and DIR/scenario.json, "
        "then print a fleet summary.",
    )
    p.add_argument("--scenario", default="mixed-fleet", help="scenario name or YAML path (default mixed-fleet)")
    positive = _arg_type(parse_positive_duration)
    p.add_argument("--duration", type=positive, help="window length, e.g. 2h (default: scenario's)")
    p.add_argument("--step", type=positive, default=15.0, help="sample interval (default 15s)")
    p.add_argument("--start", type=_arg_type(parse_time), help="window start, ISO 8601 or unix (default: model's)")
    p.add_argument("--seed", type=int, help="random seed (default: scenario's)")
    p.add_argument("--out", type=Path, help="output folder (created)")
    p.add_argument("--dialect", choices=("truegpu", "dcgm"), default="truegpu", help="metric names/labels to write")
    p.add_argument(
        "--dcgm-counters",
        choices=("default", "all"),
        default="default",
        help="dcgm dialect: fields dcgm-exporter enables by default, or every mapped field",
    )
    p.add_argument(
        "--dcgm-hostname-label",
        choices=("Hostname", "hostname"),
        default="Hostname",
        help="dcgm dialect: host label (older exporters Hostname, newer hostname)",
    )
    p.add_argument("--dcgm-legacy", action="store_true", help="dcgm dialect: 1.x lowercase names and labels")
    p.add_argument("--gzip", action="store_true", help="write metrics.om.gz")
    p.add_argument("--list", action="store_true", help="list scenarios and exit")
    p.set_defaults(func=run)


def run(args: argparse.Namespace, stdout: TextIO | None = None) -> int:
    """Execute ``truegpu simulate``; returns the exit code."""
    out = stdout or sys.stdout
    from exporter.simulator.scenario import list_scenarios, load_scenario

    if args.list:
        for name in list_scenarios():
            desc = load_scenario(name).description.strip().splitlines()
            print(f"{name:24s} {desc[0] if desc else ''}", file=out)
        return 0
    if args.out is None:
        print("truegpu simulate: error: --out DIR is required (or --list)", file=sys.stderr)
        return 2
    from exporter.simulator.dcgm_dialect import DcgmOptions
    from exporter.simulator.history import Mess, sample_times, write_history
    from exporter.simulator.model import Cluster

    try:
        scenario = load_scenario(args.scenario)
    except (FileNotFoundError, KeyError, ValueError) as e:
        print(f"truegpu simulate: error: scenario {args.scenario!r}: {e}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else scenario.seed
    cluster = Cluster(scenario, seed=seed, start=args.start)
    duration = args.duration if args.duration is not None else float(cluster.duration)
    if args.step > duration:
        print(f"truegpu simulate: error: --step ({args.step:g}s) is longer than --duration", file=sys.stderr)
        return 2
    start = float(cluster.start)
    end = start + duration

    outdir: Path = args.out
    outdir.mkdir(parents=True, exist_ok=True)
    metrics_path = outdir / ("metrics.om.gz" if args.gzip else "metrics.om")
    opts = DcgmOptions(args.dcgm_counters, args.dcgm_hostname_label, args.dcgm_legacy)
    t0 = time.perf_counter()
    # The scenario's ingestion mess (gaps, restarts, repeats, HA replicas) is written as evaluate writes it.
    mess = Mess(**scenario.mess) if scenario.mess else None
    stats = write_history(metrics_path, cluster, start, end, args.step, dialect=args.dialect, dcgm_options=opts,
                          mess=mess)
    took = time.perf_counter() - t0

    truth = [_truth_record(r, end) for r in cluster.ground_truth() if r["start"] < end]
    (outdir / "ground_truth.json").write_text(json.dumps(truth, indent=2) + "\n")
    meta = {
        "name": scenario.name,
        "seed": seed,
        "start": start,
        "start_iso": iso(start),
        "duration": duration,
        "step": args.step,
        "dialect": args.dialect,
        "metrics_file": metrics_path.name,
    }
    if args.dialect == "dcgm":
        meta.update(dcgm_counters=opts.counters, dcgm_hostname_label=opts.hostname_label, dcgm_legacy=opts.legacy)
    (outdir / "scenario.json").write_text(json.dumps(meta, indent=2) + "\n")

    print(
        f"wrote {metrics_path} ({stats.families} families, {stats.series} series, {stats.samples} samples "
        f"in {took:.1f}s), ground_truth.json ({len(truth)} records), scenario.json",
        file=out,
    )
    times = sample_times(start, end, args.step)
    print(format_summary(scenario.name, fleet_stats(cluster, times), truth, times), file=out)
    return 0


def _truth_record(r: dict, window_end: float) -> dict:
    """A ground-truth record as seen from the written window.

    A problem still going on when the window ends gets ``end`` null, exactly as the
    findings contract reports an open episode, so findings and truth compare like for like.
    """
    rec = dict(r)
    for k in ("start", "end"):
        v = rec.get(k)
        rec[k] = None if v is None or (isinstance(v, float) and not math.isfinite(v)) else float(v)
    if rec["end"] is not None and rec["end"] >= window_end:
        rec["end"] = None
    for k in ("start", "end"):
        rec[k + "_iso"] = None if rec[k] is None else iso(rec[k])
    return rec


#: Reported GPU util above which a sample counts as a busy GPU for the masking gap.
BUSY_UTIL = 0.1


def _signal(sampled: dict[str, np.ndarray], metric: Any) -> np.ndarray | None:
    for key in (metric.name, metric.name.removeprefix("truegpu_")):
        if key in sampled:
            return np.asarray(sampled[key], dtype=np.float64)
    return None


def _nanmean(x: np.ndarray | None, mask: np.ndarray) -> float:
    if x is None:
        return math.nan
    v = x[mask & ~np.isnan(x)]
    return float(v.mean()) if v.size else math.nan


def fleet_stats(cluster: Any, times: np.ndarray) -> dict[str, Any]:
    """Fleet shape, allocation share and the busy-GPU masking gap, from ``Cluster.sample``."""
    from exporter import schema

    gpus = cluster.gpus
    sampled = cluster.sample(np.asarray(times, dtype=np.float64))
    util = _signal(sampled, schema.GPU_UTILIZATION)
    sm = _signal(sampled, schema.SM_ACTIVE)
    tensor = _signal(sampled, schema.TENSOR_ACTIVE)
    alloc = _signal(sampled, schema.GPU_ALLOCATION_INFO)
    known = ~np.isnan(util) if util is not None else np.zeros((len(times), len(gpus.hostname)), dtype=bool)
    busy = known & (np.nan_to_num(util) > BUSY_UTIL)
    allocated = np.nan_to_num(alloc) > 0.5 if alloc is not None else np.zeros_like(known)
    device = np.asarray(getattr(gpus, "device_row", np.ones(len(gpus.hostname), dtype=bool)), dtype=bool)
    return {
        "gpus": int(device.sum()),
        "mig_instances": int((np.asarray(gpus.mig_profile) != "").sum()),
        "nodes": len(set(gpus.hostname)),
        "racks": len(set(zip(gpus.site, gpus.rack, strict=True))),
        "sites": len(set(gpus.site)),
        "samples": len(times),
        "allocated_share": float(allocated.mean()) if allocated.size else math.nan,
        "busy_share": float(busy.sum() / known.sum()) if known.any() else math.nan,
        "busy": {
            "gpu_util": _nanmean(util, busy),
            "sm_active": _nanmean(sm, busy),
            "tensor_active": _nanmean(tensor, busy),
        },
    }


def _pct(x: float) -> str:
    return "n/a" if math.isnan(x) else f"{100 * x:.1f}%"


def format_summary(name: str, stats: dict[str, Any], truth: list[dict], times: np.ndarray) -> str:
    """The few lines ``truegpu simulate`` prints: what the fleet is, how busy, what went wrong."""
    b = stats["busy"]
    step = float(times[1] - times[0]) if len(times) > 1 else 0.0
    lines = [
        f"{name}: {stats['gpus']} GPUs on {stats['nodes']} nodes, {stats['racks']} racks, {stats['sites']} sites; "
        f"{stats['samples']} samples every {step:g}s from {iso(float(times[0]))}",
        f"allocated: {_pct(stats['allocated_share'])} of GPU-time; busy (util > {BUSY_UTIL:.0%}): "
        f"{_pct(stats['busy_share'])} of samples",
        f"busy GPUs: reported GPU util {_pct(b['gpu_util'])} | SM active {_pct(b['sm_active'])} | "
        f"tensor active {_pct(b['tensor_active'])}",
    ]
    if not (math.isnan(b["gpu_util"]) or math.isnan(b["sm_active"])):
        lines.append(
            f"masking gap: GPU util overstates SM activity by {100 * (b['gpu_util'] - b['sm_active']):.1f} points"
        )
    lines.append(f"ground truth: {len(truth)} problem(s)")
    by_kind: dict[str, list[dict]] = {}
    for rec in truth:
        by_kind.setdefault(str(rec.get("kind")), []).append(rec)
    for kind in sorted(by_kind):
        lines.append(f"  {kind} ({len(by_kind[kind])})")
        for rec in by_kind[kind]:
            where = (
                f"{rec.get('hostname', '?')}/gpu{rec.get('gpu')}"
                if rec.get("gpu") is not None
                else (str(rec.get("hostname", "?")))
            )
            job = f" job={rec['job']}" if rec.get("job") else ""
            span = f" {rec.get('start_iso') or '?'} .. {rec.get('end_iso') or 'ongoing'}"
            cause = f": {rec['cause']}" if rec.get("cause") else ""
            lines.append(f"    {where}{job}{span}{cause}")
    return "\n".join(lines)
