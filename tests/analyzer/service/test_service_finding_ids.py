"""The service's consecutive runs over a sliding window keep the id of an ongoing problem."""

from __future__ import annotations

from analyzer.findings import GPU_FAULT, IDLE_ALLOCATED, IDLE_MASKING, entity_key, finding_id
from analyzer.service import AnalyzerService
from tests.analyzer.service.kit import NOW, WINDOW, Source


def test_consecutive_runs_keep_the_ids_of_ongoing_problems(cluster) -> None:
    clock = [NOW - 3600.0]
    service = AnalyzerService(Source(cluster), interval=60, window=WINDOW, step=60, clock=lambda: clock[0])
    runs = []
    for _ in range(4):
        assert service.run_once()
        runs.append(service.snapshot().analysis)
        clock[0] += 60.0
    first = {entity_key(f): f for f in runs[0].findings}
    kept = 0
    for analysis in runs[1:]:
        assert len({f.id for f in analysis.findings}) == len(analysis.findings)  # distinct problems, distinct ids
        for f in analysis.findings:
            before = first.get(entity_key(f))
            if before is not None and before.end is None and before.start <= runs[0].start:  # older than the window
                assert f.id == before.id, f"{f.kind} on {f.hostname}/{f.gpu} changed id"
                if f.kind in (IDLE_ALLOCATED, IDLE_MASKING, GPU_FAULT):  # their start is kept (EarlierRuns)
                    assert f.start == before.start and finding_id(f) == f.id, f"{f.kind} on {f.hostname}/{f.gpu}"
                    kept += 1
    assert kept, "no problem started before the window: the test would not see its start kept"
