"""The one engine adapter: every docker, docker compose and swarm-manager call the host tools make.

    engine = Engine()                      # the docker CLI on PATH
    engine.docker("ps", "-a")              # stdout; EngineError (one line) when it fails
    engine.compose(stack, "up", "-d")      # docker compose on one project's generated files
    engine.tasks(project)                  # {service: Container} of a Compose project's trainer tasks

Lifecycle (compose/lifecycle.py), wait, status, resize's refusals, the swarm state, the stack resize and
the tune's job control call the engine through this class, as docker/compose's Go code keeps every
operation behind its `api.Compose` interface: a test hands in a fake `run`, nothing else is patched.
Values always travel as argv elements, never through a shell. Standard library only (make runs it
with a bare python3).
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from contract import CHIEF, WORKER

PROJECT_LABEL = "com.docker.compose.project"
SERVICE_LABEL = "com.docker.compose.service"
ROOT = Path(__file__).resolve().parents[1]
"""Compose's project directory: the generated files name paths relative to the checkout."""

Run = Callable[..., subprocess.CompletedProcess]
"""subprocess.run's signature: the seam a test replaces."""


class EngineError(RuntimeError):
    """A docker command failed: its first words and the engine's last line."""


def is_task(service: str) -> bool:
    return service == CHIEF or (service.startswith(f"{WORKER}-") and service[len(WORKER) + 1 :].isdigit())


@dataclass(frozen=True)
class Container:
    id: str
    service: str
    status: str
    """As `docker ps` words it: "Up 3 minutes", "Exited (0) 2 seconds ago", "Created"."""

    @property
    def running(self) -> bool:
        return self.status.startswith("Up")


@dataclass(frozen=True)
class Stack:
    """What every `docker compose` call of one project needs to see the same stack: its name, and the
    files and settings its last `make up` generated (RUN_DIR/stack.env, RUN_DIR/compose.args)."""

    project: str
    run_dir: Path

    @property
    def env_file(self) -> Path:
        return self.run_dir / "stack.env"

    @property
    def up(self) -> bool:
        """Whether a `make up` of this project generated its files (a stack may still be stopped)."""
        return self.env_file.is_file()

    def files(self) -> list[str]:
        """The -f options compose/targets/compose.py wrote, in order."""
        path = self.run_dir / "compose.args"
        return path.read_text().split() if path.is_file() else []

    def settings(self) -> dict[str, str]:
        """stack.env as a mapping (written by compose/lifecycle.py; never sourced by a shell)."""
        if not self.up:
            return {}
        lines = self.env_file.read_text().splitlines()
        return dict(line.split("=", 1) for line in lines if "=" in line)


