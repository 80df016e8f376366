"""`python -m trainer.supervise [--max-restarts K] -- COMMAND ...`: run one task, restart it when that can help.

The entry point of every task's container, and its process loop. Docker's restart policy sees only
"non-zero", so it retried configuration errors and counted restarts over the container's whole life;
this decides from the exit code and from the job's progress. One module per concern, this loop on top:
exits.py (which codes are retried), budget.py (K restarts without a new checkpoint, and the state
kept across container restarts), probe.py (what /metrics says), stall.py (a step standing still: the
stuck task), notice.py (telling peers of a final exit), settings.py (flags and environment).

Signals: SIGTERM and SIGINT are forwarded to the child (its own session, so a terminal's Ctrl-C
reaches it once), and then the child is not restarted: the container itself is being stopped
(`docker stop`, a preempted node), and whatever stopped it decides whether it comes back.
Standard library only; one line per decision on stderr, prefixed `supervise:`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import (
    DUMP_SIGNAL_NAME,
    EXIT_CONFIG,
    EXIT_GAVE_UP,
    EXIT_OK,
    FINAL_NOTICE,
    JOINING_ENV,
    REASON_ENV,
    STUCK_ENV,
)
from trainer.supervise.budget import Budget, State
from trainer.supervise.exits import as_exit, decide, meaning
from trainer.supervise.notice import NOTICE_CODES, announce
from trainer.supervise.probe import checkpoint_step, input_step, step_and_p99
from trainer.supervise.settings import MAX_RESTARTS_ENV, STATE_DIR_ENV, Settings, settings_from
from trainer.supervise.stall import DEFER_BOUNDS, STALL_ENV, StallBound, StallWatch, behind

ENTRY = ("python", "-m", "trainer.supervise.supervisor", "--")
"""What every emitter puts before the task's command."""
DUMP_SIGNAL = getattr(signal, DUMP_SIGNAL_NAME)
"""The trainer's faulthandler writes every thread's stack on it (trainer/__main__.py, trainer/script/wrapper.py)."""
DUMP_GRACE_S = 2.0
__all__ = [
    "ENTRY",
    "MAX_RESTARTS_ENV",
    "STALL_ENV",
    "STATE_DIR_ENV",
    "Probes",
    "Settings",
    "StallBound",
    "Supervisor",
    "main",
    "meaning",
]
"""What the host uses of the supervisor (trainer/host.py: the compose generator and compose/wait.py)."""


@dataclass(frozen=True)
class Probes:
    """What the supervisor reads of its task and its peers (tests give their own)."""

    progress: Callable[[str], int | None] = checkpoint_step
    steps: Callable[[str], tuple[int | None, float | None]] = step_and_p99
    inputs: Callable[[str], int | None] = input_step
    clock: Callable[[], float] = time.monotonic
    wall: Callable[[], float] = time.time


