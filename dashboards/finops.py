"""FinOps: GPU-hours and their cost, allocated vs effective, per namespace and job."""

from __future__ import annotations

from analyzer import findings as F
from analyzer import output_schema as out
from dashboards.builder import COST, COUNT, GPU_HOURS, RATIO, TO_JOB, PanelSpec, q
from dashboards.queries import Dialect
from exporter.schema import WORKLOAD

KEY = "finops"
TITLE = "FinOps"
DESCRIPTION = (
    "GPU-hours over the dashboard range: allocated (a pod/job held the GPU) and effective (effective "
    "utilization integrated over that time); the difference is unused, and the analyzer splits it into recoverable "
    "waste and the normal headroom of healthy work of its class (not waste). Cost = allocated GPU-hours x the price "
    "catalog's $/GPU-hour of each GPU's model, as the truegpu analyzer publishes it (truegpu_gpu_hourly_cost; "
    "run `truegpu serve --prices FILE`); the exact split of the cost into effective work and waste is the "
    "analyzer's cost report (/api/reports/cost). MIG instances count as one GPU each here."
)
LINKS = ("fleet", "job")
#: Idle GPUs: the waste a FinOps view is about.
FINDINGS = (F.IDLE_ALLOCATED, F.IDLE_MASKING)


def panels(d: Dialect) -> list[PanelSpec]:
    specs = []
    per_workload = (f"namespace, {WORKLOAD}", "{{namespace}}/{{" + WORKLOAD + "}}")
    for by, what in (("namespace", "{{namespace}}"), per_workload):
        label = "workload" if WORKLOAD in by else "namespace"
        alloc, eff = d.allocated_gpu_hours(by), d.effective_gpu_hours(by)
        drill = (TO_JOB,) if label == "workload" else ()
        specs += [
            PanelSpec(f"GPU-hours per {label}: allocated, effective, unused", GPU_HOURS, [
                q(alloc, f"{what} allocated", instant=True),
                q(eff, f"{what} effective", instant=True),
                q(f"({alloc}) - ({eff})", f"{what} unused", instant=True),
            ], kind="table", description="Over the dashboard range. Unused = recoverable waste + normal headroom: "
                                         "see the analyzer's split below.", drill=drill),
            PanelSpec(f"Effective / allocated GPU-hours per {label}", RATIO,
                      [q(f"({eff}) / ({alloc})", what)], drill=drill,
                      description="Share of the allocated GPU-hours that did effective work (trailing range)."),
        ]
    specs.append(PanelSpec(
        "Cost of allocated GPU-hours per namespace (catalog prices)", COST,
        [q(d.allocated_cost("namespace, currency"), "{{namespace}} ({{currency}})", instant=True)], kind="table",
        description=f"Allocated GPU-hours x {out.GPU_HOURLY_COST.name} of the GPU's model, in the catalog's "
                    "currency. Needs the truegpu analyzer with a price catalog; unpriced models are left out."))
    ns_parts = d.analyzer(out.NAMESPACE_GPU_SECONDS)
    specs.append(PanelSpec(
        "Analyzer: recoverable waste and normal headroom per namespace", GPU_HOURS,
        [q(f"{d.agg('sum', ns_parts, 'namespace', out.PART_LABEL)} / 3600", "{{namespace}} {{part}}", instant=True)],
        kind="table", description="GPU-hours: " + out.NAMESPACE_GPU_SECONDS.help + " Recoverable: "
        + ", ".join(out.WASTE_PARTS) + "; normal (not waste): " + ", ".join(out.NORMAL_PARTS) + "."))
    specs += [
        PanelSpec("Allocated GPUs per namespace", COUNT,
                  [q(d.agg("count", d.allocated(), "namespace"), "{{namespace}}")], stacked=True,
                  description="GPUs (and MIG instances) a pod or job of the namespace holds."),
        PanelSpec("Analyzer: allocated GPUs per workload", COUNT,
                  [q(d.analyzer(out.JOB_ALLOCATED_GPUS), "{{namespace}}/{{workload}}")], stacked=True,
                  description=out.JOB_ALLOCATED_GPUS.help, drill=(TO_JOB,)),
    ]
    return specs
