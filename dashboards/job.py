"""Job view: a job's members side by side, stragglers, and the job's effective utilization."""

from __future__ import annotations

from analyzer import findings as F
from analyzer import output_schema as out
from dashboards.builder import (
    BYTES_PER_SECOND,
    CELSIUS,
    COUNT,
    HERTZ,
    NONE,
    RATIO,
    TO_GPU,
    TO_NODE,
    WATTS,
    PanelSpec,
    q,
)
from dashboards.queries import Dialect
from exporter import schema as S

KEY = "job"
TITLE = "Job"
DESCRIPTION = "The GPUs of the selected jobs side by side (one line per member), straggler findings and " \
    "the spread between members. In a synchronous job the slowest member sets everyone's pace."

LINKS = ("fleet", "node", "health", "thermal", "finops")
#: The analyzer's page of the selected workload (``truegpu job``): its report and advice.
PAGES = (("Job report (truegpu analyzer)", f"/jobs/${{{S.WORKLOAD}:percentencode}}"),)
#: Stragglers and idle GPUs: what a job's owner can act on.
FINDINGS = (F.STRAGGLER, F.IDLE_ALLOCATED, F.IDLE_MASKING)

MEMBER = "{{workload}} {{hostname}} gpu{{gpu}}"
_BY = ("namespace", S.WORKLOAD, S.HOSTNAME, S.GPU)
#: A member's series open its GPU's health and its node.
_DRILL = (TO_GPU, TO_NODE)


def panels(d: Dialect) -> list[PanelSpec]:
    def _member(expr: str) -> str:
        return d.agg("max", expr, *_BY)

    def _device(expr: str) -> str:
        """A device-level series restricted to the selected jobs' GPUs, labelled with their job."""
        members = d.agg("count", d.allocated(), *_BY)
        return f"{d.agg('max', expr, S.HOSTNAME, S.GPU)} * on({d.gpu_key}) group_right() ({members} > bool 0)"

    sm = d.sel(S.SM_ACTIVE, alloc=True)
    spread = (f"{d.agg('max', _member(sm), 'namespace', S.WORKLOAD)} - "
              f"{d.agg('min', _member(sm), 'namespace', S.WORKLOAD)}")
    specs = [
        PanelSpec("SM activity per member", RATIO, [q(_member(sm), MEMBER)], width=24,
                  description="Per-member SM activity; a member below the others is a straggler or starved."),
        PanelSpec("Effective utilization per member", RATIO, [q(_member(d.effective(alloc=True)), MEMBER)],
                  description="SM active x (SM clock / max SM clock) of each member GPU."),
        PanelSpec("Reported GPU utilization per member", RATIO,
                  [q(_device(d.sel(S.GPU_UTILIZATION)), MEMBER)],
                  description="nvidia-smi GPU-Util of each member: high here and low SM activity is masking."),
        PanelSpec("SM clock per member", HERTZ, [q(_device(d.sel(S.SM_CLOCK)), MEMBER)], width=8,
                  description="A member clocked lower than its peers (heat, power) slows the whole job."),
        PanelSpec("Temperature per member", CELSIUS,
                  [q(_device(d.sel(S.TEMPERATURE, sensor="gpu")), MEMBER)], width=8,
                  description="GPU die temperature of each member."),
        PanelSpec("Power per member", WATTS, [q(_device(d.sel(S.POWER)), MEMBER)], width=8,
                  description="Power draw of each member; a waiting member draws less."),
        PanelSpec("NVLink throughput per member", BYTES_PER_SECOND,
                  [q(_device(d.throughput(S.NVLINK_BYTES, d.gpu_key)), MEMBER)],
                  description="NVLink bytes/s (TX + RX) of each member: collectives of the job."),
        PanelSpec("SM activity spread (max - min member)", RATIO, [q(spread, "{{namespace}}/{{workload}}")],
                  description="How far the slowest member trails the fastest one."),
        PanelSpec("Straggler findings", NONE,
                  [q(d.analyzer(out.FINDING_SCORE, kind=F.STRAGGLER), instant=True)], kind="table",
                  description=f"Open {F.STRAGGLER} findings ({out.FINDING_SCORE.name}) with their score (0..1)."),
        PanelSpec("Stragglers over time", COUNT,
                  [q(d.agg("count", d.analyzer(out.FINDING_ACTIVE, kind=F.STRAGGLER), "namespace", S.WORKLOAD),
                     "{{namespace}}/{{workload}}")], stacked=True),
        PanelSpec("Job effective vs reported utilization (analyzer)", RATIO, [
            q(d.analyzer(out.JOB_EFFECTIVE_UTILIZATION), "{{namespace}}/{{workload}} effective"),
            q(d.analyzer(out.JOB_REPORTED_UTILIZATION), "{{namespace}}/{{workload}} reported"),
        ]),
        PanelSpec("GPUs per job", COUNT,
                  [q(d.agg("count", d.allocated(), "namespace", S.WORKLOAD), "{{namespace}}/{{workload}}")],
                  stacked=True, description="GPUs (and MIG instances) each selected job holds."),
    ]
    for spec in specs:
        if spec.queries[0].legend == MEMBER or spec.kind == "table":
            spec.drill = _DRILL
    return specs
