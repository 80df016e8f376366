"""A task's start: this segment's batch (a resize when the world size changed), the replica every task
restores from, its step and input offset, and the one line saying where the job resumes.
"""

from __future__ import annotations

import dataclasses
import logging

import tensorflow as tf

from trainer.assembly.build import Context, Trainable
from trainer.cluster import agreement
from trainer.data import position
from trainer.state import ledger as ledger_lib
from trainer.state import resize
from trainer.state.checkpoint import broadcast_from, copy_lags, holder, newest_manifest
from trainer.train import step

log = logging.getLogger(__name__)


def sizing(ctx: Context) -> resize.Sizing:
    """This segment's batch, from the checkpoint the job resumes (its world size may differ), and the
    one line a resize prints. A task without a copy (a new worker, a worker whose tmpfs went with its
    container) takes the per-replica batch of the task holding the newest step, as it takes its weights."""
    config, replicas = ctx.config, ctx.strategy.num_replicas_in_sync
    body = (
        newest_manifest(config.checkpoint_dir, ctx.task_id.name, ctx.is_chief)
        if config.checkpoint_dir
        else None
    )
    before = resize.saved(body)
    now = resize.plan(
        replicas=replicas, per_replica_batch=config.per_replica_batch, keep=config.resize_keep, before=before
    )
    if ctx.spec is not None:
        rows = agreement.gather(
            ctx.strategy, [float(body["step"] if body else -1), float(now.per_replica_batch)]
        )
        if (source := holder(rows)) is not None:
            now = dataclasses.replace(now, per_replica_batch=int(rows[source][1]))
    rates = tuple(resize.rate(config.learning_rate, config.lr_scaling, s) for s in (before or now, now))
    if before and (line := resize.change(before, now, body["step"], rates)):
        log.info("%s: %s", ctx.task_id.name, line)
    return now


def resume(ctx: Context, job: Trainable) -> int:
    """The task holding the newest copy restores, every task takes the configured learning rate, then
    that task's values: the step to start from. The rate is a variable under --lr-scaling none, saved
    with the optimizer: the settings check (or --resume-new-settings) makes the configured one right,
    on every task alike."""
    source, source_task, rows = _restore_source(ctx, job)
    restored = job.checkpoints.restore() if source_task == ctx.task_id.name else None
    rate = ctx.rate
    if not isinstance(rate, tf.keras.optimizers.schedules.LearningRateSchedule):
        job.optimizer.learning_rate = rate
    if ctx.spec is not None:
        broadcast_from(ctx.strategy, job.task.model.variables + job.optimizer.variables, source)
    start = int(job.optimizer.iterations.numpy())
    job.position.step, job.position.offset = start, _offset(ctx, job, rows, source)
    if job.ledger is not None:
        job.ledger.since = start
        if ctx.is_chief:  # the chunks past `start` are trained again; no task writes before its next save
            ledger_lib.forget_after(job.ledger.directory, start)
    if copy_lags(rows, start):  # every task (a save is collective), so no copy of `start` is the only one
        job.checkpoints.save(start)
        job.checkpoints.wait()
    log.info(
        "%s: %s, %d replicas in sync, %s",
        ctx.task_id.name,
        f"resumed at step {start} from {restored}"
        if restored
        else f"starting at step {start}" + (f" ({source_task}'s)" if start and source_task else ""),
        ctx.strategy.num_replicas_in_sync,
        step.describe_lr(ctx.config, ctx.strategy.num_replicas_in_sync, ctx.sizing.per_replica_batch),
    )
    if start >= ctx.config.steps:
        log.warning(
            "%s: nothing to train: the checkpoint is at step %d, --steps %d asks for no more; raise --steps "
            "to continue, or start over with an empty --checkpoint-dir (make clean)",
            ctx.task_id.name,
            start,
            ctx.config.steps,
        )
    return start


def _restore_source(ctx: Context, job: Trainable) -> tuple[int, str | None, list[list[float]]]:
    """The replica whose values every task takes, its task's name (None: no task has a checkpoint), and
    the agreement's rows (newest readable step, task index, own newest step). Every task gathers each
    task's newest readable step: a lost chief's volume costs only what the other copies lack."""
    if ctx.spec is None:
        return 0, ctx.task_id.name if job.checkpoints.newest_step is not None else None, []
    names = [t.name for t in ctx.spec.tasks]
    newest, own = job.checkpoints.newest_step, job.checkpoints.own_step
    rows = agreement.gather(
        ctx.strategy,
        [
            float(-1 if newest is None else newest),
            float(names.index(ctx.task_id.name)),
            float(-1 if own is None else own),
            float(_own_offset(ctx, job)),  # exact: float64 holds integers to 2**53
        ],
    )
    source = holder(rows)
    return (0, None, rows) if source is None else (source, names[int(rows[source][1])], rows)


def _own_offset(ctx: Context, job: Trainable) -> int:
    """The input offset of the newest copy this task found (0: none)."""
    body = job.checkpoints.newest_manifest
    return position.saved_offset(body, resize.saved(body).global_batch if resize.saved(body) else None)


def _offset(ctx: Context, job: Trainable, rows: list[list[float]], source: int) -> int:
    """The restored step's input offset: the restoring task's, which every task gathered."""
    if not rows:
        return _own_offset(ctx, job) if job.checkpoints.newest_step is not None else 0
    return int(rows[source][3]) if rows[source][0] >= 0 else 0
