"""What the observer records per call (trainer/observe/record.py, sampler.Window, config): every step
counted, parts only after a sample and then as the sample's shares of each step."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry

import contract as c
from trainer.cluster.spec import TaskId
from trainer.observe import config, marks
from trainer.observe.record import Ratios, Recorder
from trainer.observe.sampler import Window
from trainer.observe.trace import Parts
from trainer.telemetry.metrics import Metrics


def _value(registry, name, **labels):
    return registry.get_sample_value(name, {"task_type": "worker", "task_index": "1", **labels})


def test_calls_count_every_step_and_parts_follow_the_sample():
    registry = CollectorRegistry()
    rec = Recorder(Metrics(registry, TaskId("worker", 1)), clock=lambda: 100.0)
    rec.setup(replicas=2, gradient_bytes=1000)
    rec.call(1.0, 10, global_step=10, examples_per_step=16, loss=0.5)
    assert _value(registry, c.STEP.count) == 10 and _value(registry, c.STEP.sum) == pytest.approx(1.0)
    assert _value(registry, c.COMPUTE.count) == 0  # no sample yet: no split, not a made-up one
    rec.set_ratios(Ratios(compute=0.5, allreduce=0.3, input=0.1))
    rec.call(2.0, 10, global_step=20, examples_per_step=16, loss=0.25)
    assert _value(registry, c.COMPUTE.count) == 10 and _value(registry, c.COMPUTE.sum) == pytest.approx(1.0)
    assert _value(registry, c.ALLREDUCE.sum) == pytest.approx(0.6)
    assert _value(registry, c.INPUT_WAIT.sum) == pytest.approx(0.2)
    assert _value(registry, c.STEPS.name) == 20 and _value(registry, c.EXAMPLES.name) == 320
    assert _value(registry, c.ALLREDUCE_BYTES.name) == 20_000
    assert _value(registry, c.GLOBAL_STEP.name) == 20 and _value(registry, c.LOSS.name) == 0.25
    assert _value(registry, c.WORLD_SIZE.name) == 2 and _value(registry, c.SPLIT_SAMPLED.name) == 1
    assert _value(registry, c.SPLIT_SAMPLES.name) == 1
    assert rec.calls_total() == 2 and [x.steps for x in rec.calls_since(1, 2)] == [10]


def test_no_loss_removes_the_series():
    registry = CollectorRegistry()
    rec = Recorder(Metrics(registry, TaskId("worker", 1)))
    rec.no_loss("train_step returns nothing")
    assert _value(registry, c.LOSS.name) is None


def test_window_ratios_are_per_call_over_host_time_per_call():
    w = Window(
        Parts(span=0.8, compute=0.4, allreduce=0.3, input=0.1, calls=4), host_seconds=1.0, host_calls=4
    )
    r = w.ratios()
    assert (r.compute, r.allreduce, r.input) == pytest.approx((0.4, 0.3, 0.1))
    assert Window(Parts(), 1.0, 4).ratios() is None


def test_config_from_env():
    assert config.from_env({}) == config.ObserveConfig()
    got = config.from_env({config.PERIOD_ENV: "10", config.WINDOW_ENV: "0.5", config.CHECK_ENV: "1"})
    assert (got.period_s, got.window_s, got.check) == (10.0, 0.5, True)
    with pytest.raises(ValueError, match="TRAINER_SPLIT_PERIOD_S='x'"):
        config.from_env({config.PERIOD_ENV: "x"})
    with pytest.raises(ValueError, match="longer than"):
        config.from_env({config.PERIOD_ENV: "1", config.WINDOW_ENV: "2"})


def test_fit_keeps_the_users_callbacks_wherever_they_are_passed():
    from trainer.observe.fit import _with_callback

    ours, theirs = object(), object()
    assert _with_callback((1,), {}, ours) == ((1,), {"callbacks": [ours]})
    assert _with_callback((1,), {"callbacks": [theirs]}, ours)[1]["callbacks"] == [theirs, ours]
    args, kwargs = _with_callback((1, None, 32, 2, 0, [theirs], 0.0), {}, ours)
    assert args[5] == [theirs, ours] and args[6] == 0.0 and kwargs == {}

    class CallbackList:  # as tf_keras.callbacks.CallbackList: appended to, not replaced
        def __init__(self, items):
            self.items = items

        def append(self, item):
            self.items.append(item)

    given = CallbackList([theirs])
    assert _with_callback((1,), {"callbacks": given}, ours)[1]["callbacks"] is given
    assert given.items == [theirs, ours]


def test_marked_calls_export_their_own_split_every_step():
    """The graph's marks (trainer/observe/marks.py) give each call its measured all-reduce and input
    wait; compute is the rest of the call's host time; no sample needed, none claimed."""
    registry = CollectorRegistry()
    rec = Recorder(Metrics(registry, TaskId("worker", 1)), clock=lambda: 100.0)
    rec.begin_call()
    rec.marks.sums().write(marks.ALLREDUCE, 10.0, 10.3)  # what the graph adds, here eagerly
    rec.marks.sums().write(marks.ALLREDUCE, 10.3, 10.4)
    rec.marks.sums().write(marks.INPUT, 9.9, 10.0)
    rec.call(1.0, 10, global_step=10)
    assert _value(registry, c.ALLREDUCE.sum) == pytest.approx(0.4)
    assert _value(registry, c.INPUT_WAIT.sum) == pytest.approx(0.1)
    assert _value(registry, c.COMPUTE.sum) == pytest.approx(0.5) and _value(registry, c.COMPUTE.count) == 10
    assert _value(registry, c.SPLIT_SAMPLED.name) == 0 and "marked in every step" in rec.summary()


