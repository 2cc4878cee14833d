"""The service's runs carry what a detector's evidence needs beyond one window (analyzer.detectors.Memory)."""

from __future__ import annotations

from analyzer.analysis.evaluate import named_scenario_fleet
from analyzer.findings import DEGRADED_GPU
from analyzer.service import AnalyzerService

WINDOW = 1800.0


def _degraded_at(service: AnalyzerService, host: str, gpu: str) -> list[str]:
    analysis = service.snapshot().analysis
    return [f.summary for f in analysis.findings if (f.kind, f.hostname, str(f.gpu)) == (DEGRADED_GPU, host, gpu)]


def test_serve_reports_a_degradation_its_window_alone_cannot_show() -> None:
    """multi-fault's thermal degradation (7-8 C over its node peers, under the 8 C floor; 11 C over its own level):
    a minute-by-minute service started 30 minutes into the history (its first window holds the GPU's 20 minutes
    before the change) finds it within 30 minutes of onset and keeps it every run after; a service started at
    that moment (no runs before, as after a restart) judges its 30 minutes alone and does not."""
    cluster, fleet = named_scenario_fleet("multi-fault", "truegpu", 60.0)
    (truth,) = [t for t in cluster.ground_truth() if t["kind"] == DEGRADED_GPU]
    host, gpu = truth["hostname"], truth["gpu"]
    clock = [fleet.start + WINDOW]

    def service() -> AnalyzerService:
        return AnalyzerService(lambda s, e: fleet.between(s, e), interval=60, window=WINDOW, step=60,
                               kinds=[DEGRADED_GPU], clock=lambda: clock[0])

    running, shown = service(), []
    while clock[0] < truth["start"] + 2 * WINDOW:
        assert running.run_once()
        shown.append(bool(_degraded_at(running, host, gpu)))
        clock[0] += 60.0
    found = shown.index(True)
    clock[0] = fleet.start + WINDOW + 60.0 * found
    assert clock[0] - truth["start"] <= WINDOW and all(shown[found:]), shown
    restarted = service()
    assert restarted.run_once()
    assert _degraded_at(restarted, host, gpu) == []
