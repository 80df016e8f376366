"""Monitoring for the training cluster: Prometheus rules, Grafana dashboards as code, reports."""
