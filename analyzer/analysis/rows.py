"""What one row of the tidy frame says on its own: held by a workload, a MIG instance, idle.

The calibration constants every score and classification shares live here, below both
:mod:`analyzer.analysis.scores` and :mod:`analyzer.analysis.bottleneck`, so neither imports the other.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from analyzer.data.signals import ALLOCATION_COLUMNS

#: Calibrated SM activity per unit of kernel-resident time on busy GPUs (0.60 / 0.95, AcmeTrace).
FALLBACK_SM_PER_UTIL = 0.63
#: Kernel-resident fraction below which an allocated GPU counts as idle (util ~0: nothing launched).
IDLE_UTIL = 0.05
HIGH, LOW = "high", "low"
CONFIDENCE = pd.CategoricalDtype([HIGH, LOW])


def _flag_by_category(series: pd.Series, test: Any) -> np.ndarray:
    """``test(value)`` per row, evaluated once per category (2.4 M rows, a handful of values)."""
    if isinstance(series.dtype, pd.CategoricalDtype):
        per_cat = np.array([bool(test(c)) for c in series.cat.categories] + [False])
        return per_cat[series.cat.codes.to_numpy()]  # code -1 (NaN) -> the trailing False
    return np.array([False if pd.isna(v) else bool(test(v)) for v in series], dtype=bool)


def mig_rows(frame: pd.DataFrame) -> np.ndarray:
    """True on MIG instance rows (non-empty gpu_instance)."""
    if "gpu_instance" not in frame.columns:
        return np.zeros(len(frame), bool)
    return _flag_by_category(frame["gpu_instance"], lambda v: str(v) != "")


def allocated_rows(frame: pd.DataFrame) -> np.ndarray:
    """True where any allocation label (namespace/pod/container/job) is known: the GPU is held."""
    out = np.zeros(len(frame), bool)
    for c in ALLOCATION_COLUMNS:
        if c in frame.columns:
            s = frame[c]
            out |= (s.cat.codes.to_numpy() >= 0) if isinstance(s.dtype, pd.CategoricalDtype) else s.notna().to_numpy()
    return out
