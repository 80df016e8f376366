"""`make wait`: block until the training job is over; exit with its outcome.

Every task's container runs trainer.supervise.supervisor, which restarts the trainer inside the container on a
retryable exit and itself exits only when its task is over: 0 done, or a final code (1 permanent,
2 bad configuration, 3 missing peers, 4 gave up after its restart budget). So the job is over when
  - the chief's container exits 0: done, exit 0;
  - any task's container exits 1-127: that task stays down and the job cannot finish. It is
    reported at once, with the task's one-line error, and its code is the exit code; a task that
    exited 5 only echoes another's final exit (its peers end with it, trainer.supervise.supervisor), so the
    task that failed first is the one named;
  - every task's container is stopped (`docker compose stop`, `make down`): exit with the chief's code;
    unless the engine is stopping (SIGTERM to dockerd, `systemctl stop|restart docker`): it closes
    its API first, then stops every container (their exits still stream), and starts them again by
    their policy when it starts: that is waited for like any engine restart.
A container that exits 128-255 was stopped or killed from outside: not the end by itself. Docker's
restart policy (`on-failure`) brings back a container whose processes died (its PID 1 killed, the
engine or the host restarted), but a `docker kill` counts for Docker as a manual stop: this watcher
starts such a task again (a kill with SIGKILL and no SIGTERM before it since its start), since the
job cannot go on without it; a task it finds so killed when it starts (exit 137, a peer running) too. A `docker stop` (SIGTERM first: `make down`, `docker compose stop`) is
the operator's and is left alone; if the task never comes back, its peers give up (3, then 4).
When the job is over, Docker's restart policy of every task is set to `no`, so a task that ended for
good is not started again (its supervisor would exit at once with the same code anyway).
Event-driven: `docker events` is started first, then the containers' current state is read, so no
exit falls between the two; when the engine itself restarts, the events stream ends and both are
started again once it answers.
"""

from __future__ import annotations

import itertools
import json
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import contract
from compose.engine import Engine
from contract import CHIEF, task_order
from trainer.host import EXIT_PEER_FAILED, supervisor

Runner = Callable[[Sequence[str]], str]
SETTLE_TRIES = 10
"""Updates of a task's restart policy to `no` before settle() gives up on it (~11 s of backoff)."""
SERVICE = "com.docker.compose.service"
ENGINE = Engine()
"""compose/engine.py: every docker call of this module goes through it."""
# The trainer's log format (trainer/__main__.py): "2026-01-01 12:00:00,000 E <message>".
ERROR_LINE = re.compile(r"^\S+ \S+ E (.+)$")
SUPERVISOR_PREFIX = "supervise:"
SIGKILL, SIGTERM = str(signal.SIGKILL.value), str(signal.SIGTERM.value)
ENGINE_RETRY_S = 1.0
STOPPED = "stopped with every task (make up resumes)"


def docker(cmd: Sequence[str], engine: Engine = ENGINE) -> str:
    """stdout and stderr of one docker command (`docker logs` replays the container's stderr there);
    CalledProcessError when it fails."""
    out = engine.result(*cmd, timeout=None)
    if out.returncode:
        raise subprocess.CalledProcessError(out.returncode, ["docker", *cmd], out.stdout, out.stderr)
    return (out.stdout + out.stderr).strip()


def is_task(service: str) -> bool:
    return task_order(service)[0] < 2


@dataclass(frozen=True)
class Over:
    code: int
    service: str
    reason: str


def judge(states: dict[str, tuple[str, int]]) -> Over | None:
    """The job's outcome from each task's (container status, last exit code), or None: not over."""
    finals = [
        (service, code)
        for service, (status, code) in sorted(states.items(), key=lambda kv: task_order(kv[0]))
        if status == "exited" and 1 <= code <= 127
    ]
    for service, code in finals:
        if code != EXIT_PEER_FAILED:
            return Over(code, service, "failed for good")
    if finals and all(status != "running" for status, _ in states.values()):
        service, code = finals[0]  # every task echoes a peer's final exit that was never seen
        return Over(code, service, "failed for good")
    chief = states.get(CHIEF)
    if chief and chief == ("exited", 0):
        return Over(0, CHIEF, "done")
    if states and all(status in ("exited", "removed") for status, _ in states.values()):
        return Over(chief[1] if chief else 125, CHIEF, STOPPED)
    return None


