"""`python -m bench.launch --workers N [trainer flags]`: a chief and N workers as local processes.

Each task gets a free 127.0.0.1 port in a generated TF_CONFIG and its own metrics port, its output
is prefixed with its name, and if any task fails the others are stopped and the launcher exits with
that task's code. Children die with the launcher (PR_SET_PDEATHSIG), so killing the launcher kills
the cluster, the way a whole-cluster failure looks. Used to develop and test without Docker.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence

import contract
from trainer.host import on_ports

PR_SET_PDEATHSIG = 1
KILL_GRACE_S = 2.0


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Distinct free ports: all sockets stay open until every port is chosen."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def plan_ports(workers: int, metrics_port: int | None, host: str) -> tuple[list[int], list[int]]:
    """(cluster ports, metrics ports), all distinct. Drawn in one free_ports call, because ports
    drawn in two calls can repeat (a port freed by the first is free again for the second: CI once
    gave the chief's cluster port to worker-1's metrics server); given metrics ports are skipped."""
    tasks = workers + 1
    drawn = free_ports(2 * tasks, host)
    if metrics_port is None:
        return drawn[:tasks], drawn[tasks:]
    mports = [0] * tasks if metrics_port == 0 else [metrics_port + i for i in range(tasks)]
    return [p for p in drawn if p not in mports][:tasks], mports


def die_with_parent() -> None:
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


def _pump(name: str, stream, out) -> None:
    for line in stream:
        out.write(f"[{name}] {line}")
        out.flush()


def start(
    argv: Sequence[str],
    workers: int,
    *,
    module: str = "trainer",
    metrics_port: int | None = None,
    host: str = "127.0.0.1",
) -> list[tuple[str, subprocess.Popen]]:
    """Every task as a child of this process, with this process's environment plus its own TF_CONFIG,
    on top of the environment every deployed task starts with (trainer.cluster.server_config.ENVIRONMENT)."""
    from trainer.host import server_config

    ports, mports = plan_ports(workers, metrics_port, host)
    spec = on_ports(host, ports)
    procs = []
    for task, mport in zip(spec.tasks, mports):
        child_env = {
            **server_config.ENVIRONMENT,
            **os.environ,
            "TF_CONFIG": spec.with_task(task).to_tf_config(),
            "TRAINER_METRICS_PORT": str(mport),
            "PYTHONUNBUFFERED": "1",
        }
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *argv],
            env=child_env,
            text=True,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            preexec_fn=die_with_parent,
        )  # noqa: PLW1509 (only prctl)
        threading.Thread(target=_pump, args=(task.name, proc.stdout, sys.stdout), daemon=True).start()
        where = f"metrics http://{host}:{mport}/metrics" if mport else "metrics off"
        print(f"[launch] {task.name}: pid {proc.pid}, {spec.address(task)}, {where}", flush=True)
        procs.append((task.name, proc))
    return procs


def wait(procs: list[tuple[str, subprocess.Popen]], poll_s: float = 0.2) -> int:
    """0 when every task exits 0; else the first failure's code, after stopping the others."""
    while True:
        codes = [(name, p.poll()) for name, p in procs]
        failed = [(name, c) for name, c in codes if c not in (None, 0)]
        if failed:
            name, code = failed[0]
            print(f"[launch] {name} exited with {code}; stopping the others", flush=True)
            stop(procs)
            return code if code > 0 else 128 - code  # killed by signal N: 128+N, as a shell reports it
        if all(c == 0 for _, c in codes):
            return 0
        time.sleep(poll_s)


def stop(procs: list[tuple[str, subprocess.Popen]]) -> None:
    # TensorFlow swallows SIGTERM once MWMS is up, hence the SIGKILL after a grace period.
    for _, p in procs:
        if p.poll() is None:
            p.terminate()
    deadline = time.monotonic() + KILL_GRACE_S
    for _, p in procs:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.launch",
        description=__doc__.splitlines()[0],
        epilog="Other flags go to every task (see python -m trainer --help).",
    )
    p.add_argument(
        "--workers",
        type=int,
        default=contract.DEFAULT_WORKERS,
        help="workers besides the chief (default %(default)s)",
    )
    p.add_argument(
        "--metrics-port",
        type=int,
        default=None,
        help="chief's metrics port, workers the next ones; 0 disables; default free ports",
    )
    p.add_argument("--module", default="trainer", help="module each task runs (default trainer)")
    args, rest = p.parse_known_args(argv)
    if args.workers < 0:
        p.error("--workers must be 0 or more")
    procs = start(rest, args.workers, module=args.module, metrics_port=args.metrics_port)
    signal.signal(signal.SIGTERM, lambda *_: (stop(procs), sys.exit(143)))
    try:
        return wait(procs)
    except KeyboardInterrupt:
        stop(procs)
        return 130


if __name__ == "__main__":
    sys.exit(main())
