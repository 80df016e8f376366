"""`python -m trainer.script PATH [args]`: bring your own training script, keep the telemetry.

Compose runs this when SCRIPT= is set. It serves the contract's metrics on TRAINER_METRICS_PORT
(default contract.METRICS_PORT, 0 disables), labelled by the task from TF_CONFIG: those every task has (process,
network, trainer_build_info, trainer_state) and, through trainer/observe (docs/script.md), the step
time, counters, loss and the sampled compute / all-reduce / input split of `model.fit` and
`strategy.run` loops. It starts TensorFlow's profiler server on TRAINER_PROFILER_PORT (unset or 0:
none) for `make profile`, sets TF_USE_LEGACY_KERAS=1 unless set (and then `import keras` gets tf-keras
too, said in one line; a script using Keras 3's own APIs is refused in one line: trainer/script/keras3.py),
then runs the script in this process as `__main__` with sys.argv = [PATH, args...] and its folder first
on sys.path, as `python PATH` would, and exits with its status. A failure ends in one error line, the one
`make wait` and `make status` show: a module the image lacks names it and REQUIREMENTS=
(trainer/script/failure.py).
A script's own summaries belong under TRAINER_LOGDIR (the stack's TensorBoard volume), e.g.
`tf.keras.callbacks.TensorBoard(os.environ["TRAINER_LOGDIR"])`.

Faults, as for the built-in trainer: when the script raises what TensorFlow raises on a survivor of
a lost peer (the collective aborted: Unavailable, Aborted, Cancelled, DeadlineExceeded), this exits
200 (peer lost, retryable) instead of 1, so trainer.supervise.supervisor restarts every task and the script
runs again from the top. Where it resumes is the script's own business, in TRAINER_CHECKPOINT_DIR
(the same directory in every task on one host, as MWMS expects): e.g.
`tf.keras.callbacks.BackupAndRestore(os.environ["TRAINER_CHECKPOINT_DIR"])` in `fit`, or a
`tf.train.CheckpointManager` there. SIGTERM (`docker stop`) ends the script, or runs the handler it
set, although MWMS's preemption notifier would swallow it (trainer/script/sigterm.py). See docs/faults.md.
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

import contract
import trainer
from trainer import observe
from trainer.cluster.spec import CHIEF, EVERY_ADDRESS, ClusterSpecError, TaskId, parse_tf_config
from trainer.errors import EXIT_CONFIG, EXIT_PEER_LOST, REASON_ENV
from trainer.observe import config as observe_config
from trainer.script import failure, keras3, sigterm
from trainer.telemetry import run_settings, tensorboard
from trainer.telemetry.metrics import Metrics, Server

log = logging.getLogger("trainer.script.wrapper")
PROFILER_PORT_ENV = "TRAINER_PROFILER_PORT"
"""The stack's profiler port (contract.PROFILER_PORT): a server there lets `make profile` trace the script."""
LINGER_ENV = "TRAINER_METRICS_LINGER"
"""Seconds a finished task keeps serving its metrics (compose/deployment.py sets it on every target)."""


PEER_LOST = ("UnavailableError", "AbortedError", "CancelledError", "DeadlineExceededError")
"""trainer.state.checkpoint.PEER_LOST by name: this module must not import TensorFlow before the script does."""


def peer_lost(err: BaseException) -> bool:
    """True for TensorFlow's errors of a survivor whose peer died (the script may wrap them: follow the cause)."""
    while err is not None:
        if type(err).__module__.startswith("tensorflow") and type(err).__name__ in PEER_LOST:
            return True
        err = err.__cause__ or err.__context__
    return False


def _reason(line: str, env: Mapping[str, str]) -> None:
    if path := env.get(REASON_ENV):
        try:
            with open(path, "w") as f:
                f.write(line + "\n")
        except OSError:
            pass


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


def _keras3_refusal(path: str) -> str | None:
    """One line refusing a script that uses Keras 3 APIs tf-keras lacks (keras3.py), else None."""
    try:
        source = open(path, encoding="utf-8").read()
        if not keras3.imports_keras(source, path) or (api := keras3.Api.installed()) is None:
            return None
        found = keras3.uses(source, api, path)
    except (OSError, SyntaxError, ValueError):
        return None  # the script's own error, raised as Python raises it when it runs
    return keras3.refusal(path, found) if found else None


