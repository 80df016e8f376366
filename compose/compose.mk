# The Docker stack: a chief plus WORKERS workers, Prometheus, and Grafana when its image is available.
# Included by the top Makefile (which defines PYTHON, VENV and PY).
#
# Two kinds of variables reach compose/up.sh, each one way:
#  - stack settings: STACK_VARS below, the one list (defaults here);
#  - trainer knobs: any trainer flag upper-cased (STEPS=, TASK=, PER_REPLICA_BATCH=, INPUT_DELAY_MS=, ...,
#    see `python -m trainer --help`) given on make's command line, or TRAINER_<NAME> in the environment.
#    make exports command-line variables to every recipe, so they pass untouched to the Compose target
#    (python -m compose.emit --target compose), which reads them from its environment (compose/knobs.py
#    derives the names from trainer/config.py); MAKE_COMMAND_LINE (the top Makefile) names them, so a
#    shell variable that only shares a flag's name is not a knob.

WORKERS ?= $(DEFAULT_WORKERS)
GPUS ?= auto
GPUS_PER_WORKER ?= 1
OFFLINE ?= auto
# Unless given, the address the project's last `make up` published on, so status, diagnose and report
# (PROMETHEUS_URL) find that project's Prometheus.
BIND_ADDR ?= $(or $(shell sed -n 's/^BIND_ADDR=//p' $(RUN_DIR)/stack.env 2>/dev/null),127.0.0.1)
MAX_RESTARTS ?= $(DEFAULT_MAX_RESTARTS)
# The run status, diagnose and report show: unless given, the id the project's last `make up` created
# (every series carries it, contract.TARGET_LABELS); empty: the project's latest run in Prometheus.
RUN ?= $(shell sed -n 's/^RUN=//p' $(RUN_DIR)/stack.env 2>/dev/null)
SECRETS_DIR ?= secrets
# Compose project: a second stack on the same engine (the fault tests) needs its own name and BIND_ADDR.
PROJECT ?= $(DEFAULT_PROJECT)
# Generated files of the project's last `make up`: the default project's in .run, another's in .run/PROJECT.
RUN_DIR ?= .run$(if $(filter-out $(DEFAULT_PROJECT),$(PROJECT)),/$(PROJECT))
# Trainer image repository (tag <version>-cpu|gpu): stacks built from different checkouts need their own.
IMAGE_REPO ?= mwms/trainer
# Your own MWMS script, run in every task instead of the built-in trainer (its folder is mounted).
SCRIPT ?=
DATA ?=
# Host folder where the chief copies the final model and the run summary at the end of the job; kept by
# `make clean` (which refuses to delete a final model never copied out, unless FORCE=1).
OUTPUT ?= .run/output/$(PROJECT)
FORCE ?=
# Extra arguments for every task: trainer flags (ARGS="--input-delay-ms 20") or your SCRIPT's own.
ARGS ?=
# Prometheus' history: empty keeps compose/services.py's defaults (15d, 2GB; docs/security.md).
PROMETHEUS_RETENTION_TIME ?=
PROMETHEUS_RETENTION_SIZE ?=
# 1: enable Prometheus' unauthenticated lifecycle API (POST /-/reload, /-/quit); off by default.
PROMETHEUS_LIFECYCLE ?= 0

STACK_VARS = PROJECT IMAGE_REPO WORKERS GPUS GPUS_PER_WORKER OFFLINE BIND_ADDR MAX_RESTARTS SECRETS_DIR RUN_DIR PYTHON \
             SCRIPT DATA OUTPUT ARGS PROMETHEUS_RETENTION_TIME PROMETHEUS_RETENTION_SIZE PROMETHEUS_LIFECYCLE
# Every docker compose call sees the files and settings the project's last `make up` generated, and
# names the project itself: a RUN_DIR of another project's stack must not redirect down or clean.
DC = docker compose -p $(PROJECT) --project-directory $(CURDIR) --env-file $(RUN_DIR)/stack.env $$(cat $(RUN_DIR)/compose.args)
STACK_UP = test -f $(RUN_DIR)/stack.env
UV := build/uv/bin/uv
UV_COMPILE = $(UV) pip compile -q --generate-hashes --python-version 3.11 --python-platform x86_64-manylinux_2_28

$(call pass_env,up images resize,$(STACK_VARS))
$(call pass_env,status,RUN)

##@ Cluster

.PHONY: up
up: ## Start a chief + WORKERS workers with Prometheus/Grafana; GPUS=auto|0|N, SCRIPT=, DATA=, OFFLINE=1; any trainer flag: STEPS=, TASK=, ...
	@compose/up.sh

