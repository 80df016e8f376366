"""Build everything TensorFlow needs for one task and train it. Imported only after the config is
valid and the peers answer, because importing TensorFlow takes seconds.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable

import tensorflow as tf

import trainer
from trainer import agreement, device, loop, step, summary, tasks
from trainer.checkpoint import Checkpointer, NoCheckpoints, broadcast_from_chief
from trainer.cluster import ClusterSpec, TaskId
from trainer.config import Config
from trainer.errors import ConfigError, MissingPeersError, PeerLostError, PreemptedError

log = logging.getLogger(__name__)
# What a dead peer looks like from a survivor: the collective is aborted, sticky for the process.
PEER_LOST = (tf.errors.UnavailableError, tf.errors.AbortedError, tf.errors.CancelledError,
             tf.errors.DeadlineExceededError)
# How long a finishing task waits at exit for the others to finish too (TF default: 10 min... of nothing).
SHUTDOWN_BARRIER_S = 30


def make_strategy(config: Config, spec: ClusterSpec | None) -> tf.distribute.Strategy:
    if config.strategy == "mirrored":
        return tf.distribute.MirroredStrategy()
    # AUTO: NCCL between GPUs, RING on CPU. These are the strategy's defaults, which the step's explicit
    # replica-context all-reduce inherits (batch_reduce_to merges them).
    options = tf.distribute.experimental.CommunicationOptions(
        implementation=tf.distribute.experimental.CommunicationImplementation.AUTO,
        bytes_per_pack=config.bytes_per_pack)
    resolver = None
    if spec is not None:  # from our validated spec, not from os.environ (one source of truth)
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec.cluster_dict()), task_type=spec.task.type, task_id=spec.task.index,
            rpc_layer="grpc")
        configure_coordination(config, resolver.cluster_spec())
    return tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver, communication_options=options)


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

    jobs = [coordination_config_pb2.CoordinatedJob(name=job, num_tasks=cluster.num_tasks(job))
            for job in ("chief", "worker") if job in cluster.jobs]
    context.context().configure_coordination_service(
        service_type="standalone", service_leader=multi_worker_util.coordination_leader(cluster),
        coordinated_jobs=jobs, heartbeat_timeout_in_ms=int(config.heartbeat_timeout * 1000),
        cluster_register_timeout_in_ms=int(config.cluster_timeout * 1000),
        shutdown_barrier_timeout_in_ms=int(SHUTDOWN_BARRIER_S * 1000))
    # Without the barrier a task that registered goes on and waits in its first collective forever
    # for one that never joins (measured: a worker with a wrong port in its TF_CONFIG).
    context.context().coordination_service.cluster_register_with_barrier = True


def run(config: Config, spec: ClusterSpec | None, task_id: TaskId, metrics,
        release_port: Callable[[], None]) -> None:
    release_port()
    try:
        strategy = make_strategy(config, spec)  # first: nothing may touch the TF context before it
    except PEER_LOST as err:
        raise MissingPeersError(f"the cluster did not form within {config.cluster_timeout:g}s (--cluster-timeout): "
                                f"a peer accepts connections but never joined ({_first_line(err)}); check that "
                                "every task runs with the same TF_CONFIG cluster") from None
    try:
        _run(config, spec, task_id, metrics, strategy)
    except PEER_LOST as err:
        raise PeerLostError(f"a peer was lost, the collective is aborted ("
                            f"{_first_line(err)}); restart every task to resume") from None


def _first_line(err: Exception) -> str:
    return f"{type(err).__name__}: {(str(err).splitlines() or [''])[0][:200]}"


def _run(config: Config, spec: ClusterSpec | None, task_id: TaskId, metrics, strategy) -> None:
    if tf.keras.__name__.split(".")[0] != "tf_keras":
        raise ConfigError("tf.keras is Keras 3, which cannot train under MWMS: install tf-keras "
                          "and set TF_USE_LEGACY_KERAS=1 before TensorFlow is imported")
    if spec is not None:
        mine = agreement.fingerprints(spec, config, tf.__version__, trainer.__version__)
        agreement.check([t.name for t in spec.tasks], agreement.gather(strategy, mine))
    _describe(config, strategy, metrics)
    log.info("%s: %s", task_id.name, device.describe(_gpu_names(), tf.sysconfig.get_build_info(), os.environ))
    task, optimizer, ckpt = _build(config, strategy, is_chief=spec.is_chief if spec else True)
    start = _resume(config, strategy, spec, task_id, task, optimizer, ckpt)
    on_call = _preemption(config, strategy, spec, ckpt, metrics)
    result = _train(config, strategy, task_id, task, optimizer, ckpt, metrics, start, on_call)
    if config.checkpoint_dir:
        metrics.state("checkpointing")
        if result.final_step > start:  # a run resumed at its last step has nothing new to save
            ckpt.save(result.final_step)
        metrics.checkpointed(result.final_step)
        log.info("%s: exported the final model to %s", task_id.name, ckpt.export())
    ckpt.close()
    if config.output_dir:
        path = summary.write(summary.build(task=task_id.name, start_step=start, final_step=result.final_step,
                                           loss=result.loss, accuracy=result.accuracy,
                                           variables=task.model.variables, ids=result.ids), config.output_dir)
        log.info("%s: summary in %s", task_id.name, path)


def _describe(config: Config, strategy, metrics) -> None:
    metrics.world_size.set(strategy.num_replicas_in_sync)
    metrics.build_info(tf_version=tf.__version__, trainer_version=trainer.__version__, strategy=config.strategy,
                       communication="AUTO" if config.strategy == "mwms" else "local", task=config.task,
                       timing="every step" if config.measure_every == 1 else f"1 call in {config.measure_every}")


def _gpu_names() -> list[str]:
    gpus = tf.config.list_physical_devices("GPU")
    return [tf.config.experimental.get_device_details(g).get("device_name", g.name) for g in gpus]


def _build(config: Config, strategy, *, is_chief: bool):
    with strategy.scope():
        task = tasks.build(tasks.load(config.task), per_replica_batch=config.per_replica_batch,
                           seed=config.seed, data=config.data, input_delay_ms=config.input_delay_ms)
        optimizer = step.optimizer(config, strategy.num_replicas_in_sync)
        optimizer.build(task.model.trainable_variables)  # slots exist before restore and broadcast
        ckpt = (Checkpointer(config.checkpoint_dir, is_chief, task.model, optimizer)
                if config.checkpoint_dir else NoCheckpoints())
    return task, optimizer, ckpt


def _resume(config: Config, strategy, spec, task_id: TaskId, task, optimizer, ckpt) -> int:
    """Restore what this task can read, then take the chief's values: the step to start from."""
    restored = ckpt.restore()
    if spec is not None:
        broadcast_from_chief(strategy, task.model.variables + optimizer.variables)
    start = int(optimizer.iterations.numpy())
    log.info("%s: %s, %d replicas in sync, %s", task_id.name,
             f"resumed at step {start} from {restored}" if restored else f"starting at step {start}",
             strategy.num_replicas_in_sync, step.describe_lr(config, strategy.num_replicas_in_sync))
    return start


