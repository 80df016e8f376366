"""Benchmark, run in every task of a local cluster (`make bench`); the chief prints the ratios:

  (a) instrumented loop / the same loop untimed (the uninstrumented fused step), target >= 0.98
  (b) our loop / tf-keras model.fit under MWMS, target >= 1.0
  (c) |compute + all-reduce + input - step| / step over the timed steps, target <= 5%

Modes alternate within each round (A B C A B C ...) on the same model, data and cluster, so slow
drifts of a shared machine hit them alike; each mode first runs a few settling steps; the median
round counts. Not a test: on 2 shared cores the numbers move by 10% from run to run.

    python -m trainer.host.launch --workers 2 --metrics-port 0 --module trainer.host.bench [--rounds 3] [--bench-steps 400]
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import time
from dataclasses import dataclass

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf
from prometheus_client import CollectorRegistry

from trainer import agreement, loop, progress, step, tasks, training
from trainer import config as config_lib
from trainer.checkpoint import NoCheckpoints
from trainer.cluster import CHIEF, TaskId, parse_tf_config
from trainer.metrics import Metrics
from trainer.timing import StepFns


@dataclass(frozen=True)
class Bench:
    """One task's step functions, input and metrics, run untimed or through the trainer's loop."""

    fns: StepFns
    iterator: object
    metrics: Metrics

    def untimed(self, steps: int, per_call: int) -> None:
        for done in range(0, steps, per_call):
            self.fns.plain(self.iterator, min(per_call, steps - done))[1].numpy()

    def instrumented(self, steps: int, per_call: int, timings: list, measure_every: int = 1) -> None:
        metrics = self.metrics

        class Keep:  # records what the loop reports, and forwards it to real metrics (their cost counts)
            def record_step(self, **kw):
                metrics.record_step(**kw)
                if kw["timing"] is not None:
                    timings.append(kw["timing"])

        settings = loop.LoopSettings(task_name="bench", steps=steps, steps_per_call=per_call,
                                     measure_every=measure_every, save_every=0, local_examples=1,
                                     classify=False, record_ids=False)
        lines = progress.ProgressLog(progress.Job("bench", steps, 1), every=steps)  # as in training
        logging.disable(logging.INFO)
        loop.Controller(fns=self.fns, checkpoints=NoCheckpoints(), metrics=Keep(), settings=settings,
                        actions=(lines,)).train(self.iterator, 0)
        logging.disable(logging.NOTSET)


def _one_step_per_call(strategy, task, optimizer, global_batch):
    """The TensorFlow tutorial's custom loop: one step per call, aggregation inside apply_gradients."""
    variables = task.model.trainable_variables

    def replica(batch):
        x, y = batch[0], batch[1]
        with tf.GradientTape() as tape:
            loss = tf.nn.compute_average_loss(task.loss(y, task.model(x, training=True)), global_batch_size=global_batch)
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


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.host.bench")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--bench-steps", type=int, default=400, help="steps per mode per round")
    p.add_argument("--sample-every", type=int, default=4,
                   help="also bench timing one call in this many (the --measure-every trade-off)")
    args, rest = p.parse_known_args(argv)
    config = config_lib.from_args(rest, os.environ)
    spec = parse_tf_config(os.environ.get("TF_CONFIG"))
    strategy = training.make_strategy(config, spec)
    replicas = strategy.num_replicas_in_sync
    global_batch = config.per_replica_batch * replicas
    with strategy.scope():
        task = tasks.build(tasks.load(config.task), per_replica_batch=config.per_replica_batch, seed=config.seed,
                           data=config.data, input_delay_ms=config.input_delay_ms)
        optimizer = step.optimizer(config, replicas)
        fit_model = tf.keras.models.clone_model(task.model)
        fit_model.compile(optimizer=step.optimizer(config, replicas),
                          loss=tf.keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    iterator = iter(strategy.distribute_datasets_from_function(task.dataset_fn))
    fit_data = strategy.distribute_datasets_from_function(lambda ctx: task.dataset_fn(ctx).map(lambda x, y, i: (x, y)))
    fns = step.build(strategy, task, optimizer, global_batch, step.StepOptions.of(config))
    classic = _one_step_per_call(strategy, task, optimizer, global_batch)
    metrics = Metrics(CollectorRegistry(), spec.task if spec else TaskId(CHIEF, 0))
    k = config.steps_per_call or _auto_steps_per_call(strategy, fns, iterator)
    n, timings = args.bench_steps, []
    bench = Bench(fns, iterator, metrics)
    modes = {  # name -> run(steps)
        f"untimed fused step, {k} per call": lambda m: bench.untimed(m, k),
        f"instrumented loop, {k} per call": lambda m: bench.instrumented(m, k, timings),
        f"instrumented loop, {k} per call, 1 call in {args.sample_every} timed":
            lambda m: bench.instrumented(m, k, [], args.sample_every),
        f"host loop only, {k} per call, no call timed":
            lambda m: bench.instrumented(m, k, [], 10**9),
        "untimed fused step, 1 per call": lambda m: bench.untimed(m, 1),
        "instrumented loop, 1 per call": lambda m: bench.instrumented(m, 1, []),
        "tutorial custom loop, 1 per call": lambda m: [classic(iterator) for _ in range(m)],
        "tf-keras model.fit": lambda m: fit_model.fit(fit_data, epochs=1, steps_per_epoch=m, verbose=0),
    }
    rates = {name: [] for name in modes}
    for r in range(args.rounds + 1):  # round 0 traces every function and is not counted
        for name, run in modes.items():
            # Settle first: the mode before leaves threads and buffers (model.fit's input pipeline)
            # that would otherwise slow whichever mode comes next (measured: up to 2x).
            mark = len(timings)
            run(max(k, n // 5))
            del timings[mark:]
            start = time.perf_counter()
            run(n)
            if r == 0:
                del timings[mark:]
            else:
                rates[name].append(n / (time.perf_counter() - start))
    if spec is None or spec.is_chief:
        header = (f"bench: {replicas} replicas, task {config.task}, per-replica batch {config.per_replica_batch}, "
                  f"{args.rounds} rounds x {args.bench_steps} steps per mode (median round)")
        _report(header, args.sample_every, {m: statistics.median(r) for m, r in rates.items()}, timings, k)
    return 0


def _report(header: str, sample_every: int, rate: dict[str, float], timings: list, k: int) -> None:
    untimed_k, timed_k, sampled_k, loop_only_k, untimed_1, timed_1, _, fit = rate.values()
    step_s = sum(t.step for t in timings)
    gap = abs(step_s - sum(t.input + t.compute + t.allreduce for t in timings)) / step_s
    lines = [header]
    lines += [f"  {name:<36} {value:8.1f} steps/s" for name, value in rate.items()]
    lines += [
        (f"(a) instrumented / untimed fused step: {timed_k / untimed_k:.3f} at {k} steps per call, "
         f"{timed_1 / untimed_1:.3f} at 1 (target >= 0.98)"),
        (f"    timing 1 call in {sample_every}: {sampled_k / untimed_k:.3f}; host loop with no call timed: "
         f"{loop_only_k / untimed_k:.3f} (what the timestamps themselves cost is the difference)"),
        (f"(b) our loop / tf-keras model.fit:     {timed_k / fit:.2f} "
         f"(at 1 step per call: {timed_1 / fit:.2f}) (target >= 1.0)"),
        (f"(c) |compute + allreduce + input - step| / step: {gap:.1%} "
         f"over {len(timings)} timed steps (target <= 5%)"),
    ]
    print("\n".join(lines), flush=True)


if __name__ == "__main__":
    sys.exit(main())
