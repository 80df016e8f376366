"""The one description of a deployment, which every target's emitter translates.

    Deployment (frozen) + compose/services.py  ->  compose/targets/<name>.py  ->  files + a report
                                                   (compose, swarm, tfjob, jobset, trainjob)

It holds what the cluster needs (a chief plus `workers` workers, addressed by each target's template
in trainer/cluster/spec.py) and what running it needs: the image, GPUs per task, ports (contract/__init__.py),
checkpoint storage, the metrics endpoint, the trainer's knobs and the restart budget. Emitters never
add knobs of their own: whatever a target cannot express, its emitter reports as a `Change`.
Standard library only: `make up` runs the Compose emitter with a bare python3 (python -m compose.emit).
"""

from __future__ import annotations

import argparse
import dataclasses
import shlex
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import contract
from compose import knobs as trainer_knobs
from trainer.host import (
    COMPOSE_ADDRESS,
    ENV_PREFIX,
    ClusterSpec,
    Config,
    TaskId,
    __version__,
    from_template,
    observe_config,
    server_config,
)
from trainer.host import supervisor as supervise

TF_PORT = contract.TF_PORT
METRICS_PORT = contract.METRICS_PORT
METRICS_LINGER_SECONDS = 12
"""Two 5 s scrape intervals (monitoring/config/prometheus/prometheus.yml) plus margin: Prometheus records the
final step and the `done` state before a finished task's container exits."""
CHECKPOINT_DIR = "/checkpoints"
SCRIPT_CHECKPOINT_DIR = f"{CHECKPOINT_DIR}/script"
"""A SCRIPT= run's TRAINER_CHECKPOINT_DIR: its own folder of the volume, apart from the built-in job's."""
LOG_DIR = "/logs"
"""TensorBoard's log volume in every task (TRAINER_LOGDIR) and in the TensorBoard service."""
OUTPUT_DIR = "/output"
SCRIPT_DIR = "/script"
DATA_DIR = "/data"
UID = GID = 1000
"""The unprivileged user every trainer runs as (images/trainer.Dockerfile creates it)."""
STOP_GRACE_SECONDS = 60
"""Time between SIGTERM and SIGKILL: the preemption save of every task must fit in it."""
SHM_GIB = 2
"""/dev/shm of a GPU task: NCCL's shared-memory transport fails with Docker's 64 MB (NVIDIA/nccl#342)."""
KNOB_FIELDS = tuple(f.name for f in dataclasses.fields(Config))