def _preemption(config: Config, strategy, spec, ckpt, metrics) -> Callable[[int], None]:
    """SIGTERM on any task -> every task saves the same step, then exits 201 (restart, 0 steps lost).

    TensorFlow's runtime swallows SIGTERM once MWMS is up; PreemptionCheckpointHandler installs its
    own handler, tells every peer through the coordination service, and agrees on the call after
    which all save (the save needs every task). Its call counter is part of the checkpoint, which
    only the chief restores, so every task restarts it from 0 to keep the counters equal.
    """
    if spec is None or not config.checkpoint_dir:
        return lambda at: None
    saved = {"step": 0}

    def exit_fn() -> None:
        metrics.checkpointed(saved["step"])
        raise PreemptedError(f"preempted (SIGTERM here or on a peer): every task saved step {saved['step']}; "
                             "restart every task to resume with no step lost")

    handler = tf.distribute.experimental.PreemptionCheckpointHandler(
        strategy.cluster_resolver, ckpt.manager,
        termination_config=tf.distribute.experimental.TerminationConfig(exit_fn=exit_fn))
    handler._run_counter = 0  # noqa: SLF001 (see the docstring)

    def on_call(at: int) -> None:
        saved["step"] = at
        handler.save_checkpoint_if_preempted(checkpoint_number=at)

    return on_call


def _train(config: Config, strategy, task_id: TaskId, task, optimizer, ckpt, metrics, start: int,
           on_call: Callable[[int], None]):
    global_batch = config.per_replica_batch * strategy.num_replicas_in_sync
    settings = loop.LoopSettings(
        task_name=task_id.name, steps=config.steps, steps_per_call=config.steps_per_call,
        measure_every=config.measure_every, log_every=config.log_every, save_every=config.save_every,
        global_batch=global_batch, local_examples=config.per_replica_batch * len(strategy.extended.worker_devices),
        classify=task.classify, record_ids=bool(config.output_dir))

    def save(at: int) -> None:
        metrics.state("checkpointing")
        ckpt.save(at)
        metrics.checkpointed(at)
        metrics.state("training")

    def agree(k: int) -> int:
        return int(max(row[0] for row in agreement.gather(strategy, [float(k)])))

    iterator = iter(strategy.distribute_datasets_from_function(task.dataset_fn))
    fns = step.build(strategy, task, optimizer, global_batch, step.StepOptions.of(config))
    metrics.state("training")
    return loop.train(fns, iterator, start_step=start, settings=settings, metrics=metrics, save=save, agree=agree,
                      after_call=on_call)
