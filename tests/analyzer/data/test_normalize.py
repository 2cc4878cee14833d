"""normalize(): simulated history in both dialects must give the simulator's own Fleet; recorded
dcgm-exporter formats, counter resets, job derivation, XID events and bad input."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from analyzer.data.coverage import HELD, observed_share
from analyzer.data.frame import EVENT_COLUMNS, Fleet
from analyzer.data.ingest import BadLine, IngestReport, read_openmetrics
from analyzer.data.normalize import normalize
from analyzer.data.signals import NAMES
from exporter import schema as S
from tests.analyzer.data.kit import (
    DCGM_ATOL,
    FIXTURES,
    MIB,
    OFFSETS,
    STEP,
    T0,
    _events,
    _strings,
    assert_matches,
    from_history,
    long_frame,
    reference,
)


@pytest.mark.parametrize("name", sorted(OFFSETS))
def test_truegpu_history_equals_simulator_fleet(tmp_path, name):
    got, want = from_history(tmp_path, name), reference(name)
    assert got.dialect == "truegpu"
    assert_matches(got, want)
    for col in ("model", "site", "rack"):
        np.testing.assert_array_equal(_strings(got.frame[col]), _strings(want.frame[col]), err_msg=col)
    assert got.missing == {}
    assert _events(got) == _events(want)
    assert got.events["count"].tolist() == want.events.sort_values(["timestamp", "hostname"])["count"].tolist()
    assert set(map(tuple, got.topology.to_numpy())) == set(map(tuple, want.topology.to_numpy()))
    assert not want.topology.empty
    if name != "mig-training":
        assert _events(want), "the window should hold XID events"


@pytest.mark.parametrize("name", sorted(OFFSETS))
@pytest.mark.parametrize(
    "opts",
    [{"counters": "all"}, {"counters": "all", "hostname_label": "hostname"}, {"counters": "all", "legacy": True}],
    ids=["Hostname", "hostname", "1.x"],
)
def test_dcgm_history_equals_simulator_fleet(tmp_path, name, opts):
    got, want = from_history(tmp_path, name, "dcgm", **opts), reference(name)
    assert got.dialect == "dcgm"
    assert_matches(got, want, DCGM_ATOL)
    model = _strings(got.frame["model"])
    if opts.get("legacy"):
        assert set(model) == {""}  # 1.x prints no modelName
    else:
        np.testing.assert_array_equal(model, _strings(want.frame["model"]))
    # dcgm-exporter knows nothing of racks, topology or NVLink link states; sites are kube-state-metrics' node zones
    np.testing.assert_array_equal(_strings(got.frame["site"]), _strings(want.frame["site"]))
    assert set(_strings(got.frame["rack"])) == {""}
    assert got.topology.empty
    assert set(got.missing) == {"nvlink_links_up", "nvlink_links_down"}
    assert "dcgm-exporter has no field" in got.missing["nvlink_links_up"]
    # the last-XID gauge shows each new code once
    assert _events(got) == _events(want)


def test_dcgm_default_counters_say_sm_active_is_unknown(tmp_path):
    got, want = from_history(tmp_path, "mixed-fleet", "dcgm", counters="default"), reference("mixed-fleet")
    for name in ("sm_active", "sm_occupancy", "thermal_throttle", "power_limit"):
        assert name not in got.frame.columns
    assert "DCGM_FI_PROF_SM_ACTIVE not collected" in got.missing["sm_active"]
    assert "commented out in the default list" in got.missing["sm_active"]
    assert "DCGM_FI_PROF_SM_OCCUPANCY" in got.missing["sm_occupancy"]
    assert "DCGM_FI_DEV_CLOCKS_EVENT_REASONS" in got.missing["thermal_throttle"]
    assert "last_xid" in got.frame.columns  # the last-XID gauge is in the default list (no remap-pending field)
    # what the default list does carry still matches, memory total included (FB_USED+FREE+RESERVED);
    # NVLink comes from NVLINK_BANDWIDTH_TOTAL, whole MiB/s
    assert_matches(got, want, {**DCGM_ATOL, "nvlink_bps": 0.51 * MIB})
    assert got.has("mem_total") and got.has("tensor_active") and got.has("nvlink_bps")


# Recorded dcgm-exporter formats -----------------------------------------------------------------
def fixture(name: str, **kw) -> Fleet:
    long, report = read_openmetrics(FIXTURES / name, default_timestamp=T0)
    return normalize(long, report=report, **kw)


def _row(fleet: Fleet, gpu: str, instance: str = "") -> pd.Series:
    f = fleet.frame
    rows = f[(f["gpu"] == gpu) & (f["gpu_instance"] == instance)]
    assert len(rows) == 1, (gpu, instance)
    return rows.iloc[0]


def test_h100_mig_pods_fixture():
    fleet = fixture("h100_mig_pods.txt")
    f = fleet.frame
    assert fleet.dialect == "dcgm" and fleet.step == 60.0 and fleet.start == T0
    # MIG GPUs become one row per instance (and one for the slices no instance holds), whole GPUs one row each
    assert list(zip(f["gpu"], f["gpu_instance"], strict=True)) == [
        ("0", ""), ("1", ""), ("2", ""), ("3", ""), ("4", ""), ("5", ""),
        ("6", "1"), ("6", "2"), ("6", "uncarved"), ("7", "1"), ("7", "5"), ("7", "13"),
    ]  # fmt: skip
    assert _row(fleet, "6", "uncarved")["gpu_share"] == pytest.approx(1 / 7)  # 3g + 3g of 7: one seventh free
    assert pd.isna(_row(fleet, "6", "uncarved")["job"]) and pd.isna(_row(fleet, "6", "uncarved")["sm_active"])
    assert _row(fleet, "6", "1")["mig_profile"] == "3g.40gb"
    assert _row(fleet, "6", "1")["gpu_share"] == pytest.approx(3 / 7)
    assert _row(fleet, "7", "13")["gpu_share"] == pytest.approx(1 / 7)
    assert set(f["hostname"]) == {"gpu-h100-017"} and set(f["model"]) == {"NVIDIA H100 80GB HBM3"}
    # pod -> job (training operator and Deployment names)
    assert _row(fleet, "0")["job"] == "llama3-70b-pretrain" and _row(fleet, "0")["namespace"] == "ml-train"
    assert _row(fleet, "4")["job"] == "bert-ft"
    assert _row(fleet, "6", "1")["job"] == "vllm-serve" and _row(fleet, "6", "1")["container"] == "vllm"
    assert pd.isna(_row(fleet, "5")["pod"]) and pd.isna(_row(fleet, "6", "2")["job"])
    # units: % -> ratio, MHz -> Hz, MiB -> bytes, rates summed tx+rx
    g3 = _row(fleet, "3")
    assert g3["gpu_util"] == pytest.approx(0.95)
    assert g3["sm_clock"] == 1980e6
    assert g3["mem_used"] == 65020 * MIB
    assert g3["mem_total"] == (65020 + 16010 + 529) * MIB
    assert g3["pcie_bps"] == 119870011 + 229001577
    # bitmask 36 = SW_POWER_CAP | SW_THERMAL
    assert (g3["thermal_throttle"], g3["power_throttle"], g3["idle_clocks"]) == (1.0, 1.0, 0.0)
    # MIG instances: no GPU util (unknown, not 0), their own memory and rates
    assert pd.isna(_row(fleet, "7", "1")["gpu_util"])
    assert _row(fleet, "7", "1")["mem_total"] == (20000 + 20192) * MIB
    assert _row(fleet, "7", "5")["pcie_bps"] == 4096
    assert 0 < _row(fleet, "6", "1")["sm_active"] < 1
    # one snapshot: counters give no rate, and the XID already shown has no known time
    assert fleet.events.empty
    assert any("XID 13" in n and "gpu-h100-017/4" in n for n in fleet.notes)
    assert "pcie_gen" in fleet.missing and "DCGM_FI_DEV_PCIE_LINK_GEN" in fleet.missing["pcie_gen"]


def test_a100_1x_dialect_fixture():
    fleet = fixture("a100_1x_dialect.txt")
    f = fleet.frame
    assert len(f) == 4 and fleet.dialect == "dcgm"
    assert _row(fleet, "0")["uuid"] == "GPU-ef93d360-6e44-30fa-5085-852515d198c7"
    assert _row(fleet, "0")["pod"] == "resnet50-train-worker-0"
    assert _row(fleet, "0")["namespace"] == "vision" and _row(fleet, "0")["container"] == "trainer"
    assert _row(fleet, "0")["job"] == "resnet50-train"
    assert _row(fleet, "2")["job"] == "jupyter-alice"
    assert pd.isna(_row(fleet, "3")["namespace"])
    assert _row(fleet, "0")["sm_clock"] == 1410e6
    assert _row(fleet, "0")["mem_total"] == pytest.approx(_row(fleet, "0")["mem_used"] + 10536 * MIB)
    assert any("hostname" in n for n in fleet.notes)
    assert "DCGM_FI_PROF_SM_ACTIVE" in fleet.missing["sm_active"]


@pytest.mark.parametrize(("edit", "note"), [
    (lambda t: t.replace('UUID="GPU-', 'X="GPU-'), "4 GPU(s) carry no UUID label"),
    (lambda t: __import__("re").sub(r'UUID="GPU-[^"]*"', 'UUID="GPU-same"', t), "1 UUID(s) appear on more than one"),
])
def test_missing_or_repeated_uuids_still_count_every_gpu(tmp_path, edit, note):
    path = tmp_path / "page.txt"
    path.write_text(edit((FIXTURES / "l40s_default_counters.txt").read_text()))
    long, report = read_openmetrics(path, default_timestamp=T0)
    fleet = normalize(long, report=report)
    assert fleet.gpu_count() == 4 and len(fleet.frame) == 4
    assert any(note in n for n in fleet.notes), fleet.notes


@pytest.mark.parametrize("path", sorted((FIXTURES / "real").glob("*.txt")), ids=lambda p: p.stem)
def test_real_pages_from_public_threads_are_analyzed(path):
    """Every real page (fixtures/dcgm/real/SOURCES.md) normalizes: GPUs counted by host and index, the
    exporter's pod name as host said plainly, never an exception."""
    long, report = read_openmetrics(path, default_timestamp=T0)
    fleet = normalize(long, report=report)
    assert fleet.gpu_count() >= 1 and fleet.dialect == "dcgm"
    pod_hosts = [h for h in set(fleet.frame["hostname"].astype(str)) if S.DCGM_EXPORTER_POD.fullmatch(h)]
    assert bool(pod_hosts) == any("dcgm-exporter pod names" in n for n in fleet.notes)


