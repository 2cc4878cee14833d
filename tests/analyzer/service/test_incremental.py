"""`serve`'s incremental window (analyzer.data.window) gives, at every tick, what a full reload gives.

A real Prometheus holds 95 minutes of a 16-GPU fleet with faults and the telemetry mess of real
fleets; the service replays ticks on a virtual clock with its loader behind a WindowLoader, and after
every good tick its Fleet is compared with a full load of the same window (frame, XID events,
topology, missing signals, dialect) and its findings with that full load's (see below). The window
slides over: a GPU fallen off the bus at 12 min (its series end: the window start passes it), a node's
4-minute scrape gap at 15 min while its training job runs on (allocations held over the gap, then the
window start inside the gap), a node that first reports at 40 min (GPUs appearing mid-window), a
scrape gap at 52 min of a node with a GPU that had an XID at 35 min (its counter's first sample after
the gap must not read as a new XID), an exporter restart (counters from 0), pods recreated under new
names, a thermal straggler, repeated samples and an HA pair. Prometheus is unreachable for three ticks
(the next tick reads the missed steps only) and then for longer than the window (a full load).

The service runs whole at ten of the ticks (``FINDINGS_AT``) and after each outage, its findings compared;
at the others its loader's read runs alone: the same fleet gives the same findings. Documented
normalisations: allocation categories are compared as the values rows use (a full load also lists values
seen only after its last row), XID events in sorted order, finding ids left out (the service carries ids
across runs). Not compared: notes (their counts are per load).
"""

from __future__ import annotations

import pytest

from analyzer.data.frame import UNCARVED, Fleet
from analyzer.data.ingest import LabelSets
from analyzer.data.load import load_prometheus
from analyzer.data.window import OVERLAP, WindowLoader
from analyzer.detectors import Memory
from analyzer.pipeline import analyze
from analyzer.service import AnalyzerService
from exporter.simulator import Cluster
from exporter.simulator.history import Mess, write_history
from exporter.simulator.scenario import parse_scenario
from tests.analyzer.service.kit import assert_same_fleet, finding_texts
from tests.conftest import free_port
from tests.realprom import backfilled_prometheus

STEP = 60.0
WINDOW = 1800.0
MINUTE = 60.0
SCENARIO = {
    "name": "incremental-serve", "seed": 31, "duration": "95m",
    "topology": {"sites": ["dc1"], "racks_per_site": 2, "nodes_per_rack": 2, "gpus_per_node": 4, "model": "H100"},
    "workloads": [
        {"name": "train-m", "kind": "training", "namespace": "llm", "nodes": 2},
        {"name": "embed-m", "kind": "memory_bound", "namespace": "batch", "gpus": 4},
        {"name": "nb-dave", "kind": "idle_allocated", "namespace": "notebooks", "gpus": 2, "start": "10m"},
        # two 3g.40gb slices of one GPU: its uncarved seventh is recomputed over the spliced window
        {"name": "mig-nb", "kind": "idle_allocated", "namespace": "notebooks", "instances": 2,
         "mig_profile": "3g.40gb"},
        # one GPU time-sliced by two pods: its holders' per-step use is spliced like the rows
        {"name": "chat-s", "kind": "inference", "namespace": "serving", "gpus": 1,
         "sharers": {"chat-a": 0.7, "chat-b": 0.3}},
    ],
    "faults": [
        {"kind": "thermal_straggler", "target": {"job": "train-m", "rank": 6}, "start": "20m", "end": "70m",
         "slowdown": 0.2},
        {"kind": "xid", "code": 94, "target": {"job": "embed-m", "rank": 1}, "start": "35m"},
        {"kind": "xid", "code": 79, "target": {"job": "embed-m", "rank": 3}, "start": "12m"},
    ],
    "mess": {
        "node_gaps": [{"host": "dc1-r1-n01", "start": "15m", "duration": "4m"},
                      {"host": "dc1-r2-n01", "start": "52m", "duration": "4m"},
                      {"host": "dc1-r2-n02", "start": "0m", "duration": "40m"}],
        "exporter_restarts": [{"host": "dc1-r1-n02", "at": "55m"}],
        "repeat_every": 7, "replicas": ["prom-a", "prom-b"],
    },
}  # fmt: skip
#: Ticks the service runs whole and whose findings are compared with a full load's (and every tick after an
#: outage); the others run its loader's read alone. Analysis is a function of the fleet, compared at every
#: tick, so these check that a spliced fleet's rows reach the detectors as a loaded one's do: the XID at 35,
#: the node first seen at 40, a pod restart at 42, the gap at 52.
FINDINGS_AT = {30, 35, 40, 42, 45, 50, 53, 57, 60, 95}
#: Pods recreated under new names (the simulator's pod names for this seed).
POD_RESTARTS = (("embed-m-pdts6", 42 * MINUTE), ("nb-dave-sk2g5", 50 * MINUTE))


