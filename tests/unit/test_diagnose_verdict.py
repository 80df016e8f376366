"""Table tests of monitoring/verdict.py: the same cases as the promtool tests of verdict.yml
(monitoring/prometheus/tests/verdict_test.yml), so `make diagnose` and the dashboard agree."""

from __future__ import annotations

import re
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from monitoring import verdict as v
from monitoring.verdict import TaskSample

BUILD = ("2.21.0", "0.1.0", "mwms", "AUTO", "mlp")


def task(name: str, *, compute=0.07, allreduce=0.02, inp=0.005, step=0.1, ratio=1.0, **fields) -> TaskSample:
    """A training task with these mean seconds per step; `fields` override TaskSample's own."""
    base = TaskSample(
        task=name,
        up=True,
        state="training",
        last_step_age=2.0,
        step=step,
        compute_share=compute / step,
        allreduce_share=allreduce / step,
        input_share=inp / step,
        compute=compute,
        compute_ratio=ratio,
        busbw=50e6,
        build=BUILD,
        world_size=3,
    )
    return replace(base, **fields)


def cluster(**over: dict) -> list[TaskSample]:
    out = []
    for n in ("chief-0", "worker-0", "worker-1"):
        kw = dict(over.get(n, {}))
        dead = kw.pop("_dead", False)
        t = task(n, **kw)
        out.append(
            replace(
                t,
                step=None,
                compute_share=None,
                allreduce_share=None,
                input_share=None,
                compute=None,
                compute_ratio=None,
                busbw=None,
            )
            if dead
            else t
        )
    return out


COMM = dict(compute=0.035, allreduce=0.06)
WAITING = dict(step=0.2, compute=0.04, allreduce=0.15, ratio=1.0)
DEAD = dict(_dead=True)  # no timed step in the last minute

CASES = {
    # name: (samples, expected cluster verdict, tasks it names, expected per-task verdicts, exit code)
    "healthy": (cluster(), "healthy", (), dict.fromkeys(("chief-0", "worker-0", "worker-1"), "healthy"), 0),
    "communication-bound": (
        cluster(**{"chief-0": COMM, "worker-0": COMM, "worker-1": COMM}),
        "communication-bound",
        (),
        dict.fromkeys(("chief-0", "worker-0", "worker-1"), "communication-bound"),
        1,
    ),
    "some wait": (
        cluster(**{"worker-1": COMM}),
        "healthy",
        (),
        {"chief-0": "healthy", "worker-0": "healthy", "worker-1": "communication-bound"},
        0,
    ),
    "straggler": (
        cluster(
            **{
                "chief-0": WAITING,
                "worker-1": WAITING,
                "worker-0": dict(step=0.2, compute=0.16, allreduce=0.02, inp=0.01, ratio=4.0),
            }
        ),
        "straggler",
        ("worker-0",),
        {"chief-0": "communication-bound", "worker-0": "straggler", "worker-1": "communication-bound"},
        1,
    ),
    "input-bound": (
        cluster(
            **{
                "chief-0": dict(compute=0.04, allreduce=0.05),
                "worker-0": dict(compute=0.04, allreduce=0.05),
                "worker-1": dict(compute=0.03, allreduce=0.01, inp=0.04),
            }
        ),
        "input-bound",
        ("worker-1",),
        {"chief-0": "healthy", "worker-0": "healthy", "worker-1": "input-bound"},
        1,
    ),
    "down and stalled": (
        cluster(
            **{
                "chief-0": dict(last_step_age=155.0),
                "worker-0": dict(last_step_age=155.0),
                "worker-1": dict(up=False, last_step_age=155.0, **DEAD),
            }
        ),
        "down",
        ("worker-1",),
        {"chief-0": "stalled", "worker-0": "stalled", "worker-1": "down"},
        1,
    ),
    "finished task": (
        cluster(**{"worker-1": dict(up=False, state="done", last_step_age=155.0, **DEAD)}),
        "healthy",
        (),
        {"chief-0": "healthy", "worker-0": "healthy"},
        0,
    ),
    "mismatch": (
        cluster(**{"worker-1": dict(build=("2.21.0", "0.2.0", "mwms", "AUTO", "mlp"))}),
        "mismatch",
        ("worker-1",),
        {"chief-0": "healthy", "worker-0": "healthy", "worker-1": "mismatch"},
        1,
    ),
    "world size": (
        cluster(**{"worker-0": dict(world_size=2)}),
        "mismatch",
        ("worker-0",),
        {"chief-0": "healthy", "worker-0": "mismatch", "worker-1": "healthy"},
        1,
    ),
    "all done": (
        cluster(**{n: dict(up=False, state="done", **DEAD) for n in ("chief-0", "worker-0", "worker-1")}),
        "finished",
        (),
        {},
        0,
    ),
    "nothing scraped": ([], "no-data", (), {}, 2),
    "waiting for peers": (
        cluster(
            **{
                n: dict(state="waiting_for_peers", last_step_age=None, **DEAD)
                for n in ("chief-0", "worker-0", "worker-1")
            }
        ),
        "no-data",
        (),
        {},
        2,
    ),
    "checkpointing is not a stall": (
        cluster(**{"chief-0": dict(state="checkpointing", last_step_age=300.0)}),
        "healthy",
        (),
        dict.fromkeys(("chief-0", "worker-0", "worker-1"), "healthy"),
        0,
    ),
}