def test_mig_only_input_never_asks_for_gpu_util(tmp_path):
    """NVIDIA does not report GPU_UTIL for MIG instances: no counters CSV can add it, so say so."""
    text = (FIXTURES / "h100_mig_pods.txt").read_text().splitlines()
    path = tmp_path / "mig.txt"
    path.write_text("\n".join(x for x in text if x.startswith("#") or 'gpu="6"' in x or 'gpu="7"' in x) + "\n")
    long, report = read_openmetrics(path, default_timestamp=T0)
    fleet = normalize(long, report=report)
    assert "NVIDIA does not report GPU utilization for MIG instances" in fleet.missing["gpu_util"]
    assert "GR_ENGINE_ACTIVE" in fleet.missing["gpu_util"] and "counters CSV" not in fleet.missing["gpu_util"]
    assert "counters CSV" in fixture("h100_mig_pods.txt").missing.get("mem_util", "counters CSV")


def test_percent_fields_are_exact_ratios(tmp_path):
    """57 % is 0.57, not 57 * 0.01 = 0.5700000000000001 (and so on every percent in 0..100)."""
    lines = [f'DCGM_FI_DEV_GPU_UTIL{{gpu="{p}",UUID="GPU-{p}",Hostname="n"}} {p}' for p in range(101)]
    path = tmp_path / "pct.txt"
    path.write_text("\n".join(lines) + "\n")
    long, report = read_openmetrics(path, default_timestamp=T0)
    frame = normalize(long, report=report).frame
    got = dict(zip(frame["gpu"].astype(int), frame["gpu_util"], strict=True))
    assert all(got[p] == p / 100 for p in range(101)) and repr(got[57]) == "0.57"


