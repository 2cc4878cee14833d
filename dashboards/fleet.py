"""Fleet overview: reported vs effective utilization, the masking gap, GPU-hours and waste."""

from __future__ import annotations

from analyzer import output_schema as out
from analyzer.detectors import kinds
from dashboards.builder import COUNT, GPU_HOURS, RATIO, TO_NODE, PanelSpec, q
from dashboards.queries import Dialect
from exporter import schema as S

KEY = "fleet"
TITLE = "Fleet overview"
DESCRIPTION = (
    "How much of the fleet really works. Reported utilization is nvidia-smi's GPU-Util (a kernel was "
    "resident); effective utilization is SM activity x (SM clock / max SM clock); the masking gap is "
    "the difference. GPU-hours are integrated over the dashboard range."
)
LINKS = ("node", "job", "finops")
FINDINGS = tuple(kinds())  # every registered kind


def panels(d: Dialect) -> list[PanelSpec]:
    util, sm, eff = d.sel(S.GPU_UTILIZATION), d.sel(S.SM_ACTIVE), d.effective()

    def avg(expr: str) -> str:
        return d.agg("avg", expr)

    waste = d.analyzer(out.FLEET_GPU_SECONDS, **{out.PART_LABEL: "=~" + "|".join(out.WASTE_PARTS)})
    normal = d.analyzer(out.FLEET_GPU_SECONDS, **{out.PART_LABEL: "=~" + "|".join(out.NORMAL_PARTS)})
    return [
        PanelSpec("Reported GPU utilization", RATIO, [q(avg(util))], kind="stat", width=6,
                  description="Mean nvidia-smi GPU-Util over all selected GPUs and the range."),
        PanelSpec("SM activity", RATIO, [q(avg(sm))], kind="stat", width=6,
                  description="Mean fraction of time warps were resident on the SMs."),
        PanelSpec("Effective utilization", RATIO, [q(avg(eff))], kind="stat", width=6,
                  description="SM active x (SM clock / max SM clock): work done relative to the hardware."),
        PanelSpec("Masking gap", RATIO, [q(avg(d.masking_gap()))], kind="stat", width=6,
                  description="Reported utilization minus SM activity: GPUs that look busy but are not."),
        PanelSpec("Reported vs effective utilization", RATIO, [
            q(avg(util), "reported (GPU-Util)"),
            q(avg(sm), "SM active"),
            q(avg(eff), "effective"),
        ], width=12, description="Mean over the selected GPUs of what nvidia-smi reports, SM activity and "
                                 "effective utilization: the gap between the lines is work that only looks done."),
        PanelSpec("Masking gap by node", RATIO, [q(d.agg("avg", d.masking_gap(), S.HOSTNAME), "{{hostname}}")],
                  width=12, description="Per node mean of GPU-Util minus SM activity.", drill=(TO_NODE,)),
        PanelSpec("Allocated vs effective GPU-hours", GPU_HOURS, [
            q(d.agg("sum", d.allocated_gpu_hours("namespace")), "allocated"),
            q(d.agg("sum", d.effective_gpu_hours("namespace")), "effective"),
        ], kind="stat", width=8, reduce="lastNotNull",
            description="GPU-hours allocated to pods/jobs over the dashboard range, and the part of them "
                        "that was effective (effective utilization integrated over time)."),
        PanelSpec("Analyzer: recoverable waste vs normal headroom", GPU_HOURS, [
            q(f"{d.agg('sum', waste)} / 3600", "recoverable waste"),
            q(f"{d.agg('sum', normal)} / 3600", "normal headroom (not waste)"),
        ], kind="stat", width=4, reduce="lastNotNull",
            description="GPU-hours of the analyzer's last window: recoverable waste (idle, masked, straggler wait, "
                        "throttled, under the workload class's floor) and the normal gap of healthy work of its "
                        "class (not waste). Allocated minus effective is both together."),
        PanelSpec("Analyzer: where the GPU-hours went", GPU_HOURS,
                  [q(f"{d.agg('sum', d.analyzer(out.FLEET_GPU_SECONDS), out.PART_LABEL)} / 3600", "{{part}}",
                     instant=True)],
                  kind="table", width=12,
                  description="GPU-hours: " + out.FLEET_GPU_SECONDS.help),
        PanelSpec("Effective utilization by namespace", RATIO,
                  [q(d.agg("avg", d.effective(alloc=True), "namespace"), "{{namespace}}")], width=12,
                  description="Mean effective utilization of the GPUs each namespace holds."),
        PanelSpec("Data coverage", RATIO, [q(d.coverage(), "GPUs reporting")], width=12,
                  description="Share of the GPUs seen in the dashboard range that report data at each time. "
                              "Time without data is unknown (the analyzer counts it as unknown GPU-hours, "
                              "never as idle or unallocated)."),
        PanelSpec("Allocated GPUs", COUNT, [
            q(d.agg("count", d.sel(S.GPU_UTILIZATION)), "all GPUs"),
            q(d.agg("count", d.agg("count", d.allocated(), S.HOSTNAME, S.GPU)), "allocated"),
        ], width=12, description="GPUs reporting utilization, and those a pod or job holds."),
        PanelSpec("Analyzer: fleet effective vs reported", RATIO, [
            q(f"{d.analyzer(out.FLEET_EFFECTIVE_UTILIZATION)}", "effective ({{allocation}})"),
            q(f"{d.analyzer(out.FLEET_REPORTED_UTILIZATION)}", "reported ({{allocation}})"),
        ], width=12, description="The analyzer's time-weighted scores over its last analysis window."),
        PanelSpec("Open findings by kind", COUNT,
                  [q(d.agg("count", d.analyzer(out.FINDING_ACTIVE), "kind"), "{{kind}}")], width=12,
                  stacked=True, description="Open analyzer findings (truegpu_finding_active) per kind."),
    ]
