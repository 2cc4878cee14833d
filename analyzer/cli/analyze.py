"""``truegpu analyze`` and ``truegpu demo``: telemetry in, scores and findings out.

Heavy imports (pandas, scikit-learn) stay inside the command functions: the same console
script starts the per-node exporter, which must not pay for them.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from analyzer.site import load_site
from exporter.timeparse import iso, parse_positive_duration, parse_time

if TYPE_CHECKING:
    from analyzer.data.frame import Fleet
    from analyzer.findings import Finding

DEFAULT_STEP = 60.0
DEFAULT_REPORT_DIR = "truegpu-report"


def _arg(parse: Any) -> Any:
    """argparse type that keeps our error message instead of 'invalid value'."""

    def convert(text: str) -> Any:
        try:
            return parse(text)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None

    return convert


def _matcher(text: str) -> tuple[str, str]:
    name, sep, value = text.partition("=")
    if not sep or not name.strip():
        raise ValueError(f"--matcher {text!r}: expected LABEL=VALUE")
    return name.strip(), value


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise ValueError(f"{text!r} must be a whole number of at least 1")
    return value


def add_prometheus_arguments(prom: argparse._ArgumentGroup) -> None:
    """Connection options for a Prometheus-compatible API (analyze and serve share them)."""
    prom.add_argument("--matcher", action="append", type=_arg(_matcher), default=[], metavar="LABEL=VALUE",
                      help="narrow every query, e.g. Hostname=node-7 (repeatable)")
    prom.add_argument("--bearer-token-file", type=Path, help="file holding a bearer token")
    prom.add_argument("--basic-auth-user", help="basic auth user (password from --basic-auth-password-file)")
    prom.add_argument("--basic-auth-password-file", type=Path)
    prom.add_argument("--header", action="append", default=[], metavar="NAME:VALUE",
                      help="extra HTTP header, e.g. X-Scope-OrgID:tenant-1 (repeatable)")
    prom.add_argument("--ca-file", type=Path, help="CA bundle for TLS verification")
    prom.add_argument("--insecure-skip-verify", action="store_true", help="do not verify TLS certificates")
    prom.add_argument("--timeout", type=float, default=30.0, help="seconds per HTTP request (default 30)")
    prom.add_argument("--max-samples", type=_arg(_positive_int), default=None, metavar="N",
                      help="the server's limit on samples per query (Prometheus --query.max-samples, default "
                           "50000000): queries are split by host and time to stay under it")
    prom.add_argument("--concurrency", type=_arg(_positive_int), default=None, metavar="N",
                      help="HTTP requests in flight at once (default 4)")


_FILES_DEFAULTS = ("; files: the data's first sample", "; files: the end of the step holding the last sample")


def add_range_arguments(group: argparse._ArgumentGroup, start_default: str, files: bool = True) -> None:
    """--start/--end, the same everywhere: the window is [start, end), end excluded, on every input."""
    first, last = _FILES_DEFAULTS if files else ("", "")
    group.add_argument("--start", type=_arg(parse_time), help=f"RFC 3339, unix seconds or now-6h ({start_default}"
                       f"{first})")
    group.add_argument("--end", type=_arg(parse_time), help="as --start; excluded: the window is [start, end) "
                       f"(default: now{last})")


def add_site_argument(group: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """--site FILE: the site config (analyzer.site: thresholds, detector settings, workload classes...)."""
    group.add_argument("--site", type=Path, metavar="FILE",
                       help="site config YAML (thresholds, detector settings, workload classes; default: built-in)")


def _shard(text: str) -> Any:
    from analyzer.data.shard import Shard  # only when given: the exporter shares this console script

    return Shard.parse(text)


def add_shard_argument(group: argparse._ArgumentGroup) -> None:
    """--shard I/N: analyze one shard of N (analyzer.data.shard; README "Sharding")."""
    group.add_argument("--shard", type=_arg(_shard), metavar="I/N",
                       help="analyze shard I of N (0-based; I may be a StatefulSet pod name ending in its "
                       "ordinal): whole workloads and hosts per shard, N shards add up to the unsharded result")


def resolve_range(start: float | None, end: float | None, window: float | None,
                  default_window: float) -> tuple[float, float]:
    """[start, end) from --start/--end/--window: end defaults to now, start to end - window."""
    if window is not None and start is not None and end is not None:
        raise ValueError("give --window or both --start and --end, not all three")
    end = time.time() if end is None else end
    return (end - (default_window if window is None else window) if start is None else start), end


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "analyze", help="score GPU telemetry and report findings",
        description="Read GPU telemetry (truegpu or dcgm-exporter metrics) from OpenMetrics files or a "
        "Prometheus-compatible API, score effective utilization and report findings.",
    )
    src = p.add_argument_group("input (one of)")
    src.add_argument("--input", action="append", type=Path, metavar="FILE",
                     help="OpenMetrics/Prometheus text file with timestamps, plain or gzip (repeatable)")
    src.add_argument("--prometheus", metavar="URL", help="Prometheus, Thanos, Mimir or VictoriaMetrics base URL")
    src.add_argument("--workers", type=_arg(_positive_int), default=None, metavar="N",
                     help="processes reading --input files: a large plain file in ranges, several files at once "
                     "(default: the CPUs this process may use, up to 8; 1: one process)")
    win = p.add_argument_group("window")
    add_range_arguments(win, "Prometheus default: end - 1h")
    win.add_argument("--step", type=_arg(parse_positive_duration), default=None,
                     help=f"analysis resolution, e.g. 60s (Prometheus default {DEFAULT_STEP:g}s; files: inferred)")
    add_prometheus_arguments(p.add_argument_group("Prometheus"))
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help='print {"findings": [...], "summary": {...}} to stdout')
    out.add_argument("--report", type=Path, metavar="DIR", help="also write an HTML report to DIR/index.html")
    out.add_argument("--kinds", type=lambda s: [k for k in s.split(",") if k], default=None,
                     help="comma-separated finding kinds to run (default: all)")
    out.add_argument("--job-label", help="label naming the job (e.g. hpc_job); default: derived from the pod")
    add_site_argument(out)
    add_shard_argument(out)
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run_analyze)

    d = subparsers.add_parser(
        "demo", help="simulate a fleet with faults, analyze it and write a report (no services needed)",
        description="Simulate a GPU fleet in memory, analyze it like real telemetry, print the fleet summary "
        "and findings, and write an HTML report.",
    )
    d.add_argument("--scenario", default="mixed-fleet", help="simulator scenario (default mixed-fleet)")
    d.add_argument("--step", type=_arg(parse_positive_duration), default=DEFAULT_STEP,
                   help=f"analysis resolution (default {DEFAULT_STEP:g}s)")
    d.add_argument("--out", type=Path, default=Path(DEFAULT_REPORT_DIR),
                   help=f"report directory (default ./{DEFAULT_REPORT_DIR})")
    d.add_argument("--json", action="store_true", help="print JSON instead of tables")
    add_site_argument(d)
    d.add_argument("--quiet", action="store_true", help="no progress on stderr")
    d.set_defaults(func=run_demo)

    e = subparsers.add_parser(
        "evaluate", help="judge the detectors on simulator scenarios with ground truth",
        description="Simulate scenarios, analyze them in one or both input dialects, match findings to the "
        "ground truth (same kind, same entity, overlapping in time; see analyzer/analysis/evaluate.py) and print "
        "precision, recall, F1 and onset error per kind.",
    )
    e.add_argument("--scenario", action="append", dest="scenarios", metavar="NAME",
                   help="scenario to run (repeatable; default: all)")
    e.add_argument("--dialect", choices=("truegpu", "dcgm", "both"), default="both",
                   help="input dialect the analyzer reads (dcgm: via a dcgm-exporter history file; default both)")
    e.add_argument("--dcgm-counters", choices=("all", "default"), default="all",
                   help="fields the dcgm dialect's history carries: all (every field the analyzer reads) or default "
                   "(dcgm-exporter's default counter set, what most fleets run); no effect on truegpu (default all)")
    e.add_argument("--kinds", type=lambda s: [k for k in s.split(",") if k], default=None,
                   help="comma-separated finding kinds (default: every registered detector)")
    e.add_argument("--step", type=_arg(parse_positive_duration), default=None,
                   help=f"analysis resolution (default {DEFAULT_STEP:g}s; with --replay serve's --step)")
    e.add_argument("--seeds", type=int, default=1, metavar="N",
                   help="run each scenario with N seeds: its own, then its seed + 1 .. + N-1 (default 1)")
    e.add_argument("--seed-offset", type=int, default=0, metavar="K",
                   help="start the seeds at the scenario's seed + K, e.g. seeds never used while tuning (default 0)")
    rep = e.add_argument_group("replay (time to detect)")
    rep.add_argument("--replay", action="store_true",
                     help="re-run the analysis the way serve does (the last --window, every --interval) and report "
                     "the time to detect per kind: first run showing a matching finding minus the true onset")
    rep.add_argument("--interval", type=_arg(parse_positive_duration), default=None,
                     help="with --replay: how often serve analyzes (default: serve's)")
    rep.add_argument("--window", type=_arg(parse_positive_duration), default=None,
                     help="with --replay: how much history each run analyzes (default: serve's)")
    rep.add_argument("--jobs", type=int, default=1, metavar="N", help="with --replay: parallel processes (default 1)")
    e.add_argument("--json", action="store_true", help="print the full results as JSON")
    e.add_argument("--min-precision", type=float, default=None, help="exit 1 if pooled precision of a kind is lower")
    e.add_argument("--min-recall", type=float, default=None, help="exit 1 if pooled recall of a kind is lower")
    add_site_argument(e)
    e.set_defaults(func=run_evaluate)


# -- running ---------------------------------------------------------------------------------
class _Progress:
    """Short progress lines on stderr, so a long Prometheus pull is not a silent wait."""

    def __init__(self, quiet: bool) -> None:
        self.quiet = quiet
        self.t0 = time.perf_counter()

    def __call__(self, message: str) -> None:
        if not self.quiet:
            print(f"[{time.perf_counter() - self.t0:6.1f}s] {message}", file=sys.stderr, flush=True)


def _error(command: str, message: str) -> int:
    print(f"truegpu {command}: error: {message}", file=sys.stderr)
    return 2


def _client_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"timeout": args.timeout}
    for option in ("max_samples", "concurrency"):
        if getattr(args, option) is not None:
            kwargs[option] = getattr(args, option)
    if args.bearer_token_file:
        kwargs["bearer_token"] = args.bearer_token_file.read_text().strip()
    if args.basic_auth_user:
        if not args.basic_auth_password_file:
            raise ValueError("--basic-auth-user needs --basic-auth-password-file")
        kwargs["basic_auth"] = (args.basic_auth_user, args.basic_auth_password_file.read_text().strip())
    if args.header:
        headers = {}
        for h in args.header:
            name, sep, value = h.partition(":")
            if not sep or not name.strip():
                raise ValueError(f"--header {h!r}: expected NAME:VALUE")
            headers[name.strip()] = value.strip()
        kwargs["headers"] = headers
    if args.insecure_skip_verify:
        kwargs["verify"] = False
    elif args.ca_file:
        kwargs["verify"] = str(args.ca_file)
    return kwargs


def _load(args: argparse.Namespace, progress: _Progress) -> Fleet:
    from analyzer.data.load import load_files, load_prometheus
    from analyzer.data.shard import load_shard, shard_fleet

    if bool(args.input) == bool(args.prometheus):
        raise ValueError("give either --input FILE (repeatable) or --prometheus URL")
    shard = getattr(args, "shard", None)  # `report` shares this loader and reads the whole fleet
    if args.input:
        missing = [str(p) for p in args.input if not p.is_file()]
        if missing:
            raise ValueError(f"input file not found: {', '.join(missing)}")
        progress(f"reading {len(args.input)} file(s)")
        fleet = load_files(args.input, step=args.step, job_label=args.job_label, start=args.start, end=args.end,
                           workers=getattr(args, "workers", None))
        return shard_fleet(fleet, shard) if shard else fleet
    start, end = resolve_range(args.start, args.end, None, 3600.0)
    step = args.step or DEFAULT_STEP
    progress(f"querying {args.prometheus} from {iso(start)} to {iso(end)} every {step:g}s"
             + (f", shard {shard}" if shard else ""))
    if shard:
        return load_shard(args.prometheus, start, end, step, shard, matchers=dict(args.matcher) or None,
                          job_label=args.job_label, **_client_kwargs(args))
    return load_prometheus(args.prometheus, start, end, step, matchers=dict(args.matcher) or None,
                           job_label=args.job_label, **_client_kwargs(args))


def _analyze(fleet: Fleet, kinds: list[str] | None, progress: _Progress, site: Any = None) -> tuple[
        Any, list[Finding]]:
    from analyzer.pipeline import analyze

    result = analyze(fleet, kinds, site, progress=progress)
    return result.scores, result.findings


def _emit(fleet: Fleet, scores: Any, findings: list[Finding], args: argparse.Namespace, out: TextIO) -> None:
    from analyzer.findings import JSON_SCHEMA_VERSION, json_ready

    summary = build_summary(fleet, scores, findings)
    if args.json:
        doc = {"schema_version": JSON_SCHEMA_VERSION, "findings": [f.to_json() for f in findings],
               "summary": json_ready(summary)}
        json.dump(doc, out, indent=2, allow_nan=False)
        out.write("\n")
    else:
        out.write(format_summary(summary) + "\n\n" + format_findings(findings) + "\n")


def run_analyze(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from analyzer.data.ingest import PrometheusError

    out = out or sys.stdout
    progress = _Progress(args.quiet)
    try:
        site = load_site(args.site)
        fleet = _load(args, progress)
        scores, findings = _analyze(fleet, args.kinds, progress, site)
    except (ValueError, OSError, PrometheusError, KeyError) as exc:
        return _error("analyze", str(exc).strip("'\""))
    _emit(fleet, scores, findings, args, out)
    if args.report:
        _write_report(args.report, fleet, scores, findings, progress)
    return 0


def run_demo(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from analyzer.data.simulated import fleet_from_cluster
    from exporter.simulator import Cluster, load_scenario

    out = out or sys.stdout
    progress = _Progress(args.quiet)
    try:
        scenario = load_scenario(args.scenario)
        site = load_site(args.site)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        return _error("demo", str(exc).strip("'\""))
    progress(f"simulating {scenario.name}: {scenario.description.strip().splitlines()[0]}")
    fleet = fleet_from_cluster(Cluster(scenario), step=args.step)
    scores, findings = _analyze(fleet, None, progress, site)
    _emit(fleet, scores, findings, args, out)
    _write_report(args.out, fleet, scores, findings, progress)
    return 0


def run_evaluate(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from analyzer.analysis.evaluate import evaluate_scenarios, format_table, pooled
    from analyzer.detectors import load_detectors

    out = out or sys.stdout
    kinds = args.kinds or sorted(load_detectors())
    unknown = sorted(set(kinds) - set(load_detectors()))
    if unknown:
        return _error("evaluate", f"unknown kind(s) {', '.join(unknown)}; known: {', '.join(sorted(load_detectors()))}")
    if not args.replay and (args.interval or args.window):
        return _error("evaluate", "--interval and --window go with --replay")
    dialects = ("truegpu", "dcgm") if args.dialect == "both" else (args.dialect,)
    results = []
    try:
        site = load_site(args.site)
        for dialect in dialects:
            print(f"{'replaying' if args.replay else 'evaluating'} {dialect} dialect ...", file=sys.stderr, flush=True)
            if args.replay:
                results += _replay(args, dialect, kinds, site)
            else:
                results += evaluate_scenarios(args.scenarios, dialect=dialect, step=args.step or DEFAULT_STEP,
                                              kinds=kinds, site=site, seeds=args.seeds, seed_offset=args.seed_offset,
                                              dcgm_counters=args.dcgm_counters)
    except (ValueError, FileNotFoundError, KeyError) as exc:
        return _error("evaluate", str(exc).strip("'\""))
    if args.replay:
        return _emit_replay(results, args, out)
    totals = pooled(results)
    if args.json:
        _emit_json(results, totals, out)
    else:
        out.write(format_table(results) + "\n\npooled over scenarios:\n")
        for (dialect, kind), v in sorted(totals.items()):
            out.write(f"  {dialect:8} {kind:15} precision {v['precision']:.3f}  recall {v['recall']:.3f}  "
                      f"({v['tp']:.0f}/{v['findings']:.0f} findings true, {v['detected']:.0f}/{v['truth']:.0f} "
                      f"problems found{_unobservable(v)})\n")
    return _gate(totals, args)


def _unobservable(v: dict[str, Any]) -> str:
    return f"; {v['unobservable']:.0f} more the input cannot show" if v["unobservable"] else ""


def _gate(totals: dict[tuple[str, str], dict[str, Any]], args: argparse.Namespace) -> int:
    """Exit status: 1 when a kind's pooled precision or recall is below --min-precision/--min-recall."""
    failed = [(d, k) for (d, k), v in totals.items()
              if (args.min_precision is not None and v["precision"] < args.min_precision)
              or (args.min_recall is not None and v["recall"] < args.min_recall)]
    for d, k in failed:
        print(f"truegpu evaluate: {k} ({d}) below the required precision/recall", file=sys.stderr)
    return 1 if failed else 0