@dataclass(frozen=True, kw_only=True)
class Deployment:
    """What one deployment asks for, whatever the target. Unset knobs keep the trainer's defaults."""

    workers: int
    """Workers besides the chief: 2 workers are three tasks."""
    base_image: str = "mwms/python:3.11-bookworm"
    """The image the trainer image is built on (Compose builds it; other targets pull a pushed image)."""
    image_repo: str = "mwms/trainer"
    """Repository of the trainer image; tagged `<version>-<variant>` (IMAGE_REPO=)."""
    image_ref: str = ""
    """A pinned reference (`registry:5000/mwms/trainer@sha256:...`, what `make push` prints) that targets
    which pull use instead of the tag; empty: `<image_repo>:<version>-<variant>`."""
    gpu_ids: Mapping[str, tuple[str, ...]] | None = None
    """Task name -> GPU indices on the host (compose/gpus.py assigns them); None for a CPU run.
    Targets with a scheduler keep only the count per task."""
    knobs: tuple[tuple[str, str], ...] = ()
    """Trainer settings as (trainer.config.Config field, value), passed as TRAINER_<FIELD>
    (compose/knobs.py reads them from the environment: STEPS=, TASK=, ...)."""
    max_restarts: int = contract.DEFAULT_MAX_RESTARTS
    """Restart budget: automatic restarts before the run fails for good."""
    stall: str = ""
    """When a frozen step counts as stuck (SUPERVISE_STALL=multiple,floor,ceiling, trainer.supervise.supervisor);
    empty: the supervisor's default."""
    checkpoint_storage: str = "1Gi"
    """Size of the checkpoint volume where a target needs one declared (a Kubernetes PVC)."""
    script: str | None = None
    """Host path of a user's MWMS script, run instead of `python -m trainer` (SCRIPT=)."""
    observe: tuple[tuple[str, str], ...] = ()
    """The SCRIPT= wrapper's settings as (variable, value), passed to every task of a SCRIPT= run:
    TRAINER_SPLIT_PERIOD_S and TRAINER_SPLIT_WINDOW_S (trainer/observe/config.py, docs/script.md)."""
    process: tuple[tuple[str, str], ...] = ()
    """Process variables every task gets over server_config.ENVIRONMENT's (server_config.PROCESS_SETTINGS:
    the allocator, TensorFlow's thread pools), from `make tune`'s winner (process_settings)."""
    data: str | None = None
    """Host path mounted read-only at /data (DATA=)."""
    output: str | None = None
    """Host folder where the chief copies the final model and the run summary at the end (OUTPUT=)."""
    extra_args: tuple[str, ...] = ()
    """Appended to every task's command: trainer flags, or the user script's own arguments (ARGS=)."""
    cpu: str = "2"
    """CPU each task asks for and may use, where a target schedules by it (Kubernetes requests = limits:
    Guaranteed pods, evicted last; a synchronous job stops whole if one task is evicted)."""
    memory: str = "4Gi"
    """Memory each task asks for and may use, where a target schedules by it (as `cpu`)."""
    project: str = contract.DEFAULT_PROJECT
    """The stack's name (Compose project, Swarm stack, PROJECT=): a label on every series."""
    run: str = ""
    """This run's id (`make up` creates one, run_id()): a label on every series, so a later run's
    status, verdicts and reports never read this one's data."""

    def __post_init__(self) -> None:
        if self.max_restarts < 0:
            raise ValueError(f"MAX_RESTARTS={self.max_restarts}: must be 0 or more")
        if self.stall:
            supervise.StallBound.parse(self.stall)  # its error names SUPERVISE_STALL
        for name, _ in self.knobs:
            if name not in KNOB_FIELDS:
                raise ValueError(f"trainer knob {name!r} is not a trainer setting (python -m trainer --help)")
        counts = {len(ids) for ids in (self.gpu_ids or {}).values()}
        if len(counts) > 1:
            raise ValueError(f"GPU ids {dict(self.gpu_ids)}: every task needs the same number of GPUs")

    @property
    def tasks(self) -> tuple[TaskId, ...]:
        return self.cluster().tasks

    def cluster(self, template: str = COMPOSE_ADDRESS, **names: str) -> ClusterSpec:
        """Every task's address under a target's template (trainer/cluster/spec.py: *_ADDRESS)."""
        return from_template(self.workers, template, port=TF_PORT, **names)

    @property
    def gpus_per_task(self) -> int:
        return len(next(iter(self.gpu_ids.values()))) if self.gpu_ids else 0

    @property
    def variant(self) -> str:
        return "gpu" if self.gpu_ids else "cpu"

    def image(self, variant: str | None = None) -> str:
        return f"{self.image_repo}:{__version__}-{variant or self.variant}"

    @property
    def pulled_image(self) -> str:
        """What a node pulls: the pinned reference when one is given."""
        return self.image_ref or self.image()


@dataclass(frozen=True)
class Change:
    """One setting an emitter dropped or rewrote for its target, and why."""

    setting: str
    became: str
    """What it became on the target; empty when dropped."""
    why: str

    def line(self) -> str:
        what = f"rewrote {self.setting} -> {self.became}" if self.became else f"dropped {self.setting}"
        return f"  {what}: {self.why}"


def report(target: str, changes: Sequence[Change]) -> str:
    """The translation report an emitter prints: one line per change, or a line saying there were none."""
    if not changes:
        return f"{target}: nothing dropped"
    head = f"{target}: {len(changes)} setting(s) dropped or rewritten"
    return "\n".join([head, *(c.line() for c in changes)])


def trainer_env(d: Deployment) -> dict[str, str]:
    """The environment every task gets besides TF_CONFIG, the same on every target."""
    env = {
        "TRAINER_METRICS_PORT": str(METRICS_PORT),
        "TRAINER_METRICS_LINGER": str(METRICS_LINGER_SECONDS),
        "TRAINER_CHECKPOINT_DIR": CHECKPOINT_DIR,
        "TRAINER_LOGDIR": LOG_DIR,
        "TRAINER_PROFILER_PORT": str(contract.PROFILER_PORT),
        **server_config.ENVIRONMENT,
        **dict(d.process),
    }
    env.update({ENV_PREFIX + name.upper(): value for name, value in d.knobs})
    if d.data:
        env["TRAINER_DATA"] = DATA_DIR
    if d.script:
        env["TRAINER_CHECKPOINT_DIR"] = SCRIPT_CHECKPOINT_DIR
        env.update(d.observe)
    env[supervise.MAX_RESTARTS_ENV] = str(d.max_restarts)
    if d.stall:
        env[supervise.STALL_ENV] = d.stall
    return env


