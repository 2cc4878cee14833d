"""load_files / load_prometheus: files (plain, gzip) and a REAL Prometheus backfilled by promtool,
in both dialects, must give the simulator's own Fleet."""

from __future__ import annotations

from pathlib import Path

import pytest

from analyzer.data.load import load_files, load_prometheus
from analyzer.data.simulated import fleet_from_cluster
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import write_history
from exporter.simulator.model import Cluster
from exporter.simulator.scenario import load_scenario
from tests.analyzer.data.kit import (
    DCGM_ATOL,
    FIXTURES,
    STEP,
    _events,
    assert_matches,
    cluster,
    reference,
    window,
)
from tests.realprom import backfilled_prometheus

SCENARIO = "xid-faults"
#: The dcgm copy of the cluster lives one day later in the same Prometheus, so each window
#: holds one dialect only.
DAY = 86_400.0


def dcgm_cluster() -> Cluster:
    return Cluster(load_scenario(SCENARIO), start=cluster(SCENARIO).start + DAY)


def test_load_files_plain_and_gzip(tmp_path):
    start, end = window(SCENARIO)
    plain, gz = tmp_path / "h.om", tmp_path / "h.om.gz"
    write_history(plain, cluster(SCENARIO), start, end + STEP, STEP)
    write_history(gz, cluster(SCENARIO), start, end + STEP, STEP, dialect="dcgm",
                  dcgm_options=DcgmOptions(counters="all"))  # fmt: skip
    want = reference(SCENARIO)
    got = load_files(plain, start=start, end=end)
    assert_matches(got, want)
    assert _events(got) == _events(want) and len(got.events)
    got_gz = load_files([gz], start=start, end=end)
    assert got_gz.dialect == "dcgm"
    assert_matches(got_gz, want, DCGM_ATOL)
    # defaults: step inferred (60 s), window from the data itself
    inferred = load_files(plain)
    assert inferred.step == STEP and inferred.start == start and inferred.end == end + STEP


def test_load_files_snapshot_and_errors(tmp_path):
    fleet = load_files(FIXTURES / "l40s_default_counters.txt", default_timestamp=1_700_000_000.0)
    assert len(fleet.frame) == 4 and "DCGM_FI_PROF_SM_ACTIVE" in fleet.missing["sm_active"]
    other = tmp_path / "node.om"
    other.write_text("# TYPE node_load1 gauge\nnode_load1 0.5 1700000000\n# EOF\n")
    with pytest.raises(ValueError, match=r"no GPU telemetry in .*node\.om"):
        load_files(other)
    with pytest.raises(FileNotFoundError, match=r"nope\.om"):
        load_files(tmp_path / "nope.om")
    with pytest.raises(ValueError, match="no input files"):
        load_files([])


@pytest.fixture(scope="module")
def prom_url(tmp_path_factory, promtool, prometheus_bin):
    """A real Prometheus holding the scenario's truegpu history and, a day later, its dcgm history."""
    tmp = tmp_path_factory.mktemp("prom-load")
    start, end = window(SCENARIO)
    files = [tmp / "truegpu.om", tmp / "dcgm.om"]
    write_history(files[0], cluster(SCENARIO), start, end + STEP, STEP)
    write_history(files[1], dcgm_cluster(), start + DAY, end + DAY + STEP, STEP, dialect="dcgm",
                  dcgm_options=DcgmOptions(counters="all"))  # fmt: skip
    with backfilled_prometheus(tmp, files, promtool, prometheus_bin) as url:
        yield url


def test_load_prometheus_truegpu(prom_url):
    start, end = window(SCENARIO)
    got = load_prometheus(prom_url, start, end, STEP)
    want = reference(SCENARIO)
    assert got.dialect == "truegpu"
    assert_matches(got, want)
    assert _events(got) == _events(want) and len(got.events)
    assert set(map(tuple, got.topology.to_numpy())) == set(map(tuple, want.topology.to_numpy()))
    assert got.missing == {}


def test_load_prometheus_dcgm(prom_url):
    start, end = window(SCENARIO)
    got = load_prometheus(prom_url, start + DAY, end + DAY, STEP, timeout=60.0)
    want = fleet_from_cluster(dcgm_cluster(), start + DAY, end + DAY, STEP)
    assert got.dialect == "dcgm"
    assert_matches(got, want, DCGM_ATOL)
    assert _events(got) == _events(want) and len(got.events)
    assert set(got.missing) == {"nvlink_links_up", "nvlink_links_down"}


def test_load_prometheus_matchers_and_errors(prom_url):
    start, end = window(SCENARIO)
    one = load_prometheus(prom_url, start, end, STEP, matchers={"hostname": "dc1-r1-n02"})
    assert set(one.frame["hostname"]) == {"dc1-r1-n02"} and len(one.frame) == 8 * (end - start) / STEP
    with pytest.raises(ValueError, match=rf"no GPU telemetry at {prom_url}"):
        load_prometheus(prom_url, start - 30 * DAY, end - 30 * DAY, STEP)


def test_load_files_reports_path_in_errors(tmp_path: Path):
    bad = tmp_path / "h.om"
    bad.write_text('# TYPE truegpu_power_watts gauge\ntruegpu_power_watts{hostname="n1"} 5 1700000000\n# EOF\n')
    with pytest.raises(ValueError, match=r"h\.om.*gpu label"):
        load_files(bad)


def test_prometheus_reads_leave_the_label_values_normalize_never_reads_on_the_server(prom_url):
    """Three of the nine clock-event reasons and ECC's aggregate scope feed no signal: the read asks only for the
    series normalize reads (~8 % fewer, at each serve tick), and the fleet is the simulator's all the same
    (test_load_prometheus_truegpu)."""
    from analyzer.data import dialects as D
    from analyzer.data.ingest.prometheus import PrometheusClient, query_prometheus
    from exporter import schema as S

    start, end = window(SCENARIO)
    names = [S.CLOCK_EVENT_ACTIVE.name, S.ECC_ERRORS.name]

    def values(filters: dict | None) -> dict[str, set[str]]:
        with PrometheusClient(prom_url) as client:
            frame, _ = query_prometheus(client, names, start, end, STEP, label_filters=filters,
                                        functions=dict.fromkeys(names, "last_over_time"))
        return {label: set(frame[label].dropna()) for label in ("reason", "scope")}

    every, read = values(None), values(D.LABEL_FILTERS)
    assert {"applications_clocks_setting", "idle", "sw_thermal"} <= every["reason"]
    assert every["scope"] == {"volatile", "aggregate"}
    assert read["reason"] == every["reason"] & {*S.THERMAL_REASONS, *S.POWER_REASONS, "idle"}
    assert read["scope"] == {"volatile"}
