"""What the Kubernetes targets (tfjob, jobset, trainjob) share: names, the pod, the PVC, the PodMonitor.

The trainer pod mirrors the Compose hardening (compose/services.py's trainer service: non-root, read-only
root, every capability dropped, /tmp and /dev/shm scratch, the chief's checkpoint volume); the services
beside the trainers run in the cluster already, so each becomes a Change saying what to use instead.
Not a target itself (a leading underscore: compose.targets.names() skips it).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import contract
from compose import deployment, services
from compose.deployment import Change, Deployment
from compose.targets import Emitted, NotDeployable, Yaml
from trainer.host import (
    ENV_PREFIX,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_GAVE_UP,
    EXIT_MISSING_PEERS,
    EXIT_PEER_FAILED,
)

OUT = ".run/k8s"
REMAKE = "make k8s"
CONTAINER = "tensorflow"
"""The training operator finds the TF port (and exit code) only in a container of this name."""
TF_PORT_NAME = "tfjob-port"
METRICS_PORT_NAME = "metrics"
PERMANENT_EXIT_CODES = (EXIT_FAILED, EXIT_CONFIG, EXIT_MISSING_PEERS, EXIT_GAVE_UP, EXIT_PEER_FAILED)
"""trainer/errors.py: restarting cannot fix these; 128-255 are retryable, as the operator's rule says."""
SHM_SIZE = f"{deployment.SHM_GIB}Gi"
STARTUP_TIMEOUT_S = 1800
"""How long a task waits for its peers to answer (the trainer's --cluster-timeout, 300 s elsewhere):
on a cluster a peer may still be pulling a multi-GB image or waiting for the autoscaler's node, and
missing peers after the wait is a permanent exit (3) that fails the TFJob or JobSet for good."""
PROMETHEUS_CONFIG = (
    Path(__file__).resolve().parents[2] / "monitoring" / "config" / "prometheus" / "prometheus.yml"
)


@dataclass(frozen=True, kw_only=True)
class Names:
    """Where the job lives in the cluster."""

    name: str = contract.DEFAULT_PROJECT
    """TFJob / JobSet name: the prefix of every pod's DNS name (keep it short: DNS labels are 63 chars)."""
    namespace: str = "default"
    storage_class: str = ""
    """StorageClass of the checkpoint PVC; empty uses the cluster's default."""

    def __post_init__(self) -> None:
        for field, value in (("name", self.name), ("namespace", self.namespace)):
            if not re.fullmatch(r"[a-z]([-a-z0-9]{0,38}[a-z0-9])?", value):
                raise ValueError(f"--{field} {value!r}: use lowercase letters, digits and '-' (at most 40)")

    @property
    def labels(self) -> dict[str, str]:
        return {"app.kubernetes.io/name": "mwms-trainer", "app.kubernetes.io/instance": self.name}

    @property
    def claim(self) -> str:
        return f"{self.name}-checkpoints"


def meta(names: Names, name: str) -> dict:
    return {"name": name, "namespace": names.namespace, "labels": names.labels}


def _literal(text: str) -> str:
    """Kubernetes expands $(VAR) in commands and env values; `$$` keeps a `$` literal."""
    return text.replace("$", "$$")


def pvc(d: Deployment, names: Names) -> dict:
    spec: dict = {
        "accessModes": ["ReadWriteOnce"],
        "resources": {"requests": {"storage": d.checkpoint_storage}},
    }
    if names.storage_class:
        spec["storageClassName"] = names.storage_class
    return {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": meta(names, names.claim),
        "spec": spec,
    }


def _container(d: Deployment, cmd: list[str], env: list[dict], name: str) -> dict:
    container = {
        "name": name,
        "image": d.pulled_image,
        "imagePullPolicy": "IfNotPresent",
        "command": [_literal(c) for c in cmd],
        "env": env,
        "ports": [
            {"name": TF_PORT_NAME, "containerPort": deployment.TF_PORT},
            {"name": METRICS_PORT_NAME, "containerPort": deployment.METRICS_PORT},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "runAsNonRoot": True,
            "capabilities": {"drop": ["ALL"]},
        },
        "volumeMounts": [
            {"name": "tmp", "mountPath": "/tmp"},
            {"name": "dshm", "mountPath": "/dev/shm"},
            {"name": "checkpoints", "mountPath": deployment.CHECKPOINT_DIR},
            # TRAINER_LOGDIR must be writable under a read-only root (the chief's scalars, a SCRIPT's).
            {"name": "logs", "mountPath": deployment.LOG_DIR},
        ],
    }
    container["resources"] = resources(d)
    return container


def resources(d: Deployment) -> dict:
    """Requests equal to limits (Guaranteed QoS: evicted last), from the deployment description."""
    amounts = {"cpu": d.cpu, "memory": d.memory}
    if d.gpus_per_task:
        amounts["nvidia.com/gpu"] = str(d.gpus_per_task)
    return {"requests": dict(amounts), "limits": dict(amounts)}


