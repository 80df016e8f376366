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
