"""Hand-built Fleets for unit tests: exactly the frame.py contract, nothing simulated."""

from __future__ import annotations

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
