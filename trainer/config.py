"""The trainer's configuration: one frozen dataclass, built once from flags and environment.

Every field is a flag (`--per-replica-batch`) and an environment variable (`TRAINER_PER_REPLICA_BATCH`)
so compose files can set it; a flag wins over the environment, the environment over the default.
Pure Python: a bad value must fail (exit 2) before TensorFlow's ~6 s import.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import importlib.util
import inspect
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import contract
from trainer.core import fault
from trainer.errors import ConfigError
from trainer.tasks import spec as taskspec

ENV_PREFIX = "TRAINER_"
STRATEGIES = ("mwms", "mirrored")
LR_SCALINGS = ("none", "linear")
RESIZE_KEEPS = ("per-replica-batch", "global-batch")
"""--resize-keep's policies (trainer/state/resize.py applies them); the first is the default."""
ALLREDUCE_MODES = ("serial", "overlap")
ALLREDUCE_DTYPES = ("float32", "bfloat16", "float16")


@dataclass(frozen=True, kw_only=True)
class Config:
    steps: int = 100
    """Train until the global step reaches this (a resumed run continues, it does not add)."""
    per_replica_batch: int = 32
    """Examples per replica per step; the global batch is this times the replicas in sync."""
    task: str = "mlp"
    """Model and data: a built-in (trainer/tasks/: `mlp`, `cnn`) or `package.module:function` of your own."""
    strategy: str = "mwms"
    """`mwms` (MultiWorkerMirroredStrategy, one process per task) or `mirrored` (one process)."""
    data: str = ""
    """Glob of TFRecord files for the built-in tasks; empty means synthetic data."""
    learning_rate: float = 0.01
    """Learning rate for one replica's batch (--per-replica-batch); --lr-scaling turns it into the job's rate."""
    lr_scaling: str = "linear"
    """`linear` (default): the rate times the replicas in sync, since the global batch grows with them
    (Goyal et al.), reached over --warmup-steps; `none`: the same rate whatever the number of workers."""
    warmup_steps: int = 100
    """Steps of linear warm-up from the base rate to the scaled one (none when they are equal: 1 replica or
    --lr-scaling none)."""
    resize_keep: str = "per-replica-batch"
    """What a resumed job keeps when its world size changed (trainer/state/resize.py): `per-replica-batch`
    (the global batch follows the replicas, the rate is rescaled by --lr-scaling) or `global-batch` (split
    anew over the replicas; refused when it does not divide)."""
    seed: int = 0
    """Seed of the model initialisation and of the synthetic data's teacher."""
    input_delay_ms: float = 0.0
    """Extra delay per batch in the input pipeline, to demonstrate and test an input-bound run."""
    bytes_per_pack: int = 0
    """Gradient all-reduce packs of this many bytes (CommunicationOptions.bytes_per_pack); 0 = one pack.

    On CPU rings, 1 MiB packs doubled the bus bandwidth of a 64 MiB all-reduce (`make bench-comm`)."""
    allreduce_mode: str = "serial"
    """`serial`: all-reduce after the last gradient; `overlap`: each --bytes-per-pack pack as soon as it is ready
    (the all-reduce metric is then the exposed part, from the last gradient to the last reduction)."""
    allreduce_dtype: str = "float32"
    """Gradients are cast to this for the all-reduce and back before the update: float32, bfloat16, float16."""
    steps_per_call: int = 0
    """Steps per tf.function call (an in-graph loop spreading the dispatch cost); 0 = auto (~0.5 s calls)."""
    measure_every: int = 1
    """Time the steps of one call in this many (1 = every step); the others run untimed."""
    log_every: int = 10
    """A progress line per task when the step passes a multiple of this (at most one per call)."""
    metrics_port: int = contract.METRICS_PORT
    """Port of the Prometheus /metrics endpoint; 0 disables metrics."""
    metrics_linger: float = 0.0
    """Seconds to keep serving /metrics after the last step, so a scraper records the final step and `done`."""
    logdir: str = ""
    """TensorBoard log directory: the chief writes its scalars (loss, learning rate, step breakdown) under
    `<logdir>/train` every --log-every steps; empty writes none."""
    profiler_port: int = 0
    """Port of TensorFlow's profiler server in every task, for `make profile`; 0 starts none."""
    checkpoint_dir: str = ""
    """Where the chief writes checkpoints and the final model; empty disables checkpoints."""
    resume_new_settings: int = 0
    """1: resume a checkpoint whose job settings (trainer/state/manifest.py) differ, with the new settings on every
    task; 0 (default): such a start stops with exit 2, naming each difference."""
    save_every: int = 100
    """Checkpoint every this many steps (and always at the end); 0 means only at the end."""
    save_seconds: float = 10.0
    """Also checkpoint every this many seconds of training, whichever of the two comes first; 0: by steps
    only. The default keeps saves under 2 % of the wall clock: an asynchronous save held the loop at most
    0.12 s in the measured runs (docs/faults.md), 1.2 % of 10 s."""
    output_dir: str = ""
    """If set, each task writes `<task>.json` here at the end: step, weights checksum, example ids."""
    export_dir: str = ""
    """If set, the chief copies the final model (`model/`, a SavedModel) and the run's summary
    (`summary.json`) here at the end and records the copy in --checkpoint-dir (the stack: OUTPUT= on the host)."""
    cluster_timeout: float = 300.0
    """Seconds to wait for every peer to accept a connection before exiting with code 3."""
    heartbeat_timeout: float = 10.0
    """Seconds without a heartbeat after which a task is declared dead and every collective aborts (exit 200)."""
    fault: str = ""
    """Fault-injection hook of the fault tests, not a setting (trainer/core/fault.py, docs/faults.md):
    `TASK:input-block@STEP` or `TASK:hang@STEP` makes that task stuck there, `TASK:save-block@STEP` its
    checkpoint writer before that save's manifest; once per container."""

    def __post_init__(self) -> None:
        for name in ("steps", "per_replica_batch", "measure_every", "log_every"):
            _check(getattr(self, name) >= 1, name, "must be 1 or more")
        for name in (
            "warmup_steps",
            "save_every",
            "save_seconds",
            "input_delay_ms",
            "steps_per_call",
            "metrics_linger",
            "bytes_per_pack",
        ):
            _check(getattr(self, name) >= 0, name, "must be 0 or more")
        _check(self.resume_new_settings in (0, 1), "resume_new_settings", "must be 0 or 1")
        _check(self.learning_rate > 0, "learning_rate", "must be positive")
        _check(self.cluster_timeout > 0, "cluster_timeout", "must be positive (seconds)")
        _check(self.heartbeat_timeout >= 1, "heartbeat_timeout", "must be 1 or more (seconds)")
        _check(0 <= self.metrics_port < 65536, "metrics_port", "must be a port (0 disables metrics)")
        _check(
            0 <= self.profiler_port < 65536, "profiler_port", "must be a port (0 starts no profiler server)"
        )
        _check(self.strategy in STRATEGIES, "strategy", f"must be one of {', '.join(STRATEGIES)}")
        _check(
            self.allreduce_mode in ALLREDUCE_MODES,
            "allreduce_mode",
            f"must be one of {', '.join(ALLREDUCE_MODES)}",
        )
        _check(
            self.allreduce_dtype in ALLREDUCE_DTYPES,
            "allreduce_dtype",
            f"must be one of {', '.join(ALLREDUCE_DTYPES)}",
        )
        _check(self.resize_keep in RESIZE_KEEPS, "resize_keep", f"must be one of {', '.join(RESIZE_KEEPS)}")
        _check(self.lr_scaling in LR_SCALINGS, "lr_scaling", f"must be one of {', '.join(LR_SCALINGS)}")
        _check(
            _fault_ok(self.fault), "fault", f"must be TASK:KIND@STEP, KIND one of {', '.join(fault.KINDS)}"
        )
        _check(
            _task_found(self.task),
            "task",
            f"{self.task!r} is neither a built-in ({', '.join(taskspec.names())}) nor an importable "
            "package.module:function",
        )


