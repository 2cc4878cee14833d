"""The fleet's reference hosts (analyzer.data.reference): a bounded, stable sample per GPU model, whole
racks; the fleet-wide references of the detectors come from it (what a shard reads: test_shard_prometheus)."""

from __future__ import annotations

import numpy as np
import pytest

from analyzer.data import reference
from analyzer.data.reference import ranked_units, reference_hosts, unit_rank
from analyzer.data.simulated import fleet_from_cluster
from analyzer.detectors import clock_max
from exporter.simulator import Cluster, load_scenario
from tests.conftest import ROOT
from tests.fleets import timeline


def _sample(hosts: list[str], models: list[str], racks: list[str], limit: int) -> list[str]:
    return sorted(reference_hosts(np.array(hosts, dtype=object), np.array(models, dtype=object),
                                  np.array(racks, dtype=object), limit))


def test_whole_racks_per_model_in_sha256_order_until_the_limit():
    hosts = [f"r{r}-n{n}" for r in range(6) for n in range(4)]
    racks = [h.split("-")[0] for h in hosts]
    order = sorted({f"rack:{r}" for r in racks}, key=unit_rank)
    got = _sample(hosts, ["H100"] * len(hosts), racks, 6)  # racks of 4: the first two racks (4 < 6, then 8)
    assert got == sorted(h for h in hosts if f"rack:{h.split('-')[0]}" in order[:2])
    assert _sample(hosts, ["H100"] * len(hosts), racks, 100) == sorted(hosts)  # a small fleet: all of it
    # without racks, hosts are the units
    got = _sample(hosts, ["H100"] * len(hosts), [""] * len(hosts), 5)
    assert got == sorted(sorted(hosts, key=lambda h: unit_rank(f"host:{h}"))[:5])
    # every model has its own sample: a small model is never crowded out by a large one
    models = ["H100"] * 20 + ["A100"] * 4
    got = _sample(hosts, models, [""] * len(hosts), 3)
    assert sum(h in hosts[20:] for h in got) == 3 and sum(h in hosts[:20] for h in got) == 3


def test_a_host_joining_or_leaving_outside_the_sample_changes_nothing():
    hosts = [f"h{i:03d}" for i in range(200)]
    base = _sample(hosts, ["m"] * 200, [""] * 200, 16)
    ranked = sorted(hosts, key=lambda h: unit_rank(f"host:{h}"))
    outside = ranked[-1]
    assert _sample([h for h in hosts if h != outside], ["m"] * 199, [""] * 199, 16) == base
    new = next(f"x{i}" for i in range(1000) if unit_rank(f"host:x{i}") > unit_rank(f"host:{ranked[15]}"))
    assert _sample([*hosts, new], ["m"] * 201, [""] * 201, 16) == base
    # a unit's rank is the same in every process (sha256) and exact as a float
    assert unit_rank("host:h001") == unit_rank("host:h001") < 2**52
    t = ranked_units(np.array(["a", "a"], dtype=object), np.array(["m", "n"], dtype=object),
                     np.array(["", ""], dtype=object))
    assert list(t["model"]) == ["m", "n"] and t["rank"].nunique() == 1


def test_fleet_reference_rows_and_what_reads_them(monkeypatch):
    fleet = fleet_from_cluster(Cluster(load_scenario(str(ROOT / "fixtures" / "shard" / "fleet.yaml"))), step=60.0)
    assert fleet.reference_rows().all()  # 25 hosts: the whole fleet
    monkeypatch.setattr(reference, "REFERENCE_HOSTS", 6)
    small = fleet_from_cluster(Cluster(load_scenario(str(ROOT / "fixtures" / "shard" / "fleet.yaml"))), step=60.0)
    rows = small.reference_rows()
    hosts = small.frame["hostname"].astype(str).to_numpy()
    assert set(hosts[rows]) == small.reference_hosts() and len(small.reference_hosts()) == 10  # two racks of 5
    racks = set(small.frame["rack"].astype(str).to_numpy()[rows])
    assert len(racks) == 2 and set(hosts[np.isin(small.frame["rack"].astype(str), list(racks))]) == set(hosts[rows])


@pytest.mark.parametrize("limit", [1, 100])
def test_the_model_clock_where_none_is_reported_comes_from_the_reference(monkeypatch, limit):
    """A GPU on a host outside the sample boosting higher than any reference GPU does not move the model's
    clock (with every host in the sample it does)."""
    monkeypatch.setattr(reference, "REFERENCE_HOSTS", limit)
    devs = [{"hostname": h, "gpu": 0, "rack": "", "sm_clock": clk, "sm_clock_max": None}
            for h, clk in (("a", 1980.0), ("b", 1980.0), ("c", 2100.0))]
    fl = timeline(devs, 3)
    first = min("abc", key=lambda h: unit_rank(f"host:{h}"))
    got = set(clock_max(fl))
    if limit == 1:
        assert got == {1980.0 if first != "c" else 2100.0}
    else:
        assert got == {2100.0}


def test_a_shard_reads_further_where_discovered_hosts_had_no_data(monkeypatch):
    """A rack that discovery lists but that has no data in the window (coming up) and ranks first: the sample of
    what was read must reach past it, or the shard's reference would differ from the whole fleet's."""
    from analyzer.data.shard import Discovery, context_nodes, reference_read

    fleet = fleet_from_cluster(Cluster(load_scenario(str(ROOT / "fixtures" / "shard" / "fleet.yaml"))), step=60.0)
    monkeypatch.setattr(reference, "REFERENCE_HOSTS", 6)
    rank = reference.unit_rank
    monkeypatch.setattr(reference, "unit_rank", lambda key: 0 if key == "rack:ghost" else rank(key))
    hosts, models, racks = fleet.placements()
    ghosts = [f"ghost-n{i}" for i in range(5)]
    nodes = [*map(str, hosts), *ghosts]
    found = Discovery(("hostname",), {n: (n,) for n in nodes}, {n: n for n in nodes},
                      {**{str(h): (str(m),) for h, m in zip(hosts, models, strict=True)},
                       **{g: (str(models[0]),) for g in ghosts}},
                      {**{str(h): str(r) for h, r in zip(hosts, racks, strict=True)}, **{g: "ghost" for g in ghosts}})
    picked, _ = context_nodes(found, [], 0)
    assert set(ghosts) <= picked and len(picked) == 10  # the ghost rack and one real one
    assert not reference_read(fleet, found, 0)  # the fleet's sample takes a second real rack, not read
    picked, _ = context_nodes(found, [], 8)
    assert len(picked) == 15 and reference_read(fleet, found, 8)
