"""FinOps: GPU-hours allocated vs effective per namespace and job (costs come later)."""

from __future__ import annotations

from analyzer import output_schema as out
from dashboards.builder import COUNT, GPU_HOURS, RATIO, PanelSpec, q
from dashboards.queries import Dialect

KEY = "finops"
TITLE = "FinOps"
DESCRIPTION = (
    "GPU-hours over the dashboard range: allocated (a pod/job held the GPU) and effective (effective "
    "utilization integrated over that time); the difference is waste. COST PLACEHOLDER: prices are not "
    "modelled yet - multiply GPU-hours by your $/GPU-hour; cost panels will come with the analyzer's "
    "effective-cost reports. MIG instances count as one GPU each here."
)

_PLACEHOLDER = " Cost: not yet (placeholder) - multiply by your $/GPU-hour."


def panels(d: Dialect) -> list[PanelSpec]:
    specs = []
    for by, what in (("namespace", "{{namespace}}"), ("namespace, job", "{{namespace}}/{{job}}")):
        label = "job" if "job" in by else "namespace"
        alloc, eff = d.allocated_gpu_hours(by), d.effective_gpu_hours(by)
        specs += [
            PanelSpec(f"GPU-hours per {label}: allocated, effective, waste", GPU_HOURS, [
                q(alloc, f"{what} allocated", instant=True),
                q(eff, f"{what} effective", instant=True),
                q(f"({alloc}) - ({eff})", f"{what} waste", instant=True),
            ], kind="table", description=f"Over the dashboard range.{_PLACEHOLDER}"),
            PanelSpec(f"Effective / allocated GPU-hours per {label}", RATIO,
                      [q(f"({eff}) / ({alloc})", what)],
                      description="Share of the allocated GPU-hours that did effective work (trailing range)."),
        ]
    specs += [
        PanelSpec("Allocated GPUs per namespace", COUNT,
                  [q(f"count by (namespace) ({d.allocated()})", "{{namespace}}")], stacked=True),
        PanelSpec("Analyzer: allocated GPUs per job", COUNT,
                  [q(d.analyzer(out.JOB_ALLOCATED_GPUS), "{{namespace}}/{{job}}")], stacked=True,
                  description=out.JOB_ALLOCATED_GPUS.help),
    ]
    return specs
