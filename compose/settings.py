"""A stack's settings, parsed once from what make hands over (its environment) into one frozen object.

    make up WORKERS=3 STEPS=500  ->  environment (compose/compose.mk)  ->  Settings.parse(os.environ)

make hands every variable to Python in the environment, never in shell text, and names those given on
its command line in MAKE_COMMAND_LINE (the top Makefile). Stack settings (WORKERS, GPUS, OUTPUT, ...)
become this dataclass; trainer knobs (STEPS=, TASK=, any trainer flag upper-cased, TRAINER_<NAME>) stay in
the environment, which compose/knobs.py reads when the Deployment is described. What a `make up` was
given is recorded in RUN_DIR/up.json, so a resize or a tune's winner starts the same job again with one
thing changed (`restart_environ`). Standard library only.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

import contract
from compose import knobs as trainer_knobs
from compose import preflight, values
from trainer.host import ENV_PREFIX

READS = ("PROJECT", "WORKERS", "GPUS", "GPUS_PER_WORKER", "OFFLINE", "BIND_ADDR", "MAX_RESTARTS", "SECRETS_DIR",
         "RUN_DIR", "IMAGE_REPO", "SCRIPT", "DATA", "OUTPUT", "PROMETHEUS_RETENTION_TIME",
         "PROMETHEUS_RETENTION_SIZE", "PROMETHEUS_LIFECYCLE", "FORCE")  # fmt: skip
"""The variables a Settings is parsed from (compose/compose.mk's STACK_VARS hands them over)."""
RECORD = "up.json"
TUNED = "tuned.env"
NOT_KNOBS = {"WORKERS", "PROJECT", "RUN_DIR", "PYTHON"}
"""Command-line variables a restart does not carry over: the size is the restart's own, the project
and its folder are the one being restarted, PYTHON is the host's."""


def run_dir_of(project: str) -> Path:
    """The default project's generated files in .run, another's in .run/PROJECT (compose/compose.mk)."""
    return Path(".run") if project == contract.DEFAULT_PROJECT else Path(".run") / project


def shown(text: str) -> str:
    """A value as a line can show it: as typed when it is one plain word, else quoted with its escapes
    (a newline or a quote in it never breaks the one line of a refusal)."""
    return text if re.fullmatch(r"[\w.,:/@+-]*", text) else repr(text)


def _count(name: str, text: str, default: int) -> int:
    if not text.strip():
        return default
    if not text.strip().isdigit():
        raise ValueError(f"{name}={shown(text)}: a whole number, 0 or more (e.g. {name}={default})")
    return int(text)


@dataclass(frozen=True, kw_only=True)
class Settings:
    """One stack's settings as make was given them (empty: the default)."""

    project: str = contract.DEFAULT_PROJECT
    workers: int = contract.DEFAULT_WORKERS
    """Workers besides the chief."""
    gpus: str = "auto"
    gpus_per_worker: int = 1
    offline: str = "auto"
    bind_addr: str = "127.0.0.1"
    max_restarts: int = contract.DEFAULT_MAX_RESTARTS
    secrets_dir: Path = Path("secrets")
    run_dir: Path = Path(".run")
    image_repo: str = "mwms/trainer"
    script: str = ""
    data: str = ""
    output: str = ""
    """Host folder the chief copies the final model into (empty: none)."""
    args: str = ""
    """Extra arguments for every task, shell-quoted as typed (split by shlex, never by a shell)."""
    retention_time: str = ""
    retention_size: str = ""
    lifecycle_api: bool = False
    force: bool = False
    keep: str = ""
    """RESIZE_KEEP=, handed to the trainer through the environment."""

    def __post_init__(self) -> None:
        if why := preflight.project_problem(self.project):
            raise ValueError(why)

    @classmethod
    def parse(cls, environ: Mapping[str, str]) -> Settings:
        """ValueError (one line naming make's variable) on a bad value: the rules make checked at parse
        time (compose/values.py), checked again for a caller that is not make (a restart, the tune)."""
        for name in READS:
            if environ.get(name):
                values.check(name, environ[name])
        get = lambda name: environ.get(name, "")  # noqa: E731
        project = get("PROJECT") or contract.DEFAULT_PROJECT
        return cls(
            project=project,
            workers=_count("WORKERS", get("WORKERS"), contract.DEFAULT_WORKERS),
            gpus=get("GPUS") or "auto",
            gpus_per_worker=_count("GPUS_PER_WORKER", get("GPUS_PER_WORKER"), 1),
            offline=get("OFFLINE") or "auto",
            bind_addr=get("BIND_ADDR") or "127.0.0.1",
            max_restarts=_count("MAX_RESTARTS", get("MAX_RESTARTS"), contract.DEFAULT_MAX_RESTARTS),
            secrets_dir=Path(get("SECRETS_DIR") or "secrets"),
            run_dir=Path(get("RUN_DIR") or run_dir_of(project)),
            image_repo=get("IMAGE_REPO") or "mwms/trainer",
            script=get("SCRIPT"),
            data=get("DATA"),
            output=get("OUTPUT") if get("OUTPUT") or "OUTPUT" in given(environ) else f".run/output/{project}",
            args=get("ARGS"),
            retention_time=get("PROMETHEUS_RETENTION_TIME"),
            retention_size=get("PROMETHEUS_RETENTION_SIZE"),
            lifecycle_api=get("PROMETHEUS_LIFECYCLE") == "1",
            force=get("FORCE") not in ("", "0"),
        )

    @property
    def shown(self) -> str:
        """` PROJECT=name` for a line telling the user what to type; empty for the default project."""
        return "" if self.project == contract.DEFAULT_PROJECT else f" PROJECT={self.project}"


def given(environ: Mapping[str, str]) -> list[str]:
    """The names given on make's command line."""
    return environ.get(trainer_knobs.COMMAND_LINE, "").split()


def record(environ: Mapping[str, str], path: Path) -> None:
    """What a `make up` was given (its command line but the size and the project's own, and every
    TRAINER_* of its environment), for the restarts of `restart_environ`."""
    line = {
        n: environ.get(n, "")
        for n in given(environ)
        if n not in NOT_KNOBS and re.fullmatch(r"[A-Z][A-Z0-9_]*", n)
    }
    trainer = {k: v for k, v in environ.items() if re.fullmatch(ENV_PREFIX + r"[A-Z_]+", k)}
    path.write_text(json.dumps({"command_line": line, "trainer": trainer}, indent=1, sort_keys=True) + "\n")


def restart_environ(environ: Mapping[str, str], recorded: Path, drop: tuple[str, ...] = ()) -> dict[str, str]:
    """The environment to start the job again: its `make up`'s settings under those given now (WORKERS=,
    RESIZE_KEEP=), less the names in `drop` (a tune's winner, which then comes from tuned.env)."""
    if not recorded.is_file():
        raise ValueError(f"{recorded} is missing: make down, then make up with the same settings")
    was = json.loads(recorded.read_text())
    now = given(environ)
    out = {k: v for k, v in environ.items() if not k.startswith(ENV_PREFIX)}
    out |= {k: v for k, v in was["trainer"].items() if k.removeprefix(ENV_PREFIX) not in drop}
    line = {k: v for k, v in was["command_line"].items() if k not in drop}
    out |= line | {n: environ.get(n, "") for n in now}
    out[trainer_knobs.COMMAND_LINE] = " ".join(dict.fromkeys([*line, *now]))
    return out


def read_tuned(path: Path) -> dict[str, str]:
    """make tune's winner: NAME=value lines (monitoring/tune/winner.py writes them)."""
    if not path.is_file():
        return {}
    pairs = (line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)
    return {k: v for k, v in pairs if re.fullmatch(r"[A-Z][A-Z0-9_]*", k)}


def with_tuned(environ: Mapping[str, str], tuned: Mapping[str, str]) -> tuple[dict[str, str], list[str]]:
    """The winner's settings as TRAINER_<NAME>, each one the user did not give (on make's command line
    or as TRAINER_<NAME>); and those used, for the line that says so."""
    out, used, line = dict(environ), [], set(given(environ))
    for name, value in tuned.items():
        if (name in line and environ.get(name)) or environ.get(ENV_PREFIX + name):
            continue
        out[ENV_PREFIX + name] = value
        used.append(f"{name}={value}")
    return out, used
