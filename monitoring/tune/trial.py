"""The trials: one local cluster per setting (bench.launch), each from its own copy of the job's
checkpoint, run in turns (SIGSTOP/SIGCONT of its tasks, one cluster at a time, the method of
bench/script_overhead.py) so that every setting meets the same machine. Each turn ends with a reading
of the cluster's chief (monitoring/tune/scrape.py) taken while it still runs."""

from __future__ import annotations

import contextlib
import http.client
import math
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from monitoring.tune import scrape
from monitoring.tune.candidates import PROCESS_VARIABLES

LAUNCH = re.compile(r"^\[launch\] (\S+): pid (\d+), ([\d.]+):(\d+), metrics http://[\d.]+:(\d+)/metrics")
ROOT = Path(__file__).resolve().parents[2]
ERROR = re.compile(r"error|killed|out of memory|exited with", re.IGNORECASE)
"""A line of a failed cluster's output that says why (its last such line is quoted)."""


@dataclass
class Turn:
    start: float
    stop: float
    reading: scrape.Reading


@dataclass
class Cluster:
    """One setting's cluster: its launcher, its tasks' pids and the chief's metrics port."""

    name: str
    env: dict[str, str]
    workdir: Path
    tasks: int
    command: list[str]
    pids: list[int] = field(default_factory=list)
    chief_port: int = 0
    ports: list[tuple[str, int]] = field(default_factory=list)
    turns: list[Turn] = field(default_factory=list)
    log: list[str] = field(default_factory=list)
    proc: subprocess.Popen | None = None
    reader: threading.Thread | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            self.command, cwd=ROOT, env=self.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.log.append(line)
            if m := LAUNCH.match(line):
                self.pids.append(int(m.group(2)))
                self.ports.append((m.group(3), int(m.group(4))))
                if m.group(1) == "chief":
                    self.chief_port = int(m.group(5))

    def failed(self) -> str:
        """Empty while it runs; else why it ended (its exit code and the last error it printed), then
        its last lines."""
        code = self.proc.poll() if self.proc else None
        if code is None:
            return ""
        self.reader.join(timeout=5)  # its last lines, which say why
        said = [ln.strip() for ln in self.log if ERROR.search(ln)]
        # A task's own error line, else the launcher's (a task killed: out of memory, a signal).
        cause = next((ln for ln in reversed(said) if not ln.startswith("[launch]")), said[-1] if said else "")
        return (
            f"its cluster exited {code}"
            + (f" ({cause[:200]})" if cause else "")
            + "\n"
            + "".join(self.log[-15:])
        )

    def reading(self) -> scrape.Reading | None:
        if not self.chief_port:
            return None
        with contextlib.suppress(OSError, ValueError, http.client.HTTPException):  # cut short: it exited
            return scrape.read(self.chief_port)
        return None

    def signal(self, sig: int) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def stop(self) -> None:
        self.signal(signal.SIGCONT)
        if self.proc and self.proc.poll() is None:
            self.proc.kill()  # the tasks die with the launcher (PR_SET_PDEATHSIG)
            self.proc.wait()
        shutil.rmtree(self.workdir, ignore_errors=True)


