# `make diagnose`. Included by the top Makefile.
# PROMETHEUS_URL comes from monitoring/monitoring.mk, RUN_DIR and PROJECT from compose/compose.mk, PY from the top Makefile.

$(call pass_env,diagnose,RUN)

##@ Diagnose

.PHONY: diagnose
diagnose: $(VENV)/.stamp ## Verdict per cluster and task of the last `make up`'s run (RUN=<id> for an earlier one): input-/communication-bound, straggler, ...; exit 0 healthy or a verdict in a terminal, else non-zero; JSON=1: the verdict and its exit_code
	@$(PY) -m monitoring.diagnose --prometheus $(PROMETHEUS_URL) --project $(PROJECT) --run "$$RUN" --bench $(RUN_DIR)/bench-comm.json $(if $(JSON),--json) --terminal-exit-zero
