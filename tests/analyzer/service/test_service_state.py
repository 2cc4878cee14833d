"""serve --state-file: a restarted service goes on where it stopped (analyzer.service.state)."""

from __future__ import annotations

import json
import logging
import math
import shutil

import numpy as np
import pandas as pd
import pytest
from pandas.testing import assert_frame_equal
from prometheus_client import generate_latest

from analyzer import output_schema as O
from analyzer.analysis.evaluate import named_scenario_fleet
from analyzer.detectors import Memory
from analyzer.findings import DEGRADED_GPU, IDLE_ALLOCATED, Finding, IdMemory
from analyzer.service import AnalyzerService
from analyzer.service.metrics import build_registry
from analyzer.service.state import StateFile, decode, encode

WINDOW = 1800.0
CONFIG = {"window": WINDOW, "step": 60.0, "kinds": None, "shard": None, "job_label": None}
T = 1_767_571_200.0


def test_plain_data_round_trips_exactly() -> None:
    frame = pd.DataFrame({"s": [0.1, np.nan, 1e-300], "rise": [T, np.inf, -1.5], "who": ["a", None, "c"]},
                         index=pd.Index(["GPU-1", "GPU-2", "GPU-3"], dtype=object))
    value = {"cusum": {1767571800: frame, 1767572400: frame.iloc[:0]}, "level": frame[["s"]], "n": [1, 2.5, None],
             "nan": math.nan, ("a", 1): "tuple key", "flag": True}
    text = json.dumps(encode(value), allow_nan=False)  # strict JSON: no NaN/Infinity literals
    back = decode(json.loads(text))
    assert sorted(back, key=str) == sorted(value, key=str)
    assert_frame_equal(back["cusum"][1767571800], frame)
    assert back["cusum"][1767572400].empty and list(back["cusum"][1767572400].columns) == ["s", "rise", "who"]
    assert_frame_equal(back["level"], frame[["s"]])
    assert back["n"] == [1, 2.5, None] and math.isnan(back["nan"]) and back[("a", 1)] == "tuple key"
    with pytest.raises(TypeError, match="cannot keep a set"):
        encode({"x": {1, 2}})


def _idle(start: float, severity: str = "warning") -> Finding:
    return Finding(kind=IDLE_ALLOCATED, severity=severity, summary="GPU 3 of n01 allocated and idle", start=start,
                   end=None, score=0.5, hostname="n01", gpu=3, namespace="nb", job="nb-alice",
                   evidence={"idle_minutes": 45.0})


def test_ids_and_held_severities_survive_a_restart(tmp_path) -> None:
    """A problem older than the window: its start is the window's in every run, so only the ids remembered from
    the runs before give it its id; a restarted service without them would name it anew."""
    path = tmp_path / "state.json"
    before = IdMemory(WINDOW)
    first = _idle(T)
    before.carry([first], T + 600)
    before.carry([_idle(T + 60, "info")], T + 660)  # the detector says info: warning is held
    StateFile(path, CONFIG).save(before, Memory({DEGRADED_GPU: {"x": 1}}), T + 660)

    after = IdMemory(WINDOW)
    memory = StateFile(path, CONFIG).load(after)
    assert memory is not None and memory.part(DEGRADED_GPU) == {"x": 1}
    now = _idle(T + 120, "info")  # the next run, after the restart: the window has moved on
    after.carry([now], T + 720)
    assert now.id == first.id
    assert now.severity == "warning" and now.evidence["severity_held"]["detector_says"] == "info"

    fresh = _idle(T + 120, "info")
    IdMemory(WINDOW).carry([fresh], T + 720)
    assert fresh.id != first.id  # what the state file is for


def test_a_restart_keeps_a_degradation_only_carried_evidence_shows(tmp_path) -> None:
    """multi-fault's thermal degradation, found by a minute-by-minute service through the evidence its runs
    carry (tests/analyzer/service/test_service_memory.py): a service restarted from the state the first one
    wrote gives at its first run exactly what the first one gives at that tick (every finding, field for
    field, ids included); restarted without it, it does not find the GPU."""
    cluster, fleet = named_scenario_fleet("multi-fault", "truegpu", 60.0)
    (truth,) = [t for t in cluster.ground_truth() if t["kind"] == DEGRADED_GPU]
    clock = [fleet.start + WINDOW]

    def service(state: StateFile | None) -> AnalyzerService:
        return AnalyzerService(lambda s, e: fleet.between(s, e), interval=60, window=WINDOW, step=60,
                               kinds=[DEGRADED_GPU], clock=lambda: clock[0], state=state)

    def shown(s: AnalyzerService) -> list[dict]:
        return [f.to_json() for f in s.snapshot().analysis.findings]

    def degraded(found: list[dict]) -> bool:
        return any((f["hostname"], f["gpu"]) == (truth["hostname"], int(truth["gpu"])) for f in found)

    running = service(StateFile(tmp_path / "state.json", CONFIG))
    while True:
        assert running.run_once()
        if degraded(shown(running)) and clock[0] >= truth["start"] + 600:
            break
        clock[0] += 60.0
        assert clock[0] < truth["start"] + 2 * WINDOW, "the running service never found the degradation"
    shutil.copy(tmp_path / "state.json", tmp_path / "copy.json")
    clock[0] += 60.0
    assert running.run_once()
    restarted = service(StateFile(tmp_path / "copy.json", CONFIG))
    assert restarted.run_once()
    assert shown(restarted) == shown(running) and degraded(shown(restarted))
    afresh = service(None)
    assert afresh.run_once() and not degraded(shown(afresh))


