"""Generated Grafana dashboards: no drift, valid structure, and every query answers on real data.

The real-Prometheus test backfills simulated history of the mixed-fleet scenario (truegpu and
dcgm-exporter dialects, all dcgm counters, dcgm-exporter's older ``Hostname`` label), of
mig-training (hosts renamed so the two do not collide, labelled as a second cluster, dcgm-exporter's
newer ``hostname`` label) and a few synthetic analyzer series (the analyzer's /metrics is not part
of the simulator), then runs every query of every panel through /api/v1/query_range.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import requests

from analyzer import output_schema as out
from analyzer.finops.catalog import default_catalog
from dashboards import GENERATED, build_all, write_all
from dashboards.builder import SCHEMA_VERSION
from exporter.simulator import Cluster
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import sample_times, write_history, write_openmetrics
from exporter.simulator.scenario import load_scenario
from tests.realprom import backfilled_prometheus

SPAN = 2 * 3600
STEP = 60
VARIABLES = {"datasource", "cluster", "hostname", "namespace", "workload", "gpu"}
#: The cluster label of the second (mig-training) cluster in the backfilled data; mixed-fleet has none.
MIG_CLUSTER = "mig"
#: Panels whose queries may legitimately return nothing on the backfilled data, with the reason.
#: Keep this short: analyzer series are backfilled synthetically instead of being excluded here.
EXCLUDED: dict[tuple[str, str], str] = {}


def _dashboards() -> dict[str, dict]:
    return {name: json.loads(text) for name, text in build_all().items()}


def _panels(dash: dict) -> list[dict]:
    return dash["panels"]


# drift and structure ----------------------------------------------------------------------


def test_generated_files_match_the_code(tmp_path: Path) -> None:
    written = {p.name: p.read_bytes() for p in write_all(tmp_path)}
    committed = {p.name: p.read_bytes() for p in GENERATED.glob("*.json")}
    assert sorted(written) == sorted(committed), "run `python -m dashboards` and commit dashboards/generated/"
    stale = [name for name in written if written[name] != committed[name]]
    assert not stale, f"dashboards/generated/ is stale for {stale}: run `python -m dashboards`"


def test_every_dashboard_exists_in_both_dialects() -> None:
    names = set(build_all())
    keys = {n.split("-", 1)[1] for n in names}
    assert keys == {"fleet.json", "node.json", "job.json", "thermal.json", "health.json", "finops.json", "mig.json"}
    assert names == {f"{d}-{k}" for d in ("truegpu", "dcgm") for k in keys}


@pytest.mark.parametrize("name", sorted(build_all()))
def test_dashboard_structure(name: str) -> None:
    dash = json.loads(build_all()[name])
    assert dash["uid"] == name.removesuffix(".json") and len(dash["uid"]) <= 40
    assert dash["title"] and dash["schemaVersion"] == SCHEMA_VERSION
    variables = {v["name"]: v for v in dash["templating"]["list"]}
    assert set(variables) >= VARIABLES
    assert variables["datasource"]["type"] == "datasource"
    for v in VARIABLES - {"datasource"}:
        assert variables[v]["datasource"] == {"type": "prometheus", "uid": "${datasource}"}
        assert variables[v]["includeAll"] and variables[v]["current"]["value"] == ["$__all"]
        # truegpu: All hosts = the hosts listed (narrowed by site/rack), not every host
        narrowed = name.startswith("truegpu-") and v == "hostname"
        assert variables[v]["allValue"] == (None if narrowed else ".*"), v
    assert "hostlabel" not in variables  # dcgm: both host labels are normalised in the queries
    assert ("site" in variables and "rack" in variables) == name.startswith("truegpu-")
    ids = [p["id"] for p in _panels(dash)]
    assert len(ids) == len(set(ids)) and len(ids) >= 6
    for p in _panels(dash):
        where = f"{name}: {p['title']}"
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, where
        assert p["fieldConfig"]["defaults"]["unit"], f"{where} has no unit"
        assert p["type"] in ("timeseries", "stat", "table"), where
        assert p["targets"], where
        for t in p["targets"]:
            assert t["expr"] and t["datasource"] == p["datasource"], where
        grid = p["gridPos"]
        assert grid["x"] >= 0 and grid["x"] + grid["w"] <= 24, where


def test_metric_names_come_from_the_contract() -> None:
    """Every truegpu_* / DCGM_FI_* name in a query is a contract metric or one of its dcgm fields."""
    from exporter import schema
    from exporter.schema import DCGM_FB_FREE, DCGM_FB_RESERVED

    known = {m.name for m in schema.METRICS} | {m.name for m in out.METRICS}
    known |= {f.field for m in schema.METRICS for f in m.dcgm} | {DCGM_FB_FREE, DCGM_FB_RESERVED}
    for name, dash in _dashboards().items():
        for p in _panels(dash):
            for t in p["targets"]:
                used = set(re.findall(r"\b(?:truegpu_[a-z_]+|DCGM_FI_(?:DEV|PROF)_[A-Z0-9_]+)\b", t["expr"]))
                assert used <= known, f"{name}: {p['title']}: {used - known}"
                if name.startswith("truegpu-"):
                    assert "DCGM_FI_" not in t["expr"]
                else:
                    assert not used & {m.name for m in schema.METRICS}, f"{name}: {p['title']}"


def test_dcgm_panels_say_when_they_need_non_default_counters() -> None:
    from exporter.schema import DCGM_DEFAULT_FIELDS

    dash = _dashboards()["dcgm-fleet.json"]
    for p in _panels(dash):
        fields = {f for t in p["targets"] for f in re.findall(r"DCGM_FI_(?:DEV|PROF)_[A-Z0-9_]+", t["expr"])}
        noted = "default counter list does not collect" in (p["description"] or "")
        assert noted == bool(fields - DCGM_DEFAULT_FIELDS), p["title"]
    sm = next(p for p in _panels(dash) if p["title"] == "SM activity")
    assert "DCGM_FI_PROF_SM_ACTIVE" in sm["description"]


# real Prometheus ------------------------------------------------------------------------------


def _rename_hosts(path: Path, prefix: str, cluster: str) -> None:
    """Hosts renamed ``prefix<host>`` and every sample labelled ``cluster="<cluster>"``: a second cluster."""
    text = re.sub(r'="(dc\d)', rf'="{prefix}\1', path.read_text())
    text = re.sub(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{([^}]*)\})? ",
                  lambda m: f'{m.group(1)}{{cluster="{cluster}"{"," + m.group(2) if m.group(2) else ""}}} ',
                  text, flags=re.M)
    path.write_text(text)


def _analyzer_history(path: Path, cluster: Cluster, start: float, end: float) -> None:
    """The analyzer's series over the window, as `truegpu serve` would have published them: one finding
    per ground-truth problem of the scenario while it is open, and job/fleet scores."""
    times = sample_times(start, end, STEP)
    ones = np.ones(times.shape)
    namespace = {w.name: w.namespace for w in cluster.scenario.workloads}
    findings = []
    for t in cluster.ground_truth():
        labels = {"kind": t["kind"], "severity": "critical" if t["kind"] == "gpu_fault" else "warning",
                  "hostname": t["hostname"] or "", "gpu": t["gpu"] or "", "gpu_instance": "", "rack": "",
                  "namespace": namespace.get(t["job"] or "", ""), "workload": t["job"] or ""}
        open_ = np.where((times >= t["start"]) & (times < t["end"]), 1.0, np.nan)
        if not np.isnan(open_).all():
            findings.append(({k: labels[k] for k in out.FINDING_LABELS}, open_))
    jobs = sorted({(namespace[w], w) for w in namespace})
    catalog = default_catalog()
    prices = [(m, catalog.lookup(m)) for m in sorted(set(map(str, cluster.gpus.model)))]
    prices = [(m, e) for m, e in prices if e is not None]
    series = [
        *((out.FINDING_ACTIVE, f, v) for f, v in findings),
        *((out.FINDING_SCORE, f, 0.5 * v) for f, v in findings),
        *((out.JOB_EFFECTIVE_UTILIZATION, {"namespace": n, "workload": j}, 0.4 * ones) for n, j in jobs),
        *((out.JOB_REPORTED_UTILIZATION, {"namespace": n, "workload": j}, 0.9 * ones) for n, j in jobs),
        *((out.JOB_ALLOCATED_GPUS, {"namespace": n, "workload": j}, 8 * ones) for n, j in jobs),
        *((out.FLEET_EFFECTIVE_UTILIZATION, {"allocation": a}, 0.3 * ones) for a in ("allocated", "all")),
        *((out.FLEET_REPORTED_UTILIZATION, {"allocation": a}, 0.7 * ones) for a in ("allocated", "all")),
        *((out.GPU_HOURLY_COST, {"model": m, "sku": e.key, "currency": catalog.currency}, e.price_per_gpu_hour * ones)
          for m, e in prices),
        *((out.FLEET_GPU_SECONDS, {out.PART_LABEL: p}, 3600.0 * ones) for p in out.PARTS),
        *((out.NAMESPACE_GPU_SECONDS, {"namespace": n, out.PART_LABEL: p}, 1800.0 * ones)
          for n in sorted(set(namespace.values())) for p in out.PARTS[:-2]),
    ]
    with open(path, "w") as f:
        write_openmetrics(f, series, times)


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory, promtool, prometheus_bin):
    tmp = tmp_path_factory.mktemp("dashprom")
    cluster = Cluster(load_scenario("mixed-fleet"))
    start = float(cluster.start)
    end = start + SPAN
    files = [tmp / "truegpu.om", tmp / "dcgm.om", tmp / "mig-truegpu.om", tmp / "mig-dcgm.om", tmp / "analyzer.om"]
    write_history(files[0], cluster, start, end, STEP)
    write_history(files[1], cluster, start, end, STEP, dialect="dcgm",
                  dcgm_options=DcgmOptions(counters="all", hostname_label="Hostname"))
    mig = Cluster(load_scenario("mig-training"), start=start)
    write_history(files[2], mig, start, end, STEP)
    write_history(files[3], mig, start, end, STEP, dialect="dcgm",
                  dcgm_options=DcgmOptions(counters="all", hostname_label="hostname"))
    for f in files[2:4]:
        _rename_hosts(f, "mig-", MIG_CLUSTER)
    _analyzer_history(files[4], cluster, start, end)
    with backfilled_prometheus(tmp, files, promtool, prometheus_bin) as url:
        yield url, start, end


def _substitute(expr: str, values: dict[str, str]) -> str:
    builtins = {"$__range": f"{SPAN}s", "$__rate_interval": f"{4 * STEP}s", "$__interval": f"{STEP}s"}
    for k, v in {**builtins, **{f"${k}": v for k, v in values.items()}}.items():
        expr = expr.replace(k, v)
    assert not re.search(r"\$(?!1\b)[A-Za-z_]", expr), expr
    return expr


def _query_range(url: str, expr: str, start: float, end: float) -> list:
    r = requests.get(f"{url}/api/v1/query_range",
                     params={"query": expr, "start": start, "end": end - STEP, "step": STEP}, timeout=60)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", f"{expr}\n-> {body.get('error')}"
    return body["data"]["result"]


ALL_VALUES = {"cluster": ".*", "hostname": ".*", "gpu": ".*", "namespace": ".*", "workload": ".*"}
#: Real values for a second pass over the drill-down dashboards (dcgm: $workload lists pods): the host and
#: job of mixed-fleet's thermally throttled straggler.
SPECIFIC = {
    "truegpu": {"cluster": "", "hostname": "dc1-r1-n01", "gpu": "4|5|6", "namespace": "llm",
                "workload": "pretrain-7b"},
    "dcgm": {"cluster": "", "hostname": "dc1-r1-n01", "gpu": "4|5|6", "namespace": "llm", "workload": "pretrain-7b-.*"},
}


def _run_all(url: str, start: float, end: float, names: list[str], values_for) -> list[str]:
    dashboards = _dashboards()
    failures = []
    for name in names:
        for p in _panels(dashboards[name]):
            if (name, p["title"]) in EXCLUDED:
                continue
            for t in p["targets"]:
                expr = _substitute(t["expr"], values_for(name))
                if not _query_range(url, expr, start, end):
                    failures.append(f"{name}: {p['title']} [{t['refId']}] returned no data:\n  {expr}")
    return failures


def test_every_panel_query_returns_data(prometheus) -> None:
    url, start, end = prometheus
    failures = _run_all(url, start, end, sorted(build_all()), lambda _name: ALL_VALUES)
    assert not failures, "\n".join(failures)


def test_drilldown_panels_with_real_variable_values(prometheus) -> None:
    url, start, end = prometheus
    names = [f"{d}-{k}.json" for d in ("truegpu", "dcgm") for k in ("node", "job", "thermal", "finops")]
    skip = {"XID errors"}  # no XID on the picked host: rightly empty (the dcgm "Last XID code" shows 0s)
    dashboards = _dashboards()
    failures = []
    for name in names:
        values = SPECIFIC[name.split("-", 1)[0]]
        for p in _panels(dashboards[name]):
            if p["title"] in skip:
                continue
            for t in p["targets"]:
                expr = _substitute(t["expr"], values)
                if not _query_range(url, expr, start, end):
                    failures.append(f"{name}: {p['title']} [{t['refId']}] returned no data:\n  {expr}")
    assert not failures, "\n".join(failures)


def _last_sum(url: str, expr: str, start: float, end: float) -> float:
    return float(sum(float(s["values"][-1][1]) for s in _query_range(url, expr, start, end)))


def test_dcgm_variant_agrees_with_truegpu_variant(prometheus) -> None:
    """The same simulated fleet read through either exporter gives the same panel values (up to DCGM's
    integer rounding). Job panels differ by design: dcgm-exporter's "workload" is the pod."""
    url, start, end = prometheus
    dashboards = _dashboards()
    compared = 0
    for key in ("fleet", "node", "thermal", "health", "finops", "mig"):
        ours = {p["title"]: p for p in _panels(dashboards[f"truegpu-{key}.json"])}
        for p in _panels(dashboards[f"dcgm-{key}.json"]):
            if p["title"] not in ours or "per workload" in p["title"] or p["title"] == "GPU identity":
                continue
            for a, b in zip(ours[p["title"]]["targets"], p["targets"], strict=True):
                x = _last_sum(url, _substitute(a["expr"], ALL_VALUES), start, end)
                y = _last_sum(url, _substitute(b["expr"], ALL_VALUES), start, end)
                assert y == pytest.approx(x, rel=0.02, abs=1e-6), f"{key}: {p['title']} [{a['refId']}]"
                compared += 1
    assert compared > 50


