"""NvmlSource end to end over the fake pynvml (real constants, structs and exceptions)."""

from __future__ import annotations

import logging
import sys

import pynvml as real
import pytest

from exporter import schema
from exporter.sources.base import Reading
from exporter.sources.nvml import NvmlSource
from tests.exporter.fakes.fake_pynvml import (
    MIB,
    FakeGpu,
    FakeNvml,
    VirtualClock,
    a100_pcie_pair,
    h100_node,
    h100_sxm,
    mig_h100,
    v100_pcie,
)

HOST = "node-1"


def make(gpus: list[FakeGpu], **kwargs) -> tuple[FakeNvml, NvmlSource, VirtualClock]:
    clock = VirtualClock()
    fake_kwargs = {k: kwargs.pop(k) for k in ("driver_loaded", "library_found") if k in kwargs}
    fake = FakeNvml(gpus, clock=clock, **fake_kwargs)
    kwargs.setdefault("events", False)
    source = NvmlSource(fake.module, hostname=HOST, clock=clock, sleep=clock.sleep, **kwargs)
    return fake, source, clock


def series(reading: Reading, metric: schema.Metric) -> dict[tuple, float]:
    """(gpu, extra label values...) -> value, for one family."""
    out = {}
    for labels, value in reading.samples.get(metric, []):
        extra = tuple(labels[k] for k in (*metric.labels, *(k for k in schema.MIG_LABELS if k in labels)))
        key = (labels[schema.GPU], *extra)
        assert key not in out, f"duplicate series {metric.name} {labels}"
        out[key] = value
    return out


def gpus_in(reading: Reading) -> set[str]:
    return {labels[schema.GPU] for samples in reading.samples.values() for labels, _ in samples}


@pytest.fixture
def node():
    fake, source, clock = make(h100_node())
    yield fake, source, clock
    source.close()


def test_h100_values_in_base_units(node) -> None:
    fake, source, _clock = node
    reading = source.collect()
    assert reading.up and reading.errors == []
    assert series(reading, schema.GPU_UTILIZATION)[("0",)] == pytest.approx(0.95)
    assert series(reading, schema.MEMORY_UTILIZATION)[("0",)] == pytest.approx(0.40)
    assert series(reading, schema.MEMORY_USED)[("0",)] == 60_000 * MIB
    assert series(reading, schema.MEMORY_TOTAL)[("0",)] == 81559 * MIB
    assert series(reading, schema.POWER)[("0",)] == pytest.approx(450.123)
    assert series(reading, schema.POWER_LIMIT)[("0",)] == pytest.approx(700.0)
    assert series(reading, schema.ENERGY)[("3",)] == pytest.approx(4000.0)  # 4e6 mJ
    temps = series(reading, schema.TEMPERATURE)
    assert temps[("0", "gpu")] == 55 and temps[("0", "memory")] == 60
    assert series(reading, schema.SM_CLOCK)[("0",)] == 1755e6
    assert series(reading, schema.SM_CLOCK_MAX)[("0",)] == 1980e6
    assert series(reading, schema.MEMORY_CLOCK)[("0",)] == 2619e6
    assert series(reading, schema.PCIE_LINK_GENERATION)[("0", "current")] == 5
    assert series(reading, schema.PCIE_LINK_WIDTH)[("0", "max")] == 16
    assert series(reading, schema.NVLINK_LINKS)[("0", "up")] == 18
    assert series(reading, schema.NVLINK_LINKS)[("0", "down")] == 0
    assert series(reading, schema.GPM_SUPPORTED) == {(str(i),): 1.0 for i in range(8)}
    info = {labels[schema.GPU]: labels for labels, _ in reading.samples[schema.GPU_INFO]}
    assert info["0"]["model"] == "NVIDIA H100 80GB HBM3"
    assert info["0"]["driver_version"] == "550.54.15"
    assert info["0"]["pci_bus_id"] == "00000000:18:00.0"
    assert [info[str(i)]["numa_node"] for i in range(8)] == ["0"] * 4 + ["1"] * 4
    assert info["7"][schema.HOSTNAME] == HOST
    assert info["7"][schema.UUID] == fake.gpus[7].uuid


def test_every_sample_carries_exactly_the_contract_labels(node) -> None:
    _, source, _ = node
    reading = source.collect()
    assert len(reading.samples) >= 25
    for metric, samples in reading.samples.items():
        assert metric in schema.METRICS and metric not in schema.SELF_METRICS
        for labels, value in samples:
            assert set(labels) == set(metric.all_labels), (metric.name, labels)
            assert isinstance(value, float)


