"""Telemetry in: read files or Prometheus (``ingest/``, ``load``), normalize either dialect into one
tidy frame (``normalize``, ``dialects``, ``hosts``), whose columns are the signals of ``signals`` and
whose container is ``frame.Fleet``; ``coverage`` says how much of it is there, ``budget`` how much a
query may read, ``simulated`` builds a Fleet from the simulator without files.

Nothing here judges the data: that is ``analyzer.analysis`` and ``analyzer.detectors``.
"""