def _replay(args: argparse.Namespace, dialect: str, kinds: list[str], site: Any) -> list[dict[str, Any]]:
    from analyzer.analysis.evaluate import replay_scenarios

    return replay_scenarios(args.scenarios, dialect, kinds, step=args.step, interval=args.interval,
                            window=args.window, site=site, seeds=args.seeds, seed_offset=args.seed_offset,
                            jobs=args.jobs, dcgm_counters=args.dcgm_counters)


def _emit_json(results: list[dict[str, Any]], totals: dict[tuple[str, str], dict[str, Any]], out: TextIO) -> None:
    """Every run and the pooled numbers per dialect and kind, as strict JSON (unknown numbers are null)."""
    from analyzer.findings import json_ready

    doc = {"results": results, "pooled": [{"dialect": d, "kind": k, **v} for (d, k), v in totals.items()]}
    json.dump(json_ready(doc), out, indent=2, allow_nan=False)
    out.write("\n")


def _emit_replay(results: list[dict[str, Any]], args: argparse.Namespace, out: TextIO) -> int:
    """The replay's table (or JSON), then the gate."""
    from analyzer.analysis.evaluate import format_replay, pooled_replay

    totals = pooled_replay(results)
    if args.json:
        _emit_json(results, totals, out)
    else:
        r0 = results[0] if results else {}
        runs = len({(r["scenario"], r["seed"]) for r in results})
        out.write(f"replay: {runs} scenario run(s), step {r0.get('step', 0):g}s, a run every "
                  f"{r0.get('interval', 0):g}s over the last {r0.get('analysis_window', 0):g}s; time to detect = "
                  "first run showing a matching finding - true onset (scrape lag and alert `for:` not included)\n\n")
        out.write(format_replay(results) + "\n")
    return _gate(totals, args)


