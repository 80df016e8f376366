"""The Prometheus rules: recording rules and their PromQL, the alerts, the promtool tests, and the
generator that writes them under monitoring/config/prometheus/ (`python -m monitoring.rules`).
Nothing is imported here: `make status` imports recording.py with a bare python3."""
