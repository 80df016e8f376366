"""After the strategy is built, check that every task runs the same cluster, TensorFlow, trainer
and training settings; a task that differs is named instead of training silently wrong or hanging.

The fingerprints are all-gathered as float64 (52-bit values are exact), one per component.
"""

from __future__ import annotations

import functools
import hashlib
import json
from collections.abc import Sequence

from trainer.cluster.spec import ClusterSpec
from trainer.config import Config
from trainer.errors import ConfigError

COMPONENTS = ("cluster spec", "TensorFlow version", "trainer version", "training settings")
# Settings every task must share; ports and directories may legitimately differ per task. The
# all-reduce settings too: tasks sending different dtypes or packs would not meet in one collective.
SHARED_SETTINGS = (
    "steps",
    "per_replica_batch",
    "task",
    "strategy",
    "data",
    "learning_rate",
    "lr_scaling",
    "warmup_steps",
    "seed",
    "steps_per_call",
    "measure_every",
    "save_every",
    "save_seconds",
    "log_every",
    "bytes_per_pack",
    "allreduce_mode",
    "allreduce_dtype",
)


def _hash52(value: object) -> float:
    digest = hashlib.sha256(json.dumps(value, sort_keys=True).encode()).digest()
    return float(int.from_bytes(digest[:8], "big") >> 12)


def fingerprints(
    spec: ClusterSpec | None, config: Config, tf_version: str, trainer_version: str
) -> list[float]:
    cluster = float(spec.fingerprint()) if spec else 0.0
    settings = {name: getattr(config, name) for name in SHARED_SETTINGS}
    return [cluster, _hash52(tf_version), _hash52(trainer_version), _hash52(settings)]


def check(task_names: Sequence[str], gathered: Sequence[Sequence[float]]) -> None:
    """Raise ConfigError naming each task whose fingerprint differs from the chief's (the first)."""
    problems = []
    for name, values in zip(task_names[1:], gathered[1:]):
        differs = [c for c, mine, chief in zip(COMPONENTS, values, gathered[0]) if mine != chief]
        if differs:
            problems.append(f"{name} differs from {task_names[0]} in {' and '.join(differs)}")
    if problems:
        raise ConfigError(
            "tasks disagree: "
            + "; ".join(problems)
            + " (run the same image, TF_CONFIG cluster and TRAINER_* settings everywhere)"
        )


def gather(strategy, values: list[float]) -> list[list[float]]:
    """Every replica's `values`, in replica order (chief first, then worker-0, worker-1, ...)."""
    import tensorflow as tf

    gathered = _gather_function(strategy)(tf.constant(values, tf.float64))
    return [list(row) for row in strategy.experimental_local_results(gathered)[0].numpy()]


@functools.cache
def _gather_function(strategy):
    """One all-gather function per strategy, the values its argument: a start gathers ~5 times, and a
    function made per call (values as constants) was traced anew each time (TensorFlow warned of it)."""
    import tensorflow as tf

    @tf.function(input_signature=[tf.TensorSpec([None], tf.float64)], autograph=False)
    def run(values):
        def replica(v):
            return tf.distribute.get_replica_context().all_gather(v[tf.newaxis], axis=0)

        return strategy.run(replica, args=(values,))

    return run
