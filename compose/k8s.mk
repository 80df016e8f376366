# Kubernetes manifests (TFJob v1 and JobSet) from the same Deployment description as `make up`.
# Included by the top Makefile (which defines PYTHON, VENV, PY and RUN_DIR); WORKERS, IMAGE_REPO,
# MAX_RESTARTS and the trainer knobs (STEPS, ...) are compose/compose.mk's.

K8S_DIR ?= $(RUN_DIR)/k8s
K8S_NAME ?= mwms
K8S_NAMESPACE ?= default
K8S_GPUS ?= 0
K8S_STORAGE ?= 1Gi
K8S_STORAGE_CLASS ?=
K8S_KNOBS = $(if $(STEPS),--steps $(STEPS)) $(if $(TASK),--task $(TASK)) \
            $(if $(PER_REPLICA_BATCH),--per-replica-batch $(PER_REPLICA_BATCH)) $(if $(STRATEGY),--strategy $(STRATEGY)) \
            $(if $(SAVE_EVERY),--save-every $(SAVE_EVERY)) $(if $(CLUSTER_TIMEOUT),--cluster-timeout $(CLUSTER_TIMEOUT))

##@ Kubernetes

.PHONY: k8s
k8s: ## Write .run/k8s/tfjob.yaml and jobset.yaml for a chief + WORKERS (K8S_NAME, K8S_NAMESPACE, K8S_GPUS per task, IMAGE_REPO=a registry the cluster pulls from) and print the translation reports
	$(PYTHON) -m compose.k8s --workers $(WORKERS) --out $(K8S_DIR) --name $(K8S_NAME) --namespace $(K8S_NAMESPACE) \
	  --gpus-per-worker $(K8S_GPUS) --image-repo $(IMAGE_REPO) --max-restarts $(MAX_RESTARTS) \
	  --checkpoint-storage $(K8S_STORAGE) --storage-class '$(K8S_STORAGE_CLASS)' $(K8S_KNOBS) --args '$(ARGS)'

.PHONY: test-k8s
test-k8s: $(VENV)/.stamp ## Validate the manifests offline (operator SDK round trip, kubernetes-validate --strict, golden) and run a cluster under the operator's TF_CONFIG
	$(PY) -m pytest tests/unit/test_deployment.py tests/unit/test_k8s_manifests.py tests/unit/test_k8s_tf_config.py \
	  tests/cluster/test_k8s_names.py $(PYTEST_ARGS)

golden: golden-k8s
.PHONY: golden-k8s
golden-k8s: $(VENV)/.stamp ## Regenerate the Kubernetes golden files (tests/golden/*.tfjob.yaml, *.jobset.yaml) after an intended change
	UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/unit/test_k8s_manifests.py -k golden
