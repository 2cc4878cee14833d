"""Central truegpu analyzer: telemetry in (``data/``), what it means (``analysis/``, ``detectors/``),
one ``pipeline`` for every command and the service (``service/``), costs (``finops/``), reports
(``report/``) and commands (``cli/``); ``site.py`` is the one site config, ``findings.py`` and
``output_schema.py`` the contracts of what comes out.

To add a detector: one file in ``detectors/`` (a ``@register``ed dataclass with ``kind``, documented
settings, ``paging`` and ``detect``) plus its test; the API, rules, dashboards, evaluate, the site
config and docs/findings.md read the registry. A new score or signal belongs in ``analysis/`` or
``data/signals.py``, read through ``pipeline``.
"""