def run(path: str, args: Sequence[str], env: Mapping[str, str] = os.environ) -> int:
    try:
        spec = parse_tf_config(env.get("TF_CONFIG"))
        port = int(env.get("TRAINER_METRICS_PORT") or contract.METRICS_PORT)
        profiler_port = int(env.get(PROFILER_PORT_ENV, "0") or "0")
        observe_config.from_env(env)
    except (ClusterSpecError, ValueError) as err:
        log.error("configuration error: %s", err)
        return EXIT_CONFIG
    if not os.path.isfile(path):
        log.error("configuration error: script %r does not exist", path)
        return EXIT_CONFIG
    task = spec.task if spec else TaskId(CHIEF, 0)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    legacy = os.environ["TF_USE_LEGACY_KERAS"] == "1"  # `import keras` gets tf-keras too (keras3.py)
    if legacy and (refused := _keras3_refusal(path)):
        log.error("%s", refused)
        _reason(refused, env)
        return EXIT_CONFIG
    alias = keras3.install() if legacy else None
    registry = CollectorRegistry()
    metrics = Metrics(registry, task)
    metrics.build_info(
        tf_version=_tf_version(),
        trainer_version=trainer.__version__,
        strategy=contract.SCRIPT_STRATEGY,
        communication=contract.SCRIPT_STRATEGY,
        task=os.path.basename(path),
    )
    metrics.run_settings(**run_settings.of_script(os.path.basename(path), env))
    server = Server(registry, port, spec.listen_host if spec else EVERY_ADDRESS) if port else None
    tensorboard.start_profiler(profiler_port, task.name)
    metrics.state("training")
    sampler = observe.install(metrics, env)
    sigterm.install()
    sys.argv = [path, *args]
    sys.path.insert(0, os.path.dirname(os.path.abspath(path)))  # as `python train.py`: its own modules import
    try:
        if spec is not None:  # the script's own MWMS starts its server with the trainer's settings
            from trainer.cluster import server_config

            server_config.apply(server_config.DEFAULT)
        runpy.run_path(path, run_name="__main__")
        status = 0
    except SystemExit as exit_:
        status = _exit_status(exit_.code)
    except BaseException as err:  # noqa: BLE001 (whatever the script raises, report it in one line)
        first = (str(err).splitlines() or [""])[0][:200]
        if peer_lost(err):
            traceback.print_exc()
            log.error(
                "a peer was lost, the collective is aborted (%s: %s); restart every task to resume",
                type(err).__name__,
                first,
            )
            _reason(f"a peer was lost ({type(err).__name__}: {first})", env)
            status = EXIT_PEER_LOST
        else:
            known = failure.explain(err, path, aliased=alias is not None and alias.used)
            if known.traceback:
                traceback.print_exc()
            log.error("%s", known.line)  # the last error line: what `make wait` and `make status` show
            _reason(known.line, env)
            status = known.code
    keras3.uninstall(alias)
    sampler.close()
    metrics.state("done" if status == 0 else "failed")
    linger = float(env.get(LINGER_ENV, "0") or "0")
    if server and linger and status == 0:
        # As the built-in trainer does (trainer/run.py): without it the last scrape predates the final
        # steps, and a finished worker read `step 110 of 200 (55%)` in `make status` for good.
        server.linger(linger)
    if server:
        server.close()
    return status


def main(argv: Sequence[str] | None = None) -> int:
    """The script's status; trainer.__main__.exit_now skips TensorFlow's teardown after a lost peer."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname).1s %(message)s")
    from trainer.__main__ import dump_stacks_on_signal

    dump_stacks_on_signal()
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else EXIT_CONFIG
    return run(argv[0], argv[1:])


def run_as_main() -> None:
    """`python -m trainer.script`: exit with the script's status (see main)."""
    from trainer.__main__ import exit_now

    exit_now(main())


if __name__ == "__main__":
    run_as_main()
