"""`make stack-resize WORKERS=N`: a Swarm stack's job saves, stops and goes on with N workers.

    python -m compose.stackresize --dir .run/swarm/mwms --workers N     # exit 0 resized; 2 refused
    python -m compose.stackresize --dir DIR --record -- EMIT-FLAGS...    # make stack-up: how it was made

What `make resize` does on Compose, with Swarm's own verbs: every trainer service is scaled to 0 at once
(each task gets SIGTERM: the preemption handler makes all of them save the same step and exit), the
bundle is emitted again for N workers from the flags and knobs `make stack-up` recorded (`remake.json`
in the bundle), and `docker stack deploy --prune` starts the new size (a new run id; services of
workers no longer in the job are removed). The tasks then agree which copy holds the newest step
(every node keeps its tasks' copies) and the trainer sizes the batch and rate for the new world size
(trainer/state/resize.py); the chief's line saying so is printed. A pinned stack (TRAINER_NODES) puts
the N+1 tasks on the first N+1 of its nodes that are ready. Refused in one line, exit 2, before any
task stops: a count that is not a whole number, the size the stack has, a stack not deployed or
finished, too few ready nodes, a task starting or waiting for its peers (compose/resize.py). Standard
library only.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from compose import emit, knobs, resize, swarmstate
from compose.deployment import STOP_GRACE_SECONDS
from compose.engine import Engine
from compose.knobs import COMMAND_LINE
from compose.projectlock import LockHeld, ProjectLock
from compose.swarmstate import Manager
from compose.targets import Place
from compose.targets import swarm as swarm_target
from contract import CHIEF, WORKER

RECORD = "remake.json"
KEPT_PREFIXES = ("TRAINER_", "SUPERVISE_")
"""Environment the emitter reads besides the names on make's command line (compose/knobs.py)."""
STARTED = re.compile(r"chief: (?:resumed|starting) at step (\d+)")
RESIZED = re.compile(r"chief: (resized at step .*)")
SAVED = re.compile(r"every task saved step (\d+)")
"""The preemption's words (trainer/train/training.py) once every task saved the step it stops at."""
START_WAIT_S = 900.0
"""How long stack-resize waits for the chief to say it started: cold nodes pull the image first."""


class Refused(Exception):
    """Why this resize cannot go on: one line."""


def record(out: Path, argv: Sequence[str], environ: Mapping[str, str]) -> None:
    """How the bundle in `out` was made: the emitter's flags, the knobs it read, where the swarm is."""
    given = environ.get(COMMAND_LINE, "").split()
    env = {k: v for k, v in environ.items() if k in given or k == COMMAND_LINE or k.startswith(KEPT_PREFIXES)}
    body = {
        "argv": list(argv),
        "environ": env,
        "run": _run_of(out),
        "swarm": environ.get("SWARM_NAME", "mwms-swarm"),
        "nodes": int(environ.get("NODES", "3")),
        "prometheus": environ.get("PROMETHEUS_URL", ""),
    }
    (out / RECORD).write_text(json.dumps(body, indent=1) + "\n")


def load(out: Path) -> dict:
    path = out / RECORD
    if not path.is_file():
        raise Refused(f"no stack was deployed from {out} ({RECORD} missing): make stack-up STACK=...")
    return json.loads(path.read_text())


def flag(argv: Sequence[str], name: str, default: str = "") -> str:
    return argv[argv.index(name) + 1] if name in argv else default


def with_flag(argv: Sequence[str], name: str, value: str) -> list[str]:
    out = list(argv)
    if name in out:
        out[out.index(name) + 1] = value
    else:
        out += [name, value]
    return out


def _run_of(out: Path) -> str:
    found = re.search(rf'hostname: "{CHIEF}-([^"]+)"', (out / "stack.yaml").read_text())
    return found.group(1) if found else ""


def placement(rec: dict, workers: int, ready: set[str]) -> list[str]:
    """The nodes the N+1 tasks go to, in TRAINER_NODES order ([]: the scheduler places them)."""
    pinned = [n for n in flag(rec["argv"], "--trainer-nodes", "").split(",") if n]
    if not pinned:
        return []
    chosen = [n for n in pinned if n in ready][: workers + 1]
    if len(chosen) < workers + 1:
        raise Refused(
            f"WORKERS={workers} needs {workers + 1} ready nodes of TRAINER_NODES={','.join(pinned)} (one task "
            f"per node); ready: {','.join(sorted(set(pinned) & ready)) or 'none'}"
        )
    return chosen


