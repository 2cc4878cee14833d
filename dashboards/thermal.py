"""Thermal: temperatures, thermal and power throttling, capacity lost to lower clocks."""

from __future__ import annotations

from analyzer import findings as F
from analyzer import output_schema as out
from dashboards.builder import CELSIUS, COUNT, RATIO, TO_GPU, TO_NODE, PanelSpec, gpu_legend, q
from dashboards.queries import Dialect
from exporter import schema as S

KEY = "thermal"
TITLE = "Thermal"
DESCRIPTION = "GPU and HBM temperatures, thermal and power clock events, and the SM clock ratio " \
    "(capacity left after throttling)."
LINKS = ("fleet", "node", "health", "job")
FINDINGS = (F.THERMAL,)


def panels(d: Dialect) -> list[PanelSpec]:
    gpu_t = d.sel(S.TEMPERATURE, sensor="gpu")
    mem_t = d.sel(S.TEMPERATURE, sensor="memory")
    thermal = d.clock_events(S.THERMAL_REASONS)
    power = d.clock_events(S.POWER_REASONS)

    def per_gpu(expr: str) -> str:
        return d.agg("max", expr, S.HOSTNAME, S.GPU)

    def gpus_with(events: str) -> str:
        """GPUs with any of the reasons active (0 when none, empty when unknown)."""
        return d.agg("sum", per_gpu(events))

    specs = [
        PanelSpec("Hottest GPU", CELSIUS, [q(d.agg("max", gpu_t))], kind="stat", width=6, reduce="max",
                  description="Highest GPU die temperature of the selected GPUs over the range."),
        PanelSpec("GPUs thermally throttled", COUNT,
                  [q(gpus_with(thermal))], kind="stat", width=6,
                  reduce="max", description="GPUs with any of " + ", ".join(S.THERMAL_REASONS) + " active."),
        PanelSpec("GPUs power capped", COUNT,
                  [q(gpus_with(power))], kind="stat", width=6,
                  reduce="max", description="GPUs with any of " + ", ".join(S.POWER_REASONS) + " active."),
        PanelSpec("Mean SM clock ratio", RATIO, [q(d.agg("avg", d.clock_ratio()))], kind="stat", width=6,
                  description="SM clock / max SM clock; below 1 is capacity lost to throttling."),
        PanelSpec("GPU temperature", CELSIUS, [q(per_gpu(gpu_t), gpu_legend())],
                  description="GPU die temperature per GPU."),
        PanelSpec("HBM temperature", CELSIUS, [q(per_gpu(mem_t), gpu_legend())],
                  description="HBM (device memory) temperature per GPU."),
        PanelSpec("Thermal clock events", COUNT,
                  [q(d.agg("sum", thermal, S.HOSTNAME, "reason"), "{{hostname}} {{reason}}")], stacked=True,
                  description="GPUs per host with each thermal reason active.", drill=(TO_NODE,)),
        PanelSpec("Power clock events", COUNT,
                  [q(d.agg("sum", power, S.HOSTNAME, "reason"), "{{hostname}} {{reason}}")], stacked=True,
                  description="GPUs per host with each power reason active.", drill=(TO_NODE,)),
        PanelSpec("SM clock ratio", RATIO, [q(d.clock_ratio(), gpu_legend())],
                  description="SM clock / max SM clock per GPU."),
        PanelSpec("Power / limit", RATIO,
                  [q(f"{per_gpu(d.sel(S.POWER))} / {per_gpu(d.sel(S.POWER_LIMIT))}", gpu_legend())],
                  description="Power draw over the enforced power limit per GPU; near 1 the GPU is power capped."),
    ]
    if d.supports(S.NODE_INFO):
        hottest = f"{d.agg('max', gpu_t, S.HOSTNAME)} * on({d.key(S.HOSTNAME)}) group_left(rack) {d.sel(S.NODE_INFO)}"
        specs.append(PanelSpec(
            "Hottest GPU per rack", CELSIUS, [q(d.agg("max", hottest, "rack"), "{{rack}}")],
            description=f"Max GPU temperature per rack ({S.NODE_INFO.name}); a whole rack running hot "
                        "points at cooling, not at one GPU."))
    specs.append(PanelSpec("Thermal findings", COUNT,
                           [q(d.analyzer(out.FINDING_ACTIVE, kind=F.THERMAL), "{{hostname}} gpu{{gpu}} {{severity}}")],
                           width=12 if d.supports(S.NODE_INFO) else 24,
                           description=f"Open {F.THERMAL} findings of the analyzer per GPU."))
    for spec in specs:
        if spec.queries[0].legend.startswith(gpu_legend()):
            spec.drill = (TO_GPU,)
    return specs
