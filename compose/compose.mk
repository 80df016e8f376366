# The Docker stack: a chief plus WORKERS workers, Prometheus, and Grafana when its image is available.
# Included by the top Makefile (which defines PYTHON, VENV, PY and RUN_DIR).

WORKERS ?= 2
GPUS ?= auto
GPUS_PER_WORKER ?= 1
OFFLINE ?= auto
BIND_ADDR ?= 127.0.0.1
MAX_RESTARTS ?= 3
SECRETS_DIR ?= secrets
# Compose project: a second stack on the same engine (the fault tests) needs its own name, RUN_DIR and BIND_ADDR.
PROJECT ?= mwms
# Trainer image repository (tag <version>-cpu|gpu): stacks built from different checkouts need their own.
IMAGE_REPO ?= mwms/trainer
# Left empty, these fall back to the trainer's own defaults (python -m trainer --help).
STEPS ?=
TASK ?=
PER_REPLICA_BATCH ?=
STRATEGY ?=
SAVE_EVERY ?=
CLUSTER_TIMEOUT ?=
SCRIPT ?=
DATA ?=
# Extra arguments for every task: trainer flags (ARGS="--input-delay-ms 20") or your SCRIPT's own.
ARGS ?=

STACK_VARS = PROJECT IMAGE_REPO WORKERS GPUS GPUS_PER_WORKER OFFLINE BIND_ADDR MAX_RESTARTS SECRETS_DIR RUN_DIR PYTHON \
             STEPS TASK PER_REPLICA_BATCH STRATEGY SAVE_EVERY CLUSTER_TIMEOUT SCRIPT DATA ARGS
# Every docker compose call sees the files and settings the last `make up` generated.
DC = docker compose --project-directory $(CURDIR) --env-file $(RUN_DIR)/stack.env $$(cat $(RUN_DIR)/compose.args)
STACK_UP = test -f $(RUN_DIR)/stack.env
UV := build/uv/bin/uv
UV_COMPILE = $(UV) pip compile -q --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28

##@ Cluster

.PHONY: up
up: ## Start a chief + WORKERS workers (default 2) with Prometheus/Grafana; GPUS=auto|0|N, STEPS=, SCRIPT=, DATA=, OFFLINE=1
	@$(foreach v,$(STACK_VARS),$(v)='$($(v))') compose/up.sh

.PHONY: down
down: ## Stop and remove the containers; keep volumes (the next `make up` resumes from the last checkpoint)
	@if $(STACK_UP); then $(DC) down --remove-orphans; else docker compose -p $(PROJECT) down --remove-orphans; fi

.PHONY: clean
clean: ## Like down, and also remove the volumes (checkpoints, Prometheus history) and .run/
	@if $(STACK_UP); then $(DC) down --volumes --remove-orphans; \
	 else docker compose -p $(PROJECT) down --volumes --remove-orphans; fi
	rm -rf $(RUN_DIR)

.PHONY: logs
logs: ## Follow the logs of every service (SERVICE=worker-1 for one)
	@$(STACK_UP) || { echo "no stack: run make up"; exit 1; }
	$(DC) logs --follow --tail=50 $(SERVICE)

.PHONY: status
status: ## Table per task: state, step, steps/s, step time, all-reduce and input-wait share, last checkpoint
	@$(PYTHON) -m compose.status --project $(PROJECT) --prometheus $(PROMETHEUS_URL)

.PHONY: wait
wait: ## Block until the job is over (done, or failed for good across restarts); exit with the chief's code
	@$(PYTHON) -m compose.wait $(PROJECT)

.PHONY: config
config: ## Validate the generated compose files of the last `make up` (docker compose config -q)
	$(DC) config -q

##@ Setup

.PHONY: engine
engine: ## Install and start the Docker engine and Compose v2 (root on Debian/Ubuntu; no systemd needed)
	compose/engine.sh install

.PHONY: images
images: ## Build the base, Prometheus and trainer images without starting anything (OFFLINE=1 forces Debian builds)
	@$(foreach v,$(STACK_VARS),$(v)='$($(v))') compose/up.sh --build-only

.PHONY: prune
prune: ## Reclaim disk: Docker build cache and dangling images
	docker builder prune -f
	docker image prune -f

.PHONY: golden
golden: $(VENV)/.stamp ## Regenerate tests/golden/ (compose files for WORKERS=1 and 3, CPU and GPU; the swarm stack bundle) after an intended change
	UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/unit/test_compose_golden.py tests/unit/test_compose_stack.py

.PHONY: lock
lock: ## Regenerate the hash locks: requirements.lock (host .venv) and images/requirements-{cpu,gpu}.lock
	@test -x $(UV) || { $(PYTHON) -m venv build/uv && build/uv/bin/pip install -q uv==0.13.9; }
	$(UV_COMPILE) --override images/no-tensorflow.txt requirements.in -o requirements.lock
	$(UV_COMPILE) --override images/no-tensorflow.txt images/requirements-cpu.in -o images/requirements-cpu.lock
	$(UV_COMPILE) images/requirements-gpu.in -o images/requirements-gpu.lock
