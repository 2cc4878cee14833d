"""Effective-cost reports: price catalog, the cost identity on hand-built fleets (exact dollars)
and simulator scenarios, daily rollups, FOCUS CSV, JSON round trip and the HTML page."""

from __future__ import annotations

import csv
import io
import json
import math
import re
import xml.etree.ElementTree as ET

import numpy as np
import pandas as pd
import pytest

from analyzer.analysis.scores import compute_scores
from analyzer.data.frame import Fleet, empty_frame
from analyzer.data.simulated import fleet_from_cluster
from analyzer.detectors import run_detectors
from analyzer.findings import IDLE_MASKING, STRAGGLER, Finding
from analyzer.finops import outputs
from analyzer.finops.catalog import Catalog, CatalogError, default_catalog, load_catalog, parse_catalog
from analyzer.finops.costs import (
    COMPONENTS,
    GROUP_BY,
    ROLLUP_COLUMNS,
    ROLLUP_COST_COLUMNS,
    ROLLUP_HOUR_COLUMNS,
    ROLLUP_KEY_COLUMNS,
    UNALLOCATED,
    UNMAPPED,
    WASTE_COMPONENTS,
    CostReport,
    cost_report,
    daily_rollups,
    load_team_map,
)
from exporter.simulator import Cluster, load_scenario
from tests import fleets

START = 1_767_571_200.0  # 2026-01-05T00:00:00Z
HOUR = 3600.0
MAX_CLK = 1.98e9
H100, L40S, A100 = "NVIDIA H100 80GB HBM3", "NVIDIA L40S", "NVIDIA A100-SXM4-80GB"
PRICES = {"currency": "USD", "models": [
    {"key": "H100", "match": "H100", "price_per_gpu_hour": 3.0},
    {"key": "L40S", "match": "L40S", "price_per_gpu_hour": 1.0},
]}


def catalog(**over) -> Catalog:
    return parse_catalog({**PRICES, **over})


def make_fleet(devices: list[dict], steps: int = 1, step: float = HOUR, start: float = START) -> Fleet:
    return fleets.make_fleet(devices, steps, step, start, model=H100)


def gpu(util=1.0, sm=0.5, clk=MAX_CLK, **kw) -> dict:
    d = {"gpu_util": util, "sm_active": sm, "sm_clock": clk, "sm_clock_max": MAX_CLK, "gr_active": util}
    d.update(kw)
    return d


def report_for(fleet: Fleet, findings=(), cat: Catalog | None = None, **kw) -> CostReport:
    return cost_report(fleet, compute_scores(fleet), list(findings), cat or catalog(), **kw)


def group(report: CostReport, name: str) -> dict:
    g = report.groups.set_index("group")
    assert name in g.index, f"{name} not in {list(g.index)}"
    return g.loc[name].to_dict()


def assert_identity(report: CostReport) -> None:
    """Per group and in total: components add up to the cost and the GPU-hours; groups add up to the totals."""
    g = report.groups
    for unit, total in (("cost", "cost"), ("gpu_hours", "gpu_hours")):
        parts = sum(g[f"{c}_{unit}"] for c in COMPONENTS)
        np.testing.assert_allclose(parts, g[total], rtol=1e-9, atol=1e-9)
        np.testing.assert_allclose(sum(g[f"{c}_{unit}"] for c in WASTE_COMPONENTS), g[f"waste_{unit}"], atol=1e-9)
    for col in (*ROLLUP_HOUR_COLUMNS, *ROLLUP_COST_COLUMNS):
        assert math.isclose(g[col].sum(), report.totals[col], rel_tol=1e-9, abs_tol=1e-9), col
    for c in COMPONENTS:
        assert (g[f"{c}_cost"] >= -1e-12).all() and (g[f"{c}_gpu_hours"] >= -1e-12).all(), c


# ------------------------------------------------------------------ catalog


def test_default_catalog_prices_the_model_names_in_the_data():
    cat = default_catalog()
    assert cat.currency == "USD" and "illustrative" in cat.source
    keys = {m: cat.lookup(m).key for m in (H100, A100, L40S, "NVIDIA A100-PCIE-40GB", "NVIDIA H100 NVL",
                                           "NVIDIA L4", "Tesla T4", "NVIDIA A10G")}
    assert keys == {H100: "H100", A100: "A100-80GB", L40S: "L40S", "NVIDIA A100-PCIE-40GB": "A100-40GB",
                    "NVIDIA H100 NVL": "H100", "NVIDIA L4": "L4", "Tesla T4": "T4", "NVIDIA A10G": "A10G"}
    assert all(cat.price(m) > 0 for m in (H100, A100, L40S))
    assert cat.price(H100) > cat.price(A100) > cat.price(L40S)
    for unknown in ("NVIDIA B200", "NVIDIA L40", "", None):
        assert cat.lookup(unknown) is None and cat.price(unknown) is None  # unpriced, never $0


