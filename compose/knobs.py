"""The trainer's knobs on a `make up`: every trainer flag, set by its upper-case name, for every task.

    make up STEPS=500 INPUT_DELAY_MS=20 LEARNING_RATE=0.05

The one path a knob takes: make exports its command-line variables (and the shell's) to the recipe
(compose/up.sh, compose/swarm/stack-up.sh, `make k8s`); the emitter (python -m compose.emit, every
target) reads them here from its environment into the Deployment's `knobs` (compose/deployment.py);
every task gets `TRAINER_<NAME>`, which trainer/config.py reads. The names are trainer.config.Config's
fields, so a new trainer flag is a new knob with no edit here, in the Makefile or in the scripts. Values
are checked by trainer.config before any container starts.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping

from trainer.config import ENV_PREFIX, Config, from_args
from trainer.errors import ConfigError

STACK_OWNED = {
    "metrics_port": "the stack scrapes every task on the contract's metrics port",
    "metrics_linger": "the stack keeps a finished task's metrics up for Prometheus' last scrape",
    "checkpoint_dir": "the chief writes the stack's checkpoint volume",
    "logdir": "every task writes the stack's TensorBoard volume",
    "profiler_port": "make profile traces every task on the contract's profiler port",
    "data": "DATA= is a host folder the stack mounts read-only at /data",
}
"""Fields the generator sets itself, and why a user cannot."""

UP_DEFAULTS = {"steps": "30000"}
"""What `make up` trains when not told: long enough to watch in Prometheus and Grafana (the trainer's
own default, 100 steps, is over in about 1.5 s, before Prometheus' second scrape)."""

MEASURED_STEPS_PER_SECOND = 125.0
"""Default job (mlp), chief + 3 workers on the 2-core CPU machine of the README's figures."""


def names() -> list[str]:
    """Every knob a user may set, as make and the environment spell it (STEPS, INPUT_DELAY_MS, ...)."""
    return [f.name.upper() for f in dataclasses.fields(Config) if f.name not in STACK_OWNED]


def from_environ(environ: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """(Config field, value) for every knob set (non-empty) in `environ`, else make up's defaults,
    checked as the trainer will check them. Raises ValueError with a one-line message."""
    for name, why in STACK_OWNED.items():
        if name != "data" and environ.get(name.upper()):
            raise ValueError(f"{name.upper()} is set by the stack ({why}): unset it")
    values = {
        f.name: environ.get(f.name.upper(), "")
        for f in dataclasses.fields(Config)
        if f.name not in STACK_OWNED
    }
    values = {name: value or UP_DEFAULTS.get(name, "") for name, value in values.items()}
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
    """One line for `make up`: how long the job trains and how to change it."""
    steps = int(dict(knobs).get("steps", Config.steps))
    seconds = steps / MEASURED_STEPS_PER_SECOND
    took = f"{seconds / 60:.0f} min" if seconds >= 120 else f"{seconds:.0f} s"
    return (
        f"training {steps} steps, ~{took} at {MEASURED_STEPS_PER_SECOND:.0f} steps/s (measured: WORKERS=3, "
        f"2 CPU cores); STEPS=N to change, `make down` to stop"
    )