def test_l40s_default_counters_fixture():
    fleet = fixture("l40s_default_counters.txt")
    assert "sm_active" not in fleet.frame.columns and "sm_occupancy" not in fleet.frame.columns
    assert "DCGM_FI_PROF_SM_ACTIVE not collected" in fleet.missing["sm_active"]
    assert "commented out" in fleet.missing["sm_active"]
    assert "mem_temp" in fleet.missing and "thermal_throttle" in fleet.missing
    assert set(fleet.frame["hostname"]) == {"infer-l40s-03"}
    assert fleet.frame["pod"].isna().all() and fleet.frame["job"].isna().all()
    assert fleet.frame["gpu_util"].tolist() == pytest.approx([0.92, 0.90, 0.35, 0.0])
    assert fleet.has("tensor_active")


def test_t4_sentinels_are_unknown_never_values():
    fleet = fixture("t4_sentinels.txt")
    g0, g1 = _row(fleet, "0"), _row(fleet, "1")
    assert g0["power"] == pytest.approx(41.377)
    for name in ("power", "mem_used", "thermal_throttle", "mem_temp"):
        assert pd.isna(g1[name]), name
    assert pd.isna(g0["mem_temp"])
    big = fleet.frame[list(fleet.signals)].abs().max().max()
    assert big < 1e12  # no sentinel leaked through as a value
    assert "mem_temp" in fleet.missing and "not-supported" in fleet.missing["mem_temp"]
    assert any("DCGM blank/not-supported values treated as unknown" in n for n in fleet.notes)


