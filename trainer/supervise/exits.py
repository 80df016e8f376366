"""The exit policy: what the supervisor does with each exit code of its task (trainer/errors.py).

0         done: exit 0.
1, 2      final (a bug, bad configuration): exit with it at once, never retried.
3         missing peers: final on the first run (a peer that never came is a configuration
          problem); retryable once the task has run, because then its peers are restarting too.
128-255   retryable: killed by a signal, 200 peer lost, 201 preempted. Restart the command.
anything else (4-127): final.
"""

from __future__ import annotations

import signal

from trainer.errors import (
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_GAVE_UP,
    EXIT_MISSING_PEERS,
    EXIT_OK,
    EXIT_PEER_FAILED,
    is_retryable,
)

MEANING = {
    EXIT_OK: "done",
    EXIT_FAILED: "permanent failure",
    EXIT_CONFIG: "bad configuration",
    EXIT_MISSING_PEERS: "missing peers",
    EXIT_GAVE_UP: "gave up: restart budget spent",
    EXIT_PEER_FAILED: "a peer failed for good",
    200: "peer lost",
    201: "preempted",
}


def meaning(code: int) -> str:
    """A few words for an exit code (Popen gives -N for "killed by signal N", a shell or tini 128+N)."""
    signum = -code if code < 0 else code - 128
    if code not in MEANING and signum in {s.value for s in signal.Signals}:
        return f"killed by {signal.Signals(signum).name}"
    return MEANING.get(code, "retryable" if is_retryable(code) else "final")


def decide(code: int, *, has_run: bool) -> str:
    """`done`, `final` or `retry` for a child's exit code (`has_run`: this is not its first run)."""
    if code == EXIT_OK:
        return "done"
    if code < 0 or is_retryable(code) or (code == EXIT_MISSING_PEERS and has_run):
        return "retry"
    return "final"


def as_exit(code: int) -> int:
    """A child killed by signal N (Popen: -N) is reported as 128+N, as a shell and Docker do."""
    return 128 - code if code < 0 else code
