"""One small compose project for fault injection, driven and read from outside the trainer.

The fault tests and the chaos run each start their own project (own PROJECT, RUN_DIR and
Prometheus address), so the session `stack` of the other e2e tests is never touched. Everything
is read where an operator reads it: `make wait`, `docker logs -t` (with --log-every 1 every call
logs its last step), the checkpoint file in the chief's volume, and Prometheus.
"""

from __future__ import annotations

import json
import os
import re
import select
import signal
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path

import contract
from tests.e2e.conftest import ROOT

QUIET_S = 30
"""A followed log that brings nothing for this long is followed again (an engine that went away
without closing the stream); the trainer logs a line at least every few seconds once it steps."""
POLL_TAIL = 200
"""Lines of a log's tail a poll reads: the chief logs a step line every 10 steps (--log-every), so a
step line never scrolls past them between polls."""
STEP_LINE = re.compile(r"^(\S+) .* chief \| step (\d+)/")
RESUMED = re.compile(r"^(\S+) .*chief: (?:resumed at|starting at) step (\d+)")
SUPERVISOR_RESTART = re.compile(r"^(\S+) supervise: exited (\d+) .*: restart ")


@dataclass
class Outcome:
    code: int
    checkpoint: int
    resumed: list[int]
    lost: int
    recovery_s: float


def stamp(text: str) -> float:
    """Unix time of a `docker logs -t` timestamp (nanoseconds cut to microseconds)."""
    return datetime.fromisoformat(text[:26].rstrip("Z") + "+00:00").timestamp()


FAULT_DEFAULTS = {"TASK": "mlp"}
"""The job the fault scenarios were sized on: `make up`'s default task (cnn, steps ~10x longer on 2
cores) would stretch every wait they derive from the measured step."""


