"""`make stack-elastic`: a Swarm job goes on with the workers it has when a node is lost, and grows back.

    python -m compose.elastic --dir .run/swarm/mwms [--min-workers 1] [--resize-after SECONDS]

One loop, every few seconds: read Swarm (its nodes, the stack's trainer tasks), decide, act, and write
one line saying what it waits for (`<dir>/elastic.txt`, shown by `make stack-status`). A stack pinned
one task per node (TRAINER_NODES) loses a task with its node: Swarm keeps it Pending ("no suitable
node"). Once a task has been unplaced for RESIZE_AFTER (default: the job's measured restart,
contract/elastic.py), the job goes on with as many workers as its ready nodes hold, never fewer than
MIN_WORKERS, by the same stop-and-redeploy as `make stack-resize` (compose/stackresize.py); when enough
of its nodes are ready again it grows back to the job's WORKERS. An unpinned stack's task that no node
can take (GPUs) is dropped the same way; it grows back with `make stack-resize`. Restartable: it keeps
nothing but what Swarm and the bundle's remake.json say. Ends 0 when the chief's task completes or
the stack is removed (it never deploys a stack that `make stack-down` took away).
Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from compose import resize, stackresize, swarmstate
from compose.projectlock import LockHeld, ProjectLock
from compose.swarmstate import Manager, Task
from contract import CHIEF
from contract import elastic as defaults

STATUS = "elastic.txt"
UNPLACED = "pending"
"""Swarm's state of a task no node can take now (its error says why)."""


@dataclass(frozen=True, kw_only=True)
class Seen:
    """One reading of the swarm."""

    full: int
    """WORKERS: the size the job was deployed or last resized to by hand."""
    tasks: Mapping[str, Task]
    pinned: Sequence[str]
    """TRAINER_NODES in order ([]: the scheduler places the tasks)."""
    ready: frozenset[str]
    now: float

    @property
    def deployed(self) -> int:
        return swarmstate.workers(list(self.tasks))


@dataclass(frozen=True)
class Decision:
    action: str
    """wait, resize (to `workers`, on the ready nodes) or done."""
    workers: int
    why: str


def decide(seen: Seen, min_workers: int, resize_after: float) -> Decision:
    if not seen.tasks:  # not a size to grow back from: the stack was taken down (or never deployed)
        return Decision(
            "done", 0, "the stack has no trainer services (make stack-down?): nothing to keep going"
        )
    chief = seen.tasks.get(CHIEF)
    if chief and chief.state == "complete":
        return Decision("done", seen.deployed, "the job finished (the chief's task completed)")
    unplaced = sorted((t for t in seen.tasks.values() if t.state == UNPLACED), key=lambda t: t.created)
    want = _capacity(seen, unplaced)
    if unplaced:
        return _unplaced(seen, unplaced, min(want, seen.deployed), min_workers, resize_after)
    if want < seen.deployed:
        return Decision(
            "wait", seen.deployed, f"{_ready(seen)}: waiting for Swarm to mark the lost node's task"
        )
    if want > seen.deployed:
        if waiting := [t.name for t in seen.tasks.values() if t.state != "running"]:
            return Decision("wait", seen.deployed, f"nodes are back: growing to WORKERS={want} once {', '.join(waiting)} runs")  # fmt: skip
        return Decision("resize", want, f"{_ready(seen)}: growing back to WORKERS={want}")
    if seen.deployed < seen.full:
        return Decision("wait", seen.deployed, f"at WORKERS={seen.deployed} of {seen.full}: waiting for a node of TRAINER_NODES ({_ready(seen)})")  # fmt: skip
    return Decision("wait", seen.deployed, f"at full size, WORKERS={seen.full}; watching for a lost node")


def _capacity(seen: Seen, unplaced: Sequence[Task]) -> int:
    """How many workers the swarm can run now: its ready pinned nodes less the chief's, or (unpinned)
    the deployed workers less those no node takes."""
    if seen.pinned:
        return min(seen.full, len([n for n in seen.pinned if n in seen.ready]) - 1)
    return seen.deployed - len(unplaced)


def _unplaced(seen: Seen, unplaced: Sequence[Task], want: int, min_workers: int, after: float) -> Decision:
    """A task no node takes: after RESIZE_AFTER the job goes on with the workers the ready nodes hold
    (the same number when a spare node of TRAINER_NODES is ready), never fewer than MIN_WORKERS."""
    first = unplaced[0]
    waited = seen.now - first.created  # not `since`: Swarm stamps a Pending task at every attempt
    what = f"{', '.join(t.name for t in unplaced)} unplaced for {waited:.0f} s ({first.error or 'pending'})"
    if want < min_workers:
        return Decision("wait", seen.deployed, f"{what}: {max(want, 0)} workers could run, MIN_WORKERS={min_workers}: waiting for a node")  # fmt: skip
    if waited < after:
        return Decision("wait", seen.deployed, f"{what}: going on with WORKERS={want} at {after:.0f} s unless a node takes it")  # fmt: skip
    return Decision("resize", want, f"{what}: going on with WORKERS={want}")


