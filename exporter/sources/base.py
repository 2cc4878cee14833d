"""The one small interface every exporter source implements.

A source turns whatever it reads (NVML, a dcgm-exporter endpoint, the simulator) into
contract samples. It never raises for one bad GPU: it records a SourceError, omits that
GPU's families and carries on, so one failure never takes the scrape down.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar

from exporter.schema import Metric

Labels = dict[str, str]


@dataclass(frozen=True)
class SourceError:
    """One thing that went wrong during a collection.

    ``kind`` is a short bounded token (gpu_lost, not_supported, timeout, source_failed,
    bad_value, ...) because it becomes a label of truegpu_exporter_errors_total.
    """

    kind: str
    message: str
    gpu: str | None = None


@dataclass
class Reading:
    """Everything one source saw in one collection."""

    samples: dict[Metric, list[tuple[Labels, float]]] = field(default_factory=dict)
    errors: list[SourceError] = field(default_factory=list)
    #: False when the source could not read everything it should have (a lost GPU, the
    #: endpoint down); a NotSupported family on a GPU that never had it is not a failure.
    up: bool = True
    #: (input field, reason) -> series read but not published (every input series is accounted for).
    ignored: dict[tuple[str, str], int] = field(default_factory=dict)

    def ignore(self, field_name: str, reason: str, n: int = 1) -> None:
        key = (field_name, reason)
        self.ignored[key] = self.ignored.get(key, 0) + n

    def add(self, metric: Metric, labels: Labels, value: float) -> None:
        self.samples.setdefault(metric, []).append((labels, value))

    def fail(self, kind: str, message: str, gpu: str | None = None) -> None:
        self.errors.append(SourceError(kind, message, gpu))
        self.up = False


class Source(ABC):
    """A provider of contract samples; ``name`` becomes the ``source`` label."""

    name: ClassVar[str]

    @abstractmethod
    def collect(self) -> Reading:
        """Read current values. Must not raise for per-GPU problems."""

    def close(self) -> None:  # noqa: B027 - most sources hold nothing to release
        """Release handles (NVML shutdown, HTTP sessions)."""
