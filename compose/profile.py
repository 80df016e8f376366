"""`make profile`: what to run in the stack for one trace of every task (trainer.telemetry.profile_capture).

    python -m compose.profile --run-dir .run --seconds 2 --keep 5

prints the `docker compose exec` arguments: the TensorBoard service (on the cluster network, with the
log volume), the capture module, and every task of the project's last `make up`, read from the
Prometheus targets it generated (one `<task>:<port>` per task), so the list cannot disagree with the stack.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

import contract
from compose.deployment import LOG_DIR
from compose.services import TENSORBOARD


def task_names(run_dir: Path) -> list[str]:
    groups = json.loads((run_dir / "targets" / "trainers.json").read_text())
    return sorted((contract.task_of(g["labels"]) for g in groups), key=contract.task_order)


def exec_args(tasks: Sequence[str], seconds: float, keep: int) -> list[str]:
    return [
        TENSORBOARD.name,
        "python",
        "-m",
        "trainer.telemetry.profile_capture",
        f"--logdir={LOG_DIR}",
        f"--seconds={seconds:g}",
        f"--keep={keep}",
        *tasks,
    ]


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m compose.profile", description=__doc__.splitlines()[0])
    p.add_argument("--run-dir", type=Path, required=True)
    p.add_argument("--seconds", type=float, required=True)
    p.add_argument("--keep", type=int, required=True)
    ns = p.parse_args(argv)
    try:
        tasks = task_names(ns.run_dir)
    except FileNotFoundError:
        print(f"compose.profile: no stack in {ns.run_dir}: run make up first", file=sys.stderr)
        return 2
    print(" ".join(exec_args(tasks, ns.seconds, ns.keep)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