def test_cluster_overrides_reprice_and_add_models_first():
    data = {**PRICES, "clusters": {"onprem": {"models": [
        {"key": "H100", "price_per_gpu_hour": 1.5},
        {"key": "H100-NVL", "match": "H100 NVL", "price_per_gpu_hour": 2.5},
    ]}}}
    base = parse_catalog(data)
    assert base.price(H100) == 3.0 and base.price("NVIDIA H100 NVL") == 3.0 and base.cluster is None
    over = parse_catalog(data, cluster="onprem")
    assert over.cluster == "onprem" and over.price(H100) == 1.5 and over.price(L40S) == 1.0
    assert over.price("NVIDIA H100 NVL") == 2.5  # the cluster's own entry matches before the default H100
    assert over.lookup(H100).match == "H100"  # inherited
    with pytest.raises(CatalogError, match=r"no cluster 'nope'.*onprem"):
        parse_catalog(data, cluster="nope")
    assert default_catalog("onprem-example").price(H100) < default_catalog().price(H100)


@pytest.mark.parametrize("data, message", [
    ({"models": [{"key": "X", "match": "X", "price_per_gpu_hour": -1}]}, "must be a number >= 0"),
    ({"models": [{"key": "X", "match": "X", "price_per_gpu_hour": "3"}]}, "must be a number >= 0"),
    ({"models": [{"key": "X", "match": "X", "price_per_gpu_hour": float("nan")}]}, "must be a number >= 0"),
    ({"models": [{"key": "X", "match": "(", "price_per_gpu_hour": 1}]}, "bad regex"),
    ({"models": [{"key": "X", "price_per_gpu_hour": 1}]}, "needs 'match'"),
    ({"models": [{"key": "X", "match": "X"}]}, "needs 'price_per_gpu_hour'"),
    ({"models": [{"key": "X", "match": "X", "price": 1}]}, "unknown field"),
    ({"models": []}, "non-empty list"),
    ({"currency": "dollars", "models": [{"key": "X", "match": "X", "price_per_gpu_hour": 1}]}, "ISO 4217"),
    ({"modles": []}, "unknown field"),
    ({"models": [{"key": "X", "match": "X", "price_per_gpu_hour": 1}] * 2}, "duplicate model key"),
    ({"models": [{"key": "X", "match": "X", "price_per_gpu_hour": 1, "mig_shares": {"1g.10gb": 2}}]}, r"\(0, 1\]"),
    ("just text", "expected a mapping"),
])
def test_catalog_validation_errors(data, message):
    with pytest.raises(CatalogError, match=message):
        parse_catalog(data)


