"""The cluster spec: one model that parses TF_CONFIG (trainer) and writes it (compose generator).

Pure Python on purpose: it must reject a bad TF_CONFIG in milliseconds, before TensorFlow is
imported, because TensorFlow reports most mistakes late, vaguely, or by hanging forever
(an index given as the string "1" is accepted and then never forms a cluster).
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
from dataclasses import dataclass

import contract

CHIEF, WORKER = contract.CHIEF, contract.WORKER
TASK_TYPES = (CHIEF, WORKER)
DEFAULT_PORT = contract.TF_PORT
EVERY_ADDRESS = "0.0.0.0"
LOOPBACK = "127.0.0.1"


class ClusterSpecError(ValueError):
    """A TF_CONFIG that cannot form a MultiWorkerMirroredStrategy cluster; the message names the fix."""


@dataclass(frozen=True, order=True)
class TaskId:
    type: str
    index: int

    @property
    def name(self) -> str:
        """The task's name in logs, compose services and DNS: `chief`, `worker-0`, ..."""
        return contract.task_name(self.type, self.index)


@dataclass(frozen=True)
class ClusterSpec:
    """Every task's address plus the task this process is.

    `chief` holds zero or one address; `worker` one or more (a chief-less cluster has worker-0
    acting as chief, as in TensorFlow).
    """

    chief: tuple[str, ...]
    worker: tuple[str, ...]
    task: TaskId

    def __post_init__(self) -> None:
        _validate(self)

    @property
    def tasks(self) -> tuple[TaskId, ...]:
        chief = tuple(TaskId(CHIEF, i) for i in range(len(self.chief)))
        return chief + tuple(TaskId(WORKER, i) for i in range(len(self.worker)))

    @property
    def num_tasks(self) -> int:
        return len(self.chief) + len(self.worker)

    @property
    def is_chief(self) -> bool:
        if self.chief:
            return self.task.type == CHIEF
        return self.task == TaskId(WORKER, 0)

    @property
    def peers(self) -> tuple[TaskId, ...]:
        return tuple(t for t in self.tasks if t != self.task)

    def address(self, task: TaskId) -> str:
        return (self.chief if task.type == CHIEF else self.worker)[task.index]

    @property
    def listen_host(self) -> str:
        """Where this task's own listeners (metrics, the preflight listener) bind: its TF_CONFIG host when
        that is an IPv4 loopback address (`localhost`: 127.0.0.1), the local clusters bench.launch starts,
        so nothing of theirs is reachable from another machine; else every address (a container, reached
        by its service name on its network). TensorFlow's own gRPC server is not ours to place: TF 2.21
        binds `0.0.0.0:<port>` whatever the host (grpc_server_lib.cc), which gRPC opens as `[::]`."""
        return listen_host(self.address(self.task))

    def with_task(self, task: TaskId) -> ClusterSpec:
        return ClusterSpec(chief=self.chief, worker=self.worker, task=task)

    def cluster_dict(self) -> dict[str, list[str]]:
        jobs = {CHIEF: list(self.chief), WORKER: list(self.worker)}
        return {job: addrs for job, addrs in jobs.items() if addrs}

    def to_tf_config(self) -> str:
        """TF_CONFIG as TensorFlow reads it; compact and key-sorted so generated files are stable."""
        doc = {"cluster": self.cluster_dict(), "task": {"type": self.task.type, "index": self.task.index}}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"))

    def fingerprint(self) -> int:
        """A 52-bit hash of the cluster (not of this task), exact in a float64 all-reduce."""
        digest = hashlib.sha256(json.dumps(self.cluster_dict(), sort_keys=True).encode()).digest()
        return int.from_bytes(digest[:8], "big") >> 12


def listen_host(address: str) -> str:
    """`host:port` -> the address a listener of that task binds (ClusterSpec.listen_host)."""
    host = address.rpartition(":")[0]
    if host == "localhost":
        return LOOPBACK
    try:
        ip = ipaddress.ip_address(host)
    except ValueError:
        return EVERY_ADDRESS
    return host if ip.version == 4 and ip.is_loopback else EVERY_ADDRESS


# Where each target's DNS puts a task. Fields: {service} (`chief`, `worker-0`), {type} and {rjob}
# (`chief`, `worker`), {i} (index), {port}, plus the names a target passes (job, namespace, jobset).
COMPOSE_ADDRESS = "{service}:{port}"
"""Compose and Swarm: one service per task, named after it."""
TFJOB_ADDRESS = "{job}-{type}-{i}.{namespace}.svc:{port}"
"""Kubeflow training operator v1: a headless Service per pod (genClusterSpec in its tensorflow
controller; it appends `.<domain>` only when CUSTOM_CLUSTER_DOMAIN is set)."""
JOBSET_ADDRESS = "{jobset}-{rjob}-0-{i}.{jobset}:{port}"
"""JobSet: pod hostname `<jobset>-<replicatedJob>-<jobIndex>-<podIndex>` under the subdomain the
JobSet names after itself; one Job per replicated job, so the job index is always 0."""


def from_template(num_workers: int, template: str, *, port: int = DEFAULT_PORT, **names: str) -> ClusterSpec:
    """A chief plus `num_workers` workers, each address rendered from `template` (the chief's view)."""
    if num_workers < 0:
        raise ClusterSpecError(f"WORKERS={num_workers}: must be 0 or more (a chief plus N workers)")
    tasks = [TaskId(CHIEF, 0)] + [TaskId(WORKER, i) for i in range(num_workers)]
    try:
        addrs = [
            template.format(service=t.name, type=t.type, rjob=t.type, i=t.index, port=port, **names)
            for t in tasks
        ]
    except KeyError as err:
        raise ClusterSpecError(f"address template {template!r} needs a value for {err.args[0]}") from None
    return ClusterSpec(chief=(addrs[0],), worker=tuple(addrs[1:]), task=TaskId(CHIEF, 0))


def for_hosts(num_workers: int, port: int = DEFAULT_PORT) -> ClusterSpec:
    """A chief plus `num_workers` workers addressed by service name (`chief:2222`, `worker-0:2222`)."""
    return from_template(num_workers, COMPOSE_ADDRESS, port=port)


def on_ports(host: str, ports: list[int]) -> ClusterSpec:
    """A chief on ports[0] and a worker on each further port, all on one host (the local launcher)."""
    if not ports:
        raise ClusterSpecError("ports: give at least one port (the chief's)")
    return ClusterSpec(
        chief=(f"{host}:{ports[0]}",),
        worker=tuple(f"{host}:{p}" for p in ports[1:]),
        task=TaskId(CHIEF, 0),
    )


def parse_tf_config(text: str | None) -> ClusterSpec | None:
    """Parse TF_CONFIG; None (absent or blank) means a single-process run."""
    if text is None or not text.strip():
        return None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError as err:
        raise ClusterSpecError(
            f"TF_CONFIG is not valid JSON ({err.msg} at char {err.pos}); "
            'expected {"cluster": {...}, "task": {"type": ..., "index": ...}}'
        ) from None
    if not isinstance(doc, dict):
        raise ClusterSpecError('TF_CONFIG must be a JSON object with keys "cluster" and "task"')
    cluster = _parse_cluster(doc.get("cluster"))
    task = _parse_task(doc.get("task"))
    return ClusterSpec(chief=cluster.get(CHIEF, ()), worker=cluster.get(WORKER, ()), task=task)


def _parse_cluster(cluster: object) -> dict[str, tuple[str, ...]]:
    if not isinstance(cluster, dict) or not cluster:
        raise ClusterSpecError(
            "TF_CONFIG.cluster is missing or empty; give e.g. "
            '{"chief": ["chief:2222"], "worker": ["worker-0:2222"]}'
        )
    for job, addrs in cluster.items():
        if job == "ps":
            raise ClusterSpecError(
                "TF_CONFIG.cluster.ps: parameter servers are not used by "
                'MultiWorkerMirroredStrategy; remove the "ps" job'
            )
        if job not in TASK_TYPES:
            raise ClusterSpecError(f'TF_CONFIG.cluster.{job}: unknown job; use only "chief" and "worker"')
        if not isinstance(addrs, list) or not all(isinstance(a, str) for a in addrs):
            raise ClusterSpecError(f'TF_CONFIG.cluster.{job} must be a list of "host:port" strings')
        if not addrs:
            raise ClusterSpecError(
                f"TF_CONFIG.cluster.{job} is an empty list; add addresses or remove the key"
            )
    return {job: tuple(addrs) for job, addrs in cluster.items()}


def _parse_task(task: object) -> TaskId:
    if not isinstance(task, dict):
        raise ClusterSpecError('TF_CONFIG.task is missing; give {"type": "chief"|"worker", "index": N}')
    kind, index = task.get("type"), task.get("index", 0)
    if kind not in TASK_TYPES:
        raise ClusterSpecError(f'TF_CONFIG.task.type {kind!r} is not supported; use "chief" or "worker"')
    if isinstance(index, bool) or not isinstance(index, int):
        raise ClusterSpecError(
            f"TF_CONFIG.task.index {index!r} must be a JSON integer, not "
            f'{type(index).__name__}; write "index": {_as_int_hint(index)}'
        )
    return TaskId(kind, index)


def _as_int_hint(value: object) -> str:
    return str(value) if isinstance(value, str) and value.isdigit() else "0"


def _validate(spec: ClusterSpec) -> None:
    if not spec.worker and not spec.chief:
        raise ClusterSpecError("TF_CONFIG.cluster has no tasks; give a chief and/or workers")
    if len(spec.chief) > 1:
        raise ClusterSpecError(
            f"TF_CONFIG.cluster.chief has {len(spec.chief)} addresses; a cluster has exactly one chief"
        )
    for job, addrs in ((CHIEF, spec.chief), (WORKER, spec.worker)):
        for i, addr in enumerate(addrs):
            _validate_address(f"TF_CONFIG.cluster.{job}[{i}]", addr)
    _validate_unique(spec)
    _validate_task(spec)


def _validate_address(field: str, addr: str) -> None:
    host, sep, port = addr.rpartition(":")
    if not sep or not host:
        raise ClusterSpecError(f'{field} {addr!r} must be "host:port", e.g. "worker-0:{DEFAULT_PORT}"')
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ClusterSpecError(f"{field} {addr!r}: port {port!r} must be a number from 1 to 65535")


def _validate_unique(spec: ClusterSpec) -> None:
    seen: dict[str, str] = {}
    for task in spec.tasks:
        addr = spec.address(task)
        if addr in seen:
            raise ClusterSpecError(
                f"TF_CONFIG.cluster: {task.name} and {seen[addr]} share the address "
                f"{addr!r}; give every task its own host:port"
            )
        seen[addr] = task.name


def _validate_task(spec: ClusterSpec) -> None:
    count = len(spec.chief) if spec.task.type == CHIEF else len(spec.worker)
    if count == 0:
        raise ClusterSpecError(
            f'TF_CONFIG.task.type "{spec.task.type}" has no addresses in '
            f"TF_CONFIG.cluster; add a {spec.task.type} job or fix the task type"
        )
    if not 0 <= spec.task.index < count:
        raise ClusterSpecError(
            f"TF_CONFIG.task.index {spec.task.index} is out of range for "
            f'"{spec.task.type}" (valid: 0..{count - 1})'
        )