def test_clock_event_bitmask_decoded_into_one_series_per_reason(node) -> None:
    fake, source, _ = node
    fake.gpus[2].clock_reasons = real.nvmlClocksEventReasonSwPowerCap | real.nvmlClocksEventReasonHwThermalSlowdown
    events = series(source.collect(), schema.CLOCK_EVENT_ACTIVE)
    gpu2 = {reason: v for (gpu, reason), v in events.items() if gpu == "2"}
    assert set(gpu2) == set(schema.CLOCK_EVENT_REASONS.values())
    assert {r for r, v in gpu2.items() if v == 1.0} == {"sw_power_cap", "hw_thermal"}
    assert all(v == 0.0 for (gpu, _), v in events.items() if gpu != "2")


def test_gpm_percent_becomes_ratio_and_samples_are_100ms_apart(node) -> None:
    fake, source, clock = node
    first = source.collect()
    assert clock.slept == [pytest.approx(0.1)]  # one wait for all eight GPUs
    assert series(first, schema.SM_ACTIVE)[("0",)] == pytest.approx(0.60)
    assert series(first, schema.SM_OCCUPANCY)[("0",)] == pytest.approx(0.30)
    assert series(first, schema.TENSOR_ACTIVE)[("0",)] == pytest.approx(0.20)
    assert series(first, schema.DRAM_ACTIVE)[("0",)] == pytest.approx(0.40)
    assert series(first, schema.GRAPHICS_ENGINE_ACTIVE)[("0",)] == pytest.approx(0.95)

    fake.gpus[0].gpm[real.NVML_GPM_METRIC_SM_UTIL] = 12.5
    clock.advance(15)
    second = source.collect()
    assert len(clock.slept) == 1  # previous sample is 15 s old: no waiting
    assert series(second, schema.SM_ACTIVE)[("0",)] == pytest.approx(0.125)

    clock.advance(0.03)
    source.collect()
    assert clock.slept[1] == pytest.approx(0.07)  # only the missing part of the interval
    assert all(t2 - t1 >= 0.1 - 1e-9 for t1, t2 in fake.metrics_calls)
    assert len(fake.metrics_calls) == 3 * 8


def test_byte_counters_integrate_rates_and_never_decrease(node) -> None:
    fake, source, clock = node
    gpu0 = fake.gpus[0]
    totals = []
    for step, (advance, mib_s, kib) in enumerate([(0, 100.0, 10), (10, 100.0, 30), (5, 400.0, 30), (20, 0.0, 90)]):
        clock.advance(advance)
        gpu0.gpm[real.NVML_GPM_METRIC_PCIE_TX_PER_SEC] = mib_s
        gpu0.nvlinks[0].tx_kib = kib
        reading = source.collect()
        tx = series(reading, schema.PCIE_BYTES)[("0", "tx")]
        totals.append(tx)
        if step:
            assert tx >= totals[-2]
        # NVLink bytes are the driver's KiB counter summed over links, in bytes
        assert series(reading, schema.NVLINK_BYTES)[("0", "tx")] == kib * 1024
    # GPM rate x interval between samples: 0.1 s priming, then 10, 5, 20 s
    expected = 100 * MIB * 0.1 + 100 * MIB * 10 + 400 * MIB * 5 + 0.0 * 20
    assert totals[-1] == pytest.approx(expected)


def test_pcie_throughput_integrated_when_there_is_no_gpm(tmp_path) -> None:
    fake, source, clock = make(a100_pcie_pair(), sysfs_root=tmp_path)
    try:
        first = series(source.collect(), schema.PCIE_BYTES)
        assert first[("0", "tx")] == 0.0  # a counter starts at zero with the exporter
        clock.advance(10)
        second = series(source.collect(), schema.PCIE_BYTES)
        assert second[("0", "tx")] == pytest.approx(4000 * 1024 * 10)
        assert second[("0", "rx")] == pytest.approx(8000 * 1024 * 10)
        fake.gpus[0].pcie_tx_kbps = 8000
        clock.advance(10)
        third = series(source.collect(), schema.PCIE_BYTES)
        assert third[("0", "tx")] == pytest.approx(4000 * 1024 * 10 + 6000 * 1024 * 10)  # trapezoid
    finally:
        source.close()


