"""Starting one in-container sweep task (`python -m trainer.bench.allreduce_sweep`) per endpoint, with
the payloads' shapes derived on the host, and collecting their results."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from bench.comm.endpoints import Endpoint, StreamCounter
from trainer.host import allreduce_sweep as sweep

PAYLOADS = ("mlp", "cnn", "resnet50")
"""Named in bench/payloads.py (not imported here: it loads TensorFlow)."""


BENCH_PORT = 2223  # beside the trainer's 2222, so a bench can run in the trainer's own containers


def payload_shapes(names: str) -> dict[str, list[tuple[int, ...]]]:
    """The named payloads' shapes, derived here (the host has TensorFlow and bench) and passed
    to the tasks; an unknown name exits with one line."""
    wanted = [n for n in names.split(",") if n]
    unknown = [n for n in wanted if n not in PAYLOADS]
    if unknown:
        raise SystemExit(
            f"bench-comm: --payloads {','.join(unknown)}: unknown, choose from {', '.join(PAYLOADS)}"
        )
    if not wanted:
        return {}
    from bench import payloads

    return {n: payloads.NAMED[n]() for n in wanted}


def _run_sweep(
    endpoints: list[Endpoint], task_args: list[str], extra_env: dict[str, str] | None = None
) -> tuple[list[dict], int]:
    """Every task's result, and the most TCP connections seen between the first two tasks;
    `extra_env` is set in every task's process (an allocator setting of the A/B)."""
    extra_env = extra_env or {}
    from bench.launch import die_with_parent, free_ports, stop
    from trainer.host import ClusterSpec

    ports = free_ports(len(endpoints)) if not endpoints[0].exec_prefix else [BENCH_PORT] * len(endpoints)
    addrs = [f"{e.address}:{p}" for e, p in zip(endpoints, ports)]
    pair = [(e.address, p) for e, p in zip(endpoints, ports)][:2]
    counter = StreamCounter(endpoints[0], pair[0], pair[-1])
    spec = ClusterSpec(chief=(addrs[0],), worker=tuple(addrs[1:]), task=_task_id(endpoints[0].task))
    procs = []
    for e in endpoints:
        tf_config = spec.with_task(_task_id(e.task)).to_tf_config()
        cmd = [sys.executable, "-m", "trainer.bench.allreduce_sweep", *task_args]
        env = {**os.environ, "TF_CONFIG": tf_config, "PYTHONUNBUFFERED": "1", **extra_env}
        if e.exec_prefix:  # the container's own Python and TF_CONFIG
            cmd = [
                *e.exec_prefix[:2],
                "-e",
                f"TF_CONFIG={tf_config}",
                "-e",
                "PYTHONUNBUFFERED=1",
                *(arg for k, v in extra_env.items() for arg in ("-e", f"{k}={v}")),
                *e.exec_prefix[2:],
                "python",
                *cmd[1:],
            ]
        procs.append(
            (
                e.task,
                subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True, preexec_fn=die_with_parent),
            )
        )
    results = []
    counter.start()
    try:
        for name, proc in procs:
            out, _ = proc.communicate()
            if proc.returncode != 0:
                raise RuntimeError(f"bench task {name} exited with {proc.returncode}")
            results.append(
                next(
                    json.loads(line[len(sweep.RESULT) :])
                    for line in out.splitlines()
                    if line.startswith(sweep.RESULT)
                )
            )
    finally:
        counter.done.set()
        stop(procs)
    return results, counter.peak


def _task_id(name: str):
    from trainer.host import CHIEF, WORKER, TaskId

    return TaskId(CHIEF, 0) if name == "chief" else TaskId(WORKER, int(name.rsplit("-", 1)[1]))
