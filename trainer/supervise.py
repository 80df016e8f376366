"""`python -m trainer.supervise [--max-restarts K] -- COMMAND ...`: run one task, restart it when that can help.

The entry point of every task's container. Docker's restart policy sees only "non-zero", so it
retried configuration errors and counted restarts over the container's whole life; this decides
from the exit code (trainer/errors.py) and from the job's progress:

    0         done: exit 0.
    1, 2      final (a bug, bad configuration): exit with it at once, never retried.
    3         missing peers: final on the first run (a peer that never came is a configuration
              problem); retryable once the task has run, because then its peers are restarting too.
    128-255   retryable: killed by a signal, 200 peer lost, 201 preempted. Restart the command.
    anything else (4-127): final.

Budget: at most K restarts without a new checkpoint. The checkpoint step is read from the child's
own /metrics (`trainer_last_checkpoint_step`, polled while it runs), so a long job survives any
number of faults as long as it keeps saving; when a retryable exit finds the budget spent the
supervisor exits 4 (EXIT_GAVE_UP), a final code for every engine.

Signals: SIGTERM and SIGINT are forwarded to the child (its own session, so a terminal's Ctrl-C
reaches it once), and then the child is not restarted: the container itself is being stopped
(`docker stop`, a preempted node), and whatever stopped it decides whether it comes back.
Standard library only; one line per decision on stderr, prefixed `supervise:`.
"""

from __future__ import annotations

import argparse
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import contract
from trainer.errors import EXIT_CONFIG, EXIT_FAILED, EXIT_GAVE_UP, EXIT_MISSING_PEERS, EXIT_OK, is_retryable

