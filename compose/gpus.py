"""Which GPUs each task gets: detection (`GPUS=auto`) and the per-task `device_ids`.

Compose replicas cannot each get their own GPU (docker/compose#11863), so every task is its own
service with explicit `device_ids`, handed out in task order: chief, worker-0, worker-1, ...
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable, Sequence

from compose.engine import Engine


class GpuError(ValueError):
    """The requested GPU layout cannot be satisfied; the message says what to change."""


Runner = Callable[[Sequence[str]], str]


def run(cmd: Sequence[str]) -> str:
    """stdout of cmd, or "" when it is missing or fails (detection must never crash a CPU host); a
    docker command goes through the engine adapter (compose/engine.py)."""
    if cmd and cmd[0] == "docker":
        return Engine().query(*cmd[1:])
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ""


def detect(runner: Runner = run) -> tuple[str, ...]:
    """GPU indices usable by containers: needs both GPUs (nvidia-smi) and the NVIDIA runtime in Docker."""
    ids = tuple(
        line.strip()
        for line in runner(["nvidia-smi", "--query-gpu=index", "--format=csv,noheader"]).splitlines()
        if line.strip()
    )
    if not ids:
        return ()
    runtimes = runner(["docker", "info", "--format", "{{json .Runtimes}}"]).strip()
    return ids if "nvidia" in (json.loads(runtimes) if runtimes else {}) else ()


def parse(gpus: str, runner: Runner = run) -> tuple[str, ...]:
    """GPUS=auto (detect), 0 (CPU), N (GPUs 0..N-1) or an id list such as 0,2,3."""
    gpus = gpus.strip()
    if gpus == "auto":
        return detect(runner)
    if "," in gpus:
        ids = tuple(g.strip() for g in gpus.split(","))
        if not all(i.isdigit() for i in ids) or len(set(ids)) != len(ids):
            raise GpuError(f"GPUS={gpus}: give distinct GPU indices such as GPUS=0,1,3")
        return ids
    if not gpus.isdigit():
        raise GpuError(f"GPUS={gpus}: use auto, 0 (CPU only), a count such as 4, or indices such as 0,2")
    return tuple(str(i) for i in range(int(gpus)))


def assign(tasks: Sequence[str], ids: Sequence[str], per_task: int) -> dict[str, tuple[str, ...]]:
    """Each task gets its own `per_task` GPUs, in task order; no GPU is shared between tasks."""
    if per_task < 1:
        raise GpuError(f"GPUS_PER_WORKER={per_task}: must be 1 or more (use GPUS=0 for CPU)")
    need = len(tasks) * per_task
    if need > len(ids):
        raise GpuError(
            f"{len(tasks)} tasks x GPUS_PER_WORKER={per_task} need {need} GPUs but only "
            f"{len(ids)} are available ({','.join(ids) or 'none'}); lower WORKERS or "
            "GPUS_PER_WORKER, or run on CPU with GPUS=0"
        )
    return {task: tuple(ids[i * per_task : (i + 1) * per_task]) for i, task in enumerate(tasks)}
