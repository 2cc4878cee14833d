"""promtool unit tests for the generated rules (written to ``alerts/tests/*_test.yaml``).

Every alert has a case where it fires, with its exact labels and rendered annotations, and
cases where it must not (PCIe downgraded but idle, an application XID is ``info`` not
``critical``, a throttled GPU is not "near" its limit, a whole node gone is not a GPU that
fell off the bus, ...). Every recording rule is checked by value. The expected texts below are
written out by hand from concrete values, never rendered from the rule templates.

One function per case (``<dialect>_<area>_case``); ``TRUEGPU_CASES``, ``DCGM_CASES`` (each run on
every dcgm-exporter :class:`Spelling`) and ``ANALYZER_CASES`` list them in file order.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from alerts.rules import (
    ALLOCATION_ALL,
    ALLOCATION_LABEL,
    ANALYZER_JOB,
    ANALYZER_STATE,
    DASHBOARD_BASE_URL,
    DCGM_FLEET_EFFECTIVE_UTILIZATION,
    DCGM_FLEET_MASKING_GAP,
    DCGM_GPU_EFFECTIVE_UTILIZATION,
    DCGM_GPU_MASKING_GAP,
    DCGM_GPU_SM_CLOCK_RATIO,
    DCGM_JOB,
    DCGM_NODE_EFFECTIVE_UTILIZATION,
    DCGM_NODE_MASKING_GAP,
    EXPORTER_JOB,
    FLEET_EFFECTIVE_UTILIZATION,
    FLEET_MASKING_GAP,
    GPU_EFFECTIVE_UTILIZATION,
    GPU_MASKING_GAP,
    GPU_MISSING,
    GPU_SM_CLOCK_RATIO,
    KUBE_GPU_RESOURCE,
    KUBE_NODE_CAPACITY,
    KUBE_NODE_LABEL,
    NODE_EFFECTIVE_UTILIZATION,
    NODE_MASKING_GAP,
    RUNBOOK_BASE_URL,
    UP,
    WORKLOAD_EFFECTIVE_UTILIZATION,
    WORKLOAD_MASKING_GAP,
    rule_files,
)
from analyzer import output_schema as O
from exporter import schema as S

HOST, HOST2 = "node-1", "node-2"
SENTINEL = "9223372036854775794"  # DCGM int64 NOT_SUPPORTED as old exporters print it
#: How dcgm GpuXidError from the last-XID gauge describes what it saw.
LAST_XID = "(the last XID the GPU reported changed within the last 10m)"

Labels = dict[str, str]
RECOVERY_TEXT = ("needs recovery action {} (1 gpu reset, 2 node reboot, 3 drain p2p, 4 drain and reset, 5 recover imex "
                 "domain, 6 bus reset, 7 system reboot): drain its work and do what the code says; the GPU cannot be "
                 "trusted until then.")


def series(name: str, labels: Labels, values: str) -> dict[str, str]:
    inner = ", ".join(f'{k}="{v}"' for k, v in labels.items())
    return {"series": f"{name}{{{inner}}}", "values": values}


def gpu(n: int, host: str = HOST, **extra: str) -> Labels:
    return {S.HOSTNAME: host, S.GPU: str(n), S.UUID: f"GPU-{host}-{n}", **extra}


def sm_series(labels: Labels, sm: str, clock_hz: str, max_hz: str = "2000000000", n: int = 10) -> list[dict[str, str]]:
    """A GPU's effective-utilization inputs (SM activity, SM clock, max SM clock), each held for ``n`` steps."""
    return [series(S.SM_ACTIVE.name, labels, f"{sm}x{n}"), series(S.SM_CLOCK.name, labels, f"{clock_hz}x{n}"),
            series(S.SM_CLOCK_MAX.name, labels, f"{max_hz}x{n}")]


def ref(n: int, host: str = HOST) -> str:
    return f"GPU {n} (GPU-{host}-{n}) on {host}"


def short(n: int, host: str = HOST) -> str:
    return f"GPU {n} of {host}"


def annotations(alert: str, summary: str, description: str, **extra: str) -> dict[str, str]:
    return {"summary": summary, "description": description, "runbook_url": f"{RUNBOOK_BASE_URL}/{alert}.md", **extra}


#: Dashboard key per alert and the variables its link fills (written out here, not taken from the rules).
_DASHBOARDS = {
    "GpuXidError": "health", "GpuUncorrectableEcc": "health", "GpuRowRemapFailure": "health",
    "GpuRecoveryActionRequired": "health",
    "GpuNvlinkErrors": "health", "GpuPcieLinkDowngraded": "health", "GpuFellOffBus": "health",
    "GpuMissing": "health", "GpuDegraded": "health", "GpuFault": "health", "GpuThermal": "thermal",
    "GpuThermalThrottling": "thermal",
    "GpuNearThermalLimit": "thermal", "GpuStraggler": "job", "GpuIdleMasking": "finops",
    "GpuIdleAllocated": "finops",
}
_VARS = {"health": ("hostname", "gpu"), "thermal": ("hostname", "gpu"), "job": ("namespace", S.WORKLOAD),
         "finops": ("namespace",), "fleet": ("hostname",)}


def expect(labels: Labels, severity: str, team: str, ann: dict[str, str], **extra: str) -> dict[str, Any]:
    """One expected alert; its ``dashboard_url`` opens the alert's dashboard on the alert's host, GPU or workload."""
    alert = ann["runbook_url"].rsplit("/", 1)[1].removesuffix(".md")
    got = {**labels, **extra}
    key = _DASHBOARDS.get(alert, "fleet")
    dialect = "dcgm" if got.get("dialect") == "dcgm" else "truegpu"
    params = "".join(f"&var-{v}={got[v]}" for v in ("cluster", *_VARS[key]) if got.get(v))
    url = f"{DASHBOARD_BASE_URL}/d/{dialect}-{key}?orgId=1{params}"
    return {"exp_labels": {**labels, "severity": severity, "team": team, **extra},
            "exp_annotations": {**ann, "dashboard_url": url}}


def check(at: str, alert: str, *alerts: dict[str, Any]) -> dict[str, Any]:
    return {"eval_time": at, "alertname": alert, "exp_alerts": list(alerts)}


def case(name: str, input_series: list[dict[str, str]], alerts: list[dict[str, Any]] = (),  # type: ignore[assignment]
         exprs: list[dict[str, Any]] = ()) -> dict[str, Any]:  # type: ignore[assignment]
    out: dict[str, Any] = {"name": name, "interval": "1m", "input_series": input_series}
    if alerts:
        out["alert_rule_test"] = list(alerts)
    if exprs:
        out["promql_expr_test"] = list(exprs)
    return out


def samples(expr: str, at: str, *rows: tuple[Labels, float]) -> dict[str, Any]:
    """A recording rule's series (named ``expr``) at ``at``."""
    return {"expr": expr, "eval_time": at, "exp_samples": [
        {"labels": expr + "{" + ", ".join(f'{k}="{v}"' for k, v in lab.items()) + "}", "value": v} for lab, v in rows
    ]}


def _dcgm_counters(alert: str, severity: str | None = None) -> dict[str, str]:
    """The static ``dcgm_counters`` annotation of a dcgm rule (not a template: taken from the rule)."""
    dcgm = next(f for f in rule_files() if f.name == "dcgm.yaml")
    for a in dcgm.alerts():
        if a.alert == alert and (severity is None or a.severity == severity) and a.non_default_fields:
            return {"dcgm_counters": "needs dcgm-exporter counters beyond the default list: "
                    + ", ".join(a.non_default_fields)}
    return {}


