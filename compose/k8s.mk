# Kubernetes manifests (TFJob v1, JobSet, Kubeflow Trainer v2 TrainJob) from the same Deployment
# description as `make up`: one `python -m compose.emit --target T` per target in K8S_TARGETS.
# Included by the top Makefile; WORKERS, IMAGE_REPO, MAX_RESTARTS and RUN_DIR are compose/compose.mk's.
# Trainer knobs (STEPS=, TASK=, any trainer flag upper-cased) reach every target through the environment
# (compose/knobs.py).

K8S_DIR ?= $(RUN_DIR)/k8s
K8S_NAME ?= $(DEFAULT_PROJECT)
K8S_NAMESPACE ?= default
K8S_GPUS ?= 0
K8S_STORAGE ?= 1Gi
K8S_STORAGE_CLASS ?=
# Each task's CPU and memory, requests = limits (Guaranteed QoS); empty: compose/deployment.py's defaults.
CPU_PER_TASK ?=
MEMORY_PER_TASK ?=
# A pinned reference (what `make push REGISTRY=...` prints); empty uses IMAGE_REPO:<version>-<cpu|gpu>.
K8S_IMAGE ?=
K8S_TARGETS ?= tfjob jobset trainjob

$(call pass_env,k8s,K8S_TARGETS WORKERS K8S_DIR K8S_NAME K8S_NAMESPACE K8S_GPUS IMAGE_REPO MAX_RESTARTS \
  K8S_STORAGE K8S_STORAGE_CLASS K8S_IMAGE ARGS CPU_PER_TASK MEMORY_PER_TASK)
$(call pass_env,test-k8s,PYTEST_ARGS)

##@ Kubernetes

.PHONY: k8s
k8s: ## Write RUN_DIR/k8s/<target>.yaml for each of K8S_TARGETS (tfjob jobset trainjob), K8S_NAME=, ...
	@set -e; for target in $$K8S_TARGETS; do \
	  "$$PYTHON" -m compose.emit --target "$$target" --workers "$$WORKERS" --out "$$K8S_DIR" --name "$$K8S_NAME" \
	    --namespace "$$K8S_NAMESPACE" --gpus-per-worker "$$K8S_GPUS" --image-repo "$$IMAGE_REPO" \
	    --max-restarts "$$MAX_RESTARTS" --checkpoint-storage "$$K8S_STORAGE" --storage-class "$$K8S_STORAGE_CLASS" \
	    --image "$$K8S_IMAGE" --args "$$ARGS" --project "$$K8S_NAME" \
	    $(if $(CPU_PER_TASK),--cpu-per-task "$$CPU_PER_TASK") $(if $(MEMORY_PER_TASK),--memory-per-task "$$MEMORY_PER_TASK"); \
	done

.PHONY: test-k8s
test-k8s: $(VENV)/.stamp ## Validate the manifests offline and run a cluster under the operator's TF_CONFIG
	$(call with_args,PYTEST_ARGS) $(PY) -m pytest tests/unit/test_deployment.py tests/unit/test_k8s_manifests.py tests/unit/test_k8s_tf_config.py tests/unit/test_trainjob_manifests.py \
	  tests/cluster/test_k8s_names.py

golden: golden-k8s
.PHONY: golden-k8s
golden-k8s: $(VENV)/.stamp ## Regenerate the Kubernetes golden files (tests/golden/*.tfjob.yaml, ...) after an intended change
	UPDATE_GOLDEN=1 $(PY) -m pytest -q tests/unit/test_k8s_manifests.py -k golden
