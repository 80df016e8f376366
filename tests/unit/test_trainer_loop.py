"""The host loop, with fake step functions: call sizes, timing arithmetic, metrics, logs, saves."""

import logging

import numpy as np
import pytest

from trainer.core.timing import CallOutput, Interval, StepFns
from trainer.train import loop, progress
from trainer.train.loop import Controller, LoopSettings


def _settings(**kw):
    base = {
        "task_name": "worker-0",
        "steps": 25,
        "steps_per_call": 10,
        "measure_every": 1,
        "save_every": 0,
        "local_examples": 32,
        "classify": True,
        "record_ids": True,
    }
    return LoopSettings(**{**base, **kw})


def _train(fns, settings, *, start_step=0, **controller):
    """A Controller with a recorder for metrics and checkpoints, the progress lines as its first action."""
    clock = controller.pop("clock")
    metrics = controller.pop("metrics", Recorder())
    log_every = controller.pop("log_every", 10)
    lines = progress.ProgressLog(progress.Job(settings.task_name, settings.steps, 96), log_every, clock)
    actions = (lines, *controller.pop("actions", ()))
    c = Controller(
        fns=fns,
        checkpoints=metrics,
        metrics=metrics,
        settings=settings,
        actions=actions,
        clock=clock,
        **controller,
    )
    return c.train(iter(()), start_step)


class T:
    def __init__(self, value):
        self.value = np.asarray(value)

    def numpy(self):
        return self.value


class FakeClock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def _fns(clock, per_step=0.01):
    def run(iterator, n, timed=True):
        start = clock.now
        rows = []
        for i in range(n):
            s = start + i * per_step
            rows.append([s, s + 0.001, s + 0.005, s + 0.008, s + 0.009])
        clock.now = start + n * per_step
        marks = np.array(rows) if timed else np.zeros((n, 0))
        return T(marks), T([0.5, 0.75]), T(np.arange(n * 2))

    return StepFns(timed=run, plain=lambda it, n: run(it, n, False), allreduce_bytes=100)


class Recorder:
    """Metrics and checkpoints both: what the controller recorded and saved, in order."""

    def __init__(self):
        self.calls, self.saves, self.events = [], [], []

    def record_step(self, **kw):
        self.calls.append(kw)

    def state(self, state):
        self.events.append(("state", state))

    def save_blocked(self, seconds):
        self.events.append(("blocked", seconds))

    def save(self, step):
        self.saves.append(step)
        self.events.append(("save", step))


def test_call_size_stops_at_saves_and_end():
    s = _settings(steps=25, steps_per_call=10, save_every=7)
    sizes, step = [], 0
    while step < s.steps:
        n = loop.call_size(step, 10, s)
        sizes.append(n)
        step += n
    assert sizes == [7, 7, 7, 4]


def test_auto_steps_per_call_is_calibrated_and_agreed():
    clock, rec, sizes, agreed = FakeClock(), Recorder(), [], []
    fns = _fns(clock)
    sized = StepFns(
        timed=lambda it, n: (sizes.append(n), fns.timed(it, n))[1], plain=fns.plain, allreduce_bytes=1
    )

    def agree(k):
        agreed.append(k)
        return k + 1  # the cluster's maximum wins

    _train(sized, _settings(steps=200, steps_per_call=0), metrics=rec, clock=clock, agree=agree, log_every=50)
    # trace, calibrate (10 ms steps), calibrate again on a call of that size, then 0.5 s calls
    assert agreed == [50, 50] and sizes[:4] == [1, 1, 51, 51]
    assert loop.auto_steps_per_call(2.0) == 1 and loop.auto_steps_per_call(1e-5) == loop.MAX_STEPS_PER_CALL