def test_a_call_that_traced_counts_its_steps_but_not_its_time():
    registry = CollectorRegistry()
    rec = Recorder(Metrics(registry, TaskId("worker", 1)), clock=lambda: 100.0)
    rec.begin_call()
    rec.marks.sums().write(marks.ALLREDUCE, 10.0, 10.3)
    rec.traced(10, global_step=10, examples_per_step=None, loss=None)  # seen: 14 s to trace
    assert _value(registry, c.STEPS.name) == 10 and _value(registry, c.GLOBAL_STEP.name) == 10
    assert _value(registry, c.STEP.count) == 0 and _value(registry, c.ALLREDUCE.count) == 0
    rec.begin_call()
    rec.call(0.5, 10, global_step=20)  # no marks of its own: the traced call's are not carried over
    assert _value(registry, c.STEP.count) == 10 and _value(registry, c.ALLREDUCE.count) == 0


def test_split_check_names_one_task_or_every_task():
    chief = '{"cluster": {}, "task": {"type": "chief", "index": 0}}'
    worker = '{"cluster": {}, "task": {"type": "worker", "index": 1}}'
    assert config.from_env({config.CHECK_ENV: "chief", "TF_CONFIG": chief}).check
    assert not config.from_env({config.CHECK_ENV: "chief", "TF_CONFIG": worker}).check
    assert config.from_env({config.CHECK_ENV: "worker-1", "TF_CONFIG": worker}).check
    assert config.from_env({config.CHECK_ENV: "1", "TF_CONFIG": worker}).check


def test_the_input_step_moves_with_each_batch_taken_inside_a_call_and_never_steps_back():
    registry = CollectorRegistry()
    rec = Recorder(Metrics(registry, TaskId("worker", 1)))
    rec.call(1.0, 10, global_step=10)
    assert _value(registry, c.INPUT_STEP.name) == 10
    rec.begin_call()
    for i in range(3):  # the running call's graph hands each batch over as it arrives
        rec.marks.sums().write(marks.INPUT, i, i + 0.5)
    assert _value(registry, c.INPUT_STEP.name) == 13  # a task blocked in its input stays behind
    rec.call(1.0, 10, global_step=20)
    assert _value(registry, c.INPUT_STEP.name) == 20
    rec.traced(10, global_step=30, examples_per_step=None, loss=None)
    assert _value(registry, c.INPUT_STEP.name) == 30
