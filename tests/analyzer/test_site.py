"""The site config's shared sections: selectors and thresholds read by rules and detectors alike."""

from __future__ import annotations

import json

import pytest
import yaml

from alerts.rules import rule_files
from analyzer.detectors import make_detector
from analyzer.pipeline import detector_settings
from analyzer.site import THRESHOLDS, Thresholds, parse_site
from tests.conftest import ROOT


def _alert(files, name: str) -> dict:
    return next(a for f in files for a in f.alerts() if a.alert == name)


def test_thresholds_set_the_rules_and_the_detector_alike():
    site = parse_site({"thresholds": {"gpu_temp_limit_celsius": 80, "memory_temp_limit_celsius": 92,
                                      "thermal_limit_for_seconds": 180, "thermal_warn_for_seconds": 600}})
    thermal = make_detector("thermal", detector_settings(site)["thermal"])
    assert (thermal.at_limit_c, thermal.mem_limit_c, thermal.min_throttle_s, thermal.min_hot_s) == (80, 92, 180, 600)
    files = rule_files(thresholds=site.thresholds)
    throttling, near = _alert(files, "GpuThermalThrottling"), _alert(files, "GpuNearThermalLimit")
    assert (throttling.for_, near.for_) == ("3m", "10m")
    assert '{sensor="gpu"}) >= 80' in throttling.expr and '{sensor="memory"}) >= 92' in throttling.expr
    # the built-in detector is the built-in rules' (no site config: the same numbers)
    default = make_detector("thermal", detector_settings(None)["thermal"])
    assert default == make_detector("thermal")
    assert (default.at_limit_c, default.min_throttle_s) == (THRESHOLDS.gpu_temp_limit_celsius, 60)
    assert make_detector("straggler", detector_settings(site)["straggler"]).thermal_celsius == 80
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


def test_detectors_section_sets_any_documented_setting_and_names_the_file():
    site = parse_site({"detectors": {"straggler": {"min_duration_s": 300}, "idle_masking": {"sm_max": 0.25}}},
                      "site.yaml")
    settings = detector_settings(site, {"idle_masking": {"util_min": 0.8}})
    assert make_detector("straggler", settings["straggler"]).min_duration_s == 300
    masking = make_detector("idle_masking", settings["idle_masking"])
    assert (masking.sm_max, masking.util_min) == (0.25, 0.8)
    for bad, message in (
        ({"nosuch": {"x": 1}}, r"site.yaml: detectors: no detector for kind 'nosuch'"),
        ({"straggler": {"min_duration": 1}}, r"site.yaml: detectors: straggler: unknown setting\(s\) min_duration"),
        ({"thermal": {"min_hot_s": 60}}, r"site.yaml: detectors.thermal: min_hot_s come\(s\) from thresholds"),
        ({"topology": {"min_pods": 2.5}}, r"site.yaml: detectors: topology.min_pods: expected int"),
        ({"gpu_fault": {"application_xids": 1}}, r"gpu_fault.application_xids: expected bool"),
    ):
        with pytest.raises(ValueError, match=message):
            detector_settings(parse_site({"detectors": bad}, "site.yaml"))
    with pytest.raises(ValueError, match=r"site.yaml: detectors.straggler.z_min: expected a finite number"):
        parse_site({"detectors": {"straggler": {"z_min": "3"}}}, "site.yaml")


def test_evaluate_reads_the_site_config(tmp_path, capsys):
    """``truegpu evaluate --site``: a detector setting in the site file changes what evaluate finds."""
    from truegpu.cli import main

    site = tmp_path / "site.yaml"
    site.write_text("detectors:\n  idle_masking: {util_min: 1.01}\n")  # nothing can be that busy: no finding
    args = ["evaluate", "--scenario", "idle-waste", "--dialect", "truegpu", "--kinds", "idle_masking", "--json"]
    assert main(args) == 0
    found = json.loads(capsys.readouterr().out)["results"][0]["kinds"]["idle_masking"]["findings"]
    assert main([*args, "--site", str(site)]) == 0
    assert found > 0 and json.loads(capsys.readouterr().out)["results"][0]["kinds"]["idle_masking"]["findings"] == 0
