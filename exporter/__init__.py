"""Per-node truegpu exporter: sources -> one Prometheus collector -> /metrics.

Runs on every GPU node, so it never imports pandas, scikit-learn or analyzer code.

To add a metric: one ``Metric`` in ``schema.py`` (unit, labels, ``dcgm=`` fields, ``nvml_reads=``
recipe) plus its test; the NVML and dcgm sources, docs/metrics.md (``make docs``) and the golden
exposition (``python -m tests.exporter.golden``) follow from it. A new source is one module in
``sources/`` behind ``sources.base.Source``.
"""

__version__ = "0.1.0"