class Engine:
    def __init__(self, run: Run = subprocess.run, binary: str = "docker") -> None:
        self._run = run
        self.binary = binary

    def result(self, *args: str, timeout: float | None = 120, **kw) -> subprocess.CompletedProcess:
        """The finished command, whatever its exit code (stdout and stderr captured as text)."""
        kw.setdefault("capture_output", True)
        kw.setdefault("text", True)
        return self._run([self.binary, *args], timeout=timeout, **kw)

    def docker(self, *args: str, timeout: float | None = 120, **kw) -> str:
        """stdout of `docker ARGS`; EngineError naming the command and the engine's last line."""
        try:
            r = self.result(*args, timeout=timeout, **kw)
        except subprocess.TimeoutExpired:
            raise EngineError(f"docker {' '.join(args[:2])}: no answer in {timeout:.0f} s") from None
        except OSError as err:
            raise EngineError(f"docker: {err.strerror} (make engine installs it)") from None
        if r.returncode:
            raise EngineError(f"docker {' '.join(args[:2])}: {last_line(r)}")
        return r.stdout or ""

    def query(self, *args: str, timeout: float | None = 30) -> str:
        """stdout of a read-only `docker ARGS`, or "" when it fails or no engine answers (detection must
        never crash a host without one: preflight asks before the engine is installed)."""
        try:
            r = self.result(*args, timeout=timeout)
        except (OSError, subprocess.SubprocessError):
            return ""
        return "" if r.returncode else r.stdout

    def popen(self, *args: str, **kw) -> subprocess.Popen:
        """A long-running docker command (events, logs -f, a tar stream)."""
        return subprocess.Popen([self.binary, *args], **kw)

    # Compose: one project's generated files.
    def compose_args(self, stack: Stack) -> list[str]:
        return [
            "compose",
            "-p",
            stack.project,
            "--project-directory",
            str(ROOT),
            *(["--env-file", str(stack.env_file)] if stack.up else []),
            *stack.files(),
        ]

    def compose(
        self, stack: Stack, *args: str, capture: bool = False, timeout: float | None = None, **kw
    ) -> str:
        """`docker compose` on the stack's files; output to the terminal unless `capture`."""
        if capture:
            return self.docker(*self.compose_args(stack), *args, timeout=timeout, **kw)
        r = self._run([self.binary, *self.compose_args(stack), *args], timeout=timeout, **kw)
        if r.returncode:
            raise EngineError(
                f"docker compose {' '.join(args[:1])} exited {r.returncode} (its output is above)"
            )
        return ""

    def services(self, stack: Stack) -> list[str]:
        return self.compose(stack, "config", "--services", capture=True).split()

    # Containers of one Compose project.
    def containers(self, project: str, all: bool = True) -> list[Container]:
        fmt = '{{.ID}}\t{{.Label "' + SERVICE_LABEL + '"}}\t{{.Status}}'
        out = self.docker("ps", *(["-a"] if all else []), "--filter", f"label={PROJECT_LABEL}={project}",
                          "--format", fmt)  # fmt: skip
        rows = (line.split("\t", 2) for line in out.splitlines() if line.count("\t") == 2)
        return [Container(cid, service, status) for cid, service, status in rows]

    def tasks(self, project: str, all: bool = True) -> dict[str, Container]:
        """The project's trainer tasks by service, the chief first."""
        found = {c.service: c for c in self.containers(project, all) if is_task(c.service)}
        return {s: found[s] for s in sorted(found, key=lambda s: (s != CHIEF, len(s), s))}

    def inspect(self, ref: str) -> dict:
        (info,) = json.loads(self.docker("inspect", ref))
        return info

    def state(self, cid: str) -> dict:
        """The container's State (Status, Paused, ...); {} when it is gone."""
        r = self.result("inspect", "--format", "{{json .State}}", cid)
        return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}

    def stop_tasks(self, stack: Stack, grace_s: int) -> None:
        """SIGTERM every trainer task, SIGKILL after `grace_s`: each saves the same step (the preemption
        handler) and exits."""
        tasks = [s for s in self.services(stack) if is_task(s)]
        if tasks:
            self.compose(stack, "stop", "-t", str(grace_s), *tasks)

    def image_present(self, image: str) -> bool:
        return self.result("image", "inspect", image).returncode == 0

    def answers(self) -> bool:
        """Whether an engine answers (`docker info`)."""
        try:
            return self.result("info", "--format", "{{.ServerVersion}}", timeout=30).returncode == 0
        except (OSError, subprocess.TimeoutExpired):
            return False

    # A swarm manager reached through its node's container (compose/swarm/nodes.sh makes the nodes).
    def on_node(self, node: str, *args: str, timeout: float | None = 120, **kw) -> str:
        return self.docker("exec", node, "docker", *args, timeout=timeout, **kw)


def last_line(r: subprocess.CompletedProcess) -> str:
    return ((r.stderr or "").strip().splitlines() or [f"exit {r.returncode}"])[-1]


def argv(*parts: str | Sequence[str]) -> list[str]:
    """Flatten strings and lists of strings into one argv (no shell)."""
    out: list[str] = []
    for p in parts:
        out.extend([p] if isinstance(p, str) else p)
    return out
