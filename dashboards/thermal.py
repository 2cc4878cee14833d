"""Thermal: temperatures, thermal and power throttling, capacity lost to lower clocks."""

from __future__ import annotations

from analyzer import output_schema as out
from dashboards.builder import CELSIUS, COUNT, RATIO, PanelSpec, gpu_legend, q
from dashboards.queries import GPU_KEY, Dialect
from exporter import schema as S

KEY = "thermal"
TITLE = "Thermal"
DESCRIPTION = "GPU and HBM temperatures, thermal and power clock events, and the SM clock ratio " \
    "(capacity left after throttling)."


def panels(d: Dialect) -> list[PanelSpec]:
    gpu_t = d.sel(S.TEMPERATURE, sensor="gpu")
    mem_t = d.sel(S.TEMPERATURE, sensor="memory")
    thermal = d.clock_events(S.THERMAL_REASONS)
    power = d.clock_events(S.POWER_REASONS)
    specs = [
        PanelSpec("Hottest GPU", CELSIUS, [q(f"max({gpu_t})")], kind="stat", width=6, reduce="max"),
        PanelSpec("GPUs thermally throttled", COUNT,
                  [q(f"count(max by ({GPU_KEY}) ({thermal}) > 0) or vector(0)")], kind="stat", width=6,
                  reduce="max", description="GPUs with any of " + ", ".join(S.THERMAL_REASONS) + " active."),
        PanelSpec("GPUs power capped", COUNT,
                  [q(f"count(max by ({GPU_KEY}) ({power}) > 0) or vector(0)")], kind="stat", width=6,
                  reduce="max", description="GPUs with any of " + ", ".join(S.POWER_REASONS) + " active."),
        PanelSpec("Mean SM clock ratio", RATIO, [q(f"avg({d.clock_ratio()})")], kind="stat", width=6,
                  description="SM clock / max SM clock; below 1 is capacity lost to throttling."),
        PanelSpec("GPU temperature", CELSIUS, [q(f"max by ({GPU_KEY}) ({gpu_t})", gpu_legend())]),
        PanelSpec("HBM temperature", CELSIUS, [q(f"max by ({GPU_KEY}) ({mem_t})", gpu_legend())]),
        PanelSpec("Thermal clock events", COUNT,
                  [q(f"sum by (hostname, reason) ({thermal})", "{{hostname}} {{reason}}")], stacked=True,
                  description="GPUs per host with each thermal reason active."),
        PanelSpec("Power clock events", COUNT,
                  [q(f"sum by (hostname, reason) ({power})", "{{hostname}} {{reason}}")], stacked=True,
                  description="GPUs per host with each power reason active."),
        PanelSpec("SM clock ratio", RATIO, [q(d.clock_ratio(), gpu_legend())],
                  description="SM clock / max SM clock per GPU."),
        PanelSpec("Power / limit", RATIO,
                  [q(f"max by ({GPU_KEY}) ({d.sel(S.POWER)}) / max by ({GPU_KEY}) ({d.sel(S.POWER_LIMIT)})",
                     gpu_legend())]),
    ]
    if d.supports(S.NODE_INFO):
        node = S.NODE_INFO.name + '{hostname=~"$hostname"}'
        specs.append(PanelSpec(
            "Hottest GPU per rack", CELSIUS,
            [q(f"max by (rack) (max by (hostname) ({gpu_t}) * on(hostname) group_left(rack) {node})", "{{rack}}")],
            description="Max GPU temperature per rack (truegpu_node_info); a whole rack running hot "
                        "points at cooling, not at one GPU."))
    specs.append(PanelSpec("Thermal findings", COUNT,
                           [q(d.analyzer(out.FINDING_ACTIVE, kind="thermal"), "{{hostname}} gpu{{gpu}} {{severity}}")],
                           width=12 if d.supports(S.NODE_INFO) else 24))
    return specs
