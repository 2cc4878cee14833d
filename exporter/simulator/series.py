"""The shape simulated series travel in between the model, the dialect converters and the writers.

A leaf module (numpy only): ``history`` (the OpenMetrics writer) and ``dcgm_dialect`` (the
dcgm-exporter converter) both speak it, and neither has to import the other to do so.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

#: ``(family, labels, values)``: a family (a contract Metric or a DcgmFamily), one series' labels, and its
#: values aligned with the sample times (NaN: no sample then).
SeriesItem = tuple[Any, Mapping[str, str], np.ndarray]
