"""Stable finding ids: derived from kind, entity and start; carried over while a window slides."""

from __future__ import annotations

from analyzer.findings import (
    GPU_FAULT,
    HOLD_SEVERITY_S,
    THERMAL,
    Finding,
    IdMemory,
    assign_ids,
    carry_ids,
    finding_id,
    rfc3339,
)

T = 1_767_571_200.0


def f(start: float, end: float | None = None, gpu: int | None = 3, kind: str = THERMAL, **kw) -> Finding:
    return Finding(kind=kind, severity="warning", summary="s", start=T + start, end=None if end is None else T + end,
                   score=0.5, hostname="n1", gpu=gpu, **kw)


def test_the_id_comes_from_kind_entity_and_start_not_from_severity_score_or_pod() -> None:
    a = f(0)
    assert finding_id(a) == finding_id(f(0))
    same = f(0, end=600, pod="p-2", uuid="GPU-x")
    same.severity, same.score = "critical", 0.9
    assert finding_id(same) == finding_id(a)  # confirmed, extended, closed, pod restarted: same problem
    others = [f(60), f(0, gpu=4), f(0, kind=GPU_FAULT), f(0, gpu_instance="1"), f(0, job="j"), f(0, namespace="ns"),
              f(0, rack="r1")]
    assert len({finding_id(x) for x in [a, *others]}) == len(others) + 1
    assert finding_id(a).startswith("thermal-") and a.to_json()["id"] == finding_id(a)


def test_assign_ids_never_gives_two_findings_one_id() -> None:
    twins = [f(0), f(0), f(120)]
    assign_ids(twins)
    assert len({x.id for x in twins}) == 3 and twins[1].id == twins[0].id + "-2"
    kept = f(0)
    kept.id = "thermal-given"
    assign_ids([kept])
    assert kept.id == "thermal-given"


def test_an_ongoing_problem_keeps_its_id_as_the_window_slides_and_as_it_closes() -> None:
    first = [f(0)]  # window [0, 1800): the problem is at the window start, open
    assign_ids(first)
    slid = [f(60)]  # the next run's window starts 60 s later: so does the (clipped) start
    assign_ids(slid)
    assert slid[0].id != first[0].id  # derived afresh, the id would move...
    carry_ids(first, T + 1800, slid, T + 1860)
    assert slid[0].id == first[0].id  # ...carried over, it does not
    closed = [f(120, end=1500)]
    carry_ids(slid, T + 1860, closed, T + 1920)
    assert closed[0].id == first[0].id


def test_distinct_problems_never_share_an_id() -> None:
    previous = [f(0, end=600)]
    assign_ids(previous)
    later = [f(0, end=600), f(900)]  # the same closed problem, and a new one after a gap on the same GPU
    carry_ids(previous, T + 1800, later, T + 1860)
    assert later[0].id == previous[0].id and later[1].id != previous[0].id
    split = [f(0, end=300), f(300, end=600)]  # one previous problem now seen as two: one keeps the id
    carry_ids(previous, T + 1800, split, T + 1860)
    assert len({x.id for x in split}) == 2 and previous[0].id in {x.id for x in split}
    elsewhere = [f(0, gpu=4)]
    carry_ids(previous, T + 1800, elsewhere, T + 1860)
    assert elsewhere[0].id != previous[0].id


def test_a_problem_missing_from_a_run_gets_its_id_back_within_the_window() -> None:
    """An intermittent straggler between spells, a suspected one withdrawn for a minute: back in a later run,
    it is the same problem for alerts and API clients. Forgotten once last seen a window ago."""
    memory = IdMemory(keep_s=1800)
    shown = [f(600)]
    assign_ids(shown)
    memory.carry(shown, T + 900)  # open at this run's end: remembered as [600, 900]
    memory.carry([], T + 960)  # missing from one run
    back = [f(660)]  # its start moved (a spell left the window): still touches what was shown
    assign_ids(back)
    memory.carry(back, T + 1020)
    assert back[0].id == shown[0].id
    other = [f(660, gpu=4)]
    assign_ids(other)
    memory.carry(other, T + 1080)
    assert other[0].id != shown[0].id  # another GPU is another problem
    memory.carry([], T + 1020 + 1800 + 60)  # last seen more than a window ago: forgotten
    late = [f(660)]
    assign_ids(late)
    memory.carry(late, T + 1020 + 1800 + 120)
    assert late[0].id != shown[0].id


def test_a_problem_that_recurs_within_the_window_keeps_its_id() -> None:
    """An intermittent straggler's next spells: the earlier episode closed 14 minutes before the new one
    starts, and the memory still holds it (shown by a run within the window, whatever its span's end),
    so the recurrence is the same problem. Beyond the window it is a new one."""
    memory = IdMemory(keep_s=1800)
    first = [f(660, end=1260)]  # [11, 21] min, closed
    assign_ids(first)
    memory.carry(first, T + 2460)  # last shown at 41 min, its span long closed
    memory.carry([], T + 2520)
    again = [f(2100)]  # from 35 min: 14 min after the first one ended
    assign_ids(again)
    memory.carry(again, T + 2700)
    assert again[0].id == first[0].id
    memory.carry([], T + 2700 + 1860)  # nothing shown for longer than the window
    later = [f(4700)]
    assign_ids(later)
    memory.carry(later, T + 4800)
    assert later[0].id != first[0].id


def test_the_same_fleet_analyzed_twice_gets_the_same_ids() -> None:
    from analyzer.analysis.evaluate import named_scenario_fleet
    from analyzer.pipeline import analyze

    _, fleet = named_scenario_fleet("xid-faults", "truegpu", 60.0)
    once, again = analyze(fleet, partition=False).findings, analyze(fleet, partition=False).findings
    assert once and all(x.id for x in once)
    assert [x.id for x in once] == [x.id for x in again]
    assert len({x.id for x in once}) == len(once)


def test_a_finding_keeps_the_most_urgent_severity_its_detector_gave_it_lately() -> None:
    """An intermittent straggler confirmed in its spells, suspected between them: its warning does not resolve
    and re-page each spell. The detector's word is in the evidence; after HOLD_SEVERITY_S the finding says what
    the detector says, and a more urgent severity always shows at once."""
    memory = IdMemory(keep_s=1800)

    def run(at: float, severity: str) -> Finding:
        x = f(600)
        x.severity = severity
        assign_ids([x])
        memory.carry([x], T + at)
        return x

    first = run(900, "warning")
    between = run(960, "info")
    assert between.id == first.id and between.severity == "warning"
    assert between.evidence["severity_held"] == {"severity": "warning", "given_until": rfc3339(T + 900),
                                                 "detector_says": "info"}
    assert run(900 + HOLD_SEVERITY_S, "info").severity == "warning"  # 15 min after it said warning: still held
    assert run(960 + HOLD_SEVERITY_S, "info").severity == "info"  # then what the detector says
    assert run(1900, "critical").severity == "critical"
    lapsed = run(1960, "info")
    assert lapsed.severity == "critical" and lapsed.evidence["severity_held"]["detector_says"] == "info"
    assert run(1960, "warning").severity == "critical"
    assert run(1900 + HOLD_SEVERITY_S + 1, "warning").severity == "warning"  # critical lapsed, warning stands
    assert run(2000 + HOLD_SEVERITY_S, "info").severity == "warning"