# truegpu dialect -------------------------------------------------------------------------
def truegpu_recording_case() -> dict[str, Any]:
    """Every recording rule by value, with a MIG GPU and a GPU whose SM activity is unknown."""
    mig1 = {S.GPU_INSTANCE: "1", S.MIG_PROFILE: "3g.40gb"}
    mig2 = {S.GPU_INSTANCE: "2", S.MIG_PROFILE: "3g.40gb"}
    train = {"namespace": "ml", "pod": "train-0", "container": "main", S.WORKLOAD: "train"}
    serve = {"namespace": "inf", "pod": "serve-0", "container": "main", S.WORKLOAD: "serve"}
    return case("recording rules: effective utilization and masking gap at every level", [
        *sm_series(gpu(0), "0.5", "1500000000"),
        series(S.GPU_UTILIZATION.name, gpu(0), "0.9x10"),
        series(S.GPU_ALLOCATION_INFO.name, gpu(0, **train), "1x10"),
        *sm_series(gpu(1), "0.25", "2000000000"),
        series(S.GPU_UTILIZATION.name, gpu(1), "0.75x10"),
        # a MIG GPU: SM activity per instance, no GPU utilization, clocks per GPU
        series(S.SM_ACTIVE.name, gpu(2, **mig1), "0.6x10"),
        series(S.SM_ACTIVE.name, gpu(2, **mig2), "0.4x10"),
        series(S.SM_CLOCK.name, gpu(2), "1000000000x10"),
        series(S.SM_CLOCK_MAX.name, gpu(2), "2000000000x10"),
        series(S.GPU_ALLOCATION_INFO.name, gpu(2, **mig1, **serve), "1x10"),
        # clocks without SM activity: effective utilization unknown, never 0
        series(S.SM_CLOCK.name, gpu(3), "2000000000x10"),
        series(S.SM_CLOCK_MAX.name, gpu(3), "2000000000x10"),
    ], exprs=[
        samples(GPU_SM_CLOCK_RATIO, "5m", (gpu(0), 0.75), (gpu(1), 1), (gpu(2), 0.5), (gpu(3), 1)),
        samples(GPU_EFFECTIVE_UTILIZATION, "5m", (gpu(0), 0.375), (gpu(1), 0.25), (gpu(2, **mig1), 0.3),
                (gpu(2, **mig2), 0.2)),
        samples(GPU_MASKING_GAP, "5m", (gpu(0), 0.4), (gpu(1), 0.5)),
        samples(NODE_EFFECTIVE_UTILIZATION, "5m", ({S.HOSTNAME: HOST}, 0.28125)),
        samples(NODE_MASKING_GAP, "5m", ({S.HOSTNAME: HOST}, 0.45)),
        samples(WORKLOAD_EFFECTIVE_UTILIZATION, "5m", ({"namespace": "ml", S.WORKLOAD: "train"}, 0.375),
                ({"namespace": "inf", S.WORKLOAD: "serve"}, 0.3)),
        samples(WORKLOAD_MASKING_GAP, "5m", ({"namespace": "ml", S.WORKLOAD: "train"}, 0.4)),
        samples(FLEET_EFFECTIVE_UTILIZATION, "5m", ({"allocation": "all"}, 0.28125),
                ({"allocation": "allocated"}, 0.3375)),
        samples(FLEET_MASKING_GAP, "5m", ({"allocation": "all"}, 0.45), ({"allocation": "allocated"}, 0.4)),
    ])


def truegpu_shared_case() -> dict[str, Any]:
    """A time-sliced GPU: both holders' workloads get its effective utilization (allocation info names one)."""
    sharer = S.SHARER_UTILIZATION.name
    a = {"namespace": "serving", "pod": "chat-a-0", "container": "vllm", S.WORKLOAD: "chat-a"}
    b = {**a, "pod": "chat-b-0", S.WORKLOAD: "chat-b"}
    nobody = {"namespace": "", "pod": "", "container": "", S.WORKLOAD: ""}
    return case("recording rules: every holder of a shared GPU, never the unattributed one", [
        *sm_series(gpu(0), "0.4", "2000000000"),
        series(S.GPU_UTILIZATION.name, gpu(0), "0.8x10"),
        series(S.GPU_ALLOCATION_INFO.name, gpu(0, **a), "1x10"),
        series(sharer, gpu(0, **a), "0.5x10"),
        series(sharer, gpu(0, **b), "0x10"),  # held, idle this while: still a holder
        series(sharer, gpu(0, **nobody), "0.1x10"),
    ], exprs=[
        samples(WORKLOAD_EFFECTIVE_UTILIZATION, "5m", ({"namespace": "serving", S.WORKLOAD: "chat-a"}, 0.4),
                ({"namespace": "serving", S.WORKLOAD: "chat-b"}, 0.4)),
    ])


def truegpu_xid_case() -> dict[str, Any]:
    """GpuXidError by XID class, from the per-code counters."""
    xid = S.XID_ERRORS.name
    return case("GpuXidError: severity by XID class; a counter that starts at 1 counts", [
        series(xid, gpu(0, xid="79"), "0 0 1x30"),
        series(xid, gpu(1, xid="63"), "0 0 1x30"),
        series(xid, gpu(2, xid="13"), "0 0 1x30"),   # application XID: info, never critical
        series(xid, gpu(3, xid="48"), "_ _ _ 1x30"),  # first seen already at 1
        series(xid, gpu(4, xid="48"), "0x32"),        # never happened
    ], alerts=[
        check("5m", "GpuXidError",
              expect(gpu(0, xid="79"), "critical", "training", annotations(
                  "GpuXidError", f"Critical XID 79 on {short(0)}",
                  f"{ref(0)} reported 1 XID 79 event(s) in the last 10m: the GPU cannot be trusted until it is "
                  "drained and reset.")),
              expect(gpu(1, xid="63"), "warning", "training", annotations(
                  "GpuXidError", f"XID 63 on {short(1)}",
                  f"{ref(1)} reported 1 XID 63 event(s) in the last 10m: a driver or hardware error, see the "
                  "runbook's XID table.")),
              expect(gpu(2, xid="13"), "info", "training", annotations(
                  "GpuXidError", f"Application XID 13 on {short(2)}",
                  f"{ref(2)} reported 1 XID 13 event(s) in the last 10m: usually the job's own bug (illegal memory "
                  "access, kernel exception); the GPU itself is fine.")),
              expect(gpu(3, xid="48"), "critical", "training", annotations(
                  "GpuXidError", f"Critical XID 48 on {short(3)}",
                  f"{ref(3)} reported 1 XID 48 event(s) in the last 10m: the GPU cannot be trusted until it is "
                  "drained and reset."))),
        check("25m", "GpuXidError"),  # no new event in the last 10m
    ])


def truegpu_owner_case() -> dict[str, Any]:
    """Hardware alerts name the GPU's holder where there is one."""
    xid = S.XID_ERRORS.name
    alloc = S.GPU_ALLOCATION_INFO.name
    held = {"namespace": "serving", "pod": "chat-0", "container": "vllm", S.WORKLOAD: "chat"}
    return case("Hardware alerts carry who holds the GPU (one holder of a MIG-split GPU); others as they are", [
        series(alloc, gpu(0, **held), "1x30"),
        series(alloc, gpu(1, gpu_instance="1", mig_profile="3g.40gb", **held), "1x30"),
        series(alloc, gpu(1, gpu_instance="2", mig_profile="3g.40gb", **{**held, "pod": "chat-1"}), "1x30"),
        series(xid, gpu(0, xid="79"), "0 0 1x30"),
        series(xid, gpu(0, xid="13"), "0 0 1x30"),    # two codes on one held GPU: both alerts keep the owner
        series(xid, gpu(1, xid="79"), "0 0 1x30"),
        series(xid, gpu(2, xid="79"), "0 0 1x30"),    # nobody holds GPU 2
    ], alerts=[
        check("5m", "GpuXidError", *(
            expect(gpu(n, xid="79", **extra), "critical", "training", annotations(
                "GpuXidError", f"Critical XID 79 on {short(n)}",
                f"{ref(n)} reported 1 XID 79 event(s) in the last 10m: the GPU cannot be trusted until it is "
                "drained and reset."))
            for n, extra in ((0, {"namespace": "serving", S.WORKLOAD: "chat"}),
                             (1, {"namespace": "serving", S.WORKLOAD: "chat"}),
                             (2, {}))),
              expect(gpu(0, xid="13", namespace="serving", workload="chat"), "info", "training", annotations(
                  "GpuXidError", f"Application XID 13 on {short(0)}",
                  f"{ref(0)} reported 1 XID 13 event(s) in the last 10m: usually the job's own bug (illegal memory "
                  "access, kernel exception); the GPU itself is fine."))),
        check("25m", "GpuXidError"),
    ])


