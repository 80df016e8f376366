"""Build everything TensorFlow needs for one task and train it. Imported only after the config is
valid and the peers answer, because importing TensorFlow takes seconds.

Top-down: `run` builds the strategy (a `Context`), then `_run` checks that the tasks agree, builds
the model, optimizer and checkpoints (a `Trainable`), resumes, and hands the step functions, the
checkpoints, the metrics and the after-call actions to one `loop.Controller`; at the end the final
checkpoint, the exported model and the summary.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import tensorflow as tf

import trainer
from trainer.cluster import agreement, device, joining, server_config
from trainer.cluster.spec import ClusterSpec, TaskId
from trainer.config import Config
from trainer.core.timing import CallOutput
from trainer.data import position, records
from trainer.data import synthetic as data
from trainer.errors import ConfigError, MissingPeersError, PeerLostError, PreemptedError
from trainer.state import ledger as ledger_lib
from trainer.state import manifest, output, resize, summary
from trainer.state.checkpoint import (
    PEER_LOST,
    Checkpointer,
    NoCheckpoints,
    Place,
    Record,
    SaveError,
    broadcast_from,
    copy_lags,
    holder,
    newest_manifest,
)
from trainer.tasks import spec as taskspec
from trainer.tasks import task as tasks
from trainer.telemetry import run_settings, tensorboard
from trainer.train import fault, loop, progress, step

log = logging.getLogger(__name__)
# How long a finishing task waits at exit for the others to finish too (TF default: 10 min... of nothing).
SHUTDOWN_BARRIER_S = 30


def make_strategy(config: Config, spec: ClusterSpec | None) -> tf.distribute.Strategy:
    if config.strategy == "mirrored":
        return tf.distribute.MirroredStrategy()
    # AUTO: NCCL between GPUs, RING on CPU. These are the strategy's defaults, which the step's explicit
    # replica-context all-reduce inherits (batch_reduce_to merges them).
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO,
        bytes_per_pack=config.bytes_per_pack,
    )
    resolver = None
    if spec is not None:  # from our validated spec, not from os.environ (one source of truth)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec.cluster_dict()),
            task_type=spec.task.type,
            task_id=spec.task.index,
            rpc_layer="grpc",
        )
        configure_coordination(config, resolver.cluster_spec())
        server_config.apply(server_config.DEFAULT)  # before MWMS: it starts the gRPC server
    with joining.joining():
        return tf.distribute.MultiWorkerMirroredStrategy(
            cluster_resolver=resolver, communication_options=options
        )


def configure_coordination(config: Config, cluster: tf.train.ClusterSpec) -> None:
    """The coordination service with our timeouts instead of TensorFlow's (wait forever to register).

    MWMS configures it only if nobody did, so this must run before the strategy is built. Private
    API: TF 2.21 has no public way to set these. heartbeat: a task silent this long (dead, hung,
    partitioned) aborts every task's collectives (exit 200); register: a peer that accepts TCP but
    never joins the cluster (an old incarnation, another job) ends start-up instead of hanging it.
    """
    from tensorflow.compiler.xla.tsl.protobuf import coordination_config_pb2
    from tensorflow.python.distribute import multi_worker_util
    from tensorflow.python.eager import context

    jobs = [
        coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job))
        for job in ("chief", "worker")
        if job in cluster.jobs
    ]
    context.context().configure_coordination_service(
        service_type="standalone",
        service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs,
        heartbeat_timeout_in_ms=int(config.heartbeat_timeout * 1000),
        cluster_register_timeout_in_ms=int(config.cluster_timeout * 1000),
        shutdown_barrier_timeout_in_ms=int(SHUTDOWN_BARRIER_S * 1000),
    )
    # Without the barrier a task that registered goes on and waits in its first collective forever
    # for one that never joins (measured: a worker with a wrong port in its TF_CONFIG).
    context.context().coordination_service.cluster_register_with_barrier = True


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

    task: tasks.Task
    optimizer: tf.keras.optimizers.Optimizer
    checkpoints: Checkpointer | NoCheckpoints
    position: position.Position
    """The job's global example offset (trainer/data/position.py), set at the resume."""
    ledger: ledger_lib.Ledger | None
    """This task's part of the job's example-id record (--output-dir), made at the resume."""


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
    ctx = dataclasses.replace(ctx, sizing=_sizing(ctx))
    _describe(ctx, metrics)
    tensorboard.start_profiler(ctx.config.profiler_port, ctx.task_id.name)
    log.info(
        "%s: %s", ctx.task_id.name, device.describe(_gpu_names(), tf.sysconfig.get_build_info(), os.environ)
    )
    job = _build(ctx)
    # The preemption handler restores the chief's latest checkpoint when it is made: before our own
    # resume, or it would put back the saved learning rate on the chief only (the tasks then drift).
    preemption = _preemption(ctx, job, metrics)
    start = _resume(ctx, job)
    result = _train(ctx, job, metrics, start, preemption)
    _finish(ctx, job, metrics, result)


