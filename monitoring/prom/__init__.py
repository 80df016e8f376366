"""The Prometheus client of the host tools (client.py, standard library only) and the PromQL helpers
the report and the live dashboard tests share (promql.py). Nothing is imported here."""