def truegpu_ecc_case() -> dict[str, Any]:
    """GpuUncorrectableEcc: uncorrectable errors page, correctable ones do not."""
    ecc = S.ECC_ERRORS.name
    return case("GpuUncorrectableEcc: uncorrectable errors or rows fire, correctable ones do not", [
        series(ecc, gpu(0, type="uncorrectable", scope="volatile"), "0 0 1x20"),
        series(S.REMAPPED_ROWS.name, gpu(1, type="uncorrectable"), "0 0 1x20"),
        series(ecc, gpu(2, type="correctable", scope="volatile"), "0 5 10 15x20"),
        series(ecc, gpu(2, type="uncorrectable", scope="volatile"), "0x22"),
    ], alerts=[
        check("5m", "GpuUncorrectableEcc", *(
            expect(gpu(n), "critical", "training", annotations(
                "GpuUncorrectableEcc", f"Uncorrectable ECC error on {short(n)}",
                f"{ref(n)} had 1 uncorrectable memory error(s) in the last 10m: drain the GPU and reset it to apply "
                "the row remap.")) for n in (0, 1))),
        check("20m", "GpuUncorrectableEcc"),
    ])


def truegpu_remap_case() -> dict[str, Any]:
    """GpuRowRemapFailure."""
    return case("GpuRowRemapFailure", [
        series(S.ROW_REMAP_FAILURE.name, gpu(0), "0 1x5"),
        series(S.ROW_REMAP_FAILURE.name, gpu(1), "0x5"),
    ], alerts=[
        check("0m", "GpuRowRemapFailure"),
        check("2m", "GpuRowRemapFailure", expect(gpu(0), "critical", "training", annotations(
            "GpuRowRemapFailure", f"Row remapping failed on {short(0)}",
            f"{ref(0)} has no spare HBM rows left to remap memory errors: drain it and RMA it."))),
    ])


def truegpu_recovery_case() -> dict[str, Any]:
    """GpuRecoveryActionRequired."""
    return case("GpuRecoveryActionRequired: the driver asks for a drain and reset", [
        series(S.GPU_RECOVERY_ACTION.name, gpu(0), "0 4x5"),
        series(S.GPU_RECOVERY_ACTION.name, gpu(1), "0x5"),
    ], alerts=[
        check("0m", "GpuRecoveryActionRequired"),
        check("2m", "GpuRecoveryActionRequired", expect(gpu(0), "critical", "training", annotations(
            "GpuRecoveryActionRequired", f"GPU recovery action 4 required on {short(0)}",
            f"{ref(0)} {RECOVERY_TEXT.format(4)}"))),
    ])


def truegpu_thermal_case() -> dict[str, Any]:
    """GpuThermalThrottling (reasons, or temperatures where reasons are missing) and GpuNearThermalLimit."""
    ev, temp = S.CLOCK_EVENT_ACTIVE.name, S.TEMPERATURE.name
    return case("GpuThermalThrottling and GpuNearThermalLimit", [
        # GPU 0 throttles for heat all along: throttling, not "near the limit"
        series(ev, gpu(0, reason="sw_thermal"), "1x20"),
        series(S.SM_CLOCK.name, gpu(0), "1200000000x20"),
        series(S.SM_CLOCK_MAX.name, gpu(0), "2000000000x20"),
        series(temp, gpu(0, sensor="gpu"), "88x20"),
        # GPU 1 is power-capped: not a thermal problem
        series(ev, gpu(1, reason="sw_power_cap"), "1x20"),
        series(S.SM_CLOCK.name, gpu(1), "1500000000x20"),
        series(S.SM_CLOCK_MAX.name, gpu(1), "2000000000x20"),
        # GPU 2 throttles 5 minutes only
        series(ev, gpu(2, reason="hw_thermal"), "1x4 0x16"),
        series(S.SM_CLOCK.name, gpu(2), "1500000000x20"),
        series(S.SM_CLOCK_MAX.name, gpu(2), "2000000000x20"),
        # GPU 3 hot die, GPU 4 hot HBM, GPU 5 warm: no clocks, no throttle reasons
        series(temp, gpu(3, sensor="gpu"), "84x20"),
        series(temp, gpu(4, sensor="gpu"), "70x20"),
        series(temp, gpu(4, sensor="memory"), "92x20"),
        series(temp, gpu(5, sensor="gpu"), "80x20"),
        series(temp, gpu(5, sensor="memory"), "85x20"),
        # GPU 6: throttle reasons not collected, die at the 85 C limit: throttling, as the detector reads it
        series(S.SM_CLOCK.name, gpu(6), "1500000000x20"),
        series(S.SM_CLOCK_MAX.name, gpu(6), "2000000000x20"),
        series(temp, gpu(6, sensor="gpu"), "86x20"),
    ], alerts=[
        check("0m", "GpuThermalThrottling"),
        check("3m", "GpuThermalThrottling", *(expect(gpu(n), "critical", "sre", annotations(
            "GpuThermalThrottling", f"Thermal throttling on {short(n)}",
            f"{ref(n)} has been slowed down for heat for 1m (a thermal clock-event reason, or where those are not "
            f"collected the die at 85 C or HBM at 95 C or more); its SM clock is at {pct} of maximum."))
            for n, pct in ((0, "60%"), (2, "75%"), (6, "75%")))),
        check("6m", "GpuThermalThrottling", *(expect(gpu(n), "critical", "sre", annotations(
            "GpuThermalThrottling", f"Thermal throttling on {short(n)}",
            f"{ref(n)} has been slowed down for heat for 1m (a thermal clock-event reason, or where those are not "
            f"collected the die at 85 C or HBM at 95 C or more); its SM clock is at {pct} of maximum."))
            for n, pct in ((0, "60%"), (6, "75%")))),
        check("4m", "GpuNearThermalLimit"),
        check("6m", "GpuNearThermalLimit",
              expect(gpu(3, sensor="gpu"), "warning", "facilities", annotations(
                  "GpuNearThermalLimit", f"GPU gpu temperature near its limit on {short(3)}",
                  f"{ref(3)}: gpu temperature 84 C for 5m, close to thermal slowdown; check airflow and inlet "
                  "temperature of the rack.")),
              expect(gpu(4, sensor="memory"), "warning", "facilities", annotations(
                  "GpuNearThermalLimit", f"GPU memory temperature near its limit on {short(4)}",
                  f"{ref(4)}: memory temperature 92 C for 5m, close to thermal slowdown; check airflow and inlet "
                  "temperature of the rack."))),
    ])


def truegpu_nvlink_case() -> dict[str, Any]:
    """GpuNvlinkErrors: growing errors only."""
    nvl = S.NVLINK_ERRORS.name
    return case("GpuNvlinkErrors: errors that keep growing", [
        series(nvl, gpu(0, type="replay"), "0+1x30"),
        series(nvl, gpu(0, type="crc_flit"), "0x30"),
        series(nvl, gpu(1, type="replay"), "5x30"),
        series(nvl, gpu(2, type="recovery"), "0 1 2 2x28"),  # a short burst, then quiet
    ], alerts=[
        check("9m", "GpuNvlinkErrors"),
        check("20m", "GpuNvlinkErrors", expect(gpu(0), "warning", "training", annotations(
            "GpuNvlinkErrors", f"NVLink errors on {short(0)}",
            f"{ref(0)} keeps logging NVLink errors (10 in the last 10m): collectives over this GPU slow down or "
            "fail."))),
    ])


def truegpu_pcie_case() -> dict[str, Any]:
    """GpuPcieLinkDowngraded: only while busy."""
    gen, width, util = S.PCIE_LINK_GENERATION.name, S.PCIE_LINK_WIDTH.name, S.GPU_UTILIZATION.name
    return case("GpuPcieLinkDowngraded: only while busy", [
        series(gen, gpu(0, state="current"), "3x20"),
        series(gen, gpu(0, state="max"), "5x20"),
        series(util, gpu(0), "0.9x20"),
        series(gen, gpu(1, state="current"), "1x20"),   # idle GPU saving power: fine
        series(gen, gpu(1, state="max"), "5x20"),
        series(util, gpu(1), "0x20"),
        series(width, gpu(2, state="current"), "8x20"),
        series(width, gpu(2, state="max"), "16x20"),
        series(util, gpu(2), "0.95x20"),
        series(gen, gpu(3, state="current"), "5x20"),   # busy at full speed
        series(gen, gpu(3, state="max"), "5x20"),
        series(util, gpu(3), "0.9x20"),
    ], alerts=[
        check("9m", "GpuPcieLinkDowngraded"),
        check("15m", "GpuPcieLinkDowngraded",
              expect(gpu(0, link="generation"), "warning", "training", annotations(
                  "GpuPcieLinkDowngraded", f"PCIe link downgraded on busy {short(0)}",
                  f"{ref(0)} runs its PCIe link at generation 3, below its maximum, while busy: host-device "
                  "transfers are slower.")),
              expect(gpu(2, link="width"), "warning", "training", annotations(
                  "GpuPcieLinkDowngraded", f"PCIe link downgraded on busy {short(2)}",
                  f"{ref(2)} runs its PCIe link at width 8, below its maximum, while busy: host-device "
                  "transfers are slower."))),
    ])


