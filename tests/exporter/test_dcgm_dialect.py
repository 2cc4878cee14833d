"""Contract series -> dcgm-exporter dialect: units, rates, bitmask, XID, labels, counters."""

from __future__ import annotations

import re

import numpy as np
import pytest

from exporter import schema
from exporter.schema import DCGM_DEFAULT_FIELDS, MIB
from exporter.simulator.dcgm_dialect import DcgmOptions, to_dcgm

T0 = 1_700_000_000.0
TIMES = T0 + np.arange(5) * 15.0
G0 = {"hostname": "node-a", "gpu": "0", "uuid": "GPU-aaa"}
MIG = {"hostname": "node-a", "gpu": "1", "uuid": "MIG-bbb", "gpu_instance": "7", "mig_profile": "1g.10gb"}
NAN = np.nan


def _field(metric, **labels):
    return next(f.field for f in metric.dcgm if dict(f.labels) == labels)


def _contract():
    """A hand-built two-GPU window in contract order (as Cluster.series yields it)."""
    rows = []
    add = lambda m, lab, v: rows.append((m, lab, np.asarray(v, dtype=float)))  # noqa: E731
    add(schema.GPU_UTILIZATION, G0, [0.0, 0.95, 0.954, 1.0, NAN])
    add(schema.GPU_UTILIZATION, MIG, [0.5, 0.5, 0.5, 0.5, 0.5])
    add(schema.SM_ACTIVE, G0, [0.0, 0.2, 0.25, 0.3, NAN])
    add(schema.TENSOR_ACTIVE, G0, [0.0, 0.1, 0.1, 0.1, NAN])
    add(schema.MEMORY_USED, G0, np.array([0, 1024, 2048, 4096, 4096]) * MIB)
    add(schema.MEMORY_TOTAL, G0, np.full(5, 81559.0 * MIB))
    add(schema.ENERGY, G0, [1000.0, 2000.0, 3000.5, 4000.0, 5000.0])
    add(schema.TEMPERATURE, {**G0, "sensor": "gpu"}, [40.2, 41.0, 42.0, 43.0, 44.0])
    add(schema.TEMPERATURE, {**G0, "sensor": "memory"}, [50.0, 51.0, 52.0, 53.0, 54.0])
    add(schema.SM_CLOCK, G0, np.array([1980, 1980, 1500, 1755, 1980]) * 1e6)
    for reason in schema.CLOCK_EVENT_REASONS.values():
        v = np.zeros(5)
        if reason == "sw_power_cap":
            v[[2, 3]] = 1
        if reason == "hw_thermal":
            v[3] = 1
        if reason == "idle":
            v[0] = 1
        add(schema.CLOCK_EVENT_ACTIVE, {**G0, "reason": reason}, v)
    add(schema.NVLINK_BYTES, {**G0, "direction": "tx"}, np.array([0, 15, 45, 45, 105]) * MIB)
    add(schema.NVLINK_BYTES, {**G0, "direction": "rx"}, np.array([0, 30, 60, 60, 60]) * MIB)
    add(schema.PCIE_BYTES, {**G0, "direction": "tx"}, [0.0, 1500.0, 3000.0, 100.0, 1600.0])  # reset at 3
    add(schema.PCIE_BYTES, {**G0, "direction": "rx"}, [0.0, 0.0, 0.0, 0.0, 0.0])
    add(schema.XID_ERRORS, {**G0, "xid": "79"}, [0, 0, 1, 1, 1])
    add(schema.XID_ERRORS, {**G0, "xid": "13"}, [1, 1, 1, 2, 2])
    add(schema.ECC_ERRORS, {**G0, "type": "correctable", "scope": "volatile"}, [0, 0, 0, 3, 3])
    info = {"model": "NVIDIA H100 80GB HBM3", "driver_version": "550.54.15", "numa_node": "0"}
    add(schema.GPU_INFO, {**G0, **info, "pci_bus_id": "00000000:18:00.0"}, np.ones(5))
    add(schema.GPU_INFO, {**MIG, **info, "pci_bus_id": "00000000:2A:00.0"}, np.ones(5))
    alloc = {"namespace": "ml", "pod": "train-0", "container": "main", "job": "train"}
    add(schema.GPU_ALLOCATION_INFO, {**G0, **alloc}, [NAN, 1, 1, 1, NAN])
    add(schema.NODE_INFO, {"hostname": "node-a", "site": "s", "rack": "r"}, np.ones(5))
    return rows


