"""Exit codes: the contract between a task and whatever restarts it (compose, a launcher, CI).

0        the requested steps are done
1        a permanent failure not covered below (a bug, a broken plugin task, a save that failed)
2        bad configuration: a flag, an environment variable, TF_CONFIG, bad --data (the file and
         the fault), a checkpoint of other job settings, or tasks that disagree on the cluster
         spec, the TensorFlow version or the trainer version
3        missing peers: the preflight did not reach every peer, or the cluster did not form
         (a peer never registered), within --cluster-timeout
4        gave up: trainer.supervise.supervisor restarted the task its budget of times without a new checkpoint
5        a peer failed for good (it exited 1, 2 or 4): this task ends too, instead of waiting for it
128-255  retryable: restart every task and it resumes from the last checkpoint.
         200 = a peer died and the collective was aborted (TensorFlow's error is sticky inside
         the process, so the only recovery is a restart of every task).
         201 = preempted (SIGTERM here or on a peer): every task saved the same step and exited,
         so a restart of every task loses no step.
"""

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_MISSING_PEERS = 3
EXIT_GAVE_UP = 4
EXIT_PEER_FAILED = 5
EXIT_PEER_LOST = 200
EXIT_PREEMPTED = 201


class TrainerError(Exception):
    """An expected failure with a one-line message and the exit code the process ends with."""

    exit_code = EXIT_FAILED


class ConfigError(TrainerError):
    exit_code = EXIT_CONFIG


class DataError(ConfigError):
    """--data that the task cannot train on: one line naming the file (and record) and the fault."""


class MissingPeersError(TrainerError):
    exit_code = EXIT_MISSING_PEERS


class PeerFailedError(TrainerError):
    exit_code = EXIT_PEER_FAILED


class PeerLostError(TrainerError):
    exit_code = EXIT_PEER_LOST


class PreemptedError(TrainerError):
    exit_code = EXIT_PREEMPTED


def is_retryable(code: int) -> bool:
    """What a supervisor should do with an exit code: restart every task (True) or give up."""
    return 128 <= code <= 255


FINAL_NOTICE = b"mwms-final "
"""What a task that ended for good answers on its cluster port (trainer.supervise.supervisor): peers that
connect read `mwms-final <code> <why>` and end too (exit 5) instead of waiting for it."""
REASON_ENV = "SUPERVISE_REASON_FILE"
"""Where a task writes its one-line error for trainer.supervise.supervisor, whose last line repeats it."""
JOINING_ENV = "SUPERVISE_JOINING_FILE"
"""A file that exists while a task is inside MultiWorkerMirroredStrategy's constructor (trainer.cluster.joining),
which waits for every peer with SIGTERM held by TensorFlow and the GIL taken (its /metrics cannot answer):
trainer.supervise.supervisor SIGKILLs a task signalled then, which has nothing to save."""
DUMP_SIGNAL_NAME = "SIGUSR2"
"""On it a task writes every thread's Python stack to its log (faulthandler): trainer.supervise.supervisor sends
it to a task whose step is stuck, before ending it."""
STUCK_ENV = "SUPERVISE_STUCK"
"""`<step> <unix time>`: trainer.supervise.supervisor tells the run it starts that it ended this task's previous run
as stuck there and then; the task exports both (contract.STUCK_STEP, STUCK_TIME) for alerts and diagnose."""


def stuck_of(text: str) -> tuple[int, float] | None:
    """(step, unix time) of a STUCK_ENV value; None when empty or malformed (a hint, never fatal)."""
    try:
        step, at = text.split()
        return int(step), float(at)
    except ValueError:
        return None