def env(d: Deployment) -> list[dict]:
    values = deployment.trainer_env(d)
    # A longer wait for peers than elsewhere (STARTUP_TIMEOUT_S), unless CLUSTER_TIMEOUT= was given.
    values.setdefault(ENV_PREFIX + "CLUSTER_TIMEOUT", str(STARTUP_TIMEOUT_S))
    return [{"name": k, "value": _literal(v)} for k, v in values.items()]


def pod_template(
    d: Deployment, names: Names, *, chief: bool, cmd: list[str], env: list[dict], container: str = CONTAINER
) -> dict:
    """One task's pod: the Compose hardening, the metrics port annotated for Prometheus, the chief's PVC."""
    checkpoints = {"persistentVolumeClaim": {"claimName": names.claim}} if chief else {"emptyDir": {}}
    spec = {
        # The pause container is PID 1, as tini is in Compose: SIGTERM reaches Python's handler.
        "shareProcessNamespace": True,
        # The trainer never talks to the API server: no token to steal from a compromised pod.
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": deployment.STOP_GRACE_SECONDS,
        "securityContext": {
            "runAsUser": deployment.UID,
            "runAsGroup": deployment.GID,
            "fsGroup": deployment.GID,
            "runAsNonRoot": True,
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "dnsConfig": {"options": [{"name": "timeout", "value": "1"}, {"name": "attempts", "value": "1"}]},
        "containers": [_container(d, cmd, env, container)],
        "volumes": [
            {"name": "tmp", "emptyDir": {}},
            {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHM_SIZE}},
            {"name": "checkpoints", **checkpoints},
            {"name": "logs", "emptyDir": {}},
        ],
    }
    annotations = {
        "prometheus.io/scrape": "true",
        "prometheus.io/port": str(deployment.METRICS_PORT),
        "prometheus.io/path": "/metrics",
    }
    return {"metadata": {"labels": names.labels, "annotations": annotations}, "spec": spec}


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--name", default=Names.name)
    p.add_argument("--namespace", default=Names.namespace)
    p.add_argument("--storage-class", default=Names.storage_class)
    p.add_argument("--checkpoint-storage", default=Deployment.checkpoint_storage)
    p.add_argument("--gpus-per-worker", type=int, default=0, help="nvidia.com/gpu per task (0: CPU)")
    p.add_argument("--cpu-per-task", default=Deployment.cpu, help="CPU request = limit per task")
    p.add_argument("--memory-per-task", default=Deployment.memory, help="memory request = limit per task")


def describe(ns: argparse.Namespace, environ: Mapping[str, str]) -> Deployment:
    names(ns)  # a bad name is bad input before anything is built
    gpu_ids = deployment.fake_gpu_ids(ns.workers, ns.gpus_per_worker)
    return deployment.from_args(
        ns,
        gpu_ids,
        environ=environ,
        checkpoint_storage=ns.checkpoint_storage,
        cpu=ns.cpu_per_task,
        memory=ns.memory_per_task,
    )


def emitted(
    d: Deployment, names: Names, file: str, objects: tuple[dict, ...], changes: list[Change]
) -> Emitted:
    """One Kubernetes target's file: the chief's PVC, the target's objects, the PodMonitor, the
    NetworkPolicy that admits only the job's own pods to the gRPC port."""
    docs = (pvc(d, names), *objects, pod_monitor(d, names), network_policy(names))
    return Emitted(
        files={file: Yaml(docs, dollars=False)}, changes=changes, summary=f"chief + {d.workers} workers"
    )


def names(ns: argparse.Namespace) -> Names:
    return Names(name=ns.name, namespace=ns.namespace, storage_class=ns.storage_class)


def scrape_interval(config: Path = PROMETHEUS_CONFIG) -> str:
    """The project's Prometheus scrape interval, so a PodMonitor scrapes as often as `make up` does."""
    found = re.search(r"^\s*scrape_interval:\s*(\S+)", config.read_text(), re.MULTILINE)
    if not found:
        raise ValueError(f"{config}: no scrape_interval")
    return found.group(1)


def pod_monitor(d: Deployment, names: Names) -> dict:
    # The recording rules, alerts and dashboards select job="trainer" and one project's run
    # (contract/__init__.py): the labels Compose and Swarm write into their file_sd targets.
    labels = {"job": contract.JOB, **deployment.target_labels(d)}
    endpoint = {
        "port": METRICS_PORT_NAME,
        "path": "/metrics",
        "interval": scrape_interval(),
        "honorLabels": True,
        "relabelings": [{"action": "replace", "targetLabel": k, "replacement": v} for k, v in labels.items()],
    }
    return {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "PodMonitor",
        "metadata": meta(names, f"{names.name}-trainer"),
        "spec": {"selector": {"matchLabels": names.labels}, "podMetricsEndpoints": [endpoint]},
    }


