# Docker Swarm: the same run as a stack across hosts, tried on a swarm of Docker-in-Docker nodes here.
# Included by the top Makefile after compose/compose.mk (WORKERS, IMAGE_REPO, ... come from there; trainer
# knobs such as STEPS= reach the swarm target (python -m compose.emit) through the environment, compose/knobs.py).

SWARM_NAME ?= mwms-swarm
# The nodes' /24 on this host (node-N is .1N, the registry .10): another swarm on the same host needs its own.
SWARM_SUBNET ?= 10.210.0
NODES ?= 3
STACK ?= $(DEFAULT_PROJECT)
# How the images reach the nodes: registry (push once, nodes pull by digest) or load (docker save | load).
TRANSPORT ?= registry
# REGISTRY is where the host pushes; NODE_REGISTRY is the same registry as the nodes reach it.
REGISTRY ?= $(BIND_ADDR):5000
NODE_REGISTRY ?= $(REGISTRY)
GRAFANA_IMAGE ?=
# One bundle folder per stack: make stack-resize and stack-elastic emit it again from its remake.json.
SWARM_DIR = $(RUN_DIR)/swarm/$(STACK)
# One task per node, in this order (e.g. node-1,node-2,node-3); empty: the scheduler places every task.
TRAINER_NODES ?=
# make stack-elastic: the fewest workers to go on with, and how long a task may stay unplaced before
# the job goes on without it (empty: the defaults of contract/elastic.py, RESIZE_AFTER sized from the
# job's measured restart).
MIN_WORKERS ?=
RESIZE_AFTER ?=
NODES_SH = compose/swarm/nodes.sh
MANAGER = docker exec "$$SWARM_NAME-node-1" docker
TRAINER_IMAGE = "$$IMAGE_REPO:$$("$$PYTHON" -c 'import trainer; print(trainer.__version__)')-cpu"
PROMETHEUS_IMAGE ?= mwms/prometheus:2.42.0-bookworm
ALERTMANAGER_IMAGE ?= mwms/alertmanager:0.25.0-bookworm
# 1: IPsec-encrypted overlays; off by default: kernels without ESP drop every packet (docs/security.md).
SWARM_ENCRYPT ?= 0

SWARM_ENV = SWARM_NAME SWARM_SUBNET NODES BIND_ADDR
$(call pass_env,nodes-up nodes-down push stack-status stack-up,$(SWARM_ENV))
$(call pass_env,stack-up,$(STACK_VARS) STACK TRANSPORT REGISTRY NODE_REGISTRY GRAFANA_IMAGE PROMETHEUS_IMAGE \
  ALERTMANAGER_IMAGE ALERTMANAGER_CONFIG SWARM_ENCRYPT SWARM_DIR TRAINER_NODES)
$(call pass_env,push,IMAGE_REPO REGISTRY)
$(call pass_env,stack-down stack-status,SWARM_NAME STACK NODES SWARM_DIR PYTHON)
$(call pass_env,stack-status stack-resize stack-elastic,SWARM_DIR)
$(call pass_env,stack-resize,WORKERS)
$(call pass_env,stack-elastic,MIN_WORKERS RESIZE_AFTER)

##@ Swarm (multi-host)

.PHONY: nodes-up
nodes-up: ## Start NODES (3) Docker-in-Docker nodes on this host and join them into a swarm
	@$(NODES_SH) up

.PHONY: nodes-down
nodes-down: ## Remove the swarm nodes, their volumes, network and registry
	@$(NODES_SH) down

.PHONY: push
push: ## Push the trainer image to REGISTRY=host:port; prints the digest reference nodes pull
	@$(NODES_SH) push $(TRAINER_IMAGE) "$$REGISTRY"

.PHONY: stack-up
stack-up: ## Deploy the run as swarm stack STACK: nodes-up, images, push or load (TRANSPORT=), deploy
	@compose/swarm/stack-up.sh

.PHONY: stack-down
stack-down: ## Remove stack STACK from the swarm (checkpoint volumes kept: a redeploy resumes)
	@"$$PYTHON" -m compose.lifecycle stack-down

.PHONY: stack-resize
stack-resize: ## Change stack STACK to WORKERS=N at a checkpoint (docs/multi-host.md)
	@test -n "$(filter WORKERS,$(MAKE_COMMAND_LINE))" || { echo "stack-resize: WORKERS=N is required (the new number of workers besides the chief)" >&2; exit 2; }
	@"$$PYTHON" -m compose.stackresize --dir "$$SWARM_DIR" --workers "$$WORKERS"

.PHONY: stack-elastic
stack-elastic: ## Keep stack STACK going without a lost node (down to MIN_WORKERS), grow back when it returns
	@"$$PYTHON" -m compose.elastic --dir "$$SWARM_DIR" $(if $(MIN_WORKERS),--min-workers "$$MIN_WORKERS") \
	  $(if $(RESIZE_AFTER),--resize-after "$$RESIZE_AFTER")

.PHONY: stack-status
stack-status: ## Where every task of STACK runs and its state, what stack-elastic waits for, the training table
	@$(MANAGER) stack ps "$$STACK" --format 'table {{.Name}}\t{{.Node}}\t{{.CurrentState}}\t{{.Error}}'
	@cat "$$SWARM_DIR/elastic.txt" 2>/dev/null || true
	@"$$PYTHON" -m monitoring.status --no-docker --project "$$STACK" --prometheus http://$$($(NODES_SH) ip 1):$(PROMETHEUS_PORT)
