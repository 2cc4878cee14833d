"""One job's report for the person who runs it (``truegpu job``, ``GET /api/jobs/{name}``): jobstats for GPUs.

Every number comes from the one analysis of the window, never re-derived: utilization and GPU-hours from
the job's row of the allocated per-workload scores (what ``/api/scores?level=workload`` answers), where
its GPU-hours went from the one GPU-hour partition (analyzer.analysis.partition, the split the cost
report prices), its cost from the cost report grouped by workload. So the three agree to the last digit.

A job is named by its workload (``job`` column: a Deployment, a training job, a Slurm job id) or by one of
its pods. Per GPU the report adds what only a job owner asks: the memory high-water mark against the
GPU's (or MIG slice's) capacity, and reported against effective utilization per device.

Advice (``advise``), largest recoverable GPU-hours first, each rule with the number behind it:

* ``release``: idle allocated GPU-hours >= ``IDLE_SHARE`` (25 %) of the job's: a quarter of the
  reservation with nothing launched is a notebook or a service left holding GPUs.
* ``batch``: masked GPU-hours >= ``MASKED_SHARE`` (20 %), or a memory-bound bottleneck over most of
  the job: kernels are resident (the dashboard says busy) while most SMs wait on memory; larger
  batches, fused kernels and mixed precision raise the work per byte.
* ``data_loader``: an input-bound bottleneck (the GPUs sit without work between steps).
* ``fewer_gpus``: underused GPU-hours (below the workload class's floor) >= ``UNDERUSED_SHARE`` (25 %):
  the same work fits on fewer GPUs (the effective GPUs are said).
* ``smaller_gpu``: every GPU's memory high-water mark <= ``MEMORY_SHARE`` (50 %) of its capacity
  and effective utilization below ``SMALL_EFFECTIVE`` (50 %): a smaller MIG profile or GPU fits.
* ``straggler`` / ``hardware``: findings on the job's GPUs (a slow member, a failing GPU, heat).
Memory and utilization not collected are "unknown" and give no advice, never a false one.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from analyzer.analysis.partition import PARTS, WASTE
from analyzer.analysis.rows import allocated_rows
from analyzer.analysis.scores import AGG_COLUMNS, Scores, aggregate
from analyzer.analysis.shares import holder_rows, holder_view
from analyzer.data.frame import Fleet, device_order, optional_labels
from analyzer.findings import GPU_FAULT, STRAGGLER, THERMAL, Finding, json_ready, rfc3339, sort_findings
from analyzer.report import data

IDLE_SHARE = 0.25
MASKED_SHARE = 0.2
UNDERUSED_SHARE = 0.25
MEMORY_SHARE = 0.5
SMALL_EFFECTIVE = 0.5
#: The bottleneck must hold at least this share of the job's classified GPU-hours to advise on it.
BOTTLENECK_SHARE = 0.5
DEVICE_KEYS: tuple[str, ...] = ("hostname", "gpu", "uuid", "gpu_instance")
GPU_COLUMNS: tuple[str, ...] = (
    *DEVICE_KEYS, "model", "mig_profile", "gpu_hours", "reported_util", "effective_util", "effective_tensor",
    "memory_used_max_bytes", "memory_total_bytes",
)


@dataclass(frozen=True)
class Advice:
    kind: str
    text: str
    #: GPU-hours the advice is about (what following it could recover), NaN where none applies.
    gpu_hours: float = math.nan


@dataclass
class JobReport:
    name: str
    start: float
    end: float
    step: float
    namespaces: list[str]
    pods: list[str]
    #: First and last allocated sample of the job in the window; ``running``: still allocated at its end.
    first_seen: float
    last_seen: float
    running: bool
    #: The job's row of the allocated per-workload scores (AGG_COLUMNS).
    scores: dict[str, float]
    #: GPU-hours per part of the partition (PARTS), plus waste/normal/unclassified totals.
    parts: dict[str, float]
    gpus: pd.DataFrame
    timeline: pd.DataFrame
    findings: list[Finding]
    bottleneck: dict[str, Any]
    #: Slurm accounting (user, account, partition), None where not collected.
    slurm: dict[str, str] | None = None
    #: The job's row of the cost report grouped by workload, or None without prices.
    cost: dict[str, float] | None = None
    currency: str | None = None
    advice: list[Advice] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def duration_s(self) -> float:
        return self.last_seen + self.step - self.first_seen

    @property
    def physical_gpus(self) -> int:
        """GPUs the job's devices are on (a MIG slice is part of one)."""
        return len(self.gpus[["hostname", "gpu"]].drop_duplicates())

    @property
    def slices(self) -> str:
        """ "8 MIG slices (3g.40gb)" where the job held MIG instances, else ""."""
        profiles = self.gpus.loc[self.gpus["gpu_instance"].notna(), "mig_profile"]
        if not len(profiles):
            return ""
        names = ", ".join(sorted({p for p in profiles if p})) or "profile unknown"
        return f"{len(profiles)} MIG slice{'s' if len(profiles) > 1 else ''} ({names})"

    @property
    def memory_high_water_bytes(self) -> float:
        return _nanmax(self.gpus["memory_used_max_bytes"])

    @property
    def memory_capacity_bytes(self) -> float:
        return _nanmax(self.gpus["memory_total_bytes"])


