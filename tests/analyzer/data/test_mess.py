"""Ingestion mess (issue 12): scrape gaps, exporter restarts, repeated samples, HA Prometheus pairs, pods
restarted under new names, the same GPU scraped by two jobs, NaN, nodes scraped at their own phases with
jitter. The simulator's history writer makes the mess (exporter.simulator.history.Mess); the full path a
user's data takes reads it back."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from analyzer.analysis.evaluate import evaluate, fleet_gpu_hours
from analyzer.data.coverage import observed_share
from analyzer.data.frame import Fleet
from analyzer.data.ingest import read_openmetrics
from analyzer.data.load import load_files
from analyzer.data.normalize import normalize
from analyzer.detectors.idle_allocated import IdleAllocated
from analyzer.detectors.idle_masking import IdleMasking
from analyzer.detectors.topology import Topology
from analyzer.findings import GPU_FAULT, IDLE_ALLOCATED, IDLE_MASKING, TOPOLOGY, Finding, IdMemory
from analyzer.pipeline import analyze
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import Mess, renamed_pod, sample_times, scrape_times, write_history
from exporter.simulator.model import Cluster
from exporter.simulator.scenario import load_scenario

STEP = 60.0
NOTEBOOKS = "dc1-r2-n02"  # nb-alice (idle from 20 min) and nb-carol (idle from the start)
EMBED = "dc1-r2-n01"  # embed-batch: idle masking on 8 GPUs
#: A whole-node scrape gap of 4 minutes, 15 minutes into nb-alice's idle time (before its 30-minute timer).
GAP = ((NOTEBOOKS, 2100.0, 240.0), (EMBED, 2100.0, 240.0))


@pytest.fixture(scope="module")
def cluster() -> Cluster:
    return Cluster(load_scenario("idle-waste"))


def history(tmp: Path, cluster: Cluster, mess: Mess | None, dialect: str = "dcgm") -> Fleet:
    path = tmp / f"h-{dialect}-{abs(hash(mess))}.om"
    write_history(path, cluster, cluster.start, cluster.start + cluster.duration, STEP, dialect=dialect,
                  dcgm_options=DcgmOptions(counters="all"), mess=mess)
    loaded = load_files([path])
    return loaded if isinstance(loaded, Fleet) else normalize(loaded)


@pytest.fixture(scope="module")
def clean(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    return history(tmp_path_factory.mktemp("clean"), cluster, None)


@pytest.fixture(scope="module")
def messy(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Fleet:
    pods = ("embed-batch-mbt9x", "nb-carol-4tfwd")
    return history(tmp_path_factory.mktemp("messy"), cluster, Mess(
        node_gaps=GAP, repeat_every=3, replicas=("prometheus-k8s-0", "prometheus-k8s-1"),
        pod_restarts=tuple((p, 5400.0) for p in pods)))


def judged(fleet: Fleet, cluster: Cluster, detector: object, kind: str) -> dict:
    return evaluate(detector.detect(fleet), cluster.ground_truth(), [kind], fleet)["kinds"][kind]


def test_a_whole_node_gap_inside_an_idle_episode_neither_splits_nor_restarts_it(cluster: Cluster,
                                                                                messy: Fleet) -> None:
    found = [f for f in IdleAllocated().detect(messy) if f.job == "nb-alice"]
    assert len(found) == 2  # one per GPU, not two per GPU
    assert {f.start for f in found} == {cluster.start + 1200.0}  # the right start: the timer kept running
    assert all(f.end is None for f in found)
    # The gap is unknown, not idle: the 4 minutes are not claimed as idle GPU-hours.
    idle_h = [f.evidence["gpu_hours_idle"] for f in found]
    assert idle_h == pytest.approx([(cluster.duration - 1200.0 - 240.0) / 3600.0] * 2)
    masked = IdleMasking().detect(messy)
    assert len(masked) == 8 and {f.start for f in masked} == {cluster.start}  # one per GPU, not split
    for kind, det in ((IDLE_ALLOCATED, IdleAllocated()), (IDLE_MASKING, IdleMasking())):
        k = judged(messy, cluster, det, kind)
        assert (k["precision"], k["recall"], k["fragmented"]) == (1.0, 1.0, 0), kind


@pytest.mark.parametrize("phase", [0.0, 56.0])  # serve's cuts fall on its clock's minutes, the rows on the data's
def test_a_whole_node_gap_never_withdraws_an_idle_finding_in_serves_windows(cluster: Cluster, tmp_path: Path,
                                                                           phase: float) -> None:
    """Analyzed the way serve does (the last 30 minutes, every minute), the notebook's finding is shown from 30
    minutes after its pod got the GPUs on, through node gaps before and after that, under one id: with known
    minutes alone counting toward its 30, a gap anywhere in the window withdrew it for half an hour (the alert's
    30-minute ``for:`` restarting each time), and a cut inside a gap withdrew it for the gap's length. The
    minutes before the pod held the GPUs are no gap: never counted."""
    gaps = ((NOTEBOOKS, 2100.0, 240.0), (NOTEBOOKS, 4000.0, 180.0))  # inside its first 30 minutes; after them
    fleet = history(tmp_path, cluster, Mess(node_gaps=gaps))
    ids, shown = IdMemory(1800.0), {}
    due = 1200.0 + 1800.0  # nb-alice holds its GPUs idle from 20 min
    for cut in np.arange(due - 600.0, 4180.0 + 1800.0 + 300.0, STEP) + phase:
        found = [f for f in IdleAllocated().detect(fleet.between(fleet.start + cut - 1800.0, fleet.start + cut))
                 if f.job == "nb-alice"]
        ids.carry(found, fleet.start + cut)
        shown[float(cut)] = sorted(f.id for f in found)
    # due once the window holds the row starting a step before (rows count whole)
    assert {t: len(v) for t, v in shown.items()} == {t: 2 * (t > due - STEP) for t in shown}
    assert len({i for v in shown.values() for i in v}) == 2  # one id per GPU throughout


def test_repeated_samples_and_an_ha_pair_count_one_copy(clean: Fleet, messy: Fleet) -> None:
    assert len(messy.frame) == len(clean.frame)  # one row per GPU and step, not two
    assert fleet_gpu_hours(messy) == pytest.approx(fleet_gpu_hours(clean))
    want = sum(f.evidence["gpu_hours_idle"] for f in IdleAllocated().detect(clean))
    got = sum(f.evidence["gpu_hours_idle"] for f in IdleAllocated().detect(messy))
    assert got == pytest.approx(want - 2 * 240.0 / 3600.0 * 6 / 2, rel=0.02)  # less the 4-minute gap only
    notes = " ".join(messy.notes)
    assert "repeated samples" in notes and "prometheus_replica=prometheus-k8s-0/prometheus-k8s-1" in notes
    ok = np.isfinite(clean.frame["gpu_util"].to_numpy()) & np.isfinite(messy.frame["gpu_util"].to_numpy())
    assert np.allclose(messy.frame["gpu_util"].to_numpy()[ok], clean.frame["gpu_util"].to_numpy()[ok])


def test_repeated_samples_are_kept_once_and_counted(cluster: Cluster, tmp_path: Path) -> None:
    path = tmp_path / "rep.om"
    stats = write_history(path, cluster, cluster.start, cluster.start + 600.0, STEP, dialect="dcgm", mess=Mess(
        repeat_every=2, replicas=("a", "b"), replica_label="__replica__"))
    frame, report = read_openmetrics(path)
    once = tmp_path / "once.om"
    write_history(once, cluster, cluster.start, cluster.start + 600.0, STEP, dialect="dcgm")
    want, _ = read_openmetrics(once)
    assert len(frame) == len(want) and "__replica__" not in frame.columns
    assert stats.samples > 2 * len(want) and sum(report.duplicates.values()) == stats.samples - len(want)
    assert report.replicas == {"__replica__": {"a", "b"}} and not report.conflicts


def test_pods_restarted_under_new_names_stay_one_workload(clean: Fleet, messy: Fleet) -> None:
    pods = set(messy.frame["pod"].dropna().astype(str))
    assert renamed_pod("embed-batch-mbt9x") in pods and "embed-batch-mbt9x" in pods
    assert set(messy.frame["job"].dropna().astype(str)) == set(clean.frame["job"].dropna().astype(str))
    # Two pods one after the other are one member, not a gang: no "training job" on PCIe.
    assert [f for f in Topology().detect(messy) if f.kind == TOPOLOGY] == []


def test_exporter_restarts_reset_counters_and_lose_a_scrape(cluster: Cluster, tmp_path: Path) -> None:
    clean = history(tmp_path, cluster, None, dialect="truegpu")
    restarted = history(tmp_path, cluster, Mess(exporter_restarts=((NOTEBOOKS, 3000.0), (EMBED, 6000.0))),
                        dialect="truegpu")
    assert "counter resets" in " ".join(restarted.notes)
    for col in ("power_watts", "pcie_bps"):
        if col not in clean.frame.columns:
            continue
        a, b = clean.frame[col].to_numpy(), restarted.frame[col].to_numpy()
        ok = np.isfinite(a) & np.isfinite(b)
        assert ok.sum() > 0.95 * len(a) and np.allclose(a[ok], b[ok], rtol=1e-6, atol=1e-6), col
    assert len(IdleAllocated().detect(restarted)) == len(IdleAllocated().detect(clean))


@pytest.mark.parametrize("dialect", ["truegpu", "dcgm"])
def test_nodes_in_a_slower_scrape_job_are_observed_with_their_counters(cluster: Cluster, tmp_path: Path,
                                                                        dialect: str) -> None:
    """Two nodes scraped every 4th and 2nd minute among nodes scraped every minute: their GPU-hours are
    observed, not a quarter of them; their counters give rates; the same findings as the clean history."""
    clean = history(tmp_path, cluster, None, dialect=dialect)
    slow = history(tmp_path, cluster, Mess(slow_scrapes=((NOTEBOOKS, 4), (EMBED, 2))), dialect=dialect)
    assert slow.step == STEP and fleet_gpu_hours(slow) == pytest.approx(fleet_gpu_hours(clean))
    for host in (NOTEBOOKS, EMBED):
        rows = slow.frame["hostname"].to_numpy() == host
        assert observed_share(slow.frame)[rows].min() == 1.0, host
        assert slow.frame.loc[rows, "pcie_bps"].notna().mean() > 0.95, host
    for kind, det in ((IDLE_ALLOCATED, IdleAllocated()), (IDLE_MASKING, IdleMasking())):
        k = judged(slow, cluster, det, kind)
        assert (k["precision"], k["recall"], k["fragmented"]) == (1.0, 1.0, 0), kind
    assert [f for f in Topology().detect(slow) if f.kind == TOPOLOGY] == []


def test_one_gpu_scraped_by_two_jobs_is_one_device(tmp_path: Path) -> None:
    """No host label (dcgm-exporter 1.x): the host comes from ``instance``, which differs per scrape job."""
    lines = ["# TYPE dcgm_fi_dev_gpu_util gauge"]
    for t in range(10):
        for job, inst, off in (("gpu-a", "10.0.0.7:9400", 0.0), ("gpu-b", "node-7:9400", 3.0)):
            lines.append(f'dcgm_fi_dev_gpu_util{{gpu="0",uuid="GPU-7",job="{job}",instance="{inst}"}} '
                         f'{50 + t} {1_700_000_000 + 60 * t + off}')
    lines.append('dcgm_fi_dev_gpu_util{gpu="1",uuid="GPU-8",job="gpu-a",instance="10.0.0.7:9400"} NaN 1700000000')
    lines.append('dcgm_fi_dev_gpu_util{gpu="1",uuid="GPU-8",job="gpu-a",instance="10.0.0.7:9400"} 7 1700000060')
    lines.append("# EOF")
    path = tmp_path / "two-jobs.om"
    path.write_text("\n".join(lines) + "\n")
    frame, report = read_openmetrics(path)
    fleet = normalize(frame, step=60.0, report=report)
    devices = fleet.frame[["hostname", "gpu"]].drop_duplicates()
    assert len(devices) == 2 and set(devices["hostname"].astype(str)) == {"10.0.0.7"}
    g0 = fleet.frame[fleet.frame["gpu"].astype(str) == "0"]["gpu_util"].to_numpy()
    assert g0 == pytest.approx((50 + np.arange(10)) / 100.0)  # both copies agree: their mean is the value
    g1 = fleet.frame[fleet.frame["gpu"].astype(str) == "1"]["gpu_util"].to_numpy()
    assert np.isnan(g1[0]) and g1[1] == pytest.approx(0.07)  # NaN is unknown, never 0
    assert "scraped under more than one instance" in " ".join(fleet.notes)


def test_counter_copies_of_two_scrape_jobs_at_one_instant_rate_as_one(tmp_path: Path) -> None:
    """A Prometheus answer puts both scrape jobs' copies of a counter at each step, each the value of its own
    last scrape: the job scraped 10 s earlier lags. Its copy must not enter the rate (interleaved by series
    order, every step counted the lag once more: 500 errors a minute read as 584)."""
    lines = ["# TYPE truegpu_ecc_errors counter"]
    for job, lag in (("gpu-a", 0), ("gpu-b", 84)):  # 8.4 errors/s x 10 s behind
        for t in range(10):
            lines.append(f'truegpu_ecc_errors_total{{hostname="n1",gpu="0",uuid="GPU-1",type="correctable",'
                         f'scope="volatile",job="{job}",instance="n1:9400"}} {500 * t - lag * (t > 0)} '
                         f'{1_700_000_000 + 60 * t}')
    lines += ["# TYPE truegpu_gpu_utilization_ratio gauge"] + [
        f'truegpu_gpu_utilization_ratio{{hostname="n1",gpu="0",uuid="GPU-1",job="{job}",instance="n1:9400"}} 0.5 '
        f'{1_700_000_000 + 60 * t}' for job in ("gpu-a", "gpu-b") for t in range(10)] + ["# EOF"]
    path = tmp_path / "lagging.om"
    path.write_text("\n".join(lines) + "\n")
    frame, report = read_openmetrics(path)
    fleet = normalize(frame, step=60.0, report=report)
    rate = fleet.frame["ecc_correctable_rate"].to_numpy()
    assert rate[:-1] == pytest.approx(np.full(9, 500 / 60.0)) and np.isnan(rate[-1])  # a row: the minute after
    assert "samples of GPUs scraped by more than one target" in " ".join(fleet.notes)


def test_dcgm_pods_get_workloads_from_owners_not_prefixes(tmp_path: Path) -> None:
    """StatefulSet pods ``tensorflow-0..3`` are one workload ``tensorflow``; a pod with a training operator's
    label (dcgm-exporter --kubernetes-enable-pod-labels, sanitized) is named by it; ``llama-3`` alone stays."""
    pods = [("tensorflow-0", ""), ("tensorflow-1", ""), ("tensorflow-2", ""), ("tensorflow-3", ""),
            ("w-0", 'training_kubeflow_org_job_name="pretrain-7b",'),
            ("w-1", 'label_jobset_sigs_k8s_io_jobset_name="big-run",'),
            ("nightly-29345678-x7k2q", 'batch_kubernetes_io_job_name="nightly-29345678",'),
            ("llama-3", "")]
    lines = ["# TYPE DCGM_FI_DEV_GPU_UTIL gauge"]
    for g, (pod, extra) in enumerate(pods):
        for t in range(3):
            lines.append(f'DCGM_FI_DEV_GPU_UTIL{{gpu="{g}",UUID="GPU-{g}",Hostname="n1",namespace="ml",pod="{pod}",'
                         f'{extra}container="c"}} 90 {1_700_000_000 + 60 * t}')
    lines.append("# EOF")
    path = tmp_path / "owners.om"
    path.write_text("\n".join(lines) + "\n")
    fleet = normalize(read_openmetrics(path)[0], step=60.0)
    jobs = fleet.frame.drop_duplicates("gpu").set_index(fleet.frame.drop_duplicates("gpu")["gpu"].astype(int))["job"]
    assert [str(jobs[g]) for g in range(len(pods))] == ["tensorflow"] * 4 + ["pretrain-7b", "big-run", "nightly",
                                                                              "llama-3"]


def test_an_unknown_value_through_an_ha_pair_is_one_unknown_sample_not_a_conflict(tmp_path: Path) -> None:
    """A DCGM not-supported marker (or an out-of-range value) read from both replicas: unknown, never a
    "conflicting duplicate samples" note (NaN is no value to conflict with)."""
    head = 'DCGM_FI_DEV_POWER_USAGE{gpu="0",Hostname="n1",prometheus_replica="%s"}'
    lines = [f"{head % r} {v} {t}" for r in ("a", "b") for v, t in (("350.0", 0), ("9.999e+301", 60), ("1e9", 120))]
    path = tmp_path / "ha.om"
    path.write_text("# TYPE DCGM_FI_DEV_POWER_USAGE gauge\n" + "\n".join(lines) + "\n# EOF\n")
    frame, report = read_openmetrics(path)
    assert frame.loc[frame["timestamp"] == 0.0, "value"].tolist() == [350.0]
    assert frame.loc[frame["timestamp"] > 0.0, "value"].isna().all() and not report.conflicts
    assert report.duplicates == {"DCGM_FI_DEV_POWER_USAGE": 1} and not report.conflict_example


@pytest.mark.parametrize("dialect", ["truegpu", "dcgm"])
@pytest.mark.parametrize("replicas", [(), ("prom-a", "prom-b")], ids=["one-prometheus", "ha-pair"])
def test_nodes_scraped_at_their_own_phase_with_jitter_keep_every_gpu_hour(tmp_path: Path, dialect: str,
                                                                           replicas: tuple[str, ...]) -> None:
    """Each node scraped at its own phase in the minute, each scrape a few ms early or late (timestamps not
    aligned to the interval), and each replica of an HA pair at its own: the node whose first sample starts
    the grid sits on a row boundary, and a floor put its samples in the row before whenever a scrape came
    earlier than that first one, leaving rows without a sample (~4 % of the GPU-hours unknown); an HA pair's
    two copies, merged, read as one series sampled every few seconds (3/4 of the hours unknown), also where
    some samples are repeated (a target scraped twice now and then). Every hour and finding is the clean
    history's."""
    cluster = Cluster(load_scenario("thermal-straggler"))
    jittered = Mess(scrape_jitter_ms=5.0, replicas=replicas, repeat_every=7 if replicas else 0)
    times = sample_times(cluster.start, cluster.start + cluster.duration, STEP)
    targets = [f"{h}/{r}" if r else h for h in sorted(set(cluster.gpus.hostname)) for r in replicas or ("",)]
    stamps = [scrape_times(t, times, jittered.scrape_jitter_ms) for t in targets]
    first = min(float(t.min()) for t in stamps)
    assert sum(int((np.floor((t - first) / STEP) != np.arange(len(t))).sum()) for t in stamps) > 20  # it bites
    clean, messy = history(tmp_path, cluster, None, dialect), history(tmp_path, cluster, jittered, dialect)
    assert messy.step == STEP and len(messy.frame) == len(clean.frame)
    assert observed_share(messy.frame).min() == 1.0
    if replicas:
        assert "samples the replicas took at their own times in the same scrape interval dropped" in \
            " ".join(messy.notes)
    want, got = analyze(clean), analyze(messy)
    assert got.scores.partition.fleet == pytest.approx(want.scores.partition.fleet, rel=1e-9, abs=1e-9)

    def who(f: Finding) -> tuple:
        return f.kind, f.severity, f.hostname, f.gpu, f.job, f.rack

    assert [who(f) for f in got.findings] == [who(f) for f in want.findings]
    for a, b in zip(got.findings, want.findings, strict=True):  # each node's rows start at its first scrape
        assert abs(a.start - b.start) < STEP, who(a)


