"""Build everything TensorFlow needs for one task and train it. Imported only after the config is
valid and the peers answer, because importing TensorFlow takes seconds.

Top-down: `run` builds the strategy (strategy.py) into a `Context`, then `_run` checks that the tasks
agree, sizes this segment's batch (resume.py), builds the model, optimizer and checkpoints (a
`Trainable`, build.py), resumes (resume.py), and hands the step functions, the checkpoints, the
metrics and the after-call actions to one `loop.Controller`; at the end (finish.py) the final
checkpoint, the exported model and the summary.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from functools import partial

import tensorflow as tf

import trainer
from trainer.assembly.build import Context, Trainable, build
from trainer.assembly.finish import finish
from trainer.assembly.resume import resume, sizing
from trainer.assembly.strategy import make_strategy
from trainer.cluster import agreement, device
from trainer.cluster.spec import ClusterSpec, TaskId
from trainer.config import Config
from trainer.core import fault
from trainer.core.timing import CallOutput, LoopResult
from trainer.data import records
from trainer.data import synthetic as data
from trainer.errors import ConfigError, MissingPeersError, PeerLostError, PreemptedError
from trainer.state import ledger as ledger_lib
from trainer.state.checkpoint import PEER_LOST
from trainer.tasks import spec as taskspec
from trainer.telemetry import run_settings, tensorboard
from trainer.train import fault as fault_hooks
from trainer.train import loop, progress, step

log = logging.getLogger(__name__)


def run(
    config: Config, spec: ClusterSpec | None, task_id: TaskId, metrics, release_port: Callable[[], None]
) -> None:
    release_port()
    try:
        strategy = make_strategy(config, spec)  # first: nothing may touch the TF context before it
    except PEER_LOST as err:
        raise MissingPeersError(
            f"the cluster did not form within {config.cluster_timeout:g}s (--cluster-timeout): "
            f"a peer accepts connections but never joined ({_first_line(err)}); check that "
            "every task runs with the same TF_CONFIG cluster"
        ) from None
    try:
        _run(Context(config, spec, task_id, strategy), metrics)
    except PEER_LOST as err:
        raise PeerLostError(
            f"a peer was lost, the collective is aborted ({_first_line(err)}); restart every task to resume"
        ) from None


def _first_line(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"


def _run(ctx: Context, metrics) -> None:
    if tf.keras.__name__.split(".")[0] != "tf_keras":
        raise ConfigError(
            "tf.keras is Keras 3, which cannot train under MWMS: install tf-keras "
            "and set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported"
        )
    if ctx.spec is not None:
        mine = agreement.fingerprints(ctx.spec, ctx.config, tf.__version__, trainer.__version__)
        agreement.check([t.name for t in ctx.spec.tasks], agreement.gather(ctx.strategy, mine))
    ctx = dataclasses.replace(ctx, sizing=sizing(ctx))
    _describe(ctx, metrics)
    tensorboard.start_profiler(ctx.config.profiler_port, ctx.task_id.name)
    log.info(
        "%s: %s", ctx.task_id.name, device.describe(_gpu_names(), tf.sysconfig.get_build_info(), os.environ)
    )
    job = build(ctx, durable=metrics.checkpointed)
    # The preemption handler restores the chief's latest checkpoint when it is made: before our own
    # resume, or it would put back the saved learning rate on the chief only (the tasks then drift).
    preemption = _preemption(ctx, job, metrics)
    start = resume(ctx, job)
    try:
        result = _train(ctx, job, metrics, start, preemption)
    except BaseException:  # a lost peer, a preemption: the save in flight still finishes (its write is local)
        job.checkpoints.settle()
        raise
    finish(ctx, job, metrics, result)


def _describe(ctx: Context, metrics) -> None:
    config = ctx.config
    metrics.world_size.set(ctx.strategy.num_replicas_in_sync)
    metrics.build_info(
        tf_version=tf.__version__,
        trainer_version=trainer.__version__,
        strategy=config.strategy,
        communication="AUTO" if config.strategy == "mwms" else "local",
        task=config.task,
        timing="every step" if config.measure_every == 1 else f"1 call in {config.measure_every}",
    )
    metrics.run_settings(**run_settings.of_config(config, ctx.strategy.num_replicas_in_sync, os.environ))


def _gpu_names() -> list[str]:
    gpus = tf.config.list_physical_devices("GPU")
    return [tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus]


def _preemption(ctx: Context, job: Trainable, metrics) -> tuple[loop.Action, ...]:
    """SIGTERM on any task -> every task saves the same step, then exits 201 (restart, 0 steps lost).

    TensorFlow's runtime swallows SIGTERM once MWMS is up; PreemptionCheckpointHandler installs its
    own handler, tells every peer through the coordination service, and agrees on the call after
    which all save (the save needs every task). Its call counter is part of the checkpoint, which
    only the chief restores, so every task restarts it from 0 to keep the counters equal.
    """
    if ctx.spec is None or not ctx.config.checkpoint_dir:
        return ()
    saved = {"step": 0}

    def exit_fn() -> None:
        if job.ledger is not None:  # the handler saved with the manager: the ledger's chunk is ours to write
            job.ledger.flush(saved["step"])
        # The handler's save was synchronous (TensorFlow first waits for a save in flight) and published.
        metrics.checkpointed(saved["step"])
        raise PreemptedError(
            f"preempted (SIGTERM here or on a peer): every task saved step {saved['step']}; "
            "restart every task to resume with no step lost"
        )

    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        ctx.strategy.cluster_resolver,
        job.checkpoints.manager,
        termination_config=tf.distribute.experimental.TerminationConfig(exit_fn=exit_fn),
    )
    handler._run_counter = 0  # noqa: SLF001 (see the docstring)

    def on_call(out: CallOutput) -> None:
        saved["step"] = out.step
        handler.save_checkpoint_if_preempted(checkpoint_number=out.step)

    return (on_call,)


def _agree(strategy, k: int) -> int:
    """The cluster's maximum of every task's `k`."""
    return int(max(row[0] for row in agreement.gather(strategy, [float(k)])))


def _train(
    ctx: Context, job: Trainable, metrics, start: int, preemption: tuple[loop.Action, ...]
) -> LoopResult:
    config = ctx.config
    # Each input pipeline serves its task's local replicas one per-replica batch each per step.
    consumed = start * len(ctx.strategy.extended.worker_devices)
    dataset_fn = data.resumed(job.task.dataset_fn, job.position.at(start), consumed)
    if blocked := fault.of(config.fault, ctx.task_id.name, "input-block"):
        dataset_fn = _blocking(dataset_fn, start, blocked)
    iterator = iter(ctx.strategy.distribute_datasets_from_function(dataset_fn))
    settings = loop.LoopSettings(
        task_name=ctx.task_id.name,
        steps=config.steps,
        steps_per_call=config.steps_per_call,
        measure_every=config.measure_every,
        save_every=config.save_every,
        save_seconds=config.save_seconds,
        local_examples=ctx.sizing.per_replica_batch * len(ctx.strategy.extended.worker_devices),
        classify=job.task.classify,
        record_ids=bool(config.output_dir),
    )
    options = dataclasses.replace(step.StepOptions.of(config), first_step=start)
    fns = step.build(ctx.strategy, job.task, job.optimizer, ctx.global_batch, options)
    metrics.watch_input(fns.input_step)
    controller = loop.Controller(
        fns=fns,
        checkpoints=ledger_lib.Saving(job.checkpoints, job.ledger),
        metrics=metrics,
        settings=settings,
        agree=partial(_agree, ctx.strategy),
        actions=(
            progress.ProgressLog(
                progress.Job(ctx.task_id.name, config.steps, ctx.global_batch), config.log_every
            ),
            *((job.ledger,) if job.ledger else ()),  # before the preemption check, which may end the loop
            *preemption,
            tensorboard.scalars(
                config.logdir,
                ctx.is_chief,
                config.log_every,
                tensorboard.rate_at(ctx.rate),
            ),
            fault_hooks.hang_action(fault.of(config.fault, ctx.task_id.name, "hang")),
        ),
    )
    metrics.target(config.steps)
    metrics.state("training")
    try:
        return controller.train(iterator, start)
    except records.DATA_FAULTS as err:
        if not config.data or config.task not in taskspec.names():
            raise
        raise records.locate(records.find(config.data), data.problem(config.task, config.seed), err) from None


def _blocking(dataset_fn, start: int, blocked: fault.Fault):
    def blocking(input_context):
        return fault_hooks.block_input(dataset_fn(input_context), start, blocked)

    return blocking