def cluster(
    name: str,
    job_env: Mapping[str, str],
    settings: Mapping[str, str],
    checkpoint: Path,
    work: Path,
    workers: int,
    module: str,
    args: list[str],
) -> Cluster:
    """A cluster of the job's settings with `settings` on top, on its own copy of the checkpoint."""
    workdir = work / name
    shutil.copytree(checkpoint, workdir / "checkpoints", symlinks=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    env.update(job_env)
    env.update({_env_name(k): v for k, v in settings.items()})
    env.update(
        TRAINER_CHECKPOINT_DIR=str(workdir / "checkpoints"),
        TRAINER_STEPS="1000000000",  # the turns end it, never its step count
        TRAINER_SAVE_EVERY="0",
        TRAINER_RESUME_NEW_SETTINGS="1",
        TRAINER_HEARTBEAT_TIMEOUT="3600",  # a cluster waits whole seconds for its next turn
        TRAINER_LOGDIR="",
        TRAINER_EXPORT_DIR="",
        TRAINER_OUTPUT_DIR="",
        TRAINER_PROFILER_PORT="0",
        TRAINER_FAULT="",
        TF_CPP_MIN_LOG_LEVEL="2",
        PYTHONUNBUFFERED="1",
    )
    command = [sys.executable, "-m", "bench.launch", "--workers", str(workers), "--module", module, *args]
    return Cluster(name, env, workdir, workers + 1, command)


def _env_name(name: str) -> str:
    """A make variable (BYTES_PER_PACK) as the trainer reads it; a process variable (TF_..., GLIBC_...) as is."""
    return name if name.startswith(PROCESS_VARIABLES) else "TRAINER_" + name


def _accepts(addr: tuple[str, int]) -> bool:
    import socket

    with contextlib.suppress(OSError), socket.create_connection(addr, timeout=1):
        return True
    return False


def start_all(clusters: list[Cluster], timeout: float, keep: tuple[str, ...]) -> dict[str, str]:
    """Start each once the one before has bound its ports (launchers draw free ports: two at once could
    draw the same), then wait until every chief has ended two timed calls past its checkpoint (the
    trainer sizes its calls again after the first one, which ran on prefetched batches: with slow input
    that call took seconds, and 1 s turns inside it saw no step); stop them all. Not
    each as soon as it steps: a SCRIPT= job's clusters keep TensorFlow's 10 s coordination heartbeat
    (the script builds its own strategy), and one stopped while the others started (a minute under
    load) was declared dead on its first turn (a cold trial: the null's cluster exited 200). A
    candidate that fails to start (refused, out of memory) is left out (name -> why, returned); one of
    `keep` failing ends the trial."""
    deadline, left, stepping, first_end = time.monotonic() + timeout, {}, set(), {}
    for i, c in enumerate(clusters):
        while i and not _bound(clusters[i - 1]) and not _failed(clusters[i - 1], keep, left):
            _in_time(clusters, deadline)
            time.sleep(0.1)
        c.start()
    while len(stepping) + len(left) < len(clusters):
        _in_time([c for c in clusters if c.name not in stepping and c.name not in left], deadline)
        for c in clusters:
            if c.name in stepping or _failed(c, keep, left):
                continue
            r = c.reading()
            if r and r.ended > 0 and first_end.setdefault(c.name, r.ended) != r.ended:
                stepping.add(c.name)
        time.sleep(0.2)
    for c in clusters:
        c.signal(signal.SIGSTOP)
    return left


def _bound(c: Cluster) -> bool:
    return len(c.ports) == c.tasks and all(_accepts(a) for a in c.ports)


def _failed(c: Cluster, keep: tuple[str, ...], left: dict[str, str]) -> bool:
    """Whether `c` has ended (then in `left`); raises TrialError when it is one of `keep`."""
    if c.name in left:
        return True
    why = c.failed()
    if why and c.name in keep:
        raise TrialError(f"{c.name}: {why}")
    if why:
        left[c.name] = why
    return bool(why)


def _in_time(waiting: list[Cluster], deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TrialError(
            "the trial clusters did not start stepping in time: " + ", ".join(c.name for c in waiting)
        )


class TrialError(RuntimeError):
    """A trial cluster failed (its name and last lines) or never started."""


def run_turns(
    clusters: list[Cluster], turn_s: float, cycles: int, keep: tuple[str, ...], seed: int = 0
) -> dict[str, str]:
    """`cycles` cycles of one turn per cluster, in an order drawn per cycle (a fixed rotation always
    ran the null right after the current settings); a reading ends each turn. A cluster that fails or
    whose loss is not finite leaves the rotation (name -> why, returned); one of `keep` ends the trial."""
    rng, out = random.Random(seed), {}
    for _ in range(cycles):
        for c in rng.sample(clusters, len(clusters)):
            if c.name in out:
                continue
            c.signal(signal.SIGCONT)
            start = time.time()
            time.sleep(turn_s)  # the turn itself: the time this cluster runs alone
            reading = c.reading()
            c.signal(signal.SIGSTOP)
            why = c.failed() or (
                f"its loss is {reading.loss} (diverged)"
                if reading and not math.isfinite(reading.loss)
                else ""
            )
            if why and c.name in keep:
                raise TrialError(f"{c.name}: {why}")
            if why:
                out[c.name] = why
            elif reading is not None:
                c.turns.append(Turn(start, time.time(), reading))
    return out