def test_dcgm_default_counters_panels_not_marked_return_data(tmp_path, promtool, prometheus_bin) -> None:
    """On data from dcgm-exporter's default counter list, every dcgm panel without the "not collected by
    default" note still answers, and the marked ones that read only such fields are empty (unknown), not 0."""
    cluster = Cluster(load_scenario("mixed-fleet"))
    start = float(cluster.start)
    end = start + SPAN / 2
    om = tmp_path / "dcgm-default.om"
    write_history(om, cluster, start, end, STEP, dialect="dcgm", dcgm_options=DcgmOptions())
    dashboards = _dashboards()
    checked = empty_marked = 0
    with backfilled_prometheus(tmp_path, [om], promtool, prometheus_bin) as url:
        for name in sorted(n for n in dashboards if n.startswith("dcgm-") and n != "dcgm-mig.json"):
            for p in _panels(dashboards[name]):
                desc = p["description"] or ""
                if "truegpu analyzer" in desc:
                    continue
                results = [_query_range(url, _substitute(t["expr"], ALL_VALUES), start, end) for t in p["targets"]]
                if "default counter list does not collect" in desc:
                    empty_marked += not any(results)
                else:
                    assert all(results), f"{name}: {p['title']} is empty on default-counter data"
                    checked += 1
    assert checked > 20 and empty_marked > 5


