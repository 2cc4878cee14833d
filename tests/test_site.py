"""The site config's shared sections: selectors and thresholds read by rules and detectors alike."""

from __future__ import annotations

import pytest
import yaml

from alerts.rules import rule_files
from analyzer.detectors import make_detector
from analyzer.site import THRESHOLDS, Thresholds, detector_config, parse_site
from tests.conftest import ROOT


def _alert(files, name: str) -> dict:
    return next(a for f in files for a in f.alerts() if a.alert == name)


def test_thresholds_set_the_rules_and_the_detector_alike():
    site = parse_site({"thresholds": {"gpu_temp_limit_celsius": 80, "memory_temp_limit_celsius": 92,
                                      "thermal_limit_for_seconds": 180, "thermal_warn_for_seconds": 600}})
    thermal = make_detector("thermal", detector_config(site)["thermal"])
    assert (thermal.at_limit_c, thermal.mem_limit_c, thermal.min_throttle_s, thermal.min_hot_s) == (80, 92, 180, 600)
    files = rule_files(thresholds=site.thresholds)
    throttling, near = _alert(files, "GpuThermalThrottling"), _alert(files, "GpuNearThermalLimit")
    assert (throttling.for_, near.for_) == ("3m", "10m")
    assert '{sensor="gpu"}) >= 80' in throttling.expr and '{sensor="memory"}) >= 92' in throttling.expr
    # the built-in detector is the built-in rules' (no site config: the same numbers)
    default = make_detector("thermal", detector_config(None)["thermal"])
    assert default == make_detector("thermal")
    assert (default.at_limit_c, default.min_throttle_s) == (THRESHOLDS.gpu_temp_limit_celsius, 60)
    assert _alert(rule_files(), "GpuThermalThrottling").for_ == "1m"


def test_every_threshold_reaches_a_rule_or_a_detector():
    """No dead key: changing any threshold changes the generated rules or the detectors' settings."""
    base_rules = [yaml.safe_dump(f.to_dict(_links())) for f in rule_files()]
    for name, value in vars(THRESHOLDS).items():
        changed = Thresholds(**{name: value + 0.05 if value < 1 else value + 7})
        rules = [yaml.safe_dump(f.to_dict(_links())) for f in rule_files(thresholds=changed)]
        assert rules != base_rules or changed.detector_settings() != THRESHOLDS.detector_settings(), name


def _links():
    from alerts.rules import Links

    return Links()


def test_selectors_set_job_names_and_the_cluster_label():
    site = parse_site({"selectors": {"cluster_label": "k8s_cluster", "dcgm_job": "gpu-metrics"}})
    text = "".join(yaml.safe_dump(f.to_dict(_links())) for f in rule_files(selectors=site.selectors))
    assert "by (k8s_cluster, hostname" in text and "by (cluster" not in text and 'job="gpu-metrics"' in text
    assert parse_site({"selectors": {"cluster_label": ""}}).selectors.cluster_label == ""


@pytest.mark.parametrize(("data", "message"), [
    ({"selectors": {"cluster_label": "k8s-cluster"}}, r"selectors.cluster_label: expected a Prometheus label name"),
    ({"selectors": {"exporter_job": ""}}, r"selectors.exporter_job: expected a non-empty string"),
    ({"selectors": {"cluster": "x"}}, r"selectors: unknown key\(s\) \['cluster'\]"),
    ({"thresholds": {"gpu_temp_limit_celsius": "hot"}}, r"thresholds.gpu_temp_limit_celsius: expected a non-negative"),
    ({"thresholds": {"thermal_limit_for_seconds": -1}}, r"thresholds.thermal_limit_for_seconds: expected"),
    ({"thresholds": {"busy_utilization": 20}}, r"thresholds.busy_utilization: a ratio must be a number in 0..1"),
    ({"thresholds": {"gpu_temp_limit_celsius": float("nan")}}, r"thresholds.gpu_temp_limit_celsius"),
    ({"thresholds": []}, r"thresholds: expected a mapping"),
])
def test_site_section_errors_name_the_entry(data, message):
    with pytest.raises(ValueError, match=message):
        parse_site(data, "site.yaml")


def test_the_example_site_config_is_the_built_in_one_plus_its_own_classes_and_routes(tmp_path):
    """deploy/site.example.yaml documents every section with the built-in values: it parses, its
    selectors and thresholds equal the defaults, and the alerts it generates differ from the
    committed ones only in what its alerting section sets (receivers, owner routes)."""
    from alerts import GENERATED, generate
    from analyzer.site import Selectors, load_site

    site = load_site(ROOT / "deploy" / "site.example.yaml")
    assert site.selectors == Selectors() and site.thresholds == THRESHOLDS
    assert [c.name for c in site.workload_classes] == ["training", "inference"]
    assert site.workload_classes[0].match["job"] == ("*train*", "*sft*")  # the site file's `workload`
    assert site.alerting.owners == (("serving|.*-inference", "serving-oncall"),)
    generate(tmp_path, site=site)
    for name in ("truegpu.yaml", "dcgm.yaml", "analyzer.yaml"):
        assert (tmp_path / name).read_text() == (GENERATED / name).read_text(), name
