"""MIG capacity never carved into instances: a device row of its own, so it is unallocated, never missing.

A GPU in MIG mode reports only its instances: with 3 of its 7 compute slices created (one 3g instance)
its rows hold 3/7 of the GPU, and the other 4/7 would be in no GPU-hour at all: not unallocated, not
unknown, simply gone from the scores, the partition and the cost report. ``with_uncarved`` adds, per
such GPU, a device ``gpu_instance`` = UNCARVED holding ``1 -`` the shares of its instances (every
instance seen in the window: its layout at its most carved, so an instance without data in a step is
that instance's unknown hours, never counted twice as uncarved). The row is observed where any of the
GPU's instances is (``DATA_SHARE``: the largest of their observed shares), carries no workload and no
telemetry: it is ``unallocated`` where the GPU is seen and ``unknown`` where it is not.

Every load adds it (normalize, the simulator's fleets) over its whole window; the service's kept window
takes it out before splicing and adds it again over the spliced window (analyzer.data.window), so an
incremental tick gives what a full load does.
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from analyzer.data.coverage import DATA_SHARE, observed_share
from analyzer.data.frame import UNCARVED, device_order, instance_rows

#: Shares closer to 0 than this are a fully carved GPU (7/7 as a float sum).
_EPS = 1e-9


def without_uncarved(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` without UNCARVED rows."""
    if "gpu_instance" not in frame.columns:
        return frame
    drop = instance_rows(frame, UNCARVED)
    return frame.loc[~drop].reset_index(drop=True) if drop.any() else frame


def with_uncarved(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` (sorted by device, then time) with one UNCARVED device per MIG GPU not carved whole, in
    device order (after the GPU's instances); any UNCARVED rows it had are recomputed."""
    frame = without_uncarved(frame)
    if "gpu_instance" not in frame.columns or not len(frame):
        return frame
    inst = instance_rows(frame)
    if not inst.any():
        return frame
    sub = frame.loc[inst]
    gpu = [sub["hostname"].astype(str), sub["gpu"].astype(str)]
    devices = sub.drop_duplicates(["hostname", "gpu", "gpu_instance"])
    free = 1.0 - devices.groupby([devices["hostname"].astype(str), devices["gpu"].astype(str)])["gpu_share"].sum()
    free = free[free > _EPS]
    if free.empty:
        return frame
    seen = pd.Series(observed_share(sub), index=sub.index).groupby([*gpu, sub["timestamp"]]).max()
    seen = seen[seen.index.droplevel(2).isin(free.index)]
    first = sub.groupby(gpu, sort=False).head(1)  # identity of each GPU: its first instance row
    first = first.set_index([first["hostname"].astype(str), first["gpu"].astype(str)])
    keys = seen.index.droplevel(2)
    extra = pd.DataFrame(index=pd.RangeIndex(len(seen)))
    for c in frame.columns:
        if c == "timestamp":
            extra[c] = seen.index.get_level_values(2).to_numpy(np.float64)
        elif c == "gpu_instance":
            extra[c] = UNCARVED
        elif c == "gpu_share":
            extra[c] = free.reindex(keys).to_numpy(np.float64)
        elif c == DATA_SHARE:
            extra[c] = seen.to_numpy(np.float64)
        elif c in ("hostname", "gpu", "uuid", "model", "site", "rack"):
            extra[c] = first[c].astype(object).reindex(keys).to_numpy()
        elif isinstance(frame[c].dtype, pd.CategoricalDtype):
            extra[c] = "" if c == "mig_profile" else None
        else:
            extra[c] = np.nan
    if DATA_SHARE not in frame.columns:  # measured nowhere else: those rows count whole where seen (coverage)
        extra[DATA_SHARE] = seen.to_numpy(np.float64)
    return _joined(frame, extra)


def _joined(frame: pd.DataFrame, extra: pd.DataFrame) -> pd.DataFrame:
    """The two frames' rows in device order, then time; categorical columns stay categorical."""
    cols = {}
    for c in extra.columns:
        if c in frame.columns and isinstance(frame[c].dtype, pd.CategoricalDtype):
            cats = frame[c].cat.categories.union(pd.Index(pd.unique(extra[c].dropna()).astype(str)))
            left = frame[c].cat.set_categories(cats).cat.codes.to_numpy(np.int64)
            right = cats.get_indexer(pd.Index(extra[c].to_numpy(object)))
            cols[c] = pd.Categorical.from_codes(np.concatenate([left, right]), cats)
        else:
            left = frame[c].to_numpy(np.float64) if c in frame.columns else np.full(len(frame), np.nan)
            cols[c] = np.concatenate([left, extra[c].to_numpy(np.float64)])
    out = pd.DataFrame(cols)[[*frame.columns, *(c for c in extra.columns if c not in frame.columns)]]
    dev = pd.MultiIndex.from_arrays([out[c] for c in ("hostname", "gpu", "gpu_instance")])  # by category codes
    codes, uniq = dev.factorize()
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[device_order(*(np.asarray(uniq.get_level_values(i), dtype=object) for i in range(3)))] = np.arange(len(uniq))
    order = np.lexsort((out["timestamp"].to_numpy(), rank[codes]))
    return out.iloc[order].reset_index(drop=True)
