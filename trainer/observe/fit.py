"""`model.fit`, observed: a callback added to every fit call, the user's callbacks kept.

tf-keras calls its CallbackList's on_train_batch_begin/end around each call of its train_function,
which runs steps_per_execution steps; the callback times that call on the host, counts its steps from
the batch indices Keras passes, and takes the loss from the logs Keras computes anyway. The callback
declares it reads tensor logs, so it adds no conversion of its own beyond the one scalar it reads.

The callback has no batch hooks of its own: the CallbackList's two methods are wrapped to call it
(after the other callbacks, as the last in the list), because a callback with batch hooks makes
Keras call every callback's batch hooks, each call, where a plain fit calls none. Seen at fit's
default steps_per_execution of 1 with verbose=2: Keras' ProgbarLogger then walked the model's
layers for its metrics on every batch, ~200 us of CPU per call beside the callback's own ~150 us
(`make bench` (f), docs/script.md#what-it-costs).
"""

from __future__ import annotations

import functools
import threading
import time

from trainer.observe.record import Recorder, variable_bytes

FIT_FUNCTION = "train_function"
"""The name tf-keras gives the tf.function that runs fit's steps (found in the trace by it)."""
_CALLBACKS_ARG = 5  # fit(x, y, batch_size, epochs, verbose, callbacks, ...)
_state = threading.local()


def in_fit() -> bool:
    """True inside a fit call: the custom-loop hook then leaves the train_function to this one."""
    return getattr(_state, "depth", 0) > 0


def global_batch(model, args: tuple, kwargs: dict) -> int | None:
    """fit's global batch when it can be known: a dataset's static batch or batch_size for arrays."""
    import tensorflow as tf

    x = kwargs.get("x", args[0] if args else None)
    if isinstance(x, tf.data.Dataset):
        first = tf.nest.flatten(x.element_spec)[0]
        return first.shape[0] if first.shape.rank else None
    if x is None or hasattr(x, "__next__") or isinstance(x, tf.distribute.DistributedDataset):
        return None
    batch = kwargs.get("batch_size", args[2] if len(args) > 2 else None)
    return batch or 32  # fit's own default for arrays


def local_examples(model, batch: int | None) -> int | None:
    """Examples per step this task's replicas process: the global batch shared among all replicas."""
    if not batch:
        return None
    strategy = model.distribute_strategy
    local = len(strategy.extended.worker_devices)
    return batch * local // strategy.num_replicas_in_sync


def make_callback(recorder: Recorder, examples: int | None):
    import tf_keras

    class Observe(tf_keras.callbacks.Callback):
        """Times every call of fit's train_function; keeps nothing between fits but the step."""

        def __init__(self) -> None:
            super().__init__()
            self._supports_tf_logs = True
            self._begin = (0.0, 0, 0)
            self._step = 0

        def on_train_begin(self, logs=None) -> None:
            recorder.step_function(FIT_FUNCTION)
            recorder.setup(
                replicas=self.model.distribute_strategy.num_replicas_in_sync,
                gradient_bytes=variable_bytes(self.model.trainable_variables),
            )
            self._step = int(self.model.optimizer.iterations.numpy())
            self._targeted = False
            if examples is None:
                recorder.say_once("examples", "observe: fit's batch size is not static: no examples counted")

        def on_epoch_begin(self, epoch, logs=None) -> None:
            # The epoch fit starts at is known only here: BackupAndRestore's resume is decided after
            # on_train_begin (a 12-epoch script resumed at epoch 2 showed `step 2400 of 2600` done).
            if self._targeted:
                return
            self._targeted = True
            epochs, steps = self.params.get("epochs"), self.params.get("steps")
            if epochs and steps:
                recorder.target(self._step + (epochs - epoch) * steps)

        def begin_call(self, batch, logs=None) -> None:
            recorder.begin_call()
            self._begin = (time.perf_counter(), batch, _tracings(self.model))

        def end_call(self, batch, logs=None) -> None:
            t0, first, tracings = self._begin
            steps = batch - first + 1
            self._step += steps
            loss = (logs or {}).get("loss")
            loss = None if loss is None else float(loss)
            if _tracings(self.model) != tracings:
                recorder.traced(steps, global_step=self._step, examples_per_step=examples, loss=loss)
                return
            seconds = time.perf_counter() - t0
            recorder.call(seconds, steps, global_step=self._step, examples_per_step=examples, loss=loss)

    return Observe()


def _tracings(model) -> int:
    """How often fit's train_function has been traced (a call that traces it is not a step's time)."""
    function = getattr(model, "train_function", None)
    count = getattr(function, "experimental_get_tracing_count", None)
    return count() if count else 0


def _with_callback(args: tuple, kwargs: dict, callback) -> tuple[tuple, dict]:
    if len(args) > _CALLBACKS_ARG:
        given = args[_CALLBACKS_ARG]
        args = (*args[:_CALLBACKS_ARG], [*(given or []), callback], *args[_CALLBACKS_ARG + 1 :])
        return args, kwargs
    given = kwargs.get("callbacks")
    if hasattr(given, "append") and not isinstance(given, list):  # a CallbackList the user built
        given.append(callback)
        return args, kwargs
    return args, {**kwargs, "callbacks": [*(given or []), callback]}


def install(recorder: Recorder) -> None:
    """Wrap tf_keras.Model.fit (every model class inherits it) to add the observing callback."""
    import tf_keras

    original = tf_keras.Model.fit

    @functools.wraps(original)
    def fit(self, *args, **kwargs):
        if in_fit():  # a subclass's fit calling super().fit: observed once
            return original(self, *args, **kwargs)
        examples = local_examples(self, global_batch(self, args, kwargs))
        observer = make_callback(recorder, examples)
        args, kwargs = _with_callback(args, kwargs, observer)
        _state.depth, _state.observer = 1, observer
        try:
            return original(self, *args, **kwargs)
        finally:
            _state.depth, _state.observer = 0, None

    tf_keras.Model.fit = fit
    _wrap_batch_hooks(tf_keras.callbacks.CallbackList)


def _wrap_batch_hooks(callbacks) -> None:
    """The running fit's callback is called by its CallbackList's batch methods, after the others."""
    begin, end = callbacks.on_train_batch_begin, callbacks.on_train_batch_end

    @functools.wraps(begin)
    def on_train_batch_begin(self, batch, logs=None):
        begin(self, batch, logs)
        if (observer := getattr(_state, "observer", None)) is not None and observer in self.callbacks:
            observer.begin_call(batch, logs)

    @functools.wraps(end)
    def on_train_batch_end(self, batch, logs=None):
        end(self, batch, logs)
        if (observer := getattr(_state, "observer", None)) is not None and observer in self.callbacks:
            observer.end_call(batch, logs)

    callbacks.on_train_batch_begin = on_train_batch_begin
    callbacks.on_train_batch_end = on_train_batch_end