.PHONY: resize
resize: ## Resize the running job to WORKERS workers: every task saves the same step, stops, and the job goes on from it at the new size (RESIZE_KEEP=global-batch keeps the global batch)
	@test -n "$(filter WORKERS,$(MAKE_COMMAND_LINE))" || { echo "resize: WORKERS=N is required (the new number of workers besides the chief)" >&2; exit 2; }
	@compose/resize.sh

.PHONY: down
down: ## Stop and remove the containers; keep volumes (the next `make up` resumes from the last checkpoint)
	@if $(STACK_UP); then $(DC) down --remove-orphans; else docker compose -p $(PROJECT) down --remove-orphans; fi

# The chief's service, run once with another command: it mounts the checkpoint volume and OUTPUT.
CHIEF_RUN = $(DC) run --rm --no-deps -T chief python -m trainer.state.output

.PHONY: clean
clean: ## Like down, and also remove the volumes (checkpoints, Prometheus history) and .run/ but OUTPUT; FORCE=1 even if the final model was never copied out
	@if [ -z "$(FORCE)" ] && $(STACK_UP) && ! $(CHIEF_RUN) check --checkpoint-dir /checkpoints; then exit 2; fi
	@if $(STACK_UP); then $(DC) down --volumes --remove-orphans; \
	 else docker compose -p $(PROJECT) down --volumes --remove-orphans; fi
	@# Everything in RUN_DIR but the models and the folders of other projects (.run/PROJECT): one with a
	@# stack, or one whose make up is starting (it holds .up.lock before it writes stack.env).
	@test ! -d $(RUN_DIR) || find $(RUN_DIR) -mindepth 1 -maxdepth 1 ! -name output ! -exec test -f {}/stack.env \; \
	  ! -exec test -f {}/.up.lock \; -exec rm -rf {} +

.PHONY: output
output: ## Copy the final model and summary out of the checkpoint volume into OUTPUT (each job's end does it)
	@$(STACK_UP) || { echo "no stack: run make up"; exit 1; }
	@test -n "$(OUTPUT)" || { echo "OUTPUT= is empty: name a host folder to copy the final model into"; exit 2; }
	@test -d $(OUTPUT) || { mkdir -p $(OUTPUT) && if [ "$$(id -u)" = 0 ]; then chown 1000:1000 $(OUTPUT); fi; }
	@$(DC) run --rm --no-deps -T -v $(abspath $(OUTPUT)):/copy-to chief \
	  python -m trainer.state.output copy --checkpoint-dir /checkpoints --to /copy-to
	@rmdir $(RUN_DIR) 2>/dev/null || true

.PHONY: logs
logs: ## Follow the logs of every service (SERVICE=worker-1 for one)
	@$(STACK_UP) || { echo "no stack: run make up"; exit 1; }
	$(DC) logs --follow --tail=50 $(SERVICE)

.PHONY: status
status: ## Table per task of the last run (RUN=<id> for an earlier one): state, step, steps/s, step time, all-reduce and input-wait share, checkpoint
	@$(PYTHON) -m monitoring.status --project $(PROJECT) --run "$$RUN" --prometheus $(PROMETHEUS_URL)

.PHONY: wait
wait: ## Block until the job is over (done, or failed for good across restarts); exit with the chief's code
	@$(PYTHON) -m compose.wait $(PROJECT)

.PHONY: config
config: ## Validate the generated compose files of the last `make up` (docker compose config -q)
	$(DC) config -q

##@ Setup

.PHONY: engine
engine: ## Install and start the Docker engine and Compose v2, and the docker CLI the tests check stack files with (root on Debian/Ubuntu; no systemd needed)
	compose/engine.sh install

.PHONY: images
images: ## Build the base, Prometheus and trainer images without starting anything (OFFLINE=1 forces Debian builds)
	@compose/up.sh --build-only

.PHONY: prune
prune: ## Reclaim disk: Docker build cache and dangling images
	docker builder prune -f
	docker image prune -f

.PHONY: golden
golden: $(VENV)/.stamp ## Regenerate tests/golden/ (every target's files: compose for WORKERS=1 and 3, CPU and GPU; the swarm bundle; Kubernetes) after an intended change
	UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/unit/test_compose_golden.py tests/unit/test_compose_stack.py

.PHONY: lock
lock: ## Regenerate the hash locks: requirements.lock (host .venv) and images/requirements-{cpu,gpu}.lock
	@test -x $(UV) || images/quiet.sh build/logs/uv.log "lock: installing uv into build/uv" \
	  sh -c '$(PYTHON) -m venv build/uv && build/uv/bin/pip install uv==0.13.9'
	$(UV_COMPILE) --override images/no-tensorflow.txt requirements.in -o requirements.lock
	$(UV_COMPILE) --override images/no-tensorflow.txt images/requirements-cpu.in -o images/requirements-cpu.lock
	$(UV_COMPILE) images/requirements-gpu.in -o images/requirements-gpu.lock
