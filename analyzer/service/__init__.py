"""``truegpu serve``: the analysis loop, its /metrics, and the HTTP API over its latest results.

Layout (imports go down this list, never up)::

    fmt.py          leaf: label values, JSON numbers, one-line errors
    loop.py         AnalyzerService: re-analyzes the window every interval (analyzer.pipeline); no FastAPI
    metrics.py      the /metrics collector over the loop's snapshot
    settings.py     ApiSettings: tokens, prices, rollup store
    errors.py       NoResults (503), CostError (400)
    cost_source.py  cost reports over the latest results or the rollup store (analyzer.finops.rollups)
    models.py       the API's response models
    deps.py         typed dependencies (ServiceDep, SettingsDep, CostsDep, AuthDep), auth, answers
    overview.py     the / page
    routers/        one router per resource: findings, scores, costs, pages, ops
    app.py          create_app: state, error handlers, the routers

A new endpoint is one function in the router of its resource (or one new router module added to
``app.create_app``) plus its test.
"""

from analyzer.service.loop import Analysis, AnalyzerService, Health, JobUtilization, Snapshot, prometheus_loader

__all__ = ["Analysis", "AnalyzerService", "Health", "JobUtilization", "Snapshot", "prometheus_loader"]
