"""What the data tests share: simulated clusters at fixed offsets, their reference fleets straight
from the simulator, and a comparison of two fleets within the dialect's tolerance."""

from __future__ import annotations

import functools
import re
from pathlib import Path

import numpy as np
import pandas as pd

from analyzer.data.frame import Fleet
from analyzer.data.ingest import read_openmetrics
from analyzer.data.normalize import normalize
from analyzer.data.signals import NAMES
from analyzer.data.simulated import fleet_from_cluster
from exporter import schema as S
from exporter.simulator.dcgm_dialect import DcgmOptions
from exporter.simulator.history import write_history
from exporter.simulator.model import Cluster
from exporter.simulator.scenario import load_scenario
from tests.conftest import ROOT

STEP = 60.0
WINDOW = 1800.0
#: Window offsets (s after the scenario start) that contain the interesting faults.
OFFSETS = {"mixed-fleet": 5100.0, "mig-training": 0.0, "xid-faults": 3000.0}
FIXTURES = ROOT / "fixtures" / "dcgm"
MIB = S.MIB
#: dcgm-exporter prints integers for percent, celsius, MHz and MiB: absolute tolerances.
DCGM_ATOL = {
    "gpu_util": 0.0051, "mem_util": 0.0051, "temp": 0.51, "mem_temp": 0.51,
    "sm_clock": 0.51e6, "sm_clock_max": 0.51e6, "mem_clock": 0.51e6,
    "mem_used": 0.51 * MIB, "mem_total": 1.01 * MIB, "nvlink_bps": 1.01, "pcie_bps": 1.01,
}  # fmt: skip
IDENTITY = ("hostname", "gpu", "gpu_instance", "mig_profile", "uuid")
ALLOCATION = ("namespace", "pod", "container", "job")
T0 = 1_700_000_040.0


@functools.cache
def cluster(name: str) -> Cluster:
    return Cluster(load_scenario(name))


def window(name: str) -> tuple[float, float]:
    start = cluster(name).start + OFFSETS[name]
    return start, start + WINDOW


def from_history(tmp_path: Path, name: str, dialect: str = "truegpu", **opts) -> Fleet:
    """Write the scenario's history (one step past the end so the last row has rates), read, normalize."""
    start, end = window(name)
    path = tmp_path / f"{name}-{dialect}.om"
    write_history(path, cluster(name), start, end + STEP, STEP, dialect=dialect, dcgm_options=DcgmOptions(**opts))
    long, report = read_openmetrics(path)
    return normalize(long, start=start, end=end, report=report)


def _strings(col: pd.Series) -> np.ndarray:
    return col.astype(object).where(col.notna(), "<unallocated>").astype(str).to_numpy()


def assert_matches(got: Fleet, want: Fleet, atol: dict[str, float] | None = None, skip_rows=None) -> None:
    """Same devices, timestamps, allocation and (within tolerance) every signal the input carries."""
    a, b = got.frame, want.frame
    assert len(a) == len(b)
    np.testing.assert_array_equal(a["timestamp"].to_numpy(), b["timestamp"].to_numpy())
    for col in (*IDENTITY, *ALLOCATION):
        np.testing.assert_array_equal(_strings(a[col]), _strings(b[col]), err_msg=col)
    np.testing.assert_allclose(a["gpu_share"], b["gpu_share"])
    assert (got.step, got.start, got.end) == (want.step, want.start, want.end)
    compared = 0
    for name in NAMES:
        if name not in a.columns:
            assert name not in b.columns or b[name].isna().all() or name in got.missing, name
            continue
        if name not in b.columns:  # dcgm-exporter's last-XID state: the truegpu reference has events instead
            assert name == "last_xid", name
            _assert_last_xid(got, want)
            continue
        x, y = a[name].to_numpy(), b[name].to_numpy()
        if skip_rows is not None and name in skip_rows:
            x, y = x[~skip_rows[name]], y[~skip_rows[name]]
        np.testing.assert_array_equal(np.isnan(x), np.isnan(y), err_msg=f"{name}: unknown where the simulator knows")
        tol = (atol or {}).get(name, 0.0)
        np.testing.assert_allclose(x, y, rtol=1e-9, atol=tol + 1e-9, equal_nan=True, err_msg=name)
        compared += int((~np.isnan(y)).sum())
    assert compared > 0


def _assert_last_xid(got: Fleet, want: Fleet) -> None:
    """The last-XID gauge shows, on each GPU, the XIDs the reference has events of there, and those it already
    showed at the first sample (an XID before the window, named in a note); each of the latter from the start."""
    f, ev = got.frame, want.events
    shown = f.loc[f["last_xid"] > 0, ["hostname", "gpu", "last_xid"]].drop_duplicates()
    codes = {(str(h), str(g), int(x)) for h, g, x in shown.itertuples(index=False)}
    before = {(h, g, int(x)) for note in got.notes if note.startswith("last XID already non-zero")
              for h, g, x in re.findall(r"(\S+)/(\S+) XID (\d+)", note.split(": ", 1)[1])}
    events = {(str(h), str(g), int(x)) for h, g, x in zip(ev["hostname"], ev["gpu"], ev["xid"], strict=True)}
    assert before <= codes <= events | before, (codes, events, before)
    unknown = f["last_xid"].isna()  # 0 until an XID; unknown only where the GPU reports nothing (lost to XID 79)
    assert not (unknown & f["power"].notna()).any() and (f["last_xid"][~unknown] >= 0).all()


def _events(fleet: Fleet) -> list[tuple]:
    ev = fleet.events
    return sorted(zip(ev["timestamp"], ev["hostname"], ev["gpu"], ev["uuid"], ev["xid"], strict=True))


def reference(name: str) -> Fleet:
    start, end = window(name)
    return fleet_from_cluster(cluster(name), start, end, STEP)


# Hand-written input -----------------------------------------------------------------------------


def long_frame(*series: tuple[str, dict[str, str], list[float], list[float]]) -> pd.DataFrame:
    """(metric, labels, timestamps, values) -> the long frame the ingest readers produce."""
    rows = []
    for metric, labels, ts, vals in series:
        for t, v in zip(ts, vals, strict=True):
            rows.append({"metric": metric, "timestamp": float(t), "value": float(v), **labels})
    frame = pd.DataFrame(rows)
    for col in frame.columns:
        if col not in ("timestamp", "value"):
            frame[col] = frame[col].astype("category")
    return frame