def test_the_cluster_variable_separates_clusters(prometheus) -> None:
    """Per-cluster answers add up to the all-clusters one and never mix: mixed-fleet has no cluster label
    ($cluster = "" selects it), mig-training is cluster "mig"; both dialects, both dcgm host labels."""
    url, start, end = prometheus
    dashboards = _dashboards()
    for name in ("truegpu-fleet.json", "dcgm-fleet.json"):
        (panel,) = [p for p in _panels(dashboards[name]) if p["title"] == "Allocated GPUs"]
        expr = panel["targets"][0]["expr"]  # GPUs reporting utilization, per cluster

        def counts(cluster: str, expr: str = expr) -> dict[str, float]:
            result = _query_range(url, _substitute(expr, {**ALL_VALUES, "cluster": cluster}), start, end)
            return {s["metric"].get("cluster", ""): float(s["values"][-1][1]) for s in result}

        everything, mig, rest = counts(".*"), counts(MIG_CLUSTER), counts("")
        assert set(mig) == {MIG_CLUSTER} and set(rest) == {""}, name
        assert everything == {**mig, **rest}, name
        assert mig[MIG_CLUSTER] > 0 and rest[""] > 0, name


def test_host_variables_list_every_host_under_either_label(prometheus) -> None:
    """The host variable's query (query_result, cut by its regex) lists the hosts of both clusters, and in the
    dcgm variant those written with ``Hostname`` (mixed-fleet) and with ``hostname`` (mig-training) alike."""
    url, _start, end = prometheus
    for name in ("truegpu-node.json", "dcgm-node.json"):
        variables = {v["name"]: v for v in _dashboards()[name]["templating"]["list"]}
        host = variables["hostname"]
        query = re.fullmatch(r"query_result\((.*)\)", host["query"], re.S).group(1)
        values = {"site": ".*", "rack": ".*", **ALL_VALUES}
        r = requests.get(f"{url}/api/v1/query", params={"query": _substitute(query, values), "time": end - STEP},
                         timeout=60).json()
        assert r["status"] == "success", r
        pattern = re.compile(host["regex"].strip("/"))
        # Grafana matches the regex against each series as text: {label="value", ...}
        texts = ["{" + ", ".join(f'{k}="{v}"' for k, v in s["metric"].items()) + "}" for s in r["data"]["result"]]
        hosts = {pattern.search(text).group(1) for text in texts}
        assert any(h.startswith("mig-") for h in hosts) and any(h.startswith("dc") for h in hosts), (name, hosts)