def network_policy(names: Names) -> dict:
    """TensorFlow's gRPC port has no authentication: only the job's own pods reach it. The metrics
    port stays open to the cluster's Prometheus, wherever it runs."""
    return {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "NetworkPolicy",
        "metadata": meta(names, f"{names.name}-trainer"),
        "spec": {
            "podSelector": {"matchLabels": names.labels},
            "policyTypes": ["Ingress"],
            "ingress": [
                {
                    "from": [{"podSelector": {"matchLabels": names.labels}}],
                    "ports": [{"protocol": "TCP", "port": deployment.TF_PORT}],
                },
                {"ports": [{"protocol": "TCP", "port": deployment.METRICS_PORT}]},
            ],
        },
    }


COMMON_CHANGES = (
    ("pull_policy: never", "imagePullPolicy: IfNotPresent", "nodes pull the image once"),
    ("init: true", "shareProcessNamespace: true", "the pause container becomes PID 1, as tini is"),
    (
        "user, read_only, cap_drop, no-new-privileges",
        "securityContext",
        "runAsUser/runAsGroup/runAsNonRoot, readOnlyRootFilesystem, drop ALL, allowPrivilegeEscalation false",
    ),
    ("tmpfs /tmp", "emptyDir /tmp", "a writable scratch directory under a read-only root"),
    ("shm_size", f"emptyDir medium Memory at /dev/shm ({SHM_SIZE})", "on every task, not only GPU ones"),
    (
        "volume tensorboard-logs",
        f"emptyDir {deployment.LOG_DIR} per pod",
        "no TensorBoard in the cluster: mount a shared volume there to keep the summaries",
    ),
    (
        "networks: cluster (internal)",
        "NetworkPolicy",
        "only the job's pods reach the gRPC port; the metrics port is open to the cluster's Prometheus",
    ),
    ("dns_opt", "dnsConfig.options timeout:1 attempts:1", "outside names fail fast"),
    (
        "Prometheus file_sd targets",
        "prometheus.io/* pod annotations and a PodMonitor",
        f"Prometheus discovers the pods; the PodMonitor relabels job to {contract.JOB}",
    ),
)


def common_changes(d: Deployment) -> list[Change]:
    changes = [
        Change("build", "", f"Kubernetes pulls images: push {d.pulled_image} where nodes pull from"),
        *(Change(*c) for c in COMMON_CHANGES),
        Change(
            "volume checkpoints",
            f"PVC {d.checkpoint_storage}",
            "mounted by the chief; workers get an emptyDir",
        ),
        Change(
            "no resource limits",
            f"requests = limits: cpu {d.cpu}, memory {d.memory} per task",
            "Guaranteed QoS, evicted last (CPU_PER_TASK=, MEMORY_PER_TASK=)",
        ),
        Change(
            "service-account token", "automountServiceAccountToken: false", "the trainer never calls the API"
        ),
    ]
    if "cluster_timeout" not in dict(d.knobs):
        changes.append(
            Change(
                "cluster_timeout 300 s",
                f"{ENV_PREFIX}CLUSTER_TIMEOUT={STARTUP_TIMEOUT_S}",
                "peers may wait for scheduling (an image pull, the autoscaler); CLUSTER_TIMEOUT= overrides",
            )
        )
    if d.gpu_ids:
        changes.append(
            Change(
                "GPU device_ids",
                f"limits nvidia.com/gpu: {d.gpus_per_task}",
                "the scheduler picks the devices",
            )
        )
    changes += service_changes()
    for what, path in (("script", d.script), ("data", d.data)):
        if path:
            changes.append(
                Change(
                    f"{what} bind {path}",
                    "",
                    "host paths do not exist on cluster nodes: "
                    "bake it into the image or mount a volume yourself",
                )
            )
    return changes


def service_changes() -> list[Change]:
    """The services beside the trainers: a cluster has its own (compose/services.py `elsewhere`)."""
    return [
        Change(f"service {s.name}", "", s.elsewhere or f"run {s.image} in the cluster yourself")
        for s in services.SERVICES
    ]


def deploy(place, engine, services=()) -> None:
    """Kubernetes targets emit only: no API server is reached from here (docs/multi-host.md)."""
    raise NotDeployable(
        f"{place.out}: Kubernetes manifests are applied with your cluster's tools (kubectl apply -f {place.out}); "
        "make k8s writes them, this project reaches no API server"
    )


def undeploy(place, engine, volumes=False) -> None:
    raise NotDeployable(f"{place.out}: remove them with your cluster's tools (kubectl delete -f {place.out})")