class Supervisor:
    def __init__(
        self, settings: Settings, *, log: Callable[[str], None], probes: Probes | None = None
    ) -> None:
        probes = probes or Probes()
        self._s, self._log, self._progress, self._steps = settings, log, probes.progress, probes.steps
        self._inputs, self._clock, self._wall = probes.inputs, probes.clock, probes.wall
        self._deferred: tuple[str, float] | None = None
        """(whom this task waits for, since when) while another task is named stuck."""
        self.stuck: str = ""
        """Why the last run was ended as stuck, if it was."""
        self._child: subprocess.Popen | None = None
        self._stopping: int | None = None
        self.state = State.load(settings.state_file)
        self.budget = Budget(settings.max_restarts, **self.state.budget)
        self._reason = os.path.join(tempfile.gettempdir(), f"supervise-reason-{os.getpid()}")
        self._joining = Path(tempfile.gettempdir(), f"supervise-joining-{os.getpid()}")

    def on_signal(self, signum: int, _frame=None) -> None:
        self._stopping = signum
        if self._child and self._child.poll() is None:
            self._child.send_signal(signum)

    def run(self) -> int:
        if self.state.final is not None:
            code = self.state.final
            self._log(
                f"this task already ended for good: exit {code} ({meaning(code)}){self._why(self.state.why)}; "
                "not running it again (make up starts a new job)"
            )
            return code
        if self.state.runs and not self._container_restarted():
            return self._final(EXIT_GAVE_UP, "exited after a restart of its container")
        while True:
            self.state.runs += 1  # counted at the start: a container killed mid-run knows it had run
            self._save()
            code = as_exit(self._run_once())
            verdict = decide(code, has_run=self.state.runs > 1)
            what = f"exited {code} ({meaning(code)})"
            if self._stopping is not None:
                self._log(
                    f"{what} after {signal.Signals(self._stopping).name}: the container is stopping, not restarting"
                )
                return code
            if verdict == "done":
                self._log(f"{what}")
                return self._final(EXIT_OK, quiet=True)
            if verdict == "final":
                return self._final(code, what)
            if self.stuck:
                what = f"{what} ({self.stuck})"
            if not self.budget.spend():
                self._log(
                    f"{what}: gave up, {self.budget.limit} restart(s) without a new checkpoint "
                    f"(last checkpoint {self._checkpoint_text()}); exit {EXIT_GAVE_UP}"
                )
                return self._final(EXIT_GAVE_UP, quiet=True)
            self._save()
            self._log(
                f"{what}: restart {self.budget.used}/{self.budget.limit} since the last new checkpoint "
                f"({self._checkpoint_text()})"
            )
            time.sleep(self._s.restart_delay)
            if self._stopping is not None:  # stopped during the delay: nothing is running to forward to
                return code

    def _container_restarted(self) -> bool:
        """The container itself was started again after run N: spend one restart; False when none is left."""
        if not self.budget.spend():
            self._log(
                f"container restarted after run {self.state.runs}: gave up, {self.budget.limit} restart(s) "
                f"without a new checkpoint (last checkpoint {self._checkpoint_text()}); exit {EXIT_GAVE_UP}"
            )
            return False
        self._save()
        self._log(
            f"container restarted after run {self.state.runs} (killed, or its engine or host restarted): "
            f"restart {self.budget.used}/{self.budget.limit} since the last new checkpoint ({self._checkpoint_text()})"
        )
        return True

    def _final(self, code: int, what: str = "", *, quiet: bool = False) -> int:
        """Record a final exit (it stays final across container restarts), tell the peers, return it."""
        why = self._child_reason()
        self.state.final, self.state.why = code, why
        self._save()
        if not quiet:
            self._log(f"{what}: final, not restarting{self._why(why)}")
        if code in NOTICE_CODES and self._s.notice_port and self._s.peers:
            text = FINAL_NOTICE + f"{code} {meaning(code)}{self._why(why)}\n".encode()
            told = announce(self._s.notice_port, self._s.peers, text, self._s.notice_seconds)
            self._log(
                f"told {told}/{self._s.peers} peer(s) this task ended for good; exit {code}{self._why(why)}"
            )
        return code

    def _child_reason(self) -> str:
        try:
            return Path(self._reason).read_text().strip().splitlines()[-1]
        except (OSError, IndexError):
            return ""

    @staticmethod
    def _why(why: str) -> str:
        return f": {why}" if why else ""

    def _save(self) -> None:
        self.state.budget = self.budget.fields()
        try:
            self.state.save(self._s.state_file)
        except OSError as err:  # a full or read-only volume must not end the task
            self._log(f"cannot keep state in {self._s.state_file}: {err}")

    def _checkpoint_text(self) -> str:
        return f"step {self.budget.best}" if self.budget.best >= 0 else "none seen"

    def _run_once(self) -> int:
        Path(self._reason).unlink(missing_ok=True)
        self._joining.unlink(missing_ok=True)
        env = {**os.environ, REASON_ENV: self._reason, JOINING_ENV: str(self._joining)} | (
            {STUCK_ENV: self.state.stuck} if self.state.stuck else {}
        )
        self._child = subprocess.Popen(self._s.command, start_new_session=True, env=env)
        if self._stopping is not None:  # a signal between two runs: pass it on
            self._child.send_signal(self._stopping)
        self.stuck, watch, self._deferred = "", StallWatch(self._s.stall, self._clock), None
        while True:
            try:
                return self._child.wait(timeout=self._s.poll)
            except subprocess.TimeoutExpired:
                if self._stopping is not None:
                    self._end_joining()
                best = self.budget.best  # a preempted task's last save still renews the budget
                self.budget.saw(self._progress(self._s.metrics_url))
                if self.budget.best != best:  # kept at once: a kill of the container must not forget it
                    self._save()
                if (why := watch.saw(*self._steps(self._s.metrics_url))) and not self.stuck:
                    self._on_stuck(why, watch)

    def _end_joining(self) -> None:
        """A signalled child still joining its cluster cannot act on the signal and has nothing to save:
        SIGKILL it (trainer/cluster/joining.py). Otherwise it is saving or leaving: let it."""
        if not self._joining.exists():
            return
        self._log(
            f"{signal.Signals(self._stopping).name} while joining its cluster (nothing to save): SIGKILL"
        )
        try:
            os.killpg(self._child.pid, signal.SIGKILL)
        except OSError:  # already gone
            pass

    def _on_stuck(self, why: str, watch: StallWatch) -> None:
        """Name the task behind; end this one if it is behind, or if nobody is and every peer answers;
        else wait: the task named (or a peer not answering: being ended) is its own supervisor's, and
        its end fails this task's collective too. Still frozen DEFER_BOUNDS bounds later: end this one."""
        me = self._s.task
        inputs = {me: self._inputs(self._s.metrics_url)}
        inputs |= {name: self._inputs(url) for name, url in self._s.peer_metrics}
        late = behind(inputs)
        gone = [t for t, step in inputs.items() if step is None and t != me]
        shown = ", ".join(f"{t} {'?' if s is None else s}" for t, s in inputs.items())
        if me in late or not (late or gone):
            who = f"{me} is behind its peers, not in the collective" if late else "no task is behind"
            return self._end_stuck(f"{why}; {who} (input steps: {shown})", watch.step)
        whom = f"{', '.join(late)} behind" if late else f"{', '.join(gone)} not answering"
        now, grace = self._clock(), DEFER_BOUNDS * watch.bound_s
        if (
            self._deferred is None or self._deferred[0] != whom
        ):  # news (e.g. the one behind is gone now): wait anew
            self._deferred = (whom, now)
            self._log(f"{why}; {whom} (input steps: {shown}): its supervisor ends it")
        elif now - self._deferred[1] > grace:
            self._end_stuck(
                f"{why}; {whom}, still frozen {grace:.0f}s later: ending this task too", watch.step
            )

    def _end_stuck(self, why: str, step: int | None) -> None:
        """Every thread's stack into the log, then SIGKILL: the run ends with a retryable 137."""
        self.stuck = why
        self.state.stuck = f"{step if step is not None else -1} {self._wall():.3f}"
        self._save()
        self._log(
            f"stuck: {why}: writing every thread's stack to the log ({DUMP_SIGNAL.name}), then restarting"
        )
        assert self._child is not None
        try:
            self._child.send_signal(DUMP_SIGNAL)
            self._child.wait(timeout=DUMP_GRACE_S)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.killpg(self._child.pid, signal.SIGKILL)
        except OSError:  # already gone
            pass


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
