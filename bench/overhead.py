"""Benchmark, run in every task of a local cluster (`make bench`); the chief prints min / median / max
over the rounds of each ratio (each ratio is taken within one round, so slow drifts cancel):

  (a) instrumented loop / the same fused steps untimed, same steps per call and packing  (target >= 0.97)
  (b) our instrumented loop / tf-keras model.fit compiled with steps_per_execution = our steps per call
      (one long fit, its turn ending at every batch end); the TensorFlow tutorial's custom loop (1 step
      per call) is printed too                                                           (target >= 1.0)
  (c) compute and all-reduce from the marks vs TensorFlow's profiler trace (bench/tracecheck.py),
      on the `cnn` task                                                                  (target <= 10%)
  (d) --allreduce-mode overlap vs serial on `cnn` with packing: step-time ratio, and the all-reduce metric
      of each (serial: the whole all-reduce; overlap: its exposed part)
  (e) bfloat16 / float32 all-reduce time of a ResNet-50-like payload (161 tensors, 25.6 M parameters)

The modes run in turns of one call each (bench/turns.py, in an order drawn each cycle) on the same
cluster, every mode in its own thread keeping its loop's state; a round is --bench-steps of each, and
a first round (tracing, settling) is not counted. Turns, not whole modes one after another: this
machine's speed moves by up to 2x from one second to the next, which modes timed seconds apart
measured (round ratios 0.81-1.12). The untimed mode run twice ("again") is the method's own null.
Not a test: a benchmark prints, it does not assert.

    python -m bench.launch --workers 2 --metrics-port 0 --module bench.overhead [--rounds 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import random
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import replace

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from prometheus_client import CollectorRegistry

from bench import payloads, tracecheck, turns
from trainer.host import (
    CHIEF,
    TaskId,
    agreement,
    checkpoint,
    loop,
    parse_tf_config,
    progress,
    step,
    tasks,
    training,
)
from trainer.host import config as config_lib
from trainer.host import metrics as metrics_lib


def _calls(call: Callable[[], object], per_turn: int = 1) -> turns.Mode:
    """A mode making `per_turn` calls of `call` a turn."""

    def mode(turn) -> None:
        while True:
            for _ in range(per_turn):
                call()
            turn()

    return mode


def _instrumented(fns, iterator, per_call: int, sink) -> turns.Mode:
    """The trainer's own loop (Controller, progress action), one call a turn; `sink` = (metrics,
    timings, measure_every): the loop's metrics are forwarded to real ones, so their cost counts.
    One Controller for the whole run: its count of calls (which one is timed) goes on across turns."""
    metrics, timings, measure_every = sink

    class Keep:  # records what the loop reports, and forwards it to real metrics (their cost counts)
        def state(self, state: str) -> None: ...
        def checkpointed(self, step: int) -> None: ...

        def record_step(self, **kw):
            metrics.record_step(**kw)
            if kw["timing"] is not None:
                timings.append(kw["timing"])

    settings = loop.LoopSettings(
        task_name="bench",
        steps=ENDLESS,
        steps_per_call=per_call,
        measure_every=measure_every,
        save_every=0,
        local_examples=1,
        classify=False,
        record_ids=False,
    )
    lines = progress.ProgressLog(progress.Job("bench", ENDLESS, 1), every=ENDLESS)  # as in training

    def mode(turn) -> None:
        controller = loop.Controller(
            fns=fns,
            checkpoints=checkpoint.NoCheckpoints(),
            metrics=Keep(),
            settings=settings,
            actions=(lines, lambda _: turn()),
        )
        controller.train(iterator, 0)

    return mode


ENDLESS = 10**12
"""Steps of a mode's loop: more than any run makes; the schedule stops it (turns.Stop)."""


def _one_step_per_call(strategy, task, optimizer, global_batch):
    """The TensorFlow tutorial's custom loop: one step per call, aggregation inside apply_gradients."""
    variables = task.model.trainable_variables

    def replica(batch):
        x, y = batch[0], batch[1]
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(
                task.loss(y, task.model(x, training=True)), global_batch_size=global_batch
            )
        optimizer.apply_gradients(zip(tape.gradient(loss, variables), variables))
        return loss

    @tf.function
    def train_step(iterator):
        return strategy.run(replica, args=(next(iterator),))

    return lambda iterator: strategy.experimental_local_results(train_step(iterator))[0].numpy()


def _auto_steps_per_call(strategy, fns, iterator) -> int:
    """As the trainer does: from a timed one-step call, agreed (maximum) across tasks."""
    fns.timed(iterator, 1)[1].numpy()  # trace
    t_prev = time.time()
    marks = fns.timed(iterator, 1)[0].numpy()
    k = loop.auto_steps_per_call(loop.timings_of(marks, t_prev, time.time())[0].step)
    return int(max(row[0] for row in agreement.gather(strategy, [float(k)])))


class _TurnEachExecution(tf.keras.callbacks.Callback):
    """A turn at every batch end: with steps_per_execution k, after every k steps."""

    def __init__(self, turn) -> None:
        super().__init__()
        self.turn = turn

    def on_train_batch_end(self, batch, logs=None):
        self.turn()


