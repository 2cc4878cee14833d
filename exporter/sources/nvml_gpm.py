"""NVML GPM (GPU Performance Monitoring, Hopper and newer): the profiling metrics without DCGM.

GPM metrics are computed from two samples taken at least 100 ms apart. A stream keeps the
second sample of one collection as the first sample of the next, so consecutive intervals
tile the time axis: a collection only has to wait when the previous sample is younger than
the interval, and rates integrated over those intervals add up to exact byte counters.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from types import ModuleType

from exporter import schema
from exporter.schema import Metric

log = logging.getLogger(__name__)

#: Percent metrics: GPM metric constant name -> contract ratio family.
GPM_RATIOS: tuple[tuple[str, Metric], ...] = (
    ("NVML_GPM_METRIC_SM_UTIL", schema.SM_ACTIVE),
    ("NVML_GPM_METRIC_SM_OCCUPANCY", schema.SM_OCCUPANCY),
    ("NVML_GPM_METRIC_ANY_TENSOR_UTIL", schema.TENSOR_ACTIVE),
    ("NVML_GPM_METRIC_DRAM_BW_UTIL", schema.DRAM_ACTIVE),
    ("NVML_GPM_METRIC_GRAPHICS_UTIL", schema.GRAPHICS_ENGINE_ACTIVE),
)
#: Rate metrics (MiB/s): GPM metric constant name -> (family, direction) of the byte counter.
GPM_RATES: tuple[tuple[str, Metric, str], ...] = (
    ("NVML_GPM_METRIC_PCIE_TX_PER_SEC", schema.PCIE_BYTES, "tx"),
    ("NVML_GPM_METRIC_PCIE_RX_PER_SEC", schema.PCIE_BYTES, "rx"),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_TX_PER_SEC", schema.NVLINK_BYTES, "tx"),
    ("NVML_GPM_METRIC_NVLINK_TOTAL_RX_PER_SEC", schema.NVLINK_BYTES, "rx"),
)


class GpmStream:
    """Back-to-back GPM samples of one GPU (``gpu_instance`` None) or one MIG GPU instance.

    ``rates`` False asks only for the ratio metrics (MIG instances: PCIe/NVLink are per GPU).
    """

    def __init__(
        self, nvml: ModuleType, handle: object, gpu_instance: int | None = None, *, rates: bool = True
    ) -> None:
        self._nv = nvml
        self._handle = handle
        self.gpu_instance = gpu_instance
        names = [name for name, _ in GPM_RATIOS] + ([name for name, _, _ in GPM_RATES] if rates else [])
        self._ids = [getattr(nvml, name) for name in names]
        self._names = names
        self._prev: object | None = None
        self._cur: object | None = None
        self.prev_time: float | None = None
        #: Bytes integrated from the rate metrics, keyed by (family, direction).
        self.bytes: dict[tuple[Metric, str], float] = {}

    def _take(self, sample: object) -> None:
        if self.gpu_instance is None:
            self._nv.nvmlGpmSampleGet(self._handle, sample)
        else:
            self._nv.nvmlGpmMigSampleGet(self._handle, self.gpu_instance, sample)

    def prime(self, now: float) -> None:
        """Take the first sample of an interval when there is none yet."""
        if self._prev is None:
            self._prev = self._nv.nvmlGpmSampleAlloc()
            self._cur = self._nv.nvmlGpmSampleAlloc()
        if self.prev_time is None:
            self._take(self._prev)
            self.prev_time = now

    def wait_needed(self, now: float, interval: float) -> float:
        """Seconds to wait before the interval since the last sample is long enough."""
        return 0.0 if self.prev_time is None else max(0.0, interval - (now - self.prev_time))

    def finish(self, now: float) -> tuple[dict[str, float], float]:
        """Close the interval: GPM metric constant name -> value, and the interval length (s).

        The new sample becomes the start of the next interval even when the metrics call
        fails, so one bad read never leaves the stream without a baseline.
        """
        assert self._prev is not None and self._cur is not None and self.prev_time is not None
        self._take(self._cur)
        first, second, dt = self._prev, self._cur, now - self.prev_time
        self._prev, self._cur, self.prev_time = second, first, now
        nv = self._nv
        req = nv.c_nvmlGpmMetricsGet_t()
        req.version = nv.NVML_GPM_METRICS_GET_VERSION
        req.numMetrics = len(self._ids)
        req.sample1, req.sample2 = first, second
        for i, metric_id in enumerate(self._ids):
            req.metrics[i].metricId = metric_id
        nv.nvmlGpmMetricsGet(req)
        values = {
            name: req.metrics[i].value
            for i, name in enumerate(self._names)
            if req.metrics[i].nvmlReturn == nv.NVML_SUCCESS
        }
        for name, family, direction in GPM_RATES:
            if name in values:
                key = (family, direction)
                self.bytes[key] = self.bytes.get(key, 0.0) + values[name] * schema.MIB * dt
        return values, dt

    def free(self) -> None:
        for sample in (self._prev, self._cur):
            if sample is not None:
                try:
                    self._nv.nvmlGpmSampleFree(sample)
                except self._nv.NVMLError as exc:
                    log.debug("nvmlGpmSampleFree: %s", exc)
        self._prev = self._cur = None
        self.prev_time = None


def gpm_supported(nvml: ModuleType, handle: object, on_error: Callable[[Exception], None]) -> bool:
    """Whether GPM works on this GPU; an NVML that lacks the call means no."""
    try:
        return bool(nvml.nvmlGpmQueryDeviceSupport(handle).isSupportedDevice)
    except nvml.NVMLError_GpuIsLost:
        raise
    except nvml.NVMLError as exc:
        on_error(exc)
        return False