def truegpu_fell_off_bus_case() -> dict[str, Any]:
    """GpuFellOffBus: one GPU gone, not a whole node."""
    info, node = S.GPU_INFO.name, S.NODE_INFO.name
    ident = {"model": "H100", "driver_version": "550.90.07", "pci_bus_id": "0000:18:00.0", "numa_node": "0"}
    return case("GpuFellOffBus: one GPU gone while its node reports; a whole node gone is not it", [
        series(node, {S.HOSTNAME: HOST, "site": "dc1", "rack": "r1"}, "1x30"),
        series(info, gpu(0, **ident), "1x30"),
        series(info, gpu(1, **ident), "1x9 stale"),
        series(node, {S.HOSTNAME: HOST2, "site": "dc1", "rack": "r1"}, "1x9 stale"),
        series(info, gpu(0, HOST2, **ident), "1x9 stale"),
    ], alerts=[
        check("9m", "GpuFellOffBus"),
        check("12m", "GpuFellOffBus", expect(gpu(1), "critical", "training", annotations(
            "GpuFellOffBus", f"{short(1)} fell off the bus",
            f"{ref(1)} stopped reporting while its node's exporter is up: the GPU is lost (XID 79 or similar); "
            "drain the node and reset or reseat the GPU."))),
    ])


def truegpu_exporter_down_case() -> dict[str, Any]:
    """TruegpuExporterDown, with the host when known."""
    node = S.NODE_INFO.name
    exp = {"job": EXPORTER_JOB}
    return case("TruegpuExporterDown: down targets, with the hostname they served when known", [
        series(UP, {**exp, "instance": "n1:9835"}, "1x9 0x20"),
        series(node, {**exp, "instance": "n1:9835", S.HOSTNAME: HOST, "site": "dc1", "rack": "r1"}, "1x9 stale"),
        series(UP, {**exp, "instance": "n2:9835"}, "1x30"),
        series(node, {**exp, "instance": "n2:9835", S.HOSTNAME: HOST2, "site": "dc1", "rack": "r1"}, "1x30"),
        series(UP, {**exp, "instance": "n3:9835"}, "0x30"),  # never scraped: no hostname to tell
    ], alerts=[
        check("3m", "TruegpuExporterDown"),
        check("20m", "TruegpuExporterDown",
              expect({**exp, "instance": "n1:9835", S.HOSTNAME: HOST}, "warning", "sre", annotations(
                  "TruegpuExporterDown", "Exporter n1:9835 is down",
                  f"Prometheus cannot scrape n1:9835 (job {EXPORTER_JOB}, host {HOST}) for 5m: the GPUs there are "
                  "unobserved.")),
              expect({**exp, "instance": "n3:9835"}, "warning", "sre", annotations(
                  "TruegpuExporterDown", "Exporter n3:9835 is down",
                  f"Prometheus cannot scrape n3:9835 (job {EXPORTER_JOB}) for 5m: the GPUs there are "
                  "unobserved."))),
    ])


def truegpu_missing_case() -> dict[str, Any]:
    """GpuMissing on truegpu's memory series."""
    return missing_case(S.MEMORY_USED.name, gpu, S.GPU_INSTANCE, {})


def truegpu_collection_case() -> dict[str, Any]:
    """TruegpuCollectionFailing, -Stale and -Slow, per source."""
    exp, node = {"job": EXPORTER_JOB}, S.NODE_INFO.name
    n1, n2 = {**exp, "instance": "n1:9835"}, {**exp, "instance": "n2:9835"}
    return case("Collection failing, stale and slow: by source, on the exporter's node", [
        series(node, {**n1, S.HOSTNAME: HOST, "site": "dc1", "rack": "r1"}, "1x40"),
        series(S.SOURCE_UP.name, {**n1, "source": "nvml"}, "1x4 0x35"),       # a GPU lost / NVML failing
        series(S.SOURCE_UP.name, {**n1, "source": "dcgm"}, "1x40"),
        series(S.SOURCE_STALE.name, {**n1, "source": "dcgm"}, "0x4 1x35"),     # dcgm-exporter hangs
        series(S.COLLECT_DURATION.name, {**n1, "source": "dcgm"}, "0.2x4 3x35"),
        series(S.SOURCE_UP.name, {**n2, "source": "nvml"}, "0x40"),            # no node_info: still paged
        series(S.COLLECT_DURATION.name, {**n2, "source": "nvml"}, "2x40"),     # under half the deadline
    ], alerts=[
        check("3m", "TruegpuCollectionStale"),
        check("10m", "TruegpuCollectionStale",
              expect({**n1, "source": "dcgm", S.HOSTNAME: HOST}, "warning", "sre", annotations(
                  "TruegpuCollectionStale", f"GPU telemetry stale on {HOST}",
                  f"The source dcgm of the exporter on {HOST} (n1:9835) overruns its deadline and serves its last "
                  "good values for 5m: the data is old (a hung NVML call or a slow dcgm-exporter)."))),
        check("10m", "TruegpuCollectionFailing"),
        check("25m", "TruegpuCollectionFailing",
              expect({**n1, "source": "nvml", S.HOSTNAME: HOST}, "warning", "sre", annotations(
                  "TruegpuCollectionFailing", f"GPU telemetry collection failing on {HOST}",
                  f"The source nvml of the exporter on {HOST} (n1:9835) has not collected everything for 15m (a lost "
                  "GPU, NVML errors, or dcgm-exporter unreachable): truegpu_exporter_errors_total says which; those "
                  "GPUs are unknown.")),
              expect({**n2, "source": "nvml"}, "warning", "sre", annotations(
                  "TruegpuCollectionFailing", "GPU telemetry collection failing on ",
                  "The source nvml of the exporter on  (n2:9835) has not collected everything for 15m (a lost "
                  "GPU, NVML errors, or dcgm-exporter unreachable): truegpu_exporter_errors_total says which; those "
                  "GPUs are unknown."))),
        check("15m", "TruegpuCollectionSlow"),
        check("25m", "TruegpuCollectionSlow",
              expect({**n1, "source": "dcgm", S.HOSTNAME: HOST}, "info", "sre", annotations(
                  "TruegpuCollectionSlow", f"GPU telemetry collection slow on {HOST}",
                  f"The source dcgm of the exporter on {HOST} (n1:9835) takes 3s per collection for 15m, more than "
                  "half of its 5 s deadline."))),
    ])


def clusters_case() -> dict[str, Any]:
    """Two clusters in one Prometheus (Thanos, Mimir) with the same host names and GPU ids: every
    grouping keeps ``cluster``, so node and fleet series stay apart and cluster a's missing GPU is
    not hidden by cluster b's complete node (without it the counts merge: 7 report, 4 expected)."""
    cap = {"job": "kube-state-metrics", "resource": KUBE_GPU_RESOURCE, "unit": "integer"}
    inputs = [series(KUBE_NODE_CAPACITY, {**cap, KUBE_NODE_LABEL: HOST, "cluster": c}, "4x30") for c in "ab"]
    for c, n_gpus, sm in (("a", 3, "0.3"), ("b", 4, "0.6")):
        for n in range(n_gpus):
            inputs += [series(S.MEMORY_USED.name, gpu(n, cluster=c), "1x30"),
                       *sm_series(gpu(n, cluster=c), sm, "1980000000", "1980000000", 30)]
    return case("Two clusters, same host names: recording rules and GpuMissing per cluster", inputs, alerts=[
        check("20m", GPU_MISSING, expect({KUBE_NODE_LABEL: HOST, S.HOSTNAME: HOST, "cluster": "a"}, "critical",
                                         "training", annotations(
            GPU_MISSING, f"1 GPU(s) missing on {HOST}",
            f"Kubernetes counts more GPUs on {HOST} than report from it for 15m (1 missing): a GPU lost before "
            "Prometheus saw it, or long ago (nvidia-smi on the node lists what the driver sees); drain the node "
            "and reset or reseat it."))),
    ], exprs=[
        samples(NODE_EFFECTIVE_UTILIZATION, "5m", ({"cluster": "a", S.HOSTNAME: HOST}, 0.3),
                ({"cluster": "b", S.HOSTNAME: HOST}, 0.6)),
        samples(FLEET_EFFECTIVE_UTILIZATION, "5m", ({ALLOCATION_LABEL: ALLOCATION_ALL, "cluster": "a"}, 0.3),
                ({ALLOCATION_LABEL: ALLOCATION_ALL, "cluster": "b"}, 0.6)),
    ])


