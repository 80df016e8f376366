"""The one table of verdict cases. tests/unit/test_diagnose_verdict.py judges each with
monitoring/verdicts/verdict.py; `make rules` turns each into promtool series and expected codes and alerts
(monitoring/config/prometheus/tests/verdict_test.yml), so the Python verdict and the PromQL rules are
checked against the same cases.

A case gives each task's steady figures (mean seconds per step and of each part, state, build);
`sample` makes the TaskSample diagnose reads and monitoring/rules/promtests.py the series Prometheus would
scrape every 5 s, linear so that every 1 minute rate is exact.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from monitoring.verdicts.verdict import TaskSample

BUILD = ("2.21.0", "0.1.0", "mwms", "AUTO", "mlp")
THREE = ("chief", "worker-0", "worker-1")


@dataclass(frozen=True, kw_only=True)
class Task:
    name: str
    step: float = 0.1
    """Mean seconds per step (the parts below plus 'other')."""
    compute: float = 0.07
    allreduce: float = 0.02
    input: float = 0.005
    stepping: bool = True
    """False: no step in the last minute (waiting for peers, hung, down)."""
    split: bool = True
    """False: the steps are timed but not split into compute, all-reduce and input wait (a SCRIPT=
    run with the sampled split off, or before its first window): no compute, all-reduce or input
    series."""
    up: bool = True
    state: str = "training"
    last_step_age: float | None = 2.0
    build: tuple[str, ...] = BUILD
    world_size: int = 3
    loss: float = 1.0
    stuck_step: int | None = None
    """Where its supervisor last ended it as stuck; None: never."""
    stuck_age: float = 60.0
    """Seconds since then (at the end of the series)."""


@dataclass(frozen=True, kw_only=True)
class Case:
    name: str
    tasks: tuple[Task, ...]
    verdict: str
    """The cluster's verdict name."""
    named: tuple[str, ...] = ()
    """The tasks the cluster verdict names."""
    per_task: dict[str, str] = field(default_factory=dict)
    exit_code: int = 0


def sample(t: Task) -> TaskSample:
    """What Prometheus' 1 minute rules give diagnose for this task."""
    split = {
        "compute": t.compute,
        "compute_share": t.compute / t.step,
        "allreduce_share": t.allreduce / t.step,
        "input_share": t.input / t.step,
    }
    timed = {"step": t.step, **(split if t.split else {})} if t.stepping else {}
    return TaskSample(
        task=t.name,
        up=t.up,
        state=t.state,
        last_step_age=t.last_step_age,
        build=t.build,
        world_size=t.world_size,
        **({"stuck_step": t.stuck_step, "stuck_age": t.stuck_age} if t.stuck_step is not None else {}),
        **timed,
    )


def cluster(names: tuple[str, ...] = THREE, **over: dict) -> tuple[Task, ...]:
    """Tasks with default figures; `over` maps a task name to the fields it changes."""
    return tuple(replace(Task(name=n, world_size=len(names)), **over.get(n, {})) for n in names)


COMM = {"compute": 0.035, "allreduce": 0.06}
WAITING = {"step": 0.2, "compute": 0.04, "allreduce": 0.15}
SILENT = {"stepping": False}
UNSPLIT = {"split": False}
DONE = {"up": False, "state": "done", "last_step_age": 155.0, "stepping": False}
TWO = ("chief", "worker-0")


def _all(verdict: str, names: tuple[str, ...] = THREE) -> dict[str, str]:
    return dict.fromkeys(names, verdict)


