"""The running job `make tune` works on, through Docker: its trainer containers, the settings they
started with, a copy of its checkpoint volume, and pausing it while the trials run (so the trials and
the job do not share the two cores). Host side only."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass

import contract as c
from compose import deployment
from compose.engine import Engine
from trainer.host import ENV_PREFIX, server_config

OWN = {
    "METRICS_PORT",
    "METRICS_LINGER",
    "CHECKPOINT_DIR",
    "LOGDIR",
    "EXPORT_DIR",
    "PROFILER_PORT",
    "OUTPUT_DIR",
    "STEPS",
}
"""Trainer settings the stack owns (compose/knobs.STACK_OWNED and the step count): each trial sets its own."""
LABEL = "com.docker.compose"
WRAPPER = "trainer.script.wrapper"


class JobError(RuntimeError):
    """No running job, or one `make tune` cannot trial: the one line `make tune` prints."""


@dataclass(frozen=True)
class Job:
    project: str
    containers: dict[str, str]
    """Task name -> container id, the chief first."""
    env: dict[str, str]
    """The chief's trainer settings (TRAINER_*), the stack-owned ones left out, and its process settings
    (server_config.PROCESS_SETTINGS)."""
    image: str
    script: tuple[str, ...]
    """A SCRIPT= run's script (its host path) and arguments; empty for the built-in loop."""

    @property
    def workers(self) -> int:
        return len(self.containers) - 1


PAUSE_WAITS = (1.0, 2.0, 4.0, 8.0, 16.0)
"""Seconds between tries of pausing the job (31 s in all). `docker pause` asks runc to freeze each
container's cgroup: every thread of every process must stop, and runc gives them ~0.2 s, then thaws the
cgroup back and fails ("unable to freeze"). On a loaded 2-core machine TensorFlow's threads wait that
long for a core: a clean-clone CI run (load 4-22) failed so. Tried again a little later, it froze."""

Docker = Callable[[list[str]], subprocess.CompletedProcess]
"""Runs `docker ARGS` and returns the finished process (its returncode, stdout, stderr): the seam tests fake."""


def _run(args: list[str]) -> subprocess.CompletedProcess:
    """`docker ARGS` through the engine adapter (compose/engine.py); a docker that does not answer in two
    minutes is a JobError, not a traceback."""
    try:
        return Engine().result(*args, timeout=120)
    except subprocess.TimeoutExpired:
        raise JobError(
            f"docker {' '.join(args[:2])} did not answer in 120 s: is the engine overloaded?"
        ) from None


def _last_line(r: subprocess.CompletedProcess) -> str:
    return (r.stderr.strip().splitlines() or ["failed"])[-1]


def _docker(*args: str, check: bool = True) -> str:
    r = _run(list(args))
    if check and r.returncode:
        raise JobError(f"docker {' '.join(args[:2])}: {_last_line(r)}")
    return r.stdout


def find(project: str) -> Job:
    """The project's running trainer containers; JobError when none trains."""
    rows = _docker(
        "ps",
        "--filter",
        f"label={LABEL}.project={project}",
        "--format",
        '{{.ID}} {{.Label "' + LABEL + '.service"}}',
    )
    tasks = {
        svc: cid
        for cid, svc in (r.split() for r in rows.splitlines() if r.strip())
        if svc == "chief" or svc.startswith("worker-")
    }
    if "chief" not in tasks:
        raise JobError(f"no running job in project {project}: make up{_p(project)} first")
    (info,) = json.loads(_docker("inspect", tasks["chief"]))
    env = dict(e.partition("=")[::2] for e in info["Config"]["Env"])
    settings = {
        k: v for k, v in env.items() if k.startswith(ENV_PREFIX) and k.removeprefix(ENV_PREFIX) not in OWN
    }
    # The allocator and thread pools it runs with (a winner of an earlier tune): its trials' too.
    settings |= {k: env[k] for k in server_config.PROCESS_SETTINGS if k in env}
    if settings.get(ENV_PREFIX + "DATA"):
        raise JobError(
            "make tune trials synthetic-data jobs only for now: this job reads DATA= (docs/tune.md)"
        )
    mounts = {m["Destination"]: m["Source"] for m in info.get("Mounts", [])}
    script = _script(info["Config"]["Cmd"] or [], mounts)
    order = sorted(tasks, key=lambda t: (t != "chief", t))
    return Job(project, {t: tasks[t] for t in order}, settings, info["Config"]["Image"], script)


def _script(cmd: list[str], mounts: dict[str, str]) -> tuple[str, ...]:
    """The script a SCRIPT= task runs (`trainer.script.wrapper PATH ARGS`) at its host path (from the
    container's mounts), with its arguments."""
    if WRAPPER not in cmd:
        return ()
    path, *args = cmd[cmd.index(WRAPPER) + 1 :]
    for dest, src in mounts.items():
        if path == dest or path.startswith(dest.rstrip("/") + "/"):
            return (src + path[len(dest.rstrip("/")) :], *args)
    raise JobError(f"the job's script {path} is not in a mount of its container")