def test_a100_without_gpm_omits_profiling_and_unsupported_fields(tmp_path, caplog) -> None:
    for bus, node in (("0000:3b:00.0", "0"), ("0000:af:00.0", "1")):
        (tmp_path / "bus/pci/devices" / bus).mkdir(parents=True)
        (tmp_path / "bus/pci/devices" / bus / "numa_node").write_text(node + "\n")
    caplog.set_level(logging.INFO, logger="exporter.sources.nvml")
    fake, source, clock = make(a100_pcie_pair(), sysfs_root=tmp_path)
    try:
        for _ in range(3):
            clock.advance(5)
            reading = source.collect()
        assert reading.up and reading.errors == []
        assert series(reading, schema.GPM_SUPPORTED) == {("0",): 0.0, ("1",): 0.0}
        for family in (schema.SM_ACTIVE, schema.SM_OCCUPANCY, schema.TENSOR_ACTIVE, schema.DRAM_ACTIVE):
            assert family not in reading.samples  # unknown, never 0
        assert set(series(reading, schema.TEMPERATURE)) == {("0", "gpu"), ("1", "gpu")}
        info = {labels[schema.GPU]: labels["numa_node"] for labels, _ in reading.samples[schema.GPU_INFO]}
        assert info == {"0": "0", "1": "1"}  # from sysfs: this NVML has no nvmlDeviceGetNumaNodeId
        topo = series(reading, schema.GPU_TOPOLOGY_INFO)
        assert topo == {("0", "1", "nvlink"): 1.0, ("1", "0", "nvlink"): 1.0}  # NVLink bridge
        gpm_logs = [r for r in caplog.records if "GPM" in r.getMessage()]
        assert len(gpm_logs) == 1 and "A100" in gpm_logs[0].getMessage()
        assert fake.gpus[0].call_counts["nvmlGpmSampleGet"] == 0
    finally:
        source.close()


def test_video_engines_as_ratios_and_absent_where_the_gpu_has_none(node) -> None:
    fake, source, clock = node
    fake.gpus[0].util_enc, fake.gpus[0].util_dec = 25, 60
    fake.gpus[1].util_enc = None  # no NVENC on this GPU: NOT_SUPPORTED, unknown, never 0
    clock.advance(1)
    reading = source.collect()
    assert reading.up and reading.errors == []
    enc, dec = series(reading, schema.ENCODER_UTILIZATION), series(reading, schema.DECODER_UTILIZATION)
    assert enc[("0",)] == 0.25 and dec[("0",)] == 0.6
    assert ("1",) not in enc and ("1",) in dec


def test_fans_pstate_and_violation_time_where_the_gpu_has_them(node) -> None:
    import pynvml as real

    fake, source, clock = node
    fake.gpus[0].fan_pct, fake.gpus[0].pstate = 45, 2
    fake.gpus[0].violation_ns = {real.NVML_PERF_POLICY_POWER: 3_500_000_000, real.NVML_PERF_POLICY_THERMAL: 0}
    fake.gpus[1].pstate = real.NVML_PSTATE_UNKNOWN
    clock.advance(1)
    reading = source.collect()
    assert reading.up and reading.errors == []
    assert series(reading, schema.FAN_SPEED) == {("0",): 0.45}  # the others are passively cooled: absent
    pstates = series(reading, schema.PERFORMANCE_STATE)
    assert pstates[("0",)] == 2.0 and ("1",) not in pstates  # unknown P-state left out, never 32
    held = series(reading, schema.CLOCK_VIOLATION)
    assert held[("0", "power")] == 3.5 and held[("0", "thermal")] == 0.0


def test_not_supported_omits_only_that_family_and_is_not_retried(node) -> None:
    fake, source, clock = node
    fake.gpus[3].not_supported = {"nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetRemappedRows"}
    for _ in range(3):
        clock.advance(1)
        reading = source.collect()
    assert reading.up and reading.errors == []
    assert set(series(reading, schema.ENERGY)) == {(str(i),) for i in range(8) if i != 3}
    assert "3" not in {k[0] for k in series(reading, schema.ROW_REMAP_PENDING)}
    assert series(reading, schema.POWER)[("3",)] == pytest.approx(450.123)  # the rest of GPU 3 stays
    assert fake.gpus[3].call_counts["nvmlDeviceGetTotalEnergyConsumption"] == 1
    assert fake.gpus[3].call_counts["nvmlDeviceGetRemappedRows"] == 1