def test_auto_steps_per_call_is_sized_again_past_the_prefetched_batches():
    """Slow input: the first steps run on batches prefetched while the function traced (2 ms), the
    steady ones wait 100 ms for theirs. Sized on the first step alone, a call took 250 x 100 ms."""
    clock, sizes, served = FakeClock(), [], [0]
    prefetched = 8

    def run(iterator, n, timed=True):
        rows = []
        for _ in range(n):
            s = clock.now
            clock.now += 0.002 if served[0] < prefetched else 0.1
            served[0] += 1
            rows.append([s, clock.now - 0.0015, clock.now - 0.001, clock.now - 0.0005, clock.now])
        marks = np.array(rows) if timed else np.zeros((n, 0))
        return T(marks), T([0.5, 0.75]), T(np.arange(n * 2))

    fns = StepFns(
        timed=lambda it, n: (sizes.append(n), run(it, n))[1],
        plain=lambda it, n: run(it, n, False),
        allreduce_bytes=1,
    )
    _train(fns, _settings(steps=400, steps_per_call=0), clock=clock, log_every=1000)
    assert sizes[:3] == [1, 1, loop.auto_steps_per_call(0.002)], sizes[:3]
    assert len(set(sizes[3:-1])) == 1 and sizes[3] * 0.1 <= loop.AUTO_CALL_S, sizes  # ~0.5 s calls


def test_timings_cover_the_wall_time():
    marks = np.array([[1.0, 1.001, 1.005, 1.008, 1.009], [1.009, 1.010, 1.014, 1.017, 1.018]])
    t = loop.timings_of(marks, call_start=0.996, call_end=1.020)
    assert abs(sum(x.step for x in t) - (1.020 - 0.996)) < 1e-12
    assert abs(t[0].input - 0.001) < 1e-12 and abs(t[0].compute - 0.005) < 1e-12
    assert abs(t[0].allreduce - 0.003) < 1e-12
    assert abs(t[0].other - 0.004) < 1e-9  # the dispatch before the first step is reported


def test_train_records_every_step_and_logs(caplog):
    caplog.set_level(logging.INFO)
    clock, rec = FakeClock(), Recorder()
    result = _train(_fns(clock), _settings(save_every=10), start_step=3, metrics=rec, clock=clock)
    assert (result.start_step, result.final_step) == (3, 25)
    assert [c["step"] for c in rec.calls] == list(range(4, 26))
    assert all(c["work"].examples == 32 for c in rec.calls)
    assert [c["timing"] is None for c in rec.calls] == [True] * 7 + [False] * 15  # the first call traces
    assert rec.saves == [10, 20]
    assert rec.events[:4] == [
        ("state", "checkpointing"),
        ("save", 10),
        ("blocked", 0.0),  # the checkpoints report the step once it is durable, not the loop
        ("state", "training"),
    ]
    lines = [r.message for r in caplog.records if "| step" in r.message]
    assert [ln.split(" | ")[1] for ln in lines] == ["step 10/25", "step 20/25", "step 25/25"]
    assert result.accuracy == 0.75 and sum(len(i) for i in result.ids) == 44


def test_measure_every_times_one_call_in_k():
    clock, rec = FakeClock(), Recorder()
    _train(_fns(clock), _settings(steps=40, measure_every=2), metrics=rec, clock=clock)
    timed = [c["timing"] is not None for c in rec.calls]
    assert timed == [False] * 20 + [True] * 10 + [False] * 10  # first calls trace, then 1 call in 2


def test_progress_line_fixed_fields():
    interval = Interval(start_time=0.0, steps=10)
    out = CallOutput(step=120, timings=(None,) * 10, loss=0.412, accuracy=None, ids=None, now=1.2)
    line = progress.line(progress.Job("worker-1", 1000, 64), interval, out, now=1.2)
    assert line.startswith("worker-1 | step 120/1000 | 8.3 steps/s | 533 ex/s | loss 0.412 | eta 1m46s")


def test_format_eta():
    assert [progress.format_eta(s) for s in (5, 106, 7260)] == ["5s", "1m46s", "2h01m"]