def test_v100_ecc_nvlink_xid_fixture():
    fleet = fixture("v100_ecc_nvlink_xid.txt")
    g0, g3 = _row(fleet, "0"), _row(fleet, "3")
    assert g0["job"] == "881234" and pd.isna(g0["pod"])  # dcgm-exporter's hpc_job mapping
    assert pd.isna(_row(fleet, "2")["job"])
    # deprecated CLOCK_THROTTLE_REASONS: 68 = SW_POWER_CAP | HW_THERMAL; 1 = GPU_IDLE
    assert (g3["thermal_throttle"], g3["power_throttle"]) == (1.0, 1.0)
    assert _row(fleet, "1")["idle_clocks"] == 1.0
    # NVLINK_BANDWIDTH_TOTAL is a MiB/s rate despite its counter type
    assert g0["nvlink_bps"] == 41002 * MIB
    assert g0["mem_total"] > g0["mem_used"] > 0
    assert {"ecc_uncorrectable_rate", "nvlink_error_rate"} <= set(fleet.frame.columns)
    assert any("hpc-v100-12/2 XID 48" in n for n in fleet.notes)
    explicit = fixture("v100_ecc_nvlink_xid.txt", job_label="hpc_job")
    assert _strings(explicit.frame["job"]).tolist() == _strings(fleet.frame["job"]).tolist()


# Synthetic inputs: counters, resampling, jobs, events ----------------------------------------------
GPU0 = {"hostname": "n1", "gpu": "0", "uuid": "GPU-0"}


def times(n: int, step: float = STEP) -> list[float]:
    return [T0 + step * i for i in range(n)]


def test_counter_reset_is_a_restart_not_a_negative_rate():
    replays = S.PCIE_REPLAYS.name
    fleet = normalize(long_frame((replays, GPU0, times(5), [100, 160, 30, 90, 90])))
    rates = fleet.frame["pcie_replay_rate"].tolist()
    assert rates[:4] == pytest.approx([1.0, 0.5, 1.0, 0.0])  # 160 -> 30: the counter restarted, +30
    assert np.isnan(rates[4])  # no later sample: unknown, not 0
    assert any("1 counter resets" in n for n in fleet.notes)
    # the same through dcgm-exporter's counter field
    field = S.PCIE_REPLAYS.dcgm[0].field
    dcgm = normalize(long_frame((field, {"gpu": "0", "UUID": "GPU-0", "Hostname": "n1"}, times(5),
                                 [100, 160, 30, 90, 90])))  # fmt: skip
    assert dcgm.frame["pcie_replay_rate"].tolist()[:4] == pytest.approx([1.0, 0.5, 1.0, 0.0])