def error_line(container: str, run: Runner = docker) -> str:
    """The task's one-line error: the trainer's last error line, else the last line of its own output."""
    try:
        lines = run(["logs", "--tail", "200", container]).splitlines()
    except subprocess.CalledProcessError:
        return ""
    errors = [m[1] for m in map(ERROR_LINE.match, lines) if m]
    own = [ln for ln in lines if ln.strip() and not ln.startswith(SUPERVISOR_PREFIX)]
    return (errors or own or [""])[-1].strip()


def restarts(container: str, run: Runner = docker) -> int:
    try:
        lines = run(["logs", "--tail", "2000", container]).splitlines()
    except subprocess.CalledProcessError:
        return 0
    return sum(1 for ln in lines if ln.startswith(SUPERVISOR_PREFIX) and ": restart " in ln)


class Job:
    """The task containers of one compose project and what each last did."""

    def __init__(self, project: str, run: Runner = docker) -> None:
        self.project, self._run = project, run
        self.containers: dict[str, str] = {}
        self.states: dict[str, tuple[str, int]] = {}
        self._signals: dict[str, set[str]] = {}
        """Signals `docker kill`/`stop` sent each task since its last start."""

    def read(self) -> None:
        out = self._run(
            [
                "ps",
                "-a",
                "--filter",
                f"label=com.docker.compose.project={self.project}",
                "--format",
                f'{{{{.ID}}}} {{{{.Label "{SERVICE}"}}}}',
            ]
        )
        for line in out.splitlines():
            cid, _, service = line.partition(" ")
            if is_task(service):
                self.containers[service] = cid
                status, code = self._run(
                    ["inspect", "-f", "{{.State.Status}} {{.State.ExitCode}}", cid]
                ).split()
                self.states[service] = (status, int(code))

    def event(self, event: dict) -> str | None:
        """Apply one `docker events` record; a line worth logging, if any."""
        attrs = event.get("Actor", {}).get("Attributes", {})
        service, action = attrs.get(SERVICE, ""), event.get("Action") or event.get("status", "")
        if service not in self.containers and not is_task(service):
            return None
        self.containers[service] = event.get("id", "") or self.containers.get(service, "")
        if action == "start":
            self.states[service] = ("running", 0)
            self._signals[service] = set()
        elif action == "kill":
            self._signals.setdefault(service, set()).add(attrs.get("signal", ""))
        elif action == "die":
            code = int(attrs.get("exitCode", "125"))
            self.states[service] = ("exited", code)
            signals = self._signals.pop(service, set())
            if code >= 128 and SIGKILL in signals and SIGTERM not in signals:
                return self._start_again(service, code)
            if code >= 128:
                return (
                    f"{service} exited {code} ({supervisor.meaning(code)}): stopped or killed from outside; "
                    "waiting for it to start again (or for its peers to give up)"
                )
        elif action == "destroy":
            status, code = self.states.get(service, ("", 125))
            self.states[service] = ("removed", code if status == "exited" else 125)
            return f"{service}'s container was removed (make down?)"
        return None

    def _start_again(self, service: str, code: int, seen: str = "docker kill") -> str:
        """A task killed with `docker kill`: Docker's restart policy leaves it down, the job needs it."""
        try:
            self._run(["start", self.containers[service]])
        except (
            subprocess.CalledProcessError
        ) as err:  # removed meanwhile (`docker rm -f`), or the engine is going
            return f"{service} was killed ({code}, {supervisor.meaning(code)}) and cannot be started again: {err.stderr or err}"
        self.states[service] = ("starting", code)  # not stopped: every task killed at once is not the end
        return f"{service} was killed ({code}, {supervisor.meaning(code)}; {seen}): started it again"

    def revive(self) -> list[str]:
        """Tasks found killed (137: SIGKILL, `docker kill`) while a peer still runs, before this watcher
        saw it: Docker's policy leaves them down and their peers wait for them for ever (issue 29: 9
        minutes at step 0, and a `make wait` started a minute later started nothing). A `docker stop`
        ends a task with SIGTERM (143) or its own code, unless it outlived the grace period."""
        if judge(self.states) or not any(status == "running" for status, _ in self.states.values()):
            return []
        killed = 128 + signal.SIGKILL.value
        return [
            self._start_again(service, code, seen="before this wait started")
            for service, (status, code) in sorted(self.states.items(), key=lambda kv: task_order(kv[0]))
            if status == "exited" and code == killed
        ]

    def engine_up(self) -> bool:
        return engine_up(self._run)

    def settle(self, sleep: Callable[[float], None] = time.sleep) -> None:
        """The job is over: no task is started again, by Docker's restart policy either. Read back and
        tried again: a task that ended for good may be mid-restart by that policy (its supervisor exits
        at once), and an update that meets its exit fails and puts the old policy back (CI, load ~30:
        worker-1 kept `on-failure` after make wait said it failed for good)."""
        for cid in self.containers.values():
            for attempt in range(SETTLE_TRIES):
                try:
                    self._run(["update", "--restart", "no", cid])
                except subprocess.CalledProcessError:
                    pass  # removed, or the task exited under the update: read back below
                try:
                    policy = self._run(["inspect", "-f", "{{.HostConfig.RestartPolicy.Name}}", cid]).strip()
                except subprocess.CalledProcessError:
                    break  # removed
                if policy in ("no", ""):
                    break
                sleep(0.2 * (attempt + 1))

    def report(self, over: Over) -> str:
        container = self.containers.get(over.service, "")
        text = f"wait: {over.service} {over.reason}: exit code {over.code}"
        if over.code == 0:
            return f"{text} after {restarts(container, self._run)} restart(s) of the trainer"
        detail = error_line(container, self._run) if container else ""
        return f"{text} ({supervisor.meaning(over.code)})" + (f": {detail}" if detail else "")


