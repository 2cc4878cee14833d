"""Job view: a job's members side by side, stragglers, and the job's effective utilization."""

from __future__ import annotations

from analyzer import output_schema as out
from dashboards.builder import BYTES_PER_SECOND, CELSIUS, COUNT, HERTZ, NONE, RATIO, WATTS, PanelSpec, q
from dashboards.queries import GPU_KEY, Dialect
from exporter import schema as S

KEY = "job"
TITLE = "Job"
DESCRIPTION = "The GPUs of the selected jobs side by side (one line per member), straggler findings and " \
    "the spread between members. In a synchronous job the slowest member sets everyone's pace."

MEMBER = "{{workload}} {{hostname}} gpu{{gpu}}"
_BY = f"namespace, {S.WORKLOAD}, {GPU_KEY}"


def _member(expr: str) -> str:
    return f"max by ({_BY}) ({expr})"


def _device(d: Dialect, expr: str) -> str:
    """A device-level series restricted to the selected jobs' GPUs, labelled with their job."""
    members = f"count by ({_BY}) ({d.allocated()})"
    return f"max by ({GPU_KEY}) ({expr}) * on({GPU_KEY}) group_right() ({members} > bool 0)"


def panels(d: Dialect) -> list[PanelSpec]:
    sm = d.sel(S.SM_ACTIVE, alloc=True)
    spread = f"max by (namespace, workload) ({_member(sm)}) - min by (namespace, workload) ({_member(sm)})"
    return [
        PanelSpec("SM activity per member", RATIO, [q(_member(sm), MEMBER)], width=24,
                  description="Per-member SM activity; a member below the others is a straggler or starved."),
        PanelSpec("Effective utilization per member", RATIO, [q(_member(d.effective(alloc=True)), MEMBER)]),
        PanelSpec("Reported GPU utilization per member", RATIO,
                  [q(_device(d, d.sel(S.GPU_UTILIZATION)), MEMBER)]),
        PanelSpec("SM clock per member", HERTZ, [q(_device(d, d.sel(S.SM_CLOCK)), MEMBER)], width=8),
        PanelSpec("Temperature per member", CELSIUS,
                  [q(_device(d, d.sel(S.TEMPERATURE, sensor="gpu")), MEMBER)], width=8),
        PanelSpec("Power per member", WATTS, [q(_device(d, d.sel(S.POWER)), MEMBER)], width=8),
        PanelSpec("NVLink throughput per member", BYTES_PER_SECOND,
                  [q(_device(d, d.throughput(S.NVLINK_BYTES, GPU_KEY)), MEMBER)]),
        PanelSpec("SM activity spread (max - min member)", RATIO, [q(spread, "{{namespace}}/{{workload}}")],
                  description="How far the slowest member trails the fastest one."),
        PanelSpec("Straggler findings", NONE,
                  [q(d.analyzer(out.FINDING_SCORE, kind="straggler"), instant=True)], kind="table",
                  description="Open straggler findings (truegpu_finding_* {kind=\"straggler\"}) with their score."),
        PanelSpec("Stragglers over time", COUNT,
                  [q(f"count by (namespace, workload) ({d.analyzer(out.FINDING_ACTIVE, kind='straggler')})",
                     "{{namespace}}/{{workload}}")], stacked=True),
        PanelSpec("Job effective vs reported utilization (analyzer)", RATIO, [
            q(d.analyzer(out.JOB_EFFECTIVE_UTILIZATION), "{{namespace}}/{{workload}} effective"),
            q(d.analyzer(out.JOB_REPORTED_UTILIZATION), "{{namespace}}/{{workload}} reported"),
        ]),
        PanelSpec("GPUs per job", COUNT,
                  [q(f"count by (namespace, {S.WORKLOAD}) ({d.allocated()})", "{{namespace}}/{{workload}}")],
                  stacked=True),
    ]