def _fit(model, data, k: int) -> turns.Mode:
    def mode(turn) -> None:
        model.fit(
            data, epochs=1, steps_per_epoch=ENDLESS // k * k, verbose=0, callbacks=[_TurnEachExecution(turn)]
        )

    return mode


def _build(config, strategy, task_name: str, options: step.StepOptions, replicas: int):
    with strategy.scope():
        task = tasks.from_config(config, task_name)
        optimizer = step.optimizer(config, replicas)
    fns = step.build(strategy, task, optimizer, config.per_replica_batch * replicas, options)
    return task, optimizer, fns, iter(strategy.distribute_datasets_from_function(task.dataset_fn))


def _fit_model(config, strategy, task, replicas: int, k: int):
    with strategy.scope():
        model = tf.keras.models.clone_model(task.model)
        model.compile(
            optimizer=step.optimizer(config, replicas),
            steps_per_execution=k,
            loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True),
        )
    return model, strategy.distribute_datasets_from_function(
        lambda ctx: task.dataset_fn(ctx).map(lambda x, y, i: (x, y))
    )


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.overhead")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--bench-steps", type=int, default=400, help="steps per mlp mode per round")
    p.add_argument("--cnn-per-call", type=int, default=20, help="steps per call (and turn) of (d) on cnn")
    p.add_argument("--pack", type=int, default=256 * 1024, help="bytes per pack of (d)")
    p.add_argument(
        "--sample-every",
        type=int,
        default=4,
        help="also bench timing one call in this many (the --measure-every trade-off)",
    )
    p.add_argument("--skip-rates", action="store_true", help="only (c) and (e)")
    return p


def _schedule(modes: turns.Turns, names: list[str], cycles: tuple[int, int], rounds: int, timings: dict):
    """Seconds of every mode per round: each cycle gives every mode one turn, in an order drawn
    afresh each cycle from a seed every task shares (same collectives, same order). Why drawn: a
    turn's time depends on the turn before it (the same function warm, or another model whose turn
    let this input pipeline's prefetch fill): with the order fixed or mirrored, the same untimed mode
    run twice differed by 2 % (measured). Round 0 (`cycles[0]` cycles) traces every function and
    settles the input pipelines; neither it nor the timings it kept count."""
    seconds = {name: [] for name in names}
    for r in range(rounds + 1):
        spent = dict.fromkeys(names, 0.0)
        for c in range(cycles[0] if r == 0 else cycles[1]):
            for name in random.Random(f"{r}/{c}").sample(names, len(names)):
                spent[name] += modes.turn(name)
        if r == 0:
            for kept in timings.values():
                kept.clear()
            continue
        for name in names:
            seconds[name].append(spent[name])
    return seconds


