"""The CI gate of the detectors issue: every kind, all built-in scenarios, both dialects.

All detectors run together (as `truegpu analyze` runs them) on every simulator scenario, in our
dialect, dcgm-exporter's with every counter and with its default counter set;
pooled precision and recall must be >= 0.95 per kind and the healthy scenarios must give
no finding of any kind. Fleets come from the per-process cache, so this costs only the
detectors' time once the per-detector tests have built them.
"""

from __future__ import annotations

import pytest

from analyzer.analysis.evaluate import evaluate_scenarios, pooled
from analyzer.detectors import load_detectors
from analyzer.findings import GPU_FAULT

GATE = 0.95
HEALTHY = ("healthy-fleet", "healthy-long", "noisy-neighbours", "healthy-heterogeneous")
#: What dcgm-exporter data cannot carry, so recall there is not asked of the detector (precision, no false
#: claims, is still gated): its default counter set leaves out the ECC and NVLink error counters (commented
#: out in its default-counters.csv): error storms and rising NVLink errors cannot be seen there. XIDs,
#: row remaps, lost GPUs and PCIe replays still can (test_detectors_gpu_fault checks those). Topology is
#: asked of both: sites come from kube-state-metrics' node zones, NUMA from the board layout.
RECALL_EXEMPT = {"truegpu": set(), "dcgm": set(), "dcgm-default": {GPU_FAULT}}


@pytest.fixture(scope="module", params=["truegpu", "dcgm", "dcgm-default"])
def results(request) -> tuple[str, list[dict]]:
    kinds = sorted(load_detectors())
    dialect, _, counters = request.param.partition("-")
    return request.param, evaluate_scenarios(dialect=dialect, step=60.0, kinds=kinds,
                                             dcgm_counters=counters or "all")


def test_every_kind_meets_the_gate(results):
    dialect, res = results
    totals = pooled(res)
    assert {k for d, k in totals} == set(load_detectors())
    for (d, kind), v in totals.items():
        assert v["truth"] > 0, f"no scenario exercises {kind}"
        assert v["precision"] >= GATE, (d, kind, v)
        if kind not in RECALL_EXEMPT[dialect]:
            assert v["recall"] >= GATE, (d, kind, v)


def test_healthy_scenarios_give_no_finding_of_any_kind(results):
    _dialect, res = results
    for r in res:
        if r["scenario"] in HEALTHY:
            assert {k: v["findings"] for k, v in r["kinds"].items() if v["findings"]} == {}, r["scenario"]
