"""DeadlineSource around the NVML source, with slow and hanging NVML calls from the fake pynvml."""

from __future__ import annotations

import threading

import pynvml as real
import pytest

from exporter import schema
from exporter.sources.deadline import DeadlineSource
from exporter.sources.nvml import NvmlSource
from tests.exporter.fakes.fake_pynvml import FakeNvml, h100_node


def nvml_source(gpus=None) -> tuple[FakeNvml, NvmlSource]:
    fake = FakeNvml(gpus or h100_node(2))
    return fake, NvmlSource(fake.module, hostname="n", events=False)


def power(reading) -> dict[str, float]:
    return {labels[schema.GPU]: v for labels, v in reading.samples.get(schema.POWER, [])}


def test_fast_source_passes_through() -> None:
    _, inner = nvml_source()
    source = DeadlineSource(inner, deadline=30.0)
    try:
        assert source.name == "nvml" and source.last_success == 0.0
        reading = source.collect()
        assert reading.up and reading.errors == [] and power(reading) == {"0": 450.123, "1": 450.123}
        assert not source.stale and source.last_success > 0
    finally:
        source.close()


def test_hung_call_serves_last_good_values_stale_and_never_runs_twice() -> None:
    fake, inner = nvml_source()
    source = DeadlineSource(inner, deadline=30.0)
    try:
        good = source.collect()
        succeeded_at = source.last_success
        gpu1 = fake.gpus[1]
        gpu1.gate, gpu1.gated_calls = threading.Event(), {"nvmlDeviceGetPowerUsage"}
        gpu1.power_mw = 999_000
        before = gpu1.call_counts["nvmlDeviceGetPowerUsage"]
        source.deadline = 0.05
        for _ in range(3):
            reading = source.collect()
            assert source.stale
            assert [e.kind for e in reading.errors] == ["timeout"] and not reading.up
            assert "last good values" in reading.errors[0].message
            assert reading.samples == good.samples  # the last good values, not a partial read
            assert source.last_success == succeeded_at
        # three scrapes, one collection in flight: the hung call was entered once
        assert gpu1.call_counts["nvmlDeviceGetPowerUsage"] == before + 1

        gpu1.gate.set()
        source.deadline = 30.0
        fresh = source.collect()  # first waits out the hung run, then is fresh
        assert not source.stale and source.last_success > succeeded_at
        assert fresh.up and power(fresh)["1"] == pytest.approx(999.0)
    finally:
        source.close()


def test_slow_call_without_earlier_values_gives_an_empty_stale_reading() -> None:
    fake, inner = nvml_source()
    fake.gpus[0].slow = {"nvmlDeviceGetUtilizationRates": 1.0}
    source = DeadlineSource(inner, deadline=0.05)
    try:
        reading = source.collect()
        assert source.stale and reading.samples == {} and not reading.up
        assert [e.kind for e in reading.errors] == ["timeout"]
        source.deadline = 30.0
        assert source.collect().up and not source.stale
    finally:
        source.close()


def test_raising_inner_collect_becomes_source_failed() -> None:
    fake, inner = nvml_source()
    # pynvml raises this (not an NVMLError) when the binding and the driver library disagree
    fake.gpus[0].raises = {"nvmlDeviceGetPowerUsage": real.NVMLLibraryMismatchError("pynvml/driver mismatch")}
    source = DeadlineSource(inner, deadline=30.0)
    try:
        reading = source.collect()
        assert not reading.up and reading.samples == {}
        assert [e.kind for e in reading.errors] == ["source_failed"]
        assert "mismatch" in reading.errors[0].message
        assert not source.stale and source.last_success == 0.0
    finally:
        source.close()


def test_deadline_must_be_positive() -> None:
    _, inner = nvml_source()
    with pytest.raises(ValueError):
        DeadlineSource(inner, deadline=0)
    inner.close()
