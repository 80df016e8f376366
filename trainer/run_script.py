"""`python -m trainer.run_script PATH [args]`: bring your own training script, keep the telemetry.

Compose runs this when SCRIPT= is set. It serves the metrics every task has (process and network
metrics, trainer_build_info, trainer_state) on TRAINER_METRICS_PORT (default 8000, 0 disables),
labelled by the task from TF_CONFIG, starts TensorFlow's profiler server on TRAINER_PROFILER_PORT
(unset or 0: none) for `make profile`, sets TF_USE_LEGACY_KERAS=1 unless set, then runs the script
in this process as `__main__` with sys.argv = [PATH, args...] and exits with its status.
A script's own summaries belong under TRAINER_LOGDIR (the stack's TensorBoard volume), e.g.
`tf.keras.callbacks.TensorBoard(os.environ["TRAINER_LOGDIR"])`.
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import runpy
import sys
import traceback
from collections.abc import Mapping, Sequence

from prometheus_client import CollectorRegistry

import trainer
from trainer import tensorboard
from trainer.cluster import CHIEF, ClusterSpecError, TaskId, parse_tf_config
from trainer.errors import EXIT_CONFIG, EXIT_FAILED
from trainer.metrics import Server, TaskMetrics

log = logging.getLogger("trainer.run_script")
PROFILER_PORT_ENV = "TRAINER_PROFILER_PORT"
"""The stack's profiler port (contract.PROFILER_PORT): a server there lets `make profile` trace the script."""


def _tf_version() -> str:
    for dist in ("tensorflow-cpu", "tensorflow"):
        try:
            return importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            continue
    return "unknown"


def _exit_status(code: object) -> int:
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)  # sys.exit("message") prints it and exits 1, as Python does
    return 1


def run(path: str, args: Sequence[str], env: Mapping[str, str] = os.environ) -> int:
    try:
        spec = parse_tf_config(env.get("TF_CONFIG"))
        port = int(env.get("TRAINER_METRICS_PORT", "8000") or "8000")
        profiler_port = int(env.get(PROFILER_PORT_ENV, "0") or "0")
    except (ClusterSpecError, ValueError) as err:
        log.error("configuration error: %s", err)
        return EXIT_CONFIG
    if not os.path.isfile(path):
        log.error("configuration error: script %r does not exist", path)
        return EXIT_CONFIG
    task = spec.task if spec else TaskId(CHIEF, 0)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    registry = CollectorRegistry()
    metrics = TaskMetrics(registry, task)
    metrics.build_info(
        tf_version=_tf_version(),
        trainer_version=trainer.__version__,
        strategy="script",
        communication="script",
        task=os.path.basename(path),
    )
    server = Server(registry, port) if port else None
    tensorboard.start_profiler(profiler_port, task.name)
    metrics.state("training")
    sys.argv = [path, *args]
    try:
        runpy.run_path(path, run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
    except BaseException:  # noqa: BLE001 (whatever the script raises, report it and exit 1)
        traceback.print_exc()
        status = EXIT_FAILED
    metrics.state("done" if status == 0 else "failed")
    if server:
        server.close()
    return status


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname).1s %(message)s")
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else EXIT_CONFIG
    return run(argv[0], argv[1:])


if __name__ == "__main__":
    sys.exit(main())