def _nanmax(s: pd.Series) -> float:
    x = s.to_numpy(np.float64)
    return float(np.nanmax(x)) if len(x) and not np.isnan(x).all() else math.nan


def workloads(fleet: Fleet) -> list[str]:
    """The workloads holding GPUs in the window (a shared GPU's holders included), sorted."""
    fr = fleet.frame
    if "job" not in fr.columns:
        return []
    return sorted(map(str, pd.unique(holder_rows(fleet, ("job",))["job"].dropna())))


def resolve(fleet: Fleet, name: str) -> str:
    """The workload ``name`` stands for: a workload (or Slurm job id) itself, or the workload of a pod of
    that name. LookupError naming the window and some known workloads otherwise."""
    fr = fleet.frame
    known = workloads(fleet)
    if name in known:
        return name
    if "pod" in fr.columns:
        jobs = pd.unique(fr.loc[fr["pod"] == name, "job"].dropna()) if "job" in fr.columns else []
        if len(jobs) == 1:
            return str(jobs[0])
        if len(jobs) > 1:
            raise LookupError(f"pod {name!r} held GPUs for several workloads ({', '.join(sorted(map(str, jobs)))}): "
                              "name one of them")
    near = [w for w in known if name.lower() in w.lower()] or known
    listed = ", ".join(near[:10]) + (f" and {len(near) - 10} more" if len(near) > 10 else "")
    raise LookupError(f"no workload, Slurm job or pod named {name!r} between {rfc3339(fleet.start)} and "
                      f"{rfc3339(fleet.end)}" + (f"; workloads: {listed}" if listed else "; no workload held a GPU"))


def job_report(fleet: Fleet, scores: Scores, findings: Sequence[Finding], name: str, cost: Any = None) -> JobReport:
    """The report of workload ``name`` (``resolve`` it first) from one analysis: ``scores`` with the partition
    attached (analyzer.pipeline.analyze), its ``findings``, and ``cost``: the cost report grouped by workload
    (analyzer.finops.cost_report) or None."""
    if scores.partition is None:
        raise ValueError("the job report needs the GPU-hour partition: analyze with partition=True")
    sub = holder_view(fleet, name)
    if not len(sub.frame):
        raise LookupError(f"workload {name!r} held no GPU in the window")
    rows = scores.rows.loc[sub.frame.index]
    table = scores.allocated["job"]
    row = table[table["job"].astype(str) == name].iloc[0]
    ts = sub.frame["timestamp"].to_numpy(np.float64)
    alloc_ts = ts[allocated_rows(sub.frame)]
    last = float(alloc_ts.max())
    part = scores.partition.job
    parts = {k: float(v) for k, v in part.loc[name].items()} if name in part.index else {}
    report = JobReport(
        name=name, start=fleet.start, end=fleet.end, step=fleet.step,
        namespaces=_values(sub.frame, "namespace"), pods=_values(sub.frame, "pod"),
        first_seen=float(alloc_ts.min()), last_seen=last, running=last + fleet.step >= fleet.end - 1e-6,
        scores={c: float(row[c]) for c in AGG_COLUMNS},
        parts=parts,
        gpus=_gpus(sub, rows),
        timeline=data.timeseries(sub, dataclasses.replace(scores, rows=rows)),
        findings=_touching(findings, name, sub.frame),
        bottleneck=_bottleneck(scores, name),
        notes=list(scores.notes),
    )
    acct = fleet.accounting
    hit = acct[acct["job"].astype(str) == name]
    if len(hit):
        report.slurm = {c: str(hit.iloc[0][c]) for c in ("user", "account", "partition")}
    if cost is not None:
        groups = cost.groups
        hit = groups[groups["group"].astype(str) == name]
        if len(hit):
            report.cost = {k: float(v) for k, v in hit.iloc[0].items() if k != "group"}
            report.currency = cost.currency
    report.advice = advise(report)
    return report


