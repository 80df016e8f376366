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


def result(states: dict[str, str], at: float = float("inf")) -> list[dict]:
    """What Prometheus answers to phases()'s query: each task's current state series, sampled at `at`."""
    labels = {"chief": ("chief", "0"), "worker-0": ("worker", "0"), "worker-1": ("worker", "1")}
    return [
        {
            "metric": {"task_type": labels[t][0], "task_index": labels[t][1], "trainer_state": s},
            "value": [0, str(at)],
        }
        for t, s in states.items()
    ]


@pytest.mark.parametrize("state", ["starting", "waiting_for_peers"])
def test_a_task_that_is_starting_is_refused(state):
    seen = []
    query = lambda expr: seen.append(expr) or result({"chief": "training", "worker-1": state})  # noqa: E731
    why = resize.settle(query, "p", "R1", sleep=lambda s: None)
    assert why.startswith("PROJECT=p's worker-1 is starting or waiting for peers") and "\n" not in why
    assert 'project="p"' in seen[0] and 'run="R1"' in seen[0]


def test_a_task_scraped_starting_before_the_ask_is_judged_on_its_next_scrape():
    """Seconds after training began, the last scrape may still say waiting_for_peers (CI stop 35)."""
    clock = iter(range(100, 10_000))
    answers = iter([result({"chief": "training", "worker-0": "waiting_for_peers"}, at=95)] * 4
                   + [result({"chief": "training", "worker-0": "training"}, at=104)])  # fmt: skip
    slept = []
    why = resize.settle(lambda e: next(answers), "p", "R", sleep=slept.append, clock=lambda: next(clock))
    assert why is None and len(slept) == 4


def test_a_task_that_is_not_scraped_again_is_judged_on_its_last_scrape():
    clock = iter(range(100, 10_000, 7))
    why = resize.settle(
        lambda e: result({"chief": "training", "worker-0": "starting"}, at=95), "p", "R",
        sleep=lambda s: None, clock=lambda: next(clock),
    )  # fmt: skip
    assert why.startswith("PROJECT=p's worker-0 is starting")


def test_a_finished_job_is_refused():
    why = resize.settle(
        lambda e: result({"chief": "done", "worker-0": "done"}), "p", "R", sleep=lambda s: None
    )
    assert "has finished" in why


def test_a_save_in_progress_is_waited_out():
    answers = iter([{"chief": "checkpointing", "worker-0": "checkpointing"}] * 3 + [{"chief": "training"}])
    slept = []
    assert resize.settle(lambda e: result(next(answers)), "p", "R", sleep=slept.append) is None
    assert len(slept) == 3


def test_a_save_that_never_ends_is_refused():
    clock = iter(range(0, 10_000, 100))
    why = resize.settle(
        lambda e: result({"chief": "checkpointing"}), "p", "R", wait_s=250, sleep=lambda s: None,
        clock=lambda: next(clock),
    )  # fmt: skip
    assert why == "PROJECT=p's chief has been saving for over 250 s: make status, then try again"


def test_training_goes_on():
    assert resize.settle(lambda e: result({"chief": "training", "worker-0": "training"}), "p", "R") is None
