"""Scoped access: a token the site config scopes to namespaces sees its own jobs, findings, scores and
costs through every route, and nothing fleet-wide; the admin token (--api-token-file) sees all. Through the
real app on a loopback uvicorn over the simulated mixed fleet."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterator

import pytest
import requests
from fastapi.routing import APIRoute
from starlette.routing import Route

from analyzer.service.app import create_app
from analyzer.service.settings import ApiSettings
from analyzer.site import parse_site
from tests.analyzer.service.kit import AUTH, TOKEN, served

NOTEBOOKS = "nb-token-7f3c2a"
SCOPED = {"Authorization": f"Bearer {NOTEBOOKS}"}
#: The mixed fleet's workloads outside the notebooks namespace: a scoped answer never names one.
OTHERS = ("pretrain-7b", "finetune-13b", "chat-serve", "ranker-serve", "embed-batch")


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


@pytest.fixture(scope="module")
def app(analyzed, catalog, tmp_path_factory):
    token_file = tmp_path_factory.mktemp("tokens") / "serving"
    token_file.write_text("serving-token-1\n")
    site = parse_site({"access": {"tokens": [
        {"name": "notebooks", "sha256": sha(NOTEBOOKS), "namespaces": ["note*"]},
        {"name": "serving", "token_file": str(token_file), "namespaces": ["serving"]},
    ]}}, "site.yaml")
    service, _ = analyzed
    return create_app(service, ApiSettings(token=TOKEN, catalog=catalog, tokens=site.tokens, protect_metrics=True))


@pytest.fixture(scope="module")
def api(app) -> Iterator[str]:
    with served(app) as url:
        yield url


def get(url: str, path: str, headers: dict, **params) -> requests.Response:
    return requests.get(url + path, params=params, headers=headers, timeout=60)


def test_findings_scores_costs_and_jobs_of_its_namespaces_only(api, analyzed):
    a = analyzed[0].snapshot().analysis
    mine = sorted(f.id for f in a.findings if f.namespace == "notebooks")
    assert mine and len(mine) < len(a.findings)
    got = get(api, "/api/findings", SCOPED).json()
    assert sorted(f["id"] for f in got["findings"]) == mine and got["total"] == len(mine)

    rows = get(api, "/api/scores", SCOPED, level="workload").json()["rows"]
    assert [r["workload"] for r in rows] == ["nb-alice"]
    admin = {r["workload"]: r for r in get(api, "/api/scores", AUTH, level="workload").json()["rows"]}
    assert rows[0] == admin["nb-alice"]
    assert [r["namespace"] for r in get(api, "/api/scores", SCOPED, level="namespace").json()["rows"]] == \
        ["notebooks"]

    for group_by in ("namespace", "workload"):
        report = get(api, "/api/reports/cost", SCOPED, group_by=group_by).json()["report"]
        want = "notebooks" if group_by == "namespace" else "nb-alice"
        assert [g["group"] for g in report["groups"]] == [want]
        full = {g["group"]: g for g in get(api, "/api/reports/cost", AUTH, group_by=group_by).json()["report"]
                ["groups"]}
        assert report["totals"]["cost"] == pytest.approx(full[want]["cost"])
        assert report["totals"]["gpu_hours"] == pytest.approx(full[want]["gpu_hours"])
    csv = get(api, "/api/reports/cost", SCOPED, group_by="workload", format="csv").text
    assert "nb-alice" in csv and not any(o in csv for o in OTHERS)

    assert [j["job"] for j in get(api, "/api/jobs", SCOPED).json()["jobs"]] == ["nb-alice"]
    assert get(api, "/api/jobs/nb-alice", SCOPED).json()["job"]["workload"] == "nb-alice"
    hidden = get(api, "/api/jobs/pretrain-7b", SCOPED)
    assert hidden.status_code == 404 and not any(o in hidden.text for o in OTHERS[1:])  # no list of workloads
    assert get(api, "/api/jobs/no-such", SCOPED).status_code == 404
    assert "pretrain-7b" in get(api, "/api/jobs/no-such", AUTH).json()["detail"]  # the admin is told the names


def test_fleet_wide_answers_need_the_admin_token(api):
    for path, params in (("/api/scores", {"level": "fleet"}), ("/api/scores", {"level": "node"}),
                         ("/api/reports/cost", {"group_by": "node"}), ("/metrics", {})):
        r = get(api, path, SCOPED, **params)
        assert r.status_code == 403, (path, r.status_code)
        if path != "/metrics":
            assert "token 'notebooks' sees namespaces note* only" in r.json()["detail"]
        assert get(api, path, AUTH, **params).status_code == 200
    basic = {"Authorization": "Basic " + base64.b64encode(f"me:{NOTEBOOKS}".encode()).decode()}
    assert get(api, "/", basic).status_code == 403  # the overview is the whole fleet
    assert get(api, "/jobs/nb-alice", basic).status_code == 200
    assert get(api, "/jobs/chat-serve", basic).status_code == 404
    serving = {"Authorization": "Bearer serving-token-1"}  # the token read from its file
    assert {j["job"] for j in get(api, "/api/jobs", serving).json()["jobs"]} == {"chat-serve", "ranker-serve"}
    assert get(api, "/api/findings", {"Authorization": "Bearer nope"}).status_code == 401


def get_paths(routes) -> set[str]:
    """Every GET route's path, included routers walked into (FastAPI wraps them)."""
    out = set()
    for r in routes:
        if isinstance(r, APIRoute | Route) and "GET" in (r.methods or ()):
            out.add(r.path)
        inner = getattr(r, "original_router", None)
        if inner is not None:
            out |= get_paths(inner.routes)
    return out