def test_memory_health_follows_the_architecture(tmp_path) -> None:
    """Hopper/Ampere: spare-row histogram, no retired pages; Volta: retired pages, no row remapper.
    The other generation's calls answer NotSupported once, are never asked again and publish nothing."""
    h100, a100, v100 = h100_sxm(0), a100_pcie_pair()[0], v100_pcie(0)
    h100.remap_histogram = (10230, 6, 3, 1, 0)
    a100.remap_histogram = (9000, 0, 0, 1, 2)
    v100.retired_pages = {
        real.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS: [0x1A2B000, 0x1A2C000],
        real.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR: [0x3F00000],
    }
    v100.retired_pending = True
    _fake, source, clock = make([h100, a100, v100], sysfs_root=tmp_path)
    try:
        for _ in range(3):
            clock.advance(1)
            reading = source.collect()
        assert reading.up and reading.errors == []
        banks = series(reading, schema.ROW_REMAP_BANKS)
        assert {k: v for k, v in banks.items() if k[0] == "0"} == {
            ("0", "max"): 10230, ("0", "high"): 6, ("0", "partial"): 3, ("0", "low"): 1, ("0", "none"): 0}
        assert banks[("1", "none")] == 2 and banks[("1", "max")] == 9000
        assert {k[0] for k in banks} == {"0", "1"}  # the V100 has no row remapper: absent, not 0
        assert series(reading, schema.RETIRED_PAGES) == {("2", "single_bit_ecc"): 2.0, ("2", "double_bit_ecc"): 1.0}
        assert series(reading, schema.RETIRED_PAGES_PENDING) == {("2",): 1.0}
        assert {k[0] for k in series(reading, schema.REMAPPED_ROWS)} == {"0", "1"}
        assert series(reading, schema.TEMPERATURE)[("2", "gpu")] == 52  # the rest of the V100 stays
        for gpu in (h100, a100):
            assert gpu.call_counts["nvmlDeviceGetRetiredPages"] == 1
            assert gpu.call_counts["nvmlDeviceGetRetiredPagesPendingStatus"] == 1
            assert gpu.call_counts["nvmlDeviceGetRowRemapperHistogram"] == 3
        assert v100.call_counts["nvmlDeviceGetRowRemapperHistogram"] == 1
        assert v100.call_counts["nvmlDeviceGetRemappedRows"] == 1
        assert v100.call_counts["nvmlDeviceGetRetiredPages"] == 3 * 2  # one call per cause

        v100.retired_pending = False  # the driver was reloaded: the pages are set aside
        v100.retired_pages[real.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR].append(0x4000000)
        reading = source.collect()
        assert series(reading, schema.RETIRED_PAGES)[("2", "double_bit_ecc")] == 2.0
        assert series(reading, schema.RETIRED_PAGES_PENDING) == {("2",): 0.0}
    finally:
        source.close()


def test_recovery_action_is_the_nvml_code_and_absent_where_unknown(node) -> None:
    fake, source, clock = node
    fake.gpus[0].recovery_action = real.NVML_GPU_RECOVERY_ACTION_DRAIN_AND_RESET
    fake.gpus[1].recovery_action = real.NVML_GPU_RECOVERY_ACTION_GPU_RESET
    fake.gpus[2].recovery_action = None  # this GPU does not report it: NOT_SUPPORTED
    # a driver older than the field rejects its ID: left out, neither an error nor 0
    fake.gpus[3].field_returns = {real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: real.NVML_ERROR_INVALID_ARGUMENT}
    for _ in range(2):
        clock.advance(1)
        reading = source.collect()
    assert reading.up and reading.errors == []
    actions = series(reading, schema.GPU_RECOVERY_ACTION)
    assert actions == {("0",): 4.0, ("1",): 1.0, **{(str(i),): 0.0 for i in range(4, 8)}}
    assert schema.GPU_RECOVERY_ACTIONS[int(actions[("0",)])] == "drain_and_reset"
    for i in (2, 3):
        assert fake.gpus[i].fields_asked.count(real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) == 1
        assert series(reading, schema.TEMPERATURE)[(str(i), "memory")] == 60  # same batch, still read
    assert fake.gpus[0].fields_asked.count(real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION) == 2

    # any other per-field failure is an error this round, and the field is asked again next round
    fake.gpus[4].field_returns = {real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION: real.NVML_ERROR_UNKNOWN}
    reading = source.collect()
    assert [(e.kind, e.gpu) for e in reading.errors] == [("nvml_error", "4")]
    assert ("4",) not in series(reading, schema.GPU_RECOVERY_ACTION)
    assert series(reading, schema.POWER)[("4",)] == pytest.approx(450.123)
    del fake.gpus[4].field_returns[real.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION]
    assert series(source.collect(), schema.GPU_RECOVERY_ACTION)[("4",)] == 0.0


