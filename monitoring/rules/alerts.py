"""The alerts: conditions from monitoring/rules/recording.py, thresholds and advice from monitoring/verdicts/verdict.py.

Each annotation is a function of the task's name and the alert's value, called with Go template
text for the rule file and with real values for the generated promtool tests (`render`), so the
tests check the exact prose users get.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import contract as c
from monitoring.rules import recording as r
from monitoring.verdicts import verdict as v

TASK = (
    f'{{{{ if eq $labels.task_type "{c.CHIEF}" }}}}{c.CHIEF}{{{{ else }}}}'
    "{{ $labels.task_type }}-{{ $labels.task_index }}{{ end }}"
)
"""contract.task_name in Go template: `chief`, `worker-0`, ..."""

Text = Callable[[str, str], str]
"""(task, value) -> annotation."""


@dataclass(frozen=True, kw_only=True)
class Alert:
    name: str
    expr: str
    wait: str
    """Prometheus' `for`: how long the condition must hold."""
    severity: str
    value: tuple[str, Callable[[float], str]]
    """How $value is shown: the Go template and the same in Python."""
    summary: Text
    description: Text

    def rule(self) -> dict:
        task, value = TASK, self.value[0]
        return {
            "alert": self.name,
            "expr": self.expr,
            "for": self.wait,
            "labels": {"severity": self.severity},
            "annotations": {
                "summary": self.summary(task, value),
                "description": self.description(task, value),
            },
        }

    def render(self, task: str, value: float) -> dict[str, str]:
        """The annotations Prometheus writes for this task and value."""
        shown = self.value[1](value)
        return {"summary": self.summary(task, shown), "description": self.description(task, shown)}


PERCENT = ("{{ $value | humanizePercentage }}", lambda x: f"{x * 100:.4g}%")
RATIO = ('{{ $value | printf "%.1f" }}', lambda x: f"{x:.1f}")
SECONDS = ('{{ $value | printf "%.0f" }}', lambda x: f"{x:.0f}")
RAW = (
    "{{ $value }}",
    lambda x: "NaN" if math.isnan(x) else {math.inf: "+Inf", -math.inf: "-Inf"}.get(x, f"{x:g}"),
)


def _advice(code: int) -> str:
    return " ".join(v.ADVICE[code])


STALL_AGE = f"time() - max by ({r.BY_TASK}) ({c.LAST_STEP_TIME.name} > 0)"
"""Computed here rather than read from the age rule: that rule lives in another group, evaluated
concurrently, so its value could lag by one interval."""

ALERTS = (
    Alert(
        name="TrainerDown",
        expr=r.down_condition(),
        wait="1m",
        severity="critical",
        value=RAW,
        summary=lambda t, x: f"Trainer task {t} is down",
        description=lambda t, x: (
            f"Prometheus has not been able to scrape {t} for 1 minute and the task had not finished. "
            "In synchronous training every other task now blocks in all-reduce. " + _advice(v.DOWN)
        ),
    ),
    Alert(
        name="TrainingStalled",
        expr=r.stall_condition(STALL_AGE),
        wait="15s",
        severity="critical",
        value=SECONDS,
        summary=lambda t, x: f"Trainer task {t} has made no step for {x} s",
        description=lambda t, x: (
            f"{t} is scraped but has not finished a step for {x} s (more than {v.STALL_SECONDS:g} s) "
            "and is not done. " + _advice(v.STALLED)
        ),
    ),
    Alert(
        name="TaskStuck",
        # An event, not a state: the run after the restart reports it, so it fires at once.
        expr=f"{c.STUCK_STEP.name} and on ({r.BY_TASK}) ({r.stuck_condition()})",
        wait="0s",
        severity="critical",
        value=SECONDS,
        summary=lambda t, x: f"Trainer task {t} was stuck at step {x} and was restarted",
        description=lambda t, x: (
            f"The step of {t}'s job stood still at {x} for longer than SUPERVISE_STALL while {t} was "
            "behind its peers, alive but not in the collective; its supervisor ended it. " + _advice(v.STUCK)
        ),
    ),
    Alert(
        name="Straggler",
        expr=f"{r.COMPUTE_RATIO} > {v.STRAGGLER_RATIO:g}",
        wait="2m",
        severity="warning",
        value=RATIO,
        summary=lambda t, x: f"Trainer task {t} is a straggler ({x}x the others' compute time)",
        description=lambda t, x: (
            f"{t} computes {x} times as long per step as the others (threshold {v.STRAGGLER_RATIO:g}x); "
            "they wait for it inside all-reduce. " + _advice(v.STRAGGLER)
        ),
    ),
    Alert(
        name="InputBound",
        expr=f"{r.SHARE[c.INPUT_WAIT]} > {v.INPUT_SHARE:g}",
        wait="2m",
        severity="warning",
        value=PERCENT,
        summary=lambda t, x: f"Trainer task {t} spends {x} of each step waiting for input",
        description=lambda t, x: (
            f"{t} waits for its input pipeline for {x} of step time (threshold {v.INPUT_SHARE:.0%}); "
            "the accelerator idles meanwhile. " + _advice(v.INPUT)
        ),
    ),
    Alert(
        name="CommunicationBound",
        expr=f"{r.SHARE[c.ALLREDUCE]} > {v.ALLREDUCE_SHARE:g}",
        wait="2m",
        severity="warning",
        value=PERCENT,
        summary=lambda t, x: f"Trainer task {t} spends {x} of each step in all-reduce",
        description=lambda t, x: (
            f"{t} spends {x} of step time in the gradient all-reduce (threshold {v.ALLREDUCE_SHARE:.0%}). "
            "If only some tasks do, another is a straggler (see Straggler); if all do: "
            + _advice(v.COMMUNICATION)
            + " (A SCRIPT= run: `make diagnose` says what to change in your script instead.)"
        ),
    ),
    Alert(
        name="LossNotFinite",
        expr=f"({c.LOSS.name} != {c.LOSS.name}) or (abs({c.LOSS.name}) == Inf)",
        wait="10s",
        severity="critical",
        value=RAW,
        summary=lambda t, x: f"Trainer task {t} reports a loss of {x}",
        description=lambda t, x: (
            f"The loss on {t} is {x}: training has diverged and further steps are wasted. Stop the run, "
            "lower the learning rate (or its warm-up for a larger global batch), check the input data "
            "for NaN/Inf, and resume from a checkpoint taken before the divergence."
        ),
    ),
)
BY_NAME = {a.name: a for a in ALERTS}
GROUPS = {
    "trainer_availability": ("TrainerDown", "TrainingStalled", "TaskStuck"),
    "trainer_performance": ("Straggler", "InputBound", "CommunicationBound"),
    "trainer_correctness": ("LossNotFinite",),
}


def rule_file() -> dict:
    return {
        "groups": [{"name": g, "rules": [BY_NAME[n].rule() for n in names]} for g, names in GROUPS.items()]
    }
