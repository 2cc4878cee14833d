"""Every registered detector behaves like one (scikit-learn's ``check_estimator`` in spirit), and
a new detector in one file reaches the API, evaluate, the rules and the docs without other edits."""

from __future__ import annotations

import json
import math
import sys
import types
from dataclasses import dataclass, fields
from typing import Any

import pandas as pd
import pytest

from analyzer import detectors as D
from analyzer.data.frame import Fleet
from analyzer.findings import Finding
from tests.fleets import make_fleet

SEVERITIES = ("critical", "warning", "info")
#: Scenario fleets every detector is run on (at 60 s): faults of every kind, in both dialects, and
#: dcgm-exporter's default counters (no power limit, no throttle reasons: unknown must read as unknown).
SCENARIOS = (("multi-fault", "truegpu", "all"), ("mixed-fleet", "dcgm", "all"), ("mig-training", "truegpu", "all"),
             ("straggler-slowdowns", "dcgm", "default"))


def check_detector(cls: type) -> None:
    """The conformance checks of one detector class; raises AssertionError naming what is wrong."""
    name = cls.__name__
    assert isinstance(cls.kind, str) and cls.kind, f"{name}: kind"
    assert isinstance(cls.paging, D.Paging) or (cls.paging is None and cls.not_paged), f"{name}: paging"
    if cls.paging is not None:
        assert cls.paging.severity in (None, *SEVERITIES) and cls.paging.hold_s >= 0, f"{name}: paging"
        assert cls.paging.says.format(score="s"), f"{name}: paging.says"
    own = cls.__doc__ or ""
    own = "" if own.startswith(f"{name}(") else own  # dataclass' generated signature is no documentation
    module_doc = (sys.modules[cls.__module__].__doc__ or "") + own
    for f in fields(cls):  # every setting has a documented default of a plain type
        assert isinstance(f.default, bool | int | float), f"{name}.{f.name}: default {f.default!r}"
        assert f.name in module_doc, f"{name}.{f.name} is not documented in its module or class docstring"
    det = cls()
    for fleet in (_empty(), _no_signals()):
        assert det.detect(fleet) == [], f"{name}: findings without data"
    for scenario, dialect, counters in SCENARIOS:
        fleet = _scenario(scenario, dialect, counters)
        first, again = det.detect(fleet), cls().detect(_scenario(scenario, dialect, counters))
        _check_findings(cls.kind, first, f"{name} on {scenario}/{dialect}")
        for short in _short(scenario, dialect, counters):
            _check_findings(cls.kind, det.detect(short), f"{name} on {len(short.frame.timestamp.unique())} samples")
        assert [f.to_json() for f in first] == [f.to_json() for f in again], f"{name}: not deterministic"


def _check_findings(kind: str, findings: list[Finding], where: str) -> None:
    for f in findings:
        assert f.kind == kind and f.severity in SEVERITIES, where
        assert math.isfinite(f.score) and 0.0 <= f.score <= 1.0, (where, f.score)
        assert f.end is None or f.start <= f.end, where
        assert f.summary and "nan" not in f.summary.lower().split(), (where, f.summary)
        json.dumps(f.to_json(), allow_nan=False)  # finite JSON: no NaN/inf anywhere in the evidence


def _empty() -> Fleet:
    """A window with no data at all: the frame's columns, no rows (Prometheus returned nothing)."""
    fleet = _no_signals()
    return Fleet(frame=fleet.frame.iloc[:0], step=fleet.step, start=fleet.start, end=fleet.end)


def _no_signals() -> Fleet:
    """Devices and allocations but not one signal: every optional input missing."""
    return make_fleet([{"namespace": "ns", "job": "train", "pod": f"train-{i}"} for i in range(4)], steps=10, step=60)