CASES = (
    Case(name="healthy", tasks=cluster(), verdict="healthy", per_task=_all("healthy")),
    Case(
        name="communication-bound",
        tasks=cluster(**dict.fromkeys(THREE, COMM)),
        verdict="communication-bound",
        per_task=_all("communication-bound"),
        exit_code=1,
    ),
    Case(
        name="some wait",
        tasks=cluster(**{"worker-1": COMM}),
        verdict="healthy",
        per_task=_all("healthy") | {"worker-1": "communication-bound"},
    ),
    Case(
        name="straggler",
        tasks=cluster(
            chief=WAITING,
            **{
                "worker-1": WAITING,
                "worker-0": {"step": 0.2, "compute": 0.16, "allreduce": 0.02, "input": 0.01},
            },
        ),
        verdict="straggler",
        named=("worker-0",),
        exit_code=1,
        per_task=_all("communication-bound") | {"worker-0": "straggler"},
    ),
    # Two tasks: 1.6x the other is a straggler (1.5x the median of two would need 3x).
    Case(
        name="straggler of two",
        tasks=cluster(
            TWO,
            chief={"step": 0.2, "compute": 0.05, "allreduce": 0.14},
            **{"worker-0": {"step": 0.2, "compute": 0.08, "allreduce": 0.11}},
        ),
        verdict="straggler",
        named=("worker-0",),
        exit_code=1,
        per_task={"chief": "communication-bound", "worker-0": "straggler"},
    ),
    Case(
        name="two tasks within 1.5x",
        tasks=cluster(TWO, chief={"compute": 0.05}, **{"worker-0": {"compute": 0.07}}),
        verdict="healthy",
        per_task=_all("healthy", TWO),
    ),
    Case(
        name="input-bound",
        tasks=cluster(
            chief={"compute": 0.04, "allreduce": 0.05},
            **{
                "worker-0": {"compute": 0.04, "allreduce": 0.05},
                "worker-1": {"compute": 0.035, "allreduce": 0.01, "input": 0.04},
            },
        ),
        verdict="input-bound",
        named=("worker-1",),
        exit_code=1,
        per_task=_all("healthy") | {"worker-1": "input-bound"},
    ),
    Case(
        name="down and stalled",
        tasks=cluster(
            chief={"last_step_age": 155.0, "stepping": False},
            **{
                "worker-0": {"last_step_age": 155.0, "stepping": False},
                "worker-1": {"up": False, "last_step_age": 155.0, "stepping": False},
            },
        ),
        verdict="down",
        named=("worker-1",),
        exit_code=1,
        per_task={"chief": "stalled", "worker-0": "stalled", "worker-1": "down"},
    ),
    Case(
        name="finished task",
        tasks=cluster(**{"worker-1": DONE}),
        verdict="healthy",
        per_task=_all("healthy", TWO),
    ),
    Case(
        name="mismatch",
        tasks=cluster(**{"worker-1": {"build": ("2.21.0", "0.2.0", "mwms", "AUTO", "mlp")}}),
        verdict="mismatch",
        named=("worker-1",),
        exit_code=1,
        per_task=_all("healthy") | {"worker-1": "mismatch"},
    ),
    Case(
        name="world size",
        tasks=cluster(**{"worker-0": {"world_size": 2}}),
        verdict="mismatch",
        named=("worker-0",),
        exit_code=1,
        per_task=_all("healthy") | {"worker-0": "mismatch"},
    ),
    Case(name="all done", tasks=cluster(**dict.fromkeys(THREE, DONE)), verdict="finished"),
    Case(
        name="waiting for peers",
        tasks=cluster(
            **{key: dict(state="waiting_for_peers", last_step_age=None, **SILENT) for key in THREE}
        ),
        verdict="no-data",
        exit_code=2,
    ),
    Case(
        name="loss not finite",
        tasks=cluster(**{"worker-0": {"loss": float("inf")}}),
        verdict="healthy",
        per_task=_all("healthy"),
    ),
    # A user's script with the split off: its steps say how long, not why. "Healthy, compute
    # dominates" (what this said before) was a claim nothing measured.
    Case(
        name="timed steps without their split",
        tasks=cluster(**dict.fromkeys(THREE, UNSPLIT)),
        verdict="no-data",
        exit_code=2,
    ),
    Case(
        name="a stall is judged without the split",
        tasks=cluster(
            chief=UNSPLIT,
            **{
                "worker-0": UNSPLIT,
                "worker-1": {"split": False, "stepping": False, "last_step_age": 155.0},
            },
        ),
        verdict="stalled",
        named=("worker-1",),
        exit_code=1,
        per_task={"worker-1": "stalled"},
    ),
    # Its supervisor ended worker-1 as stuck a minute ago; the job trains again after the restart.
    Case(
        name="stuck and restarted",
        tasks=cluster(**{"worker-1": {"stuck_step": 150}}),
        verdict="stuck",
        named=("worker-1",),
        exit_code=1,
        per_task=_all("healthy") | {"worker-1": "stuck"},
    ),
    Case(
        name="stuck long ago",
        tasks=cluster(**{"worker-1": {"stuck_step": 150, "stuck_age": 900.0}}),
        verdict="healthy",
        per_task=_all("healthy"),
    ),
    Case(
        name="checkpointing is not a stall",
        tasks=cluster(chief={"state": "checkpointing", "last_step_age": 300.0, "stepping": False}),
        verdict="healthy",
        per_task=_all("healthy", THREE[1:]),
    ),
)
