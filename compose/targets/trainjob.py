"""Kubernetes with Kubeflow Trainer v2: a TrainJob and the TrainingRuntime it runs (.run/k8s/trainjob.yaml).

Trainer v2 dropped the TFJob (kubeflow/trainer#2699: TFJob v1 lives on only in the training
operator's release-1.9 branch). Its runtimes are JobSet templates, so this target is the JobSet
target's spec (compose/targets/jobset.py) inside a namespaced TrainingRuntime:
  - replicated jobs `chief` (1 pod) and `worker`; the worker job is the runtime's trainer step
    (label trainer.kubeflow.org/trainjob-ancestor-step: trainer, container `node`, replicas 1: what
    the Trainer's admission webhook requires), so the TrainJob's `trainer.numNodes` is the number of
    workers; with no workers the chief is the trainer step;
  - TF_CONFIG is built in each pod by trainer.cluster.jobset_entry from the JobSet annotations the Trainer's
    JobSet carries (its JobSet is named after the TrainJob) and JOB_COMPLETION_INDEX;
  - no mlPolicy framework (torch, mpi, jax): the Trainer's PlainML plugin only sets the trainer
    step's pod count from numNodes and adds the TrainJob's env.
trainjob.yaml holds the chief's checkpoint PVC, the TrainingRuntime, the TrainJob and a PodMonitor;
`kubectl apply -f` it on a cluster with Kubeflow Trainer v2.3 (and JobSet) installed.
"""

from __future__ import annotations

import argparse

import contract
from compose.deployment import Change, Deployment
from compose.targets import Emitted, _kube, jobset
from compose.targets._kube import OUT, REMAKE, add_arguments, deploy, describe, undeploy  # noqa: F401 (the Target protocol)

TITLE = "k8s TrainJob"
API_VERSION = "trainer.kubeflow.org/v1alpha1"
CONTAINER = "node"
"""The container the Trainer treats as the trainer step's (its webhook rejects a runtime without it)."""
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"


def emit(d: Deployment, ns: argparse.Namespace) -> Emitted:
    names = _kube.names(ns)
    return _kube.emitted(
        d,
        names,
        "trainjob.yaml",
        (training_runtime(d, names), train_job(d, names)),
        trainjob_changes(d, names),
    )


def runtime_name(names: _kube.Names) -> str:
    return f"{names.name}-tensorflow"


def trainer_step(d: Deployment) -> str:
    """The replicated job whose pod count the TrainJob's numNodes sets: the workers, or a lone chief."""
    return contract.WORKER if d.workers else contract.CHIEF


def training_runtime(d: Deployment, names: _kube.Names) -> dict:
    spec = jobset.spec(d, names, container=CONTAINER)
    for rjob in spec["replicatedJobs"]:
        if rjob["name"] == trainer_step(d):
            rjob["template"] = {"metadata": {"labels": {ANCESTOR_LABEL: "trainer"}}, **rjob["template"]}
    meta = _kube.meta(names, runtime_name(names))
    meta["labels"] = {**meta["labels"], FRAMEWORK_LABEL: "tensorflow"}
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainingRuntime",
        "metadata": meta,
        "spec": {"mlPolicy": {"numNodes": _nodes(d)}, "template": {"spec": spec}},
    }


def _nodes(d: Deployment) -> int:
    return d.workers or 1


def train_job(d: Deployment, names: _kube.Names) -> dict:
    return {
        "apiVersion": API_VERSION,
        "kind": "TrainJob",
        "metadata": _kube.meta(names, names.name),
        "spec": {
            "runtimeRef": {
                "apiGroup": API_VERSION.split("/")[0],
                "kind": "TrainingRuntime",
                "name": runtime_name(names),
            },
            "trainer": {"numNodes": _nodes(d)},
        },
    }


def trainjob_changes(d: Deployment, names: _kube.Names) -> list[Change]:
    step = trainer_step(d)
    return [
        *jobset.jobset_changes(d),
        Change(
            "the JobSet",
            f"TrainingRuntime {runtime_name(names)} (its JobSet template) and TrainJob {names.name}",
            f"Trainer v2 creates the JobSet, named after the TrainJob; the `{step}` replicated job is the "
            f"trainer step (container `{CONTAINER}`), so trainer.numNodes {_nodes(d)} is its pod count",
        ),
        Change(
            "image, command, environment",
            "in the TrainingRuntime, for both replicated jobs",
            f"a TrainJob's trainer.image/command/env reach only the trainer step ({step}); "
            "the chief must run the same image and command",
        ),
        Change(
            "WORKERS",
            f"TrainJob trainer.numNodes and the runtime's JOBSET_WORKERS, both {d.workers}",
            "TF_CONFIG lists JOBSET_WORKERS workers: change the number with `make k8s WORKERS=N`, "
            "not by editing numNodes alone",
        ),
    ]