@pytest.mark.parametrize("dialect", ["truegpu", "dcgm"])
@pytest.mark.parametrize("jitter_ms", [0.0, 5.0], ids=["same-instants", "own-phases"])
def test_every_gpu_scraped_by_two_jobs_counts_once_with_its_counters(tmp_path: Path, dialect: str,
                                                                      jitter_ms: float) -> None:
    """Every exporter in two scrape jobs (series told apart by ``job`` and ``instance`` only), at the same
    instants (a Prometheus answer's steps) or each job at its own phase (raw scrapes): one GPU, one copy per
    scrape interval. Merged at their own phases, the step read as the jobs' distance, a counter's stale copy
    gave rates alternating 0 and twice the rate, and a growing correctable-ECC storm was lost."""
    cluster = Cluster(load_scenario("error-storms"))
    clean = history(tmp_path, cluster, Mess(scrape_jitter_ms=jitter_ms), dialect)
    twice = history(tmp_path, cluster, Mess(scrape_jitter_ms=jitter_ms, scrape_jobs=("gpu-metrics", "dcgm")),
                    dialect)
    assert twice.step == STEP and len(twice.frame) == len(clean.frame)
    assert observed_share(twice.frame).min() == 1.0
    assert "samples of GPUs scraped by more than one target (job/instance) dropped" in " ".join(twice.notes)
    want, got = analyze(clean), analyze(twice)
    assert got.scores.partition.fleet == pytest.approx(want.scores.partition.fleet, rel=1e-9, abs=1e-9)
    for col in ("ecc_correctable_rate", "nvlink_error_rate"):
        assert np.allclose(twice.frame[col], clean.frame[col], rtol=1e-3, equal_nan=True), col  # jitter apart

    def faults(result: object) -> list[tuple]:
        return [(f.hostname, f.gpu, f.summary.split(" on GPU")[0].split(" at ")[0]) for f in result.findings
                if f.kind == GPU_FAULT]

    assert faults(got) == faults(want)
    assert {s for *_, s in faults(want)} == {"correctable ECC errors", "NVLink errors"}
