"""A Compose stack's lifecycle: up, down, clean, resize, a tune's winner applied, wait, and the rest.

    python -m compose.lifecycle up|images|check|down|clean|resize|apply-tuned|output|logs|config|wait
    python -m compose.lifecycle compose ARGS...      # docker compose ARGS on the project's stack

make hands every value to this one process in its environment (compose/compose.mk); it is parsed once
into `Settings` (compose/settings.py) and the steps below read that object. Every docker and compose
call goes through the engine adapter (compose/engine.py); engine and image installation stay shell
(compose/engine.sh, images/images.sh), called with argv lists. Every command that changes the job
holds the project's lock (compose/projectlock.py). Refusals are one line and exit 2.

`make up`: refusals (compose/preflight.py, every knob) -> engine -> base images -> the Compose files
(compose/emit.py) -> wheels -> the trainer image, built once -> the checkpoint check -> start -> URLs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable, Mapping
from pathlib import Path

import contract
from compose import deployment, engine, preflight, settings, targets, up, wait
from compose.engine import Engine, EngineError, Stack
from compose.projectlock import LockHeld, ProjectLock
from compose.settings import Settings
from compose.targets import Place

STOP_GRACE_S = deployment.STOP_GRACE_SECONDS


class Refused(RuntimeError):
    """One line for the user; exit 2."""


def say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def stack(s: Settings) -> Stack:
    return Stack(s.project, s.run_dir)


# make down / clean / output / logs / config


def compose_place(s: Settings) -> Place:
    return Place(s.project, s.run_dir)


def down(s: Settings, eng: Engine) -> int:
    targets.load("compose").undeploy(compose_place(s), eng)
    return 0


def clean(s: Settings, eng: Engine) -> int:
    """Like down, and the project's volumes and generated files, never a model not yet copied out nor an
    OUTPUT folder (compose/keep.py says what is kept)."""
    from compose import keep

    if not s.force and (why := keep.uncopied_model(s, eng)):
        raise Refused(why)
    targets.load("compose").undeploy(compose_place(s), eng, volumes=True)
    for path in keep.removable(s):
        keep.remove(path)
    return 0


def output(s: Settings, eng: Engine) -> int:
    if not s.output:
        raise Refused("OUTPUT= is empty: name a host folder to copy the final model into")
    _need_stack(s)
    folder = up.output_folder(s.output)
    eng.compose(stack(s), "run", "--rm", "--no-deps", "-T", "-v", f"{folder.resolve()}:/copy-to", "chief",
                "python", "-m", "trainer.state.output", "copy", "--checkpoint-dir", deployment.CHECKPOINT_DIR,
                "--to", "/copy-to")  # fmt: skip
    return 0


def logs(s: Settings, eng: Engine, service: str) -> int:
    _need_stack(s)
    eng.compose(stack(s), "logs", "--follow", "--tail=50", *([service] if service else []))
    return 0


def config(s: Settings, eng: Engine) -> int:
    _need_stack(s)
    eng.compose(stack(s), "config", "-q")
    return 0


def passthrough(s: Settings, eng: Engine, args: list[str]) -> int:
    """`docker compose ARGS` on the project's stack, for the make recipes that signal or exec into a
    service (alerts-reload, profile): their arguments are the recipe's own, not a user's."""
    _need_stack(s)
    eng.compose(stack(s), *args)
    return 0


def _need_stack(s: Settings) -> None:
    if not stack(s).up:
        raise Refused(f"no stack: run make up{s.shown}")


# make resize / applying a tune's winner: every task saves the same step, then make up again


def resize(s: Settings, eng: Engine, environ: Mapping[str, str]) -> int:
    from compose import resize as refusals

    _need_stack(s)
    if "WORKERS" not in settings.given(environ):
        raise Refused("WORKERS=N is required (the new number of workers besides the chief)")
    st = stack(s).settings()
    code = refusals.main(["--project", s.project, "--workers", str(s.workers), "--prometheus",
                          prometheus_url(st), "--run", st.get("RUN", "")])  # fmt: skip
    if code:
        return code
    return restart(s, eng, settings.restart_environ(environ, s.run_dir / settings.RECORD), "resize")


def apply_tuned(s: Settings, eng: Engine, environ: Mapping[str, str]) -> int:
    """make tune APPLY=1: the job goes on from its checkpoint with the winner in RUN_DIR/tuned.env; the
    knobs of its own make up, less the winner's names, which then come from tuned.env (a knob the job was
    started with would otherwise win over the file, and the job restart as it was)."""
    tuned = settings.read_tuned(s.run_dir / settings.TUNED)
    if not tuned:
        raise Refused(f"cannot apply: {s.run_dir / settings.TUNED} is missing or empty")
    workers = str(sum(1 for x in eng.services(stack(s)) if engine.is_task(x)) - 1)  # its size now
    now = {**environ, "WORKERS": workers, settings.trainer_knobs.COMMAND_LINE: ""}
    return restart(s, eng, settings.restart_environ(now, s.run_dir / settings.RECORD, tuple(tuned)), "tune")


def restart(s: Settings, eng: Engine, environ: Mapping[str, str], who: str) -> int:
    """make up's own refusals for the new settings, before any task stops; then stop and start."""
    new = Settings.parse(environ)
    up.check(new, eng, environ, quiet=True)
    say(f"{who}: stopping every task at the next step boundary (each saves the same step)")
    eng.stop_tasks(stack(s), STOP_GRACE_S)
    return up.up(new, eng, environ)