@dataclass(frozen=True)
class FaultStack:
    project: str
    run_dir: str
    bind: str
    settings: dict[str, str] = field(default_factory=dict)
    """Extra make variables: WORKERS, STEPS, SAVE_EVERY, ARGS, ..."""
    docker_host: str = ""
    """The engine the stack runs on (DOCKER_HOST), when not this host's: a Docker-in-Docker node's."""
    engine_root: Path | None = None
    """Where that engine's /var/lib/docker is on this host (its volumes' files are read there)."""
    host_pid: Callable[[int], int] | None = None
    """That engine's PIDs (`docker top`'s, of its own namespace) to this host's: a DinD node's
    EngineNode.host_pid, so that a process in there can be signalled from here."""

    @property
    def env(self) -> dict[str, str] | None:
        return {**os.environ, "DOCKER_HOST": self.docker_host} if self.docker_host else None

    @property
    def prometheus(self) -> str:
        return f"http://{self.bind}:{contract.PROMETHEUS_PORT}"

    def make_argv(self, *args: str) -> list[str]:
        variables = [
            f"PROJECT={self.project}",
            f"RUN_DIR={self.run_dir}",
            f"BIND_ADDR={self.bind}",
            "OFFLINE=1",
            "GPUS=0",
            *(f"{k}={v}" for k, v in (FAULT_DEFAULTS | self.settings).items()),
        ]
        return ["make", "--no-print-directory", *args, *variables]

    def make_background(self, *args: str) -> subprocess.Popen:
        """`make ARGS` running while the caller watches (its output piped)."""
        return subprocess.Popen(self.make_argv(*args), cwd=ROOT, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=self.env)  # fmt: skip

    def make(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        return subprocess.run(
            self.make_argv(*args),
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=self.env,
        )

    def compose(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        files = (ROOT / self.run_dir / "compose.args").read_text().split()
        return subprocess.run(
            [
                "docker",
                "compose",
                "--project-directory",
                str(ROOT),
                "--env-file",
                str(ROOT / self.run_dir / "stack.env"),
                *files,
                *args,
            ],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=self.env,
        )

    def wait_process(self) -> subprocess.Popen:
        """`make wait` (the module, for the exact exit code), running in the background."""
        return subprocess.Popen(
            [sys.executable, "-m", "compose.wait", self.project],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env=self.env,
        )

    def wait_code(self, timeout: float = 600) -> int:
        proc = self.wait_process()
        try:
            return proc.wait(timeout=timeout)
        finally:
            proc.kill()

    def container(self, service: str) -> str:
        return f"{self.project}-{service}-1"

    def inspect(self, service: str, fmt: str) -> str:
        return subprocess.run(
            ["docker", "inspect", "-f", fmt, self.container(service)],
            capture_output=True,
            text=True,
            check=True,
            env=self.env,
        ).stdout.strip()

    def logs(self, service: str = "chief", tail: int | None = None) -> list[str]:
        """The service's log, whole or its last `tail` lines (json-file reads a tail from the end)."""
        last = ["--tail", str(tail)] if tail else []
        out = subprocess.run(
            ["docker", "logs", "-t", *last, self.container(service)],
            capture_output=True,
            text=True,
            env=self.env,
        )
        return (out.stdout + out.stderr).splitlines()

    def chief_steps(self, tail: int | None = None) -> list[tuple[float, int]]:
        return [(stamp(m[1]), int(m[2])) for m in map(STEP_LINE.match, self.logs(tail=tail)) if m]

    def resumes(self) -> list[tuple[float, int]]:
        """(time, step) of every start of the chief's trainer: the first one, then every resume."""
        return [(stamp(m[1]), int(m[2])) for m in map(RESUMED.match, self.logs()) if m]

    def trainer_pid(self, service: str) -> int:
        """Host PID of the trainer process itself (under tini and trainer.supervise.supervisor): what a crash kills."""
        return self.process_pid(service, " -m trainer", but="trainer.supervise.supervisor")

    def process_pid(self, service: str, marker: str, but: str = "\0") -> int:
        """Host PID of the one process of `service` whose command line holds `marker` (and not `but`)."""
        # Another engine's `docker top` gives PIDs of its own namespace: never signal those from here.
        assert not self.docker_host or self.host_pid, (
            f"{service}: its PIDs are not this host's (engine {self.docker_host})"
        )
        out = subprocess.run(
            ["docker", "top", self.container(service), "-eo", "pid,args"],
            capture_output=True,
            text=True,
            check=True,
            env=self.env,
        ).stdout.splitlines()[1:]
        found = [int(ln.split()[0]) for ln in out if marker in ln and but not in ln]
        assert len(found) == 1, f"{service}: expected one {marker!r} process, found {out}"
        return self.host_pid(found[0]) if self.host_pid else found[0]

    def volume_dir(self, volume: str) -> Path:
        path = Path(
            subprocess.run(
                ["docker", "volume", "inspect", "-f", "{{.Mountpoint}}", f"{self.project}_{volume}"],
                capture_output=True,
                text=True,
                check=True,
                env=self.env,
            ).stdout.strip()
        )
        return self.engine_root / path.relative_to("/var/lib/docker") if self.engine_root else path

    def checkpoint_dir(self) -> Path:
        return self.volume_dir("checkpoints")

    def checkpoint_step(self) -> int:
        state = (self.checkpoint_dir() / "checkpoint").read_text()
        return int(re.search(r'^model_checkpoint_path: "ckpt-(\d+)"', state, re.MULTILINE)[1])

    def kill_chief_during_a_save(self, timeout: float) -> list[str] | None:
        """SIGKILL the chief's trainer while TensorFlow's temporary checkpoint files exist: what was
        seen then, or None if no save came within `timeout` (it is killed anyway)."""
        mount, pid = self.checkpoint_dir(), self.trainer_pid("chief")
        deadline = time.time() + timeout
        while time.time() < deadline:
            names = os.listdir(mount)
            if any("_temp" in n or ".tmp" in n for n in names):
                os.kill(pid, signal.SIGKILL)
                return names
        os.kill(pid, signal.SIGKILL)
        return None

    def prom(self, expr: str, at: float | None = None) -> dict[str, float]:
        params = {"query": expr} | ({"time": f"{at:.3f}"} if at else {})
        with urllib.request.urlopen(
            f"{self.prometheus}/api/v1/query?{urllib.parse.urlencode(params)}", timeout=5
        ) as r:
            result = json.load(r)["data"]["result"]
        return {
            s["metric"].get("task_type", "") + s["metric"].get("task_index", ""): float(s["value"][1])
            for s in result
        }

    def outcome(self, fault_at: float, code: int) -> Outcome:
        """What the fault did, seen from outside, once the job is over with `code` (make wait's)."""
        steps, starts = self.chief_steps(), self.resumes()
        assert len(starts) > 1, f"the chief never resumed (wait: {code}):\n" + "\n".join(self.logs()[-15:])
        resumed_at, resumed_step = starts[-1]
        before = max((s for t, s in steps if t < resumed_at), default=0)  # the old incarnation's last step
        first_after = min((t for t, s in steps if t > resumed_at and s > resumed_step), default=float("nan"))
        return Outcome(
            code=code,
            checkpoint=self.checkpoint_step(),
            resumed=[s for _, s in starts[1:]],
            lost=max(0, before - resumed_step),
            recovery_s=round(first_after - fault_at, 1),
        )

    def wait_for_step(self, step: int, timeout: float, current: bool = False) -> float:
        """When the chief's log first shows `step` or a later one (current=True: as its last step line,
        since a resume goes back to its checkpoint): what is logged already, then each line as it is
        written, streamed by one `docker logs -f` (a poll of the log's tail every 0.2 s, a Go CLI start
        and the engine's read each, was ~2.5 processes a second per waiting test beside the others)."""
        deadline, since = time.time() + timeout, time.time() - 1  # 1 s overlap: no line falls between
        steps = self.chief_steps(POLL_TAIL if current else None)
        if steps and (steps[-1][1] if current else max(s for _, s in steps)) >= step:
            return time.time()
        while time.time() < deadline:
            at, since = self._stream_until(step, since, deadline)
            if at is not None:
                return at
            time.sleep(0.5)  # the container stopped or was replaced, or the stream went quiet: again
        raise AssertionError(
            f"the chief never reached step {step} in {timeout:.0f}s:\n" + "\n".join(self.logs()[-30:])
        )

    def _stream_until(self, step: int, since: float, deadline: float) -> tuple[float | None, float]:
        """(The time a step line >= `step` logged after `since` is read, or None once the stream ends
        or brings nothing for QUIET_S; the `since` to follow again from)."""
        follow = ["docker", "logs", "-f", "-t", "--since", f"{since:.3f}", self.container("chief")]
        proc = subprocess.Popen(follow, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=self.env)
        try:
            partial, heard = b"", time.time()
            while (left := min(deadline, heard + QUIET_S) - time.time()) > 0:
                if not select.select([proc.stdout], [], [], min(left, 1.0))[0]:
                    continue
                chunk, heard = os.read(proc.stdout.fileno(), 1 << 16), time.time()
                if not chunk:
                    break
                since = heard - 1
                *lines, partial = (partial + chunk).split(b"\n")
                if any(
                    (m := STEP_LINE.match(ln.decode(errors="replace"))) and int(m[2]) >= step for ln in lines
                ):
                    return heard, since
            return None, since
        finally:
            proc.kill()
            proc.wait()


class Watch:
    """`make wait` started before the fault, as an operator would: it also starts a docker-killed task."""

    def __init__(self, stack: FaultStack) -> None:
        self.proc = stack.wait_process()
        self.lines: list[str] = []
        self._reader = threading.Thread(target=lambda: self.lines.extend(self.proc.stderr), daemon=True)
        self._reader.start()

    def code(self, timeout: float = 600) -> int:
        try:
            return self.proc.wait(timeout=timeout)
        finally:
            self.proc.kill()
            self._reader.join(timeout=5)
