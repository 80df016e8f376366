"""Kubernetes with JobSet: `make k8s` writes .run/k8s/jobset.yaml (no training operator needed).

jobset.yaml: the chief's checkpoint PVC, the JobSet (replicated jobs `chief` and `worker`, whole-gang
restarts, permanent exit codes fail it at once), a PodMonitor. TF_CONFIG is built at start by
trainer.cluster.jobset_entry from the pod's JobSet annotations and JOB_COMPLETION_INDEX.
"""

from __future__ import annotations

import argparse

import contract
from compose import deployment
from compose.deployment import Change, Deployment
from compose.targets import Emitted, _kube
from compose.targets._kube import OUT, REMAKE, add_arguments, deploy, describe, undeploy  # noqa: F401 (the Target protocol)
from trainer.host import jobset_entry
from trainer.host import supervisor as supervise

TITLE = "k8s JobSet"


def emit(d: Deployment, ns: argparse.Namespace) -> Emitted:
    names = _kube.names(ns)
    return _kube.emitted(d, names, "jobset.yaml", (jobset(d, names),), jobset_changes(d))


def _jobset_env(d: Deployment) -> list[dict]:
    def annotation(var: str, key: str) -> dict:
        return {"name": var, "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{key}']"}}}

    return [
        annotation(jobset_entry.ENV_JOBSET, jobset_entry.JOBSET_NAME_KEY),
        annotation(jobset_entry.ENV_REPLICATED_JOB, jobset_entry.REPLICATED_JOB_KEY),
        {"name": jobset_entry.ENV_WORKERS, "value": str(d.workers)},
        *_kube.env(d),
    ]


def _replicated_job(d: Deployment, names: _kube.Names, rjob: str, pods: int, container: str) -> dict:
    cmd = ["python", "-m", "trainer.cluster.jobset_entry", *deployment.command(d)]
    chief = rjob == contract.CHIEF
    template = _kube.pod_template(d, names, chief=chief, cmd=cmd, env=_jobset_env(d), container=container)
    template["spec"]["restartPolicy"] = "Never"  # podFailurePolicy requires it; JobSet restarts the gang
    job = {
        "parallelism": pods,
        "completions": pods,
        "completionMode": "Indexed",
        "backoffLimit": 0,
        "podFailurePolicy": {
            "rules": [
                {
                    "action": "FailJob",
                    "onExitCodes": {
                        "containerName": container,
                        "operator": "In",
                        "values": list(_kube.PERMANENT_EXIT_CODES),
                    },
                }
            ]
        },
        "template": template,
    }
    return {"name": rjob, "replicas": 1, "template": {"spec": job}}


def jobset(d: Deployment, names: _kube.Names) -> dict:
    return {
        "apiVersion": "jobset.x-k8s.io/v1alpha2",
        "kind": "JobSet",
        "metadata": _kube.meta(names, names.name),
        "spec": spec(d, names),
    }


def spec(d: Deployment, names: _kube.Names, container: str = _kube.CONTAINER) -> dict:
    """The JobSet spec: replicated jobs `chief` (1 pod) and `worker` (one pod per worker), the pods'
    container named `container` (a Kubeflow Trainer runtime wants `node`)."""
    rjobs = [_replicated_job(d, names, contract.CHIEF, 1, container)]
    if d.workers:
        rjobs.append(_replicated_job(d, names, contract.WORKER, d.workers, container))
    return {
        "network": {"enableDNSHostnames": True, "publishNotReadyAddresses": True},
        "successPolicy": {"operator": "All", "targetReplicatedJobs": [contract.CHIEF]},
        # Any failed pod fails its Job (backoffLimit 0), which restarts every Job: MWMS cannot go on
        # without a peer. A permanent exit code fails the Job by PodFailurePolicy: then stop for good.
        "failurePolicy": {
            "maxRestarts": d.max_restarts,
            "rules": [
                {
                    "name": "permanentExitCode",
                    "action": "FailJobSet",
                    "onJobFailureReasons": ["PodFailurePolicy"],
                }
            ],
        },
        "replicatedJobs": rjobs,
    }


def jobset_changes(d: Deployment) -> list[Change]:
    codes = ",".join(map(str, _kube.PERMANENT_EXIT_CODES))
    return [
        *_kube.common_changes(d),
        Change(
            "TF_CONFIG",
            "built at start by trainer.cluster.jobset_entry",
            "from the JobSet annotations and JOB_COMPLETION_INDEX",
        ),
        Change(
            f"trainer.supervise.supervisor, {supervise.MAX_RESTARTS_ENV}={d.max_restarts}",
            f"the same in-pod supervisor, plus failurePolicy.maxRestarts {d.max_restarts}",
            f"the supervisor restarts the trainer inside the pod; a failed pod (killed, node lost) "
            f"restarts the whole gang; exit codes {codes} fail the JobSet at once",
        ),
    ]