def _mixed_fleet_service(state: StateFile) -> AnalyzerService:
    """idle_allocated on mixed-fleet (its notebooks' idle GPUs), one window in."""
    _, fleet = named_scenario_fleet("mixed-fleet", "truegpu", 60.0)
    return AnalyzerService(lambda s, e: fleet.between(s, e), interval=60, window=WINDOW, step=60,
                           kinds=[IDLE_ALLOCATED], clock=lambda: fleet.start + 2 * WINDOW, state=state)


def test_a_state_that_does_not_fit_is_logged_and_replaced(tmp_path, caplog) -> None:
    path = tmp_path / "state.json"
    StateFile(path, CONFIG).save(IdMemory(WINDOW), Memory({DEGRADED_GPU: {"x": 1}}), T)
    caplog.set_level(logging.INFO, logger="analyzer.service.state")
    assert StateFile(path, {**CONFIG, "window": 3600.0}).load(IdMemory(3600.0)) is None
    assert "was written under" in caplog.text and "'window': 1800.0" in caplog.text

    path.write_text('{"config": ')  # cut short
    ids = IdMemory(WINDOW)
    assert StateFile(path, CONFIG).load(ids) is None and "is not usable" in caplog.text
    doc = {"config": {"format": 1, **CONFIG}, "seen": [[{"kind": "x"}, 1.0]], "urgent": [], "memory": {"$dict": []}}
    path.write_text(json.dumps(doc))
    assert StateFile(path, CONFIG).load(ids) is None and ids.state() == ([], [])

    # The service starts afresh and writes a good state after its first run.
    service = _mixed_fleet_service(StateFile(path, CONFIG))
    assert service.run_once()
    assert StateFile(path, CONFIG).load(IdMemory(WINDOW)) is not None


def test_a_state_that_cannot_be_written_does_not_stop_the_runs(tmp_path, caplog) -> None:
    state = StateFile(tmp_path / "gone" / "state.json", CONFIG)
    with pytest.raises(ValueError, match="does not exist"):
        state.check_writable()
    service = _mixed_fleet_service(state)
    assert service.run_once() and service.snapshot().analysis.findings
    assert f"cannot write the service state {tmp_path / 'gone' / 'state.json'}" in caplog.text
    kept = service.health_json()["state_file"]
    assert kept["writes"] == {"ok": 0, "error": 1} and "No such file or directory" in kept["last_error"], kept
    text = generate_latest(build_registry(service.snapshot)).decode()
    assert f'{O.ANALYZER_STATE_WRITES.name}{{result="error"}} 1.0' in text
    (tmp_path / "gone").mkdir()  # the folder is back: the next run writes it
    assert service.run_once()
    assert service.health_json()["state_file"] == {"path": str(state.path), "writes": {"ok": 1, "error": 1},
                                                   "last_error": None}


def test_one_state_file_serves_one_service_and_a_killed_one_lets_it_go(tmp_path) -> None:
    """Two services on one file would overwrite each other's state every run: the second is refused, naming
    the holder; the lock goes with its process, killed with SIGKILL too (no stale lock to clean up)."""
    import os
    import signal
    import subprocess
    import sys

    path = tmp_path / "state.json"
    holder = subprocess.Popen(
        [sys.executable, "-c", "import sys, time; from analyzer.service.state import StateFile; "
         f"StateFile({str(path)!r}, {{}}).claim(); print('held', flush=True); time.sleep(120)"],
        stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ValueError, match=rf"in use by another truegpu serve \(pid {holder.pid}, lock "):
            StateFile(path, CONFIG).claim()
        os.kill(holder.pid, signal.SIGKILL)
        holder.wait(30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
    mine = StateFile(path, CONFIG)
    mine.claim()  # the killed holder's lock is gone
    with pytest.raises(ValueError, match=rf"pid {os.getpid()},"):
        StateFile(path, CONFIG).claim()  # one process, two services: refused all the same
    mine.release()
    again = StateFile(path, CONFIG)
    again.claim()
    again.release()


def test_serve_refuses_a_state_file_another_service_holds(tmp_path, capsys) -> None:
    from analyzer.cli import serve as serve_cli
    from truegpu.cli import build_parser

    path = tmp_path / "state.json"
    held = StateFile(path, CONFIG)
    held.claim()
    argv = ["serve", "--prometheus", "http://127.0.0.1:9", "--listen", "127.0.0.1:0", "--state-file", str(path)]
    try:
        assert serve_cli.run(build_parser(argv).parse_args(argv)) == 2
    finally:
        held.release()
    err = capsys.readouterr().err
    assert err.startswith("truegpu serve: error: --state-file ") and "in use by another truegpu serve" in err, err
