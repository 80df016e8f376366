"""The seam between the host and the container: compose/, monitoring/ and bench/ use the trainer only
through the names below (tests/unit/test_import_graph.py fails on any other `trainer.*` import there),
so a change inside trainer/ that keeps these names keeps the host working.

Two kinds:
- what the host must know of a task, standard library only and imported here: its configuration and
  the environment prefix of its flags, exit codes, the cluster spec and every target's address
  template, the supervisor (its command, settings and exit meanings), the JobSet entry, the gRPC
  server settings, the job settings a checkpoint fixes (manifest), the SCRIPT= split's knobs and trace reader, bench-comm's in-container probe;
- the trainer's own parts that `make bench` runs in-process on the host's TensorFlow (IN_PROCESS),
  loaded on first use so that compose/ and monitoring/ never load TensorFlow.
"""

from __future__ import annotations

import importlib
from types import ModuleType

from trainer import __version__, config
from trainer.bench import allreduce_sweep
from trainer.cluster import jobset_entry, server_config
from trainer.cluster.spec import (
    CHIEF,
    COMPOSE_ADDRESS,
    TFJOB_ADDRESS,
    WORKER,
    ClusterSpec,
    TaskId,
    from_template,
    on_ports,
    parse_tf_config,
)
from trainer.config import ENV_PREFIX, Config, from_args
from trainer.errors import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_GAVE_UP,
    EXIT_MISSING_PEERS,
    EXIT_PEER_FAILED,
    ConfigError,
)
from trainer.observe import config as observe_config
from trainer.observe import trace
from trainer.state import manifest
from trainer.supervise import supervisor

IN_PROCESS = {
    "agreement": "trainer.cluster.agreement",
    "checkpoint": "trainer.state.checkpoint",
    "loop": "trainer.train.loop",
    "metrics": "trainer.telemetry.metrics",
    "progress": "trainer.train.progress",
    "step": "trainer.train.step",
    "tasks": "trainer.assembly.task",
    "training": "trainer.assembly.training",
}
"""Name -> module of the in-process parts (`from trainer.host import training`)."""


def __getattr__(name: str) -> ModuleType:
    if name in IN_PROCESS:
        return importlib.import_module(IN_PROCESS[name])
    raise AttributeError(f"module {__name__!r} has no attribute {name!r} (the host's seam: trainer/host.py)")


__all__ = [
    "CHIEF",
    "COMPOSE_ADDRESS",
    "ENV_PREFIX",
    "EXIT_CONFIG",
    "EXIT_FAILED",
    "EXIT_GAVE_UP",
    "EXIT_MISSING_PEERS",
    "EXIT_PEER_FAILED",
    "TFJOB_ADDRESS",
    "WORKER",
    "ClusterSpec",
    "Config",
    "ConfigError",
    "TaskId",
    "__version__",
    "allreduce_sweep",
    "config",
    "from_args",
    "from_template",
    "jobset_entry",
    "manifest",
    "observe_config",
    "on_ports",
    "parse_tf_config",
    "server_config",
    "supervisor",
    "trace",
    *IN_PROCESS,
]