def test_a_counter_rounded_down_in_its_last_digit_is_flat_not_restarted():
    """A flat NVLink byte counter near 4.6e14 that reads back a last digit lower (VictoriaMetrics keeps ~15
    significant digits per block; seen once as a 7.7 TB/s spike in its test) is flat, not a restart from 0."""
    nvl = S.NVLINK_BYTES.name
    big = 4.6e14
    fleet = normalize(long_frame((nvl, {**GPU0, "direction": "tx"}, times(4), [big, big, big - 0.5, big - 0.5])))
    assert fleet.frame["nvlink_bps"].tolist()[:3] == pytest.approx([0.0, 0.0, 0.0])
    assert not any("counter resets" in n for n in fleet.notes)
    restarted = normalize(long_frame((nvl, {**GPU0, "direction": "tx"}, times(3), [big, big, 6e9])))
    assert restarted.frame["nvlink_bps"].tolist()[1] == pytest.approx(6e9 / STEP)  # a real restart, from 0
    assert any("1 counter resets" in n for n in restarted.notes)


def test_resampling_means_gauges_and_rates_counters_over_the_step():
    ts = times(8, 15.0)  # 15 s samples, 60 s step
    fleet = normalize(long_frame(
        (S.POWER.name, GPU0, ts, [100, 200, 300, 400, 10, 20, 30, 40]),
        (S.PCIE_BYTES.name, {**GPU0, "direction": "tx"}, ts, [0, 15, 30, 45, 60, 75, 90, 105]),
        (S.PCIE_BYTES.name, {**GPU0, "direction": "rx"}, ts, [0, 30, 60, 90, 120, 150, 180, 210]),
    ), step=60.0)  # fmt: skip
    f = fleet.frame
    assert f["timestamp"].tolist() == [T0, T0 + 60]
    assert f["power"].tolist() == [250.0, 25.0]
    # tx + rx = 3 B/s; the last row has only three 15 s pairs but the same rate
    assert f["pcie_bps"].tolist() == pytest.approx([3.0, 3.0])


def test_gaps_are_unknown_not_zero():
    ts = times(6)
    fleet = normalize(long_frame(
        (S.POWER.name, GPU0, ts[:2] + ts[4:], [100, 110, 130, 140]),
        (S.PCIE_REPLAYS.name, GPU0, ts[:2] + ts[4:], [0, 60, 180, 240]),
        (S.POWER.name, {**GPU0, "gpu": "1", "uuid": "GPU-1"}, ts[:1], [50]),
    ))  # fmt: skip
    f = fleet.frame
    g0 = f[f["gpu"] == "0"]
    assert np.isnan(g0["power"].to_numpy()[2:4]).all() and g0["power"].notna().sum() == 4
    assert g0["pcie_replay_rate"].tolist()[:1] == [1.0]
    assert np.isnan(g0["pcie_replay_rate"].to_numpy()[1:4]).all()  # across the gap: unknown
    assert g0["pcie_replay_rate"].tolist()[4] == 1.0
    # a GPU that stopped reporting still has a row at every step, NaN
    assert (f["gpu"] == "1").sum() == 6 and f.loc[f["gpu"] == "1", "power"].notna().sum() == 1


