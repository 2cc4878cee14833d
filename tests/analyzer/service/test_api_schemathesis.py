"""Property-based run of the `truegpu serve` API against its own OpenAPI spec (schemathesis).

The app holds real results (one analysis of the simulated mixed-fleet cluster, a rollup
store with two days written) before the run, so every operation can answer; schemathesis
generates valid requests from /openapi.json, sends them in-process through the ASGI app with
a valid token and checks every response: no 5xx, documented status codes and content types,
bodies that match the response models. Bounded examples keep it well under a minute.
"""

from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

from analyzer.finops.rollups import RollupWriter
from analyzer.service import AnalyzerService
from analyzer.service.app import create_app
from analyzer.service.settings import ApiSettings
from tests.analyzer.service.kit import AUTH, NOW, TOKEN, WINDOW, Source

MAX_EXAMPLES = 40


@pytest.fixture(scope="module")
def api_schema(tmp_path_factory):
    from analyzer.finops import load_catalog
    from exporter.simulator import Cluster, load_scenario

    scenario = load_scenario("mixed-fleet")
    cluster = Cluster(scenario, start=NOW - float(scenario.duration))
    catalog = load_catalog()
    store = str(tmp_path_factory.mktemp("rollups") / "rollups.db")
    source = Source(cluster)
    writer = RollupWriter(source, store, catalog, every=3600)
    service = AnalyzerService(source, url="sim", interval=60, window=WINDOW, step=60, clock=lambda: NOW + 7,
                              on_result=writer)
    assert service.run_once(), "the app must have results before the run (503 otherwise)"
    assert writer.writes == 2
    app = create_app(service, ApiSettings(token=TOKEN, catalog=catalog, store=store))
    return schemathesis.openapi.from_asgi("/openapi.json", app)


@pytest.mark.parametrize("path", ["/api/findings", "/api/scores", "/api/reports/cost"])
@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_api_conforms_to_its_openapi_spec(api_schema, path, mode):
    """Valid requests: every check (status codes, content types, response schemas); invalid ones: no 5xx."""
    operation = api_schema[path]["GET"]
    checks = None if mode is GenerationMode.POSITIVE else [not_a_server_error]
    seen: list[int] = []

    @given(case=operation.as_strategy(generation_mode=mode))
    @settings(max_examples=MAX_EXAMPLES, deadline=None, phases=[Phase.explicit, Phase.generate],
              suppress_health_check=list(HealthCheck), database=None)
    def run(case):
        response = case.call_and_validate(headers=AUTH, checks=checks)
        assert response.status_code < 500, response.text
        seen.append(response.status_code)

    run()
    assert seen
    if mode is GenerationMode.POSITIVE:
        assert 200 in seen
    else:
        assert 422 in seen