def _values(frame: pd.DataFrame, col: str) -> list[str]:
    return sorted(map(str, pd.unique(frame[col].dropna()))) if col in frame.columns else []


def _gpus(sub: Fleet, rows: pd.DataFrame) -> pd.DataFrame:
    """Per device of the job: scores over its rows, its memory high-water mark and capacity."""
    fr = sub.frame
    keys = [k for k in DEVICE_KEYS if k in fr.columns]
    table = aggregate(sub, rows, keys, allocated_only=True)
    extra = {}
    for col, out in (("model", "model"), ("mig_profile", "mig_profile")):
        if col in fr.columns:
            extra[out] = fr[col].astype(object)
    for col, out in (("mem_used", "memory_used_max_bytes"), ("mem_total", "memory_total_bytes")):
        extra[out] = fr[col].astype(np.float64) if col in fr.columns else pd.Series(np.nan, index=fr.index)
    more = pd.DataFrame(extra, index=fr.index)
    grouped = more.groupby([fr[k] for k in keys], observed=True, sort=True, dropna=False)
    agg = grouped.agg({c: ("first" if c in ("model", "mig_profile") else "max") for c in more.columns})
    table = table.merge(agg.reset_index(), on=keys, how="left")
    for c in GPU_COLUMNS:
        if c not in table.columns:
            table[c] = None if c in ("model", "mig_profile", *DEVICE_KEYS) else np.nan
    for c in ("model", "mig_profile", *keys):
        table[c] = optional_labels(table[c], table.index, empty_is_missing=True)
    order = device_order(*(table[c].fillna("").to_numpy(object) for c in ("hostname", "gpu", "gpu_instance")))
    return table[list(GPU_COLUMNS)].iloc[order].reset_index(drop=True)


def _touching(findings: Sequence[Finding], name: str, frame: pd.DataFrame) -> list[Finding]:
    """Findings of the job, and findings on its GPUs while it held them (a GPU's fault, heat)."""
    held: dict[tuple[str, str], tuple[float, float]] = {}
    if "hostname" in frame.columns and "gpu" in frame.columns and len(frame):
        span = frame.groupby([frame["hostname"].astype(str), frame["gpu"].astype(str)], observed=True,
                             sort=False)["timestamp"].agg(["min", "max"])
        held = {k: (float(a), float(b)) for k, (a, b) in zip(span.index, span.to_numpy(), strict=True)}
    out = []
    for f in findings:
        if f.job == name:
            out.append(f)
            continue
        if f.job is not None or f.hostname is None:
            continue
        hosts = [(str(f.hostname), str(f.gpu))] if f.gpu is not None else [k for k in held if k[0] == f.hostname]
        end = math.inf if f.end is None else f.end
        if any(k in held and f.start <= held[k][1] and held[k][0] <= end for k in hosts):
            out.append(f)
    return sort_findings(out)


def _bottleneck(scores: Scores, name: str) -> dict[str, Any]:
    bn = data.job_bottlenecks(scores)
    hit = bn[bn["job"] == name]
    if not len(hit):
        return {"class": None, "share": None, "confidence": None}
    r = hit.iloc[0]
    return {"class": str(r["bottleneck"]), "share": float(r["bottleneck_share"]),
            "confidence": str(r["bottleneck_confidence"])}


def _gb(v: float) -> str:
    """Bytes in GiB, as nvidia-smi's MiB and the card's name ("80GB" is 80 GiB) count them."""
    g = v / 2**30
    return f"{g:,.0f} GiB" if g >= 10 else f"{g:,.1f} GiB"


def _share(part: float, whole: float) -> float:
    return part / whole if whole > 0 and not math.isnan(part) else math.nan