def test_every_route_answers_a_scoped_token_within_its_namespaces(api, app):
    paths = sorted(get_paths(app.routes))
    assert {"/api/findings", "/api/scores", "/api/reports/cost", "/api/jobs", "/api/jobs/{name}", "/jobs/{name}",
            "/", "/metrics"} <= set(paths)
    for path in paths:
        r = get(api, path.replace("{name}", "nb-alice"), SCOPED)
        assert r.status_code in (200, 403), (path, r.status_code)
        if r.status_code == 200:
            assert not any(o in r.text for o in OTHERS), path


@pytest.mark.parametrize("entry, message", [
    ({"name": "x", "namespaces": ["a"]}, "give sha256 .* or token_file, one of them"),
    ({"name": "x", "sha256": "00", "namespaces": ["a"]}, r"sha256: expected 64 hex digits"),
    ({"name": "x", "sha256": "0" * 64}, r"give the namespaces \(globs\) or Slurm accounts it sees"),
    ({"name": "x", "sha256": "0" * 64, "accounts": [""]}, r"accounts: expected a glob or a list of globs"),
    ({"name": "x", "token_file": "/nonexistent/t", "namespaces": ["a"]}, r"token_file: cannot read /nonexistent/t"),
    ({"name": "x", "sha256": "0" * 64, "namespaces": ["a"], "role": "admin"}, r"unknown key\(s\) \['role'\]"),
])
def test_access_section_errors_name_the_entry(entry, message):
    with pytest.raises(ValueError, match=message):
        parse_site({"access": {"tokens": [entry]}}, "site.yaml")
    twice = [{"name": "x", "sha256": "0" * 64, "namespaces": ["a"]}, {"name": "y", "sha256": "0" * 64,
                                                                       "namespaces": ["b"]}]
    with pytest.raises(ValueError, match=r"site\.yaml: access: scoped token tokens repeat"):
        parse_site({"access": {"tokens": twice}}, "site.yaml")
    site = parse_site({"access": {"tokens": twice[:1]}}, "site.yaml")
    with pytest.raises(ValueError, match="scoped access tokens need --api-token-file"):
        ApiSettings(no_auth=True, tokens=site.tokens)