def missing_case(metric: str, gpu_labels: Any, instance_label: str, extra: Labels) -> dict[str, Any]:
    """GpuMissing: Kubernetes' GPU capacity above what reports (node-1 lost one GPU); a node whose
    exporter is down (node-4), a complete node (node-2) and a MIG node whose device plugin counts
    instances as GPUs (node-3) do not page."""
    cap = {"job": "kube-state-metrics", "resource": KUBE_GPU_RESOURCE, "unit": "integer"}
    inputs = [series(KUBE_NODE_CAPACITY, {**cap, KUBE_NODE_LABEL: h}, f"{n}x30")
              for h, n in (("node-1", 4), ("node-2", 2), ("node-3", 2), ("node-4", 2))]
    inputs += [series(metric, gpu_labels(n, "node-1"), "1x30") for n in range(3)]
    inputs += [series(metric, gpu_labels(n, "node-2"), "1x30") for n in range(2)]
    inputs += [series(metric, gpu_labels(0, "node-3", **{instance_label: str(i)}), "1x30") for i in (1, 2)]
    return case("GpuMissing: fewer GPUs report than Kubernetes counts", inputs, alerts=[
        check("10m", GPU_MISSING),
        check("20m", GPU_MISSING, expect({KUBE_NODE_LABEL: "node-1", S.HOSTNAME: "node-1", **extra}, "critical",
                                         "training", annotations(
            GPU_MISSING, "1 GPU(s) missing on node-1",
            "Kubernetes counts more GPUs on node-1 than report from it for 15m (1 missing): a GPU lost before "
            "Prometheus saw it, or long ago (nvidia-smi on the node lists what the driver sees); drain the node "
            "and reset or reseat it."))),
    ])


#: truegpu_test.yaml's cases, in file order.
TRUEGPU_CASES: tuple[Callable[[], dict[str, Any]], ...] = (
    truegpu_recording_case, truegpu_shared_case, truegpu_xid_case, truegpu_owner_case, truegpu_ecc_case,
    truegpu_remap_case, truegpu_recovery_case, truegpu_thermal_case, truegpu_nvlink_case, truegpu_pcie_case,
    truegpu_fell_off_bus_case, truegpu_missing_case, truegpu_exporter_down_case, truegpu_collection_case,
    clusters_case,
)


def truegpu_tests() -> list[dict[str, Any]]:
    """``truegpu_test.yaml``: every case of the truegpu rules."""
    return [make() for make in TRUEGPU_CASES]


# dcgm-exporter dialect --------------------------------------------------------------------
@dataclass(frozen=True)
class Spelling:
    """How a dcgm-exporter release spells its series: every dcgm rule is tested on each."""

    suffix: str
    #: The host label (``Hostname`` before dcgm-exporter renamed it, ``hostname`` since).
    host: str
    #: The UUID label (``uuid`` in 1.x) and whether field names are the 1.x lower-case ones.
    uuid: str = "UUID"
    lower: bool = False

    def name(self, field_name: str) -> str:
        return field_name.lower() if self.lower else field_name

    def gpu(self, n: int, host: str = HOST, **extra: str) -> Labels:
        return {S.GPU: str(n), self.uuid: f"GPU-{host}-{n}", self.host: host, **extra}

    def normalized(self, labels: Labels) -> Labels:
        """The labels after the rules' normalization: ``hostname`` and ``UUID`` whatever the spelling."""
        out = dict(labels)
        out[S.HOSTNAME] = labels.get(self.host, labels.get(S.HOSTNAME, ""))
        out["UUID"] = labels.get(self.uuid, labels.get("UUID", ""))
        return out

    def field(self, metric: S.Metric, **labels: str) -> str:
        """The series name of ``metric``'s dcgm field with these labels (``type="uncorrectable"``)."""
        return self.name(metric.dcgm_field(**labels).field)

    def alerted(self, labels: Labels, **extra: str) -> Labels:
        """Alert labels of a dcgm rule: the series' labels, normalized, and the dialect."""
        return {**self.normalized(labels), "dialect": "dcgm", **extra}

    def keys(self, labels: Labels) -> Labels:
        """The (hostname, gpu, UUID) key the per-GPU rules group by."""
        n = self.normalized(labels)
        return {k: n[k] for k in (S.HOSTNAME, S.GPU, "UUID")}


SPELLINGS = (
    Spelling("", "Hostname"),                         # dcgm-exporter before the hostname rename
    Spelling("_hostname", S.HOSTNAME),                 # current dcgm-exporter
    Spelling("_1x", S.HOSTNAME, uuid="uuid", lower=True),  # 1.x lower-case names and uuid
)


def dcgm_recording_case(sp: Spelling) -> dict[str, Any]:
    """Every dcgm recording rule by value (percent, MHz, MIG)."""
    sm, clk, clk_max, util = (sp.field(m) for m in (S.SM_ACTIVE, S.SM_CLOCK, S.SM_CLOCK_MAX, S.GPU_UTILIZATION))
    pod = {"namespace": "ml", "pod": "train-0", "container": "main"}
    mig = {"GPU_I_PROFILE": "3g.40gb", "GPU_I_ID": "1"}
    return case("dcgm recording rules (percent GPU util, MHz clocks, MIG clocks per instance)", [
        series(sm, sp.gpu(0, **pod), "0.5x10"),
        series(clk, sp.gpu(0, **pod), "1500x10"),
        series(clk_max, sp.gpu(0, **pod), "2000x10"),
        series(util, sp.gpu(0, **pod), "90x10"),
        series(sm, sp.gpu(1, **mig), "0.4x10"),
        series(clk, sp.gpu(1, **mig), "1000x10"),
        series(clk, sp.gpu(1, GPU_I_PROFILE="3g.40gb", GPU_I_ID="2"), "1000x10"),
        series(clk_max, sp.gpu(1, **mig), "2000x10"),
    ], exprs=[
        samples(DCGM_GPU_SM_CLOCK_RATIO, "5m", (sp.keys(sp.gpu(0)), 0.75), (sp.keys(sp.gpu(1)), 0.5)),
        samples(DCGM_GPU_EFFECTIVE_UTILIZATION, "5m", (sp.normalized(sp.gpu(0, **pod)), 0.375),
                (sp.normalized(sp.gpu(1, **mig)), 0.2)),
        samples(DCGM_GPU_MASKING_GAP, "5m", (sp.keys(sp.gpu(0)), 0.4)),
        samples(DCGM_NODE_EFFECTIVE_UTILIZATION, "5m", ({S.HOSTNAME: HOST}, 0.2875)),
        samples(DCGM_NODE_MASKING_GAP, "5m", ({S.HOSTNAME: HOST}, 0.4)),
        samples(DCGM_FLEET_EFFECTIVE_UTILIZATION, "5m", ({}, 0.2875)),
        samples(DCGM_FLEET_MASKING_GAP, "5m", ({}, 0.4)),
    ])


def dcgm_xid_case(sp: Spelling) -> dict[str, Any]:
    """GpuXidError from a change of the last-XID gauge."""
    xid = sp.field(S.XID_ERRORS)
    return case("dcgm GpuXidError: a change of the last-XID gauge, classed by its value", [
        series(xid, sp.gpu(0, err_code="0"), "0x9"),
        series(xid, sp.gpu(0, err_code="79"), "_x10 79x20"),   # dcgm-exporter relabels err_code on a new XID
        series(xid, sp.gpu(1), "0x9 13x20"),                   # application XID: info
        series(xid, sp.gpu(2), "0x9 63x20"),
        series(xid, sp.gpu(3), "0x30"),
        series(xid, sp.gpu(4), "48x30"),                       # an old event, reported since before the window
        series(xid, sp.gpu(5), f"0x9 {SENTINEL}x20"),          # NOT_SUPPORTED marker: unknown, not an XID
    ], alerts=[
        check("12m", "GpuXidError",
              expect(sp.alerted(sp.gpu(0, err_code="79")), "critical", "training", annotations(
                  "GpuXidError", f"Critical XID 79 on {short(0)}",
                  f"{ref(0)} reported XID 79 {LAST_XID}: the GPU cannot be trusted until it is drained and reset.")),
              expect(sp.alerted(sp.gpu(1)), "info", "training", annotations(
                  "GpuXidError", f"Application XID 13 on {short(1)}",
                  f"{ref(1)} reported XID 13 {LAST_XID}: usually the job's own bug (illegal memory access, kernel "
                  "exception); the GPU itself is fine.")),
              expect(sp.alerted(sp.gpu(2)), "warning", "training", annotations(
                  "GpuXidError", f"XID 63 on {short(2)}",
                  f"{ref(2)} reported XID 63 {LAST_XID}: a driver or hardware error, see the runbook's XID table."))),
        check("25m", "GpuXidError"),
    ])


