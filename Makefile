# Synchronous multi-worker TensorFlow on one Docker host. `make help` lists every target.
# Each area keeps its own targets in a fragment next to its code; this file holds what they share.

SHELL := /bin/bash
.DEFAULT_GOAL := help

# The host's Python 3, resolved once: a version manager's shim (pyenv's) costs ~0.12 CPU-s at every
# call, and a make up makes six. Exported, so nested makes and scripts take it as resolved.
ifeq ($(origin PYTHON),undefined)
PYTHON := $(shell python3 -c 'import sys; print(sys.executable)' 2>/dev/null || echo python3)
endif
export PYTHON

# Variables given on make's command line, taken as typed: make would otherwise expand a `$` in them, and
# a recipe that pastes one into a shell line runs what its quotes let through (ARGS="--note 'a b'" split,
# `'; cmd; '` run). Recipes hand them on in the environment (pass_env below), never re-quoted.
export MAKE_COMMAND_LINE := $(strip $(foreach v,$(.VARIABLES),$(if $(filter command line,$(origin $(v))),$(v))))
$(foreach v,$(MAKE_COMMAND_LINE),$(eval override $(v) := $$(value $(v))))
export $(MAKE_COMMAND_LINE)

# Every value a user may give (compose/values.py's table), checked here at parse time, before anything
# runs: one line naming the variable and its rule. Environment values are taken as typed there too.
include compose/values.mk

# $(call pass_env,targets,variables): the targets' recipes get each variable's value in their environment
# (quotes, spaces, $, backticks, ; and newlines arrive intact); recipes read them as "$$NAME".
pass_env = $(foreach v,$(2),$(eval $(1): export $(v) := $$($(v))))
# $(call with_args,VAR) command...: command with $VAR's words appended, split as a shell splits them
# (quotes honoured) by Python's shlex, so nothing in them runs; the recipe needs VAR from pass_env.
with_args = "$$PYTHON" -m compose.values --with-args $(1)
VENV := .venv
PY := $(VENV)/bin/python

# The sections of make help, in the order a user meets them (a section of a fragment goes where its
# name is here, its targets together; one not named here comes last). tests/unit/test_hostile_values.py.
HELP_SECTIONS := General|Cluster|Monitoring|Diagnose|Tune|TensorBoard|Swarm (multi-host)|Kubernetes|Setup|Local runs and benchmarks|Trainer|Tests|Lint

##@ General

.PHONY: help
help: ## Show this help (WORKERS=N means a chief plus N workers)
	@awk -v order='$(HELP_SECTIONS)' 'BEGIN {FS = ":.*##"; n = split(order, sections, "|")} \
	  /^##@/ { section = substr($$0, 5); if (!(section in text)) { extra[++m] = section; text[section] = "" } } \
	  /^[a-zA-Z0-9_.-]+:.*?##/ { d = $$2; sub(/^ +/, "", d); text[section] = text[section] sprintf("  \033[36m%-20s\033[0m %s\n", $$1, d) } \
	  END { printf "Usage: make <target> [VAR=value]\n"; \
	    for (i = 1; i <= n; i++) { s = sections[i]; done[s] = 1; if (text[s] != "") printf "\n\033[1m%s\033[0m\n%s", s, text[s] } \
	    for (i = 1; i <= m; i++) if (!(extra[i] in done)) printf "\n\033[1m%s\033[0m\n%s", extra[i], text[extra[i]] }' $(MAKEFILE_LIST)
	@printf '\nDefaults, on BIND_ADDR only: Prometheus :%s, Grafana :%s, Alertmanager :%s, TensorBoard :%s\n' \
	  $(PROMETHEUS_PORT) $(GRAFANA_PORT) $(ALERTMANAGER_PORT) $(TENSORBOARD_PORT)
	@printf 'Defaults: WORKERS=%s MAX_RESTARTS=%s PROJECT=%s\n' $(DEFAULT_WORKERS) $(DEFAULT_MAX_RESTARTS) $(DEFAULT_PROJECT)

##@ Setup

