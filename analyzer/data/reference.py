"""The hosts whose data makes the fleet-wide references: a bounded, stable sample per GPU model.

Some comparisons reach past a GPU's node and workload to the whole fleet of its model: thermal's
thermal resistance and its nodes-versus-fleet and racks-versus-racks levels, degraded_gpu's robust
fits, medians and outlier gate, topology's healthy-training activity and whether NVLink is in use,
the straggler's per-model maximum SM clock where none is reported. Fitted on every host, they make
a sharded analyzer read every host of the fleet (analyzer.data.shard) and cost it as much as the
whole analysis. A few hundred GPUs of a model make as good a median or a robust fit as ten thousand
(the standard error of a median of 512 chips is ~5 % of their spread), so per model the references
come from the first ``REFERENCE_HOSTS`` hosts in a fixed order: whole racks (where racks are known:
a rack's level is that of all its nodes), taken in sha256 order of the rack's (else the host's) name,
until that many hosts. sha256 gives every process and every shard the same sample, and a host joining
or leaving the fleet changes it only where that host ranks inside it. Below that size (every
evaluation scenario, most clusters) the sample is the whole fleet and nothing changes.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd

#: Hosts per GPU model that feed the fleet-wide references (8-GPU nodes: 512 GPUs).
REFERENCE_HOSTS = 64


def stable_hash(key: str) -> int:
    """64 bits of sha256: the same in every process and on every machine (Python's ``hash()`` is salted per
    process), for what every replica must work out alike (this sample, a shard's owner)."""
    return int.from_bytes(hashlib.sha256(key.encode()).digest()[:8], "big")


def unit_rank(key: str) -> int:
    """The place of a rack or host in the sample's order: ``stable_hash`` (52 bits: exact as a float too)."""
    return stable_hash(key) >> 12


def ranked_units(hosts: np.ndarray, models: np.ndarray, racks: np.ndarray) -> pd.DataFrame:
    """Distinct (model, unit, rank, host) of (host, model, rack) triples; the unit is the rack where known,
    else the host; sorted by model, then rank (ties: the unit key)."""
    t = pd.DataFrame({"host": np.asarray(hosts, dtype=object).astype(str),
                      "model": np.asarray(models, dtype=object).astype(str),
                      "rack": np.asarray(racks, dtype=object).astype(str)}).drop_duplicates()
    t["unit"] = np.where(t["rack"] != "", "rack:" + t["rack"], "host:" + t["host"])
    ranks = {u: unit_rank(u) for u in pd.unique(t["unit"])}
    t["rank"] = t["unit"].map(ranks).astype(np.int64)
    return t.sort_values(["model", "rank", "unit", "host"], kind="stable").reset_index(drop=True)


def sample(units: pd.DataFrame, limit: int | None = None) -> pd.DataFrame:
    """The rows of ``ranked_units`` in the sample: per model, whole units in rank order while fewer than
    ``limit`` (default REFERENCE_HOSTS) hosts of the model are taken."""
    limit = REFERENCE_HOSTS if limit is None else int(limit)
    per_unit = units.groupby(["model", "unit"], sort=False).size().rename("hosts").reset_index()  # in rank order
    before = per_unit.groupby("model", sort=False)["hosts"].cumsum() - per_unit["hosts"]
    return units.merge(per_unit.loc[before < limit, ["model", "unit"]], on=["model", "unit"])


def reference_hosts(hosts: np.ndarray, models: np.ndarray, racks: np.ndarray,
                    limit: int | None = None) -> frozenset[str]:
    """Hosts whose data feeds the fleet-wide references (the module docstring's rule)."""
    return frozenset(sample(ranked_units(hosts, models, racks), limit)["host"])


__all__ = ["REFERENCE_HOSTS", "ranked_units", "reference_hosts", "sample", "stable_hash", "unit_rank"]