def test_a_node_scraped_less_often_holds_its_samples_and_is_observed():
    """Fleets mix scrape intervals (a scrape job per node pool): a GPU sampled every 60 s among GPUs sampled
    every 15 s is observed at every 15 s row, its value held as Prometheus' lookback holds it, its counters
    read from its own 60 s pairs; only a gap past its own spacing is unknown."""
    fast = {**GPU0, "hostname": "n2", "uuid": "GPU-2"}
    slow_ts = times(8, 60.0)
    slow_ts = slow_ts[:4] + slow_ts[6:]  # two missed scrapes: 180 s without a sample
    power = [100.0, 200.0, 300.0, 400.0, 700.0, 800.0]
    fleet = normalize(long_frame(
        (S.POWER.name, GPU0, slow_ts, power),
        (S.MEMORY_USED.name, GPU0, slow_ts, [1.0] * 6),
        (S.PCIE_REPLAYS.name, GPU0, slow_ts, [0, 60, 120, 180, 360, 420]),
        (S.POWER.name, fast, times(32, 15.0), [50.0] * 32),
        (S.MEMORY_USED.name, fast, times(32, 15.0), [1.0] * 32),
    ))  # fmt: skip
    assert fleet.step == 15.0
    g0 = fleet.frame[fleet.frame["hostname"] == "n1"]
    p = g0["power"].to_numpy()
    np.testing.assert_array_equal(p[:16], np.repeat([100.0, 200.0, 300.0, 400.0], 4))  # each sample holds 60 s
    np.testing.assert_array_equal(g0[HELD].to_numpy()[:16], np.tile([0.0, 1.0, 1.0, 1.0], 4))  # marked held
    assert (fleet.frame.loc[fleet.frame["hostname"] == "n2", HELD] == 0).all()
    assert np.isnan(p[16:24]).all()  # past its own 60 s spacing: unknown
    np.testing.assert_array_equal(p[24:29], [700.0] * 4 + [800.0])
    assert g0["pcie_replay_rate"].to_numpy()[:12] == pytest.approx([1.0] * 12)  # 60 per 60 s pair
    assert np.isnan(g0["pcie_replay_rate"].to_numpy()[12:24]).all()  # across the gap: no rate
    observed = observed_share(fleet.frame)[fleet.frame["hostname"].to_numpy() == "n1"]
    assert (observed[:16] == 1.0).all() and (observed[16:24] == 0.0).all()
    # At a 60 s step the slow GPU's one sample per row covers the row (not 15/60 of it).
    coarse = normalize(long_frame(
        (S.POWER.name, GPU0, slow_ts, power), (S.MEMORY_USED.name, GPU0, slow_ts, [1.0] * 6),
        (S.MEMORY_USED.name, fast, times(32, 15.0), [1.0] * 32),
    ), step=60.0)  # fmt: skip
    share = observed_share(coarse.frame)[coarse.frame["hostname"].to_numpy() == "n1"]
    np.testing.assert_array_equal(share, [1, 1, 1, 1, 0, 0, 1, 1])


def test_absent_fields_named_once_in_the_inputs_dialect():
    """A field counts as absent only when none of its spellings is there, once, by its current name;
    a dcgm page is not told it lacks truegpu_* names."""
    labels = {"gpu": "0", "UUID": "GPU-0", "Hostname": "n1"}
    sm = S.SM_ACTIVE.dcgm[0].field
    report = IngestReport(missing=sorted({*S.dcgm_spellings(sm), "dcgm_fi_dev_gpu_temp", "dcgm_gpu_temp",
                                          S.SM_ACTIVE.name, S.POWER.name}))
    fleet = normalize(long_frame((S.GPU_UTILIZATION.dcgm[0].field, labels, times(2), [50, 50]),
                                 ("DCGM_FI_DEV_GPU_TEMP", labels, times(2), [40, 40])), report=report)
    (note,) = [n for n in fleet.notes if n.startswith("queried but absent")]
    assert note == f"queried but absent from the source: {sm}"
    report.files = ["history.om"]  # what a file read lacks was never asked for: no "queried" there
    fleet = normalize(long_frame((S.GPU_UTILIZATION.dcgm[0].field, labels, times(2), [50, 50])), report=report)
    assert [n for n in fleet.notes if "absent" in n] == [f"read but absent from the files: {sm}"]


def test_workload_label_and_the_older_job_spellings():
    """Allocation info says ``workload`` now; data from before says ``job`` (honor_labels) or
    ``exported_job`` (Prometheus renamed it next to its own scrape ``job``): all three are read."""
    alloc, ts = S.GPU_ALLOCATION_INFO.name, times(2)
    gpus = [{"hostname": "n1", "gpu": str(g), "uuid": f"GPU-{g}"} for g in range(3)]
    fleet = normalize(long_frame(
        *((S.POWER.name, g, ts, [100, 100]) for g in gpus),
        (alloc, {**gpus[0], "namespace": "a", "pod": "p0", "workload": "new", "job": "truegpu-exporter"}, ts, [1, 1]),
        (alloc, {**gpus[1], "namespace": "a", "pod": "p1", "exported_job": "renamed", "job": "truegpu-exporter"},
         ts, [1, 1]),
        (alloc, {**gpus[2], "namespace": "a", "pod": "p2", "job": "honored"}, ts, [1, 1]),
    ))  # fmt: skip
    jobs = fleet.frame.groupby("gpu", observed=True)["job"].first().astype(str).to_dict()
    assert jobs == {"0": "new", "1": "renamed", "2": "honored"}


