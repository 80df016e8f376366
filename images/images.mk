# Trainer image variants. Included by the top Makefile after compose/compose.mk, whose `images` target
# builds what `make up` would on this host (the GPU image only where GPUs are detected).
# VARIANT=gpu builds the CUDA image on any host, GPU or not, through the same path as `make up GPUS=N`:
# the generated GPU overlay supplies the image tag and VARIANT=gpu, images.sh the wheelhouse.
VARIANT ?=

ifeq ($(VARIANT),gpu)
# A chief holding GPU 0 is the smallest layout that renders the GPU overlay; the build does not depend
# on WORKERS. Its own RUN_DIR leaves a running stack's generated files alone.
images: override export WORKERS := 0
images: override export GPUS := 1
images: override export GPUS_PER_WORKER := 1
images: override export RUN_DIR := $(RUN_DIR)/images-gpu
else ifeq ($(VARIANT),cpu)
images: override export GPUS := 0
else ifneq ($(VARIANT),)
$(error VARIANT=$(VARIANT): use VARIANT=cpu or VARIANT=gpu, or leave it unset to build what `make up` would)
endif

##@ Setup

.PHONY: images-gpu
images-gpu: ## Build the GPU trainer image (CUDA wheels) on any host: make images VARIANT=gpu
	@$(MAKE) --no-print-directory images VARIANT=gpu