def _write_report(out_dir: Path, fleet: Fleet, scores: Any, findings: list[Finding], progress: _Progress) -> None:
    from analyzer.report import write_report

    path = write_report(out_dir, fleet, scores, findings)
    progress(f"report written to {path}")


# -- output -----------------------------------------------------------------------------------
def build_summary(fleet: Fleet, scores: Any, findings: list[Finding]) -> dict[str, Any]:
    """The JSON summary: fleet_summary's numbers plus what was analyzed and what is unknown."""
    from analyzer.analysis.scores import fleet_summary
    from analyzer.data.shard import ShardFleet

    summary = fleet_summary(scores)
    frame = fleet.frame
    by_kind: dict[str, int] = {}
    for f in findings:
        by_kind[f.kind] = by_kind.get(f.kind, 0) + 1
    summary.update(
        start=iso(fleet.start), end=iso(fleet.end), step_seconds=fleet.step, dialect=fleet.dialect,
        gpus=fleet.gpu_count(), nodes=int(frame["hostname"].nunique()),
        findings_by_kind=by_kind, missing=dict(fleet.missing), input_notes=list(fleet.notes),
    )
    if isinstance(fleet, ShardFleet):  # its owned rows' numbers: the shards' GPU-hours add up
        summary["shard"] = dict(fleet.about)
    return summary