$(VENV)/.stamp: requirements.lock ## (file) The project venv, installed exactly from the hash-locked requirements.lock
	@images/quiet.sh build/logs/venv.log "venv: installing requirements.lock into $(VENV)" \
	  sh -c 'rm -rf $(VENV) && "$$PYTHON" -m venv $(VENV) && $(VENV)/bin/pip install --no-deps --require-hashes -r requirements.lock'
	@touch $@

.PHONY: venv
venv: $(VENV)/.stamp ## Create the project venv (.venv) from requirements.lock

# Ports and defaults written once in contract/__init__.py (PROMETHEUS_PORT, DEFAULT_WORKERS, ...);
# make remakes this generated fragment when the contract changes (tests/unit/test_defaults_once.py).
include contract/defaults.mk
contract/defaults.mk: contract/__init__.py contract/__main__.py
	@$(PYTHON) -m contract --make > $@

include trainer/trainer.mk
include compose/compose.mk
include compose/tensorboard.mk
include compose/k8s.mk
include compose/swarm.mk
include images/images.mk
include monitoring/monitoring.mk
include monitoring/diagnose.mk
include bench/bench.mk

##@ Tests

# The unit tests measure no time: they run on every core (pytest-xdist). Of the local clusters and the
# end-to-end modules, those that judge what they time (marked `measures`: step times, shares of a step,
# speed-ups) run alone; the others size their waits from what they measure, so they run side by side,
# each module on one xdist worker (tests/conftest.py), each stack in its own project and address
# (tests/e2e/places.py): the longest first, two lanes for the CPU-bound modules (the 2 cores) and two
# for the modules that mostly wait on a timer or a bound with their job idle (tests/schedule.py): in one
# waiting lane they took 1350 s of a 1387 s stage (CI, 2026-12-06), as long as the CPU-bound lanes.
# The stage ends by printing each lane's modules and their spans (tests/lanes.py, build/logs/lanes.tsv).
# Two per core: some unit tests wait on real time (a live Prometheus' scrapes, a supervisor's polls), and
# their waits overlap the others' work (891 tests: 99 s with 4 processes on 2 idle cores, 117 s with 2).
UNIT_JOBS ?= $(shell echo $$((2 * $$(nproc))))
UNIT = $(PY) -m pytest -n "$$UNIT_JOBS" tests/unit
E2E_JOBS ?= 4
MEASURED = $(PY) -m pytest --durations=15 -m measures tests/cluster tests/e2e
SIDE_BY_SIDE = $(PY) -m pytest --durations=30 -n "$$E2E_JOBS" --dist loadscope -m "not measures" tests/cluster tests/e2e
# pytest's exit 5 (nothing selected, e.g. PYTEST_ARGS=-k of one stage's test) fails only if both stages had none.
BOTH_PASSED = { [ $$1 -eq 0 ] || [ $$1 -eq 5 ]; } && { [ $$2 -eq 0 ] || [ $$2 -eq 5 ]; } && [ $$1$$2 != 55 ]

# While the unit tests run (they measure no time), the images' wheelhouses download beside the base
# images' builds (the network, not the cores; `make images` waits on the CPU one's lock) and, when an
# engine answers, the CPU stack's images are built (~1 min cold), then the GPU trainer image that
# tests/e2e/test_gpu_image.py exercises (~2 min cold, ~9 GB written), so the clusters and the end-to-end
# tests, which size their waits from what they measure, run on idle cores: built in the side-by-side
# stage, the GPU image took 2-5 min of a lane beside the CPU-bound modules. Built here (101 s, 117 CPU-s
# cold), after the CPU stack's images (whose three Debian builds run side by side: compose/up.sh), it ends
# within ~30 s of the unit tests, which wait for it (~2.4 min while those builds ran one after another).
# What fails here is done again by the test that needs it.
# The host's python3 downloads (no venv needed): .ci/run starts this while Chromium and the venv install.
FETCH = images/images.sh fetch images/requirements-$(1).lock build/wheelhouse-$(1)
PREBUILD = ($(call FETCH,gpu)) & gpu=$$!; ($(call FETCH,cpu)) & \
  if compose/engine.sh check >/dev/null 2>&1; then $(MAKE) --no-print-directory images VARIANT=cpu OFFLINE=1 \
    && wait $$gpu && $(MAKE) --no-print-directory images VARIANT=gpu OFFLINE=1 && date >$(GPU_BUILT); \
  else echo "test: no Docker engine: the end-to-end tests build the images themselves"; fi; built=$$?; \
  wait; exit $$built

