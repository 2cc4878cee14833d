"""MIG: per-instance activity, memory and ownership on MIG-partitioned GPUs."""

from __future__ import annotations

from dashboards.builder import BYTES, COUNT, RATIO, PanelSpec, q
from dashboards.queries import GPU_KEY, Dialect
from exporter import schema as S

KEY = "mig"
TITLE = "MIG instances"
DESCRIPTION = "GPUs partitioned with Multi-Instance GPU: activity and memory per instance " \
    "(gpu_instance / mig_profile; dcgm-exporter: GPU_I_ID / GPU_I_PROFILE) and who holds each one."

INSTANCE = "{{hostname}} gpu{{gpu}} gi{{gpu_instance}} {{mig_profile}}"
_BY = f"{GPU_KEY}, gpu_instance, mig_profile"


def _inst(d: Dialect, m: S.Metric) -> str:
    return f"max by ({_BY}) ({d.sel(m, mig=True, **{S.GPU_INSTANCE: '!='})})"


def panels(d: Dialect) -> list[PanelSpec]:
    specs = [
        PanelSpec("MIG instances", COUNT, [q(f"count({_inst(d, S.MEMORY_USED)})")], kind="stat", width=6,
                  reduce="lastNotNull"),
        PanelSpec("MIG instances per profile", COUNT,
                  [q(f"count by (mig_profile) ({_inst(d, S.MEMORY_USED)})", "{{mig_profile}}")], kind="stat",
                  width=18, reduce="lastNotNull"),
    ]
    for m, title in ((S.SM_ACTIVE, "SM active"), (S.SM_OCCUPANCY, "SM occupancy"),
                     (S.TENSOR_ACTIVE, "Tensor-core active"), (S.DRAM_ACTIVE, "DRAM active")):
        specs.append(PanelSpec(f"{title} per instance", RATIO, [q(_inst(d, m), INSTANCE)], description=m.help))
    specs += [
        PanelSpec("Memory used per instance", BYTES, [q(_inst(d, S.MEMORY_USED), INSTANCE)]),
        PanelSpec("Memory used / instance size", RATIO,
                  [q(f"{_inst(d, S.MEMORY_USED)} / {_inst(d, S.MEMORY_TOTAL)}", INSTANCE)]),
        PanelSpec("Effective utilization per instance", RATIO,
                  [q(f"max by ({_BY}) ({d.effective(mig=True, **{S.GPU_INSTANCE: '!='})})", INSTANCE)],
                  description="Instance SM activity x the parent GPU's SM clock ratio."),
        PanelSpec("Instances per namespace/job", COUNT,
                  [q(f"count by (namespace, job) ({d.sel(S.MEMORY_USED, alloc=True, mig=True, gpu_instance='!=')})",
                     "{{namespace}}/{{job}}")], stacked=True),
    ]
    return specs
