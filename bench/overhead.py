"""Benchmark, run in every task of a local cluster (`make bench`); the chief prints min / median / max
over the rounds of each ratio (each ratio is taken within one round, so slow drifts cancel):

  (a) instrumented loop / the same fused steps untimed, same steps per call and packing  (target >= 0.97)
  (b) our instrumented loop / tf-keras model.fit compiled with steps_per_execution = our steps per call,
      one long fit per round timed by a batch-end callback after its warm-up; the TensorFlow tutorial's
      custom loop (1 step per call) is printed too                                       (target >= 1.0)
  (c) compute and all-reduce from the marks vs TensorFlow's profiler trace (bench/tracecheck.py),
      on the `cnn` task                                                                  (target <= 10%)
  (d) --allreduce-mode overlap vs serial on `cnn` with packing: step-time ratio, and the all-reduce metric
      of each (serial: the whole all-reduce; overlap: its exposed part)
  (e) bfloat16 / float32 all-reduce time of a ResNet-50-like payload (161 tensors, 25.6 M parameters)

Modes alternate within each round (A B C, then C B A, ...) on the same cluster; each first runs
settling steps.
Not a test: on 2 shared cores the numbers move by 10% from run to run.

    python -m bench.launch --workers 2 --metrics-port 0 --module bench.overhead [--rounds 5]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from dataclasses import replace

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from prometheus_client import CollectorRegistry

from bench import payloads, tracecheck
from trainer import agreement, loop, progress, step, tasks, training
from trainer import config as config_lib
from trainer.checkpoint import NoCheckpoints
from trainer.cluster import CHIEF, TaskId, parse_tf_config
from trainer.metrics import Metrics


def _untimed(fns, iterator, steps: int, per_call: int) -> None:
    for done in range(0, steps, per_call):
        fns.plain(iterator, min(per_call, steps - done))[1].numpy()


def _instrumented(fns, iterator, steps: int, per_call: int, sink) -> None:
    """The trainer's own loop (Controller, progress action) over `steps`; `sink` = (metrics, timings,
    measure_every): the loop's metrics are forwarded to real ones, so their cost counts."""
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
        steps=steps,
        steps_per_call=per_call,
        measure_every=measure_every,
        save_every=0,
        local_examples=1,
        classify=False,
        record_ids=False,
    )
    lines = progress.ProgressLog(progress.Job("bench", steps, 1), every=steps)  # as in training
    logging.disable(logging.INFO)
    loop.Controller(
        fns=fns, checkpoints=NoCheckpoints(), metrics=Keep(), settings=settings, actions=(lines,)
    ).train(iterator, 0)
    logging.disable(logging.NOTSET)


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


class _FitClock(tf.keras.callbacks.Callback):
    """Batch-end times of one fit: with steps_per_execution k it fires every k steps."""

    def __init__(self) -> None:
        super().__init__()
        self.ends: list[tuple[int, float]] = []

    def on_train_batch_end(self, batch, logs=None):
        self.ends.append((batch, time.perf_counter()))


def _fit_rate(model, data, settle: int, steps: int) -> float:
    """Steps per second of one long fit, after its first `settle` steps (tracing, input warm-up)."""
    clock = _FitClock()
    model.fit(data, epochs=1, steps_per_epoch=settle + steps, verbose=0, callbacks=[clock])
    start = next((t, b) for b, t in clock.ends if b + 1 >= settle)
    return (clock.ends[-1][0] - start[1]) / (clock.ends[-1][1] - start[0])


def _timed_rate(run, settle: int, steps: int) -> float:
    run(settle)
    start = time.perf_counter()
    run(steps)
    return steps / (time.perf_counter() - start)


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
    p.add_argument("--bench-steps", type=int, default=400, help="steps per mode per round")
    p.add_argument("--cnn-steps", type=int, default=60, help="steps per mode per round of (c) and (d) on cnn")
    p.add_argument("--pack", type=int, default=256 * 1024, help="bytes per pack of (d)")
    p.add_argument(
        "--sample-every",
        type=int,
        default=4,
        help="also bench timing one call in this many (the --measure-every trade-off)",
    )
    p.add_argument("--skip-rates", action="store_true", help="only (c) and (e)")
    return p