def dcgm_xid_counted_case(sp: Spelling) -> dict[str, Any]:
    """GpuXidError from the XID count collector."""
    xid = sp.field(S.XID_ERRORS)
    xid_count = sp.name(S.DCGM_XID_COUNT)
    window = {"window_size_in_ms": "300000"}
    cdesc = "event(s) within dcgm-exporter's XID count window in the last 10m"
    counter = _dcgm_counters("GpuXidError", "critical")
    counted = {"dialect": "dcgm", "xid_source": "count_collector"}
    return case("dcgm GpuXidError from the XID count collector: a repeated XID pages again, once", [
        series(xid, sp.gpu(0), "0x9 79x60"),                    # the gauge cannot see the second XID 79 ...
        series(xid_count, sp.gpu(0, xid="79", **window), "0x9 1x5 0x15 1x5 0x25"),  # ... the collector can
        series(xid_count, sp.gpu(1, xid="13", **window), "0x9 2x5 0x45"),
        series(xid, sp.gpu(2), "0x9 94x60"),                    # no collector on this GPU: the gauge pages
    ], alerts=[
        check("12m", "GpuXidError",
              expect({**sp.keys(sp.gpu(0)), "xid": "79", **counted}, "critical", "training", annotations(
                  "GpuXidError", f"Critical XID 79 on {short(0)}",
                  f"{ref(0)} reported 1 XID 79 {cdesc}: the GPU cannot be trusted until it is drained and reset.",
                  **counter)),
              expect({**sp.keys(sp.gpu(1)), "xid": "13", **counted}, "info", "training", annotations(
                  "GpuXidError", f"Application XID 13 on {short(1)}",
                  f"{ref(1)} reported 2 XID 13 {cdesc}: usually the job's own bug (illegal memory access, kernel "
                  "exception); the GPU itself is fine.", **counter)),
              expect(sp.alerted(sp.gpu(2)), "warning", "training", annotations(
                  "GpuXidError", f"XID 94 on {short(2)}",
                  f"{ref(2)} reported XID 94 {LAST_XID}: a driver or hardware error, see the runbook's XID table."))),
        check("28m", "GpuXidError"),
        check("42m", "GpuXidError",   # the same XID again, 30 minutes later: the gauge stayed at 79
              expect({**sp.keys(sp.gpu(0)), "xid": "79", **counted}, "critical", "training", annotations(
                  "GpuXidError", f"Critical XID 79 on {short(0)}",
                  f"{ref(0)} reported 1 XID 79 {cdesc}: the GPU cannot be trusted until it is drained and reset.",
                  **counter))),
    ])


def dcgm_ecc_case(sp: Spelling) -> dict[str, Any]:
    """GpuUncorrectableEcc, with the pod dcgm-exporter attributes."""
    dbe = sp.field(S.ECC_ERRORS, type="uncorrectable", scope="volatile")
    sbe = sp.field(S.ECC_ERRORS, type="correctable", scope="volatile")
    rows = sp.field(S.REMAPPED_ROWS, type="uncorrectable")
    pod0 = {"namespace": "serving", "pod": "chat-0", "container": "vllm"}
    return case("dcgm GpuUncorrectableEcc, carrying the pod that holds the GPU where dcgm-exporter says", [
        series(dbe, sp.gpu(0), "0 0 1x20"),
        series(sp.field(S.MEMORY_USED), sp.gpu(0, **pod0), "100x22"),   # dcgm-exporter's pod attribution
        series(rows, sp.gpu(1), "0 0 1x20"),
        series(sbe, sp.gpu(2), "0 5 10 15x20"),
        series(dbe, sp.gpu(2), "0x22"),
    ], alerts=[
        check("5m", "GpuUncorrectableEcc", *(
            expect(sp.alerted(sp.keys(sp.gpu(n)), **owner), "critical", "training", annotations(
                "GpuUncorrectableEcc", f"Uncorrectable ECC error on {short(n)}",
                f"{ref(n)} had 1 uncorrectable memory error(s) in the last 10m: drain the GPU and reset it to apply "
                "the row remap.", **_dcgm_counters("GpuUncorrectableEcc")))
            for n, owner in ((0, {"namespace": "serving", "pod": "chat-0"}), (1, {})))),
        check("20m", "GpuUncorrectableEcc"),
    ])


def dcgm_remap_case(sp: Spelling) -> dict[str, Any]:
    """GpuRowRemapFailure; a NOT_SUPPORTED marker is no failure."""
    failure = sp.field(S.ROW_REMAP_FAILURE)
    return case("dcgm GpuRowRemapFailure (a NOT_SUPPORTED marker is not a failure)", [
        series(failure, sp.gpu(0), "0 1x5"),
        series(failure, sp.gpu(1), "0x5"),
        series(failure, sp.gpu(2), "2147483634x5"),
    ], alerts=[
        check("0m", "GpuRowRemapFailure"),
        check("2m", "GpuRowRemapFailure", expect(sp.alerted(sp.gpu(0)), "critical", "training", annotations(
            "GpuRowRemapFailure", f"Row remapping failed on {short(0)}",
            f"{ref(0)} has no spare HBM rows left to remap memory errors: drain it and RMA it."))),
    ])


def dcgm_recovery_case(sp: Spelling) -> dict[str, Any]:
    """GpuRecoveryActionRequired; a blank marker is no action."""
    action = sp.field(S.GPU_RECOVERY_ACTION)
    return case("dcgm GpuRecoveryActionRequired (a blank marker is no action)", [
        series(action, sp.gpu(0), "0 1x5"),
        series(action, sp.gpu(1), "0x5"),
        series(action, sp.gpu(2), "2147483632x5"),
    ], alerts=[
        check("0m", "GpuRecoveryActionRequired"),
        check("2m", "GpuRecoveryActionRequired", expect(sp.alerted(sp.gpu(0)), "critical", "training", annotations(
            "GpuRecoveryActionRequired", f"GPU recovery action 1 required on {short(0)}",
            f"{ref(0)} {RECOVERY_TEXT.format(1)}", **_dcgm_counters("GpuRecoveryActionRequired")))),
    ])


def dcgm_thermal_case(sp: Spelling) -> dict[str, Any]:
    """GpuThermalThrottling (bitmask, both field names) and GpuNearThermalLimit."""
    clk = sp.field(S.SM_CLOCK)
    reasons, old_reasons = (sp.name(x.field) for x in S.CLOCK_EVENT_ACTIVE.dcgm)
    gtemp, mtemp = sp.field(S.TEMPERATURE, sensor="gpu"), sp.field(S.TEMPERATURE, sensor="memory")
    return case("dcgm GpuThermalThrottling (bitmask, both field names) and GpuNearThermalLimit", [
        series(reasons, sp.gpu(0), "33x20"),          # GPU_IDLE | SW_THERMAL
        series(clk, sp.gpu(0), "1200x20"),
        series(gtemp, sp.gpu(0), "88x20"),
        series(reasons, sp.gpu(1), "4x20"),           # SW_POWER_CAP: not thermal
        series(clk, sp.gpu(1), "1500x20"),
        series(old_reasons, sp.gpu(2), "64x20"),      # HW_THERMAL on the deprecated field
        series(clk, sp.gpu(2), "1100x20"),
        series(reasons, sp.gpu(3), f"{SENTINEL}x20"),
        series(clk, sp.gpu(3), "1500x20"),
        series(gtemp, sp.gpu(4), "84x20"),
        series(mtemp, sp.gpu(4), "70x20"),
        series(gtemp, sp.gpu(5), "60x20"),
        series(mtemp, sp.gpu(5), "92x20"),
        series(gtemp, sp.gpu(6), "80x20"),
        # default counters (no throttle reasons): HBM at its 95 C throttle point is throttling
        series(clk, sp.gpu(7), "1300x20"),
        series(gtemp, sp.gpu(7), "80x20"),
        series(mtemp, sp.gpu(7), "96x20"),
    ], alerts=[
        check("0m", "GpuThermalThrottling"),
        check("4m", "GpuNearThermalLimit"),
        check("2m", "GpuThermalThrottling", *(
            expect(sp.alerted(sp.keys(sp.gpu(n))), "critical", "sre", annotations(
                "GpuThermalThrottling", f"Thermal throttling on {short(n)}",
                f"{ref(n)} has been slowed down for heat for 1m (a thermal clock-event reason, or where those are "
                f"not collected the die at 85 C or HBM at 95 C or more); its SM clock is at {mhz}Hz.",
                **_dcgm_counters("GpuThermalThrottling"))) for n, mhz in ((0, "1.2G"), (2, "1.1G"), (7, "1.3G")))),
        check("6m", "GpuNearThermalLimit",
              expect(sp.alerted(sp.keys(sp.gpu(4)), sensor="gpu"), "warning", "facilities", annotations(
                  "GpuNearThermalLimit", f"GPU gpu temperature near its limit on {short(4)}",
                  f"{ref(4)}: gpu temperature 84 C for 5m, close to thermal slowdown; check airflow and inlet "
                  "temperature of the rack.")),
              expect(sp.alerted(sp.keys(sp.gpu(5)), sensor="memory"), "warning", "facilities", annotations(
                  "GpuNearThermalLimit", f"GPU memory temperature near its limit on {short(5)}",
                  f"{ref(5)}: memory temperature 92 C for 5m, close to thermal slowdown; check airflow and inlet "
                  "temperature of the rack."))),
    ])