def test_binding_older_than_the_new_calls_omits_them() -> None:
    """An nvidia-ml-py without the histogram call or the recovery field ID still serves everything else."""
    clock = VirtualClock()
    fake = FakeNvml(h100_node(2), clock=clock)
    del fake.module.nvmlDeviceGetRowRemapperHistogram
    del fake.module.NVML_FI_DEV_GET_GPU_RECOVERY_ACTION
    source = NvmlSource(fake.module, hostname=HOST, clock=clock, sleep=clock.sleep, events=False)
    try:
        reading = source.collect()
        assert reading.up and reading.errors == []
        assert schema.ROW_REMAP_BANKS not in reading.samples
        assert schema.GPU_RECOVERY_ACTION not in reading.samples
        assert series(reading, schema.TEMPERATURE)[("1", "memory")] == 60
        assert set(series(reading, schema.REMAPPED_ROWS)) == {(g, t) for g in "01" for t in schema.ECC_TYPES}
    finally:
        source.close()


def test_gpu_lost_while_reading_memory_health_loses_only_that_gpu(node) -> None:
    fake, source, clock = node
    fake.gpus[6].raises = {"nvmlDeviceGetRowRemapperHistogram": real.NVMLError(real.NVML_ERROR_GPU_IS_LOST)}
    clock.advance(1)
    reading = source.collect()
    assert [(e.kind, e.gpu) for e in reading.errors] == [("gpu_lost", "6")]
    assert {k[0] for k in series(reading, schema.ROW_REMAP_BANKS)} == {str(i) for i in range(8)} - {"6"}


def test_lost_gpu_loses_only_its_own_series(node) -> None:
    fake, source, clock = node
    assert gpus_in(source.collect()) == {str(i) for i in range(8)}
    fake.gpus[5].lost_after = fake.gpus[5].calls + 4  # falls off the bus mid-collection
    for _ in range(2):
        clock.advance(1)
        reading = source.collect()
        assert not reading.up
        assert [(e.kind, e.gpu) for e in reading.errors] == [("gpu_lost", "5")]
        assert gpus_in(reading) == {str(i) for i in range(8)} - {"5"}
        topo = series(reading, schema.GPU_TOPOLOGY_INFO)
        assert len(topo) == 7 * 6 and all("5" not in key[:2] for key in topo)
        assert len(reading.samples[schema.SM_ACTIVE]) == 7


def test_mig_instances_get_their_own_series() -> None:
    _fake, source, _clock = make([mig_h100(0), *h100_node(2)[1:]])
    try:
        reading = source.collect()
        assert reading.up and reading.errors == []
        used = series(reading, schema.MEMORY_USED)
        assert used[("0", "1", "3g.40gb")] == 30_000 * MIB
        assert used[("0", "5", "2g.20gb")] == 5_000 * MIB
        assert used[("0", "6", "2g.20gb")] == 0
        assert used[("0",)] == 60_000 * MIB  # the whole GPU stays too
        sm = series(reading, schema.SM_ACTIVE)
        assert sm[("0", "1", "3g.40gb")] == pytest.approx(0.70)
        assert sm[("0", "5", "2g.20gb")] == pytest.approx(0.20)
        assert sm[("0", "6", "2g.20gb")] == 0.0
        # NVML reports no utilization for a GPU in MIG mode: omitted, not 0, not an error
        assert set(series(reading, schema.GPU_UTILIZATION)) == {("1",)}
        for labels, _ in reading.samples[schema.MEMORY_USED]:
            assert (schema.GPU_INSTANCE in labels) == (schema.MIG_PROFILE in labels)
    finally:
        source.close()