def _task_found(task: str) -> bool:
    """A built-in, or `package.module:function` whose top-level package is on the path. Finding the
    package runs none of its code, so TensorFlow is not imported; loading the function comes later."""
    if task in taskspec.names():  # the registry runs no TensorFlow
        return True
    module, sep, function = task.partition(":")
    if not sep or not function.isidentifier() or not all(p.isidentifier() for p in module.split(".")):
        return False
    return importlib.util.find_spec(module.split(".")[0]) is not None


def _fault_ok(text: str) -> bool:
    try:
        fault.Fault.parse(text)
    except ConfigError:
        return False
    return True


def _check(ok: bool, name: str, problem: str) -> None:
    if not ok:
        raise ConfigError(f"--{_flag(name)} ({ENV_PREFIX}{name.upper()}): {problem}")


def _flag(name: str) -> str:
    return name.replace("_", "-")


def field_docs(cls: type = Config) -> dict[str, str]:
    """The docstring under each field, so flags' --help and the code share one description."""
    body = ast.parse(inspect.getsource(cls)).body[0].body
    docs = {}
    for node, following in itertools.pairwise(body):
        if isinstance(node, ast.AnnAssign) and isinstance(following, ast.Expr):
            docs[node.target.id] = following.value.value
    return docs


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m trainer", description=__doc__.splitlines()[0])
    docs = field_docs()
    for f in dataclasses.fields(Config):
        env = ENV_PREFIX + f.name.upper()
        p.add_argument(
            f"--{_flag(f.name)}",
            dest=f.name,
            default=None,
            metavar=env,
            help=f"{docs.get(f.name, '')} (default {f.default!r})",
        )
    return p


def from_args(argv: Sequence[str], env: Mapping[str, str]) -> Config:
    """Flags over environment over defaults; every value converted and checked, errors name the field."""
    args = vars(parser().parse_args(argv))
    values = {}
    for f in dataclasses.fields(Config):
        env_name = ENV_PREFIX + f.name.upper()
        raw, source = args[f.name], f"--{_flag(f.name)}"
        if raw is None and env.get(env_name, "") != "":
            raw, source = env[env_name], env_name
        if raw is not None:
            values[f.name] = _convert(raw, _type_of(f), source)
    return Config(**values)


def _type_of(f: dataclasses.Field) -> type:
    return {"int": int, "float": float, "str": str}[f.type if isinstance(f.type, str) else f.type.__name__]


def _convert(raw: str, kind: type, source: str) -> object:
    try:
        return kind(raw.strip())
    except ValueError:
        raise ConfigError(
            f"{source}={raw!r}: must be {'an integer' if kind is int else 'a number'}"
        ) from None


def to_env(config: Config) -> dict[str, str]:
    """The environment that reproduces `config` (the launcher and the contract tests use it)."""
    return {ENV_PREFIX + f.name.upper(): str(getattr(config, f.name)) for f in dataclasses.fields(Config)}
