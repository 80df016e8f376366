# `make diagnose`, `make bench-comm`, `make scaling`. Included by the top Makefile.
# PROMETHEUS_URL comes from monitoring/monitoring.mk, RUN_DIR and PROJECT from compose/compose.mk, PY from the top Makefile.

BENCH_COMM_ARGS ?=
SCALING_SECONDS ?= 20
SCALING_ARGS ?= --task cnn --log-every 100

##@ Diagnose and benchmarks

.PHONY: diagnose
diagnose: $(VENV)/.stamp ## Verdict per cluster and task from Prometheus (input-/communication-bound, straggler, ...); exit 0 healthy, 1 problem, 2 no data; JSON=1
	@$(PY) -m monitoring.diagnose --prometheus $(PROMETHEUS_URL) --bench $(RUN_DIR)/bench-comm.json $(if $(JSON),--json)

.PHONY: bench-comm
bench-comm: $(VENV)/.stamp ## All-reduce sweep 4 KiB-64 MiB (time, algbw, busbw per knob) next to iperf3 TCP; the stack's containers if up, else 2 local tasks; writes $(RUN_DIR)/bench-comm.{json,png}
	$(PY) -m trainer.host.bench_comm --project $(PROJECT) --out $(RUN_DIR)/bench-comm $(BENCH_COMM_ARGS)

.PHONY: scaling
scaling: $(VENV)/.stamp ## Same short job at WORKERS=0..N (N=WORKERS): throughput, efficiency, breakdown, and the ring model (fitted to bench-comm) projected to 4-64 workers; writes $(RUN_DIR)/scaling.{json,png}
	$(PY) -m trainer.host.scaling --max-workers $(WORKERS) --seconds $(SCALING_SECONDS) --out $(RUN_DIR)/scaling --bench-comm $(RUN_DIR)/bench-comm.json $(SCALING_ARGS)
