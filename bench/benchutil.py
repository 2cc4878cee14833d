"""What the benchmark scripts share: memory readings from /proc (Linux)."""

from __future__ import annotations


def status_mb(field: str) -> float:
    """A /proc/self/status memory field (VmRSS, VmHWM) in MB; NaN where there is none."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) / 1024.0
    except OSError:
        pass
    return float("nan")


def reset_peak() -> None:
    """Reset VmHWM where Linux allows it, so a later peak is the measured step's, not the set-up's."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass
