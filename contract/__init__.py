"""The telemetry contract: every metric, label, port and task name, written once.

Standard library only: the trainer (in the container), the compose generator and the monitoring
tools on the host all import it, and tests freeze it. Exporter, recording rules, alerts, dashboards,
`make status`, `make diagnose` and `make report` read names from here; nothing else spells them.

Names follow Prometheus conventions (one prefix, base units, `_total` on counters), and each is
built by one function from its parts, as prometheus_client's `_build_full_name` does.
"""

from __future__ import annotations

from dataclasses import dataclass

NAMESPACE = "trainer"
LABELS = ("task_type", "task_index")
"""Every trainer series carries exactly these two labels (and Prometheus adds job and instance)."""
TASK_TYPE, TASK_INDEX = LABELS
JOB = "trainer"
"""Prometheus scrape job of the trainers (monitoring/config/prometheus/prometheus.yml)."""
PROJECT_LABEL, RUN_LABEL = "project", "run"
TARGET_LABELS = (PROJECT_LABEL, RUN_LABEL)
"""Labels Prometheus attaches to every trainer series from its scrape target (the emitters write them
into the targets, so the exporter knows nothing of them): which stack (Compose project, Swarm stack)
and which run of it (a new id at every `make up`). Queries of one run select both; another run stays
queryable by its id."""

METRICS_PORT = 8000
"""Every task's /metrics port inside the cluster network (never published)."""
TF_PORT = 2222
"""Every task's TensorFlow gRPC port (the TFJob convention)."""
PROMETHEUS_PORT = 9090
"""Prometheus' port, in its container and where it is published (on BIND_ADDR)."""
GRAFANA_PORT = 3000
"""Grafana's port, in its container and where it is published (on BIND_ADDR)."""
ALERTMANAGER_PORT = 9093
"""Alertmanager's port, in its container and where it is published (on BIND_ADDR)."""
TENSORBOARD_PORT = 6006
"""TensorBoard's web UI, in its container and where it is published (on BIND_ADDR)."""
PROFILER_PORT = 6009
"""Every task's TensorFlow profiler server inside the cluster network (never published; `make profile`)."""

DEFAULT_PROJECT = "mwms"
"""Compose project, Swarm stack and Kubernetes job name when PROJECT (STACK, K8S_NAME) is not given."""
DEFAULT_WORKERS = 2
"""Workers besides the chief when WORKERS is not given: three tasks."""
DEFAULT_MAX_RESTARTS = 3
"""Automatic restarts of a task before the run fails for good, when MAX_RESTARTS is not given."""

SHARED_SETTINGS = (
    "METRICS_PORT",
    "TF_PORT",
    "PROMETHEUS_PORT",
    "GRAFANA_PORT",
    "ALERTMANAGER_PORT",
    "TENSORBOARD_PORT",
    "DEFAULT_PROJECT",
    "DEFAULT_WORKERS",
    "DEFAULT_MAX_RESTARTS",
)
"""The ports and defaults make and the shell scripts read from here (`python3 -m contract --make`,
`--shell`): written once, in this file."""

CHIEF, WORKER = "chief", "worker"
STATES = ("starting", "waiting_for_peers", "training", "checkpointing", "done", "failed")
"""Values of the STATE enum."""

COUNTER, GAUGE, HISTOGRAM, INFO, ENUM = "counter", "gauge", "histogram", "info", "enum"


def task_name(task_type: str, task_index: int | str) -> str:
    """A task's one name in logs, compose services, DNS, status, diagnose and reports:
    `chief`, `worker-0`, `worker-1`, ..."""
    return CHIEF if task_type == CHIEF else f"{task_type}-{task_index}"


def task_labels(name: str) -> tuple[str, str]:
    """(task_type, task_index) of a task name: the inverse of task_name."""
    if name == CHIEF:
        return CHIEF, "0"
    task_type, _, index = name.rpartition("-")
    return task_type, index


def task_order(name: str) -> tuple[int, int]:
    """Sort key: the chief first, then workers by index (worker-10 after worker-9)."""
    if name == CHIEF:
        return (0, 0)
    _, _, index = name.rpartition("-")
    return (1, int(index)) if index.isdigit() else (2, 0)


def task_of(labels: dict) -> str:
    """The task name of a Prometheus series from its labels; `?` for a label that is missing."""
    return task_name(labels.get(TASK_TYPE, "?"), labels.get(TASK_INDEX, "0"))


def full_name(name: str, *, unit: str = "", kind: str = GAUGE) -> str:
    """`trainer_<name>[_<unit>][_total]`, the name as Prometheus stores it (counters end in _total)."""
    parts = [NAMESPACE, name] + ([unit] if unit and not name.endswith(unit) else [])
    base = "_".join(parts)
    return f"{base}_total" if kind == COUNTER else base


@dataclass(frozen=True)
class Metric:
    name: str
    """The full name Prometheus stores (for histograms, the family: add _bucket, _sum, _count)."""
    kind: str
    help: str

    @property
    def sum(self) -> str:
        return f"{self.name}_sum"

    @property
    def count(self) -> str:
        return f"{self.name}_count"

    @property
    def bucket(self) -> str:
        return f"{self.name}_bucket"

    @property
    def client_name(self) -> str:
        """The name to give prometheus_client, which appends _total to counters and _info to infos."""
        return self.name.removesuffix("_total")


def _metric(name: str, kind: str, help_text: str, unit: str = "") -> Metric:
    return Metric(full_name(name, unit=unit, kind=kind), kind, help_text)


STEP = _metric("step_duration", HISTOGRAM, "Whole training step, host wall clock", "seconds")
SAMPLED_NOTE = "; on SCRIPT= runs sampled where trainer_split_sampled is 1"
INPUT_WAIT = _metric(
    "input_wait", HISTOGRAM, "Waiting for the next distributed batch" + SAMPLED_NOTE, "seconds"
)
COMPUTE = _metric(
    "compute_duration",
    HISTOGRAM,
    "Forward, backward and optimizer update on the local replica" + SAMPLED_NOTE,
    "seconds",
)
ALLREDUCE = _metric(
    "allreduce_duration",
    HISTOGRAM,
    "Gradient all-reduce from the last gradient to the last reduction, waiting for the slowest "
    "task included; with --allreduce-mode overlap only its exposed part (what the step still "
    "waits for after its last gradient)" + SAMPLED_NOTE,
    "seconds",
)
STEPS = _metric("steps", COUNTER, "Training steps completed by this task")
EXAMPLES = _metric("examples", COUNTER, "Examples processed by this task's replicas")
ALLREDUCE_BYTES = _metric(
    "allreduce",
    COUNTER,
    "Gradient bytes this task hands to the all-reduce per step, in the dtype sent (--allreduce-dtype)",
    "bytes",
)
NET_TRANSMIT = _metric("network_transmit", COUNTER, "Bytes sent on the task's network interfaces", "bytes")
NET_RECEIVE = _metric("network_receive", COUNTER, "Bytes received on the task's network interfaces", "bytes")
LOSS = _metric("loss", GAUGE, "Global mean training loss of the last step")
GLOBAL_STEP = _metric("global_step", GAUGE, "Optimizer step (continues after a resume)")
WORLD_SIZE = _metric("world_size", GAUGE, "Replicas in sync")
LAST_STEP_TIME = _metric("last_step_timestamp", GAUGE, "Unix time the last step finished", "seconds")
INPUT_STEP = _metric(
    "input_step",
    GAUGE,
    "Step whose batch this task has taken from its input (one ahead of trainer_global_step while a "
    "step runs): when a job's step stands still, a task behind its peers is the one not in the collective",
)
STUCK_STEP = _metric(
    "stuck_step",
    GAUGE,
    "Step at which trainer.supervise.supervisor last ended this task as stuck (SUPERVISE_STALL, docs/faults.md), "
    "exported by the task's next run; absent: never in this container",
)
STUCK_TIME = _metric(
    "stuck",
    GAUGE,
    "Unix time trainer.supervise.supervisor last ended this task as stuck",
    "timestamp_seconds",
)
LAST_CHECKPOINT = _metric(
    "last_checkpoint_step",
    GAUGE,
    "Step of the last checkpoint saved (published: its files durable, its manifest written)",
)
CHECKPOINT_BLOCKED = _metric(
    "checkpoint_blocked",
    COUNTER,
    "Seconds the training loop spent on checkpoint saves between steps: the hand-off to the writer "
    "(the variables copied to host memory, the previous save waited for); the write itself runs beside "
    "the steps",
    "seconds",
)
TARGET_STEPS = _metric(
    "target_steps",
    GAUGE,
    "Global step the run ends at, where known (STEPS=, or a fit script's epochs x steps per epoch); 0: unknown",
)
SPLIT_SAMPLED = _metric(
    "split_sampled",
    GAUGE,
    "1: compute, all-reduce and input wait are each step's host time times the shares of the last "
    "sampled profiler window (SCRIPT= runs, docs/script.md); 0: measured in every step",
)
SPLIT_SAMPLES = _metric(
    "split_samples", COUNTER, "Profiler windows parsed into the step split (SCRIPT= runs)"
)
BUILD_INFO = _metric("build", INFO, "Versions and setup of this task")
RUN_SETTINGS = _metric(
    "run_settings",
    INFO,
    "Settings this task's run started with (`make runs` lists them, `make compare` names those that differ)",
)
STATE = _metric("state", ENUM, "Lifecycle state of this task")

STEP_PARTS = (INPUT_WAIT, COMPUTE, ALLREDUCE)
"""The histograms a step splits into; the step minus their sum is dispatch and host time."""
ALL = (
    STEP,
    INPUT_WAIT,
    COMPUTE,
    ALLREDUCE,
    STEPS,
    EXAMPLES,
    ALLREDUCE_BYTES,
    NET_TRANSMIT,
    NET_RECEIVE,
    LOSS,
    GLOBAL_STEP,
    WORLD_SIZE,
    LAST_STEP_TIME,
    INPUT_STEP,
    STUCK_STEP,
    STUCK_TIME,
    LAST_CHECKPOINT,
    CHECKPOINT_BLOCKED,
    TARGET_STEPS,
    SPLIT_SAMPLED,
    SPLIT_SAMPLES,
    BUILD_INFO,
    RUN_SETTINGS,
    STATE,
)
BUILD_LABELS = ("tf_version", "trainer_version", "strategy", "communication", "task")
"""The labels of BUILD_INFO: tasks whose values differ cannot train together."""
RUN_SETTING_LABELS = (
    "task",
    "world_size",
    "per_replica_batch",
    "learning_rate",
    "bytes_per_pack",
    "allreduce_dtype",
    "allreduce_mode",
    "steps_per_call",
    "measure_every",
    "input_delay_ms",
    "allocator",
    "intraop_threads",
    "interop_threads",
)
"""The labels of RUN_SETTINGS: what a run's speed or optimisation depends on and `make tune` may change
(a SCRIPT= run records the ones its wrapper controls, the others empty)."""
SCRIPT_STRATEGY = "script"
"""BUILD_INFO's strategy (and communication) for a user's own script (SCRIPT=): the advice differs."""
RUN_BY = ("job", *TARGET_LABELS)
"""Labels of one run's series in PromQL `by (...)` clauses: what cluster-level figures keep."""
TASK_BY = (*RUN_BY, "instance", *LABELS)
"""Labels of one task's series in PromQL `by (...)` clauses (Prometheus adds job and instance)."""


def exposed_name(metric: Metric) -> str:
    """What an exposition shows for an Info (`_info`) metric; other names are shown as stored."""
    return f"{metric.name}_info" if metric.kind == INFO else metric.name


def table() -> str:
    """The contract as a Markdown table (`python -m contract`), for docs that must not copy it."""
    rows = ["| series | type | meaning |", "|---|---|---|"]
    rows += [f"| `{exposed_name(m)}` | {m.kind} | {m.help} |" for m in ALL]
    return "\n".join(rows)


def settings() -> dict[str, str]:
    """SHARED_SETTINGS with their values, for make and shell (which cannot import this file)."""
    return {name: str(globals()[name]) for name in SHARED_SETTINGS}


def make_fragment() -> str:
    """contract/defaults.mk, which the Makefile includes: `NAME := value` per shared setting."""
    lines = ["# Generated by `python3 -m contract --make` from contract/__init__.py. Do not edit."]
    return "\n".join(lines + [f"{k} := {v}" for k, v in settings().items()]) + "\n"


def shell_lines() -> str:
    """`NAME=value` per shared setting, for a shell script's `eval "$(python3 -m contract --shell)"`."""
    return "".join(f"{k}={v}\n" for k, v in settings().items())
