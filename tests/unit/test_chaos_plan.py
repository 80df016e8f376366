"""`make chaos FAULTS=N` draws N faults: FAULTS=4 ran 12 (one of every kind) before (issue 29)."""

from tests.e2e import test_chaos as chaos

DRAWN = chaos.KINDS + chaos.ENGINE_KINDS


def test_the_plan_holds_as_many_faults_as_asked() -> None:
    for count in (1, 3, 4, len(DRAWN) - 1, len(DRAWN), len(DRAWN) + 5):
        faults = chaos.plan(601207, count, DRAWN)
        assert len(faults) == count, [f.kind for f in faults]
    assert len({f.kind for f in chaos.plan(601207, 4, DRAWN)}) == 4  # distinct kinds below all of them
    assert {f.kind for f in chaos.plan(601207, len(DRAWN), DRAWN)} == set(DRAWN)


def test_issue_29s_run_is_replayed_by_its_seed_and_twelve_faults() -> None:
    """Fault 10 cut the chief's save, fault 11 killed every task 26 steps later (before the next save):
    tests/cluster/test_resume_after_a_cut_save.py replays that pair as processes."""
    kinds = [f.kind for f in chaos.plan(601207, 12, DRAWN)]
    assert kinds[9:11] == ["sigkill-chief-saving", "kill-every-task"], kinds


def test_the_restart_budget_covers_the_longest_chain_of_faults_before_a_new_save() -> None:
    """The budget renews only with a new checkpoint: faults that strike before the job saved again
    add up (make test's nine kinds in one job spent a budget of 3 at its seventh fault)."""
    save, per = chaos.SAVE_EVERY, chaos.RESTARTS_PER_FAULT
    spaced = [chaos.Fault("sigkill-worker", "worker-0", 2 * save) for _ in range(5)]
    assert chaos.max_restarts(spaced) == per + 1
    close = [chaos.Fault("sigkill-worker", "worker-0", save // 2) for _ in range(3)]
    prometheus = chaos.Fault("restart-prometheus", "prometheus", 1)  # no task restarts: no link
    assert chaos.max_restarts([*spaced[:2], close[0], prometheus, *close[1:], spaced[2]]) == 4 * per + 1