def dcgm_nvlink_case(sp: Spelling) -> dict[str, Any]:
    """GpuNvlinkErrors."""
    replay = sp.field(S.NVLINK_ERRORS, type="replay")
    return case("dcgm GpuNvlinkErrors", [
        series(replay, sp.gpu(0), "0+1x30"),
        series(replay, sp.gpu(1), "5x30"),
    ], alerts=[
        check("9m", "GpuNvlinkErrors"),
        check("20m", "GpuNvlinkErrors", expect(sp.alerted(sp.keys(sp.gpu(0))), "warning", "training", annotations(
            "GpuNvlinkErrors", f"NVLink errors on {short(0)}",
            f"{ref(0)} keeps logging NVLink errors (10 in the last 10m): collectives over this GPU slow down or fail.",
            **_dcgm_counters("GpuNvlinkErrors")))),
    ])


def dcgm_pcie_case(sp: Spelling) -> dict[str, Any]:
    """GpuPcieLinkDowngraded: only while busy."""
    util = sp.field(S.GPU_UTILIZATION)
    gen, gen_max = sp.field(S.PCIE_LINK_GENERATION, state="current"), sp.field(S.PCIE_LINK_GENERATION, state="max")
    return case("dcgm GpuPcieLinkDowngraded: only while busy", [
        series(gen, sp.gpu(0), "3x20"),
        series(gen_max, sp.gpu(0), "5x20"),
        series(util, sp.gpu(0), "90x20"),
        series(gen, sp.gpu(1), "1x20"),
        series(gen_max, sp.gpu(1), "5x20"),
        series(util, sp.gpu(1), "0x20"),
    ], alerts=[
        check("9m", "GpuPcieLinkDowngraded"),
        check("15m", "GpuPcieLinkDowngraded", expect(
            sp.alerted(sp.keys(sp.gpu(0)), link="generation"), "warning", "training", annotations(
            "GpuPcieLinkDowngraded", f"PCIe link downgraded on busy {short(0)}",
            f"{ref(0)} runs its PCIe link at generation 3, below its maximum, while busy: host-device transfers "
            "are slower.", **_dcgm_counters("GpuPcieLinkDowngraded")))),
    ])


def dcgm_fell_off_bus_case(sp: Spelling) -> dict[str, Any]:
    """GpuFellOffBus: one GPU gone, not a whole node."""
    gtemp = sp.field(S.TEMPERATURE, sensor="gpu")
    return case("dcgm GpuFellOffBus: one GPU gone while its node reports; a whole node gone is not it", [
        series(gtemp, sp.gpu(0), "40x30"),
        series(gtemp, sp.gpu(1), "40x9 stale"),
        series(gtemp, sp.gpu(0, HOST2), "40x9 stale"),   # node-2 (both GPUs) or its exporter gone: not this
        series(gtemp, sp.gpu(1, HOST2), "40x9 stale"),
    ], alerts=[
        check("9m", "GpuFellOffBus"),
        check("12m", "GpuFellOffBus", expect(sp.alerted(sp.keys(sp.gpu(1))), "critical", "training", annotations(
            "GpuFellOffBus", f"{short(1)} fell off the bus",
            f"{ref(1)} stopped reporting while its node's exporter is up: the GPU is lost (XID 79 or similar); "
            "drain the node and reset or reseat the GPU."))),
    ])


def dcgm_exporter_down_case(sp: Spelling) -> dict[str, Any]:
    """DcgmExporterDown, with the host it served."""
    gtemp = sp.field(S.TEMPERATURE, sensor="gpu")
    job = {"job": DCGM_JOB}
    return case("DcgmExporterDown", [
        series(UP, {**job, "instance": "10.0.0.1:9400"}, "1x9 0x20"),
        series(gtemp, {**job, "instance": "10.0.0.1:9400", **sp.gpu(0)}, "40x9 stale"),
        series(UP, {**job, "instance": "10.0.0.2:9400"}, "1x30"),
    ], alerts=[
        check("3m", "DcgmExporterDown"),
        check("20m", "DcgmExporterDown", expect(
            {**job, "instance": "10.0.0.1:9400", S.HOSTNAME: HOST, "dialect": "dcgm"}, "warning", "sre", annotations(
                "DcgmExporterDown", "Exporter 10.0.0.1:9400 is down",
                f"Prometheus cannot scrape 10.0.0.1:9400 (job {DCGM_JOB}, host {HOST}) for 5m: the GPUs there are "
                "unobserved."))),
    ])


def dcgm_missing_case(sp: Spelling) -> dict[str, Any]:
    """GpuMissing on dcgm-exporter's memory series."""
    return missing_case(sp.field(S.MEMORY_USED), sp.gpu, "GPU_I_ID", {"dialect": "dcgm"})


#: dcgm_*_test.yaml's cases (one file per spelling), in file order.
DCGM_CASES: tuple[Callable[[Spelling], dict[str, Any]], ...] = (
    dcgm_recording_case, dcgm_xid_case, dcgm_xid_counted_case, dcgm_ecc_case, dcgm_remap_case, dcgm_recovery_case,
    dcgm_thermal_case, dcgm_nvlink_case, dcgm_pcie_case, dcgm_fell_off_bus_case, dcgm_missing_case,
    dcgm_exporter_down_case,
)


def dcgm_tests(sp: Spelling) -> list[dict[str, Any]]:
    """``dcgm<suffix>_test.yaml``: every case of the dcgm rules on series spelled as ``sp``."""
    return [make(sp) for make in DCGM_CASES]




# analyzer findings ---------------------------------------------------------------------------
#: The workload and GPU of finding 0, as the analyzer alerts' descriptions name them.
WHERE = "GPU 0 on node-1 (workload ml/train)"


def finding(kind: str, severity: str, n: int = 0, **extra: str) -> Labels:
    """A finding's labels on GPU ``n`` of node-1, held by ml/train."""
    return {"kind": kind, "severity": severity, S.HOSTNAME: HOST, S.GPU: str(n), "rack": "r1",
            "namespace": "ml", S.WORKLOAD: "train", **extra}


def open_finding(labels: Labels, values: str, value: str) -> list[dict[str, str]]:
    """A finding's active and score series: open while ``values`` says 1, scored ``value``."""
    return [series(O.FINDING_ACTIVE.name, labels, values),
            series(O.FINDING_SCORE.name, labels, values.replace("1x", f"{value}x"))]


def finding_alert(kind: str, n: int = 0) -> Labels:
    """The labels an alert on a finding carries (its severity is the alert's own)."""
    return {k: v for k, v in finding(kind, "", n).items() if k != "severity"}