def refusal(requested: str, stack: str, now: Mapping[str, swarmstate.Task]) -> str | None:
    if not re.fullmatch(r"\d+", requested.strip()):
        return f"WORKERS={requested!r}: a whole number of workers besides the chief (0 or more)"
    if CHIEF not in now:
        return f"STACK={stack} has no trainers on the swarm: make stack-up STACK={stack} WORKERS=N"
    if now[CHIEF].state == "complete":
        return f"STACK={stack}'s job has finished: make stack-up WORKERS=N STEPS=<more> trains on at the new size"
    if int(requested) == swarmstate.workers(now):
        return f"STACK={stack} already trains with WORKERS={int(requested)}: nothing to resize"
    return None


def overlay(recorded: Mapping[str, str], environ: Mapping[str, str]) -> dict[str, str]:
    """The recorded knobs under those given on this command line (`make stack-resize STEPS=...`)."""
    now = [k for k in environ.get(COMMAND_LINE, "").split() if k in knobs.names()]
    line = sorted(set(recorded.get(COMMAND_LINE, "").split()) | set(now))
    return {**recorded, **{k: environ[k] for k in now}, COMMAND_LINE: " ".join(line)}


def emit_bundle(out: Path, rec: dict, workers: int, nodes: Sequence[str]) -> str:
    """The bundle for `workers` on `nodes`, written over the old one; its new run id."""
    argv = with_flag(rec["argv"], "--workers", str(workers))
    argv = with_flag(with_flag(argv, "--trainer-nodes", ",".join(nodes)), "--run", "")
    r = emit.run(argv, rec["environ"])
    emit.write(r)
    return r.deployment.run


Follow = Callable[[Manager, str, float], Callable[[], str]]
"""Start reading a service's log as it is written (for at most the given seconds); the function it
returns stops the reading and gives what was read."""


def stop(
    m: Manager,
    stack: str,
    names: Sequence[str],
    sleep: Callable[[float], None] = time.sleep,
    follow: Follow | None = None,
) -> int | None:
    """SIGTERM to every trainer at once (each saves the same step); wait until none holds a container.
    The step every task saved, from the chief's log read while it stops (a scaled-down task's container
    goes, its log with it); None when no save was said (no task was training: a peer was lost)."""
    limit = STOP_GRACE_SECONDS + 60  # Swarm sends SIGKILL after the grace
    chief = (follow or _follow)(m, f"{stack}_{CHIEF}", limit)
    try:
        m.docker("service", "scale", "-d", *(f"{stack}_{n}=0" for n in names))
        deadline = time.time() + limit
        while live := _live_or_unknown(m, stack):
            if time.time() > deadline:
                raise RuntimeError(f"{', '.join(live)} still running {limit} s after the stop")
            sleep(1.0)
    finally:
        said = chief()
    steps = [int(found.group(1)) for found in SAVED.finditer(said)]
    return steps[-1] if steps else None


def _follow(m: Manager, service: str, limit: float) -> Callable[[], str]:
    """`docker service logs -f` on the manager from now on, ended by `timeout` there at the latest."""
    cmd = ["docker", "exec", m.container(), "timeout", f"{limit:.0f}", "docker", "service", "logs", "-f",
           "--raw", "--since", f"{time.time():.0f}", service]  # fmt: skip
    proc = Engine().popen(*cmd[1:], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)

    def finish() -> str:
        proc.terminate()
        try:
            return proc.communicate(timeout=10)[0]
        except subprocess.TimeoutExpired:
            proc.kill()
            return proc.communicate()[0]

    return finish


def _live_or_unknown(m: Manager, stack: str) -> list[str]:
    """_live, or ["?"] while Swarm answers mid-change (a task reaped between `stack ps` and `inspect`:
    "No such task" ended a resize after its stop and left the job at 0 replicas in the swarm run)."""
    try:
        return _live(m, stack)
    except RuntimeError:
        return ["?"]


def _live(m: Manager, stack: str) -> list[str]:
    """Trainers whose container still runs on a ready node (one on a Down node is gone with it)."""
    up = {n.host for n in swarmstate.nodes(m) if n.ready}
    return [
        t.name for t in swarmstate.tasks(m, stack).values() if t.state in swarmstate.LIVE and t.node in up
    ]