def _convert(zones: bool = False, **opts):
    """{name: [(labels, values)]} of the dcgm output (``zones``: with kube-state-metrics' node zones)."""
    out: dict[str, list[tuple[dict, np.ndarray]]] = {}
    order = []
    for family, labels, values in to_dcgm(_contract(), TIMES, DcgmOptions(node_zones=zones, **opts)):
        if not order or order[-1] != family.name:
            assert family.name not in order, "families must be contiguous"
            order.append(family.name)
        out.setdefault(family.name, []).append((labels, values))
    return out


def _merged(rows, **match):
    """Values of one GPU over the window, merged across its allocation segments."""
    sel = [v for lab, v in rows if all(lab.get(k) == x for k, x in match.items())]
    assert sel, f"no series with {match}"
    return np.nansum(sel, axis=0) + np.where(np.isnan(sel).all(axis=0), np.nan, 0)


def test_unit_conversions_percent_mhz_mib_mj():
    out = _convert(counters="all")
    util = _merged(out[_field(schema.GPU_UTILIZATION)], gpu="0")
    np.testing.assert_array_equal(util, [0, 95, 95, 100, NAN])  # integer percent, NaN stays absent
    np.testing.assert_array_equal(_merged(out[_field(schema.SM_CLOCK)], gpu="0"), [1980, 1980, 1500, 1755, 1980])
    np.testing.assert_array_equal(_merged(out[_field(schema.MEMORY_USED)], gpu="0"), [0, 1024, 2048, 4096, 4096])
    np.testing.assert_array_equal(
        _merged(out["DCGM_FI_DEV_FB_FREE"], gpu="0"), 81559 - np.array([0, 1024, 2048, 4096, 4096])
    )
    np.testing.assert_array_equal(_merged(out[_field(schema.MEMORY_TOTAL)], gpu="0"), np.full(5, 81559))
    np.testing.assert_array_equal(_merged(out[_field(schema.ENERGY)], gpu="0"), [1e6, 2e6, 3000500, 4e6, 5e6])
    np.testing.assert_array_equal(_merged(out[_field(schema.TEMPERATURE, sensor="gpu")], gpu="0"), [40, 41, 42, 43, 44])
    np.testing.assert_allclose(_merged(out[_field(schema.SM_ACTIVE)], gpu="0")[:4], [0, 0.2, 0.25, 0.3])


def test_rates_from_counters():
    out = _convert(counters="all")
    tx = _merged(out[_field(schema.PCIE_BYTES, direction="tx")], gpu="0")
    np.testing.assert_array_equal(tx, [NAN, 100, 100, NAN, 100])  # bytes/s; unknown at start and after a reset
    total = _merged(out[_field(schema.NVLINK_BYTES, direction="total")], gpu="0")
    np.testing.assert_array_equal(total, [NAN, 3, 4, 0, 4])  # (tx + rx) MiB/s
    nv_tx = _merged(out[_field(schema.NVLINK_BYTES, direction="tx")], gpu="0")
    np.testing.assert_allclose(nv_tx, np.array([NAN, 1, 2, 0, 4]) * MIB)


def test_clock_event_bitmask_matches_clock_event_reasons():
    bits = {reason: bit for bit, reason in schema.CLOCK_EVENT_REASONS.items()}
    out = _convert(counters="all")
    for field in (f.field for f in schema.CLOCK_EVENT_ACTIVE.dcgm):
        mask = _merged(out[field], gpu="0")
        assert mask.tolist() == [
            bits["idle"],
            0,
            bits["sw_power_cap"],
            bits["sw_power_cap"] | bits["hw_thermal"],
            0,
        ]
    assert bits["sw_power_cap"] == 0x4 and bits["hw_thermal"] == 0x40


