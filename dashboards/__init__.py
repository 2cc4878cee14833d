"""Grafana dashboards generated from the metric contract."""
