"""Jobs below an effective-utilization bar (``truegpu job --list``, ``GET /api/jobs``), and the mail an admin
sends their owners: one plain-text RFC 5322 message per namespace (a Slurm job's: per user), written to
files (``sendmail -t < F`` sends one; no mail server is involved here).

A job is *finished* when it held no GPU in the last step of the window (its last allocated sample is
earlier): run over yesterday (``--start`` / ``--end``), the finished jobs are the ones that ended
yesterday. Effective utilization is the job's row of the allocated per-workload scores, unknown where
nothing was measured (never listed as 0 %: an unknown job is not below the bar).
"""

from __future__ import annotations

import math
import re
from email.message import EmailMessage
from email.utils import formatdate

import numpy as np
import pandas as pd

from analyzer.analysis.scores import Scores
from analyzer.analysis.shares import holder_rows
from analyzer.data.frame import Fleet
from analyzer.findings import rfc3339
from analyzer.report.data import job_namespaces

LIST_COLUMNS: tuple[str, ...] = (
    "job", "namespace", "user", "account", "first_seen", "last_seen", "running", "gpus", "allocated_gpu_hours",
    "reported_util", "effective_util", "waste_gpu_hours",
)
#: How a recipient address is made by default (``--mail-to``): a namespace, or a Slurm job's user.
DEFAULT_MAIL_TO = "{owner}"


def job_list(fleet: Fleet, scores: Scores, below: float | None = None, finished: bool = False) -> pd.DataFrame:
    """Jobs of the window (LIST_COLUMNS), lowest effective utilization first; ``below``: only those under
    that ratio (unknown ones never); ``finished``: only those that ended within the window."""
    fr = fleet.frame
    jobs = scores.allocated.get("job")
    if jobs is None or jobs.empty or "job" not in fr.columns:
        return pd.DataFrame(columns=list(LIST_COLUMNS))
    held = holder_rows(fleet, ("timestamp", "hostname", "gpu", "namespace", "job"))
    sub = held[held["job"].notna()].astype({"timestamp": np.float64})  # a shared GPU's every holder
    key = sub["job"].astype(str)
    span = sub.groupby(key, sort=True)["timestamp"].agg(["min", "max"])
    # Physical GPUs, as the job's report counts them: a job on 8 MIG slices of 4 GPUs holds 4.
    counts = sub[["hostname", "gpu"]].assign(job=key).drop_duplicates().groupby("job", sort=True).size()
    ns = job_namespaces(sub)
    out = jobs.assign(job=jobs["job"].astype(str)).set_index("job")
    acct = fleet.accounting.assign(job=fleet.accounting["job"].astype(str)).set_index("job")
    out = pd.DataFrame({
        "job": span.index,
        "namespace": ns.reindex(span.index).fillna("").to_numpy(),
        **{c: acct[c].reindex(span.index).fillna("").astype(str).to_numpy() for c in ("user", "account")},
        "first_seen": span["min"].to_numpy(float),
        "last_seen": span["max"].to_numpy(float),
        "running": (span["max"].to_numpy(float) + fleet.step >= fleet.end - 1e-6),
        "gpus": counts.reindex(span.index).to_numpy(int),
        "allocated_gpu_hours": out["allocated_gpu_hours"].reindex(span.index).to_numpy(float),
        "reported_util": out["reported_util"].reindex(span.index).to_numpy(float),
        "effective_util": out["effective_util"].reindex(span.index).to_numpy(float),
        "waste_gpu_hours": _waste(scores, span.index),
    })
    if finished:
        out = out[~out["running"]]
    if below is not None:
        out = out[out["effective_util"] < below]  # NaN < x is False: unknown is never "below"
    return out.sort_values(["effective_util", "allocated_gpu_hours", "job"], ascending=[True, False, True],
                           na_position="last", ignore_index=True)


def _waste(scores: Scores, jobs: pd.Index) -> list[float]:
    part = scores.partition.job if scores.partition is not None else pd.DataFrame()
    if part.empty or "waste_gpu_hours" not in part.columns:
        return [math.nan] * len(jobs)
    waste = part["waste_gpu_hours"]
    waste.index = waste.index.astype(str)
    return waste.reindex(jobs).astype(float).tolist()


def format_list(jobs: pd.DataFrame, below: float | None) -> str:
    """The listing as a terminal table."""
    if jobs.empty:
        return "No job " + (f"below {below:.0%} effective utilization" if below is not None else "held a GPU") + \
            " in the window."
    lines = [f"{'job':<28} {'owner':<14} {'GPUs':>5} {'GPU-h':>8} {'reported':>9} {'effective':>9} "
             f"{'waste GPU-h':>11}  ended"]
    for r in jobs.to_dict("records"):
        owner = r["namespace"] or r["user"]
        lines.append(f"{r['job']:<28} {owner:<14} {r['gpus']:>5} {r['allocated_gpu_hours']:>8,.1f} "
                     f"{_pct(r['reported_util']):>9} {_pct(r['effective_util']):>9} {_num(r['waste_gpu_hours']):>11}"
                     f"  {'running' if r['running'] else rfc3339(r['last_seen'])}")
    return "\n".join(lines)


def _pct(v: float) -> str:
    return f"{v:.0%}" if math.isfinite(v) else "unknown"


def _num(v: float) -> str:
    return f"{v:,.1f}" if math.isfinite(v) else "unknown"


def mail_messages(jobs: pd.DataFrame, below: float, start: float, end: float, *, to: str = DEFAULT_MAIL_TO,
                  sender: str = "truegpu", link: str | None = None) -> dict[str, EmailMessage]:
    """One message per owner listing their jobs (``jobs`` from ``job_list``), keyed by a file-safe name: the
    namespace, or for a Slurm job (no namespace) its user. ``to``: the recipient address template (``{owner}``,
    ``{namespace}`` and ``{user}`` are replaced); ``link``: a URL template for a job's page (``{job}``), e.g.
    ``https://truegpu.example/jobs/{job}``."""
    out: dict[str, EmailMessage] = {}
    owner = jobs["namespace"].where(jobs["namespace"] != "", jobs["user"]).replace("", "(no owner)")
    for ns, group in jobs.groupby(owner, sort=True):
        msg = EmailMessage()
        msg["From"] = sender
        msg["To"] = to.format(owner=ns, namespace=group["namespace"].iloc[0], user=group["user"].iloc[0])
        msg["Date"] = formatdate(end, usegmt=True)
        msg["Subject"] = f"GPU jobs below {below:.0%} effective utilization of {ns} ({len(group)})"
        lines = [
            f"Hello,\n\nthese jobs of {ns} used less than {below:.0%} of the GPUs they held between "
            f"{rfc3339(start)} and {rfc3339(end)} (effective utilization: the share of the GPUs' cycles "
            "that did real work, what the dashboards' \"GPU util\" does not tell):\n",
            format_list(group, below),
            "",
            "Run `truegpu job NAME` (or open the link) for each job's own report and what to change.",
        ]
        if link:
            lines += [""] + [f"  {j}: {link.format(job=j)}" for j in group["job"]]
        lines.append("\n-- \ntruegpu")
        msg.set_content("\n".join(lines), cte="8bit")  # readable as written: no line is near SMTP's 998
        out[file_safe(str(ns))] = msg
    return out


def file_safe(text: str) -> str:
    """``text`` usable as a file name (a job or namespace may hold any character)."""
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", text)