def test_topology_from_pcie_hierarchy_without_nvlink() -> None:
    gpus = h100_node(8)
    for gpu in gpus:
        gpu.nvlinks = []
    gpus[2].hostbridge, gpus[2].pcie_switch = 0, 1  # behind GPU 0's host bridge, own switch
    _, source, _ = make(gpus)
    try:
        reading = source.collect()
        topo = {(a, b): link for (a, b, link) in series(reading, schema.GPU_TOPOLOGY_INFO)}
        assert len(topo) == 56
        assert topo[("0", "1")] == "pcie_switch"
        assert topo[("0", "2")] == "host_bridge"
        assert topo[("0", "3")] == "numa"
        assert topo[("0", "4")] == "system"
        assert topo[("4", "0")] == "system"
        assert set(topo.values()) <= set(schema.TOPOLOGY_LINKS)
        for family in (schema.NVLINK_BYTES, schema.NVLINK_LINKS, schema.NVLINK_ERRORS):
            assert family not in reading.samples  # no NVLink: absent, not 0
        assert set(series(reading, schema.PCIE_BYTES)) == {(str(i), d) for i in range(8) for d in ("tx", "rx")}
    finally:
        source.close()


def test_hgx_nvswitch_gpus_are_all_nvlink_peers(node) -> None:
    _, source, _ = node
    topo = series(source.collect(), schema.GPU_TOPOLOGY_INFO)
    assert len(topo) == 56 and {link for (_, _, link) in topo} == {"nvlink"}


def test_xid_events_counted_and_watcher_survives_errors() -> None:
    fake, source, _clock = make(h100_node(4), events=True, event_timeout_ms=5)
    try:
        watcher = source.event_watcher
        assert watcher is not None
        assert fake.registered() == {
            i: real.nvmlEventTypeXidCriticalError | real.nvmlEventTypeDoubleBitEccError for i in range(4)
        }
        fake.emit_xid(2, 48)
        fake.emit_xid(2, 48)
        fake.emit_xid(3, 13)
        assert watcher.wait_for_events(3, timeout=10)
        xids = series(source.collect(), schema.XID_ERRORS)
        assert xids == {("2", "48"): 2.0, ("3", "13"): 1.0}

        fake.wait_errors.append(real.NVML_ERROR_UNKNOWN)  # a failing wait: logged, backed off
        fake.emit_xid(1, 79)
        fake.emit_double_bit_ecc(1)
        assert watcher.wait_for_events(5, timeout=10)
        assert watcher.wait_errors == 1 and watcher.alive
        assert watcher.dbe_counts() == {1: 1}
        assert series(source.collect(), schema.XID_ERRORS)[("1", "79")] == 1.0
    finally:
        source.close()
    assert not watcher.alive
    assert fake.registered() == {}  # event set freed
    assert fake.init_count == 0


def test_no_driver_reports_unavailable_and_retries_with_backoff(caplog) -> None:
    caplog.set_level(logging.WARNING, logger="exporter.sources.nvml")
    fake, source, clock = make(h100_node(2), driver_loaded=False, retry_backoff=(5.0, 60.0))
    attempts = []
    for _ in range(4):
        reading = source.collect()
        assert not reading.up and reading.samples == {}
        assert [e.kind for e in reading.errors] == ["nvml_unavailable"]
        assert "driver is not loaded" in reading.errors[0].message
        attempts.append(fake.init_attempts)
        clock.advance(5)
    # constructor, then t+5 (backoff 5), then t+15 (backoff 10): not every scrape
    assert attempts == [1, 2, 2, 3]
    assert len([r for r in caplog.records if "NVML unavailable" in r.getMessage()]) == 1
    fake.driver_loaded = True
    clock.advance(60)
    reading = source.collect()
    assert reading.up and gpus_in(reading) == {"0", "1"}
    source.close()


def test_no_library_and_no_pynvml(monkeypatch) -> None:
    _, source, _ = make(h100_node(1), library_found=False)
    reading = source.collect()
    assert not reading.up and "libnvidia-ml.so.1 not found" in reading.errors[0].message
    source.close()

    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml -> ImportError
    source = NvmlSource(hostname=HOST)
    reading = source.collect()
    assert not reading.up and reading.errors[0].kind == "nvml_unavailable"
    assert "pynvml is not installed" in reading.errors[0].message
    source.close()


def test_static_info_read_once_and_close_releases_everything(node) -> None:
    fake, source, clock = node
    for _ in range(3):
        clock.advance(1)
        source.collect()
    for gpu in fake.gpus:
        assert gpu.call_counts["nvmlDeviceGetName"] == 1
        assert gpu.call_counts["nvmlDeviceGetPciInfo_v3"] == 1
        assert gpu.call_counts["nvmlDeviceGetMaxClockInfo"] == 1
        assert gpu.call_counts["nvmlGpmQueryDeviceSupport"] == 1
    assert fake.samples
    source.close()
    assert fake.samples == {} and fake.init_count == 0


