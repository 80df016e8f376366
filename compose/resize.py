"""`make resize WORKERS=N`'s refusals, each one line, before any task is stopped.

    python -m compose.resize --project NAME --workers N     # exit 0: go on; 2: refused (the line says why)

A resize stops every task with SIGTERM (each saves the same step, trainer/train/training.py's
preemption handler) and starts the job again with N workers from that checkpoint (compose/up.sh,
trainer/state/resize.py). It only makes sense for a job that is training now at another size:
refused for a count that is not a whole number >= 0, the same size, and a job that is not running
(never started, stopped, failed or finished: `make up WORKERS=N` continues one from its checkpoint).
Standard library only.
"""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
from collections.abc import Callable, Mapping, Sequence

from contract import CHIEF, WORKER

WORKER_RE = re.compile(rf"^{WORKER}-(\d+)$")
EXITED_RE = re.compile(r"^Exited \((\d+)\)")


def states(project: str, run: Callable[[list[str]], str] | None = None) -> dict[str, str]:
    """Each task's container status as `docker ps` words it ("Up 3 minutes", "Exited (0) ...")."""
    run = run or (lambda cmd: subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)
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


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m compose.resize", description=__doc__.splitlines()[0])
    p.add_argument("--project", required=True)
    p.add_argument("--workers", required=True)
    ns = p.parse_args(argv)
    tasks = states(ns.project)
    if why := refusal(ns.workers, ns.project, tasks):
        print(f"resize: {why}", file=sys.stderr)
        return 2
    now = sum(1 for svc in tasks if WORKER_RE.match(svc))
    print(f"resize: PROJECT={ns.project} from WORKERS={now} to WORKERS={int(ns.workers)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