def deploy(m: Manager, out: Path, stack: str) -> None:
    """The bundle deployed again by the Swarm target (compose/targets/swarm.py)."""
    swarm_target.deploy(Place(stack, out, m.swarm, m.nodes), m.engine)


def started(
    m: Manager, stack: str, since: float, sleep: Callable[[float], None] = time.sleep
) -> tuple[str, float]:
    """The chief's resize line (or its start line) once it starts after `since`, and when it did."""
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(since))
    while time.time() < since + START_WAIT_S:
        lines = swarmstate.logs(m, f"{stack}_{CHIEF}", stamp)
        if starts := [ln for ln in lines if STARTED.search(ln)]:
            resized = [found.group(1) for ln in lines if (found := RESIZED.search(ln))]
            said = resized[0] if resized else starts[0][starts[0].index("chief: ") + len("chief: ") :]
            return said, swarmstate.stamp(starts[0].split()[0])
        sleep(2.0)
    raise RuntimeError(
        f"the chief did not start within {START_WAIT_S:.0f} s: make stack-status STACK={stack}"
    )


def resize_to(
    m: Manager, out: Path, rec: dict, workers: int, nodes: Sequence[str], say: Callable[[str], None]
) -> float:
    """Stop, emit, deploy, wait for the chief's start; the seconds from the stop to that start."""
    stack = flag(rec["argv"], "--project")
    names = list(swarmstate.trainers(m, stack))
    begun = time.time()
    saved = stop(m, stack, names)
    say(
        f"stopped: every task saved step {saved}"
        if saved is not None
        else "stopped: no task said a save (none was training: a peer was lost); the job goes on from its newest save"
    )
    rec = {**rec, "run": emit_bundle(out, rec, workers, nodes)}
    deploy(m, out, stack)
    where = (
        f" ({', '.join(f'{t} on {n}' for t, n in zip(_tasks(workers), nodes, strict=False))})"
        if nodes
        else ""
    )
    say(
        f"STACK={stack} from WORKERS={swarmstate.workers(names)} to WORKERS={workers}{where}: deployed, run {rec['run']}"
    )
    (out / RECORD).write_text(json.dumps(rec, indent=1) + "\n")
    line, at = started(m, stack, begun)
    say(f"{line} ({at - begun:.0f} s after the stop)")
    return at - begun


def _tasks(workers: int) -> list[str]:
    return [CHIEF, *(f"{WORKER}-{i}" for i in range(workers))]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m compose.stackresize", description=__doc__.splitlines()[0])
    p.add_argument("--dir", type=Path, required=True, help="the stack's bundle folder (SWARM_DIR)")
    p.add_argument("--workers", default="", help="workers besides the chief after the resize")
    p.add_argument("--record", nargs=argparse.REMAINDER, help="record the emitter's flags that follow")
    ns = p.parse_args(argv)
    say = lambda text: print(f"stack-resize: {text}", file=sys.stderr)  # noqa: E731
    if ns.record is not None:
        record(ns.dir, [a for a in ns.record if a != "--"], os.environ)
        return 0
    lock = ProjectLock(ns.dir, f"make stack-resize STACK={ns.dir.name} WORKERS={ns.workers}", ns.dir.name,
                       say=say, label="STACK")  # fmt: skip
    try:
        lock.acquire()  # stack-up, stack-down and stack-elastic of the stack hold it too
        rec = load(ns.dir)
        m = Manager(rec["swarm"], rec["nodes"])
        stack = flag(rec["argv"], "--project")
        if why := refusal(ns.workers, stack, swarmstate.tasks(m, stack)):
            raise Refused(why)
        nodes = placement(rec, int(ns.workers), swarmstate.usable(swarmstate.nodes(m)))
        if rec["prometheus"] and (
            why := resize.settle(resize.prometheus(rec["prometheus"]), stack, rec["run"])
        ):
            raise Refused(why)
        rec["argv"] = with_flag(rec["argv"], "--workers", str(int(ns.workers)))  # the job's full size now
        rec["environ"] = overlay(rec["environ"], os.environ)
        resize_to(m, ns.dir, rec, int(ns.workers), nodes, say)
    except (Refused, LockHeld) as why:
        say(str(why))
        return 2
    except (RuntimeError, ValueError, OSError) as err:
        say(f"{err}; the job resumes from its checkpoint on the next make stack-up STACK=...")
        return 1
    finally:
        lock.release()
    return 0


if __name__ == "__main__":
    sys.exit(main())
