"""What a swarm says about a stack's trainers and its nodes, read through a manager node.

The host is no swarm member: every question goes to the first node (`<swarm>-node-1`, -2, ...) whose
engine manages the swarm, so losing node-1 leaves the others to ask. Swarm's own state is the truth:
a task's state and when it entered it, its error ("no suitable node ..."), each node's status and
availability. Nothing is remembered here: a controller that restarts reads it all again.
Standard library only.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime

from compose.engine import Engine
from contract import CHIEF, WORKER

NODE_LABEL = "org.mwms.node"
"""The node label placements use (compose/targets/swarm.py NODE_LABEL; compose/swarm/nodes.sh sets it)."""
TRAINER_RE = re.compile(rf"^(?:{CHIEF}|{WORKER}-\d+)$")
LIVE = ("assigned", "accepted", "preparing", "ready", "starting", "running")
"""Swarm task states of a task placed on a node, which holds or is about to hold a container."""

Run = Callable[..., subprocess.CompletedProcess]
"""subprocess.run's shape: (argv, timeout=seconds) -> CompletedProcess with text stdout and stderr."""


@dataclass(frozen=True)
class Node:
    name: str
    """Its org.mwms.node label (its hostname without one)."""
    host: str
    ready: bool
    active: bool

    @property
    def usable(self) -> bool:
        return self.ready and self.active


@dataclass(frozen=True)
class Task:
    name: str
    """chief, worker-0, ...: the stack's service without the stack's prefix."""
    state: str
    """Swarm's word: pending, running, complete, failed, shutdown, ..."""
    since: float
    """When Swarm last set its state (Unix time, Swarm's clock). A Pending task's moves with each
    scheduling attempt (swarmkit's noSuitableNode stamps it anew): use `created` for how long it waits."""
    created: float
    """When Swarm made this task (a lost node's replacement: when the node was marked Down)."""
    node: str
    error: str
    desired: str


class Manager:
    """`docker` run on a manager node of swarm `swarm` (its nodes are containers `<swarm>-node-N`)."""

    def __init__(self, swarm: str, nodes: int, run: Run | None = None, engine: Engine | None = None) -> None:
        self.swarm, self.nodes = swarm, nodes
        self.engine = engine or Engine()
        self.run = run or self._through_engine
        self.node = 0

    def _through_engine(self, cmd: Sequence[str], timeout: float = 60) -> subprocess.CompletedProcess:
        """`docker ...` through the engine adapter (compose/engine.py)."""
        try:
            return self.engine.result(*cmd[1:], timeout=timeout)
        except subprocess.TimeoutExpired:  # an engine that stopped answering: one line, asked again later
            raise RuntimeError(f"{' '.join(cmd[:6])} did not answer within {timeout:.0f} s") from None

    def container(self, n: int | None = None) -> str:
        return f"{self.swarm}-node-{n or self.find()}"

    def find(self) -> int:
        """The first node whose engine manages the swarm now (asked again after a failure)."""
        if self.node:
            return self.node
        for n in range(1, self.nodes + 1):
            out = self.run(
                [
                    "docker",
                    "exec",
                    f"{self.swarm}-node-{n}",
                    "docker",
                    "info",
                    "-f",
                    "{{.Swarm.ControlAvailable}}",
                ]
            )
            if out.returncode == 0 and out.stdout.strip() == "true":
                self.node = n
                return n
        raise RuntimeError(
            f"no node of swarm {self.swarm} (1..{self.nodes}) answers as a manager: make nodes-up"
        )

    def docker(self, *args: str, timeout: float = 60) -> str:
        out = self.run(["docker", "exec", self.container(), "docker", *args], timeout=timeout)
        if out.returncode != 0:
            self.node = 0  # the next question finds a manager again
            raise RuntimeError(f"docker {' '.join(args[:3])} on {self.container()}: {out.stderr.strip()}")
        return out.stdout


def logs(m: Manager, service: str, since: str) -> list[str]:
    """A service's log lines since a time (RFC 3339 or Unix seconds), each led by its timestamp. The
    task's stderr is Docker's stderr here, and a Down node's tasks make the command fail while it still
    prints every other task's lines: both streams are read, whatever the exit code."""
    out = m.run(["docker", "exec", m.container(), "docker", "service", "logs", "--raw", "-t", "--since", since, service], timeout=60)  # fmt: skip
    return [ln for ln in (out.stdout + out.stderr).splitlines() if ln[:1].isdigit()]


def stamp(text: str) -> float:
    """Docker's RFC 3339 time (nanoseconds, Z) as Unix time."""
    head, _, frac = text.rstrip("Z").partition(".")
    return datetime.fromisoformat(f"{head}.{(frac + '000000')[:6]}+00:00").timestamp()


def nodes(m: Manager) -> list[Node]:
    ids = m.docker("node", "ls", "-q").split()
    return [_node(n) for n in json.loads(m.docker("node", "inspect", *ids))] if ids else []


def _node(n: dict) -> Node:
    name = (n["Spec"].get("Labels") or {}).get(NODE_LABEL) or n["Description"]["Hostname"]
    host = n["Description"]["Hostname"]
    return Node(name, host, n["Status"]["State"] == "ready", n["Spec"]["Availability"] == "active")


def usable(found: Sequence[Node]) -> set[str]:
    """Node names some ready, active node carries (a node removed and joined again leaves a Down record
    with the same label beside its new one)."""
    return {n.name for n in found if n.usable}


def trainers(m: Manager, stack: str) -> dict[str, str]:
    """The stack's trainer services: task name -> service id as `service ls` prints it (12 characters:
    the 20.10 CLI has no --no-trunc there, and a task names its service by the full id)."""
    out = m.docker("service", "ls", "--filter", f"label=com.docker.stack.namespace={stack}", "--format", "{{.ID}} {{.Name}}")  # fmt: skip
    rows = (line.split() for line in out.splitlines() if line.strip())
    found = {name.removeprefix(f"{stack}_"): sid for sid, name in rows}
    return {name: sid for name, sid in found.items() if TRAINER_RE.match(name)}


def tasks(m: Manager, stack: str) -> dict[str, Task]:
    """The newest task of each trainer service: what Swarm does with it now."""
    services = trainers(m, stack)
    ids = m.docker("stack", "ps", stack, "-q", "--no-trunc").split() if services else []
    found = json.loads(m.docker("inspect", "--type", "task", *ids)) if ids else []
    names = _node_names(m) if found else {}
    newest: dict[str, dict] = {}
    for t in found:
        name = next((n for n, sid in services.items() if t["ServiceID"].startswith(sid)), None)
        if name and (name not in newest or t["CreatedAt"] > newest[name]["CreatedAt"]):
            newest[name] = t
    return {name: _task(name, t, names) for name, t in newest.items()}


def _node_names(m: Manager) -> dict[str, str]:
    return {n["ID"]: n["Description"]["Hostname"] for n in json.loads(m.docker("node", "inspect", *m.docker("node", "ls", "-q").split()))}  # fmt: skip


def _task(name: str, t: dict, node_names: dict[str, str]) -> Task:
    status = t["Status"]
    return Task(
        name=name,
        state=status["State"],
        since=stamp(status["Timestamp"]),
        created=stamp(t["CreatedAt"]),
        node=node_names.get(t.get("NodeID", ""), ""),
        error=status.get("Err", ""),
        desired=t.get("DesiredState", ""),
    )


def workers(names: Sequence[str]) -> int:
    return sum(1 for n in names if n != CHIEF)