def _short(scenario: str, dialect: str, counters: str) -> list[Fleet]:
    """A scenario's faults in windows of a few samples at a 5 s step, from its start and its middle: far
    shorter than any detector's run, window or episode (a short file, serve's first minutes). A detector
    may find nothing there; it must not fail."""
    fleet = _scenario(scenario, dialect, counters)
    f = fleet.frame
    ts = f["timestamp"].drop_duplicates().sort_values()
    out = []
    for keep in (ts.iloc[:3], ts.iloc[len(ts) // 2:len(ts) // 2 + 5]):
        out.append(Fleet(frame=f[f["timestamp"].isin(keep)], step=5.0, start=float(keep.min()),
                         end=float(keep.max()) + 5.0))
    return out


def _scenario(name: str, dialect: str, counters: str = "all") -> Fleet:
    from analyzer.analysis.evaluate import named_scenario_fleet

    return named_scenario_fleet(name, dialect, 60.0, dcgm_counters=counters)[1]


@pytest.mark.parametrize("kind", D.kinds())
def test_every_registered_detector_conforms(kind: str) -> None:
    check_detector(D.load_detectors()[kind])


def test_the_conformance_checks_can_fail() -> None:
    @dataclass
    class NoDocs:
        kind = "nodocs"
        paging = None
        not_paged = "test"
        undocumented_threshold: float = 1.0

        def detect(self, fleet: Fleet) -> list[Finding]:
            return []

    with pytest.raises(AssertionError, match="undocumented_threshold is not documented"):
        check_detector(NoDocs)

    @dataclass
    class Nan:
        """``level`` 1."""

        kind = "nan"
        paging = None
        not_paged = "test"
        level: float = 1.0

        def detect(self, fleet: Fleet) -> list[Finding]:
            if fleet.frame.empty:
                return []
            return [Finding(kind="nan", severity="warning", summary="x", start=fleet.start, end=None,
                            score=float("nan"))]

    with pytest.raises(AssertionError):
        check_detector(Nan)


@pytest.fixture
def toy_detector(tmp_path: Any) -> Any:
    """A detector written as a module of its own, registered the way every detector is; removed after."""
    source = '''
"""Toy: flags every GPU with ``sm_active`` below ``floor``."""
from dataclasses import dataclass
from analyzer.detectors import Paging, register
from analyzer.findings import Finding


@register
@dataclass
class Toy:
    kind = "toy"
    paging = Paging(alert="GpuToy", team="sre", says="is a toy ({score}).")
    floor: float = 0.0

    def detect(self, fleet):
        return []
'''
    mod = types.ModuleType("analyzer.detectors.toy")
    sys.modules[mod.__name__] = mod
    exec(compile(source, str(tmp_path / "toy.py"), "exec"), mod.__dict__)
    yield mod.Toy
    D.DETECTORS.pop("toy", None)
    sys.modules.pop(mod.__name__, None)


def test_a_new_detector_reaches_every_consumer_without_other_edits(toy_detector: type, tmp_path: Any) -> None:
    from alerts.rules import Timing, analyzer_file
    from analyzer.detectors.__main__ import render
    from analyzer.pipeline import detect, detector_settings
    from analyzer.service import AnalyzerService
    from analyzer.service.app import create_app
    from analyzer.site import parse_site

    assert "toy" in D.kinds()
    check_detector(toy_detector)  # the conformance suite runs on it
    app = create_app(AnalyzerService(lambda s, e: _empty()))
    enum = next(p for p in app.openapi()["paths"]["/api/findings"]["get"]["parameters"] if p["name"] == "kind")
    assert "toy" in json.dumps(enum["schema"])  # the API's kind enum
    alerts = [a for a in analyzer_file(Timing()).alerts() if a.alert == "GpuToy"]
    assert [a.severity for a in alerts] == ["critical", "warning", "info"] and 'kind="toy"' in alerts[0].expr
    assert "| `toy` | GpuToy | sre |" in render() and "`floor` = 0.0" in render()  # docs/findings.md
    settings = detector_settings(parse_site({"detectors": {"toy": {"floor": 0.5}}}))
    assert settings["toy"] == {"floor": 0.5}  # the site config's detectors section
    assert detect(_no_signals(), site=parse_site({"detectors": {"toy": {"floor": 0.5}}})) == []  # analyze, serve
    from analyzer.analysis.evaluate import evaluate_scenarios

    judged = evaluate_scenarios(["healthy-fleet"], dialect="truegpu", step=60.0, kinds=D.kinds())[0]["kinds"]
    assert judged["toy"]["findings"] == 0 and judged["toy"]["fp"] == 0  # evaluate judges it with the others


def test_docs_findings_is_generated_from_the_registry() -> None:
    from analyzer.detectors.__main__ import render
    from tests.conftest import ROOT

    assert (ROOT / "docs" / "findings.md").read_text() == render(), \
        "regenerate: python -m analyzer.detectors > docs/findings.md"


def test_scenario_fleets_are_what_the_checks_use() -> None:
    fleet = _scenario("multi-fault", "truegpu")
    assert isinstance(fleet.frame, pd.DataFrame) and len(fleet.frame) and fleet.gpu_count() > 8
