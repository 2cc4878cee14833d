"""The analyzer's own metric contract: what `truegpu serve` publishes on /metrics.

Workloads are labelled ``workload`` (exporter.schema.WORKLOAD), never ``job``, which is
Prometheus' scrape job: scrape the analyzer without ``honor_labels``. Alert rules and
dashboards read these names from here (as they read the exporter's from
exporter/schema.py), so the analyzer, the rules and the panels cannot drift apart. Same
conventions: ratios 0..1, base units, counters end in ``_total``. Findings are bounded
(one series per open problem, gone when it ends), so their identity labels are fine here.
"""

from __future__ import annotations

from exporter.schema import WORKLOAD, Metric

#: Labels of a finding series; "" where the finding has no such entity (a rack finding has no gpu).
FINDING_LABELS: tuple[str, ...] = (
    "kind", "severity", "hostname", "gpu", "gpu_instance", "rack", "namespace", WORKLOAD,
)

FINDING_ACTIVE = Metric(
    "truegpu_finding_active", "gauge", "",
    "1 while the analyzer has an open finding of this kind on this entity (absent once it ends); kind is one "
    "of the detector registry's kinds, listed with who is paged for each in docs/findings.md.",
    labels=FINDING_LABELS, scope="exporter",
)
FINDING_SCORE = Metric(
    "truegpu_finding_score", "gauge", "",
    "How bad the open finding is, 0..1 (the finding's score).",
    labels=FINDING_LABELS, scope="exporter",
)
FINDING_STARTED = Metric(
    "truegpu_finding_start_timestamp_seconds", "gauge", "seconds",
    "Unix time the open finding started.",
    labels=FINDING_LABELS, scope="exporter",
)

JOB_EFFECTIVE_UTILIZATION = Metric(
    "truegpu_job_effective_utilization_ratio", "gauge", "ratio",
    "Effective utilization of a job's GPUs over the last analysis window (SM activity x clock ratio, "
    "time-weighted).",
    labels=("namespace", WORKLOAD), scope="exporter",
)
JOB_REPORTED_UTILIZATION = Metric(
    "truegpu_job_reported_utilization_ratio", "gauge", "ratio",
    "GPU utilization as nvidia-smi reports it for the job's GPUs over the last analysis window.",
    labels=("namespace", WORKLOAD), scope="exporter",
)
JOB_ALLOCATED_GPUS = Metric(
    "truegpu_job_allocated_gpus", "gauge", "",
    "GPUs (MIG slices by their share) the job held on average over the last analysis window.",
    labels=("namespace", WORKLOAD), scope="exporter",
)
FLEET_EFFECTIVE_UTILIZATION = Metric(
    "truegpu_fleet_effective_utilization_ratio", "gauge", "ratio",
    "Effective utilization over the last analysis window, allocation=allocated|all.",
    labels=("allocation",), scope="exporter",
)
FLEET_REPORTED_UTILIZATION = Metric(
    "truegpu_fleet_reported_utilization_ratio", "gauge", "ratio",
    "Reported GPU utilization over the last analysis window, allocation=allocated|all.",
    labels=("allocation",), scope="exporter",
)

GPU_HOURLY_COST = Metric(
    "truegpu_gpu_hourly_cost", "gauge", "",
    "Price catalog's cost of one whole GPU of this model for one hour, in `currency` (FOCUS ListUnitPrice): "
    "dashboards and rules multiply GPU-hours by it. One series per GPU model of the latest analysis that the "
    "catalog prices; an unpriced model has no series (never $0).",
    labels=("model", "sku", "currency"), scope="exporter",
)

#: The label naming a part of the GPU-hour partition, and its values (defined in analyzer.analysis.partition).
PART_LABEL = "part"
PARTS: tuple[str, ...] = (
    "effective", "idle_allocated", "masked", "straggler", "throttled", "underused",
    "headroom", "bandwidth_bound", "power_capped", "unclassified", "shared_unattributed", "unknown", "unallocated",
)
#: Recoverable waste: what the workload's owner can get back.
WASTE_PARTS: tuple[str, ...] = ("idle_allocated", "masked", "straggler", "throttled", "underused")
#: Unused but not waste: normal for healthy work of its class, site policy, or real work.
NORMAL_PARTS: tuple[str, ...] = ("headroom", "bandwidth_bound", "power_capped")
FLEET_GPU_SECONDS = Metric(
    "truegpu_fleet_gpu_seconds", "gauge", "seconds",
    "GPU-seconds (GPU-hours x 3600, base unit) of the last analysis window in each part of the GPU-hour "
    "partition (part: effective; recoverable waste idle_allocated, masked, straggler, throttled, underused; "
    "normal headroom, bandwidth_bound, power_capped; unclassified, shared_unattributed, unknown, unallocated). "
    "The parts add up to "
    "the capacity.",
    labels=(PART_LABEL,), scope="exporter",
)
NAMESPACE_GPU_SECONDS = Metric(
    "truegpu_namespace_gpu_seconds", "gauge", "seconds",
    "Allocated GPU-seconds of the namespace in the last analysis window, per part of the GPU-hour partition "
    "(as truegpu_fleet_gpu_seconds; parts a namespace has no hours in are absent).",
    labels=("namespace", PART_LABEL), scope="exporter",
)

ANALYZER_LAST_SUCCESS = Metric(
    "truegpu_analyzer_last_success_timestamp_seconds", "gauge", "seconds",
    "Unix time of the analyzer's last complete analysis run.",
    scope="exporter",
)
ANALYZER_RUN_DURATION = Metric(
    "truegpu_analyzer_run_duration_seconds", "gauge", "seconds",
    "Wall time of the last analysis run.",
    scope="exporter",
)
ANALYZER_RUNS = Metric(
    "truegpu_analyzer_runs_total", "counter", "",
    "Analysis runs by result (ok, error).",
    labels=("result",), scope="exporter",
)

ANALYZER_STATE_WRITES = Metric(
    "truegpu_analyzer_state_writes_total", "counter", "",
    "Writes of serve's --state-file (finding ids and carried evidence, for restarts) by result (ok, error); "
    "absent without one.",
    labels=("result",), scope="exporter",
)

METRICS: tuple[Metric, ...] = tuple(v for v in dict(globals()).values() if isinstance(v, Metric))