def test_actions_run_at_every_call_boundary_before_the_save():
    clock, rec = FakeClock(), Recorder()
    _train(
        _fns(clock),
        _settings(save_every=10),
        start_step=3,
        metrics=rec,
        clock=clock,
        actions=(lambda out: rec.events.append(("call", out.step)),),
    )
    events = [e for e in rec.events if e[0] in ("call", "save")]
    assert events == [("call", 10), ("save", 10), ("call", 20), ("save", 20), ("call", 25)]


def test_a_preemption_at_a_call_boundary_stops_the_loop_there():
    class Preempted(Exception):
        pass

    def after_call(out):
        if out.step >= 10:
            raise Preempted(out.step)

    clock, rec = FakeClock(), Recorder()
    try:
        _train(_fns(clock), _settings(), metrics=rec, clock=clock, actions=(after_call,))
    except Preempted as stop:
        assert stop.args == (10,)
    assert [c["step"] for c in rec.calls][-1] == 10  # every step before the save was recorded, none after


def test_save_seconds_turn_into_steps_from_the_agreed_rate():
    """10 ms steps, --save-seconds 0.05: a save every 5 steps, sized on the first timed call (each task's
    figure through `agree`, the cluster's maximum) and again at each save; --save-every 0."""
    clock, rec, asked = FakeClock(), Recorder(), []

    def agree(k):
        asked.append(k)
        return k

    _train(
        _fns(clock),
        _settings(steps=40, steps_per_call=3, save_seconds=0.05),
        metrics=rec,
        clock=clock,
        agree=agree,
    )
    assert asked[0] == 5
    # the first call traces (untimed), the second is timed and sizes the interval: 5 steps after 0
    assert rec.saves[0] == 5 and all(b - a == 5 for a, b in zip(rec.saves, rec.saves[1:]))


@pytest.mark.parametrize(
    ("save_every", "save_seconds", "first_saves"),
    [(8, 0.11, [8, 16, 24, 32]), (30, 0.07, [7, 14, 21, 28])],  # 10 ms steps: 11 and 7 steps by the seconds
)
def test_the_first_of_save_every_and_save_seconds_wins(save_every, save_seconds, first_saves):
    clock, rec = FakeClock(), Recorder()
    settings = _settings(steps=40, steps_per_call=4, save_every=save_every, save_seconds=save_seconds)
    _train(_fns(clock), settings, metrics=rec, clock=clock)
    assert rec.saves[:4] == first_saves


def test_save_schedule():
    s = loop.SaveSchedule(save_every=100, seconds=10.0, anchor=130)
    assert s.next == 200  # the rate not known yet: by steps only
    s.seconds_steps = s.steps_for(0.5)
    assert (s.seconds_steps, s.next) == (20, 150)
    assert loop.SaveSchedule(save_every=0, seconds=0.0, anchor=7).next is None
    assert loop.SaveSchedule(save_every=0, seconds=1.0, anchor=0).steps_for(5.0) == 1
    assert loop.call_size(140, 100, _settings(steps=1000), save_at=150) == 10


def test_the_seconds_interval_is_re_sized_when_it_chose_the_save_else_one_save_in_ten():
    s = loop.SaveSchedule(save_every=100, seconds=10.0, anchor=0, seconds_steps=500)
    due = []
    for k in range(1, 21):  # every save chosen by --save-every: one re-size (an all-gather) in RESIZE_EVERY
        due.append(s.resize_due(100 * k))
        s.anchor = 100 * k
    assert [i + 1 for i, d in enumerate(due) if d] == [loop.RESIZE_EVERY, 2 * loop.RESIZE_EVERY]
    s.seconds_steps = 30
    assert s.resize_due(s.anchor + 30)  # chosen by the seconds
    assert not loop.SaveSchedule(save_every=100, seconds=0.0, anchor=0).resize_due(100)
