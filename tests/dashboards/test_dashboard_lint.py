"""The rules of Grafana's dashboard-linter (github.com/grafana/dashboard-linter, lint/rule_*.go) as tests
over every generated dashboard, plus truegpu's own: every query honours ``$cluster``, the links and
the findings annotations.

PromQL validity is judged by a real parser: every expression (panel targets, annotation queries,
template-variable queries), with Grafana's variables replaced by sample values as the linter does,
goes into one temporary rule file that ``promtool check rules`` must accept. The rules that look
inside an expression (rate interval, counter aggregation, cluster matchers and groupings) read a
small PromQL tokenizer below; the expressions it reads are the ones promtool accepted.

Rules that cannot apply, and why:

* ``template-job-rule`` / ``template-instance-rule`` / ``target-job-rule`` / ``target-instance-rule``:
  truegpu never selects by scrape target. Workloads are ``workload`` (``job`` is Prometheus' scrape
  job, DESIGN.md), GPUs are ``hostname``/``gpu`` whatever target (exporter, dcgm-exporter, federated
  Prometheus) published them. The dashboards' equivalent, the ``hostname`` template, is checked with
  the linter's checkTemplate properties instead (templated datasource, query type, multi-select,
  All), except ``allValue: .+``: ``.*`` keeps series without the label (findings without a host,
  a Prometheus without a cluster label), and the truegpu host list's All is the listed hosts (so
  site/rack narrow the panels).
* ``target-logql-rule`` / ``target-logql-auto-rule``: no Loki data source.
* ``uneditable-dashboard``: the generated dashboards are provisioned from files (Grafana keeps them
  read-only there); users copy them to edit, so ``editable`` stays Grafana's default.
"""

from __future__ import annotations

import importlib
import json
import re
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from analyzer import findings as F
from analyzer import output_schema as out
from analyzer.detectors import kinds
from dashboards import MODULES, build_all
from dashboards.queries import DEFAULT_CLUSTER_LABEL
from exporter import schema as S
from tests.conftest import ROOT

DASHBOARDS = {name: json.loads(text) for name, text in build_all().items()}
NAMES = sorted(DASHBOARDS)
DATASOURCE_UIDS = {"$datasource", "${datasource}"}
#: Panel types the linter's panel rules look at (it skips others; ours are all of these).
PANEL_TYPES = {"stat", "singlestat", "graph", "table", "timeseries", "gauge"}
#: lint/rule_panel_units.go's validUnits (Grafana's valueFormats categories), kept as the linter lists them.
_UNITS = """
none string short percent percentunit humidity dB hex0x hex sci locale pixel accMS2 accFS2 accG degree radian grad
arcmin arcsec areaM2 areaF2 areaMI2 flops mflops gflops tflops pflops eflops zflops yflops ppm conppb conngm3
conngNm3 conμgm3 conμgNm3 conmgm3 conmgNm3 congm3 congNm3 conmgdL conmmolL currencyUSD currencyGBP currencyEUR
currencyJPY currencyRUB currencyUAH currencyBRL currencyDKK currencyISK currencyNOK currencySEK currencyCZK
currencyCHF currencyPLN currencyBTC currencymBTC currencyμBTC currencyZAR currencyINR currencyKRW currencyIDR
currencyPHP currencyVND bytes decbytes bits decbits kbytes deckbytes mbytes decmbytes gbytes decgbytes tbytes
dectbytes pbytes decpbytes pps binBps Bps binbps bps KiBs Kibits KBs Kbits MiBs Mibits MBs Mbits GiBs Gibits GBs
Gbits TiBs Tibits TBs Tbits PiBs Pibits PBs Pbits dateTimeAsIso dateTimeAsIsoNoDateIfToday dateTimeAsUS
dateTimeAsUSNoDateIfToday dateTimeAsLocal dateTimeAsLocalNoDateIfToday dateTimeAsSystem dateTimeFromNow watt kwatt
megwatt gwatt mwatt Wm2 voltamp kvoltamp voltampreact kvoltampreact watth watthperkg kwatth kwattm amph kamph mamph
joule ev amp kamp mamp volt kvolt mvolt dBm ohm kohm Mohm farad µfarad nfarad pfarad ffarad henry mhenry µhenry
lumens flowgpm flowcms flowcfs flowcfm litreh flowlpm flowmlpm lux forceNm forcekNm forceN forcekN Hs KHs MHs GHs
THs PHs EHs massmg massg masslb masskg masst lengthmm lengthin lengthft lengthm lengthkm lengthmi pressurembar
pressurebar pressurekbar pressurepa pressurehpa pressurekpa pressurehg pressurepsi radbq radci radgy radrad radsv
radmsv radusv radrem radexpckg radr radsvh radmsvh radusvh rotrpm rothz rotrads rotdegs celsius fahrenheit kelvin
hertz ns µs ms s m h d dtdurationms dtdurations dthms dtdhms timeticks clockms clocks cps ops reqps rps wps iops
cpm opm rpm wpm mps mpm velocityms velocitykmh velocitymph velocityknot mlitre litre m3 Nm3 dm3 gallons bool
bool_yes_no bool_on_off
"""
VALID_UNITS = frozenset(_UNITS.split())
#: Grafana's custom-unit syntax (``suffix:<text>``), which the linter's fixed list predates: GPU-hours have
#: no built-in unit. Anything else must be on the list.
CUSTOM_UNIT = re.compile(r"^suffix: ?\S+$")
#: The linter's sample values for Grafana's global variables (lint/variables.go), as PromQL durations.
GLOBALS = {"__rate_interval": "5m", "__interval": "1m", "__range": "1h"}
RATE_INTERVAL = "$__rate_interval"


