# `make diagnose`. Included by the top Makefile.
# PROMETHEUS_URL comes from monitoring/monitoring.mk, RUN_DIR and PROJECT from compose/compose.mk, PY from the top Makefile.

$(call pass_env,diagnose runs compare,PROMETHEUS_URL PROJECT RUN_DIR)
$(call pass_env,diagnose compare,RUN)
$(call pass_env,compare,WITH COMPARE_SKIP)

##@ Diagnose

.PHONY: diagnose
diagnose: $(VENV)/.stamp ## Verdict per cluster and task of the last run (RUN=<id>): input-bound, straggler, ...; JSON=1
	@$(PY) -m monitoring.diagnose --prometheus "$$PROMETHEUS_URL" --project "$$PROJECT" --run "$$RUN" \
	  --bench "$$RUN_DIR/bench-comm.json" --tune "$$RUN_DIR/tune.json" --compare "$$RUN_DIR/compare.json" \
	  $(if $(filter 1,$(JSON)),--json) --terminal-exit-zero

COMPARE_SKIP ?=

.PHONY: runs
runs: ## List the project's runs in Prometheus (id, steps, tasks, settings), for make compare; JSON=1
	@"$$PYTHON" -m monitoring.runs --prometheus "$$PROMETHEUS_URL" --project "$$PROJECT" $(if $(filter 1,$(JSON)),--json)

.PHONY: compare
compare: ## The last run (RUN=<id>) against the one before (WITH=<id>): speed, step parts, verdict; JSON=1
	@"$$PYTHON" -m monitoring.compare --prometheus "$$PROMETHEUS_URL" --project "$$PROJECT" --run "$$RUN" --with "$$WITH" \
	  $(if $(COMPARE_SKIP),--skip "$$COMPARE_SKIP") $(if $(filter 1,$(JSON)),--json) --out "$$RUN_DIR/compare.json"

##@ Tune

TUNE_SECONDS ?=
TUNE_CANDIDATES ?=
# STACK_VARS: APPLY=1 starts the job again as `make up` does (compose/lifecycle.py reads them).
$(call pass_env,tune,RUN TUNE_CANDIDATES TUNE_SECONDS PROMETHEUS_URL $(STACK_VARS))

.PHONY: tune
tune: $(VENV)/.stamp ## During a running job: try the settings its verdict names against the current ones (docs/tune.md)
	@$(PY) -m monitoring.tune --prometheus "$$PROMETHEUS_URL" --project "$$PROJECT" --run "$$RUN" --run-dir "$$RUN_DIR" \
	  $(if $(TUNE_SECONDS),--seconds "$$TUNE_SECONDS") $(if $(TUNE_CANDIDATES),--candidates "$$TUNE_CANDIDATES") \
	  $(if $(filter 1,$(APPLY)),--apply) $(if $(filter 1,$(TUNE_RESTART_OK)),--restart-ok)
