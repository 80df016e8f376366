# Host-side tools that run the trainer as local processes: the local launcher and the benchmarks.
# Included by the top Makefile; RUN_DIR and PROJECT come from compose/compose.mk, PY from the top Makefile.

BENCH_ARGS ?= --rounds 7 --bench-steps 800
SCRIPT_BENCH_ARGS ?= --rounds 5 --workers 1
TRAIN_ARGS ?= --steps 300 --log-every 50
BENCH_COMM_ARGS ?=
SCALING_SECONDS ?= 20
SCALING_ARGS ?= --task cnn --log-every 100

##@ Local runs and benchmarks

.PHONY: train-local
train-local: $(VENV)/.stamp ## Train a chief + WORKERS local processes (no Docker); TRAIN_ARGS=... passes trainer flags
	$(PY) -m bench.launch --workers $(WORKERS) $(TRAIN_ARGS)

.PHONY: bench
bench: $(VENV)/.stamp ## Benchmark on a local chief + WORKERS cluster: ratios (a) timing overhead, (b) vs model.fit, (c) marks vs profiler, (d) overlap vs serial, (e) bfloat16 all-reduce, (f) a user's fit script observed (SCRIPT=, scraped by a Prometheus) vs plain, at steps_per_execution 1 and 10
	$(PY) -m bench.launch --workers $(WORKERS) --metrics-port 0 --module bench.overhead $(BENCH_ARGS)
	$(PY) -m bench.script_overhead $(SCRIPT_BENCH_ARGS)

.PHONY: iperf3
iperf3: ## Install iperf3 from Debian's packages if missing (make bench-comm's TCP reference; root, apt; without it bench-comm runs with no reference)
	@command -v iperf3 >/dev/null || { echo "iperf3: apt-get install iperf3"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iperf3 >/dev/null; } \
	  || echo "iperf3: could not install it (not root, or no apt): bench-comm runs without the TCP reference"; }

.PHONY: bench-comm
bench-comm: $(VENV)/.stamp iperf3 ## All-reduce sweep 4 KiB-64 MiB and mlp/cnn/ResNet-50 gradient lists (median, min-max, busbw per knob) next to iperf3 with TF's stream count; the stack's containers if up, else 2 local tasks (BENCH_COMM_ARGS=--where bridge: containers on a bridge); writes $(RUN_DIR)/bench-comm.{json,png}
	$(PY) -m bench.comm --project $(PROJECT) --out $(RUN_DIR)/bench-comm $(BENCH_COMM_ARGS)

.PHONY: scaling
scaling: $(VENV)/.stamp ## Same short job at WORKERS=0..N (N=WORKERS): throughput, efficiency, breakdown, and the ring model (fitted to bench-comm) projected to 4-64 workers; writes $(RUN_DIR)/scaling.{json,png}
	$(PY) -m bench.scaling --max-workers $(WORKERS) --seconds $(SCALING_SECONDS) --out $(RUN_DIR)/scaling --bench-comm $(RUN_DIR)/bench-comm.json $(SCALING_ARGS)

