"""Prometheus recording/alerting rules and Alertmanager routing generated from the contract."""
