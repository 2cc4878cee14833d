"""``truegpu job``: one job's efficiency report for the person who runs it, or the jobs below a bar.

``truegpu job NAME`` (a workload, Slurm job id or pod) prints what the job's GPUs really did and what to
change (text, ``--json``, ``--html DIR``); ``truegpu job --list --below 0.3 --finished`` lists the jobs
that ended in the window under 30 % effective utilization, and ``--mail DIR`` writes one message per
namespace for an admin to send. Input as for ``truegpu report``: ``--prometheus`` (``--window``, default
1 day), ``--input`` files or ``--demo``. Heavy imports stay inside ``run_job``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, TextIO

from analyzer.cli.analyze import (
    _arg,
    _error,
    _Progress,
    add_site_argument,
)
from analyzer.cli.report import add_source_arguments, check_source, load_inputs

if TYPE_CHECKING:
    from analyzer.analysis.scores import Scores
    from analyzer.data.frame import Fleet

DEFAULT_WINDOW = "1d"


def _ratio(text: str) -> float:
    value = float(text.rstrip("%")) / (100.0 if text.endswith("%") else 1.0)
    if not 0.0 < value <= 1.0:
        raise ValueError(f"{text!r}: give a ratio in (0, 1] or a percentage, e.g. 0.3 or 30%")
    return value


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "job", help="one job's GPU efficiency report and advice (or the jobs below a bar)",
        description="What one job's GPUs really did: reported vs effective utilization per GPU and over time, "
        "memory high-water mark against capacity, idle and masked GPU-hours, findings that touched it, cost, "
        "and what to change. With --list, the jobs of the window (below --below).",
    )
    p.add_argument("name", nargs="?", help="workload name, Slurm job id or pod name")
    cost = add_source_arguments(p, DEFAULT_WINDOW)
    add_site_argument(cost)
    lst = p.add_argument_group("listing")
    lst.add_argument("--list", action="store_true", help="list the window's jobs instead of one job's report")
    lst.add_argument("--below", type=_arg(_ratio), default=None, metavar="RATIO",
                     help="with --list: only jobs under this effective utilization, e.g. 0.3 or 30%%")
    lst.add_argument("--finished", action="store_true", help="with --list: only jobs that ended in the window")
    lst.add_argument("--mail", type=Path, metavar="DIR", help="with --list --below: write one message per namespace "
                     "(a Slurm job's: per user) to DIR/<owner>.eml (send each with sendmail -t < FILE)")
    lst.add_argument("--mail-to", default="{owner}", metavar="TEMPLATE",
                     help="recipient address, {owner} (the namespace, or a Slurm job's user), {namespace} and {user} "
                     "replaced (default {owner})")
    lst.add_argument("--mail-from", default="truegpu", metavar="ADDRESS", help="sender address (default truegpu)")
    lst.add_argument("--link", metavar="URL", help="a job page's URL, {job} replaced, e.g. "
                     "https://truegpu.example/api/jobs/{job}?format=html")
    out = p.add_argument_group("output")
    out.add_argument("--json", action="store_true", help="print JSON")
    out.add_argument("--html", type=Path, metavar="DIR", help="also write the job's page to DIR/job-<name>.html")
    out.add_argument("--quiet", action="store_true", help="no progress on stderr")
    p.set_defaults(func=run_job)


def _check(args: argparse.Namespace) -> None:
    check_source(args)
    if args.list == bool(args.name):
        raise ValueError("give a job NAME, or --list (not both)")
    if not args.list and (args.below is not None or args.finished or args.mail):
        raise ValueError("--below, --finished and --mail go with --list")
    if args.mail and args.below is None:
        raise ValueError("--mail needs --below (the bar the message names)")
    if args.list and args.html:
        raise ValueError("--html writes one job's page: give a job NAME")


def run_job(args: argparse.Namespace, out: TextIO | None = None) -> int:
    from analyzer.data.ingest import PrometheusError

    out = out or sys.stdout
    progress = _Progress(args.quiet)
    try:
        _check(args)
        from analyzer.finops import cost_report
        from analyzer.finops.costs import WORKLOAD
        from analyzer.pipeline import analyze

        catalog, site, fleet = load_inputs(args, progress, DEFAULT_WINDOW)
        result = analyze(fleet, None, site, progress=progress)
        if args.list:
            return _list(args, fleet, result.scores, out)
        from analyzer.report import job

        name = job.resolve(fleet, args.name)
        cost = cost_report(fleet, result.scores, result.findings, catalog, group_by=WORKLOAD, site=site)
        report = job.job_report(fleet, result.scores, result.findings, name, cost)
    except (LookupError, ValueError, OSError, PrometheusError) as exc:
        return _error("job", str(exc).strip("'\""))
    if args.json:
        json.dump(job.to_json(report), out, indent=2, allow_nan=False)
        out.write("\n")
    else:
        out.write(job.format_text(report) + "\n")
    if args.html:
        from analyzer.report.job_html import render_job
        from analyzer.report.job_list import file_safe

        try:
            args.html.mkdir(parents=True, exist_ok=True)
            path = args.html / f"job-{file_safe(name)}.html"
            path.write_text(render_job(report), encoding="utf-8")
        except OSError as exc:
            return _error("job", f"cannot write the page: {exc.strerror or exc}")
        progress(f"page written to {path}")
    return 0


def _list(args: argparse.Namespace, fleet: Fleet, scores: Scores, out: TextIO) -> int:
    from analyzer.findings import json_ready
    from analyzer.report.job_list import format_list, job_list, mail_messages

    jobs = job_list(fleet, scores, args.below, args.finished)
    if args.json:
        json.dump(json_ready({"below": args.below, "finished_only": args.finished,
                              "jobs": jobs.to_dict("records")}), out, indent=2, allow_nan=False)
        out.write("\n")
    else:
        out.write(format_list(jobs, args.below) + "\n")
    if args.mail:
        messages = mail_messages(jobs, args.below, fleet.start, fleet.end, to=args.mail_to, sender=args.mail_from,
                                 link=args.link)
        try:
            args.mail.mkdir(parents=True, exist_ok=True)
            for key, msg in messages.items():
                (args.mail / f"{key}.eml").write_bytes(bytes(msg))
        except OSError as exc:
            return _error("job", f"cannot write the messages: {exc.strerror or exc}")
        print(f"truegpu job: {len(messages)} message(s) written to {args.mail}", file=sys.stderr)
    return 0
