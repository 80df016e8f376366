"""One task from a valid config to the end: metrics server, preflight, then TensorFlow."""

from __future__ import annotations

import logging
import os

from trainer.cluster import preflight
from trainer.cluster.spec import CHIEF, EVERY_ADDRESS, ClusterSpec, TaskId
from trainer.config import Config
from trainer.errors import STUCK_ENV, stuck_of
from trainer.telemetry import metrics as metrics_lib

log = logging.getLogger(__name__)


def run(config: Config, spec: ClusterSpec | None) -> None:
    task = spec.task if spec else TaskId(CHIEF, 0)
    host = spec.listen_host if spec else EVERY_ADDRESS
    metrics, server = metrics_lib.for_task(task, config.metrics_port, host)
    listener = None
    try:
        metrics.state("starting")
        if stuck := stuck_of(os.environ.get(STUCK_ENV, "")):
            metrics.stuck(*stuck)
        if spec is None:
            log.info("no TF_CONFIG: single-process run")
        elif spec.peers:
            metrics.state("waiting_for_peers")
            listener = preflight.Listener(preflight.own_port(spec), host)
            preflight.wait_for_peers(spec, config.cluster_timeout)
        from trainer.assembly import training  # TensorFlow is imported here, after the cheap checks

        training.run(config, spec, task, metrics, release_port=listener.close if listener else lambda: None)
        metrics.state("done")
        if server and config.metrics_linger:
            # The process is about to vanish with its /metrics endpoint: without this, the last scrape
            # predates the final steps and Prometheus never sees `done` (TrainerDown would then fire).
            server.linger(config.metrics_linger)
    except BaseException:
        metrics.state("failed")
        raise
    finally:
        if listener:
            listener.close()
        if server:
            server.close()