def test_catalog_files(tmp_path):
    with pytest.raises(CatalogError, match="cannot read price catalog"):
        load_catalog(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("models: [unclosed\n")
    with pytest.raises(CatalogError, match="not valid YAML"):
        load_catalog(bad)
    good = tmp_path / "p.yaml"
    good.write_text("currency: EUR\nmodels:\n  - {key: H100, match: 'h100', price_per_gpu_hour: 2}\n")
    cat = load_catalog(good)
    assert cat.currency == "EUR" and cat.price(H100) == 2.0 and cat.source == str(good)  # case-insensitive


# ------------------------------------------------------------------ cost identity, exact dollars


def test_exact_dollars_for_every_component():
    devices = [
        gpu(util=1.0, sm=0.5, namespace="a", job="ja"),                 # 0: masked half
        gpu(util=0.0, sm=0.0, namespace="a", job="ja"),                 # 1: idle
        gpu(util=0.9, sm=0.6, clk=MAX_CLK / 2, namespace="b", job="jb"),  # 2: throttled + masked + unclassified
        {"gr_active": 0.8, "sm_active": 0.4, "sm_clock": MAX_CLK, "sm_clock_max": MAX_CLK, "gpu_instance": "1",
         "mig_profile": "3g.40gb", "namespace": "b", "job": "jb"},     # 3: MIG slice, 3/7 of a GPU
        gpu(model=L40S, hostname="n9"),                                 # 4: unallocated L40S
        gpu(util=0.5, sm=0.5, model="NVIDIA B200", namespace="c", job="jc"),  # 5: unpriced model
        {"namespace": "b", "job": "jb", "gpu_util": math.nan},          # 6: allocated, nothing measured
    ]
    # The idle_masking detector flags GPUs 0 and 2: masked cost comes only from what it flags.
    masking = [Finding(kind=IDLE_MASKING, severity="warning", summary="s", start=START, end=None, score=0.5,
                       hostname="n0", gpu=g) for g in (0, 2)]
    r = report_for(make_fleet(devices), masking)
    assert_identity(r)
    a, b, c, un = group(r, "a"), group(r, "b"), group(r, "c"), group(r, UNALLOCATED)
    # a: GPU 0 is 1.5 effective + 1.5 masked; GPU 1 is idle (its whole $3).
    assert a["cost"] == pytest.approx(6.0) and a["effective_cost"] == pytest.approx(1.5)
    assert a["masked_cost"] == pytest.approx(1.5) and a["idle_allocated_cost"] == pytest.approx(3.0)
    assert a["cost_per_effective_gpu_hour"] == pytest.approx(6.0 / 0.5)
    # b: GPU 2 at half clock: eff 0.3, throttled 0.3, masked 0.9-0.6=0.3, the last 0.1 unclassified (x $3:
    #    job "jb" is of no known workload class, so its gap is neither headroom nor waste);
    #    the MIG slice: 3/7 GPU-hour, eff 0.4, the rest unclassified (no per-instance GPU util: no masking gap);
    #    GPU 6: $3 unknown.
    mig = 3 / 7 * 3.0
    assert b["cost"] == pytest.approx(3.0 + mig + 3.0)
    assert b["gpu_hours"] == pytest.approx(2 + 3 / 7)
    assert b["effective_cost"] == pytest.approx(0.9 + 0.4 * mig)
    assert b["throttled_cost"] == pytest.approx(0.9)
    assert b["masked_cost"] == pytest.approx(0.9)
    assert b["unclassified_cost"] == pytest.approx(0.3 + 0.6 * mig) and b["underused_cost"] == 0.0
    assert b["unknown_cost"] == pytest.approx(3.0) and b["unknown_gpu_hours"] == pytest.approx(1.0)
    # c: unpriced: hours counted, no dollars, no cost per effective hour; named in the report.
    assert c["cost"] == 0.0 and c["unpriced_gpu_hours"] == pytest.approx(1.0) and c["gpu_hours"] == 1.0
    assert c["effective_gpu_hours"] == pytest.approx(0.5) and math.isnan(c["cost_per_effective_gpu_hour"])
    assert r.unpriced_models == {"NVIDIA B200": pytest.approx(1.0)}
    assert any("NVIDIA B200" in n and "unpriced" in n for n in r.notes)
    # unallocated capacity is its own group, all of it in the unallocated bucket.
    assert un["cost"] == pytest.approx(1.0) and un["unallocated_cost"] == pytest.approx(1.0)
    assert r.groups["group"].iloc[-1] == UNALLOCATED
    assert r.totals["cost"] == pytest.approx(6.0 + 3.0 + mig + 3.0 + 1.0)
    # hour split agrees with the scores' fleet numbers
    f = compute_scores(make_fleet(devices)).allocated["fleet"].iloc[0]
    assert r.totals["effective_gpu_hours"] == pytest.approx(f["allocated_effective_gpu_hours"])
    unused = ("waste_gpu_hours", "headroom_gpu_hours", "bandwidth_bound_gpu_hours", "power_capped_gpu_hours",
              "unclassified_gpu_hours")
    assert sum(r.totals[c] for c in unused) == pytest.approx(f["unused_gpu_hours"])
    assert r.totals["unknown_gpu_hours"] == pytest.approx(f["unknown_gpu_hours"])
    # Without the detector's finding the same gap is never "masked": one definition.
    plain = report_for(make_fleet(devices))
    assert plain.totals["masked_cost"] == 0.0
    assert plain.totals["unclassified_cost"] == pytest.approx(r.totals["unclassified_cost"] + r.totals["masked_cost"])


def test_mig_shares_override_prices_a_slice():
    cat = catalog(models=[{"key": "H100", "match": "H100", "price_per_gpu_hour": 3.0,
                           "mig_shares": {"1g.10gb": 0.125}}])
    devices = [gpu(gpu_instance=str(i), mig_profile=p, namespace="a", job="j", uuid="GPU-0", gpu="0")
               for i, p in enumerate(("1g.10gb", "3g.40gb"))]
    r = report_for(make_fleet(devices), cat=cat)
    assert group(r, "a")["gpu_hours"] == pytest.approx(1 / 7 + 3 / 7)
    assert group(r, "a")["cost"] == pytest.approx(3.0 * 0.125 + 3.0 * 3 / 7)
    assert_identity(r)


def test_straggler_wait_comes_from_the_findings_lost_hours_of_the_peers():
    devices = [gpu(util=1.0, sm=0.5, namespace="ml", job="train", hostname="h", gpu=str(i), uuid=f"G{i}")
               for i in range(3)]
    devices.append(gpu(util=1.0, sm=0.5, namespace="ml", job="other", hostname="h", gpu="3", uuid="G3"))
    fleet = make_fleet(devices, steps=2)
    f = Finding(kind=STRAGGLER, severity="warning", summary="s", start=START, end=None, score=0.3, hostname="h",
                gpu=0, uuid="G0", job="train", namespace="ml", evidence={"lost_gpu_hours": 1.0, "slowdown": 0.33})
    r = report_for(fleet, [f], group_by="workload")
    t, o = group(r, "train"), group(r, "other")
    # 1 lost GPU-hour over the peers' 4 GPU-hours ($3 each): $3 of straggler wait, carved out of the
    # non-working time (no idle_masking finding here: nothing is masked). "train" is a training job: its
    # members at SM 0.5 are above the class floor, so the rest of their gap is headroom, not waste.
    assert t["straggler_gpu_hours"] == pytest.approx(1.0) and t["straggler_cost"] == pytest.approx(3.0)
    assert t["headroom_cost"] == pytest.approx(6 * 0.5 * 3.0 - 3.0) and t["masked_cost"] == 0.0
    assert t["underused_cost"] == 0.0
    assert o["straggler_cost"] == 0.0 and o["unclassified_cost"] == pytest.approx(2 * 0.5 * 3.0)
    assert r.straggler_findings_gpu_hours == pytest.approx(1.0)
    assert_identity(r)
    # A claim larger than the peers' non-working time is capped (and said so): nothing counts twice.
    f.evidence["lost_gpu_hours"] = 10.0
    r = report_for(fleet, [f], group_by="workload")
    assert group(r, "train")["straggler_gpu_hours"] == pytest.approx(4 * 0.5)
    assert group(r, "train")["headroom_cost"] == pytest.approx(3.0)  # the straggler's own GPU, 2 h x 0.5 x $3
    assert any("capped" in n for n in r.notes)
    assert_identity(r)


def test_group_by_node_model_keep_unallocated_capacity_in_their_rows():
    devices = [gpu(namespace="a", job="j", hostname="h1"), gpu(hostname="h1"), gpu(model=L40S, hostname="h2")]
    fleet = make_fleet(devices)
    node = report_for(fleet, group_by="node")
    assert set(node.groups["group"]) == {"h1", "h2"}
    assert group(node, "h1")["unallocated_cost"] == pytest.approx(3.0)
    assert group(node, "h2")["unallocated_cost"] == pytest.approx(1.0)
    model = report_for(fleet, group_by="model")
    assert set(model.groups["group"]) == {H100, L40S}
    assert model.tags[H100] == {"model": H100} and node.tags["h1"] == {"hostname": "h1"}
    for r in (node, model):
        assert_identity(r)
        assert r.totals["cost"] == pytest.approx(7.0)


def test_team_grouping_from_a_namespace_map(tmp_path):
    devices = [gpu(namespace=ns, job=f"j-{ns}") for ns in ("llm", "serve-a", "serve-b", "batch")] + [gpu()]
    fleet = make_fleet(devices)
    path = tmp_path / "teams.yaml"
    path.write_text("llm: research\n'serve-*': product\n")
    team_map = load_team_map(path)
    r = report_for(fleet, group_by="team", team_map=team_map)
    assert set(r.groups["group"]) == {"research", "product", UNMAPPED, UNALLOCATED}
    assert group(r, "product")["cost"] == pytest.approx(6.0)
    assert r.tags["product"] == {"team": "product"}
    # namespace reports carry the team as a tag; without a map the team is the label value itself
    ns = report_for(fleet, group_by="namespace", team_map=team_map)
    assert ns.tags["serve-a"] == {"namespace": "serve-a", "team": "product"}
    by_job = report_for(fleet, group_by="team", team_label="job")
    assert "j-llm" in set(by_job.groups["group"])
    for bad in ("nope", "[1, 2]"):
        p = tmp_path / "bad.yaml"
        p.write_text(bad)
        with pytest.raises(ValueError, match="team map"):
            load_team_map(p)
    with pytest.raises(ValueError, match="group_by must be one of"):
        report_for(fleet, group_by="pod")
    with pytest.raises(ValueError, match="team_label must be one of"):
        report_for(fleet, group_by="team", team_label="hostname")


def test_empty_fleet_costs_nothing():
    fleet = Fleet(frame=empty_frame(), step=60.0, start=START, end=START)
    r = report_for(fleet)
    assert r.groups.empty and r.totals["cost"] == 0.0 and math.isnan(r.totals["cost_per_effective_gpu_hour"])
    assert list(daily_rollups(r).columns) == list(ROLLUP_COLUMNS) and daily_rollups(r).empty
    assert outputs.to_focus_csv(r).strip() == ",".join(outputs.FOCUS_COLUMNS)
    assert "no priced GPU-hours" in outputs.render_html(r)


def test_scores_from_another_fleet_are_refused():
    a = make_fleet([gpu(namespace="a", job="j")])
    b = make_fleet([gpu(namespace="a", job="j")] * 2)
    with pytest.raises(ValueError, match="scores do not belong"):
        cost_report(a, compute_scores(b), [], catalog())


# ------------------------------------------------------------------ daily rollups


def test_daily_rollups_split_days_and_sum_back_to_the_report():
    # 4 steps of 6 h from 12:00: two rows on day 1, two on day 2.
    fleet = make_fleet([gpu(namespace="a", job="j"), gpu(namespace="b", job="k", util=0.0, sm=0.0), gpu()],
                       steps=4, step=6 * HOUR, start=START + 12 * HOUR)
    r = report_for(fleet)
    d = daily_rollups(r)
    assert list(d.columns) == list(ROLLUP_COLUMNS)
    assert set(d["day"]) == {"2026-01-05", "2026-01-06"} and set(d["group_by"]) == {"namespace"}
    assert len(d) == 6 and not d.duplicated(["day", "group"]).any()
    assert d.attrs == {"currency": "USD", "cluster": ""}
    for c in ROLLUP_COLUMNS:
        if c not in ROLLUP_KEY_COLUMNS:
            assert pd.api.types.is_float_dtype(d[c]), c  # additive numbers only: the store keeps numeric columns
    sums = d.groupby("group")[list(ROLLUP_HOUR_COLUMNS + ROLLUP_COST_COLUMNS)].sum()
    g = r.groups.set_index("group")
    pd.testing.assert_frame_equal(sums.sort_index(), g.loc[sums.index, sums.columns].sort_index(), check_names=False)
    # the other spelling: straight from the inputs
    again = daily_rollups(fleet, compute_scores(fleet), [], catalog(), group_by="namespace")
    pd.testing.assert_frame_equal(again, d)
    # FOCUS rows are daily charges clipped to the window
    rows = outputs.focus_rows(r)
    assert {(x["ChargePeriodStart"], x["ChargePeriodEnd"]) for x in rows} == {
        ("2026-01-05T12:00:00Z", "2026-01-06T00:00:00Z"), ("2026-01-06T00:00:00Z", "2026-01-06T12:00:00Z")}


# ------------------------------------------------------------------ simulator scenarios


@pytest.fixture(scope="module")
def scenario_inputs():
    out = {}
    for name in ("mixed-fleet", "straggler-slowdowns"):
        fleet = fleet_from_cluster(Cluster(load_scenario(name)), step=60.0)
        out[name] = (fleet, compute_scores(fleet), run_detectors(fleet, [STRAGGLER, IDLE_MASKING]))
    return out


@pytest.mark.parametrize("group_by", GROUP_BY)
@pytest.mark.parametrize("scenario", ["mixed-fleet", "straggler-slowdowns"])
def test_identity_holds_for_every_grouping(scenario_inputs, scenario, group_by):
    fleet, scores, findings = scenario_inputs[scenario]
    cat = default_catalog()
    r = cost_report(fleet, scores, findings, cat, group_by=group_by)
    assert_identity(r)
    # the fleet total is the catalog price of every GPU-hour, whatever the grouping
    fr = fleet.frame
    hours = (fr["gpu_share"] * fleet.step / 3600).groupby(fr["model"].astype(str)).sum()
    assert r.totals["cost"] == pytest.approx(sum(h * cat.price(m) for m, h in hours.items()), rel=1e-9)
    # and its hour split is the scores' one
    f, a = scores.levels["fleet"].iloc[0], scores.allocated["fleet"].iloc[0]
    assert r.totals["gpu_hours"] == pytest.approx(f["gpu_hours"])
    assert r.totals["unallocated_gpu_hours"] == pytest.approx(f["unallocated_gpu_hours"])
    assert r.totals["effective_gpu_hours"] == pytest.approx(f["allocated_effective_gpu_hours"])
    unused = ("waste_gpu_hours", "headroom_gpu_hours", "bandwidth_bound_gpu_hours", "power_capped_gpu_hours",
              "unclassified_gpu_hours")
    assert sum(r.totals[c] for c in unused) == pytest.approx(f["unused_gpu_hours"])
    assert r.totals["unknown_gpu_hours"] == pytest.approx(a["unknown_gpu_hours"])


def test_mixed_fleet_shows_masked_and_idle_waste_where_they_are(scenario_inputs):
    fleet, scores, findings = scenario_inputs["mixed-fleet"]
    r = cost_report(fleet, scores, findings, default_catalog(), group_by="workload")
    mem, nb = group(r, "embed-batch"), group(r, "nb-alice")
    assert mem["masked_cost"] > 0.5 * mem["cost"]  # memory-bound: util high, SM low
    assert mem["masked_cost"] == max(group(r, j)["masked_cost"] / group(r, j)["cost"] for j in
                                     r.groups["group"] if group(r, j)["cost"] > 0) * mem["cost"]
    assert nb["idle_allocated_cost"] > 0.95 * nb["cost"] and nb["idle_allocated_cost"] > 0
    assert nb["effective_cost"] < 0.01 * nb["cost"]
    assert group(r, "pretrain-7b")["straggler_cost"] > 0  # its thermal straggler
    assert group(r, UNALLOCATED)["unallocated_cost"] > 0
    ns = cost_report(fleet, scores, findings, default_catalog(), group_by="namespace")
    assert group(ns, "notebooks")["idle_allocated_cost"] == pytest.approx(nb["idle_allocated_cost"])


def test_straggler_slowdowns_cost_their_jobs_in_order(scenario_inputs):
    fleet, scores, findings = scenario_inputs["straggler-slowdowns"]
    r = cost_report(fleet, scores, findings, default_catalog(), group_by="workload")
    wait = {j: group(r, j)["straggler_cost"] for j in ("train-10", "train-20", "train-50")}
    assert all(v > 0 for v in wait.values())
    assert wait["train-10"] < wait["train-20"] < wait["train-50"]
    lost = {f.job: f.evidence["lost_gpu_hours"] for f in findings}
    for j in wait:  # the findings' lost GPU-hours, priced (capped at most a little)
        assert group(r, j)["straggler_gpu_hours"] == pytest.approx(lost[j], rel=0.02)


# ------------------------------------------------------------------ outputs


@pytest.fixture(scope="module")
def mixed_report(scenario_inputs):
    fleet, scores, findings = scenario_inputs["mixed-fleet"]
    return cost_report(fleet, scores, findings, default_catalog(), group_by="namespace")


def parse_csv(text: str) -> list[dict[str, str]]:
    return list(csv.DictReader(io.StringIO(text)))


def test_focus_csv_columns_and_values(mixed_report):
    text = outputs.to_focus_csv(mixed_report)
    header = text.splitlines()[0].split(",")
    assert header == list(outputs.FOCUS_COLUMNS)
    assert set(outputs.FOCUS_MANDATORY) <= set(header)  # FOCUS 1.x's required columns
    rows = parse_csv(text)
    assert all(r["EffectiveCost"] == r["BilledCost"] == r["ContractedCost"] == r["ListCost"] for r in rows)
    assert {r["BillingAccountId"] for r in rows} == {"truegpu"} and {r["ChargeClass"] for r in rows} == {""}
    assert all(r[c] for r in rows for c in ("BillingAccountId", "ChargeCategory", "ChargePeriodStart",
                                             "InvoiceIssuerName", "ProviderName", "PublisherName", "PricingUnit"))
    for col in ("BillingPeriodStart", "BillingPeriodEnd", "ChargePeriodStart", "ChargePeriodEnd", "BilledCost",
                "ListCost", "ListUnitPrice", "ConsumedQuantity", "ConsumedUnit", "PricingUnit", "ServiceName",
                "ServiceCategory", "ResourceType", "Tags", "ChargeCategory", "BillingCurrency"):
        assert col in header
    custom = [c for c in header if c not in outputs.FOCUS_STANDARD_COLUMNS]
    assert custom and all(c.startswith("x_") for c in custom)
    assert {"x_EffectiveGpuHours", "x_WasteIdleAllocatedCost", "x_WasteMaskedCost", "x_WasteStragglerCost",
            "x_WasteThrottledCost", "x_UnallocatedCost"} <= set(header)
    rows = parse_csv(text)
    assert {r["ChargeCategory"] for r in rows} == {"Usage"}
    assert {r["ConsumedUnit"] for r in rows} == {"GPU-Hours"} == {r["PricingUnit"] for r in rows}
    assert {r["BillingCurrency"] for r in rows} == {"USD"}
    assert sum(float(r["BilledCost"]) for r in rows) == pytest.approx(mixed_report.totals["cost"], abs=1e-3)
    for r in rows:
        assert float(r["BilledCost"]) == pytest.approx(float(r["ConsumedQuantity"]) * float(r["ListUnitPrice"]),
                                                       abs=1e-5)
        parts = sum(float(r[c]) for c in ("x_EffectiveWorkCost", "x_WasteCost", "x_NormalCost", "x_UnclassifiedCost",
                                          "x_UnknownCost", "x_UnallocatedCost"))
        assert parts == pytest.approx(float(r["BilledCost"]), abs=1e-4)
        tags = json.loads(r["Tags"])
        if r["x_Group"] != UNALLOCATED:
            assert tags["namespace"] == r["x_Group"]
    assert parse_csv(text)[0]["BillingPeriodStart"] == "2026-01-05T00:00:00Z"


def test_focus_csv_leaves_unpriced_cost_empty_not_zero():
    r = report_for(make_fleet([gpu(namespace="a", job="j", model="NVIDIA B200"), gpu(namespace="a", job="j")]))
    rows = {x["x_GpuModel"]: x for x in parse_csv(outputs.to_focus_csv(r))}
    b200 = rows["NVIDIA B200"]
    assert b200["BilledCost"] == "" and b200["ListUnitPrice"] == "" and b200["SkuId"] == ""
    assert float(b200["x_UnpricedGpuHours"]) == 1.0 and float(b200["ConsumedQuantity"]) == 1.0
    assert "unpriced" in b200["ChargeDescription"]
    assert float(rows[H100]["BilledCost"]) == 3.0


def test_json_round_trip(mixed_report):
    doc = outputs.to_json(mixed_report)
    text = json.dumps(doc, allow_nan=False)
    back = outputs.from_json(json.loads(text))
    pd.testing.assert_frame_equal(back.groups, mixed_report.groups)
    pd.testing.assert_frame_equal(back.detail, mixed_report.detail)
    for k, v in mixed_report.totals.items():
        assert (math.isnan(v) and math.isnan(back.totals[k])) or back.totals[k] == pytest.approx(v), k
    assert back.tags == mixed_report.tags and back.notes == mixed_report.notes
    assert back.coverage == mixed_report.coverage and doc["coverage"]["ratio"] == mixed_report.coverage.ratio
    assert (back.group_by, back.start, back.end, back.currency) == (
        mixed_report.group_by, mixed_report.start, mixed_report.end, mixed_report.currency)
    assert outputs.to_focus_csv(back) == outputs.to_focus_csv(mixed_report)
    assert doc["groups"][0]["group"] == mixed_report.groups["group"].iloc[0] and "tags" in doc["groups"][0]
    with pytest.raises(ValueError, match="not a truegpu cost report"):
        outputs.from_json({"schema": "other"})


def _well_formed(page: str) -> ET.Element:
    return ET.fromstring(re.sub(r"^<!DOCTYPE html>\s*", "", page))


def test_html_is_self_contained(mixed_report, tmp_path):
    path = outputs.write_html(mixed_report, tmp_path / "out")
    assert path == tmp_path / "out" / outputs.HTML_NAME
    page = path.read_text(encoding="utf-8")
    _well_formed(page)
    low = page.lower()
    assert "<script" not in low and "http://" not in low and "https://" not in low and "<link" not in low
    assert "src=" not in low and "@import" not in low and "url(" not in low
    assert page.count("<svg") >= 2 and 'id="cost-by-group-t"' in page and 'id="waste-breakdown-t"' in page
    for ns in ("llm", "serving", "batch", "notebooks", UNALLOCATED):
        assert f"<td>{ns}</td>" in page
    assert "$" in page and "EffectiveCost" in page  # the FOCUS note


def test_savings_ranked_with_their_lever_at_the_top(mixed_report, tmp_path):
    from analyzer.analysis.partition import LEVERS
    from analyzer.finops.costs import savings

    top = savings(mixed_report)
    costs = [r["cost"] for r in top]
    assert costs == sorted(costs, reverse=True) and all(r["lever"] == LEVERS[r["part"]] for r in top)
    # the demo's recoverable waste: the straggler's peers in llm, the memory-bound batch job, the idle notebooks
    assert [(r["group"], r["part"]) for r in top[:3]] == [
        ("llm", "straggler"), ("batch", "masked"), ("notebooks", "idle_allocated")]
    assert sum(r["cost"] for r in top) <= mixed_report.totals["waste_cost"] + 1e-9
    # healthy training is mostly headroom: llm's waste is a fraction of its normal gap
    llm = group(mixed_report, "llm")
    assert llm["waste_cost"] < 0.5 * llm["headroom_cost"]
    assert llm["cost_per_attainable_gpu_hour"] < llm["cost_per_effective_gpu_hour"]
    page = outputs.render_html(mixed_report)
    assert page.index('id="savings"') < page.index('id="charts"') < page.index('id="groups"')
    assert LEVERS["straggler"] in page
    doc = outputs.to_json(mixed_report)
    assert doc["savings"] == json.loads(json.dumps(top)) and doc["schema"] == "truegpu.cost_report/v2"
    v1 = dict(doc, schema="truegpu.cost_report/v1",
              detail=[{k: v for k, v in d.items() if not k.startswith(("headroom", "unclassified"))}
                      for d in doc["detail"]])
    assert outputs.from_json(v1).totals["headroom_gpu_hours"] == 0.0  # older reports still read


def test_html_escapes_user_text():
    evil = '<script>alert("x")</script>&'
    r = report_for(make_fleet([gpu(namespace=evil, job="j"), gpu(namespace="ok", job="k", model="Evil <GPU>")]))
    page = outputs.render_html(r)
    _well_formed(page)
    assert "<script" not in page and "&lt;script&gt;" in page and "Evil &lt;GPU&gt;" in page
    csv_text = outputs.to_focus_csv(r)
    assert parse_csv(csv_text)[0]["x_Group"] in (evil, "ok")  # CSV quoting keeps the raw value


def test_gpu_report_has_one_row_per_gpu_with_its_uuid_as_resource_id(scenario_inputs):
    fleet, scores, findings = scenario_inputs["mixed-fleet"]
    report = cost_report(fleet, scores, findings, default_catalog(), group_by="gpu")
    uuids = set(fleet.frame["uuid"].astype(str))
    assert set(report.groups["group"]) == uuids
    assert report.totals["gpu_hours"] == pytest.approx(cost_report(fleet, scores, findings, default_catalog())
                                                      .totals["gpu_hours"])
    rows = parse_csv(outputs.to_focus_csv(report))
    assert {r["ResourceId"] for r in rows} == uuids and all(r["ResourceId"] == r["x_Group"] for r in rows)


def test_catalog_billing_account_reaches_focus_and_json(scenario_inputs):
    fleet, scores, findings = scenario_inputs["mixed-fleet"]
    data = {"currency": "USD", "billing_account": {"id": "acme-gpu", "name": "ACME GPU platform"},
            "models": [{"key": "H100", "match": "H100", "price_per_gpu_hour": 2.0}]}
    report = cost_report(fleet, scores, findings, parse_catalog(data))
    rows = parse_csv(outputs.to_focus_csv(report))
    assert {(r["BillingAccountId"], r["BillingAccountName"]) for r in rows} == {("acme-gpu", "ACME GPU platform")}
    back = outputs.from_json(json.loads(json.dumps(outputs.to_json(report))))
    assert (back.billing_account_id, back.billing_account_name) == ("acme-gpu", "ACME GPU platform")
    with pytest.raises(CatalogError, match="billing_account must be a mapping"):
        parse_catalog({**data, "billing_account": {"id": ""}})