def advise(r: JobReport) -> list[Advice]:
    """What the owner can do, largest recoverable GPU-hours first (module docstring: the rules)."""
    hours = r.scores.get("allocated_gpu_hours", math.nan)
    p = r.parts
    out: list[Advice] = []
    idle, masked, under = (p.get(f"{k}_gpu_hours", math.nan) for k in ("idle_allocated", "masked", "underused"))
    cls, cls_share = r.bottleneck.get("class"), r.bottleneck.get("share") or 0.0
    if _share(idle, hours) >= IDLE_SHARE:
        out.append(Advice("release", f"Release the GPUs when you are not using them: they sat idle (nothing running) "
                          f"for {idle:,.1f} of the {hours:,.1f} GPU-hours you held ({_share(idle, hours):.0%}). "
                          "Stop the notebook or kernel, or scale the service down, and ask for GPUs again when you "
                          "need them.", idle))
    if _share(masked, hours) >= MASKED_SHARE or (cls == "memory_bound" and cls_share >= BOTTLENECK_SHARE):
        s = r.scores
        out.append(Advice("batch", "Batch more work per kernel: the GPUs report "
                          f"{_pct(s['reported_util'])} busy but the SMs were active only {_pct(s['effective_util'])} "
                          "of the time, waiting on memory. Use larger batches, fuse small kernels (torch.compile), "
                          "use mixed precision (bf16/fp8) and keep data on the GPU.",
                          masked if not math.isnan(masked) else math.nan))
    if cls == "input_bound" and cls_share >= BOTTLENECK_SHARE:
        out.append(Advice("data_loader", "Feed the GPUs faster: they waited for input between steps for most of the "
                          f"job ({cls_share:.0%} of its classified GPU-hours). Add data-loader workers, pin memory, "
                          "prefetch, and read from faster storage or a local cache."))
    if _share(under, hours) >= UNDERUSED_SHARE:
        gpus = r.scores["allocated_gpu_hours"] / max(r.duration_s / 3600.0, 1e-9)
        used = r.scores["allocated_effective_gpu_hours"] / max(r.duration_s / 3600.0, 1e-9)
        out.append(Advice("fewer_gpus", f"Ask for fewer GPUs: the job held {gpus:,.1f} GPUs on average and their "
                          f"real work would fit on {used:,.1f} ({under:,.1f} GPU-hours underused below what this "
                          "kind of work normally reaches).", under))
    high, cap = r.memory_high_water_bytes, r.memory_capacity_bytes
    per_gpu = r.gpus["memory_used_max_bytes"] / r.gpus["memory_total_bytes"]
    idle_job = any(a.kind == "release" for a in out)  # releasing comes first; a smaller GPU held idle is no fix
    if (len(r.gpus) and per_gpu.notna().all() and not idle_job and float(per_gpu.max()) <= MEMORY_SHARE
            and r.scores["effective_util"] < SMALL_EFFECTIVE):
        out.append(Advice("smaller_gpu", f"Use a smaller GPU or MIG profile: you asked for {len(r.gpus)} x "
                          f"{_gb(cap)} and used at most {_gb(high)} on any of them, at "
                          f"{_pct(r.scores['effective_util'])} effective utilization."))
    kinds = {f.kind for f in r.findings}
    if STRAGGLER in kinds:
        out.append(Advice("straggler", "One slow member held the rest of the job back (see the straggler finding "
                          "below): report it to the cluster admins with the finding's id, or exclude that node "
                          "when you resubmit.", p.get("straggler_gpu_hours", math.nan)))
    if kinds & {GPU_FAULT, THERMAL}:
        out.append(Advice("hardware", "A GPU of this job failed or overheated (see the findings below): your job "
                          "may have crashed or slowed because of it. Resubmit away from that node and tell the "
                          "cluster admins the finding's id."))
    if not out:
        waste = sum(p.get(f"{k}_gpu_hours", 0.0) for k in WASTE)
        out.append(Advice("none", f"Nothing to fix found: {waste:,.1f} recoverable GPU-hours of {hours:,.1f}; "
                          f"effective utilization {_pct(r.scores['effective_util'])} is normal for this work."))
    return sorted(out, key=lambda a: -a.gpu_hours if not math.isnan(a.gpu_hours) else 0.0)


def _pct(v: float) -> str:
    return "unknown" if v is None or not math.isfinite(v) else f"{v:.0%}"