def test_xid_last_value_and_zero_without_errors():
    out = _convert()
    xid = out[_field(schema.XID_ERRORS)]
    # 13 already counted before the window, 79 at t2, 13 again at t3
    np.testing.assert_array_equal(_merged(xid, gpu="0"), [13, 13, 79, 13, 13])
    np.testing.assert_array_equal(_merged(xid, gpu="1"), np.zeros(5))


def test_default_counters_are_dcgm_exporters_defaults():
    out = _convert()
    assert _field(schema.SM_ACTIVE) not in out
    assert _field(schema.SM_OCCUPANCY) not in DCGM_DEFAULT_FIELDS
    assert _field(schema.ECC_ERRORS, type="correctable", scope="volatile") not in out
    assert not any(f.field in out for f in schema.CLOCK_EVENT_ACTIVE.dcgm)
    assert _field(schema.MEMORY_TOTAL) not in out  # FB_TOTAL is not a default field, DCGM_FB_FREE is
    for f in (schema.GPU_UTILIZATION, schema.TENSOR_ACTIVE, schema.ENERGY, schema.XID_ERRORS, schema.MEMORY_USED):
        assert _field(f) in out
    assert _field(schema.NVLINK_BYTES, direction="total") in out
    assert _field(schema.NVLINK_BYTES, direction="tx") not in out
    assert set(out) <= DCGM_DEFAULT_FIELDS
    everything = _convert(counters="all")
    assert _field(schema.SM_ACTIVE) in everything and _field(schema.ECC_ERRORS, type="correctable", scope="volatile")


def test_labels_current_dialect():
    out = _convert()
    labels, _ = out[_field(schema.SM_CLOCK)][0]
    assert labels == {
        "gpu": "0",
        "UUID": "GPU-aaa",
        "pci_bus_id": "00000000:18:00.0",
        "device": "nvidia0",
        "modelName": "NVIDIA H100 80GB HBM3",
        "Hostname": "node-a",
        "DCGM_FI_DRIVER_VERSION": "550.54.15",
    }
    newer = _convert(hostname_label="hostname")
    labels, _ = newer[_field(schema.SM_CLOCK)][0]
    assert labels["hostname"] == "node-a" and "Hostname" not in labels


def test_mig_labels():
    out = _convert()
    ((labels, values),) = [r for r in out[_field(schema.GPU_UTILIZATION)] if r[0]["gpu"] == "1"]
    assert labels["GPU_I_ID"] == "7" and labels["GPU_I_PROFILE"] == "1g.10gb"
    assert labels["UUID"] == "MIG-bbb" and labels["device"] == "nvidia1"
    np.testing.assert_array_equal(values, np.full(5, 50))
    assert all("GPU_I_ID" not in lab for lab, _ in out[_field(schema.GPU_UTILIZATION)] if lab["gpu"] == "0")


def test_pod_labels_only_while_allocated():
    out = _convert()
    rows = [r for r in out[_field(schema.GPU_UTILIZATION)] if r[0]["gpu"] == "0"]
    assert len(rows) == 2
    (free_l, free_v), (pod_l, pod_v) = sorted(rows, key=lambda r: "pod" in r[0])
    assert "pod" not in free_l and "namespace" not in free_l
    assert (pod_l["namespace"], pod_l["pod"], pod_l["container"]) == ("ml", "train-0", "main")
    assert "job" not in pod_l
    assert (~np.isnan(free_v)).tolist() == [True, False, False, False, False]  # t4 is NaN in the input
    assert (~np.isnan(pod_v)).tolist() == [False, True, True, True, False]


def test_node_info_site_becomes_kube_state_metrics_node_zone():
    zones = _convert(zones=True)[schema.KUBE_NODE_LABELS]
    nodes = [lab for lab, _ in zones]
    assert nodes and all(set(lab) == {schema.KUBE_NODE_LABELS_NODE, schema.KUBE_NODE_ZONE_LABELS[0]} for lab in nodes)
    assert schema.KUBE_NODE_LABELS not in _convert()


