"""How a user's script is observed: one frozen config, read once from the environment."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

PERIOD_ENV = "TRAINER_SPLIT_PERIOD_S"
WINDOW_ENV = "TRAINER_SPLIT_WINDOW_S"
CHECK_ENV = "TRAINER_SPLIT_CHECK"
MARKS_ENV = "TRAINER_SPLIT_MARKS"
ENV_NAMES = (PERIOD_ENV, WINDOW_ENV, MARKS_ENV)
"""What a stack passes from `make up` to a SCRIPT= run's tasks (compose/deployment.py)."""
RECOMMENDED_PERIOD_S = 30.0
"""The period to turn sampling on with (XLA-compiled steps): a 1 s window every 30 s."""


@dataclass(frozen=True, kw_only=True)
class ObserveConfig:
    period_s: float = 0.0
    """Seconds between profiler windows (TRAINER_SPLIT_PERIOD_S); 0 (the default): none. The marks
    split every step without them; windows split only steps nothing marks (XLA-compiled), and
    TensorFlow 2.21's profiler stop() crashed MWMS worker processes here about once in 20 to 60
    windows (docs/script.md). RECOMMENDED_PERIOD_S when turned on."""
    window_s: float = 1.0
    """Seconds each window traces (TRAINER_SPLIT_WINDOW_S), lengthened when it holds too few calls."""
    marks: bool = True
    """TRAINER_SPLIT_MARKS=0: no marks in the step's graph (no split but the profiler windows'): what
    `make bench`'s (f) variants use to show what the marks cost apart from the hooks."""
    check: bool = False
    """TRAINER_SPLIT_CHECK=1 (every task) or =<task> (e.g. chief: that task only): trace back to back
    and print the near-full trace's split at exit next to the exported one, over the same calls
    (costs the profiler's overhead all run long: for verification; the profiler's stop crashed MWMS
    workers here about once in 20 to 60 windows, hence one task)."""

    def __post_init__(self) -> None:
        if self.period_s < 0:
            raise ValueError(f"{PERIOD_ENV}={self.period_s}: must be 0 (off) or more seconds")
        if self.window_s <= 0:
            raise ValueError(f"{WINDOW_ENV}={self.window_s}: must be more than 0 seconds")
        if self.period_s and self.window_s > self.period_s:
            raise ValueError(f"{WINDOW_ENV}={self.window_s} is longer than {PERIOD_ENV}={self.period_s}")


def from_env(env: Mapping[str, str]) -> ObserveConfig:
    def number(name: str, default: float) -> float:
        text = env.get(name, "") or str(default)
        try:
            return float(text)
        except ValueError:
            raise ValueError(f"{name}={text!r}: not a number of seconds") from None

    defaults = ObserveConfig()
    return ObserveConfig(
        period_s=number(PERIOD_ENV, defaults.period_s),
        window_s=number(WINDOW_ENV, defaults.window_s),
        marks=env.get(MARKS_ENV, "1") != "0",
        check=env.get(CHECK_ENV, "") in ("1", task_name(env.get("TF_CONFIG", ""))),
    )


def task_name(tf_config: str) -> str:
    """ "chief", "worker-0", ... from TF_CONFIG; "chief" alone without one."""
    import json

    task = json.loads(tf_config).get("task", {}) if tf_config else {}
    kind, index = task.get("type", "chief"), task.get("index", 0)
    return "chief" if kind == "chief" else f"{kind}-{index}"
