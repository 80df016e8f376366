# The Docker stack: a chief plus WORKERS workers, Prometheus, and Grafana when its image is available.
# Included by the top Makefile (which defines PYTHON, VENV and PY).
#
# Every recipe here is one call of compose/lifecycle.py: make hands it every variable in its environment
# (pass_env, the top Makefile), never inside shell text, and it parses them once (compose/settings.py).
#  - stack settings: STACK_VARS below, the one list; their defaults are compose/settings.py's;
#  - trainer knobs: any trainer flag upper-cased (STEPS=, TASK=, PER_REPLICA_BATCH=, ..., see `python -m trainer
#    --help`) given on make's command line, or TRAINER_<NAME> in the environment: MAKE_COMMAND_LINE (the top
#    Makefile) names them, so a shell variable that only shares a flag's name is not a knob (compose/knobs.py).

# Compose project: a second stack on the same engine (the fault tests) needs its own name and BIND_ADDR.
PROJECT ?= $(DEFAULT_PROJECT)
# Generated files of the project's last `make up`: the default project's in .run, another's in .run/PROJECT.
RUN_DIR ?= .run$(if $(filter-out $(DEFAULT_PROJECT),$(PROJECT)),/$(PROJECT))
# What the project's last `make up` recorded, read without a shell: its address (so status, diagnose and
# report find its Prometheus, PROMETHEUS_URL) and its run id (every series carries it, contract.TARGET_LABELS).
stack_env = $(patsubst $(1)=%,%,$(filter $(1)=%,$(file <$(RUN_DIR)/stack.env)))
BIND_ADDR ?= $(or $(call stack_env,BIND_ADDR),127.0.0.1)
RUN ?= $(call stack_env,RUN)
PROMETHEUS_URL ?= http://$(if $(filter-out 0.0.0.0,$(BIND_ADDR)),$(BIND_ADDR),127.0.0.1):$(PROMETHEUS_PORT)
# Trainer image repository (tag <version>-cpu|gpu): stacks built from different checkouts need their own.
IMAGE_REPO ?= mwms/trainer
WORKERS ?= $(DEFAULT_WORKERS)
MAX_RESTARTS ?= $(DEFAULT_MAX_RESTARTS)
# OUTPUT (default .run/output/PROJECT): the host folder the chief copies the final model and summary into;
# kept by `make clean`, which refuses to delete a final model never copied out, unless FORCE=1.
# The rest (GPUS, SCRIPT, DATA, ARGS, SECRETS_DIR, OFFLINE, PROMETHEUS_RETENTION_*, ...): compose/settings.py.
STACK_VARS = PROJECT IMAGE_REPO WORKERS GPUS GPUS_PER_WORKER OFFLINE BIND_ADDR MAX_RESTARTS SECRETS_DIR RUN_DIR PYTHON \
             SCRIPT DATA OUTPUT ARGS PROMETHEUS_RETENTION_TIME PROMETHEUS_RETENTION_SIZE PROMETHEUS_LIFECYCLE FORCE \
             SERVICE GRAFANA_IMAGE
LIFECYCLE = "$$PYTHON" -m compose.lifecycle
UV := build/uv/bin/uv
UV_COMPILE = $(UV) pip compile -q --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28

$(call pass_env,up images resize down clean output logs config wait profile alerts-reload,$(STACK_VARS))
$(call pass_env,status,RUN PROJECT PROMETHEUS_URL)

##@ Cluster

.PHONY: up
up: ## Start a chief + WORKERS workers, Prometheus, TensorBoard; GPUS=, SCRIPT=, DATA=, trainer flags
	@$(LIFECYCLE) up

.PHONY: resize
resize: ## Resize the running job to WORKERS=N from a checkpoint every task saves (RESIZE_KEEP=global-batch)
	@$(LIFECYCLE) resize

.PHONY: down
down: ## Stop and remove the containers; keep the volumes (the next make up resumes)
	@$(LIFECYCLE) down

.PHONY: clean
clean: ## Like down, and remove volumes and RUN_DIR files; keeps OUTPUT and an uncopied model (FORCE=1)
	@$(LIFECYCLE) clean

.PHONY: output
output: ## Copy the final model and summary from the checkpoint volume into OUTPUT
	@$(LIFECYCLE) output

.PHONY: logs
logs: ## Follow the logs of every service (SERVICE=worker-1 for one)
	@$(LIFECYCLE) logs

.PHONY: status
status: ## Table per task of the last run (RUN=<id>): state, step, steps/s, time shares, checkpoint
	@"$$PYTHON" -m monitoring.status --project "$$PROJECT" --run "$$RUN" --prometheus "$$PROMETHEUS_URL"

.PHONY: wait
wait: ## Block until the job is over; exit with the chief's code
	@$(LIFECYCLE) wait

.PHONY: config
config: ## Validate the generated compose files of the last `make up` (docker compose config -q)
	@$(LIFECYCLE) config

##@ Setup

.PHONY: engine
engine: ## Install and start the Docker engine, Compose v2 and the docker CLI (root, Debian/Ubuntu)
	compose/engine.sh install

.PHONY: images
images: ## Build the base, Prometheus and trainer images without starting anything (OFFLINE=1)
	@$(LIFECYCLE) images

.PHONY: prune
prune: ## Reclaim disk: Docker build cache and dangling images
	docker builder prune -f
	docker image prune -f

.PHONY: golden
golden: $(VENV)/.stamp ## Regenerate tests/golden/ (compose, swarm, Kubernetes) after an intended change
	UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/unit/test_compose_golden.py tests/unit/test_compose_stack.py

.PHONY: lock
lock: ## Regenerate the hash locks: requirements.lock (host .venv) and images/requirements-{cpu,gpu}.lock
	@test -x $(UV) || images/quiet.sh build/logs/uv.log "lock: installing uv into build/uv" \
	  sh -c '"$$PYTHON" -m venv build/uv && build/uv/bin/pip install uv==0.13.9'
	$(UV_COMPILE) --override images/no-tensorflow.txt requirements.in -o requirements.lock
	$(UV_COMPILE) --override images/no-tensorflow.txt images/requirements-cpu.in -o images/requirements-cpu.lock
	$(UV_COMPILE) images/requirements-gpu.in -o images/requirements-gpu.lock