@pytest.fixture(scope="module", params=["truegpu", "dcgm"])
def prom(request, tmp_path_factory, promtool, prometheus_bin):
    scenario = parse_scenario(SCENARIO)
    cluster = Cluster(scenario)
    tmp = tmp_path_factory.mktemp(f"incremental-{request.param}")
    path = tmp / "history.om"
    write_history(path, cluster, cluster.start, cluster.start + cluster.duration, 15.0, dialect=request.param,
                  mess=Mess(**scenario.mess, pod_restarts=POD_RESTARTS))
    with backfilled_prometheus(tmp, [path], promtool, prometheus_bin) as url:
        yield url, cluster.start


def test_incremental_window_equals_a_full_reload_at_every_tick(prom) -> None:
    url, t0 = prom
    target = [url]
    calls: list[tuple[float, float]] = []
    labelsets = LabelSets()  # as serve's ticks read: the series' label sets kept from one load to the next

    def load(start: float, end: float) -> Fleet:
        calls.append((start, end))
        return load_prometheus(target[0], start, end, STEP, timeout=10, retries=0, labelsets=labelsets)

    window = WindowLoader(load)
    now = [0.0]
    service = AnalyzerService(window, url=url, interval=STEP, window=WINDOW, step=STEP, clock=lambda: now[0])
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there: Prometheus is down
    down = {36, 37, 38, 63}  # minutes whose tick fails; after 63 the clock jumps past a whole window
    ends = [*range(30, 64), 95]
    good = 0
    memory = Memory()  # the full reloads' analyses carry what the service's runs carry, run for run
    uncarved: set[int] = set()  # rows of the MIG GPU's uncarved seventh per tick
    shared = 0  # ticks whose window holds the time-sliced GPU's holders (dcgm-exporter has no such series)
    for minute in ends:
        now[0] = t0 + minute * MINUTE + 7.0
        target[0] = dead if minute in down else url
        analyzed = minute in down or minute in FINDINGS_AT or minute - 1 in down
        if analyzed:  # the service's run: its loader's read, then the analysis
            assert service.run_once() is (minute not in down), service.health_json()["last_error"]
            if minute in down:
                continue
            analysis = service.snapshot().analysis
            assert analysis is not None and analysis.end == t0 + minute * MINUTE
            fleet = analysis.fleet
        else:  # the same read alone (what the service's run does first)
            fleet = window(*service.window_at(now[0]))
        good += 1
        full = load_prometheus(url, fleet.start, fleet.end, STEP)
        assert fleet.end == t0 + minute * MINUTE
        assert_same_fleet(fleet, full)
        shared += bool(len(fleet.shares))
        uncarved.add(int((fleet.frame["gpu_instance"] == UNCARVED).sum()))
        if analyzed:
            assert finding_texts(analysis.findings) == finding_texts(analyze(full, memory=memory).findings), \
                f"tick at {minute} min"
    # The first tick and the one after the outage longer than the window loaded the whole window; every
    # other tick read its new step and the OVERLAP before it, or from a GPU's last row before a gap.
    assert WINDOW / STEP in uncarved  # the MIG GPU (on the node seen from minute 40) over a whole window
    assert shared >= (10 if analysis.fleet.dialect == "truegpu" else 0)
    assert window.full_loads == 2 and window.incremental_loads == good - 2
    assert window.last_reason == "the window no longer overlaps the kept one"
    whole = [c for c in calls if c[1] - c[0] >= WINDOW]
    assert len(whole) == 2, whole
    assert sum(1 for s, e in calls if e - s == (OVERLAP + 1) * STEP) >= good - 8


def test_a_device_scraped_less_often_than_the_step_loads_the_window_in_full() -> None:
    """A few new steps hold too few of a slow device's samples to know its spacing: every tick loads in full
    (and gives what a full load gives); the same fleet with every device at the step splices."""
    import pandas as pd

    from analyzer.data.normalize import normalize
    from exporter import schema as S
    from tests.analyzer.data.kit import long_frame

    t0 = 1_767_000_000.0

    def long(every: int) -> pd.DataFrame:  # 2 h at 60 s; GPU 0 every ``every`` minutes
        series = []
        for gpu, k in (("0", every), ("1", 1)):
            labels, ts = {"hostname": "n1", "gpu": gpu, "uuid": f"GPU-{gpu}"}, [t0 + 60.0 * i for i in range(0, 120, k)]
            series += [(S.MEMORY_USED.name, labels, ts, [1e9] * len(ts)),
                       (S.POWER.name, labels, ts, [100.0 + (t - t0) / 60.0 for t in ts])]
        return long_frame(*series)

    for every, incremental in ((4, False), (1, True)):
        data = long(every)

        def loader(start: float, end: float, data: pd.DataFrame = data) -> Fleet:
            return normalize(data[(data["timestamp"] >= start) & (data["timestamp"] < end)], step=STEP,
                             start=start, end=end)

        window = WindowLoader(loader)
        for tick in range(40, 45):
            start, end = t0 + (tick - 30) * MINUTE, t0 + tick * MINUTE
            assert window(start, end).frame["power"].equals(loader(start, end).frame["power"]), (every, tick)
        assert (window.incremental_loads > 0) == incremental, every
        if not incremental:
            assert window.last_reason == "a device is scraped less often than the step: its held rows need the " \
                                         "whole window"
