# Monitoring: Prometheus rules, Grafana dashboards as code, reports. Included by the top Makefile.

PROMTOOL ?= promtool
# Prometheus is published on BIND_ADDR (compose.mk); 0.0.0.0 is reached through loopback.
GRAFANA_URL ?=
GRAFANA_DATASOURCE_UID ?= prometheus
MONITORING_PROM := monitoring/config/prometheus

##@ Monitoring

.PHONY: dashboards
dashboards: $(VENV)/.stamp ## Regenerate monitoring/config/grafana/dashboards/*.json from the Python in monitoring/dashboards
	$(PY) -m monitoring.dashboards

.PHONY: check-dashboards
check-dashboards: $(VENV)/.stamp ## Fail if the committed dashboard JSON differs from what the generator writes
	$(PY) -m monitoring.dashboards --check

.PHONY: rules
rules: $(VENV)/.stamp ## Regenerate the Prometheus rules, alerts and promtool tests (contract/, monitoring/verdicts/)
	$(PY) -m monitoring.rules

.PHONY: check-rules
check-rules: $(VENV)/.stamp ## Generated rules up to date; promtool: check the config and rules, run the rule unit tests
	@command -v "$$PROMTOOL" >/dev/null || { echo "promtool not found: apt-get install prometheus (make engine does)"; exit 1; }
	$(PY) -m monitoring.rules --check
	"$$PROMTOOL" check config $(MONITORING_PROM)/prometheus.yml
	"$$PROMTOOL" check rules $(MONITORING_PROM)/rules/*.yml
	"$$PROMTOOL" test rules $(MONITORING_PROM)/tests/*.yml

AMTOOL ?= amtool
ALERTMANAGER_CONFIG := monitoring/config/alertmanager/alertmanager.yml

.PHONY: check-alerts
check-alerts: ## Validate the Alertmanager config (amtool) and show where a critical alert goes (docs/alerts.md)
	@command -v "$$AMTOOL" >/dev/null || { echo "amtool not found: apt-get install prometheus-alertmanager (make engine does)"; exit 1; }
	"$$AMTOOL" check-config "$$ALERTMANAGER_CONFIG"
	"$$AMTOOL" config routes test --config.file="$$ALERTMANAGER_CONFIG" severity=critical alertname=TrainingStalled

.PHONY: alerts-reload
alerts-reload: ## Make the running Alertmanager re-read monitoring/config/alertmanager/alertmanager.yml (SIGHUP)
	@$(LIFECYCLE) compose kill -s HUP alertmanager

$(call pass_env,check-rules,PROMTOOL)
$(call pass_env,check-alerts,AMTOOL ALERTMANAGER_CONFIG)
$(call pass_env,report,RUN PROMETHEUS_URL PROJECT RUN_DIR)
$(call pass_env,publish-dashboards,GRAFANA_URL GRAFANA_TOKEN GRAFANA_DATASOURCE_UID)

.PHONY: report
report: $(VENV)/.stamp ## Write RUN_DIR/report.png: a picture of the last run (or RUN=<id>) from Prometheus
	$(PY) -m monitoring.report --prometheus "$$PROMETHEUS_URL" --project "$$PROJECT" --run "$$RUN" --out "$$RUN_DIR/report.png"

.PHONY: publish-dashboards
publish-dashboards: $(VENV)/.stamp ## Upload the dashboards to a Grafana: GRAFANA_URL=, GRAFANA_TOKEN=, GRAFANA_DATASOURCE_UID=
	@$(PY) -m monitoring.dashboards.publish --url "$$GRAFANA_URL" --datasource-uid "$$GRAFANA_DATASOURCE_UID"