def watch(job: Job, events: Iterable[dict], log: Callable[[str], None]) -> int | None:
    """Judge the state read so far, then after every event, until the job is over (its code), or
    until the events end first (None: the engine went, or restarted)."""
    for event in itertools.chain([None], events):  # lazily: the stream only ends with `docker events`
        if event is not None:
            note = job.event(event)
            if note:
                log(f"wait: {note}")
        over = judge(job.states)
        if over and over.reason == STOPPED and not job.engine_up():
            # A stopping engine (its API already closed) stopped them: its stream ends when it exits.
            log("wait: every task was stopped by the engine, which is stopping; waiting for it")
            continue
        if over:
            job.settle()
            log(job.report(over))
            return over.code
    log("wait: docker events ended before the job did")
    return None


def engine_up(run: Runner = docker) -> bool:
    try:
        run(["info", "--format", "{{.ServerVersion}}"])
    except (subprocess.CalledProcessError, OSError):
        return False
    return True


def docker_events(project: str) -> tuple[subprocess.Popen, Iterable[dict]]:
    proc = ENGINE.popen(
        *[
            "events",
            "--format",
            "{{json .}}",
            "--filter",
            "type=container",
            "--filter",
            f"label=com.docker.compose.project={project}",
            *(x for e in ("start", "kill", "die", "destroy") for x in ("--filter", f"event={e}")),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    return proc, (json.loads(line) for line in proc.stdout)


def main(argv: Sequence[str]) -> int:
    project = argv[0] if argv else contract.DEFAULT_PROJECT
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # through `finally`: no orphaned `docker events`

    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    job = Job(project)
    while True:
        proc, events = docker_events(project)
        try:
            job.read()
            if CHIEF not in job.containers:
                log(f"wait: no chief container in project {project}: run `make up` first")
                return 125
            for note in job.revive():
                log(f"wait: {note}")
            code = watch(job, events, log=log)
        finally:
            proc.kill()
            proc.wait()
        if code is not None:
            return code
        # The stream ends with the engine. It may already answer again (a quick restart): the tasks
        # are read again either way, since their restart policy brings them back with the engine.
        if not engine_up():
            log("wait: the engine is gone; waiting for it to come back")
            while not engine_up():
                time.sleep(ENGINE_RETRY_S)
        else:
            time.sleep(ENGINE_RETRY_S)
        log("wait: the engine is back; reading the tasks again")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