def _ready(seen: Seen) -> str:
    if not seen.pinned:
        return "unpinned"
    return (
        f"ready: {','.join(n for n in seen.pinned if n in seen.ready) or 'none'} of {','.join(seen.pinned)}"
    )


def read(m: Manager, rec: dict, clock: Callable[[], float] = time.time) -> Seen:
    stack = stackresize.flag(rec["argv"], "--project")
    pinned = [n for n in stackresize.flag(rec["argv"], "--trainer-nodes").split(",") if n]
    return Seen(
        full=int(stackresize.flag(rec["argv"], "--workers")),
        tasks=swarmstate.tasks(m, stack),
        pinned=pinned,
        ready=frozenset(swarmstate.usable(swarmstate.nodes(m))),
        now=clock(),
    )


def measured_restart(m: Manager, stack: str) -> float | None:
    """Seconds from the chief's service being (re)deployed to the chief's start line, from Swarm and its
    logs; None when its logs do not say (not started yet, or gone with a lost node)."""
    try:
        # JSON: a plain template prints Go's time format, not RFC 3339.
        updated = m.docker("service", "inspect", "-f", "{{json .UpdatedAt}}", f"{stack}_{CHIEF}")
        since = swarmstate.stamp(json.loads(updated))
        lines = swarmstate.logs(m, f"{stack}_{CHIEF}", f"{since:.0f}")
    except (RuntimeError, ValueError):
        return None
    starts = [swarmstate.stamp(ln.split()[0]) for ln in lines if stackresize.STARTED.search(ln)]
    return starts[0] - since if starts else None


def _not_training(rec: dict, stack: str, tasks: Mapping[str, Task]) -> str | None:
    """Why the job cannot stop for a grow now: growing stops a job that trains, so every task of this
    run must have been scraped training (a task still starting has no step to save)."""
    if not rec["prometheus"]:
        return None
    query = resize.prometheus(rec["prometheus"])
    seen = resize.phases(query, stack, rec["run"])
    if missing := [t for t in tasks if t not in seen]:
        return f"{', '.join(missing)} of run {rec['run']} not scraped yet"
    return resize.settle(query, stack, rec["run"])


class Controller:
    def __init__(self, out: Path, min_workers: int, resize_after: float | None) -> None:
        self.out, self.min_workers, self.given = out, min_workers, resize_after
        self.restart_s: float | None = None
        self.said = ""

    def after(self, m: Manager, stack: str) -> float:
        if self.given is not None:
            return self.given
        if self.restart_s is None:
            self.restart_s = measured_restart(m, stack)
        return defaults.resize_after(self.restart_s)

    def step(self) -> Decision:
        rec = stackresize.load(self.out)
        m = Manager(rec["swarm"], rec["nodes"])
        stack = stackresize.flag(rec["argv"], "--project")
        seen = read(m, rec)
        d = decide(seen, self.min_workers, self.after(m, stack))
        if (
            d.action == "resize"
            and d.workers > seen.deployed
            and (why := _not_training(rec, stack, seen.tasks))
        ):
            d = Decision("wait", seen.deployed, f"growing back to WORKERS={d.workers} waits: {why}")
        self.status(d.why)
        if d.action == "resize":
            nodes = stackresize.placement(rec, d.workers, seen.ready)
            self.restart_s = stackresize.resize_to(m, self.out, rec, d.workers, nodes, self.say)
        return d

    def status(self, why: str) -> None:
        (self.out / STATUS).write_text(f"{time.strftime('%H:%M:%S')} elastic: {why}\n")
        if re.sub(r"\d+", "#", why) != re.sub(r"\d+", "#", self.said):  # not every tick of a wait
            self.say(why)
        self.said = why

    def say(self, text: str) -> None:
        print(f"elastic: {text}", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m compose.elastic", description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="the stack's bundle folder (SWARM_DIR)")
    p.add_argument("--min-workers", type=int, default=defaults.MIN_WORKERS)
    p.add_argument("--resize-after", type=float, help="seconds a task may stay unplaced (default: measured)")
    ns = p.parse_args(argv)
    if ns.min_workers < 0 or (ns.resize_after is not None and ns.resize_after < 0):
        print("elastic: MIN_WORKERS and RESIZE_AFTER must be 0 or more", file=sys.stderr)
        return 2
    lock = ProjectLock(ns.dir, f"make stack-elastic STACK={ns.dir.name}", ns.dir.name, label="STACK",
                       say=lambda line: print(f"elastic: {line}", file=sys.stderr))  # fmt: skip
    try:
        stackresize.load(ns.dir)
        lock.acquire()  # held while it runs: a make stack-resize meanwhile is refused, naming it
    except (stackresize.Refused, LockHeld) as why:
        print(f"elastic: {why}", file=sys.stderr)
        return 2
    c = Controller(ns.dir, ns.min_workers, ns.resize_after)
    while True:
        try:
            if c.step().action == "done":
                return 0
        except stackresize.Refused as why:
            c.status(str(why))
        except (RuntimeError, OSError, ValueError) as err:  # a manager lost mid-question: ask again
            c.status(f"reading the swarm failed ({err}); trying again")
        time.sleep(defaults.POLL_S)


if __name__ == "__main__":
    sys.exit(main())
