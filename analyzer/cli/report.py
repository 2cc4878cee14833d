"""``truegpu report``: the effective-cost report of a window, as FOCUS CSV, JSON or HTML.

Input: ``--prometheus URL`` (``--start/--end``, or the ``--window`` ending at ``--end``/now),
``--input FILE...`` (OpenMetrics history files: the data, or ``--start/--end``) or ``--demo``
(the simulated mixed-fleet scenario). The window is ``[start, end)`` on every input.
CSV and JSON go to stdout unless ``--out`` names a file (or a directory: ``cost-report.csv`` /
``cost-report.json`` in it); HTML needs ``--out DIR`` and writes ``DIR/cost-report.html``.

Heavy imports (pandas) stay inside ``run_report``: the console script imports this module to
register the command before it knows which command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, TextIO

from analyzer.cli.analyze import (
    DEFAULT_STEP,
    _arg,
    _error,
    _load,
    _Progress,
    add_prometheus_arguments,
    add_range_arguments,
    add_site_argument,
    resolve_range,
)
from analyzer.data.signals import ALLOCATION_COLUMNS
from analyzer.site import load_site
from exporter.timeparse import parse_positive_duration

#: Same as analyzer.finops.costs.GROUP_BY (kept here so --help needs no pandas; a test holds them equal).
GROUP_BY_CHOICES: tuple[str, ...] = ("namespace", "workload", "team", "user", "account", "node", "model", "gpu")
FORMATS: tuple[str, ...] = ("csv", "json", "html")
DEFAULT_WINDOW = "30d"
DEMO_SCENARIO = "mixed-fleet"
#: Prometheus windows longer than a day are read at 5-minute resolution unless --step says otherwise
#: (30 days x 1,000 GPUs at 60 s is 43 M rows; cost sums do not need finer steps).
LONG_WINDOW_S, LONG_WINDOW_STEP = 86400.0, 300.0


def add_source_arguments(p: argparse.ArgumentParser, default_window: str) -> argparse._ArgumentGroup:
    """--prometheus/--input/--demo, the window, the Prometheus options and the price catalog (``load_inputs``'s);
    returns the "cost" group for the command's own options."""
    src = p.add_argument_group("input (one of)")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus, Thanos, Mimir or VictoriaMetrics base URL "
                     "(reads the --window ending now)")
    src.add_argument("--input", action="append", type=Path, metavar="FILE",
                     help="OpenMetrics history file, plain or gzip (repeatable; the window is the data)")
    src.add_argument("--demo", action="store_true", help=f"the simulated {DEMO_SCENARIO} fleet (no services needed)")
    win = p.add_argument_group("window")
    win.add_argument("--window", type=_arg(parse_positive_duration), default=None, metavar="DURATION",
                     help=f"with --prometheus: how far back from --end, e.g. 7d (default {default_window})")
    add_range_arguments(win, "Prometheus default: --end - --window")
    win.add_argument("--step", type=_arg(parse_positive_duration), default=None,
                     help=f"resolution (Prometheus default {DEFAULT_STEP:g}s, {LONG_WINDOW_STEP:g}s for windows over "
                     "a day; files: inferred)")
    win.add_argument("--job-label", help="label naming the job (e.g. hpc_job); default: derived from the pod")
    add_prometheus_arguments(p.add_argument_group("Prometheus"))
    cost = p.add_argument_group("cost")
    cost.add_argument("--prices", type=Path, metavar="FILE",
                      help="price catalog YAML (default: the illustrative fixtures/prices/default.yaml)")
    cost.add_argument("--cluster", metavar="NAME", help="apply this cluster's overrides from the price catalog")
    return cost


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "report", help="effective-cost report: GPU-hours, cost and waste in dollars (FOCUS CSV, JSON, HTML)",
        description="Price the GPU-hours of a window with a price catalog and split the cost into effective work, "
        "recoverable waste (idle allocated, masked, straggler wait, throttled, underused), the normal headroom "
        "of healthy work, unclassified, unknown and unallocated capacity, grouped by namespace, job, team, node, "
        "model or GPU.",
    )
    cost = add_source_arguments(p, DEFAULT_WINDOW)
    cost.add_argument("--group-by", choices=GROUP_BY_CHOICES, default="namespace",
                      help="group the cost by (default namespace)")
    cost.add_argument("--team-map", type=Path, metavar="FILE",
                      help="YAML/JSON mapping of namespace (or --team-label value) -> team; keys may be globs")
    cost.add_argument("--team-label", choices=ALLOCATION_COLUMNS, default="namespace",
                      help="label the team map keys are values of (default namespace)")
    add_site_argument(cost)
    out = p.add_argument_group("output")
    out.add_argument("--format", choices=FORMATS, default="csv", help="csv (FOCUS-aligned, default), json or html")
    out.add_argument("--out", type=Path, metavar="PATH",
                     help="csv/json: file or directory (default stdout); html: directory (required)")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run_report)


