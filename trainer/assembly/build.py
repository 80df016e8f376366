"""Where a task trains and what it trains: a `Context` (config, place in the cluster, strategy, this
segment's batch) and a `Trainable` (task, optimizer, checkpoints, input position, example-id ledger),
built under the strategy's scope before the resume.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from functools import partial

import tensorflow as tf

from trainer.assembly import task as tasks
from trainer.cluster.spec import ClusterSpec, TaskId
from trainer.config import Config
from trainer.core import fault
from trainer.data import position, records
from trainer.data import synthetic as data
from trainer.state import ledger as ledger_lib
from trainer.state import manifest, resize
from trainer.state.checkpoint import Checkpointer, NoCheckpoints, Place, Record
from trainer.tasks import spec as taskspec
from trainer.tasks.task import Task
from trainer.train import fault as fault_hooks
from trainer.train import step


@dataclass(frozen=True)
class Context:
    """Where this task trains: its configuration, its place in the cluster, the strategy built for it."""

    config: Config
    spec: ClusterSpec | None
    task_id: TaskId
    strategy: tf.distribute.Strategy
    sizing: resize.Sizing | None = None
    """This segment's batch (trainer/state/resize.py): --per-replica-batch unless a resize kept the global batch."""

    @property
    def is_chief(self) -> bool:
        return self.spec.is_chief if self.spec else True

    @property
    def global_batch(self) -> int:
        return self.sizing.global_batch

    @property
    def batch_config(self) -> Config:
        """The config with this segment's per-replica batch: what the task and its input are built with."""
        return dataclasses.replace(self.config, per_replica_batch=self.sizing.per_replica_batch)

    @property
    def rate(self):
        return step.learning_rate(self.config, self.sizing.lr_scale)


@dataclass(frozen=True)
class Trainable:
    """What this task trains, built under the strategy's scope."""

    task: Task
    optimizer: tf.keras.optimizers.Optimizer
    checkpoints: Checkpointer | NoCheckpoints
    position: position.Position
    """The job's global example offset (trainer/data/position.py), set at the resume."""
    ledger: ledger_lib.Ledger | None
    """This task's part of the job's example-id record (--output-dir), made at the resume."""


def build(ctx: Context, durable=lambda step: None) -> Trainable:
    """`durable(step)`: told once a save of `step` is published (the task's last-checkpoint metric)."""
    config = ctx.config
    where = position.Position(global_batch=ctx.global_batch)
    with ctx.strategy.scope():
        task = tasks.from_config(ctx.batch_config)
        optimizer = step.optimizer(config, ctx.sizing.lr_scale)
        optimizer.build(task.model.trainable_variables)  # slots exist before restore and broadcast
        ckpt = (
            Checkpointer(
                Place(config.checkpoint_dir, ctx.task_id.name, ctx.is_chief),
                task.model,
                optimizer,
                Record(
                    manifest.job_settings(config, ctx.strategy.num_replicas_in_sync),
                    partial(_published, ctx, where),
                    asynchronous=True,
                    durable=durable,
                    before_publish=fault_hooks.save_block(
                        fault.of(config.fault, ctx.task_id.name, "save-block")
                    ),
                ),
                accept_new_settings=bool(config.resume_new_settings),
            )
            if config.checkpoint_dir
            else NoCheckpoints(durable)
        )
    return Trainable(task, optimizer, ckpt, where, _ledger(ctx))


def _published(ctx: Context, where: position.Position, at: int) -> dict:
    """What a manifest records besides the settings: the input offset after `at`, this segment's sizing."""
    return {"input": where.record(at), "sizing": ctx.sizing.record()}


def _ledger(ctx: Context) -> ledger_lib.Ledger | None:
    """This task's part of the job's example-id record (--output-dir); `since` is set at the resume."""
    config = ctx.config
    if not config.output_dir:
        return None
    folder = os.path.join(config.output_dir, ledger_lib.FOLDER)
    names = [t.name for t in ctx.spec.tasks] if ctx.spec else [ctx.task_id.name]
    return ledger_lib.Ledger(
        directory=folder,
        task=ctx.task_id.name,
        rank=names.index(ctx.task_id.name),
        pipelines=len(names),
        epoch_examples=_epoch_examples(config),
        since=0,
    )


def _epoch_examples(config: Config) -> int | None:
    """Examples per epoch of a built-in task's input (None: a task of your own, whose input we do not know)."""
    if config.task not in taskspec.names():
        return None
    if config.data:
        return records.count(records.find(config.data))
    return data.problem(config.task, config.seed).num_examples