def test_legacy_1x_names_and_labels():
    out = _convert(legacy=True)
    assert all(name == name.lower() and name.startswith("dcgm_fi_") for name in out)
    rows = out[_field(schema.GPU_UTILIZATION).lower()]
    pod_l = next(lab for lab, _ in rows if "pod_name" in lab)
    assert (pod_l["pod_namespace"], pod_l["pod_name"], pod_l["container_name"]) == ("ml", "train-0", "main")
    assert pod_l["uuid"] == "GPU-aaa" and "UUID" not in pod_l and "pod" not in pod_l


def test_declared_counters_are_untyped_in_openmetrics():
    families = {f.name: f for f, _, _ in to_dcgm(_contract(), TIMES, DcgmOptions(counters="all"))}
    energy = families[_field(schema.ENERGY)]
    assert energy.declared == "counter" and energy.type == "unknown"
    assert families[_field(schema.NVLINK_BYTES, direction="total")].declared == "counter"
    assert families[_field(schema.PCIE_BYTES, direction="tx")].declared == "gauge"
    assert families[_field(schema.GPU_UTILIZATION)].type == "gauge"


@pytest.mark.parametrize("legacy", [False, True])
def test_no_truegpu_only_families(legacy):
    names = {f.name for f, _, _ in to_dcgm(_contract(), TIMES, DcgmOptions(counters="all", legacy=legacy))}
    assert not any("truegpu" in n or "info" in n.lower() for n in names)


# End to end on simulated scenarios ---------------------------------------------------------


def _simulate(name, step=60.0, **opts):
    from exporter.simulator.history import sample_times
    from exporter.simulator.model import Cluster
    from exporter.simulator.scenario import load_scenario

    cluster = Cluster(load_scenario(name))
    times = sample_times(cluster.start, cluster.start + cluster.duration, step)
    contract = list(cluster.series(times))
    return cluster, times, contract, list(to_dcgm(contract, times, DcgmOptions(**opts)))


def test_xid_faults_scenario_shows_each_code_after_its_start():
    cluster, times, _, out = _simulate("xid-faults")
    xid: dict[tuple[str, str], list[np.ndarray]] = {}
    for f, lab, v in out:
        if f.name == _field(schema.XID_ERRORS):
            xid.setdefault((lab["Hostname"], lab["gpu"]), []).append(v)  # one series per pod that held it
    checked = 0
    for rec in cluster.ground_truth():
        m = re.match(r"XID (\d+)", rec.get("cause", ""))
        if not m:
            continue
        parts = xid[rec["hostname"], rec["gpu"]]
        values = np.nansum(parts, axis=0) + np.where(np.isnan(parts).all(axis=0), np.nan, 0)
        before, after = values[times < rec["start"]], values[times >= rec["start"]]
        assert np.all(before[~np.isnan(before)] == 0)
        seen = after[~np.isnan(after)]
        assert seen.size and np.all(seen == int(m.group(1))), (rec, np.unique(seen))
        if m.group(1) == "79":  # fallen off the bus: the XID, then no telemetry at all
            assert seen.size <= 2
        checked += 1
    assert checked >= 5


def test_mig_scenario_labels_and_pods_match_allocation():
    cluster, _, contract, out = _simulate("mig-training", step=300.0, counters="all")
    util = [(lab, v) for f, lab, v in out if f.name == _field(schema.SM_ACTIVE)]
    mig = [(lab, v) for lab, v in util if "GPU_I_ID" in lab]
    assert mig and {lab["GPU_I_PROFILE"] for lab, _ in mig} == set(cluster.gpus.mig_profile) - {""}
    # every allocated contract sample shows up with its pod, and no unallocated one does
    alloc = {
        (lab["hostname"], lab["gpu"], lab.get("gpu_instance", ""), lab["pod"]): v > 0.5
        for m, lab, v in contract
        if m is schema.GPU_ALLOCATION_INFO
    }
    with_pod = {}
    for lab, v in util:
        if "pod" in lab:
            key = (lab["Hostname"], lab["gpu"], lab.get("GPU_I_ID", ""), lab["pod"])
            with_pod[key] = ~np.isnan(v)
    assert with_pod and set(with_pod) <= set(alloc)
    for key, present in with_pod.items():
        assert not np.any(present & ~alloc[key])
