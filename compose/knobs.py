"""The trainer's knobs on a `make up`: every trainer flag, set by its upper-case name, for every task.

    make up STEPS=500 INPUT_DELAY_MS=20 LEARNING_RATE=0.05

The one path a knob takes: make exports its command-line variables to the recipe (compose/up.sh,
compose/swarm/stack-up.sh, `make k8s`) and names them in MAKE_COMMAND_LINE (compose/compose.mk); the
emitter (python -m compose.emit, every target) reads them here from its environment into the
Deployment's `knobs` (compose/deployment.py); every task gets `TRAINER_<NAME>`, which trainer/config.py
reads. Only documented settings reach the job: a name given on make's command line, or TRAINER_<NAME>
in the environment. A shell variable that merely shares a flag's name (OUTPUT_DIR, SEED, ...) is
someone else's and changes nothing. The names are trainer.config.Config's
fields, so a new trainer flag is a new knob with no edit here, in the Makefile or in the scripts. Values
are checked by trainer.config before any container starts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from trainer.host import ENV_PREFIX, Config, ConfigError, from_args

STACK_OWNED = {
    "metrics_port": "the stack scrapes every task on the contract's metrics port",
    "metrics_linger": "the stack keeps a finished task's metrics up for Prometheus' last scrape",
    "checkpoint_dir": "the chief writes the stack's checkpoint volume",
    "logdir": "every task writes the stack's TensorBoard volume",
    "profiler_port": "make profile traces every task on the contract's profiler port",
    "data": "DATA= is a host folder the stack mounts read-only at /data",
    "export_dir": "OUTPUT= is the host folder the stack mounts for the final model",
}
"""Fields the generator sets itself, and why a user cannot."""

UP_DEFAULTS = {"steps": "8000"}
"""How long `make up` trains when not told: long enough to watch in Prometheus and Grafana (the
trainer's own default, 100 steps, is over before Prometheus' second scrape)."""
UP_TASK = {"task": "cnn", "learning_rate": "0.003"}
"""What `make up` trains when TASK is not given: a job that teaches. The `cnn` task's problem takes
it a few thousand steps to learn (the loss falls from ln 10 over the first minutes, where `mlp`'s is
flat from the first seconds), and its step has compute to split (all-reduce ~40 % of the step on 2
shared CPU cores, where `mlp`'s is ~85 %). With the rate it was tuned at, 0.003 per replica's batch:
at the trainer's 0.01 (fine for `mlp`) Adam's scaled rate stalled it at ln 10. `TASK=` alone gets
the trainer's defaults for the rest."""


def names() -> list[str]:
    """Every knob a user may set, as make and the environment spell it (STEPS, INPUT_DELAY_MS, ...)."""
    return [f.name.upper() for f in dataclasses.fields(Config) if f.name not in STACK_OWNED]


COMMAND_LINE = "MAKE_COMMAND_LINE"
"""The variable naming what was given on make's command line (compose/compose.mk computes it)."""


def on_command_line(**values: str) -> dict[str, str]:
    """The environment a recipe of `make up NAME=VALUE ...` sees: the values and the list of their names."""
    return {**values, COMMAND_LINE: " ".join(values)}


def given(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings the user gave: make command-line variables, then TRAINER_<NAME> (the trainer's own
    spelling) for the rest. Anything else in the environment is not ours to read."""
    on_line = set(environ.get(COMMAND_LINE, "").split())
    out = {}
    for f in dataclasses.fields(Config):
        name = f.name.upper()
        value = environ.get(name, "") if name in on_line else ""
        out[f.name] = value or environ.get(ENV_PREFIX + name, "")
    return out


def from_environ(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(Config field, value) for every knob the user gave (non-empty, see `given`), else make up's
    defaults, checked as the trainer will check them. Raises ValueError with a one-line message."""
    user = given(environ)
    for name, why in STACK_OWNED.items():
        if name != "data" and user[name]:
            raise ValueError(f"{name.upper()} is set by the stack ({why}): unset it")
    values = {name: value for name, value in user.items() if name not in STACK_OWNED}
    defaults = UP_DEFAULTS | ({} if values["task"] else UP_TASK)
    values = {name: value or defaults.get(name, "") for name, value in values.items()}
    env = {ENV_PREFIX + name.upper(): value for name, value in values.items() if value}
    try:
        from_args([], env)
    except ConfigError as err:
        raise ValueError(f"{_as_typed(str(err), env)}: {err}") from None
    return tuple((name, value) for name, value in values.items() if value)


def _as_typed(message: str, env: Mapping[str, str]) -> str:
    """`STEPS=0`: the trainer's message names --steps and TRAINER_STEPS; a make user typed STEPS=."""
    found = re.search(ENV_PREFIX + r"[A-Z0-9_]+", message)
    return f"{found.group().removeprefix(ENV_PREFIX)}={env.get(found.group(), '')}" if found else "knob"


def describe(knobs: tuple[tuple[str, str], ...]) -> str:
    """One line for `make up`: how long the job trains and how to change it. No duration: a rate measured
    on other settings or another host is no estimate of this job's (the same line once said ~3 min at 40
    steps/s for every TASK, WORKERS and host); `make status` shows this run's own rate and ETA."""
    steps = int(dict(knobs).get("steps", Config.steps))
    return (
        f"training {steps} steps; `make status` shows the rate and ETA this run measures once it trains; "
        "STEPS=N to change, `make down` to stop"
    )