# One at a time per tree: make test's own, started while .ci/run's still built, waited on its locks and
# then checked every image again (the GPU one's 3.3 GB build context: 20 s after its 139 s build, with
# the unit tests done and waiting). The second now waits for the first and takes its images as built.
TEST_IMAGES_LOCK = build/test-images.lock
# Written when this make test's make test-images (or the one it waited for) built the GPU image: the side-by-
# side stage's test_gpu_image takes that image rather than build it again, a warm build that resent its
# 3.5 GB context because the CPU stacks' builds had replaced the builder's copy (60-90 s of a CPU-bound lane
# on CI). make test removes it first; run on its own, the test builds.
GPU_BUILT = build/test-images.gpu-built
TEST_IMAGES_LOG = build/logs/test-images.log
.PHONY: test-images
test-images: ## Download the wheelhouses and build the CPU stack's and GPU trainer's images, as make test does
	@mkdir -p $(dir $(TEST_IMAGES_LOG)); flock -n -E 75 -o $(TEST_IMAGES_LOCK) sh -c '$(PREBUILD)' >>$(TEST_IMAGES_LOG) 2>&1; \
	  rc=$$?; [ $$rc -eq 75 ] || exit $$rc; \
	  echo "test-images: another make test-images of this tree is building them: waiting for it" >>$(TEST_IMAGES_LOG); \
	  flock $(TEST_IMAGES_LOCK) true

.PHONY: test
test: $(VENV)/.stamp ## Run every test: unit (images building meanwhile), then the local clusters and the Docker suite
	@mkdir -p build/logs; rm -f $(GPU_BUILT); $(MAKE) --no-print-directory test-images & images=$$!; \
	  $(call with_args,PYTEST_ARGS) $(UNIT); unit=$$?; \
	  wait $$images || echo "test: the images' download or build failed (build/logs/test-images.log): the tests that need them do it again"; \
	  exit $$unit
	@export TEST_IMAGES_GPU_BUILT=$(GPU_BUILT); $(call with_args,PYTEST_ARGS) $(MEASURED); measured=$$?; \
	  $(call with_args,PYTEST_ARGS) $(SIDE_BY_SIDE); rest=$$?; \
	  set -- $$measured $$rest; $(BOTH_PASSED)

FAULTS ?= 20
SEED ?=
CHAOS_ENGINE ?= dind
.PHONY: chaos
chaos: $(VENV)/.stamp ## Long chaos run: FAULTS (20) faults at random steps from SEED on Docker-in-Docker (CHAOS_ENGINE=)
	CHAOS_FAULTS="$$FAULTS" CHAOS_SEED="$$SEED" $(call with_args,PYTEST_ARGS) $(PY) -m pytest -s tests/e2e/test_chaos.py

.PHONY: test-unit
test-unit: $(VENV)/.stamp ## Run only the fast unit tests (no TensorFlow cluster, no Docker; UNIT_JOBS=1 for one process)
	$(call with_args,PYTEST_ARGS) $(UNIT)

# The local clusters that cost seconds each (~75 s together on the loaded 2 cores): the server's
# settings, and the trainer's own cluster faults (a missing, a disagreeing and a lost peer).
QUICK_CLUSTER = tests/cluster/test_server_config.py \
  tests/cluster/test_trainer_cluster.py::test_missing_peer_exits_3_naming_it \
  tests/cluster/test_trainer_cluster.py::test_tasks_that_disagree_are_named \
  tests/cluster/test_trainer_cluster.py::test_lost_peer_is_a_retryable_exit
.PHONY: test-quick
test-quick: $(VENV)/.stamp ## The inner loop (under 5 min, no Docker): unit tests and the fast local-cluster tests
	$(call with_args,PYTEST_ARGS) $(UNIT)
	$(call with_args,PYTEST_ARGS) $(PY) -m pytest $(QUICK_CLUSTER)

$(call pass_env,test test-unit test-quick,PYTEST_ARGS UNIT_JOBS)
$(call pass_env,test,E2E_JOBS)
$(call pass_env,chaos,FAULTS SEED CHAOS_ENGINE PYTEST_ARGS)
