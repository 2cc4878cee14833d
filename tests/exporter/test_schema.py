"""The metric contract follows Prometheus conventions and maps dcgm-exporter fields once."""

from __future__ import annotations

import math
import re
import subprocess
from collections import Counter

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from exporter import schema

# The published contract: users' dashboards and alert rules depend on these names, so a
# rename must be deliberate (edit here too), never an accident.
PUBLISHED = {
    "truegpu_gpu_utilization_ratio", "truegpu_memory_utilization_ratio", "truegpu_sm_active_ratio",
    "truegpu_sm_occupancy_ratio", "truegpu_tensor_active_ratio", "truegpu_dram_active_ratio",
    "truegpu_graphics_engine_active_ratio", "truegpu_memory_used_bytes", "truegpu_memory_total_bytes",
    "truegpu_power_watts", "truegpu_power_limit_watts", "truegpu_energy_joules_total",
    "truegpu_temperature_celsius", "truegpu_sm_clock_hertz", "truegpu_sm_clock_max_hertz",
    "truegpu_memory_clock_hertz", "truegpu_clock_event_active", "truegpu_nvlink_bytes_total",
    "truegpu_pcie_bytes_total", "truegpu_pcie_link_generation", "truegpu_pcie_link_width",
    "truegpu_pcie_replays_total", "truegpu_xid_errors_total", "truegpu_ecc_errors_total",
    "truegpu_remapped_rows_total", "truegpu_row_remap_pending", "truegpu_row_remap_failure",
    "truegpu_nvlink_errors_total", "truegpu_nvlink_links", "truegpu_gpu_info", "truegpu_gpu_topology_info",
    "truegpu_gpu_allocation_info", "truegpu_exporter_source_up", "truegpu_exporter_collect_duration_seconds",
    "truegpu_exporter_errors_total", "truegpu_retired_pages_total", "truegpu_retired_pages_pending",
    "truegpu_row_remap_banks", "truegpu_gpu_recovery_action",
}


def test_required_families_exist():
    assert set(schema.BY_NAME) >= PUBLISHED, sorted(PUBLISHED - set(schema.BY_NAME))


@pytest.mark.parametrize("metric", schema.METRICS, ids=lambda m: m.name)
def test_naming_conventions(metric: schema.Metric):
    check_conventions(metric)
    assert not set(metric.labels) & set(schema.MIG_LABELS), "MIG labels are added per sample, not per family"


def check_conventions(metric: schema.Metric) -> None:
    assert re.fullmatch(r"truegpu_[a-z0-9_]+", metric.name)
    assert metric.name.endswith("_total") == (metric.type == "counter")
    if metric.unit:
        assert metric.family_name.endswith("_" + metric.unit), "unit must be the name's suffix"
    assert metric.unit in ("", "ratio", "bytes", "seconds", "hertz", "watts", "joules", "celsius")
    if metric.name.endswith("_info"):
        assert metric.type == "gauge" and metric.labels, "info series are gauges of 1 carrying identity labels"
    assert metric.help.strip() and not metric.help[0].islower()
    assert len(set(metric.all_labels)) == len(metric.all_labels)


def test_every_gpu_family_has_a_source_recipe():
    for metric in schema.METRICS:
        if metric.scope == "gpu":
            assert metric.nvml_recipe, f"{metric.name} says nothing about how NVML provides it"


def test_dcgm_fields_map_to_exactly_one_series():
    fields = Counter(f.field for m in schema.METRICS for f in m.dcgm)
    assert [f for f, n in fields.items() if n > 1] == []
    for metric in schema.METRICS:
        for f in metric.dcgm:
            assert f.field.startswith("DCGM_FI_"), f.field
            assert f.spellings[:2] == (f.field, f.field.lower())
            given = {k for k, _ in f.labels}
            assert given <= set(metric.labels), (f.field, given)
            if f.kind == "value":
                # A plain field must pin every family label, or two fields would collide.
                assert given == set(metric.labels), (f.field, given)
            if f.kind == "rate":
                assert metric.type == "counter", f"{f.field} is a rate: it integrates into a counter"