ENTRY = ("python", "-m", "trainer.supervise", "--")
"""What every emitter puts before the task's command."""
MAX_RESTARTS_ENV = "SUPERVISE_MAX_RESTARTS"
"""The budget K; the compose generator writes it from MAX_RESTARTS."""
DEFAULT_MAX_RESTARTS = contract.DEFAULT_MAX_RESTARTS
# Restart at once but not in a hot loop: peers need the same ~1 s to notice and exit; the budget,
# not a growing back-off, bounds the retries (a back-off could outgrow the peers' --cluster-timeout).
RESTART_DELAY_S = 1.0
POLL_S = 2.0
CHECKPOINT_LINE = re.compile(rf"^{contract.LAST_CHECKPOINT.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
MEANING = {
    EXIT_OK: "done",
    EXIT_FAILED: "permanent failure",
    EXIT_CONFIG: "bad configuration",
    EXIT_MISSING_PEERS: "missing peers",
    EXIT_GAVE_UP: "gave up: restart budget spent",
    200: "peer lost",
    201: "preempted",
}


@dataclass(frozen=True, kw_only=True)
class Settings:
    command: tuple[str, ...]
    """The task's command (the trainer, or a user's script through trainer.run_script)."""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """K: restarts allowed in a row without a new checkpoint; a new checkpoint renews the budget."""
    metrics_url: str = f"http://127.0.0.1:{contract.METRICS_PORT}/metrics"
    """The child's /metrics, where its last checkpoint step is read; empty: no progress is ever seen."""
    restart_delay: float = RESTART_DELAY_S
    poll: float = POLL_S

    def __post_init__(self) -> None:
        if not self.command:
            raise ValueError("no command to supervise: python -m trainer.supervise -- python -m trainer ...")
        if self.max_restarts < 0:
            raise ValueError(f"{MAX_RESTARTS_ENV}={self.max_restarts}: must be 0 or more")


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


def checkpoint_step(url: str) -> int | None:
    """The child's last checkpoint step from its /metrics, or None (not up, or metrics disabled)."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            found = CHECKPOINT_LINE.findall(response.read().decode())
    except (OSError, ValueError):
        return None
    return max((int(float(v)) for v in found), default=None)


class Budget:
    """K restarts in a row without progress; a checkpoint newer than any seen renews it."""

    def __init__(self, limit: int) -> None:
        self.limit, self.used, self.best, self._best_at_restart = limit, 0, -1, -1

    def saw(self, step: int | None) -> None:
        if step is not None:
            self.best = max(self.best, step)

    def spend(self) -> bool:
        """One restart: False when none is left."""
        if self.best > self._best_at_restart:
            self.used = 0
        self._best_at_restart = self.best
        if self.used >= self.limit:
            return False
        self.used += 1
        return True


class Supervisor:
    def __init__(
        self,
        settings: Settings,
        *,
        log: Callable[[str], None],
        progress: Callable[[str], int | None] = checkpoint_step,
    ) -> None:
        self._s, self._log, self._progress = settings, log, progress
        self._child: subprocess.Popen | None = None
        self._stopping: int | None = None
        self.budget = Budget(settings.max_restarts)

    def on_signal(self, signum: int, _frame=None) -> None:
        self._stopping = signum
        if self._child and self._child.poll() is None:
            self._child.send_signal(signum)

    def run(self) -> int:
        runs = 0
        while True:
            code = _as_exit(self._run_once())
            runs += 1
            verdict = decide(code, has_run=runs > 1)
            what = f"exited {code} ({meaning(code)})"
            if self._stopping is not None:
                self._log(
                    f"{what} after {signal.Signals(self._stopping).name}: the container is stopping, not restarting"
                )
                return code
            if verdict == "done":
                self._log(f"{what}")
                return EXIT_OK
            if verdict == "final":
                self._log(f"{what}: final, not restarting")
                return code
            if not self.budget.spend():
                self._log(
                    f"{what}: gave up, {self.budget.limit} restart(s) without a new checkpoint "
                    f"(last checkpoint {self._checkpoint_text()}); exit {EXIT_GAVE_UP}"
                )
                return EXIT_GAVE_UP
            self._log(
                f"{what}: restart {self.budget.used}/{self.budget.limit} since the last new checkpoint "
                f"({self._checkpoint_text()})"
            )
            time.sleep(self._s.restart_delay)
            if self._stopping is not None:  # stopped during the delay: nothing is running to forward to
                return code

    def _checkpoint_text(self) -> str:
        return f"step {self.budget.best}" if self.budget.best >= 0 else "none seen"

    def _run_once(self) -> int:
        self._child = subprocess.Popen(self._s.command, start_new_session=True)
        if self._stopping is not None:  # a signal between two runs: pass it on
            self._child.send_signal(self._stopping)
        while True:
            try:
                return self._child.wait(timeout=self._s.poll)
            except subprocess.TimeoutExpired:
                self.budget.saw(self._progress(self._s.metrics_url))


def _as_exit(code: int) -> int:
    """A child killed by signal N (Popen: -N) is reported as 128+N, as a shell and Docker do."""
    return 128 - code if code < 0 else code


def settings_from(argv: Sequence[str], env: Mapping[str, str]) -> Settings:
    p = argparse.ArgumentParser(prog="python -m trainer.supervise", description=__doc__.split("\n")[0])
    p.add_argument(
        "--max-restarts",
        type=int,
        default=None,
        help=f"restarts without a new checkpoint (${MAX_RESTARTS_ENV}, default {DEFAULT_MAX_RESTARTS})",
    )
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- then the task's command")
    ns = p.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    raw = (
        ns.max_restarts if ns.max_restarts is not None else env.get(MAX_RESTARTS_ENV) or DEFAULT_MAX_RESTARTS
    )
    try:
        limit = int(raw)
    except ValueError:
        raise ValueError(f"{MAX_RESTARTS_ENV}={raw!r}: must be an integer") from None
    port = env.get("TRAINER_METRICS_PORT", str(contract.METRICS_PORT))
    url = "" if port.strip() in ("", "0") else f"http://127.0.0.1:{port.strip()}/metrics"
    return Settings(command=tuple(command), max_restarts=limit, metrics_url=url)


def main(argv: Sequence[str] | None = None, env: Mapping[str, str] = os.environ) -> int:
    def log(message: str) -> None:
        print(f"supervise: {message}", file=sys.stderr, flush=True)

    try:
        settings = settings_from(sys.argv[1:] if argv is None else argv, env)
    except ValueError as err:
        log(str(err))
        return EXIT_CONFIG
    supervisor = Supervisor(settings, log=log)
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, supervisor.on_signal)
    try:
        return supervisor.run()
    except OSError as err:  # the command itself cannot start (not found, not executable)
        log(f"cannot run {settings.command[0]!r}: {err}")
        return EXIT_CONFIG


if __name__ == "__main__":
    sys.exit(main())