def test_allocation_and_job_derivation():
    ts = times(4)
    alloc = S.GPU_ALLOCATION_INFO.name
    base = {"namespace": "ml", "container": "c"}
    frame = long_frame(
        (S.POWER.name, GPU0, ts, [1, 2, 3, 4]),
        (S.POWER.name, {**GPU0, "gpu": "1", "uuid": "GPU-1"}, ts, [1, 2, 3, 4]),
        (alloc, {**GPU0, **base, "pod": "llama-ft-worker-3", "job": ""}, ts[1:3], [1, 1]),
        (alloc, {**GPU0, "gpu": "1", "uuid": "GPU-1", **base, "pod": "vllm-7d9c8b6f5-x2k9q", "job": "serve",
                 "job_id": "J42"}, ts, [1, 1, 1, 1]),
    )  # fmt: skip
    f = normalize(frame).frame
    g0, g1 = f[f["gpu"] == "0"], f[f["gpu"] == "1"]
    assert _strings(g0["job"]).tolist() == ["<unallocated>", "llama-ft", "llama-ft", "<unallocated>"]
    assert _strings(g0["pod"]).tolist()[1] == "llama-ft-worker-3"
    assert set(g1["job"]) == {"serve"}  # the exporter's own job label
    explicit = normalize(frame, job_label="job_id").frame
    assert set(explicit.loc[explicit["gpu"] == "1", "job"]) == {"J42"}
    # dcgm pod labels on the samples themselves
    dcgm = long_frame((S.POWER.dcgm[0].field, {"gpu": "0", "UUID": "U", "Hostname": "n1", "pod": "bert-mpi-launcher",
                                               "namespace": "nlp", "container": "l"}, ts, [1, 2, 3, 4]))  # fmt: skip
    assert set(normalize(dcgm).frame["job"]) == {"bert-mpi"}


def test_truegpu_xid_counter_increases_are_events():
    xid = S.XID_ERRORS.name
    fleet = normalize(long_frame(
        (S.POWER.name, GPU0, times(6), [1] * 6),
        (xid, {**GPU0, "xid": "48"}, times(6), [0, 0, 1, 1, 3, 3]),
        (xid, {**GPU0, "xid": "79"}, times(6)[3:], [1, 1, 1]),  # series born by its first event
    ))  # fmt: skip
    ev = fleet.events
    assert list(ev.columns) == list(EVENT_COLUMNS)
    assert list(zip(ev["timestamp"], ev["xid"], ev["count"], strict=True)) == [
        (T0 + 60, "48", 1.0), (T0 + 120, "79", 1.0), (T0 + 180, "48", 2.0),
    ]  # fmt: skip


def test_dcgm_last_xid_changes_are_events():
    labels = {"gpu": "0", "UUID": "GPU-0", "Hostname": "n1"}
    field = S.XID_ERRORS.dcgm[0].field
    fleet = normalize(long_frame(
        (field, {**labels, "err_code": "0"}, times(3), [0, 0, 0]),
        (field, {**labels, "err_code": "48", "err_msg": "DBE"}, times(5)[3:], [48, 48]),
        (field, {**labels, "err_code": "13"}, times(7)[5:], [13, 13]),
    ))  # fmt: skip
    ev = fleet.events
    assert list(zip(ev["timestamp"], ev["xid"], ev["uuid"], strict=True)) == [(T0 + 120, "48", "GPU-0"),
                                                                              (T0 + 240, "13", "GPU-0")]


