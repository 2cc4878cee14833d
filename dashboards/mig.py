"""MIG: per-instance activity, memory and ownership on MIG-partitioned GPUs."""

from __future__ import annotations

from analyzer.detectors import kinds
from dashboards.builder import BYTES, COUNT, RATIO, TO_GPU, TO_JOB, PanelSpec, q
from dashboards.queries import Dialect
from exporter import schema as S

KEY = "mig"
TITLE = "MIG instances"
DESCRIPTION = "GPUs partitioned with Multi-Instance GPU: activity and memory per instance " \
    "(gpu_instance / mig_profile; dcgm-exporter: GPU_I_ID / GPU_I_PROFILE) and who holds each one."

LINKS = ("fleet", "node", "health", "job")
FINDINGS = tuple(kinds())  # every registered kind

INSTANCE = "{{hostname}} gpu{{gpu}} gi{{gpu_instance}} {{mig_profile}}"
_BY = (S.HOSTNAME, S.GPU, S.GPU_INSTANCE, S.MIG_PROFILE)


def _inst(d: Dialect, m: S.Metric) -> str:
    return d.agg("max", d.sel(m, mig=True, **{S.GPU_INSTANCE: "!="}), *_BY)


def panels(d: Dialect) -> list[PanelSpec]:
    specs = [
        PanelSpec("MIG instances", COUNT, [q(d.agg("count", _inst(d, S.MEMORY_USED)))], kind="stat", width=6,
                  reduce="lastNotNull", description="MIG instances of the selected GPUs."),
        PanelSpec("MIG instances per profile", COUNT,
                  [q(d.agg("count", _inst(d, S.MEMORY_USED), S.MIG_PROFILE), "{{mig_profile}}")], kind="stat",
                  width=18, reduce="lastNotNull", description="MIG instances per profile (slice size)."),
    ]
    for m, title in ((S.SM_ACTIVE, "SM active"), (S.SM_OCCUPANCY, "SM occupancy"),
                     (S.TENSOR_ACTIVE, "Tensor-core active"), (S.DRAM_ACTIVE, "DRAM active")):
        specs.append(PanelSpec(f"{title} per instance", RATIO, [q(_inst(d, m), INSTANCE)], description=m.help,
                               drill=(TO_GPU,)))
    specs += [
        PanelSpec("Memory used per instance", BYTES, [q(_inst(d, S.MEMORY_USED), INSTANCE)], drill=(TO_GPU,),
                  description=S.MEMORY_USED.help),
        PanelSpec("Memory used / instance size", RATIO,
                  [q(f"{_inst(d, S.MEMORY_USED)} / {_inst(d, S.MEMORY_TOTAL)}", INSTANCE)], drill=(TO_GPU,),
                  description="Device memory used over the instance's memory."),
        PanelSpec("Effective utilization per instance", RATIO,
                  [q(d.agg("max", d.effective(mig=True, **{S.GPU_INSTANCE: "!="}), *_BY), INSTANCE)],
                  description="Instance SM activity x the parent GPU's SM clock ratio.", drill=(TO_GPU,)),
        PanelSpec("Instances per namespace/workload", COUNT,
                  [q(d.agg("count", d.sel(S.MEMORY_USED, alloc=True, mig=True, gpu_instance="!="), "namespace",
                           S.WORKLOAD), "{{namespace}}/{{workload}}")], stacked=True, drill=(TO_JOB,),
                  description="MIG instances each workload holds (dcgm-exporter: each pod)."),
    ]
    return specs
