"""The host loop, with fake step functions: call sizes, timing arithmetic, metrics, logs, saves."""

import logging

import numpy as np

from trainer import loop, progress
from trainer.loop import LoopSettings, StepFns


def _settings(**kw):
    base = {"task_name": "worker-0", "steps": 25, "steps_per_call": 10, "measure_every": 1, "log_every": 10,
            "save_every": 0, "global_batch": 96, "local_examples": 32, "classify": True, "record_ids": True}
    return LoopSettings(**{**base, **kw})


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
    def __init__(self):
        self.calls = []

    def record_step(self, **kw):
        self.calls.append(kw)


def test_call_size_stops_at_saves_and_end():
    s = _settings(steps=25, steps_per_call=10, log_every=10, save_every=7)
    sizes, step = [], 0
    while step < s.steps:
        n = loop.call_size(step, 10, s)
        sizes.append(n)
        step += n
    assert sizes == [7, 7, 7, 4]


def test_auto_steps_per_call_is_calibrated_and_agreed():
    clock, rec, sizes, agreed = FakeClock(), Recorder(), [], []
    fns = _fns(clock)
    sized = StepFns(timed=lambda it, n: (sizes.append(n), fns.timed(it, n))[1], plain=fns.plain, allreduce_bytes=1)

    def agree(k):
        agreed.append(k)
        return k + 1  # the cluster's maximum wins

    loop.train(sized, iter(()), start_step=0, settings=_settings(steps=200, steps_per_call=0, log_every=50),
               metrics=rec, save=lambda s: None, clock=clock, agree=agree)
    assert agreed == [50] and sizes[:4] == [1, 1, 51, 51]  # trace, calibrate (10 ms steps), then 0.5 s calls
    assert loop.auto_steps_per_call(2.0) == 1 and loop.auto_steps_per_call(1e-5) == loop.MAX_STEPS_PER_CALL


def test_timings_cover_the_wall_time():
    marks = np.array([[1.0, 1.001, 1.005, 1.008, 1.009], [1.009, 1.010, 1.014, 1.017, 1.018]])
    t = loop.timings_of(marks, call_start=0.996, call_end=1.020)
    assert abs(sum(x.step for x in t) - (1.020 - 0.996)) < 1e-12
    assert abs(t[0].input - 0.001) < 1e-12 and abs(t[0].compute - 0.005) < 1e-12
    assert abs(t[0].allreduce - 0.003) < 1e-12
    assert abs(t[0].other - 0.004) < 1e-9  # the dispatch before the first step is reported


def test_train_records_every_step_and_logs(caplog):
    caplog.set_level(logging.INFO)
    clock, rec, saves = FakeClock(), Recorder(), []
    result = loop.train(_fns(clock), iter(()), start_step=3, settings=_settings(save_every=10), metrics=rec,
                        save=saves.append, clock=clock)
    assert (result.start_step, result.final_step) == (3, 25)
    assert [c["step"] for c in rec.calls] == list(range(4, 26))
    assert all(c["examples"] == 32 for c in rec.calls)
    assert [c["timing"] is None for c in rec.calls] == [True] * 7 + [False] * 15  # the first call traces
    assert saves == [10, 20]
    lines = [r.message for r in caplog.records if "| step" in r.message]
    assert [ln.split(" | ")[1] for ln in lines] == ["step 10/25", "step 20/25", "step 25/25"]
    assert result.accuracy == 0.75 and sum(len(i) for i in result.ids) == 44


def test_measure_every_times_one_call_in_k():
    clock, rec = FakeClock(), Recorder()
    loop.train(_fns(clock), iter(()), start_step=0, settings=_settings(steps=40, measure_every=2), metrics=rec,
               save=lambda s: None, clock=clock)
    timed = [c["timing"] is not None for c in rec.calls]
    assert timed == [False] * 20 + [True] * 10 + [False] * 10  # first calls trace, then 1 call in 2


def test_progress_line_fixed_fields():
    interval = progress.Interval(start_time=0.0, steps=10)
    line = progress.line(task="worker-1", step=120, total=1000, interval=interval, now=1.2, global_batch=64,
                         loss=0.412, accuracy=None)
    assert line.startswith("worker-1 | step 120/1000 | 8.3 steps/s | 533 ex/s | loss 0.412 | eta 1m46s")


def test_format_eta():
    assert [progress.format_eta(s) for s in (5, 106, 7260)] == ["5s", "1m46s", "2h01m"]


def test_after_call_runs_at_every_call_boundary_before_the_save():
    clock, rec, events = FakeClock(), Recorder(), []
    loop.train(_fns(clock), iter(()), start_step=3, settings=_settings(save_every=10), metrics=rec,
               save=lambda s: events.append(("save", s)), clock=clock, after_call=lambda s: events.append(("call", s)))
    assert events == [("call", 10), ("save", 10), ("call", 20), ("save", 20), ("call", 25)]


def test_a_preemption_at_a_call_boundary_stops_the_loop_there():
    class Preempted(Exception):
        pass

    def after_call(step):
        if step >= 10:
            raise Preempted(step)

    clock, rec = FakeClock(), Recorder()
    try:
        loop.train(_fns(clock), iter(()), start_step=0, settings=_settings(), metrics=rec, save=lambda s: None,
                   clock=clock, after_call=after_call)
    except Preempted as stop:
        assert stop.args == (10,)
    assert [c["step"] for c in rec.calls][-1] == 10  # every step before the save was recorded, none after