def test_running_processes_are_a_method_not_labels() -> None:
    _, source, _ = make([mig_h100(0), *h100_node(2)[1:]])
    try:
        procs = {(p.gpu, p.pid): p for p in source.running_processes()}
        assert procs[("0", 2001)].used_memory_bytes == 30_000 * MIB
        assert procs[("0", 2001)].gpu_instance == 1
        assert procs[("1", 1001)].gpu_instance is None
        assert procs[("1", 1001)].uuid.startswith("GPU-")
        reading = source.collect()
        assert not any("pid" in labels for s in reading.samples.values() for labels, _ in s)
    finally:
        source.close()


def test_gpm_interval_below_100ms_rejected() -> None:
    with pytest.raises(ValueError, match="100 ms"):
        NvmlSource(FakeNvml([]).module, gpm_interval=0.05)


def test_nvlink_bytes_from_gpm_when_the_driver_has_no_throughput_fields(node) -> None:
    fake, source, clock = node
    fake.gpus[0].unsupported_fields = {
        real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX,
        real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_RX,
    }
    source.collect()  # 0.1 s priming interval
    clock.advance(10)
    reading = source.collect()
    nvlink = series(reading, schema.NVLINK_BYTES)
    assert nvlink[("0", "tx")] == pytest.approx(1000 * MIB * 10.1)  # GPM 1000 MiB/s integrated
    assert nvlink[("0", "rx")] == pytest.approx(2000 * MIB * 10.1)
    assert nvlink[("1", "tx")] == 0  # GPU 1 still reads the driver's KiB counter (0 here)
    asked = fake.gpus[0].fields_asked
    assert asked.count(real.NVML_FI_DEV_NVLINK_THROUGHPUT_DATA_TX) == 1  # not asked again
    assert asked.count(real.NVML_FI_DEV_MEMORY_TEMP) == 2


def test_fake_pynvml_matches_the_real_binding() -> None:
    """The fake has the real functions' names and parameters, and the real classes and constants."""
    import inspect

    fake = FakeNvml(h100_node(1))
    faked = [name for name in dir(FakeNvml) if name.startswith("nvml")]
    assert len(faked) > 50
    for name in faked:
        real_params = list(inspect.signature(getattr(real, name)).parameters)
        fake_params = list(inspect.signature(getattr(fake.module, name)).parameters)
        assert fake_params == real_params, name
    assert fake.module.NVMLError_GpuIsLost is real.NVMLError_GpuIsLost
    assert fake.module.c_nvmlGpmMetricsGet_t is real.c_nvmlGpmMetricsGet_t
    with pytest.raises(real.NVMLError_Uninitialized):
        fake.module.nvmlDeviceGetCount()
    fake.module.nvmlInit()
    with pytest.raises(real.NVMLError_FunctionNotFound):  # a real function the fake does not model
        fake.module.nvmlDeviceGetNumFans(fake.module.nvmlDeviceGetHandleByIndex(0))


def test_fake_answers_as_a_real_h200_did() -> None:
    """What nvidia-ml-py answered on a real H200 (SXM in a VM, driver 580.159.04, MIG capable but off, no NVLink
    peers, no NUMA affinity, no fan) for calls the source makes, and the fake must answer alike."""
    gpu = h100_sxm(0)
    gpu.numa_node, gpu.fan_pct = None, None
    fake = FakeNvml([gpu])
    nv = fake.module
    nv.nvmlInit()
    h = nv.nvmlDeviceGetHandleByIndex(0)
    with pytest.raises(real.NVMLError_NotFound):  # MIG off: no instance at any index
        nv.nvmlDeviceGetMigDeviceHandleByIndex(h, 0)
    with pytest.raises(real.NVMLError_InvalidArgument):  # a whole GPU's handle has no GPU instance
        nv.nvmlDeviceGetGpuInstanceId(h)
    with pytest.raises(real.NVMLError_InvalidArgument):
        nv.nvmlDeviceGetHandleByIndex(7)
    with pytest.raises(real.NVMLError_NotSupported):
        nv.nvmlDeviceGetNumaNodeId(h)
    with pytest.raises(real.NVMLError_NotSupported):
        nv.nvmlDeviceGetFanSpeed(h)
    assert nv.nvmlDeviceGetMigMode(h) == [real.NVML_DEVICE_MIG_DISABLE, real.NVML_DEVICE_MIG_DISABLE]
    assert nv.nvmlDeviceIsMigDeviceHandle(h) == 0
    # memory v2: "used" leaves out the driver's reservation that v1 counts as used
    v1, v2 = nv.nvmlDeviceGetMemoryInfo(h), nv.nvmlDeviceGetMemoryInfo(h, real.nvmlMemory_v2)
    assert v1.used == v2.used + v2.reserved and v1.total == v2.total