def _interleave(modes: dict, rounds: int, timings: dict) -> dict[str, list[float]]:
    """Steps per second of every mode, the modes interleaved over `rounds` rounds; round 0 traces
    every function and is not counted (nor are the timings it kept)."""
    rates = {name: [] for name in modes}
    for r in range(rounds):
        # Odd rounds run the modes in reverse: a mode's place in the round (after which function, at
        # which phase of the input pipeline's prefetch) then favours no mode over the rounds.
        for name, run in list(modes.items())[:: -1 if r % 2 else 1]:
            rate = run()
            if r:
                rates[name].append(rate)
        if r == 0:
            for kept in timings.values():
                kept.clear()
    return rates


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
    metrics = Metrics(CollectorRegistry(), spec.task if spec else TaskId(CHIEF, 0))
    k = config.steps_per_call or _auto_steps_per_call(strategy, fns, iterator)
    fit_model, fit_data = _fit_model(config, strategy, task, replicas, k)
    cnn = {
        mode: _build(config, strategy, "cnn", replace(options, mode=mode, bytes_per_pack=args.pack), replicas)
        for mode in ("serial", "overlap")
    }
    n, settle, cn = args.bench_steps, max(k, args.bench_steps // 5), args.cnn_steps
    cnn_k = max(1, min(k, cn // 3))
    timings = {"ours": [], "serial": [], "overlap": []}
    modes = {  # name -> () -> steps per second
        "untimed fused steps": lambda: _timed_rate(lambda m: _untimed(fns, iterator, m, k), settle, n),
        "instrumented loop": lambda: _timed_rate(
            lambda m: _instrumented(fns, iterator, m, k, (metrics, timings["ours"], 1)), settle, n
        ),
        f"instrumented, 1 call in {args.sample_every} timed": lambda: _timed_rate(
            lambda m: _instrumented(fns, iterator, m, k, (metrics, [], args.sample_every)), settle, n
        ),
        f"model.fit, steps_per_execution {k}": lambda: _fit_rate(fit_model, fit_data, settle, n),
        "tutorial custom loop, 1 per call": lambda: _timed_rate(
            lambda m: [classic(iterator) for _ in range(m)], settle, n
        ),
        "cnn serial": lambda: _timed_rate(
            lambda m: _instrumented(
                cnn["serial"][2], cnn["serial"][3], m, cnn_k, (metrics, timings["serial"], 1)
            ),
            cnn_k,
            cn,
        ),
        "cnn overlap": lambda: _timed_rate(
            lambda m: _instrumented(
                cnn["overlap"][2], cnn["overlap"][3], m, cnn_k, (metrics, timings["overlap"], 1)
            ),
            cnn_k,
            cn,
        ),
    }
    rates = _interleave(modes, 0 if args.skip_rates else args.rounds + 1, timings)
    if chief and not args.skip_rates:  # first what is measured, in case a later part fails
        header = (
            f"bench: {replicas} replicas, task {config.task}, per-replica batch {config.per_replica_batch}, "
            f"{k} steps per call, {args.rounds} rounds x {args.bench_steps} steps per mode; "
        )
        print(_report(header, args, k, rates, timings), flush=True)
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
    names = list(rates)
    untimed, timed, sampled, fit, tutorial, serial, overlap = names
    lines = [f"{header}ratios as min / median / max over the rounds; load average {os.getloadavg()[0]:.1f}"]
    lines += [f"  {name:<40} {statistics.median(v):8.1f} steps/s (median)" for name, v in rates.items()]
    lines += [
        f"(a) instrumented / untimed, {k} per call:          {_spread(_ratios(rates, timed, untimed))} (target >= 0.97)",
        f"    1 call in {args.sample_every} timed / untimed:            {_spread(_ratios(rates, sampled, untimed))}",
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
