# Trainer targets (included by the top-level Makefile). Recipes use $(PY) from the project venv.

WORKERS ?= 2
BENCH_ARGS ?= --rounds 5 --bench-steps 400
TRAIN_ARGS ?= --steps 300 --log-every 50

##@ Trainer

.PHONY: train-local
train-local: $(VENV)/.stamp ## Train a chief + WORKERS local processes (no Docker); TRAIN_ARGS=... passes trainer flags
	$(PY) -m trainer.host.launch --workers $(WORKERS) $(TRAIN_ARGS)

.PHONY: bench
bench: $(VENV)/.stamp ## Benchmark on a local chief + WORKERS cluster: ratios (a) timing overhead, (b) vs model.fit, (c) marks vs profiler, (d) overlap vs serial, (e) bfloat16 all-reduce
	$(PY) -m trainer.host.launch --workers $(WORKERS) --metrics-port 0 --module trainer.host.bench $(BENCH_ARGS)

.PHONY: test-trainer
test-trainer: $(VENV)/.stamp ## Run the trainer's unit tests and local-cluster tests (real TensorFlow processes)
	$(PY) -m pytest $(wildcard tests/unit/test_trainer_*.py) tests/unit/test_bench_comm.py \
	  tests/unit/test_import_graph.py tests/unit/test_packaging.py tests/cluster $(PYTEST_ARGS)

##@ Lint

.PHONY: lint
lint: $(VENV)/.stamp ## ruff check and ruff format --check over the tree (to fix: .venv/bin/ruff format . && .venv/bin/ruff check --fix .)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