def to_json(r: JobReport) -> dict[str, Any]:
    """JSON-ready dict (RFC 3339 times, finite numbers or null)."""
    return json_ready({
        "workload": r.name,
        "window": {"start": rfc3339(r.start), "end": rfc3339(r.end), "step_seconds": r.step},
        "namespaces": r.namespaces, "pods": r.pods, "slurm": r.slurm,
        "first_seen": rfc3339(r.first_seen), "last_seen": rfc3339(r.last_seen), "running": r.running,
        "duration_seconds": r.duration_s,
        "gpus": r.physical_gpus, "devices": len(r.gpus),
        "scores": r.scores,
        "parts": {k.removesuffix("_gpu_hours"): v for k, v in r.parts.items()},
        "memory": {"high_water_bytes": r.memory_high_water_bytes, "capacity_bytes": r.memory_capacity_bytes},
        "bottleneck": r.bottleneck,
        "cost": r.cost, "currency": r.currency,
        "advice": [{"kind": a.kind, "text": a.text, "gpu_hours": a.gpu_hours} for a in r.advice],
        "per_gpu": r.gpus.to_dict("records"),
        "timeline": r.timeline.assign(timestamp=[rfc3339(t) for t in r.timeline["timestamp"]]).to_dict("records"),
        "findings": [f.to_json() for f in r.findings],
        "notes": r.notes,
    })


def format_text(r: JobReport) -> str:
    """The terminal report: one screen, plain advice first-class."""
    s = r.scores
    models = sorted({m for m in r.gpus["model"] if m})
    hosts = r.gpus["hostname"].nunique()
    lines = [
        f"Job {r.name}" + (f" (namespace {', '.join(r.namespaces)})" if r.namespaces else ""),
        *([f"  Slurm:     user {r.slurm['user'] or '?'}, account {r.slurm['account'] or '?'}, "
           f"partition {r.slurm['partition'] or '?'}"] if r.slurm else []),
        f"  GPUs:      {r.physical_gpus}{f' as {r.slices}' if r.slices else ''} "
        f"({', '.join(models) or 'model unknown'}) on {hosts} node(s)",
        f"  Ran:       {rfc3339(r.first_seen)} to {rfc3339(r.last_seen + r.step)} "
        f"({_duration(r.duration_s)}{', still running' if r.running else ''})",
        f"  GPU-hours: {s['allocated_gpu_hours']:,.1f} held, {s['allocated_effective_gpu_hours']:,.1f} of real work",
        f"  Utilization: reported {_pct(s['reported_util'])}, effective {_pct(s['effective_util'])}, "
        f"tensor cores {_pct(s['effective_tensor'])}",
    ]
    high, cap = r.memory_high_water_bytes, r.memory_capacity_bytes
    lines.append("  Memory:    " + (f"used at most {_gb(high)} of {_gb(cap)} per GPU" if not math.isnan(high)
                                    and not math.isnan(cap) else "unknown (memory not collected)"))
    if r.bottleneck.get("class"):
        lines.append(f"  Bottleneck: {r.bottleneck['class']} ({r.bottleneck['share']:.0%} of its GPU-hours)")
    if r.parts:
        shown = [f"{k} {r.parts[f'{k}_gpu_hours']:,.1f}" for k in PARTS
                 if r.parts.get(f"{k}_gpu_hours", 0.0) >= 0.05]
        lines.append("  Where the GPU-hours went: " + ", ".join(shown))
    if r.cost is not None:
        cpe = r.cost.get("cost_per_effective_gpu_hour", math.nan)
        lines.append(f"  Cost:      {r.cost['cost']:,.2f} {r.currency}, of which {r.cost['waste_cost']:,.2f} "
                     "recoverable waste; per effective GPU-hour "
                     + (f"{cpe:,.2f}" if math.isfinite(cpe) else "unknown"))
    lines += ["", "  Per GPU:", f"    {'host':<22} {'gpu':>4} {'reported':>9} {'effective':>9} {'tensor':>7} "
              f"{'memory peak':>12}"]
    for g in r.gpus.to_dict("records"):
        gpu = g["gpu"] or "-"
        if g["gpu_instance"]:
            gpu = f"{gpu}/{g['gpu_instance']}"
        mem = g["memory_used_max_bytes"]
        lines.append(f"    {g['hostname'] or '-'!s:<22} {gpu:>4} {_pct(g['reported_util']):>9} "
                     f"{_pct(g['effective_util']):>9} {_pct(g['effective_tensor']):>7} "
                     f"{(_gb(mem) if not math.isnan(mem) else 'unknown'):>12}")
    if r.findings:
        lines += ["", f"  Findings ({len(r.findings)}):"]
        lines += [f"    [{f.severity}] {f.kind} {f.id}: {f.summary}" for f in r.findings]
    lines += ["", "  Advice:"]
    lines += [f"    {i}. {a.text}" for i, a in enumerate(r.advice, 1)]
    return "\n".join(lines)


def _duration(seconds: float) -> str:
    h, m = divmod(round(seconds / 60.0), 60)
    return f"{h}h {m:02d}m" if h else f"{m}m"