# A swarm stack (compose/swarm.mk): deploy and undeploy by the Swarm target, under the stack's lock.


def swarm_place(environ: Mapping[str, str]) -> Place:
    stack_name = environ.get("STACK") or contract.DEFAULT_PROJECT
    if why := preflight.project_problem(stack_name):
        raise ValueError(why.replace("PROJECT=", "STACK=", 1))
    out = Path(environ.get("SWARM_DIR") or Path(".run/swarm") / stack_name)
    nodes = environ.get("NODES") or "3"
    if not nodes.isdigit():
        raise ValueError(f"NODES={settings.shown(nodes)}: a whole number of swarm nodes")
    return Place(stack_name, out, environ.get("SWARM_NAME") or "mwms-swarm", int(nodes))


def stack_deploy(place: Place, eng: Engine) -> int:
    targets.load("swarm").deploy(place, eng)
    return 0


def stack_down(place: Place, eng: Engine) -> int:
    targets.load("swarm").undeploy(place, eng)
    return 0


def prometheus_url(stack_settings: Mapping[str, str]) -> str:
    bind = stack_settings.get("BIND_ADDR") or "127.0.0.1"
    return f"http://{'127.0.0.1' if bind == '0.0.0.0' else bind}:{contract.PROMETHEUS_PORT}"


# The command line make calls.

COMMANDS = {
    "up",
    "images",
    "check",
    "down",
    "clean",
    "resize",
    "apply-tuned",
    "output",
    "logs",
    "config",
    "wait",
    "compose",
    "stack-deploy",
    "stack-down",
}
CHANGES = {"up", "images", "down", "clean", "resize", "apply-tuned"}
"""The commands that hold the project's lock (`make images` waits for it; the others refuse)."""


SWARM = {"stack-deploy": stack_deploy, "stack-down": stack_down}


def run_swarm(command: str, environ: Mapping[str, str], eng: Engine) -> int:
    place = swarm_place(environ)
    with ProjectLock(place.out, f"make {command.replace('deploy', 'up')} STACK={place.project}", place.project,
                     say=lambda line: say(f"{command}: {line}"), label="STACK"):  # fmt: skip
        return SWARM[command](place, eng)


def run(command: str, environ: Mapping[str, str], eng: Engine, args: list[str] = ()) -> int:
    if command in SWARM:
        return run_swarm(command, environ, eng)
    s = Settings.parse(environ)
    commands: dict[str, Callable[[], int]] = {
        "up": lambda: up.up(s, eng, environ),
        "images": lambda: up.up(s, eng, environ, build_only=True),
        "check": lambda: up.check(s, eng, environ) or 0,
        "down": lambda: down(s, eng),
        "clean": lambda: clean(s, eng),
        "resize": lambda: resize(s, eng, environ),
        "apply-tuned": lambda: apply_tuned(s, eng, environ),
        "output": lambda: output(s, eng),
        "logs": lambda: logs(s, eng, environ.get("SERVICE", "")),
        "config": lambda: config(s, eng),
        "wait": lambda: wait.main([s.project]),
        "compose": lambda: passthrough(s, eng, list(args)),
    }
    if command not in CHANGES:
        return commands[command]()
    typed = f"make {command}{s.shown}"
    with ProjectLock(
        s.run_dir, typed, s.project, wait=command == "images", say=lambda line: say(f"{command}: {line}")
    ):
        return commands[command]()


def main(argv: list[str] | None = None, environ: Mapping[str, str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    environ = os.environ if environ is None else environ
    command = argv[0] if argv else ""
    prefix = "up" if command in ("up", "images", "check") else command
    if command not in COMMANDS:
        say(f"python -m compose.lifecycle: unknown command {command!r}: one of {', '.join(sorted(COMMANDS))}")
        return 2
    try:
        return run(command, environ, Engine(), argv[1:])
    except (Refused, LockHeld, ValueError) as err:
        say(f"{prefix}: {err}")
        return 2
    except EngineError as err:
        say(f"{prefix}: {err}")
        return 1
    except subprocess.CalledProcessError as err:
        return err.returncode or 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
