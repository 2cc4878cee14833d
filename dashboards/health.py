"""GPU health: XID, ECC, row remapping, NVLink and PCIe errors, and the analyzer's fault findings."""

from __future__ import annotations

from analyzer import findings as F
from analyzer import output_schema as out
from dashboards.builder import COUNT, NONE, PER_SECOND, TO_JOB, TO_NODE, PanelSpec, gpu_legend, q
from dashboards.queries import Dialect
from exporter import schema as S

KEY = "health"
TITLE = "GPU health"
DESCRIPTION = "Errors that mean a GPU or its links are failing: XID events, ECC and row remapping, " \
    "NVLink and PCIe errors, degraded PCIe links."
LINKS = ("fleet", "node", "thermal", "job")
FINDINGS = (F.GPU_FAULT, F.DEGRADED_GPU)
#: The fault-findings table also lists topology findings (a GPU's links).
_FAULT_KINDS = (*FINDINGS, F.TOPOLOGY)


def panels(d: Dialect) -> list[PanelSpec]:
    def _by_gpu(expr: str, *extra: str) -> str:
        return d.agg("max", expr, S.HOSTNAME, S.GPU, *extra)

    xid, meaning = d.xid()
    specs = [
        PanelSpec("XID errors over the range" if meaning == "events" else "Last XID code",
                  COUNT if meaning == "events" else NONE,
                  [q(xid, gpu_legend("xid {{xid}}") if meaning == "events" else gpu_legend())], width=12,
                  description=(S.XID_ERRORS.help + " Events per code over the dashboard range.")
                  if meaning == "events" else
                  "dcgm-exporter publishes the code of the last XID error seen (0 until one happens), "
                  "not a count per code; e.g. 79 = GPU fallen off the bus, 48 = double-bit ECC error."),
        PanelSpec("ECC errors over the range", COUNT,
                  [q(_by_gpu(d.increase(S.ECC_ERRORS, scope="volatile"), "type"), gpu_legend("{{type}}"))],
                  width=12, description=S.ECC_ERRORS.help),
        PanelSpec("Rows remapped over the range", COUNT,
                  [q(_by_gpu(d.increase(S.REMAPPED_ROWS), "type"), gpu_legend("{{type}}"))], width=8,
                  description=S.REMAPPED_ROWS.help + " Rows remapped within the dashboard range (a counter: "
                  "its increase, not its lifetime total)."),
        PanelSpec("Row remap pending / failed", NONE, [
            q(_by_gpu(d.sel(S.ROW_REMAP_PENDING)), gpu_legend("pending")),
            q(_by_gpu(d.sel(S.ROW_REMAP_FAILURE)), gpu_legend("failed")),
        ], width=8, description=f"{S.ROW_REMAP_PENDING.help} {S.ROW_REMAP_FAILURE.help}"),
        PanelSpec("PCIe replays", PER_SECOND, [q(_by_gpu(d.rate(S.PCIE_REPLAYS)), gpu_legend())], width=8,
                  description=S.PCIE_REPLAYS.help),
        PanelSpec("NVLink errors", PER_SECOND,
                  [q(_by_gpu(d.rate(S.NVLINK_ERRORS), "type"), gpu_legend("{{type}}"))], width=12,
                  description=S.NVLINK_ERRORS.help),
        PanelSpec("Degraded PCIe links (current / max)", NONE, [
            q(f"{_by_gpu(d.sel(S.PCIE_LINK_GENERATION, state='current'))} / "
              f"{_by_gpu(d.sel(S.PCIE_LINK_GENERATION, state='max'))}", gpu_legend("gen")),
            q(f"{_by_gpu(d.sel(S.PCIE_LINK_WIDTH, state='current'))} / "
              f"{_by_gpu(d.sel(S.PCIE_LINK_WIDTH, state='max'))}", gpu_legend("width")),
        ], width=12, description="Current over max PCIe generation and width; below 1 is a downgraded link "
                                 "(or an idle GPU saving power)."),
    ]
    if d.supports(S.NVLINK_LINKS):
        specs.append(PanelSpec("NVLink links down", COUNT,
                               [q(_by_gpu(d.sel(S.NVLINK_LINKS, state="down")), gpu_legend())], width=12,
                               description=S.NVLINK_LINKS.help))
    specs.append(PanelSpec(
        "Open fault findings", NONE,
        [q(d.analyzer(out.FINDING_SCORE, kind="=~" + "|".join(_FAULT_KINDS)), instant=True)],
        kind="table", width=12 if d.supports(S.NVLINK_LINKS) else 24, drill=(TO_NODE, TO_JOB),
        description=f"Analyzer findings of kind {', '.join(_FAULT_KINDS)} with their score (0..1)."))
    for spec in specs:
        if spec.queries[0].legend.startswith(gpu_legend()):
            spec.drill = (TO_NODE,)
    return specs
