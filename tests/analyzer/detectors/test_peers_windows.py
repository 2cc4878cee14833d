"""The peer comparisons' rolling windows against a plain per-row reference."""

from __future__ import annotations

import numpy as np

from analyzer.detectors._peers import trailing_median


def _reference(m: np.ndarray, window: int) -> np.ndarray:
    out = np.full(m.shape, np.nan)
    for s in range(m.shape[0]):
        for t in range(1, m.shape[1]):
            before = m[s, max(0, t - window):t]
            known = before[~np.isnan(before)]
            if len(known) >= max(1, window // 2):
                out[s, t] = np.median(known)
    return out


def test_trailing_median_sees_only_its_own_row_before_each_step() -> None:
    rng = np.random.default_rng(7)
    m = rng.random((6, 40)) * 100.0
    m[rng.random(m.shape) < 0.3] = np.nan
    m[2] = np.nan  # a row with nothing known
    m[3, -20:] = 1e6  # a row ending far above the next one: no window may reach across into it
    for window in (2, 5, 10, 39, 60):
        np.testing.assert_array_equal(trailing_median(m, window), _reference(m, window))