def check_source(args: argparse.Namespace) -> None:
    """One of --prometheus, --input, --demo, with the window options that apply to it (``load_fleet``'s)."""
    sources = [name for name, given in (("--prometheus", args.prometheus), ("--input", args.input),
                                        ("--demo", args.demo)) if given]
    if len(sources) != 1:
        raise ValueError("give exactly one of --prometheus URL, --input FILE (repeatable) or --demo"
                         + (f" (got {', '.join(sources)})" if sources else ""))
    if args.window is not None and not args.prometheus:
        raise ValueError("--window applies to --prometheus; with --input use --start/--end")
    if args.demo and (args.start is not None or args.end is not None):
        raise ValueError("--start/--end apply to --prometheus and --input; --demo is the whole simulated run")


def _check(args: argparse.Namespace) -> None:
    """Argument combinations argparse cannot express; fails before any slow work."""
    check_source(args)
    if args.format == "html" and args.out is None:
        raise ValueError("--format html needs --out DIR (the page is written to DIR/cost-report.html)")
    if args.format == "html" and args.out.exists() and not args.out.is_dir():
        raise ValueError(f"--out {args.out}: --format html needs a directory, that is a file")


def load_fleet(args: argparse.Namespace, progress: _Progress, default_window: str = DEFAULT_WINDOW) -> Any:
    """The fleet of ``--demo``, ``--input`` or ``--prometheus`` (its ``--window``, default ``default_window``)."""
    if args.demo:
        from analyzer.data.simulated import fleet_from_cluster
        from exporter.simulator import Cluster, load_scenario

        scenario = load_scenario(DEMO_SCENARIO)
        progress(f"simulating {scenario.name}")
        return fleet_from_cluster(Cluster(scenario), step=args.step or DEFAULT_STEP)
    load_args = argparse.Namespace(**vars(args))
    if args.prometheus:
        load_args.start, load_args.end = resolve_range(args.start, args.end, args.window,
                                                       parse_positive_duration(default_window))
        if load_args.step is None:
            span = load_args.end - load_args.start
            load_args.step = LONG_WINDOW_STEP if span > LONG_WINDOW_S else DEFAULT_STEP
    return _load(load_args, progress)


def _destination(out: Path, fmt: str) -> Path:
    if out.is_dir() or str(out).endswith(("/", "\\")):
        return out / f"cost-report.{fmt}"
    return out


def load_inputs(args: argparse.Namespace, progress: _Progress, default_window: str = DEFAULT_WINDOW) -> tuple[
        Any, Any, Any]:
    """(price catalog, site config, fleet), in that order: a bad catalog or site fails before a slow read."""
    from analyzer.finops.catalog import load_catalog

    catalog = load_catalog(args.prices, cluster=args.cluster)
    site = load_site(args.site)
    return catalog, site, load_fleet(args, progress, default_window)


def run_report(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from analyzer.data.ingest import PrometheusError

    out = out or sys.stdout
    progress = _Progress(args.quiet)
    try:
        _check(args)
        from analyzer.finops.costs import COST_FINDING_KINDS, cost_report, load_team_map

        team_map = load_team_map(args.team_map) if args.team_map else None
        catalog, site, fleet = load_inputs(args, progress)
        from analyzer.pipeline import analyze

        result = analyze(fleet, list(COST_FINDING_KINDS), site, partition=False, progress=progress)
        report = cost_report(fleet, result.scores, result.findings, catalog, group_by=args.group_by,
                             team_label=args.team_label, team_map=team_map, site=site)
    except (ValueError, OSError, PrometheusError, KeyError) as exc:
        return _error("report", str(exc).strip("'\""))
    for model, hours in report.unpriced_models.items():
        print(f"truegpu report: warning: GPU model {model!r} is not in the price catalog: {hours:,.1f} GPU-hours are "
              "unpriced (add a 'models' entry to --prices)", file=sys.stderr)
    from analyzer.finops import outputs

    try:
        if args.format == "html":
            path = outputs.write_html(report, args.out)
            progress(f"report written to {path}")
            return 0
        if args.format == "csv":
            text = outputs.to_focus_csv(report)
        else:
            text = json.dumps(outputs.to_json(report), indent=2, allow_nan=False) + "\n"
        if args.out is None:
            out.write(text)
        else:
            path = _destination(args.out, args.format)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
            progress(f"report written to {path}")
    except OSError as exc:
        return _error("report", f"cannot write the report: {exc.strerror or exc}")
    return 0
