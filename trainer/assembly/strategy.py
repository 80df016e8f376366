"""The strategy of one task: MultiWorkerMirroredStrategy (or MirroredStrategy in one process), with the
coordination service's timeouts and the gRPC server's settings put in before it starts.
"""

from __future__ import annotations

import tensorflow as tf

from trainer.cluster import joining, server_config
from trainer.cluster.spec import ClusterSpec
from trainer.config import Config

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
