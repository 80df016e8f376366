"""`make up`'s early refusals: each fault in one line, before anything is downloaded, built or started.

    problems(ns) -> [one line per fault]      # compose/up.py's step 0 (`make up`, `make resize`)

- PROJECT must follow Compose's rule for project names (else it fails only after the image builds);
- GPUS=N or GPUS=i,j must name GPUs this host has and Docker can give to containers (else a 3.3 GB
  wheel download and a 6.75 GB build come first);
- with --starting: every port the stack publishes must be free on BIND_ADDR, or held by this same
  project's running stack (a second stack on a taken port would start its trainers anyway, and its
  `make status` would read the first stack's Prometheus); and the tasks must fit in the host's
  available memory at what one task of the default job was measured to hold (WORKERS=100 on a 24 GiB
  host started silently).
A second `make up` of the project while one is starting is refused by the project's lock
(compose/projectlock.py). Standard library only: it runs before any venv exists.
"""

from __future__ import annotations

import argparse
import errno
import re
import socket

from compose import gpus, services

PROJECT_NAME = re.compile(r"[a-z0-9][a-z0-9_-]*")
"""Compose's rule: lowercase letters, digits, dashes and underscores, starting with a letter or digit."""


def project_problem(name: str) -> str | None:
    if PROJECT_NAME.fullmatch(name):
        return None
    fixed = re.sub(r"[^a-z0-9_-]", "-", name.lower()).lstrip("-_") or "mwms"
    return (
        f"PROJECT={name!r}: Compose project names take lowercase letters, digits, '-' and '_', "
        f"starting with a letter or digit: use e.g. PROJECT={fixed}"
    )


def gpu_problem(requested: str, runner: gpus.Runner = gpus.run) -> str | None:
    """GPUS=auto and GPUS=0 always pass; a count or a list must be on this host."""
    try:
        ids = gpus.parse(requested) if requested.strip() != "auto" else ()
    except gpus.GpuError as err:
        return str(err)
    if not ids:
        return None
    host = gpus.detect(runner)
    if not host:
        return (
            f"GPUS={requested}: this host has no GPU that containers can use (nvidia-smi and Docker's "
            "nvidia runtime): use GPUS=0 (CPU) or GPUS=auto; `make images-gpu` builds the GPU image anywhere"
        )
    missing = [i for i in ids if i not in host]
    if missing:
        return f"GPUS={requested}: GPU {','.join(missing)} is not on this host (it has {','.join(host)})"
    return None


MEMORY_PER_TASK_MIB = 400
"""What one task of the default job holds (docker stats, 2026-12-04, a chief + 2 workers on 2 CPU cores:
chief 397 MiB, workers 372-375): a floor, a larger model or a SCRIPT holds more."""
MONITORING_MIB = 400
"""Prometheus, Alertmanager and TensorBoard together, measured the same way (90 + 38 + 255 MiB)."""


def available_mib(meminfo: str = "/proc/meminfo", field: str = "MemAvailable") -> int | None:
    try:
        with open(meminfo) as f:
            fields = dict(line.split(":", 1) for line in f if ":" in line)
        return int(fields[field].split()[0]) // 1024
    except (OSError, KeyError, ValueError):
        return None


def need_mib(workers: int) -> int:
    return (workers + 1) * MEMORY_PER_TASK_MIB + MONITORING_MIB


def memory_problem(workers: int, available: int | None) -> str | None:
    need = need_mib(workers)
    if available is None or need <= available:
        return None
    most = max((available - MONITORING_MIB) // MEMORY_PER_TASK_MIB - 1, 0)
    return (
        f"WORKERS={workers}: {workers + 1} tasks need at least {need / 1024:.1f} GiB ({MEMORY_PER_TASK_MIB} MiB "
        f"each, measured on the default job, and {MONITORING_MIB} MiB for the monitoring); this host has "
        f"{available / 1024:.1f} GiB available: WORKERS={most} at most here, or more hosts (make stack-up)"
    )


def workers_problem(text: str) -> str | None:
    if text.strip().isdigit():
        return None
    return f"WORKERS={text}: a whole number of workers besides the chief, 0 or more (e.g. WORKERS=3)"


def published_ports() -> list[tuple[str, int]]:
    """(service, port) the stack publishes on BIND_ADDR, as compose/services.py describes them."""
    return [(s.name, p) for s in services.SERVICES for p in s.publish]


def port_in_use(addr: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        # Connections of an earlier stack in TIME_WAIT do not hold the port; a listener does.
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((addr, port))
        except OSError as err:
            return err.errno == errno.EADDRINUSE
    return False


def holders(addr: str, port: int, runner: gpus.Runner = gpus.run) -> list[tuple[str, str]]:
    """(compose project, container) of every container publishing `port` on `addr` (or on every
    address), as Docker reports them."""
    out = runner(
        [
            "docker",
            "ps",
            "--filter",
            f"publish={port}",
            "--format",
            '{{.Label "com.docker.compose.project"}}|{{.Names}}|{{.Ports}}',
        ]
    )
    on = (f"{addr}:{port}->", f"0.0.0.0:{port}->", f":::{port}->")
    rows = [line.split("|", 2) for line in out.splitlines() if line.count("|") == 2]
    return [
        (project, name) for project, name, ports in rows if addr == "0.0.0.0" or any(o in ports for o in on)
    ]


def port_problem(
    addr: str, service: str, port: int, project: str, runner: gpus.Runner = gpus.run
) -> str | None:
    if not port_in_use(addr, port):
        return None
    held = holders(addr, port, runner)
    if any(p == project for p, _ in held):
        return None  # this project's own running stack: `make up` again replaces it
    who = ", ".join(f"container {name} (project {p or '-'})" for p, name in held) or "another process"
    return (
        f"{addr}:{port} ({service}) is already in use by {who}: give this stack its own BIND_ADDR=, "
        f"or stop that one first (make down PROJECT=...)"
    )


def own_mib(project: str, runner: gpus.Runner = gpus.run) -> int:
    """What this project's running containers hold, at the measured figures: the memory that `make up`
    again, or `make resize`, frees before its new tasks start."""
    out = runner(["docker", "ps", "--filter", f"label=com.docker.compose.project={project}", "--format",
                  '{{.Label "com.docker.compose.service"}}'])  # fmt: skip
    names = set(out.split())
    tasks = {n for n in names if n == "chief" or n.startswith("worker-")}
    return len(tasks) * MEMORY_PER_TASK_MIB + (MONITORING_MIB if names - tasks else 0)


def freed_mib(project: str, workers: int, runner: gpus.Runner = gpus.run) -> int | None:
    """The memory available once this project's running containers are replaced. Docker is asked only
    when the answer matters: a job that fits in what is free, or that no emptied host could hold, is
    decided without it (a refusal comes before the engine is touched)."""
    available, total = available_mib(), available_mib(field="MemTotal")
    if available is None or need_mib(workers) <= available or total is None or need_mib(workers) > total:
        return available
    return available + own_mib(project, runner)


def problems(ns: argparse.Namespace, runner: gpus.Runner = gpus.run) -> list[str]:
    found = [project_problem(ns.project), gpu_problem(ns.gpus, runner), workers_problem(ns.workers)]
    if ns.starting and not found[-1]:
        found.append(memory_problem(int(ns.workers), freed_mib(ns.project, int(ns.workers), runner)))
    if ns.starting:
        addr = "0.0.0.0" if ns.bind_addr in ("", "0.0.0.0") else ns.bind_addr
        found += [port_problem(addr, svc, port, ns.project, runner) for svc, port in published_ports()]
    return [p for p in found if p]