def command(d: Deployment) -> list[str]:
    """Every task on every target runs under trainer.supervise.supervisor: it restarts the trainer by exit code
    with a budget that renews with each checkpoint, which no engine's own restart policy can do."""
    if d.script:
        return [
            *supervise.ENTRY,
            "python",
            "-m",
            "trainer.script.wrapper",
            f"{SCRIPT_DIR}/{Path(d.script).name}",
            *d.extra_args,
        ]
    return [*supervise.ENTRY, "python", "-m", "trainer", *d.extra_args]


def observe_settings(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The SCRIPT= wrapper's settings the user gave (`make up TRAINER_SPLIT_PERIOD_S=30`, or the
    environment), checked as the wrapper will check them. Raises ValueError with a one-line message."""
    given = {name: environ[name] for name in observe_config.ENV_NAMES if environ.get(name)}
    observe_config.from_env(given)
    return tuple(sorted(given.items()))


def process_settings(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(NAME, value) for each process setting given as TRAINER_<NAME> (compose/tuned.sh exports `make
    tune`'s winner so): an empty value is one too (GLIBC_TUNABLES= is glibc's stock allocator)."""
    return tuple(
        (name, environ[ENV_PREFIX + name])
        for name in server_config.PROCESS_SETTINGS
        if ENV_PREFIX + name in environ
    )


def run_id(now: float | None = None) -> str:
    """A new run's id: its UTC start time, so ids sort in the order the runs started."""
    return time.strftime("%Y%m%dT%H%M%SZ", time.gmtime(time.time() if now is None else now))


def target_labels(d: Deployment) -> dict[str, str]:
    """What Prometheus attaches to every series of a task from its scrape target (contract.TARGET_LABELS)."""
    return {contract.PROJECT_LABEL: d.project, contract.RUN_LABEL: d.run}


def fake_gpu_ids(workers: int, per_task: int) -> dict[str, tuple[str, ...]] | None:
    """GPU ids for a target that only needs the count per task (its scheduler picks the devices)."""
    if per_task < 0:
        raise ValueError(f"GPUS_PER_WORKER={per_task}: must be 0 (CPU) or more")
    if not per_task:
        return None
    names = [t.name for t in from_template(workers, COMPOSE_ADDRESS).tasks]
    return {n: tuple(str(k * per_task + j) for j in range(per_task)) for k, n in enumerate(names)}


def count(var: str) -> Callable[[str], int]:
    """An argparse type for a count of 0 or more whose error names make's variable (WORKERS=abc), not
    the flag: the user typed the variable."""

    def parse(text: str) -> int:
        if not text.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{var}={text}: a whole number, 0 or more (e.g. {var}=3)")
        return int(text)

    return parse


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The flags every emitter's CLI shares: the cluster, the image, the restart budget. Trainer knobs are
    not flags: every emitter reads them from its environment (compose/knobs.py)."""
    p.add_argument("--workers", type=count("WORKERS"), required=True, help="workers besides the chief")
    p.add_argument("--base-image", default=Deployment.base_image)
    p.add_argument("--image-repo", default=Deployment.image_repo)
    p.add_argument("--script", help="host path of your MWMS script, run in every task")
    p.add_argument("--data", help="host folder mounted read-only at /data")
    p.add_argument("--output", help="host folder the chief copies the final model and summary into")
    p.add_argument("--args", default="", help="extra arguments for every task's command (shell-quoted)")
    p.add_argument("--max-restarts", type=count("MAX_RESTARTS"), default=Deployment.max_restarts)
    p.add_argument("--project", default=Deployment.project, help="stack name, a label on every series")
    p.add_argument("--run", default="", help="run id, a label on every series (empty: a new one)")
    p.add_argument(
        "--image",
        default="",
        help="pinned image reference nodes pull (what `make push` prints); targets that pull",
    )


def from_args(
    ns: argparse.Namespace,
    gpu_ids: Mapping[str, tuple[str, ...]] | None,
    environ: Mapping[str, str] | None = None,
    **more: object,
) -> Deployment:
    """The Deployment the shared flags and the knobs in `environ` describe (`more`: target-specific
    fields such as checkpoint_storage)."""
    return Deployment(
        workers=ns.workers,
        base_image=ns.base_image,
        image_repo=ns.image_repo,
        gpu_ids=gpu_ids,
        knobs=trainer_knobs.from_environ(environ or {}),
        max_restarts=ns.max_restarts,
        stall=(environ or {}).get(supervise.STALL_ENV, ""),
        script=ns.script,
        observe=observe_settings(environ or {}),
        process=process_settings(environ or {}),
        data=ns.data,
        output=ns.output,
        extra_args=tuple(shlex.split(ns.args)),
        project=ns.project,
        run=ns.run or run_id(),
        image_ref=ns.image,
        **more,
    )
