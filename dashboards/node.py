"""Node and GPU drill-down: every contract metric per GPU of the selected hosts."""

from __future__ import annotations

from analyzer.detectors import kinds
from dashboards.builder import (
    BYTES,
    BYTES_PER_SECOND,
    CELSIUS,
    COUNT,
    HERTZ,
    NONE,
    PER_SECOND,
    RATIO,
    TO_GPU,
    WATTS,
    PanelSpec,
    gpu_legend,
    q,
    rate_unit,
)
from dashboards.queries import Dialect
from exporter import schema as S

KEY = "node"
TITLE = "Node and GPU drill-down"
DESCRIPTION = "Every exporter metric for the GPUs of the selected hosts: utilization, memory, power, clocks, " \
    "clock events, interconnect and errors."
LINKS = ("fleet", "health", "thermal", "job")
#: Every finding about a GPU or a node.
FINDINGS = tuple(kinds())  # every registered kind

_RATIOS = (S.GPU_UTILIZATION, S.SM_ACTIVE, S.SM_OCCUPANCY, S.TENSOR_ACTIVE, S.DRAM_ACTIVE,
           S.GRAPHICS_ENGINE_ACTIVE, S.MEMORY_UTILIZATION)


def panels(d: Dialect) -> list[PanelSpec]:
    def _by_gpu(expr: str, *extra: str) -> str:
        return d.agg("max", expr, S.HOSTNAME, S.GPU, *extra)

    specs = [
        PanelSpec("GPU identity", NONE, [q(d.gpu_identity(), instant=True)], kind="table", width=24, height=6,
                  description="Model and driver of each GPU (truegpu_gpu_info; dcgm-exporter: its labels)."),
        PanelSpec("Effective utilization", RATIO, [q(_by_gpu(d.effective()), gpu_legend())],
                  description="SM active x (SM clock / max SM clock)."),
        PanelSpec("Masking gap", RATIO, [q(d.masking_gap(), gpu_legend())],
                  description="GPU-Util minus SM activity."),
    ]
    for m in _RATIOS:
        specs.append(PanelSpec(_title(m), RATIO,
                               [q(_by_gpu(d.sel(m)), gpu_legend())], width=8, description=m.help))
    specs += [
        PanelSpec("Memory used", BYTES, [q(_by_gpu(d.sel(S.MEMORY_USED)), gpu_legend())], width=8,
                  description=S.MEMORY_USED.help),
        PanelSpec("Memory used / installed", RATIO,
                  [q(f"{_by_gpu(d.sel(S.MEMORY_USED))} / {_by_gpu(d.memory_total())}", gpu_legend())], width=8,
                  description=S.MEMORY_TOTAL.help),
        PanelSpec("Power and limit", WATTS, [
            q(_by_gpu(d.sel(S.POWER)), gpu_legend()),
            q(_by_gpu(d.sel(S.POWER_LIMIT)), gpu_legend("limit")),
        ], width=8, description=f"{S.POWER.help} {S.POWER_LIMIT.help}"),
        PanelSpec("Energy rate", rate_unit(S.ENERGY), [q(_by_gpu(d.rate(S.ENERGY)), gpu_legend())], width=8,
                  description="Rate of the energy counter: mean power over each interval."),
        PanelSpec("Temperature", CELSIUS, [q(_by_gpu(d.sel(S.TEMPERATURE), "sensor"), gpu_legend("{{sensor}}"))],
                  width=8, description=S.TEMPERATURE.help),
        PanelSpec("SM clock and max", HERTZ, [
            q(_by_gpu(d.sel(S.SM_CLOCK)), gpu_legend()),
            q(_by_gpu(d.sel(S.SM_CLOCK_MAX)), gpu_legend("max")),
        ], width=8, description=f"{S.SM_CLOCK.help} {S.SM_CLOCK_MAX.help}"),
        PanelSpec("Memory clock", HERTZ, [q(_by_gpu(d.sel(S.MEMORY_CLOCK)), gpu_legend())], width=8,
                  description=S.MEMORY_CLOCK.help),
        PanelSpec("Clock events active", COUNT,
                  [q(f"{d.agg('sum', d.clock_events(tuple(S.CLOCK_EVENT_REASONS.values())), S.HOSTNAME, 'reason')} > 0",
                     "{{hostname}} {{reason}}")], width=16, stacked=True,
                  description="GPUs per host with each clock-event (throttle) reason active. "
                              + S.CLOCK_EVENT_ACTIVE.help),
        PanelSpec("NVLink throughput", BYTES_PER_SECOND,
                  [q(d.throughput(S.NVLINK_BYTES, d.gpu_key), gpu_legend())], width=12,
                  description=S.NVLINK_BYTES.help),
        PanelSpec("PCIe throughput", BYTES_PER_SECOND,
                  [q(d.throughput(S.PCIE_BYTES, d.gpu_key), gpu_legend())], width=12, description=S.PCIE_BYTES.help),
        PanelSpec("PCIe link generation / width (current)", NONE, [
            q(_by_gpu(d.sel(S.PCIE_LINK_GENERATION, state="current")), gpu_legend("gen")),
            q(_by_gpu(d.sel(S.PCIE_LINK_WIDTH, state="current")), gpu_legend("width")),
        ], width=12, description=f"{S.PCIE_LINK_GENERATION.help} {S.PCIE_LINK_WIDTH.help}"),
        PanelSpec("PCIe replays", PER_SECOND, [q(_by_gpu(d.rate(S.PCIE_REPLAYS)), gpu_legend())], width=12,
                  description=S.PCIE_REPLAYS.help),
    ]
    xid, meaning = d.xid()
    specs += [
        PanelSpec("XID errors" if meaning == "events" else "Last XID code", COUNT if meaning == "events" else NONE,
                  [q(xid, gpu_legend("xid {{xid}}") if meaning == "events" else gpu_legend())], width=8,
                  description=S.XID_ERRORS.help if meaning == "events" else
                  "dcgm-exporter reports the code of the last XID error (0: none), not a count per code."),
        PanelSpec("ECC errors (volatile)", COUNT,
                  [q(_by_gpu(d.increase(S.ECC_ERRORS, scope="volatile"), "type"), gpu_legend("{{type}}"))], width=8,
                  description="Increase over the dashboard range. " + S.ECC_ERRORS.help),
        PanelSpec("NVLink errors", PER_SECOND,
                  [q(_by_gpu(d.rate(S.NVLINK_ERRORS), "type"), gpu_legend("{{type}}"))], width=8,
                  description=S.NVLINK_ERRORS.help),
    ]
    if d.supports(S.NVLINK_LINKS):
        specs.append(PanelSpec("NVLink links", COUNT,
                               [q(_by_gpu(d.sel(S.NVLINK_LINKS), "state"), gpu_legend("{{state}}"))], width=12,
                               description=S.NVLINK_LINKS.help))
    if d.supports(S.GPM_SUPPORTED):
        specs.append(PanelSpec("NVML GPM supported", NONE, [q(_by_gpu(d.sel(S.GPM_SUPPORTED)), gpu_legend())],
                               width=12, description=S.GPM_SUPPORTED.help))
    if d.supports(S.GPU_TOPOLOGY_INFO):
        specs.append(PanelSpec("GPU topology", NONE, [q(d.sel(S.GPU_TOPOLOGY_INFO), instant=True)], kind="table",
                               width=24, description=S.GPU_TOPOLOGY_INFO.help))
    # Every per-GPU series and table row opens that GPU's health.
    for spec in specs:
        if "gpu{{gpu}}" in spec.queries[0].legend or spec.kind == "table":
            spec.drill = (TO_GPU,)
    return specs


def _title(m: S.Metric) -> str:
    return {
        S.GPU_UTILIZATION: "GPU utilization (reported)",
        S.SM_ACTIVE: "SM active",
        S.SM_OCCUPANCY: "SM occupancy",
        S.TENSOR_ACTIVE: "Tensor-core active",
        S.DRAM_ACTIVE: "DRAM active",
        S.GRAPHICS_ENGINE_ACTIVE: "Graphics engine active",
        S.MEMORY_UTILIZATION: "Memory copy utilization",
    }[m]
