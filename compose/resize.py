"""`make resize WORKERS=N`'s refusals, each one line, before any task is stopped.

    python -m compose.resize --project NAME --workers N     # exit 0: go on; 2: refused (the line says why)

A resize stops every task with SIGTERM (each saves the same step, trainer/train/training.py's
preemption handler) and starts the job again with N workers from that checkpoint (compose/up.sh,
trainer/state/resize.py). It only makes sense for a job that is training now at another size:
refused for a count that is not a whole number >= 0, the same size, and a job that is not running
(never started, stopped, failed or finished: `make up WORKERS=N` continues one from its checkpoint).
From the job's own Prometheus: refused while a task is starting or waiting for its peers (no step to
save yet: its SIGTERM would end the start, not save), and a resize asked mid-save waits for the save
to end, so the stop saves the step after it. A task is judged on a sample scraped after the ask: the
scrape before it may predate the task's first step by a scrape interval (a resize asked seconds after
training began was refused on it). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping, Sequence

from compose.engine import Engine
from contract import CHIEF, PROJECT_LABEL, RUN_LABEL, STATE, WORKER, task_of

WORKER_RE = re.compile(rf"^{WORKER}-(\d+)$")
EXITED_RE = re.compile(r"^Exited \((\d+)\)")


def states(project: str, run: Callable[[list[str]], str] | None = None) -> dict[str, str]:
    """Each task's container status as `docker ps` words it ("Up 3 minutes", "Exited (0) ...")."""
    run = run or (lambda cmd: Engine().docker(*cmd[1:]))
    out = run(
        ["docker", "ps", "-a", "--filter", f"label=com.docker.compose.project={project}",
         "--format", '{{.Label "com.docker.compose.service"}}\t{{.Status}}']
    )  # fmt: skip
    rows = (line.split("\t", 1) for line in out.splitlines() if "\t" in line)
    return {svc: status for svc, status in rows if svc == CHIEF or WORKER_RE.match(svc)}


def refusal(requested: str, project: str, tasks: Mapping[str, str]) -> str | None:
    """Why this resize cannot go on (one line), or None."""
    if not re.fullmatch(r"\d+", requested.strip()):
        return f"WORKERS={requested!r}: a whole number of workers besides the chief (0 or more)"
    chief = tasks.get(CHIEF, "")
    if not chief.startswith("Up"):
        done = EXITED_RE.match(chief)
        state = (
            "has finished (its chief exited 0): make up WORKERS=N STEPS=<more> trains on at the new size"
            if done and done.group(1) == "0"
            else "is not running: make up WORKERS=N continues it from its checkpoint at the new size"
        )
        return f"PROJECT={project}'s job {state}"
    now = sum(1 for svc in tasks if WORKER_RE.match(svc))
    if int(requested) == now:
        return f"PROJECT={project} already trains with WORKERS={now}: nothing to resize"
    return None


STARTING = ("starting", "waiting_for_peers")
SAVING = "checkpointing"
SAVE_WAIT_S = 300.0
"""How long a resize waits for a save in progress to end: a save that lasts longer is stuck, not slow."""
FRESH_WAIT_S = 60.0
"""How long a resize waits for a starting task's first sample after the ask: Prometheus scrapes every
task every few seconds (monitoring/config/prometheus/prometheus.yml), so one not scraped in a minute
is not being scraped, and its last sample is all there is."""

Query = Callable[[str], list[dict]]


def prometheus(url: str) -> Query:
    """An instant query of the job's Prometheus: its result list."""

    def query(expr: str) -> list[dict]:
        with urllib.request.urlopen(
            f"{url}/api/v1/query?{urllib.parse.urlencode({'query': expr})}", timeout=5
        ) as r:
            return json.load(r)["data"]["result"]

    return query


def phases(query: Query, project: str, run: str) -> dict[str, tuple[str, float]]:
    """Each task's lifecycle state in this run as it last exposed it, and when that was scraped."""
    sel = f'{STATE.name}{{{PROJECT_LABEL}="{project}", {RUN_LABEL}="{run}"}}'
    # timestamp() of a plain selector is the sample's own time (of `sel == 1`, the query's): `and`
    # keeps it for the state that is 1.
    found = query(f"timestamp({sel}) and {sel} == 1")
    return {
        task_of(r["metric"]): (r["metric"].get(STATE.client_name, ""), float(r["value"][1])) for r in found
    }


def phase_refusal(now: Mapping[str, str], project: str) -> str | None:
    starting = sorted(t for t, state in now.items() if state in STARTING)
    if starting:
        return (
            f"PROJECT={project}'s {', '.join(starting)} {'is' if len(starting) == 1 else 'are'} starting or "
            "waiting for peers (no step to save yet): resize once `make status` shows every task training"
        )
    if any(state == "done" for state in now.values()):
        return (
            f"PROJECT={project}'s job has finished: make up WORKERS=N STEPS=<more> trains on at the new size"
        )
    return None


def settle(
    query: Query,
    project: str,
    run: str,
    wait_s: float = SAVE_WAIT_S,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.time,
) -> str | None:
    """Why not now (one line), or None once no task is starting and none is saving (waits out a save)."""  # fmt: skip
    asked = clock()
    deadline, said = asked + wait_s, False
    while True:
        seen = phases(query, project, run)
        stale = [t for t, (state, at) in seen.items() if state in STARTING and at < asked]
        if stale and clock() < asked + FRESH_WAIT_S:
            sleep(1.0)  # its next scrape says whether it still starts
            continue
        now = {t: state for t, (state, _) in seen.items()}
        if why := phase_refusal(now, project):
            return why
        saving = sorted(t for t, state in now.items() if state == SAVING)
        if not saving:
            return None
        if clock() > deadline:
            return f"PROJECT={project}'s {', '.join(saving)} has been saving for over {wait_s:.0f} s: make status, then try again"
        if not said:
            print(f"resize: {', '.join(saving)} saving a checkpoint: waiting for it to end", file=sys.stderr)
            said = True
        sleep(1.0)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m compose.resize", description=__doc__.splitlines()[0])
    p.add_argument("--project", required=True)
    p.add_argument("--workers", required=True)
    p.add_argument("--prometheus", help="the job's Prometheus: starting and saving tasks are read from it")
    p.add_argument("--run", default="", help="the job's run id (stack.env's RUN)")
    ns = p.parse_args(argv)
    tasks = states(ns.project)
    why = refusal(ns.workers, ns.project, tasks)
    if not why and ns.prometheus:
        try:
            why = settle(prometheus(ns.prometheus), ns.project, ns.run)
        except OSError as err:
            print(
                f"resize: {ns.prometheus} did not answer ({err}): starting or saving tasks not checked",
                file=sys.stderr,
            )
    if why:
        print(f"resize: {why}", file=sys.stderr)
        return 2
    now = sum(1 for svc in tasks if WORKER_RE.match(svc))
    print(f"resize: PROJECT={ns.project} from WORKERS={now} to WORKERS={int(ns.workers)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
