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

Across container restarts (SUPERVISE_STATE_DIR, a volume): the runs, the budget and a final exit
are kept in `<dir>/<hostname>.json`, the hostname being the container's id, so a new container (`make
up` after `make down`) starts afresh while a restarted one (killed, the engine or the host restarted)
goes on: a restart of the container spends the budget like a restart of the trainer, and a container
whose task ended for good (0, 1, 2, 3 on the first run, 4, 5) exits at once with the same code
without running the task again, whoever starts it.

Failing as a group: after a final exit 1, 2 or 4 the supervisor answers on the task's cluster port
(`mwms-final <code> <why>`, trainer.errors.FINAL_NOTICE) for SUPERVISE_NOTICE_SECONDS (default 60) or
until every peer has connected: peers restarting after the lost collective read it in their
preflight and end with exit 5 at once, instead of waiting for it round after round.

Stuck, not dead: a trainer whose step stops advancing (a hung input pipeline, a collective that
never completes) still heartbeats, so nothing else ends it. Once its step has advanced in this run,
the supervisor reads `trainer_global_step` and the step histogram's p99 from the same /metrics; when
the step has not moved for longer than SUPERVISE_STALL = "multiple,floor,ceiling" (default
"20,60,900": 20 x the p99 step, at least 60 s, at most 900 s; "0" disables), it finds the stuck task.
Every task of a stuck job sees its step frozen (the others wait in the collective), so each supervisor
reads every task's `trainer_input_step` (the step whose batch the task has taken: its own /metrics and
its peers', on the same port at their TF_CONFIG hosts): the tasks behind the others are the ones not in
the collective. A supervisor whose task is behind, or that finds nobody behind (all equal, or peers
unreadable), ends its task: SIGUSR2 (the trainer's faulthandler writes every thread's Python stack to
the log), then SIGKILL: exit 137, retryable. Its peers' collectives then fail (exit 200) and every
task restarts from the last checkpoint, or ends with that line when the budget is spent; the next run
exports the stuck step and time (SUPERVISE_STUCK to the child; contract.STUCK_STEP, STUCK_TIME). A
supervisor whose task is not behind (or that cannot read a peer: being ended) leaves it to that
task's supervisor, and ends its own task too only if the step is still frozen DEFER_BOUNDS bounds later.

Signals: SIGTERM and SIGINT are forwarded to the child (its own session, so a terminal's Ctrl-C
reaches it once), and then the child is not restarted: the container itself is being stopped
(`docker stop`, a preempted node), and whatever stopped it decides whether it comes back.
Standard library only; one line per decision on stderr, prefixed `supervise:`.
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import contract
from trainer.cluster.spec import ClusterSpecError, parse_tf_config
from trainer.errors import (
    DUMP_SIGNAL_NAME,
    EXIT_CONFIG,
    EXIT_FAILED,
    EXIT_GAVE_UP,
    EXIT_MISSING_PEERS,
    EXIT_OK,
    EXIT_PEER_FAILED,
    FINAL_NOTICE,
    JOINING_ENV,
    REASON_ENV,
    STUCK_ENV,
    is_retryable,
)
from trainer.state import atomic

ENTRY = ("python", "-m", "trainer.supervise.supervisor", "--")
"""What every emitter puts before the task's command."""
MAX_RESTARTS_ENV = "SUPERVISE_MAX_RESTARTS"
"""The budget K; the compose generator writes it from MAX_RESTARTS."""
DEFAULT_MAX_RESTARTS = contract.DEFAULT_MAX_RESTARTS
STATE_DIR_ENV = "SUPERVISE_STATE_DIR"
"""Where the state that outlives the container's processes is kept (a volume); unset: nowhere."""
NOTICE_ENV = "SUPERVISE_NOTICE_SECONDS"
DEFAULT_NOTICE_S = 60.0
NOTICE_CODES = (EXIT_FAILED, EXIT_CONFIG, EXIT_GAVE_UP)
"""Finals a peer must hear of: 3 is every task's own timeout, 5 is already the echo of another's final."""
# Restart at once but not in a hot loop: peers need the same ~1 s to notice and exit; the budget,
# not a growing back-off, bounds the retries (a back-off could outgrow the peers' --cluster-timeout).
RESTART_DELAY_S = 1.0
POLL_S = 2.0
STALL_ENV = "SUPERVISE_STALL"
DUMP_SIGNAL = getattr(signal, DUMP_SIGNAL_NAME)
"""The trainer's faulthandler writes every thread's stack on it (trainer/__main__.py, trainer/script/wrapper.py)."""
DUMP_GRACE_S = 2.0
DEFER_BOUNDS = 2.0
"""A task not behind waits this many stall bounds for the named task's end to fail its collective (the
peers notice within the heartbeat timeout) before it ends itself."""
STATE_LINE = re.compile(
    rf'^{contract.STATE.name}{{[^}}]*{contract.STATE.client_name}="([a-z_]+)"[^}}]*}} 1(?:\.0)?$',
    re.MULTILINE,
)
TARGET_LINE = re.compile(rf"^{contract.TARGET_STEPS.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
INPUT_LINE = re.compile(rf"^{contract.INPUT_STEP.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
STEP_LINE = re.compile(rf"^{contract.GLOBAL_STEP.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
BUCKET_LINE = re.compile(rf'^{contract.STEP.name}_bucket{{[^}}]*le="([^"]+)"[^}}]*}} (\S+)$', re.MULTILINE)
CHECKPOINT_LINE = re.compile(rf"^{contract.LAST_CHECKPOINT.name}(?:{{[^}}]*}})? (\S+)$", re.MULTILINE)
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


@dataclass(frozen=True)
class StallBound:
    """How long a step may stand still: `multiple` x the p99 step, within [floor, ceiling] seconds."""

    multiple: float = 20.0
    floor: float = 60.0
    ceiling: float = 900.0

    def seconds(self, p99: float | None) -> float:
        return self.ceiling if p99 is None else min(self.ceiling, max(self.floor, self.multiple * p99))

    def describe(self, p99: float | None) -> str:
        measured = f"{self.multiple:g} x p99 step {p99:.3g}s" if p99 is not None else "no step time yet"
        return f"{self.seconds(p99):.0f}s: {measured}, floor {self.floor:g}s, ceiling {self.ceiling:g}s"

    @classmethod
    def parse(cls, text: str) -> StallBound | None:
        """`multiple,floor,ceiling`; "0": never (None)."""
        if text.strip() == "0":
            return None
        try:
            multiple, floor, ceiling = (float(x) for x in text.split(","))
        except ValueError:
            raise ValueError(
                f"{STALL_ENV}={text!r}: must be multiple,floor,ceiling (e.g. 20,60,900) or 0"
            ) from None
        if not 0 < floor <= ceiling or multiple <= 0:
            raise ValueError(f"{STALL_ENV}={text!r}: needs multiple > 0 and 0 < floor <= ceiling")
        return cls(multiple, floor, ceiling)


@dataclass(frozen=True, kw_only=True)
class Settings:
    command: tuple[str, ...]
    """The task's command (the trainer, or a user's script through trainer.script.wrapper)."""
    max_restarts: int = DEFAULT_MAX_RESTARTS
    """K: restarts allowed in a row without a new checkpoint; a new checkpoint renews the budget."""
    metrics_url: str = f"http://127.0.0.1:{contract.METRICS_PORT}/metrics"
    """The child's /metrics, where its last checkpoint step is read; empty: no progress is ever seen."""
    restart_delay: float = RESTART_DELAY_S
    poll: float = POLL_S
    state_file: str = ""
    """The JSON state of this container's task (SUPERVISE_STATE_DIR/<hostname>.json); empty: not kept."""
    notice_port: int = 0
    """This task's cluster port, where a final exit is announced to peers; 0: no announcement."""
    peers: int = 0
    notice_seconds: float = DEFAULT_NOTICE_S
    stall: StallBound | None = StallBound()
    """When a step that stopped advancing counts as stuck; None: never."""
    task: str = contract.CHIEF
    """This task's name (from TF_CONFIG), in the stuck task's verdict."""
    peer_metrics: tuple[tuple[str, str], ...] = ()
    """(task name, /metrics URL) of every peer, where their input steps are read when the step is stuck."""

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
    text = metrics_text(url)
    if text is None:
        return None
    return max((int(float(v)) for v in CHECKPOINT_LINE.findall(text)), default=None)


def metrics_text(url: str) -> str | None:
    """The child's /metrics page, or None: metrics disabled, not up yet, or gone. A child that exits
    while it answers cuts the page short (http.client.IncompleteRead, not an OSError): that is gone too,
    not a crash of the supervisor (seen at a job's end: the task's container then exited 1)."""
    if not url:
        return None
    try:
        with urllib.request.urlopen(url, timeout=1) as response:
            return response.read().decode()
    except (OSError, ValueError, http.client.HTTPException):
        return None


def step_and_p99(url: str) -> tuple[int | None, float | None]:
    """The child's global step and the p99 of its step histogram (upper bucket bound), from /metrics."""
    text = metrics_text(url)
    if text is None:
        return None, None
    steps = [int(float(v)) for v in STEP_LINE.findall(text)]
    states = STATE_LINE.findall(text)
    targets = [float(v) for v in TARGET_LINE.findall(text)]
    if states and "training" not in states:  # saving, done (the final export, the metrics linger): not stuck
        steps = []
    if steps and targets and 0 < max(targets) <= max(steps):  # the last step is done: the end of the job
        steps = []  # (final collectives, save, export) waits for the slowest task, it is no frozen step
    return (max(steps) if steps else None), p99(
        [(float(le), float(count)) for le, count in BUCKET_LINE.findall(text)]
    )


def input_step(url: str) -> int | None:
    """The step whose batch the task at `url` has taken (contract.INPUT_STEP), or None."""
    text = metrics_text(url)
    if text is None:
        return None
    values = [float(v) for v in INPUT_LINE.findall(text) if v.lower() != "nan"]
    return int(max(values)) if values else None


def behind(inputs: Mapping[str, int | None]) -> tuple[str, ...]:
    """The tasks whose input step is below another task's (unknown ones ignored); () when nobody is:
    in a stuck job those never took the batch that their peers are all-reducing."""
    known = {t: s for t, s in inputs.items() if s is not None}
    if len(set(known.values())) < 2:
        return ()
    low = min(known.values())
    return tuple(sorted((t for t, s in known.items() if s == low), key=contract.task_order))


def p99(buckets: list[tuple[float, float]]) -> float | None:
    """The upper bound of the bucket holding the 99th percentile of cumulative `(le, count)` buckets."""
    buckets = sorted(buckets)
    total = buckets[-1][1] if buckets else 0
    if not total:
        return None
    finite = [(le, count) for le, count in buckets if count >= 0.99 * total and le != float("inf")]
    return finite[0][0] if finite else max(le for le, _ in buckets if le != float("inf"))


class Budget:
    """K restarts in a row without progress; a checkpoint newer than any seen renews it."""

    def __init__(self, limit: int, used: int = 0, best: int = -1, best_at_restart: int = -1) -> None:
        self.limit, self.used, self.best, self._best_at_restart = limit, used, best, best_at_restart

    def fields(self) -> dict[str, int]:
        return {"used": self.used, "best": self.best, "best_at_restart": self._best_at_restart}

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


@dataclass
class State:
    """What one container's task did, kept across restarts of the container."""

    runs: int = 0
    budget: dict[str, int] = field(default_factory=dict)
    final: int | None = None
    why: str = ""
    stuck: str = ""
    """`<step> <unix time>` the supervisor last ended this task as stuck (errors.STUCK_ENV), or ""."""

    @classmethod
    def load(cls, path: str) -> State:
        try:
            raw = json.loads(Path(path).read_text()) if path else {}
        except FileNotFoundError:
            raw = {}
        except (OSError, ValueError):  # torn or unreadable: the budget restarts, nothing final is lost
            raw = {}
        return cls(**{k: raw[k] for k in ("runs", "budget", "final", "why", "stuck") if k in raw})

    def save(self, path: str) -> None:
        if not path:
            return
        atomic.write_json(
            path, asdict(self)
        )  # whole or not at all: a kill mid-write leaves the previous state


def announce(port: int, peers: int, text: bytes, seconds: float) -> int:
    """Answer `text` to whoever connects to `port` until `peers` distinct hosts have, or `seconds`
    pass; how many hosts were told (0 if the port cannot be bound)."""
    told: set[str] = set()
    try:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("", port))
        sock.listen(16)
    except OSError:
        return 0
    deadline = time.monotonic() + seconds
    with sock:
        while len(told) < peers and (left := deadline - time.monotonic()) > 0:
            sock.settimeout(left)
            try:
                conn, (host, _port) = sock.accept()
            except OSError:  # timed out
                break
            with conn:
                try:
                    conn.sendall(text)
                    told.add(host)
                except OSError:
                    pass
    return len(told)


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
            code = _as_exit(self._run_once())
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


class StallWatch:
    """Is the step standing still for longer than the bound? Armed once it has advanced in this run
    (start-up, restore and tracing are the cluster timeout's business)."""

    def __init__(self, bound: StallBound | None, clock: Callable[[], float]) -> None:
        self._bound, self._clock = bound, clock
        self._step: int | None = None
        self._since = 0.0
        self._armed = False
        self._paused = False
        self.bound_s = 0.0
        """The bound of the last stall seen, seconds."""

    @property
    def step(self) -> int | None:
        return self._step

    def saw(self, step: int | None, p99_s: float | None) -> str:
        """ "" or why the step counts as stuck. A step of None (not training: saving, done; or no
        metrics) stops the clock: the frozen time counts from the next step seen."""
        if self._bound is None:
            return ""
        now = self._clock()
        if step is None:
            self._paused = True
            return ""
        if self._paused:
            self._paused, self._since = False, now
        if step != self._step:
            self._armed = self._step is not None
            self._step, self._since = step, now
            return ""
        still = now - self._since
        self.bound_s = self._bound.seconds(p99_s)
        if self._armed and still > self.bound_s:
            return f"step stuck at {step} for {still:.0f}s (bound {self._bound.describe(p99_s)})"
        return ""


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
    state_dir = env.get(STATE_DIR_ENV, "")
    state_file = os.path.join(state_dir, f"{socket.gethostname()}.json") if state_dir else ""
    try:
        notice = float(env.get(NOTICE_ENV) or DEFAULT_NOTICE_S)
    except ValueError:
        raise ValueError(f"{NOTICE_ENV}={env.get(NOTICE_ENV)!r}: must be a number of seconds") from None
    notice_port, peers = _cluster_port(env.get("TF_CONFIG"))
    task, peer_metrics = _peer_metrics(env.get("TF_CONFIG"), port.strip())
    stall = StallBound.parse(env[STALL_ENV]) if env.get(STALL_ENV) else StallBound()
    return Settings(
        command=tuple(command),
        max_restarts=limit,
        metrics_url=url,
        state_file=state_file,
        notice_port=notice_port,
        peers=peers,
        notice_seconds=notice,
        stall=stall,
        task=task,
        peer_metrics=peer_metrics,
    )


def _peer_metrics(tf_config: str | None, port: str) -> tuple[str, tuple[tuple[str, str], ...]]:
    """This task's name and every peer's /metrics URL: the same port at the peer's TF_CONFIG host (true
    of every target; local process clusters differ by port, so their peers read as unknown)."""
    try:
        spec = parse_tf_config(tf_config)
    except ClusterSpecError:
        spec = None
    if spec is None:
        return contract.CHIEF, ()
    if port in ("", "0"):
        return spec.task.name, ()
    urls = tuple((p.name, f"http://{spec.address(p).rpartition(':')[0]}:{port}/metrics") for p in spec.peers)
    return spec.task.name, urls


def _cluster_port(tf_config: str | None) -> tuple[int, int]:
    """This task's cluster port and its number of peers, from TF_CONFIG; (0, 0) without one (the
    trainer itself reports a bad TF_CONFIG, with exit 2)."""
    try:
        spec = parse_tf_config(tf_config)
    except ClusterSpecError:
        return 0, 0
    if spec is None or not spec.peers:
        return 0, 0
    return int(spec.address(spec.task).rpartition(":")[2]), len(spec.peers)


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
