"""`python -m trainer.bench.allreduce_sweep`: one task of `make bench-comm`'s all-reduce sweep.

Runs where a trainer task runs (inside the trainer image, or a local process), started by the host
driver bench/comm/ with TF_CONFIG set. Builds a MultiWorkerMirroredStrategy and, per
payload, times chained all-reduces of a tensor list under every knob setting (CommunicationOptions
implementation and bytes_per_pack), the settings in turns (one call each, in an order drawn per
repeat): TENSORS equal tensors per size of the sweep, and the gradient-shaped
lists the driver passes (`--shapes`, JSON {name: [shape, ...]}: the tasks' models, ResNet-50), so
that a pack holds several tensors as in training. Every repeat's time is reported (the driver prints
the spread). Prints one line `BENCH_RESULT {json}` that the driver collects. Only the standard
library at import time.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import resource
import statistics
import sys
import time
from collections.abc import Sequence

KIB, MIB = 1024, 1024 * 1024
SIZES = tuple(4 * KIB * 4**i for i in range(8))  # 4 KiB ... 64 MiB
VARIANTS = ("RING/0", "AUTO/0", "RING/1MiB", "RING/16MiB")
"""implementation/bytes_per_pack; 0 = one pack (everything concatenated into one collective)."""
TENSORS = 8
EQUAL = f"equal{TENSORS}"
REPEATS = 7
RESULT = "BENCH_RESULT "


def parse_bytes(text: str) -> int:
    units = {"kib": KIB, "mib": MIB, "gib": 1024 * MIB, "": 1}
    low = text.strip().lower()
    for unit in ("kib", "mib", "gib", ""):
        if low.endswith(unit) and low[: len(low) - len(unit)].isdigit():
            return int(low[: len(low) - len(unit)]) * units[unit]
    raise ValueError(f"{text!r}: a byte count such as 0, 4096, 256KiB or 16MiB")


def human(n: float) -> str:
    for unit, size in (("MiB", MIB), ("KiB", KIB)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n:g} B"


def iterations(size: int) -> int:
    """All-reduces chained per timed call: enough to amortise dispatch on small sizes."""
    return max(2, min(20, (16 * MIB) // size))


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m trainer.bench.allreduce_sweep")
    p.add_argument("--sizes", default=",".join(map(str, SIZES)))
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--shapes", default="{}", help="JSON {payload name: [shape, ...]}")
    p.add_argument("--repeats", type=int, default=REPEATS)
    p.add_argument(
        "--server",
        default=None,
        help="gRPC server settings NAME=INT,... (trainer/cluster/server_config.py; 'stock' = TF's own); "
        "default: the trainer's",
    )
    args = p.parse_args(argv)
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    import tensorflow as tf

    from trainer.cluster import server_config
    from trainer.cluster.spec import parse_tf_config

    spec = parse_tf_config(os.environ.get("TF_CONFIG"))
    server = server_config.DEFAULT if args.server is None else server_config.parse(args.server)
    if spec is not None:
        server_config.apply(server)  # before the strategy: it starts the server
    resolver = None
    if spec is not None:
        resolver = tf.distribute.cluster_resolver.SimpleClusterResolver(
            tf.train.ClusterSpec(spec.cluster_dict()),
            task_type=spec.task.type,
            task_id=spec.task.index,
            rpc_layer="grpc",
        )
    strategy = tf.distribute.MultiWorkerMirroredStrategy(cluster_resolver=resolver)
    impl = tf.distribute.experimental.CommunicationImplementation
    options = {
        variant: tf.distribute.experimental.CommunicationOptions(
            implementation=getattr(impl, variant.split("/")[0]),
            bytes_per_pack=parse_bytes(variant.split("/")[1]),
        )
        for variant in args.variants.split(",")
    }
    timings = []
    for payload, shapes in payloads(args.sizes, json.loads(args.shapes)):
        timings += _time_payload(strategy, options, payload, shapes, args.repeats)
    print(
        RESULT
        + json.dumps(
            {
                "task": spec.task.name if spec else "chief",
                "n": strategy.num_replicas_in_sync,
                "tf_version": tf.__version__,
                "server": server_config.label(server_config.in_server()),
                "timings": timings,
            }
        ),
        flush=True,
    )
    return 0


def payloads(sizes: str, named: dict[str, list]) -> list[tuple[str, list[tuple[int, ...]]]]:
    """(name, float32 shapes): TENSORS equal tensors per size, then the named gradient lists."""
    equal = [(EQUAL, [(max(1, int(s) // 4 // TENSORS),)] * TENSORS) for s in sizes.split(",") if s]
    return equal + [(name, [tuple(s) for s in shapes]) for name, shapes in named.items()]


def turn_order(payload: str, repeat: int, variants: Sequence[str]) -> list[str]:
    """The variants' order in one repeat: drawn afresh each repeat, the same in every task (a string
    seed is hashed by sha512, not by PYTHONHASHSEED), because their collectives must match."""
    return random.Random(f"{payload}/{repeat}").sample(list(variants), len(variants))


def _time_payload(strategy, options: dict, payload: str, shapes, repeats: int) -> list[dict]:
    """Every variant's repeats on one payload, in turns: each repeat times every variant once, in a
    drawn order. Run one variant after another instead, and a minute in which the shared cores are
    slow lands on one variant (a 4 ms step on every small payload of one variant, 2026-12-02)."""
    size = 4 * sum(math.prod(s) for s in shapes)
    iters = iterations(size)
    chains = {variant: _chain(strategy, opts, shapes, iters) for variant, opts in options.items()}
    cells = {variant: {"samples": [], "cpu": [], "faults": [], "at": []} for variant in options}
    origin = time.perf_counter()
    for repeat in range(repeats):
        for variant in turn_order(payload, repeat, list(options)):
            start, (start_cpu, start_faults) = time.perf_counter(), _usage()
            float(chains[variant]())  # the fetch waits for the last all-reduce
            cell = cells[variant]
            cell["at"].append(start - origin)
            cell["samples"].append((time.perf_counter() - start) / iters)
            end_cpu, end_faults = _usage()
            cell["cpu"].append((end_cpu - start_cpu) / iters)
            cell["faults"].append((end_faults - start_faults) / iters)
    for variant, cell in cells.items():
        print(
            f"{variant:>11} {payload:>8} {human(size):>9}: {statistics.median(cell['samples']) * 1e3:9.3f} ms"
            f" ({statistics.median(cell['cpu']) * 1e3:.1f} ms CPU, {statistics.median(cell['faults']):.0f} page faults)",
            file=sys.stderr,
            flush=True,
        )
    return [{"variant": v, "payload": payload, "size": size, **cell} for v, cell in cells.items()]


def _chain(strategy, options, shapes, iters: int):
    """A traced and warmed-up function doing `iters` chained all-reduces of float32 tensors of
    `shapes` (each depends on the previous: they cannot overlap)."""
    import tensorflow as tf  # already loaded by main

    @tf.function
    def chain():
        def replica_fn():
            values = [tf.fill(shape, 1.0 + i) for i, shape in enumerate(shapes)]
            ctx = tf.distribute.get_replica_context()
            for _ in range(iters):
                values = ctx.all_reduce(tf.distribute.ReduceOp.MEAN, values, options=options)
            return tf.reshape(values[0], [-1])[0]

        return strategy.run(replica_fn)

    float(chain())  # trace, build the collective groups, warm up
    return chain


def _usage() -> tuple[float, int]:
    """This process's user + system CPU time and minor page faults, all threads (gRPC's included):
    what an all-reduce costs whatever else shares the cores, unlike its wall time. The faults are
    fresh memory being mapped and zeroed (docs/communication.md: the largest part of that CPU)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime, usage.ru_minflt


if __name__ == "__main__":
    sys.exit(main())