def test_dcgm_units_convert_to_base_units():
    by_field = {f.field: f for m in schema.METRICS for f in m.dcgm}
    assert by_field["DCGM_FI_DEV_GPU_UTIL"].scale == 0.01  # integer percent
    assert by_field["DCGM_FI_PROF_SM_ACTIVE"].scale == 1.0  # profiling ratios are already 0..1
    assert by_field["DCGM_FI_DEV_SM_CLOCK"].scale == 1e6  # MHz
    assert by_field["DCGM_FI_DEV_FB_USED"].scale == 1024 * 1024  # MiB
    assert by_field["DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION"].scale == 1e-3  # mJ
    assert by_field["DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL"].kind == "rate"
    assert by_field["DCGM_FI_DEV_CLOCKS_EVENT_REASONS"].kind == "bitmask"


def test_clock_event_bits_are_single_distinct_bits():
    bits = list(schema.CLOCK_EVENT_REASONS)
    assert all(b & (b - 1) == 0 for b in bits)
    assert len(set(schema.CLOCK_EVENT_REASONS.values())) == len(bits)
    assert set(schema.THERMAL_REASONS + schema.POWER_REASONS) <= set(schema.CLOCK_EVENT_REASONS.values())


def test_whole_contract_passes_promtool_lint(promtool: str):
    """Every family, exposed once with every label set, passes the real `promtool check metrics`."""

    class Contract:
        def collect(self):
            for m in schema.METRICS:
                cls = CounterMetricFamily if m.type == "counter" else GaugeMetricFamily
                family = cls(m.family_name, m.help, labels=m.all_labels, unit=m.unit or "")
                family.add_metric(["x"] * len(m.all_labels), 1.0)
                yield family

    registry = CollectorRegistry()
    registry.register(Contract())
    text = generate_latest(registry)
    result = subprocess.run([promtool, "check", "metrics"], input=text, capture_output=True, timeout=30)
    assert result.returncode == 0, result.stdout.decode() + result.stderr.decode()
    for m in schema.METRICS:
        # The classic text format names counters with their _total suffix.
        assert f"# TYPE {m.name} {m.type}".encode() in text


def test_metrics_reference_is_generated_from_the_contract():
    from exporter import schema_doc
    from tests.conftest import ROOT

    committed = (ROOT / "docs" / "metrics.md").read_text()
    assert committed == schema_doc.render(), "regenerate: python -m exporter.schema_doc > docs/metrics.md"


def test_dcgm_sentinels_are_recognised_and_real_values_are_not():
    for sentinel in (9223372036854775794, 9223372036854775792, 2147483632, 2147483634, 140737488355328.0):
        assert schema.is_dcgm_sentinel(float(sentinel)), sentinel
    for real in (0.0, 99.0, 1980.0, 700.0, 81559.0, 2.5e12, 2147483631.0):
        assert not schema.is_dcgm_sentinel(real), real
    assert not schema.is_dcgm_sentinel(math.inf)  # no DCGM marker: the valid-range check drops it, said as such


def test_dcgm_by_field_knows_both_spellings():
    metric, field = schema.DCGM_BY_FIELD["dcgm_fi_dev_gpu_temp"]
    assert metric is schema.TEMPERATURE and field.labels == (("sensor", "gpu"),)
    assert schema.DCGM_BY_FIELD["DCGM_FI_DEV_GPU_TEMP"] == (metric, field)


def test_analyzer_output_contract_follows_the_same_conventions(promtool: str):
    from analyzer import output_schema

    names = {m.name for m in output_schema.METRICS}
    assert not names & set(schema.BY_NAME), "analyzer metrics must not reuse exporter names"
    for m in output_schema.METRICS:
        check_conventions(m)