def test_nvlink_errors_summed_over_links_from_fields_or_per_link_calls(node) -> None:
    fake, source, _ = node
    for gpu in fake.gpus[:2]:
        gpu.nvlinks[0].errors = {real.NVML_NVLINK_ERROR_DL_CRC_FLIT: 3, real.NVML_NVLINK_ERROR_DL_REPLAY: 2}
        gpu.nvlinks[17].errors = {real.NVML_NVLINK_ERROR_DL_CRC_FLIT: 4}
        gpu.nvlinks[9].active = False
    # GPU 1's driver lacks the summed fields: the source falls back to one call per link
    fake.gpus[1].unsupported_fields = {
        real.NVML_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL,
        real.NVML_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL,
        real.NVML_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL,
        real.NVML_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL,
    }
    reading = source.collect()
    errors = series(reading, schema.NVLINK_ERRORS)
    links = series(reading, schema.NVLINK_LINKS)
    for gpu in ("0", "1"):
        assert errors[(gpu, "crc_flit")] == 7 and errors[(gpu, "replay")] == 2
        assert errors[(gpu, "crc_data")] == 0 and errors[(gpu, "recovery")] == 0
        assert links[(gpu, "up")] == 17 and links[(gpu, "down")] == 1
    assert fake.gpus[0].call_counts["nvmlDeviceGetNvLinkErrorCounter"] == 0
    assert fake.gpus[1].call_counts["nvmlDeviceGetNvLinkErrorCounter"] == 4 * 18


def test_slurm_attribution_publishes_allocation_for_whole_gpus_and_mig_instances(tmp_path) -> None:
    from exporter.attribution import SlurmAttributor

    (tmp_path / "jobs").mkdir()
    (tmp_path / "jobs" / "0").write_text("4242\n")  # whole GPU 0
    (tmp_path / "jobs" / "1.5").write_text("777\n")  # MIG instance 5 of GPU 1
    (tmp_path / "meta").mkdir()  # the prolog's accounting, for job 4242 only
    (tmp_path / "meta" / "4242.env").write_text("job=4242\nuser=alice\naccount=phys-a\npartition=gpu\n")
    attributor = SlurmAttributor(str(tmp_path / "jobs"), meta_directory=str(tmp_path / "meta"))
    _fake, source, _clock = make([h100_sxm(0), mig_h100(1)], attributor=attributor)
    try:
        reading = source.collect()
    finally:
        source.close()
    held = {
        (labels[schema.GPU], labels.get(schema.GPU_INSTANCE)): labels[schema.WORKLOAD]
        for labels, value in reading.samples[schema.GPU_ALLOCATION_INFO]
        if value == 1.0
    }
    assert held == {("0", None): "4242", ("1", "5"): "777"}  # free devices have no series
    (labels, value), = reading.samples[schema.SLURM_JOB_INFO]  # only where the prolog wrote accounting
    assert set(labels) == set(schema.SLURM_JOB_INFO.all_labels) and value == 1.0
    assert (labels[schema.GPU], labels[schema.WORKLOAD], labels["user"], labels["account"], labels["partition"]) == \
        ("0", "4242", "alice", "phys-a", "gpu")
    assert reading.up


def test_attribution_failure_is_counted_but_keeps_the_source_up(tmp_path) -> None:
    from exporter.attribution import SlurmAttributor

    _fake, source, _clock = make(h100_node(2), attributor=SlurmAttributor(tmp_path / "missing"))
    try:
        reading = source.collect()
    finally:
        source.close()
    assert reading.up and schema.GPU_ALLOCATION_INFO not in reading.samples
    assert [e.kind for e in reading.errors] == ["slurm_dir_missing"]
    assert series(reading, schema.GPU_UTILIZATION)  # telemetry unaffected
