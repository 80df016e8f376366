"""`python -m trainer [flags]`: one task of a synchronous data-parallel training job.

Flags and TRAINER_* variables (see --help), TF_CONFIG from the environment. Exit codes in
trainer/errors.py: 0 done, 2 bad configuration, 3 missing peers, 200 peer lost and 201 preempted
(retryable: restart every task).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import signal
import sys
import threading
from collections.abc import Mapping, Sequence

from trainer import config as config_lib
from trainer.cluster.spec import ClusterSpecError, parse_tf_config
from trainer.errors import (
    DUMP_SIGNAL_NAME,
    EXIT_CONFIG,
    EXIT_FAILED,
    REASON_ENV,
    ConfigError,
    TrainerError,
    is_retryable,
)

log = logging.getLogger("trainer")


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    logging.basicConfig(
        level=logging.INFO, format="%(asctime)s %(levelname).1s %(message)s", stream=sys.stderr
    )
    dump_stacks_on_signal()
    try:
        config = config_lib.from_args(sys.argv[1:] if argv is None else argv, env)
        spec = parse_tf_config(env.get("TF_CONFIG"))
        if spec is not None and config.strategy == "mirrored":
            raise ConfigError(
                "--strategy mirrored runs in one process: unset TF_CONFIG or use --strategy mwms"
            )
    except (ConfigError, ClusterSpecError) as err:
        return failed(f"configuration error: {err}", EXIT_CONFIG, env)
    # Before TensorFlow is imported: Keras 3 cannot train under MWMS (keras-team/keras#20585).
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")
    from trainer import run

    try:
        run.run(config, spec)
    except TrainerError as err:
        code = failed(str(err), err.exit_code, env)
        if is_retryable(code):
            # Before this block ends: the end of the block frees the traceback, and with it the training
            # loop's frames and their TensorFlow datasets and collectives, whose teardown waited for peers
            # already gone. A preempted task (make down) took 20-40 s to exit in 5 of 9 tries, its main
            # thread asleep on this line; exit_now skips that teardown.
            exit_now(code)
        return code
    except Exception as err:
        log.exception("training failed")
        return failed(f"training failed: {type(err).__name__}: {err}", EXIT_FAILED, env, logged=True)
    return 0


def dump_stacks_on_signal() -> None:
    """SIGUSR2 (trainer.supervise.supervisor, when the step is stuck) writes every thread's Python stack to stderr.

    Not `faulthandler.register`: its C handler walks every thread's frames while they run, and crashed
    the task (SIGSEGV) when a scrape thread was in Python at that moment (measured: a stuck worker
    scraped by its peers' supervisors). Here the signal is blocked in every thread (those started later
    inherit the mask, TensorFlow's included) and one thread waits for it, then dumps holding the GIL,
    when no other thread is inside a Python frame. Called first, before any other thread exists.
    """
    signum = getattr(signal, DUMP_SIGNAL_NAME)
    signal.pthread_sigmask(signal.SIG_BLOCK, {signum})

    def wait_and_dump() -> None:
        while True:
            signal.sigwait({signum})
            faulthandler.dump_traceback(all_threads=True)

    threading.Thread(target=wait_and_dump, name="stack-dump", daemon=True).start()


def failed(line: str, code: int, env: Mapping[str, str], *, logged: bool = False) -> int:
    """Log the one-line error and leave it where trainer.supervise.supervisor repeats it in its last line."""
    if not logged:
        log.error("%s", line)
    if path := env.get(REASON_ENV):
        try:
            with open(path, "w") as f:
                f.write((line.splitlines() or [""])[0] + "\n")
        except OSError:
            pass
    return code


def exit_now(code: int) -> None:
    """Exit with `code`. A retryable failure skips TensorFlow's teardown: its error is sticky and its
    coordination-service shutdown would wait for the dead peer (measured: ~10 s) before the restart."""
    if is_retryable(code):
        logging.shutdown()
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)


if __name__ == "__main__":
    exit_now(main())
