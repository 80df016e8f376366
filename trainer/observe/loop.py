"""A custom training loop, observed: every call of the tf.function that calls `strategy.run`.

Every tf.function call passes through a wrapper that keeps a per-thread stack of the functions
being called. When `strategy.run` is traced inside one (a tf.function traces on its first call,
inside that call), the function is marked as a step function; so is the optimizer whose
apply_gradients it traces. Each later call of a marked function is timed on the host; its steps are
the optimizer's iterations it advanced (else one per traced strategy.run), its examples the static
batch strategy.run was traced with, its loss what it returns when that is a scalar (or a dict's
"loss"): nothing else is read from the device.
"""

from __future__ import annotations

import functools
import threading
import time
from dataclasses import dataclass

import trainer.observe.fit as fit
from trainer.observe.record import Recorder, variable_bytes

_stack = threading.local()
_tracing: list = [None]
"""The step function being traced: strategy.run may call the replica function in other threads."""


@dataclass
class StepFunction:
    """What tracing told us about one step function."""

    name: str
    runs: int = 0
    """strategy.run calls traced in it: steps per call when no optimizer is seen."""
    examples: int | None = None
    optimizer: object | None = None


def _calling() -> list:
    if not hasattr(_stack, "calls"):
        _stack.calls = []
    return _stack.calls


def batch_examples(strategy, args: tuple, kwargs: dict | None) -> int | None:
    """Examples this task's replicas get in one strategy.run: the static leading dimension of its
    first tensor argument, over the local replicas; None when it is not static."""
    import tensorflow as tf

    flat = tf.nest.flatten((args, kwargs or {}), expand_composites=False)
    for value in flat:
        parts = strategy.experimental_local_results(value)
        shapes = [getattr(p, "shape", None) for p in parts]
        if shapes and all(s is not None and s.rank for s in shapes):
            dims = [s[0] for s in shapes]
            return sum(dims) if all(d is not None for d in dims) else None
    return None


class LoopHook:
    def __init__(self, recorder: Recorder) -> None:
        self.recorder = recorder
        self.marked: dict[int, StepFunction] = {}
        self.steps = 0
        """Steps counted so far: the global step when no optimizer was seen."""

    def traced_run(self, strategy, args, kwargs) -> None:
        calls = _calling()
        if not calls or fit.in_fit():
            return
        function = calls[-1]
        info = self.marked.setdefault(id(function), StepFunction(function._name))
        if _tracing[0] is not info:  # the first strategy.run of this trace
            _tracing[0], info.runs = info, 0
        info.runs += 1
        if info.examples is None:
            info.examples = batch_examples(strategy, args, kwargs)
        self.recorder.step_function(info.name)
        self.recorder.setup(replicas=strategy.num_replicas_in_sync)

    def traced_apply(self, optimizer, grads_and_vars) -> None:
        if _tracing[0] is not None:
            _tracing[0].optimizer = optimizer
            pairs = list(grads_and_vars)
            self.recorder.setup(gradient_bytes=variable_bytes(v for _, v in pairs))
            return pairs
        return grads_and_vars

    def call(self, original, function, args, kwargs):
        calls = _calling()
        info = self.marked.get(id(function))
        if info is None or calls or fit.in_fit():  # not (yet) a step function, or nested in one
            calls.append(function)
            try:
                return original(function, *args, **kwargs)
            finally:
                calls.pop()
                if not calls:
                    _tracing[0] = None
        self.recorder.begin_call()
        before = self._iterations(info)
        t0 = time.perf_counter()
        calls.append(function)
        try:
            result = original(function, *args, **kwargs)
        finally:
            calls.pop()
            _tracing[0] = None
        seconds = time.perf_counter() - t0
        after = self._iterations(info)
        steps = after - before if after is not None and before is not None else max(info.runs, 1)
        self.steps += steps
        self.recorder.call(
            seconds,
            steps,
            global_step=after if after is not None else self.steps,
            examples_per_step=info.examples,
            loss=self._loss(info, result),
        )
        return result

    @staticmethod
    def _iterations(info: StepFunction) -> int | None:
        return None if info.optimizer is None else int(info.optimizer.iterations.numpy())

    def _loss(self, info: StepFunction, result) -> float | None:
        value = result.get("loss") if isinstance(result, dict) else result
        shape = getattr(value, "shape", None)
        if shape is not None and shape.rank == 0 and value.dtype.is_floating:
            return float(value)
        self.recorder.no_loss(f"{info.name} returns no scalar loss (nor a dict with one)")
        return None


def install(recorder: Recorder) -> LoopHook:
    """Wrap tf.function calls, Strategy.run and the tf-keras optimizers' apply_gradients."""
    import tensorflow as tf
    from tensorflow.python.distribute import distribute_lib
    from tensorflow.python.eager.polymorphic_function import polymorphic_function as pf

    hook = LoopHook(recorder)
    call = pf.Function.__call__

    @functools.wraps(call)
    def function_call(self, *args, **kwargs):
        return hook.call(call, self, args, kwargs)

    pf.Function.__call__ = function_call
    run = distribute_lib.StrategyBase.run

    @functools.wraps(run)
    def strategy_run(self, fn, args=(), kwargs=None, options=None):
        if tf.inside_function():
            hook.traced_run(self, args, kwargs)
        return run(self, fn, args=args, kwargs=kwargs, options=options)

    distribute_lib.StrategyBase.run = strategy_run
    _wrap_optimizers(hook)
    return hook


def _wrap_optimizers(hook: LoopHook) -> None:
    import tf_keras

    for cls in {tf_keras.optimizers.Optimizer, tf_keras.optimizers.legacy.Optimizer}:
        apply = cls.apply_gradients

        def apply_gradients(self, grads_and_vars, *args, _apply=apply, **kwargs):
            # A zip the user passed is consumed once: the hook hands back the list it read.
            return _apply(self, hook.traced_apply(self, grads_and_vars), *args, **kwargs)

        cls.apply_gradients = functools.wraps(apply)(apply_gradients)
