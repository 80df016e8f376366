"""The running job `make tune` works on, through Docker: its trainer containers, the settings they
started with, a copy of its checkpoint volume, and pausing it while the trials run (so the trials and
the job do not share the two cores). Host side only."""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

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


def _docker(*args: str, check: bool = True) -> str:
    r = subprocess.run(["docker", *args], capture_output=True, text=True, timeout=120)
    if check and r.returncode:
        raise JobError(f"docker {' '.join(args[:2])}: {(r.stderr.strip().splitlines() or ['failed'])[-1]}")
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
        raise JobError(
            f"no running job in project {project}: make up{'' if project == 'mwms' else ' PROJECT=' + project} first"
        )
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


def pause(job: Job) -> None:
    _docker("pause", *job.containers.values())


def unpause(job: Job) -> None:
    _docker("unpause", *job.containers.values(), check=False)


def copy_checkpoint(job: Job, dest: Path) -> None:
    """The checkpoint volume's files into dest, read by a throwaway container of the job's image."""
    dest.mkdir(parents=True, exist_ok=True)
    tar = subprocess.Popen(
        [
            "docker",
            "run",
            "--rm",
            "-v",
            f"{job.project}_checkpoints:/c:ro",
            "--entrypoint",
            "tar",
            job.image,
            "-C",
            "/c",
            "-cf",
            "-",
            ".",
        ],
        stdout=subprocess.PIPE,
    )
    untar = subprocess.run(["tar", "-xf", "-", "-C", str(dest)], stdin=tar.stdout, capture_output=True)
    if tar.wait(timeout=300) or untar.returncode:
        raise JobError(
            f"could not copy the checkpoint volume {job.project}_checkpoints: {untar.stderr.decode().strip()[:200]}"
        )
