"""The NVML recipes in the contract (``Metric.nvml_reads``) name only real pynvml things and fit their family.

NvmlSource executes these recipes as they are, so a misspelt function or constant would silently
drop a family on every GPU (a binding without the function is never asked); these tests catch it.
"""

from __future__ import annotations

import importlib.util
import inspect

import pytest

from exporter import schema
from exporter.sources import nvml
from tests.exporter.fakes.fake_pynvml import FakeNvml

RECIPES = [(m, r) for m in schema.METRICS for r in m.nvml_reads]


def test_there_are_recipes() -> None:
    assert len({m for m, _ in RECIPES}) >= 25


@pytest.mark.skipif(importlib.util.find_spec("pynvml") is None, reason="nvidia-ml-py not installed")
def test_every_recipe_name_exists_in_the_installed_pynvml() -> None:
    import pynvml

    missing = sorted({n for _, r in RECIPES for n in r.names if not hasattr(pynvml, n)})
    assert missing == []


def test_every_recipe_name_exists_in_the_fake_and_its_calls_are_faked() -> None:
    module = FakeNvml([]).module
    assert sorted({n for _, r in RECIPES for n in r.names if not hasattr(module, n)}) == []
    calls = {c.name for _, r in RECIPES for c in (r.call, r.fallback) if c is not None}
    assert sorted(calls - set(dir(FakeNvml))) == [], "a recipe calls a function the fake does not implement"
    for name in calls:
        assert inspect.isroutine(getattr(module, name))


def test_recipes_fit_their_family() -> None:
    for metric, read in RECIPES:
        assert (read.call is None) != (not read.field), f"{metric.name}: exactly one of call or field"
        assert read.call is None or read.call.key, f"{metric.name}: {read.call} needs a key"
        assert read.field == "" or read.field.startswith("NVML_FI_"), read.field
        assert {k for k, _ in read.labels} == set(metric.labels), (metric.name, read.labels)
        assert read.pick == "" or read.pick.isdigit() or read.pick.isidentifier(), read.pick
        m, d = read.factors
        assert m / d == pytest.approx(read.scale)
    series = [(m, r.labels) for m, r in RECIPES]
    assert len(series) == len(set(series)), "two recipes publish the same series"


def test_sub_unit_scales_divide_exactly() -> None:
    assert schema.exact_factors(0.01) == (1.0, 100.0)
    assert schema.exact_factors(1e-9) == (1.0, 1e9)  # 1 / 1e-9 is 999999999.9999999 in floats
    assert schema.exact_factors(1e6) == (1e6, 1.0)
    assert 57 * 1.0 / 100.0 == 0.57


def test_docs_print_the_recipes() -> None:
    """docs/metrics.md's NVML column comes from the recipes, so it cannot drift from the code."""
    for metric, read in RECIPES:
        assert read.describe() in metric.nvml_recipe
    assert schema.POWER.nvml_recipe == "nvmlDeviceGetPowerUsage() / 1000"
    assert schema.TEMPERATURE.nvml_recipe == (
        "nvmlDeviceGetTemperature(NVML_TEMPERATURE_GPU) (sensor=gpu); field NVML_FI_DEV_MEMORY_TEMP (sensor=memory)")


def test_plan_follows_the_contract_and_covers_every_recipe() -> None:
    order = {m: i for i, m in enumerate(schema.METRICS)}
    positions = [order[m] for _, m, _ in nvml.PLAN]
    assert positions == sorted(positions)
    planned = {r for kind, _, r in nvml.PLAN if kind in ("read", "once")}
    assert planned == {r for _, r in RECIPES if not r.field}
    assert [kind for kind, _, _ in nvml.PLAN].count("fields") == 1
    assert [r for _, r in nvml.FIELD_READS] == [r for _, r in RECIPES if r.field]
    for method in nvml._HAND_WRITTEN.values():
        assert callable(getattr(nvml.NvmlSource, method))
