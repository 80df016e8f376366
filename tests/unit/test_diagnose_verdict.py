"""Table tests of monitoring/verdicts/verdict.py over monitoring/verdicts/cases.py, the cases `make rules` also
turns into the promtool tests of the generated verdict rules: `make diagnose` and the dashboard agree."""

from __future__ import annotations

from dataclasses import replace

import pytest

import contract
from monitoring.verdicts import cases as vc
from monitoring.verdicts import verdict as v
from monitoring.verdicts.verdict import TaskSample

BUILD = vc.BUILD
CASES = {case.name: case for case in vc.CASES}


def task(name: str, **fields) -> TaskSample:
    return replace(vc.sample(vc.Task(name=name)), **fields)


def samples(name: str) -> list[TaskSample]:
    return [vc.sample(t) for t in CASES[name].tasks]


@pytest.mark.parametrize("name", CASES)
def test_verdict(name):
    case = CASES[name]
    d = v.diagnose(samples(name))
    assert d.cluster.verdict == case.verdict
    assert d.cluster.tasks == case.named
    assert {k: f.verdict for k, f in d.tasks.items()} == case.per_task
    assert d.exit_code == case.exit_code
    assert d.cluster.advice, "every verdict comes with advice"


@pytest.mark.parametrize(
    ("computes", "reference"),
    [
        ([0.05, 0.08], 0.05),  # two tasks: the other one
        ([0.04, 0.16, 0.04], 0.04),
        ([0.035, 0.07, 0.07], 0.0525),  # ties for slowest: one is set aside
        ([0.1], 0.1),
        ([], None),
    ],
)
def test_compute_reference_is_the_median_of_all_but_the_slowest(computes, reference):
    assert v.compute_reference(computes) == pytest.approx(reference)


def test_a_tie_between_two_builds_is_a_mismatch_naming_nobody():
    other = ("2.20.0",) + BUILD[1:]
    samples = [
        task("chief"),
        task("worker-0"),
        task("worker-1", build=other),
        task("worker-2", build=other),
    ]
    d = v.diagnose(samples)
    assert (d.cluster.verdict, d.cluster.tasks, d.exit_code) == ("mismatch", (), 1)
    assert len(d.cluster.evidence) == 4


def test_straggler_evidence_says_by_how_much_and_who_waits():
    evidence = v.diagnose(samples("straggler")).cluster.evidence
    assert evidence[0].startswith("worker-0 computes 4.0x the others (160.0 ms vs 40.0 ms")
    assert "the others wait in all-reduce: chief 75%, worker-1 75%" in evidence


def test_communication_evidence_compares_with_bench_comm():
    comm = [replace(s, busbw=50e6) for s in samples("communication-bound")]
    d = v.diagnose(comm, link_busbw=200e6)
    assert any("25% of the 200 MB/s `make bench-comm` measured" in e for e in d.cluster.evidence)
    assert any("run `make bench-comm`" in e for e in v.diagnose(comm).cluster.evidence)


def test_priorities_are_the_codes():
    assert [v.NAMES[c] for c in range(8)] == [
        "healthy",
        "communication-bound",
        "input-bound",
        "straggler",
        "mismatch",
        "stalled",
        "stuck",
        "down",
    ]


def test_a_users_script_gets_advice_for_its_own_code_not_our_flags():
    script = (*BUILD[:2], contract.SCRIPT_STRATEGY, contract.SCRIPT_STRATEGY, "train.py")
    comm = samples("communication-bound")
    ours = " ".join(v.diagnose(comm).cluster.advice)
    theirs = " ".join(v.diagnose([replace(s, build=script) for s in comm]).cluster.advice)
    assert "--bytes-per-pack" in ours and "communication_options=" not in ours
    assert "communication_options=" in theirs and " --" not in theirs
    assert "skip_gradients_aggregation=True" in theirs


def test_a_healthy_cluster_says_its_largest_part_of_the_step_is_not_compute_when_it_is_not():
    # The quiet `make up` of 2026-12-02: all-reduce 48-51 % of every step, compute 42-44 %, not every
    # task over 50 %, so healthy; its advice once read "Compute dominates".
    split = {"chief": (0.42, 0.49), "worker-0": (0.44, 0.48), "worker-1": (0.42, 0.51)}
    cluster = [
        task(name, compute_share=c, allreduce_share=a, input_share=0.05, step=0.025, compute=0.0105)
        for name, (c, a) in split.items()
    ]
    d = v.diagnose(cluster)
    assert (d.cluster.verdict, d.tasks["worker-1"].verdict) == ("healthy", "communication-bound")
    assert (
        d.cluster.evidence[0]
        == "no threshold crossed; the largest part of the step is all-reduce (48%-51% on the tasks)"
    )
    assert "dominates" not in " ".join(d.cluster.advice)
