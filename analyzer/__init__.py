"""Central truegpu analyzer: ingest, scores, findings, reports."""
