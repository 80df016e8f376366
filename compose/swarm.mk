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
SWARM_DIR = $(RUN_DIR)/swarm
NODES_SH = compose/swarm/nodes.sh
MANAGER = docker exec $(SWARM_NAME)-node-1 docker
TRAINER_IMAGE = $(IMAGE_REPO):$$($(PYTHON) -c 'import trainer; print(trainer.__version__)')-cpu
PROMETHEUS_IMAGE ?= mwms/prometheus:2.42.0-bookworm
ALERTMANAGER_IMAGE ?= mwms/alertmanager:0.25.0-bookworm
# 1: IPsec-encrypted overlays; off by default: kernels without ESP drop every packet (docs/security.md).
SWARM_ENCRYPT ?= 0

SWARM_ENV = SWARM_NAME SWARM_SUBNET NODES BIND_ADDR
$(call pass_env,nodes-up nodes-down push stack-status stack-up,$(SWARM_ENV))
$(call pass_env,stack-up,$(STACK_VARS) STACK TRANSPORT REGISTRY NODE_REGISTRY GRAFANA_IMAGE PROMETHEUS_IMAGE \
  ALERTMANAGER_IMAGE ALERTMANAGER_CONFIG SWARM_ENCRYPT SWARM_DIR)

##@ Swarm (multi-host)

.PHONY: nodes-up
nodes-up: ## Start NODES (3) Docker-in-Docker nodes on this host and join them into a swarm, labelled org.mwms.node=node-N
	@$(NODES_SH) up

.PHONY: nodes-down
nodes-down: ## Remove the swarm nodes, their volumes, network and registry (the host engine is never in swarm mode)
	@$(NODES_SH) down

.PHONY: push
push: ## Push the trainer image to REGISTRY=host:port; prints the digest reference nodes pull
	@$(NODES_SH) push "$(TRAINER_IMAGE)" "$(REGISTRY)"

.PHONY: stack-up
stack-up: ## Deploy the run as swarm stack STACK on the nodes (nodes-up, images, push or load, deploy; TRANSPORT=registry|load)
	@compose/swarm/stack-up.sh

.PHONY: stack-down
stack-down: ## Remove stack STACK from the swarm (each node keeps its checkpoint volume: every task's copy; a redeploy resumes)
	@$(MANAGER) stack rm $(STACK)

.PHONY: stack-status
stack-status: ## Where every task of STACK runs and its state, then the per-task training table from its Prometheus
	@$(MANAGER) stack ps $(STACK) --format 'table {{.Name}}\t{{.Node}}\t{{.CurrentState}}\t{{.Error}}'
	@$(PYTHON) -m monitoring.status --no-docker --project $(STACK) --prometheus http://$$($(NODES_SH) ip 1):$(PROMETHEUS_PORT)
