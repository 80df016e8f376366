"""bench/turns.py runs `make bench`'s modes in turns inside one process: one mode at a time, in the
schedule's order, each turn timed, a mode's loop state kept across turns, failures raised, and every
thread ended by close()."""

import time

import numpy as np
import pytest

from bench import overhead, turns
from trainer.core.timing import StepFns


def _recording(log: list, name: str, running: list):
    def mode(turn):
        while True:
            running.append(name)
            log.append((name, len(set(running))))  # modes running at this moment
            running.remove(name)
            turn()

    return mode


def test_modes_run_one_at_a_time_in_the_order_given_and_stop_at_close():
    log, running = [], []
    with turns.Turns({n: _recording(log, n, running) for n in "abc"}) as t:
        for name in "abccba":
            t.turn(name)
        threads = list(t._threads)
    assert [n for n, _ in log] == list("abccba")
    assert all(concurrent == 1 for _, concurrent in log)
    assert not any(th.is_alive() for th in threads)


def test_a_turn_is_timed_from_handing_it_over_to_getting_it_back():
    def sleeper(turn):
        while True:
            time.sleep(0.05)
            turn()

    with turns.Turns({"sleeper": sleeper, "idle": overhead._calls(lambda: None)}) as t:
        slept = [t.turn("sleeper") for _ in range(3)]
        t.turn("idle")
    assert min(slept) >= 0.05


def test_a_mode_that_fails_is_raised_by_its_turn_and_the_others_still_end():
    def broken(turn):
        turn()
        raise ValueError("the step function failed")

    t = turns.Turns({"broken": broken, "fine": overhead._calls(lambda: None)})
    t.turn("broken")
    t.turn("fine")
    with pytest.raises(ValueError, match="step function failed"):
        t.turn("broken")
    t.close()
    assert not any(th.is_alive() for th in t._threads)


def test_a_mode_that_returns_is_an_error_not_a_wait_for_ever():
    with (
        turns.Turns({"short": lambda turn: None}) as t,
        pytest.raises(RuntimeError, match="until it is stopped"),
    ):
        t.turn("short")


class _T:
    def __init__(self, value):
        self.value = np.asarray(value)

    def numpy(self):
        return self.value


def _fns(calls: list):
    def run(iterator, n, timed=True):
        calls.append("timed" if timed else "plain")
        s = time.time()
        rows = [[s, s, s, s, s]] * n if timed else np.zeros((n, 0))
        return _T(rows), _T([0.5, 0.75]), _T([])

    return StepFns(timed=run, plain=lambda it, n: run(it, n, False), allreduce_bytes=4)


class _Metrics:
    def record_step(self, **kw): ...


def test_the_trainers_loop_keeps_its_count_across_turns_one_call_in_four_timed():
    """One Controller for the whole run: a loop restarted every turn would time every call (its
    first call is always timed)."""
    calls, timings = [], []
    mode = overhead._instrumented(_fns(calls), iter(()), 5, (_Metrics(), timings, 4))
    with turns.Turns({"sampled": mode}) as t:
        for _ in range(8):
            t.turn("sampled")
    assert calls[:8] == ["timed", "plain", "plain", "plain"] * 2
    assert len(timings) == 5  # the second timed call's steps; the first traced, so it is not a step time


def test_the_schedule_draws_the_order_each_cycle_the_same_in_every_task_and_leaves_out_round_0():
    def run():
        log, running = [], []
        timings = {"kept": [1, 2]}
        with turns.Turns({n: _recording(log, n, running) for n in "abcd"}) as t:
            seconds = overhead._schedule(t, list("abcd"), (1, 20), 2, timings)
        return [n for n, _ in log], seconds, timings

    order, seconds, timings = run()
    cycles = [tuple(order[i : i + 4]) for i in range(0, len(order), 4)]
    assert len(cycles) == 1 + 2 * 20 and all(sorted(c) == list("abcd") for c in cycles)
    assert len(set(cycles)) > 1  # not one fixed order
    before = {n: {p for p, x in zip(order, order[1:]) if x == n} for n in "abcd"}
    assert all(len(preceding) >= 3 for preceding in before.values())  # every mode after several others
    assert run()[0] == order  # another task draws the same orders
    assert {name: len(s) for name, s in seconds.items()} == dict.fromkeys("abcd", 2)
    assert timings["kept"] == []
