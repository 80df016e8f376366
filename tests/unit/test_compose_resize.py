"""`make resize WORKERS=N`'s refusals (compose/resize.py), one line each, before any task is stopped."""

import pytest

from compose import resize

RUNNING = {"chief": "Up 2 minutes", "worker-0": "Up 2 minutes", "worker-1": "Up 2 minutes"}


@pytest.mark.parametrize("workers", ["-1", "two", "1.5", ""])
def test_a_count_that_is_not_a_whole_number_is_refused(workers):
    why = resize.refusal(workers, "p", RUNNING)
    assert why.startswith(f"WORKERS={workers!r}: a whole number") and "\n" not in why


def test_the_same_size_is_refused():
    assert resize.refusal("2", "p", RUNNING) == "PROJECT=p already trains with WORKERS=2: nothing to resize"


@pytest.mark.parametrize(
    "chief, said",
    [
        ("Exited (0) 3 seconds ago", "has finished (its chief exited 0)"),
        ("Exited (2) 3 seconds ago", "is not running: make up WORKERS=N continues it"),
        (None, "is not running"),
    ],
)
def test_a_job_not_running_is_refused_with_the_way_on(chief, said):
    tasks = {**RUNNING, "chief": chief} if chief else {}
    assert said in resize.refusal("3", "p", tasks)


def test_a_running_job_at_another_size_goes_on():
    assert resize.refusal("3", "p", RUNNING) is None and resize.refusal("0", "p", RUNNING) is None


def test_states_keeps_the_tasks_only():
    out = "chief\tUp 1 minute\nworker-0\tUp 1 minute\nprometheus\tUp 1 minute\n"
    assert resize.states("p", run=lambda cmd: out) == {"chief": "Up 1 minute", "worker-0": "Up 1 minute"}