def test_dcgm_xid_count_collector_sees_a_repeated_xid():
    """The last-XID gauge cannot see XID 31 twice; dcgm-exporter's count collector can, and where a GPU
    has it the gauge is not counted again. Without it the analyzer says repeats are invisible."""
    labels = {"gpu": "0", "UUID": "GPU-0", "Hostname": "n1"}
    last, count = S.XID_ERRORS.dcgm[0].field, S.DCGM_XID_COUNT
    window = {**labels, "xid": "31", "window_size_in_ms": "300000"}
    fleet = normalize(long_frame(
        (last, labels, times(6), [0, 31, 31, 31, 31, 31]),
        (count, window, times(6), [0, 1, 1, 2, 2, 1]),  # XID 31, again, then the first ages out
    ))  # fmt: skip
    ev = fleet.events
    assert list(zip(ev["timestamp"], ev["xid"], ev["count"], strict=True)) == [(T0, "31", 1.0),
                                                                               (T0 + 120, "31", 1.0)]
    assert not any("count collector" in n for n in fleet.notes)
    alone = normalize(long_frame((last, labels, times(6), [0, 31, 31, 31, 31, 31])))
    assert len(alone.events) == 1 and any("same XID repeating is not seen" in n for n in alone.notes)


def test_mixed_dialects_merge_by_device():
    ts = times(3)
    fleet = normalize(long_frame(
        (S.POWER.name, GPU0, ts, [100, 100, 100]),
        (S.POWER.dcgm[0].field, {"gpu": "0", "UUID": "GPU-0", "Hostname": "n1"}, ts, [999, 999, 999]),
        (S.POWER.dcgm[0].field, {"gpu": "1", "UUID": "GPU-1", "Hostname": "n1"}, ts, [50, 50, 50]),
    ))  # fmt: skip
    assert fleet.dialect == "mixed"
    f = fleet.frame
    assert f.groupby("gpu", observed=True)["power"].first().to_dict() == {"0": 100.0, "1": 50.0}


def test_report_is_carried_into_notes():
    report = IngestReport(bad_line_count=3, bad_lines=[BadLine("h.om", 7, "bad value", "x{} abc")],
                          warnings=["timestamps look like ms"], sentinels={"DCGM_FI_DEV_POWER_USAGE": 2})  # fmt: skip
    fleet = normalize(long_frame((S.POWER.name, GPU0, times(2), [1, 2])), report=report)
    text = "\n".join(fleet.notes)
    assert "3 unreadable input lines" in text and "h.om:7" in text
    assert "timestamps look like ms" in text and "DCGM_FI_DEV_POWER_USAGE (2)" in text


def test_bad_input_errors_name_what_and_where():
    with pytest.raises(ValueError, match=r"lacks column.*value"):
        normalize(pd.DataFrame({"metric": ["x"], "timestamp": [1.0]}))
    with pytest.raises(ValueError, match=r"no GPU telemetry.*node_cpu_seconds_total"):
        normalize(long_frame(("node_cpu_seconds_total", {"cpu": "0"}, times(2), [1, 2])))
    good = long_frame((S.POWER.name, GPU0, times(2), [1, 2]))
    with pytest.raises(ValueError, match="step must be a positive number"):
        normalize(good, step=0)
    with pytest.raises(ValueError, match=r"is empty: --end must be after --start"):
        normalize(good, start=T0, end=T0)
    with pytest.raises(TypeError, match="long ingest DataFrame"):
        normalize([1, 2, 3])  # type: ignore[arg-type]
    nogpu = long_frame((S.POWER.name, {"hostname": "n1"}, times(2), [1, 2]))
    with pytest.raises(ValueError, match="gpu label"):
        normalize(nogpu)


def test_truegpu_missing_profiling_names_the_fix():
    fleet = normalize(long_frame((S.POWER.name, GPU0, times(2), [1, 2])))
    assert "sm_active" not in fleet.frame.columns
    assert "truegpu_sm_active_ratio absent" in fleet.missing["sm_active"]
    assert "Hopper" in fleet.missing["sm_active"] and "dcgm-exporter" in fleet.missing["sm_active"]
    # last_xid is dcgm-exporter's last-XID state: truegpu publishes XIDs as events, so it is never missing here
    assert set(fleet.missing) == set(NAMES) - {"power", "last_xid"}
