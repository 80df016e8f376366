# Trainer targets (included by the top-level Makefile). Recipes use $(PY) from the project venv.

$(call pass_env,test-trainer,PYTEST_ARGS)

##@ Trainer

.PHONY: test-trainer
test-trainer: $(VENV)/.stamp ## Run the trainer's unit tests and local-cluster tests (real TensorFlow processes)
	$(call with_args,PYTEST_ARGS) $(PY) -m pytest $(wildcard tests/unit/test_trainer_*.py) tests/unit/test_bench_comm.py \
	  tests/unit/test_import_graph.py tests/unit/test_packaging.py tests/cluster

##@ Lint

.PHONY: lint
lint: $(VENV)/.stamp ## ruff check and ruff format --check over the tree
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