def _pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"


def _points(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f} points"


def _hours(x: float | None) -> str:
    return "unknown" if x is None else f"{x:,.1f}"


def _split_lines(s: dict[str, Any]) -> list[str]:
    """The allocated hours without SM work, split into recoverable waste and what is normal."""
    p = s.get("parts")
    if p is None:
        return [f"unused (allocated, no SM work): {_hours(s['unused_gpu_hours'])} GPU-hours, not split "
                "(the partition needs the findings)"]
    from analyzer.analysis.partition import NORMAL, WASTE

    def parts(names: tuple[str, ...]) -> str:
        return ", ".join(f"{_hours(p[n])} {n.replace('_', ' ')}" for n in names if p[n] >= 0.05) or "none"

    lines = [
        f"recoverable waste: {_hours(s['waste_gpu_hours'])} GPU-hours ({parts(WASTE)})",
        f"normal, not waste: {_hours(s['normal_gpu_hours'])} GPU-hours ({parts(NORMAL)}); "
        f"unclassified workloads: {_hours(s['unclassified_gpu_hours'])} GPU-hours",
    ]
    if p.get("shared_unattributed", 0.0) >= 0.05:  # only where GPUs are shared
        lines.append(f"shared GPUs, use no holder's process explains: {_hours(p['shared_unattributed'])} GPU-hours "
                     "(never spread over the holders)")
    return lines