def _panels() -> Iterator[tuple[str, dict]]:
    for name in NAMES:
        for p in DASHBOARDS[name]["panels"]:
            yield name, p


def _targets() -> Iterator[tuple[str, dict, dict]]:
    for name, p in _panels():
        for t in p["targets"]:
            yield name, p, t


def _variables(dash: dict) -> dict[str, dict]:
    return {v["name"]: v for v in dash["templating"]["list"]}


def _query_variables(dash: dict) -> list[dict]:
    return [v for v in dash["templating"]["list"] if v["type"] == "query"]


# PromQL tokens -------------------------------------------------------------------------------
_TOKEN = re.compile(r'''\s*(?:(?P<str>"(?:[^"\\]|\\.)*")|(?P<dur>\[[^\]]*\])|(?P<num>\d+(?:\.\d+)?(?:e[+-]?\d+)?\b)'''
                    r'''|(?P<op>=~|!~|!=|==|>=|<=|[-+*/%^<>=,(){}])|(?P<ident>[A-Za-z_:][A-Za-z0-9_:]*))''')
_KEYWORDS = {"by", "on", "without", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless", "offset"}
_LABEL_LISTS = {"by", "on", "without", "ignoring", "group_left", "group_right"}
AGGREGATIONS = {"sum", "avg", "min", "max", "count", "group", "stddev", "stdvar", "topk", "bottomk", "quantile",
                "count_values"}


def tokens(expr: str) -> list[tuple[str, str]]:
    """(kind, text) tokens; a range or subquery ``[...]`` is one ``dur`` token."""
    out_, pos = [], 0
    expr = expr.rstrip()
    while pos < len(expr):
        m = _TOKEN.match(expr, pos)
        assert m and m.end() > pos, f"cannot tokenize at {expr[pos:pos + 40]!r}"
        out_.append((m.lastgroup or "", m.group(m.lastgroup or 0)))
        pos = m.end()
    return out_


@dataclass
class Selector:
    name: str
    matchers: list[tuple[str, str, str]]
    #: The range that follows it (``[...]`` text without brackets), or None for an instant selector.
    range: str | None
    #: The function whose argument it is directly (None at top level or under an operator).
    call: str | None


def selectors(expr: str) -> list[Selector]:
    """Every vector/matrix selector of ``expr`` with its matchers, range and directly enclosing call."""
    toks = tokens(expr)
    found: list[Selector] = []
    stack: list[str | None] = []  # per open "(": the call name, "<labels>" for by/on lists, None for grouping
    i = 0
    while i < len(toks):
        kind, text = toks[i]
        nxt = toks[i + 1][1] if i + 1 < len(toks) else ""
        if text == "(":
            prev_kind, prev = toks[i - 1] if i else ("", "")
            stack.append("<labels>" if prev in _LABEL_LISTS else prev if prev_kind == "ident" else None)
        elif text == ")":
            stack.pop()
        elif (kind == "ident" and nxt not in ("(", "by", "without") and text not in _KEYWORDS
              and stack[-1:] != ["<labels>"]) or text == "{":
            name = text if kind == "ident" else ""
            j = i + 1 if kind == "ident" else i
            matchers: list[tuple[str, str, str]] = []
            if j < len(toks) and toks[j][1] == "{":
                j += 1
                while toks[j][1] != "}":
                    label, op, value = toks[j][1], toks[j + 1][1], toks[j + 2][1]
                    matchers.append((label, op, json.loads(value)))
                    j += 3 + (toks[j + 3][1] == ",")
                j += 1
            rng = toks[j][1][1:-1] if j < len(toks) and toks[j][0] == "dur" else None
            call = stack[-1] if stack and (toks[i - 1][1] == "(" if i else False) else None
            found.append(Selector(name, matchers, rng, call))
            i = j + (rng is not None)
            continue
        i += 1
    assert not stack, f"unbalanced parentheses in {expr}"
    return found


def groupings(expr: str) -> Iterator[tuple[str, list[str]]]:
    """(keyword, labels) of every ``by``/``on``/``without``/``ignoring`` list, and bare aggregations as
    (aggregation, None-like empty list marker ``["<bare>"]``)."""
    toks = tokens(expr)
    for i, (kind, text) in enumerate(toks):
        if text in ("by", "on", "without", "ignoring"):
            j = toks.index((("op", ")")), i)
            yield text, [t for k, t in toks[i + 2:j] if k == "ident"]
        elif kind == "ident" and text in AGGREGATIONS and i + 1 < len(toks) and toks[i + 1][1] == "(" \
                and (i == 0 or toks[i - 1][1] not in ("by", "without")):
            yield text, ["<bare>"]


def _substitute(expr: str, variables: list[dict]) -> str:
    """Grafana variables -> sample values as the linter does: globals -> durations, template variables -> a
    value (a regex of one value); fails on a variable the dashboard does not define."""
    names = {v["name"] for v in variables}

    def value(m: re.Match) -> str:
        name = m.group(1) or m.group(2)
        if name in GLOBALS:
            return GLOBALS[name]
        assert name in names, f"undefined variable ${name} in {expr}"
        return f"{name}_value"

    return re.sub(r"\$\{(\w+)(?::\w+)?\}|\$(?!\d)(\w+)", value, expr)


def all_expressions(dashboards: dict[str, dict]) -> Iterator[tuple[str, str]]:
    """(where, PromQL) of every target, annotation and variable query, variables substituted."""
    for name, dash in dashboards.items():
        variables = dash["templating"]["list"]
        for p in dash["panels"]:
            for t in p["targets"]:
                yield f"{name}: {p['title']} [{t['refId']}]", _substitute(t["expr"], variables)
        for a in dash["annotations"]["list"]:
            yield f"{name}: annotation {a['name']}", _substitute(a["expr"], variables)
        for v in _query_variables(dash):
            for i, arg in enumerate(variable_promql(v)):
                yield f"{name}: variable {v['name']} [{i}]", _substitute(arg, variables)


def variable_promql(variable: dict) -> list[str]:
    """The PromQL inside a Prometheus query variable (template-label-promql-rule): ``label_values(sel,
    label)`` -> the selector, ``query_result(expr)`` -> the expression; another function fails."""
    m = re.fullmatch(r"([a-z_]+)\((.*)\)", variable["query"], re.S)
    assert m, f"variable {variable['name']}: invalid query {variable['query']!r}"
    function, arg = m.groups()
    assert function in ("label_names", "label_values", "metrics", "query_result"), function
    if function == "label_values":
        selector, _, label = arg.rpartition(",")
        assert re.fullmatch(r"[a-zA-Z_][a-zA-Z0-9_]*", label.strip()), f"bad label in {variable['query']}"
        return [selector] if selector else []
    return [arg] if function == "query_result" else []


def promtool_check(expressions: list[tuple[str, str]], tmp: Path, promtool: str) -> subprocess.CompletedProcess:
    """``promtool check rules`` on one recording rule per expression (one group each, named after it)."""
    groups = [{"name": f"{i:04d} {where}", "rules": [{"record": f"lint:expression_{i:04d}", "expr": expr}]}
              for i, (where, expr) in enumerate(expressions)]
    path = tmp / "dashboard-expressions.yml"
    path.write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
    return subprocess.run([promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=120)


# template rules ------------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_template_datasource_rule(name: str) -> None:
    """A templated data source, named 'datasource' and labelled 'Data source', of Prometheus."""
    (ds,) = [v for v in DASHBOARDS[name]["templating"]["list"] if v["type"] == "datasource"]
    assert (ds["name"], ds["label"], ds["query"]) == ("datasource", "Data source", "prometheus")


@pytest.mark.parametrize("name", NAMES)
def test_host_template_like_template_job_rule(name: str) -> None:
    """checkTemplate's properties on the template that plays job/instance's part here (see module doc)."""
    host = _variables(DASHBOARDS[name])["hostname"]
    assert host["datasource"]["uid"] in DATASOURCE_UIDS
    assert host["type"] == "query" and host["label"] == "Host" and host["multi"] and host["includeAll"]
    assert host["allValue"] in (".*", None)


@pytest.mark.parametrize("name", NAMES)
def test_template_label_promql_rule(name: str) -> None:
    """Every query variable uses a Prometheus variable function; its PromQL parses (with the rest, below)."""
    variables = _query_variables(DASHBOARDS[name])
    assert len(variables) >= 5
    for v in variables:
        assert v["datasource"]["uid"] in DATASOURCE_UIDS, v["name"]
        variable_promql(v)
        if v["query"].startswith("query_result("):  # the value is cut out of the series text
            assert v["regex"] == f'/{v["name"]}="([^"]+)"/', v["name"]


@pytest.mark.parametrize("name", NAMES)
def test_template_on_time_change_reload_rule(name: str) -> None:
    for v in _query_variables(DASHBOARDS[name]):
        assert v["refresh"] == 2, f"{v['name']} must refresh on time range change"


# panel rules -------------------------------------------------------------------------------------------
def test_panel_datasource_rule() -> None:
    for name, p in _panels():
        assert p["datasource"]["uid"] in DATASOURCE_UIDS, f"{name}: {p['title']}"
        assert all(t["datasource"]["uid"] in DATASOURCE_UIDS for t in p["targets"]), f"{name}: {p['title']}"


def test_panel_title_description_rule() -> None:
    for name, p in _panels():
        assert p["type"] in PANEL_TYPES
        assert p["title"].strip() and (p["description"] or "").strip(), f"{name}: {p['title']!r} has no description"


def test_panel_units_rule() -> None:
    for name, p in _panels():
        defaults = p["fieldConfig"]["defaults"]
        if defaults.get("mappings"):
            continue  # the linter skips panels with value mappings
        unit = defaults.get("unit") or ""
        assert unit in VALID_UNITS or CUSTOM_UNIT.match(unit), f"{name}: {p['title']}: unit {unit!r}"


def test_panel_no_targets_rule() -> None:
    for name, p in _panels():
        assert p["targets"] and all(t["expr"].strip() for t in p["targets"]), f"{name}: {p['title']}"


# target rules --------------------------------------------------------------------------------------------
def test_target_promql_rule(tmp_path: Path, promtool: str) -> None:
    """Every expression parses with Prometheus' own parser (promtool)."""
    expressions = list(all_expressions(DASHBOARDS))
    assert len(expressions) > 250
    result = promtool_check(expressions, tmp_path, promtool)
    assert result.returncode == 0, (result.stdout + result.stderr)[-5000:]
    assert f"{len(expressions)} rules found" in result.stdout + result.stderr


def test_promtool_check_rejects_bad_promql(tmp_path: Path, promtool: str) -> None:
    """The check above can fail: an expression the parser rejects fails it."""
    bad = [("ok", "sum by (cluster) (up)"), ("bad", 'rate(up{cluster=~"x"}[5m]')]
    result = promtool_check(bad, tmp_path, promtool)
    assert result.returncode != 0 and "bad" in result.stdout + result.stderr


def test_target_rate_interval_rule() -> None:
    """rate()/irate() of a range selector use $__rate_interval (other functions may use other windows)."""
    checked = 0
    for name, p, t in _targets():
        for sel in selectors(t["expr"]):
            if sel.range is not None and ":" not in sel.range and sel.call in ("rate", "irate"):
                assert sel.range == RATE_INTERVAL, f"{name}: {p['title']}: rate over [{sel.range}]"
                checked += 1
    assert checked > 20


def test_target_counter_agg_rule() -> None:
    """A ``*_total`` selector only appears as rate/irate/increase(counter[range]); and every truegpu
    contract counter is read that way (dcgm-exporter names no counter ``*_total``; its upper-case
    ``*_TOTAL`` fields include a per-second rate, NVLINK_BANDWIDTH_TOTAL, that must not be rate()d)."""
    counters = {m.name for m in (*S.METRICS, *out.METRICS) if m.type == "counter"}
    seen = set()
    for name, p, t in _targets():
        for sel in selectors(t["expr"]):
            if sel.name.endswith("_total") or sel.name in counters:
                assert sel.range is not None and sel.call in ("rate", "irate", "increase"), \
                    f"{name}: {p['title']}: counter {sel.name} not aggregated with rate/irate/increase"
                seen.add(sel.name)
    assert {S.XID_ERRORS.name, S.ECC_ERRORS.name, S.NVLINK_ERRORS.name, S.PCIE_REPLAYS.name} <= seen


def test_the_tokenizer_finds_what_the_rules_look_for() -> None:
    """The rules above can fail: the tokenizer sees bad windows, bare counters and missing matchers."""
    (bad_rate,) = selectors('sum by (cluster) (rate(x_total{cluster=~"$cluster"}[5m]))')
    assert (bad_rate.name, bad_rate.range, bad_rate.call) == ("x_total", "5m", "rate")
    bare, joined = selectors('x_total * on(cluster, hostname) group_left(model) {__name__=~"a|b", gpu="1"}')
    assert bare.range is None and bare.call is None and joined.matchers == [("__name__", "=~", "a|b"),
                                                                           ("gpu", "=", "1")]
    assert list(groupings("count(x) / sum by (hostname) (y)")) == [("count", ["<bare>"]), ("by", ["hostname"])]


# truegpu's rules: clusters, links, findings ----------------------------------------------------------------
def _honours_cluster(dashboards: dict[str, dict], label: str) -> int:
    """Asserts every selector matches ``label=~"$cluster"`` and every grouping keeps ``label``; returns the
    number of selectors checked."""
    checked = 0
    for name, dash in dashboards.items():
        exprs = [(f"{p['title']} [{t['refId']}]", t["expr"]) for p in dash["panels"] for t in p["targets"]]
        exprs += [(f"annotation {a['name']}", a["expr"]) for a in dash["annotations"]["list"]]
        exprs += [(f"variable {v['name']}", e) for v in _query_variables(dash) if v["name"] != "cluster"
                  for e in variable_promql(v)]
        for where, expr in exprs:
            for sel in selectors(expr):
                assert (label, "=~", "$cluster") in sel.matchers, f"{name}: {where}: {sel.name or sel.matchers}"
                checked += 1
            for keyword, labels in groupings(expr):
                assert keyword in ("by", "on") and label in labels, f"{name}: {where}: {keyword} ({labels})"
    return checked


def test_every_query_honours_the_cluster_variable() -> None:
    assert _honours_cluster(DASHBOARDS, DEFAULT_CLUSTER_LABEL) > 500
    for name in NAMES:
        cluster = _variables(DASHBOARDS[name])["cluster"]
        assert cluster["query"].startswith("label_values(") and cluster["query"].endswith(f", {DEFAULT_CLUSTER_LABEL})")
        assert cluster["includeAll"] and cluster["hide"] == 0


def test_a_site_cluster_label_runs_through_every_query() -> None:
    other = {n: json.loads(t) for n, t in build_all("k8s_cluster").items()}
    assert _honours_cluster(other, "k8s_cluster") > 500
    assert not any(re.search(rf"\b{DEFAULT_CLUSTER_LABEL}=~", t) for t in build_all("k8s_cluster").values())
    for name, text in build_all("").items():  # no cluster label: no variable, no matcher, no grouping
        assert "$cluster" not in text and "cluster" not in _variables(json.loads(text)), name


def test_python_m_dashboards_renders_a_site(tmp_path: Path) -> None:
    site = tmp_path / "site.yaml"
    site.write_text("selectors:\n  cluster_label: k8s_cluster\n")
    import sys

    done = subprocess.run([sys.executable, "-m", "dashboards", "--site", str(site), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    written = {p.name: p.read_text() for p in (tmp_path / "out").glob("*.json")}
    assert sorted(written) == NAMES
    assert all('k8s_cluster=~\\"$cluster\\"' in text for text in written.values())


def test_dcgm_dashboards_read_both_host_labels_without_a_variable() -> None:
    for name in (n for n in NAMES if n.startswith("dcgm-")):
        assert "hostlabel" not in _variables(DASHBOARDS[name])
        for p in DASHBOARDS[name]["panels"]:
            for t in p["targets"]:
                hosts = [sel for sel in selectors(t["expr"]) if sel.matchers[0][0] == "__name__"
                         and any(k in ("Hostname", "hostname") for k, _, _ in sel.matchers)]
                # each host-filtered selector comes in a pair, one per host label, and is normalised
                labels = [k for sel in hosts for k, _, _ in sel.matchers if k in ("Hostname", "hostname")]
                assert labels.count("Hostname") == labels.count("hostname"), f"{name}: {p['title']}"
                if hosts:
                    assert '"hostname", "$1", "Hostname", "(.+)"' in t["expr"], f"{name}: {p['title']}"


def _modules() -> dict[str, object]:
    return {m.KEY: m for m in (importlib.import_module(f"dashboards.{k}") for k in MODULES)}


def test_dashboard_links_chain_fleet_node_gpu_job() -> None:
    """fleet -> node -> GPU (health/thermal) -> job, each keeping the time range and the variables."""
    for dialect in ("truegpu", "dcgm"):
        def targets(key: str, dialect: str = dialect) -> set[str]:
            links = [lk for lk in DASHBOARDS[f"{dialect}-{key}.json"]["links"]
                     if not lk.get("url", "").startswith("${analyzer_url}")]  # the analyzer's pages: below
            assert all(link["keepTime"] and link["includeVars"] for link in links)
            return {link["url"].removeprefix("/d/") for link in links if link["type"] == "link"}

        assert f"{dialect}-node" in targets("fleet")
        assert {f"{dialect}-health", f"{dialect}-thermal"} <= targets("node")
        assert f"{dialect}-job" in targets("health") & targets("thermal")
        for name in (n for n in NAMES if n.startswith(dialect)):
            assert targets(name.split("-", 1)[1].removesuffix(".json")) <= {n.removesuffix(".json") for n in NAMES}


def test_the_job_dashboard_links_the_analyzer_s_job_page() -> None:
    """`truegpu job`'s page of the selected workload, at the analyzer URL the dashboard's textbox holds."""
    from dashboards.builder import ANALYZER_URL_DEFAULT

    for dialect in ("truegpu", "dcgm"):
        dash = DASHBOARDS[f"{dialect}-job.json"]
        pages = [lk for lk in dash["links"] if lk.get("url", "").startswith("${analyzer_url}")]
        assert [lk["url"] for lk in pages] == ["${analyzer_url}/jobs/${workload:percentencode}"]
        var = next(v for v in dash["templating"]["list"] if v["name"] == "analyzer_url")
        assert var["type"] == "textbox" and var["query"] == ANALYZER_URL_DEFAULT
        assert "workload" in _variables(dash)
    others = [n for n in NAMES if not n.endswith("-job.json")]
    assert not any("analyzer_url" in json.dumps(DASHBOARDS[n]) for n in others)


def test_data_links_open_existing_dashboards_with_their_variables() -> None:
    linked = set()
    for name, p in _panels():
        for link in p["fieldConfig"]["defaults"].get("links", []):
            url = link["url"]
            uid = re.match(r"/d/([a-z]+-[a-z]+)\?", url).group(1)
            assert f"{uid}.json" in DASHBOARDS and uid.split("-")[0] == name.split("-")[0], url
            assert "${__url_time_range}" in url and "${datasource:queryparam}" in url
            target_vars = _variables(DASHBOARDS[f"{uid}.json"])
            source = "__data.fields" if p["type"] == "table" else "__field.labels"
            for var, label in re.findall(r"&var-(\w+)=\$\{(?:__data\.fields|__field\.labels)\.(\w+)\}", url):
                assert var in target_vars, url
                assert source in url
                assert label == (DEFAULT_CLUSTER_LABEL if var == "cluster" else var)
            linked.add((name.split("-")[0], uid.split("-")[1]))
    for dialect in ("truegpu", "dcgm"):
        assert {(dialect, k) for k in ("node", "health", "job")} <= linked


def test_findings_are_annotations_filtered_by_the_variables() -> None:
    modules = _modules()
    assert set(modules["fleet"].FINDINGS) == set(kinds())
    assert set(modules["thermal"].FINDINGS) == {F.THERMAL}
    assert set(modules["health"].FINDINGS) == {F.GPU_FAULT, F.DEGRADED_GPU}
    assert {F.STRAGGLER, F.IDLE_ALLOCATED} <= set(modules["job"].FINDINGS)
    for name in NAMES:
        key = name.split("-", 1)[1].removesuffix(".json")
        (annotation,) = DASHBOARDS[name]["annotations"]["list"]
        assert annotation["enable"] and annotation["datasource"]["uid"] in DATASOURCE_UIDS
        (sel,) = selectors(annotation["expr"])
        assert sel.name == out.FINDING_ACTIVE.name
        matchers = {k: v for k, _, v in sel.matchers}
        assert set(matchers["kind"].split("|")) == set(modules[key].FINDINGS) <= set(kinds())
        for var in ("cluster", "hostname", "gpu", "namespace"):
            assert matchers[var if var != "cluster" else DEFAULT_CLUSTER_LABEL] == f"${var}", (name, var)
        assert "{{kind}}" in annotation["titleFormat"] and "{{hostname}}" in annotation["textFormat"]