@pytest.mark.parametrize("name", CASES)
def test_verdict(name):
    samples, want, named, per_task, exit_code = CASES[name]
    d = v.diagnose(samples)
    assert d.cluster.verdict == want
    assert d.cluster.tasks == named
    assert {k: f.verdict for k, f in d.tasks.items()} == per_task
    assert d.exit_code == exit_code
    assert d.cluster.advice, "every verdict comes with advice"


def test_a_tie_between_two_builds_is_a_mismatch_naming_nobody():
    other = ("2.20.0",) + BUILD[1:]
    samples = [
        task("chief-0"),
        task("worker-0"),
        task("worker-1", build=other),
        task("worker-2", build=other),
    ]
    d = v.diagnose(samples)
    assert (d.cluster.verdict, d.cluster.tasks, d.exit_code) == ("mismatch", (), 1)
    assert len(d.cluster.evidence) == 4


def test_straggler_evidence_says_by_how_much_and_who_waits():
    samples, *_ = CASES["straggler"]
    evidence = v.diagnose(samples).cluster.evidence
    assert evidence[0].startswith("worker-0 computes 4.0x the median task (160.0 ms vs 40.0 ms")
    assert "the others wait in all-reduce: chief-0 75%, worker-1 75%" in evidence


def test_communication_evidence_compares_with_bench_comm():
    samples, *_ = CASES["communication-bound"]
    d = v.diagnose(samples, link_busbw=200e6)
    assert any("25% of the 200 MB/s `make bench-comm` measured" in e for e in d.cluster.evidence)
    assert any("run `make bench-comm`" in e for e in v.diagnose(samples).cluster.evidence)


def test_priorities_are_the_codes():
    assert [v.NAMES[c] for c in range(7)] == [
        "healthy",
        "communication-bound",
        "input-bound",
        "straggler",
        "mismatch",
        "stalled",
        "down",
    ]


RULES = Path(__file__).resolve().parents[2] / "monitoring" / "prometheus" / "rules" / "verdict.yml"


def test_rules_use_the_same_thresholds_and_codes():
    rules = {r["record"]: r["expr"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"]}
    code = rules["task:trainer_verdict:code"]
    assert f"age_seconds > {v.STALL_SECONDS:g}" in code
    assert f"ratio_to_median1m > {v.STRAGGLER_RATIO}) + {v.STRAGGLER}" in code
    assert f"input_wait_seconds:share1m > {v.INPUT_SHARE}) + {v.INPUT}" in code
    assert f"allreduce_duration_seconds:share1m > {v.ALLREDUCE_SHARE}) + {v.COMMUNICATION}" in code
    assert (
        f"allreduce_duration_seconds:share1m) > {v.ALLREDUCE_SHARE}) + {v.COMMUNICATION}"
        in rules["cluster:trainer_verdict:code"]
    )
    for level in ("task", "cluster"):
        named = dict(
            re.findall(r'code == (\d), "verdict", "([a-z-]+)"', rules[f"{level}:trainer_verdict:named"])
        )
        assert {int(k): name for k, name in named.items()} == {c: v.NAMES[c] for c in range(7)}