def analyzer_waste_case() -> dict[str, Any]:
    """GpuIdleMasking and GpuIdleAllocated: sustained waste findings only."""
    return case("GpuIdleMasking and GpuIdleAllocated: sustained waste findings open a FinOps ticket", [
        *open_finding(finding("idle_masking", "warning"), "1x40", "0.8"),
        *open_finding(finding("idle_masking", "info", 1), "1x20 stale", "0.5"),  # closed after 20m
        *open_finding(finding("idle_allocated", "warning", 2), "1x40", "0.95"),
    ], alerts=[
        check("25m", "GpuIdleMasking"),
        check("35m", "GpuIdleMasking", expect(finding_alert("idle_masking"), "warning", "finops", annotations(
            "GpuIdleMasking", "GPU busy in nvidia-smi but its SMs mostly idle: GPU 0 of node-1",
            f"{WHERE} reports high GPU utilization while its SMs are mostly idle (score 80%): the job pays for a "
            "whole GPU and uses a fraction of it."))),
        check("25m", "GpuIdleAllocated"),
        check("35m", "GpuIdleAllocated", expect(finding_alert("idle_allocated", 2), "warning", "finops", annotations(
            "GpuIdleAllocated", "Allocated GPU idle: GPU 2 of node-1",
            "GPU 2 on node-1 (workload ml/train) is allocated but idle (score 95%): release it or fix the job's input "
            "pipeline."))),
    ])


#: The finding alerts that follow their finding's severity: (alert, kind, team, what the description says).
SEVERITY_FOLLOWING = (
    ("GpuStraggler", "straggler", "training", "is the straggler slowing its training gang"),
    ("GpuDegraded", "degraded_gpu", "training", "runs degraded (power cap, PCIe or NVLink)"),
    ("GpuFault", "gpu_fault", "training", "has a hardware fault (XID, ECC, NVLink, PCIe, lost GPU)"),
    ("GpuThermal", "thermal", "sre", "runs hot or throttles for heat (GPU, node or rack)"),
)
#: Per severity, the GPU its finding sits on and its score.
SEVERITY_GPUS = (("critical", 0, "0.9"), ("warning", 1, "0.5"), ("info", 2, "0.2"))


def analyzer_severity_case() -> dict[str, Any]:
    """GpuStraggler, GpuDegraded, GpuFault, GpuThermal: the finding's severity is the alert's (critical pages,
    warning tickets, info, an early suspect, is logged), and a blip shorter than ``for:`` raises nothing."""
    return case("GpuStraggler, GpuDegraded, GpuFault, GpuThermal: the finding's severity decides page, ticket or log", [
        *(s for _, kind, _, _ in SEVERITY_FOLLOWING for sev, n, score in SEVERITY_GPUS
          for s in open_finding(finding(kind, sev, n), "1x20", score)),
        *open_finding(finding("straggler", "critical", 5), "1x2 stale", "0.9"),  # a blip shorter than for:
    ], alerts=[c for alert, kind, team, what in SEVERITY_FOLLOWING for c in (check("4m", alert), check("10m", alert, *(
        expect(finding_alert(kind, n), sev, team, annotations(
            alert, f"{alert.removeprefix('Gpu')}: GPU {n} of node-1",
            f"GPU {n} on node-1 (workload ml/train) {what} (score {round(float(score) * 100)}%); see the analyzer's "
            "finding for the evidence.")) for sev, n, score in SEVERITY_GPUS)))])


def analyzer_keep_firing_case() -> dict[str, Any]:
    """GpuStraggler and GpuDegraded keep firing through a withdrawal (an intermittent straggler between spells,
    a flickering degraded GPU): no resolve and re-page; a finding gone for good resolves after keep_firing_for."""
    straggler, degraded = finding("straggler", "warning", 1), finding("degraded_gpu", "warning", 3)
    fires = [expect(finding_alert("straggler", 1), "warning", "training", annotations(
        "GpuStraggler", "Straggler: GPU 1 of node-1", "GPU 1 on node-1 (workload ml/train) is the straggler slowing "
        "its training gang (score 50%); see the analyzer's finding for the evidence."))]
    return case("GpuStraggler, GpuDegraded: a finding withdrawn for a few runs keeps its alert firing", [
        *open_finding(straggler, "1x20 stale _x4 1x10", "0.5"),  # withdrawn from 21 to 25 min, back at 26
        *open_finding(degraded, "1x20 stale", "0.5"),  # gone for good at 21 min
    ], alerts=[
        check("24m", "GpuStraggler", *fires),
        check("24m", "GpuDegraded", expect(finding_alert("degraded_gpu", 3), "warning", "training", annotations(
            "GpuDegraded", "Degraded: GPU 3 of node-1", "GPU 3 on node-1 (workload ml/train) runs degraded (power "
            "cap, PCIe or NVLink) (score 50%); see the analyzer's finding for the evidence."))),
        check("30m", "GpuStraggler", *fires),
        check("40m", "GpuDegraded"),  # 15 min after its finding closed: resolved
    ])


def analyzer_health_case() -> dict[str, Any]:
    """TruegpuAnalyzerDown: not scraped, or stuck."""
    job = {"job": ANALYZER_JOB, "instance": "analyzer:8000"}
    return case("TruegpuAnalyzerDown: not scraped, or no successful run for too long", [
        series(UP, job, "1x9 0x30"),
        series(O.ANALYZER_LAST_SUCCESS.name, job, "0x40"),  # last success at t=0, never again
        series(UP, {**job, "instance": "analyzer-2:8000"}, "1x40"),
        series(O.ANALYZER_LAST_SUCCESS.name, {**job, "instance": "analyzer-2:8000"}, "0+60x40"),  # healthy
    ], alerts=[
        check("12m", "TruegpuAnalyzerDown"),
        check("25m", "TruegpuAnalyzerDown",
              expect(job, "warning", "sre", annotations(
                  "TruegpuAnalyzerDown", "truegpu analyzer analyzer:8000 is down",
                  "Prometheus cannot scrape the analyzer analyzer:8000 for 5m: findings (stragglers, idle GPUs) are "
                  "not being raised."), reason="down"),
              expect(job, "warning", "sre", annotations(
                  "TruegpuAnalyzerDown", "truegpu analyzer analyzer:8000 is stuck",
                  "The analyzer analyzer:8000 last finished an analysis 25m 0s ago: findings are stale."),
                  reason="stale")),
    ])


def analyzer_state_case() -> dict[str, Any]:
    """TruegpuAnalyzerStateNotSaved: every --state-file write of 15 minutes failed; one good write clears it."""
    job = {"job": ANALYZER_JOB, "instance": "analyzer:8000"}
    writes = O.ANALYZER_STATE_WRITES.name
    return case("TruegpuAnalyzerStateNotSaved: the state file not written for 15 minutes", [
        series(writes, {**job, "result": "ok"}, "0+1x10 10x40"),  # good writes until 10m, then none
        series(writes, {**job, "result": "error"}, "0x10 1+1x40"),  # every write fails from 11m on
        series(writes, {**job, "instance": "analyzer-2:8000", "result": "ok"}, "0+1x50"),
        series(writes, {**job, "instance": "analyzer-2:8000", "result": "error"}, "0x20 1x30"),  # one failure
    ], alerts=[
        check("20m", ANALYZER_STATE),  # writes of the last 15 minutes were good too
        check("35m", ANALYZER_STATE, expect(job, "info", "sre", annotations(
            ANALYZER_STATE, "truegpu analyzer analyzer:8000 cannot save its state",
            "Every write of the analyzer's --state-file for 15m failed: a restart would give ongoing problems new "
            "ids and lose the evidence carried past the window (see its log)."))),
    ])


#: analyzer_test.yaml's cases, in file order.
ANALYZER_CASES: tuple[Callable[[], dict[str, Any]], ...] = (
    analyzer_waste_case, analyzer_severity_case, analyzer_keep_firing_case, analyzer_health_case,
    analyzer_state_case,
)


def analyzer_tests() -> list[dict[str, Any]]:
    """``analyzer_test.yaml``: every case of the analyzer rules."""
    return [make() for make in ANALYZER_CASES]


def test_files() -> dict[str, dict[str, Any]]:
    """``alerts/tests/<name>``: promtool test files (rule paths relative to alerts/tests/)."""
    def file(rules: str, tests: list[dict[str, Any]]) -> dict[str, Any]:
        return {"rule_files": [f"../generated/{rules}"], "evaluation_interval": "1m", "tests": tests}

    return {
        "truegpu_test.yaml": file("truegpu.yaml", truegpu_tests()),
        **{f"dcgm{sp.suffix}_test.yaml": file("dcgm.yaml", dcgm_tests(sp)) for sp in SPELLINGS},
        "analyzer_test.yaml": file("analyzer.yaml", analyzer_tests()),
    }
