"""Per-node truegpu exporter: sources -> one Prometheus collector -> /metrics.

Runs on every GPU node, so it never imports pandas, scikit-learn or analyzer code.
"""

__version__ = "0.1.0"
