"""Kubernetes with the Kubeflow training operator v1: a TFJob (`make k8s` writes .run/k8s/tfjob.yaml).

tfjob.yaml: the chief's checkpoint PVC, the TFJob (Chief + Worker, ExitCode restarts), a PodMonitor;
`kubectl apply -f` it. The operator writes TF_CONFIG (trainer.cluster.spec's TFJOB_ADDRESS).
"""

from __future__ import annotations

import argparse

from compose import deployment
from compose.deployment import Change, Deployment
from compose.targets import Emitted, _kube
from compose.targets._kube import OUT, REMAKE, add_arguments, deploy, describe, undeploy  # noqa: F401 (the Target protocol)
from trainer.host import TFJOB_ADDRESS
from trainer.host import supervisor as supervise

TITLE = "k8s TFJob"


def emit(d: Deployment, ns: argparse.Namespace) -> Emitted:
    names = _kube.names(ns)
    return _kube.emitted(d, names, "tfjob.yaml", (tfjob(d, names),), tfjob_changes(d))


def tfjob(d: Deployment, names: _kube.Names) -> dict:
    def replica(count: int, chief: bool) -> dict:
        return {
            "replicas": count,
            "restartPolicy": "ExitCode",
            "template": _kube.pod_template(
                d, names, chief=chief, cmd=deployment.command(d), env=_kube.env(d)
            ),
        }

    specs = {"Chief": replica(1, True)}
    if d.workers:
        specs["Worker"] = replica(d.workers, False)
    return {
        "apiVersion": "kubeflow.org/v1",
        "kind": "TFJob",
        "metadata": _kube.meta(names, names.name),
        "spec": {
            "runPolicy": {"backoffLimit": d.max_restarts, "cleanPodPolicy": "None"},
            "tfReplicaSpecs": specs,
        },
    }


def tfjob_changes(d: Deployment) -> list[Change]:
    budget = (
        f"the same in-pod supervisor, plus restartPolicy ExitCode, backoffLimit {d.max_restarts}",
        (
            "the supervisor restarts the trainer inside the pod by exit code (budget renewed by each "
            "checkpoint, exit 4 when spent); a pod that ends 128-255 (killed, node lost) is recreated, any "
            "other code fails the job; backoffLimit counts container restarts, which stay 0 when pods are "
            "recreated, so only the supervisor's budget bounds retries"
        ),
    )
    return [
        *_kube.common_changes(d),
        Change("TF_CONFIG", "written by the operator", f"addresses {TFJOB_ADDRESS}"),
        Change(f"trainer.supervise.supervisor, {supervise.MAX_RESTARTS_ENV}={d.max_restarts}", *budget),
    ]
