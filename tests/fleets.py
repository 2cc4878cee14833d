"""Hand-built Fleets for unit tests: exactly the frame.py contract, nothing simulated."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import pandas as pd

from analyzer.data.frame import Fleet, gpu_share
from analyzer.data.signals import ALLOCATION_COLUMNS

START = 1_700_000_000.0
_CATEGORIES = ("hostname", "gpu", "uuid", "gpu_instance", "mig_profile", "model", "site", "rack", *ALLOCATION_COLUMNS)


def make_fleet(
    devices: list[dict], steps: int = 4, step: float = 15.0, start: float = START, model: str = "H100"
) -> Fleet:
    """A Fleet from device dicts: identity/allocation keys plus, per signal, one value or a list
    with one value per step; a signal no device names is absent from the frame (unknown)."""
    rows: list[dict] = []
    for i, d in enumerate(devices):
        for t in range(steps):
            r = {
                "timestamp": start + t * step, "hostname": d.get("hostname", f"n{i // 8}"),
                "gpu": d.get("gpu", str(i % 8)), "uuid": d.get("uuid", f"GPU-{i}"),
                "gpu_instance": d.get("gpu_instance", ""), "mig_profile": d.get("mig_profile", ""),
                "model": d.get("model", model), "site": "dc1", "rack": "r1",
                "gpu_share": gpu_share(d.get("mig_profile", "")),
            }
            for c in ALLOCATION_COLUMNS:
                v = d.get(c)
                r[c] = v[t] if isinstance(v, list) else v
            for k, v in d.items():
                if k not in r and k not in ALLOCATION_COLUMNS:
                    r[k] = float(v[t] if isinstance(v, list) else v)
            rows.append(r)
    frame = pd.DataFrame(rows)
    for c in _CATEGORIES:
        frame[c] = frame[c].astype("category")
    return Fleet(frame=frame, step=step, start=start, end=start + steps * step)


#: Timelines (``timeline``): 2026-01-05T00:00:00Z, one-minute steps.
T0 = 1_767_571_200.0  # 2026-01-05T00:00:00Z
STEP = 60.0


def timeline(
    devices: Sequence[Mapping[str, object]],
    steps: int,
    step: float = STEP,
    *,
    drop: Mapping[int, Sequence[int]] | None = None,
) -> Fleet:
    """A tidy Fleet by hand: each device dict has identity keys and per-step signal lists/scalars.

    Keys: hostname, gpu, gpu_instance, mig_profile, job/namespace/pod (a scalar or a per-step
    list, None = unallocated) and any signal column (scalar or per-step list; None/NaN =
    unknown). ``drop``: device index -> step indexes whose rows are missing entirely.
    """
    parts = []
    for i, d in enumerate(devices):
        host, gpu, inst = str(d.get("hostname", "node-a")), str(d.get("gpu", i)), str(d.get("gpu_instance", ""))
        prof = str(d.get("mig_profile", ""))
        cols: dict[str, object] = {
            "timestamp": T0 + np.arange(steps) * step, "hostname": host, "gpu": gpu,
            "uuid": str(d.get("uuid", f"GPU-{host}-{gpu}")), "gpu_instance": inst, "mig_profile": prof,
            "model": "H100", "site": "dc1", "rack": "dc1-r1", "gpu_share": gpu_share(prof),
        }
        for key, value in d.items():
            if key in ("hostname", "gpu", "gpu_instance", "mig_profile", "uuid"):
                continue
            if isinstance(value, list | tuple | np.ndarray):
                assert len(value) == steps, key
                value = [np.nan if v is None else v for v in value] if key not in ("job", "namespace", "pod") \
                    else list(value)
            cols[key] = value
        part = pd.DataFrame(cols)
        if drop and i in drop:
            part = part.drop(index=list(drop[i])).reset_index(drop=True)
        parts.append(part)
    frame = pd.concat(parts, ignore_index=True)
    for c in ("hostname", "gpu", "uuid", "gpu_instance", "mig_profile", "model", "site", "rack",
              "namespace", "pod", "container", "job"):
        if c not in frame.columns:
            frame[c] = None
        frame[c] = frame[c].astype("category")
    return Fleet(frame=frame, step=step, start=T0, end=T0 + steps * step)
