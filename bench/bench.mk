# Host-side tools that run the trainer as local processes: the local launcher and the benchmarks.
# Included by the top Makefile; RUN_DIR and PROJECT come from compose/compose.mk, PY from the top Makefile.

BENCH_ARGS ?= --rounds 7 --bench-steps 800
SCRIPT_BENCH_ARGS ?= --rounds 5 --workers 1
TRAIN_ARGS ?= --steps 300 --log-every 50
BENCH_COMM_ARGS ?=
SCALING_SECONDS ?= 20
SCALING_ARGS ?= --task cnn --log-every 100

$(call pass_env,train-local,WORKERS TRAIN_ARGS)
$(call pass_env,bench,WORKERS BENCH_ARGS SCRIPT_BENCH_ARGS)
$(call pass_env,bench-comm,PROJECT RUN_DIR BENCH_COMM_ARGS)
$(call pass_env,scaling,WORKERS SCALING_SECONDS RUN_DIR SCALING_ARGS)

##@ Local runs and benchmarks

.PHONY: train-local
train-local: $(VENV)/.stamp ## Train a chief + WORKERS local processes (no Docker); TRAIN_ARGS=... passes trainer flags
	$(call with_args,TRAIN_ARGS) $(PY) -m bench.launch --workers "$$WORKERS"

.PHONY: bench
bench: $(VENV)/.stamp ## Benchmark a local chief + WORKERS cluster: overheads, vs model.fit, a SCRIPT= observed
	$(call with_args,BENCH_ARGS) $(PY) -m bench.launch --workers "$$WORKERS" --metrics-port 0 --module bench.overhead
	$(call with_args,SCRIPT_BENCH_ARGS) $(PY) -m bench.script_overhead

.PHONY: iperf3
iperf3: ## Install iperf3 from Debian's packages if missing (bench-comm's TCP reference; root, apt)
	@command -v iperf3 >/dev/null || { echo "iperf3: apt-get install iperf3"; \
	  { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends iperf3 >/dev/null; } \
	  || echo "iperf3: could not install it (not root, or no apt): bench-comm runs without the TCP reference"; }

.PHONY: bench-comm
bench-comm: $(VENV)/.stamp iperf3 ## All-reduce sweep and gradient lists next to iperf3; writes RUN_DIR/bench-comm.{json,png}
	$(call with_args,BENCH_COMM_ARGS) $(PY) -m bench.comm --project "$$PROJECT" --out "$$RUN_DIR/bench-comm"

.PHONY: scaling
scaling: $(VENV)/.stamp ## Same short job at WORKERS=0..N, projected to 4-64 workers; writes RUN_DIR/scaling.{json,png}
	$(call with_args,SCALING_ARGS) $(PY) -m bench.scaling --max-workers "$$WORKERS" --seconds "$$SCALING_SECONDS" \
	  --out "$$RUN_DIR/scaling" --bench-comm "$$RUN_DIR/bench-comm.json"