def _rates(modes: dict[str, tuple[int, turns.Mode]], args, k: int, timings: dict) -> dict[str, list[float]]:
    """Steps per second of every mode (name -> (steps a turn, mode)) per round, run in turns."""
    if args.skip_rates:
        return {}
    cycles = (max(2, -(-args.bench_steps // 5 // k)), max(1, -(-args.bench_steps // k)))
    logging.disable(logging.INFO)  # the loops' lines, as a job with --log-every far apart
    try:
        with turns.Turns({name: mode for name, (_, mode) in modes.items()}) as running:
            seconds = _schedule(running, list(modes), cycles, args.rounds, timings)
    finally:
        logging.disable(logging.NOTSET)
    return {name: [steps * cycles[1] / t for t in seconds[name]] for name, (steps, _) in modes.items()}


def main(argv=None) -> int:
    args, rest = _parser().parse_known_args(argv)
    config = config_lib.from_args(rest, os.environ)
    spec = parse_tf_config(os.environ.get("TF_CONFIG"))
    chief = spec is None or spec.is_chief
    strategy = training.make_strategy(config, spec)
    replicas = strategy.num_replicas_in_sync
    options = step.StepOptions.of(config)
    task, optimizer, fns, iterator = _build(config, strategy, config.task, options, replicas)
    classic = _one_step_per_call(strategy, task, optimizer, config.per_replica_batch * replicas)
    metrics = metrics_lib.Metrics(CollectorRegistry(), spec.task if spec else TaskId(CHIEF, 0))
    k = config.steps_per_call or _auto_steps_per_call(strategy, fns, iterator)
    fit_model, fit_data = _fit_model(config, strategy, task, replicas, k)
    cnn = {
        mode: _build(config, strategy, "cnn", replace(options, mode=mode, bytes_per_pack=args.pack), replicas)
        for mode in ("serial", "overlap")
    }
    cnn_k = args.cnn_per_call
    timings = {"ours": [], "serial": [], "overlap": []}
    untimed = _calls(lambda: fns.plain(iterator, k)[1].numpy())
    modes = {  # name -> (steps a turn, mode)
        "untimed fused steps": (k, untimed),
        "instrumented loop": (k, _instrumented(fns, iterator, k, (metrics, timings["ours"], 1))),
        f"instrumented, 1 call in {args.sample_every} timed": (
            k,
            _instrumented(fns, iterator, k, (metrics, [], args.sample_every)),
        ),
        f"model.fit, steps_per_execution {k}": (k, _fit(fit_model, fit_data, k)),
        "tutorial custom loop, 1 per call": (k, _calls(lambda: classic(iterator), k)),
        "cnn serial": (
            cnn_k,
            _instrumented(cnn["serial"][2], cnn["serial"][3], cnn_k, (metrics, timings["serial"], 1)),
        ),
        "cnn overlap": (
            cnn_k,
            _instrumented(cnn["overlap"][2], cnn["overlap"][3], cnn_k, (metrics, timings["overlap"], 1)),
        ),
        "untimed fused steps again": (k, untimed),  # the same mode in another place: the method's null
    }
    rates = _rates(modes, args, k, timings)
    if chief and rates:  # first what is measured, in case a later part fails
        header = (
            f"bench: {replicas} replicas, task {config.task}, per-replica batch {config.per_replica_batch}, "
            f"{k} steps per call, {args.rounds} rounds x {-(-args.bench_steps // k)} turns of one call per mode, "
            "the modes in turns; "
        )
        print(_report(header, args, k, rates, timings), flush=True)
    agreement.gather(strategy, [0.0])  # all tasks out of the turns (a fit's exit takes seconds) before (c)
    trace = tracecheck.check(cnn["serial"][2], cnn["serial"][3], TRACE_STEPS, chief)
    payload = _compression(strategy, args.rounds)
    if chief:
        print(_report_more(trace, payload, TRACE_STEPS), flush=True)
    return 0


# Steps in the profiled call: the profiler's host buffer dropped events of 60 cnn steps (measured).
TRACE_STEPS = 20


def _compression(strategy, rounds: int) -> dict[str, list[float]]:
    """Seconds per all-reduce of the ResNet-50-like payload, per dtype, interleaved over rounds."""
    shapes = payloads.resnet50_like()
    reduce = {dtype: payloads.all_reduce_fn(strategy, shapes, dtype) for dtype in ("float32", "bfloat16")}
    seconds = {dtype: [] for dtype in reduce}
    for r in range(rounds + 1):
        for dtype, run in reduce.items():
            start = time.perf_counter()
            run()
            if r:
                seconds[dtype].append(time.perf_counter() - start)
    return seconds


def _spread(values) -> str:
    return f"{min(values):.3f} / {statistics.median(values):.3f} / {max(values):.3f}"


def _ratios(rates, a: str, b: str) -> list[float]:
    return [x / y for x, y in zip(rates[a], rates[b], strict=True)]


def _ms(timings, part: str) -> float:
    return 1000 * statistics.median(getattr(t, part) for t in timings)


def _report(header: str, args, k, rates, timings) -> str:
    untimed, timed, sampled, fit, tutorial, serial, overlap, again = list(rates)
    lines = [f"{header}ratios as min / median / max over the rounds; load average {os.getloadavg()[0]:.1f}"]
    lines += [f"  {name:<40} {statistics.median(v):8.1f} steps/s (median)" for name, v in rates.items()]
    lines += [
        f"(a) instrumented / untimed, {k} per call:          {_spread(_ratios(rates, timed, untimed))} (target >= 0.97)",
        f"    1 call in {args.sample_every} timed / untimed:            {_spread(_ratios(rates, sampled, untimed))}",
        f"    null: untimed again / untimed:              {_spread(_ratios(rates, again, untimed))} (the method's own spread)",
        f"(b) ours / model.fit at steps_per_execution {k}: {_spread(_ratios(rates, timed, fit))} (target >= 1.0)",
        f"    ours / tutorial custom loop:                {_spread(_ratios(rates, timed, tutorial))}",
    ]
    lines.append(
        f"(d) cnn, {args.pack} B packs: step time overlap / serial {_spread(_ratios(rates, serial, overlap))}; "
        f"all-reduce metric serial {_ms(timings['serial'], 'allreduce'):.2f} ms (whole), overlap "
        f"{_ms(timings['overlap'], 'allreduce'):.2f} ms (exposed), compute {_ms(timings['serial'], 'compute'):.2f} "
        f"vs {_ms(timings['overlap'], 'compute'):.2f} ms, medians"
    )
    return "\n".join(lines)


def _report_more(trace, payload, total: int) -> str:
    ours, theirs, steps, _ = trace
    ratios = [b / f for b, f in zip(payload["bfloat16"], payload["float32"], strict=True)]
    return "\n".join(
        [
            (
                f"(c) marks vs profiler, cnn, {steps} of {total} steps in the trace: "
                f"{tracecheck.describe(ours, theirs, steps)} (target <= 10%)"
            ),
            (
                f"(e) ResNet-50-like payload (161 tensors, 25.6 M params), bfloat16 / float32 all-reduce time: "
                f"{_spread(ratios)} (target <= 0.6); float32 median {statistics.median(payload['float32']):.3f} s"
            ),
            f"load average after the run: {os.getloadavg()[0]:.1f}",
        ]
    )


if __name__ == "__main__":
    sys.exit(main())
