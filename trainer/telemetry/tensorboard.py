"""TensorBoard from inside a task: the chief's scalars and every task's profiler server.

Layout of the log directory (--logdir, TRAINER_LOGDIR; the stack mounts its TensorBoard volume there):

    <logdir>/train/events.out.tfevents...                   the chief's scalars (built-in trainer)
    <logdir>/<anything else>                                 a SCRIPT's own summaries, wherever it writes
    <logdir>/profile/<task>/plugins/profile/<capture>/<task>.xplane.pb   `make profile`, one run per task

The scalars are written by an action of the loop, on the chief only, when a call passes a multiple of
--log-every (the progress line's interval): a handful of eager summary ops and a flush per interval,
nothing per step. They go through `tf.summary.write` with the scalar plugin's metadata, which is what
`tf.summary.scalar` writes, so no TensorBoard package is needed where the trainer runs (TensorFlow 2.21
raises TBNotInstalledError for `tf.summary.scalar` without one).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

from trainer.core.timing import CallOutput, Interval

log = logging.getLogger(__name__)

SCALARS_RUN = "train"
"""The run (sub-directory of the log directory) of the built-in trainer's scalars."""
PROFILE_RUNS = "profile"
"""`make profile` writes one run per task under <logdir>/profile/<task>."""
TAGS = {
    "loss": "loss",
    "learning_rate": "learning_rate",
    "step": "step_time/step_ms",
    "compute": "step_time/compute_ms",
    "allreduce": "step_time/allreduce_ms",
    "input": "step_time/input_wait_ms",
    "other": "step_time/other_ms",
}
"""TensorBoard tag of each scalar; the step breakdown is grouped under one `step_time/` card section."""


class NoScalars:
    """The disabled sink: no log directory, or not the chief."""

    def __call__(self, out: CallOutput) -> None:
        return None


class Scalars:
    """An action of the loop: the interval's mean step breakdown, the loss and the learning rate."""

    def __init__(self, path: str, every: int, learning_rate: Callable[[int], float]) -> None:
        import tensorflow as tf

        self.every, self.learning_rate = every, learning_rate
        self.writer = tf.summary.create_file_writer(path)
        self.metadata = scalar_metadata()
        self.interval = Interval(0.0)

    def __call__(self, out: CallOutput) -> None:
        self.interval.timings.extend(t for t in out.timings if t is not None)
        before = out.step - out.steps
        if out.step // self.every > before // self.every:
            self.write(out.step, self.values(out))
            self.interval = Interval(0.0)

    def values(self, out: CallOutput) -> dict[str, float]:
        values = {"loss": out.loss, "learning_rate": self.learning_rate(out.step)}
        mean = self.interval.mean()
        if mean is not None:  # an interval of untimed calls (--measure-every) has no breakdown
            for part in ("step", "compute", "allreduce", "input", "other"):
                values[part] = 1000 * getattr(mean, part)
        return values

    def write(self, step: int, values: dict[str, float]) -> None:
        import tensorflow as tf

        with self.writer.as_default():
            for name, value in values.items():
                tf.summary.write(
                    TAGS[name], tf.constant(value, tf.float32), step=step, metadata=self.metadata
                )
        self.writer.flush()


def scalar_metadata():
    """What `tf.summary.scalar` attaches (TensorBoard's scalar plugin, data class scalar)."""
    from tensorflow.core.framework import summary_pb2

    return summary_pb2.SummaryMetadata(
        plugin_data=summary_pb2.SummaryMetadata.PluginData(plugin_name="scalars"),
        data_class=summary_pb2.DATA_CLASS_SCALAR,
    )


def scalars(
    logdir: str, is_chief: bool, every: int, learning_rate: Callable[[int], float]
) -> Scalars | NoScalars:
    """The chief's scalar writer under <logdir>/train, or the no-op sink."""
    if not logdir or not is_chief:
        return NoScalars()
    path = os.path.join(logdir, SCALARS_RUN)
    log.info("TensorBoard scalars every %d steps in %s", every, path)
    return Scalars(path, every, learning_rate)


def rate_at(schedule) -> Callable[[int], float]:
    """The learning rate at a step, from a Keras schedule or a constant rate."""
    return (lambda step: float(schedule(step))) if callable(schedule) else (lambda step: float(schedule))


def start_profiler(port: int, task: str) -> None:
    """TensorFlow's profiler server on `port` (0: none), so `make profile` can trace this task.

    It only listens: nothing is recorded until a client asks for a trace. Safe before the strategy is
    built (it does not touch the eager context)."""
    if not port:
        return
    import tensorflow as tf

    tf.profiler.experimental.server.start(port)
    log.info("%s: profiler server on port %d (make profile traces it)", task, port)