def format_summary(s: dict[str, Any]) -> str:
    lines = [
        f"fleet: {s['gpus']} GPUs on {s['nodes']} nodes, {s['start']} .. {s['end']} (step {s['step_seconds']:g}s, "
        f"{s['dialect']} metrics)",
        f"allocated GPUs: reported utilization {_pct(s['reported_util'])}, effective {_pct(s['effective_util'])}, "
        f"masking gap {_points(s['masking_gap'])}",
        f"whole fleet:    reported utilization {_pct(s['fleet_reported_util'])}, "
        f"effective {_pct(s['fleet_effective_util'])}",
        f"GPU-hours: {_hours(s['gpu_hours'])} capacity, {_hours(s['allocated_gpu_hours'])} allocated, "
        f"{_hours(s['effective_gpu_hours'])} effective, {_hours(s['unallocated_gpu_hours'])} unallocated, "
        f"{_hours(s['unknown_gpu_hours'])} unknown",
        *_split_lines(s),
        f"data coverage: {_pct(s['coverage']['ratio'])} of the window's GPU-hours have data",
    ]
    lines += [f"unknown: {why}" for why in s["missing"].values()]  # each reason starts with its signal's name
    lines += [f"note: {n}" for n in s["notes"] + s["input_notes"]]
    return "\n".join(lines)


def format_findings(findings: list[Finding]) -> str:
    if not findings:
        return "no findings"
    rows = [("SEVERITY", "KIND", "WHERE", "WORKLOAD", "START", "END", "SUMMARY")]
    for f in findings:
        where = f.hostname or f.rack or "-"
        if f.gpu is not None:
            where += f"/gpu{f.gpu}" + (f"/mig{f.gpu_instance}" if f.gpu_instance else "")
        rows.append((f.severity, f.kind, where, f.job or "-", iso(f.start),
                     "ongoing" if f.end is None else iso(f.end), f.summary))
    widths = [max(len(r[i]) for r in rows) for i in range(6)]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r[:6], widths, strict=True)) + "  " + r[6] for r in rows)
