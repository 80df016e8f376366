# `make diagnose`. Included by the top Makefile.
# PROMETHEUS_URL comes from monitoring/monitoring.mk, RUN_DIR and PROJECT from compose/compose.mk, PY from the top Makefile.

$(call pass_env,diagnose compare,RUN)
$(call pass_env,compare,WITH)

##@ Diagnose

.PHONY: diagnose
diagnose: $(VENV)/.stamp ## Verdict per cluster and task of the last `make up`'s run (RUN=<id> for an earlier one): input-/communication-bound, straggler, ...; exit 0 healthy or a verdict in a terminal, else non-zero; JSON=1: the verdict and its exit_code
	@$(PY) -m monitoring.diagnose --prometheus $(PROMETHEUS_URL) --project $(PROJECT) --run "$$RUN" --bench $(RUN_DIR)/bench-comm.json --tune $(RUN_DIR)/tune.json --compare $(RUN_DIR)/compare.json $(if $(JSON),--json) --terminal-exit-zero

COMPARE_SKIP ?=

.PHONY: runs
runs: ## List the project's runs Prometheus holds, which make compare can compare: id, first step, steps, tasks, settings; JSON=1
	@$(PYTHON) -m monitoring.runs --prometheus $(PROMETHEUS_URL) --project $(PROJECT) $(if $(JSON),--json)

.PHONY: compare
compare: ## The last run (RUN=<id>) against the one before (WITH=<id>): steps/s, examples/s, step parts, median and spread over the steady part, settings that differ, verdict (kept in RUN_DIR/compare.json for make diagnose); COMPARE_SKIP=s, JSON=1
	@$(PYTHON) -m monitoring.compare --prometheus $(PROMETHEUS_URL) --project $(PROJECT) --run "$$RUN" --with "$$WITH" $(if $(COMPARE_SKIP),--skip $(COMPARE_SKIP)) $(if $(JSON),--json) --out $(RUN_DIR)/compare.json

TUNE_SECONDS ?=
TUNE_CANDIDATES ?=
# STACK_VARS: APPLY=1 starts the job again as `make up` does (compose/lifecycle.py reads them).
$(call pass_env,tune,RUN TUNE_CANDIDATES $(STACK_VARS))

.PHONY: tune
tune: $(VENV)/.stamp ## During a running job: try the settings its verdict names (TUNE_CANDIDATES=...) from its checkpoint against the current ones in turns, with a null; table, winner to RUN_DIR/tuned.env (make up reads it); TUNE_SECONDS=, APPLY=1: the job goes on with it at once, from its checkpoint; a SCRIPT= job that keeps no checkpoint is refused (TUNE_RESTART_OK=1: tune it anyway)
	@$(PY) -m monitoring.tune --prometheus $(PROMETHEUS_URL) --project $(PROJECT) --run "$$RUN" --run-dir $(RUN_DIR) $(if $(TUNE_SECONDS),--seconds $(TUNE_SECONDS)) $(if $(TUNE_CANDIDATES),--candidates "$$TUNE_CANDIDATES") $(if $(APPLY),--apply) $(if $(TUNE_RESTART_OK),--restart-ok)