def _state(docker: Docker, cid: str) -> dict:
    """The container's State (Status, Paused, ...); {} when it is gone."""
    r = docker(["inspect", "--format", "{{json .State}}", cid])
    return json.loads(r.stdout) if r.returncode == 0 and r.stdout.strip() else {}


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def pause(
    job: Job,
    docker: Docker = _run,
    sleep: Callable[[float], None] = time.sleep,
    say: Callable[[str], None] = _stderr,
) -> None:
    """Pause every task, all or none: a task that does not freeze has the ones paused before it unpaused
    at once (a cluster half paused would miss its collectives and heartbeats), and the whole is tried
    again after PAUSE_WAITS, said in a line. JobError (one line) when a task has stopped or never froze;
    the job then runs as it was. A task already paused (a tune killed before it could unpause) counts as
    paused."""
    for wait in (*PAUSE_WAITS, None):
        paused: list[str] = []
        for task, cid in job.containers.items():
            r = docker(["pause", cid])
            state = _state(docker, cid) if r.returncode else {"Paused": True}
            if state.get("Paused"):
                paused.append(cid)
                continue
            _thaw(docker, paused)
            if state.get("Status") != "running":
                raise JobError(
                    f"the job's task {task} is {state.get('Status', 'gone')}, not running: nothing to tune "
                    f"(make status{_p(job.project)})"
                )
            if wait is None:
                tries = len(PAUSE_WAITS) + 1
                raise JobError(
                    f"could not pause the job's task {task} in {tries} tries over {sum(PAUSE_WAITS):.0f} s "
                    f"(docker: {_last_line(r)}): the machine is too busy to freeze it; the job goes on as it "
                    "was: make tune again when the load is lower"
                )
            say(
                f"tune: the job's task {task} did not freeze (docker: {_last_line(r)}); the job runs, trying again in {wait:.0f} s"
            )
            break
        else:
            return
        sleep(wait)


def unpause(job: Job, docker: Docker = _run, sleep: Callable[[float], None] = time.sleep) -> list[str]:
    """Unpause every task, trying again after PAUSE_WAITS' first waits; the tasks still paused (for a
    line that gives the command), normally none."""
    left = list(job.containers.values())
    for wait in (*PAUSE_WAITS[:3], None):
        left = _thaw(docker, left)
        if not left or wait is None:
            break
        sleep(wait)
    return [t for t, cid in job.containers.items() if cid in left]


def _thaw(docker: Docker, cids: list[str]) -> list[str]:
    """Unpause each container; those that are still paused."""
    for cid in cids:
        docker(["unpause", cid])
    return [cid for cid in cids if _state(docker, cid).get("Paused")]


def _p(project: str) -> str:
    return "" if project == c.DEFAULT_PROJECT else f" PROJECT={project}"


SCRIPT_FOLDER = os.path.relpath(deployment.SCRIPT_CHECKPOINT_DIR, deployment.CHECKPOINT_DIR)
"""A SCRIPT= job's TRAINER_CHECKPOINT_DIR, as a folder of the checkpoint volume (apart from the loop's)."""


def checkpoint_folder(job: Job) -> str:
    """Where in the checkpoint volume the job's own saves are: the loop's at its top, a script's apart."""
    return SCRIPT_FOLDER if job.script else "."


def holds_checkpoint(job: Job, docker: Docker = _run) -> bool:
    """Whether the job's folder of the checkpoint volume holds anything: a SCRIPT= job saves there
    (TRAINER_CHECKPOINT_DIR) or nowhere."""
    folder = f"/c/{checkpoint_folder(job)}"
    listing = f"if [ -d {folder} ]; then ls -A {folder}; fi"
    volume = f"{job.project}_checkpoints:/c:ro"
    r = docker(["run", "--rm", "-v", volume, "--entrypoint", "sh", job.image, "-c", listing])
    if r.returncode:
        raise JobError(f"could not read the checkpoint volume {job.project}_checkpoints: {_last_line(r)}")
    return bool(r.stdout.strip())


def refuse_unsaved_script(job: Job, restart_ok: bool, docker: Docker = _run) -> None:
    """A tune pauses the job past TensorFlow's 10 s heartbeat, so its tasks restart afterwards: a
    script that saves nothing would train again from its start, all it trained lost."""
    if job.script and not restart_ok and not holds_checkpoint(job, docker):
        raise JobError(
            f"project {job.project}'s script keeps no checkpoint in TRAINER_CHECKPOINT_DIR: after the tune its "
            "tasks restart (the pause outlasts TensorFlow's heartbeat) and it would train again from its start; "
            "add tf.keras.callbacks.BackupAndRestore(os.environ['TRAINER_CHECKPOINT_DIR']) (docs/script.md), "
            "or TUNE_RESTART_OK=1 to tune anyway"
        )