def _sizing(ctx: Context) -> resize.Sizing:
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


def _build(ctx: Context) -> Trainable:
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
                ),
                accept_new_settings=bool(config.resume_new_settings),
            )
            if config.checkpoint_dir
            else NoCheckpoints()
        )
    return Trainable(task, optimizer, ckpt, where, _ledger(ctx))


def _published(ctx: Context, where: position.Position, at: int) -> dict:
    """What a manifest records besides the settings: the input offset after `at`, this segment's sizing."""
    return {"input": where.record(at), "sizing": ctx.sizing.record()}


def _resume(ctx: Context, job: Trainable) -> int:
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
) -> loop.LoopResult:
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
            fault.hang_action(fault.of(config.fault, ctx.task_id.name, "hang")),
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
        return fault.block_input(dataset_fn(input_context), start, blocked)

    return blocking


def _copy_out(ctx: Context, final: summary.Summary) -> None:
    """What produced the final model, recorded with it; both copied out of the checkpoint folder (a
    volume `make clean` deletes) when --export-dir is set."""
    config = ctx.config
    body = {
        **dataclasses.asdict(final),
        "steps": config.steps,
        "settings": manifest.job_settings(config, ctx.strategy.num_replicas_in_sync),
        "sizing": ctx.sizing.record(),
    }
    body.pop("example_ids", None)
    try:
        output.record(config.checkpoint_dir, body)
        if not config.export_dir:
            return
        path = output.copy_out(config.checkpoint_dir, config.export_dir)
    except OSError as err:
        raise SaveError(
            f"copying the final model to {config.export_dir} failed ({err}); it is still in "
            f"{config.checkpoint_dir}/export (make output copies it again)"
        ) from None
    log.info(
        "%s: final model in %s, summary in %s",
        ctx.task_id.name,
        path,
        os.path.join(config.export_dir, "summary.json"),
    )


def _finish(ctx: Context, job: Trainable, metrics, result: loop.LoopResult) -> None:
    """The final checkpoint and model (chief's directory), then this task's summary."""
    config, name = ctx.config, ctx.task_id.name
    # On every task, at the same point: reading BatchNorm's sync-on-read statistics (the weights'
    # digest) is a collective, and a chief reading them alone waits for peers that have left.
    final = summary.build(name, result, job.task.model.variables)
    if job.ledger is not None:
        job.ledger.flush(result.final_step)
    if config.checkpoint_dir:
        metrics.state("checkpointing")
        if result.final_step > result.start_step:  # a run resumed at its last step has nothing new to save
            job.checkpoints.save(result.final_step)
        metrics.checkpointed(result.final_step)
        log.info("%s: exported the final model to %s", name, job.checkpoints.export())
        if ctx.is_chief:
            _copy_out(ctx, final)
    job.checkpoints.close()
    if config.output_dir:
        path = summary.write(final, config.output_dir)
        log.info("%s: summary in %s", name, path)
