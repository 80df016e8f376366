"""`make bench-comm`: TensorFlow's own all-reduce, 4 KiB to 64 MiB and gradient-shaped, next to iperf3.

    python -m bench.comm [--where auto|local|docker|bridge] [--workers 1] [--out .run/bench-comm]

Runs on the host only (drives Docker and iperf3). It starts one sweep task per cluster task
(`python -m trainer.bench.allreduce_sweep`, the in-container half), either as local processes on
127.0.0.1 (a fresh chief + --workers workers, like bench.launch), inside the compose stack's
containers (its running trainers, else temporary ones from the same image on its network), or
(`bridge`) in temporary containers of the trainer image on a bridge network of their own. Payloads:
8 equal tensors per size (the size axis the projection fits), and the `mlp`, `cnn` and ResNet-50-like
gradient lists (bench/payloads.py), so that packing packs several tensors. Every cell is timed
--repeats times: median and min-max are printed, and a setting is named best only when its slowest
repeat beats the runner-up's fastest. Bandwidths follow nccl-tests: algbw = bytes / time,
busbw = algbw x 2(n-1)/n. iperf3 runs between the first two tasks' network namespaces (nsenter for
containers) with as many streams as TensorFlow held connections between them (counted with `ss`
during the sweep). Writes <out>.json (contract/benchcomm.py, which `make diagnose` reads),
<out>.png and prints a table.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Callable, Sequence
from pathlib import Path

import contract
from bench.comm.endpoints import bridge_endpoints, docker_endpoints, local_endpoints, stack_containers
from bench.comm.iperf import tcp_throughput
from bench.comm.plot import write_png
from bench.comm.settings import ENV_CANDIDATES, SERVER_CANDIDATES, server_ab
from bench.comm.table import format_cpu, format_rounds, format_table, rows
from bench.comm.tasks import PAYLOADS, _run_sweep, payload_shapes
from contract.benchcomm import Result
from trainer.host import __version__, server_config
from trainer.host import allreduce_sweep as sweep


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m bench.comm", description=__doc__.splitlines()[0])
    p.add_argument(
        "--where",
        choices=("auto", "local", "docker", "bridge"),
        default="auto",
        help="auto: the compose stack's containers if it exists, else local processes; bridge: temporary "
        "containers of --image on a bridge network of their own",
    )
    p.add_argument(
        "--image",
        default=f"{os.environ.get('IMAGE_REPO', 'mwms/trainer')}:{__version__}-cpu",
        help="--where bridge: the trainer image (default IMAGE_REPO:<version>-cpu)",
    )
    p.add_argument(
        "--project",
        default=os.environ.get("PROJECT", contract.DEFAULT_PROJECT),
        help="compose project (make up PROJECT=)",
    )
    p.add_argument(
        "--workers", type=int, default=1, help="local, bridge: workers besides the chief (default 1: 2 tasks)"
    )
    p.add_argument("--sizes", default=",".join(map(str, sweep.SIZES)), help="bytes, comma-separated")
    p.add_argument(
        "--variants", default=",".join(sweep.VARIANTS), help="IMPLEMENTATION/bytes_per_pack, comma-separated"
    )
    p.add_argument(
        "--payloads",
        default=",".join(PAYLOADS),
        help=f"gradient-shaped tensor lists besides the equal-tensor sizes ({', '.join(PAYLOADS)}; '' = none)",
    )
    p.add_argument(
        "--repeats", type=int, default=sweep.REPEATS, help="timed calls per cell (the spread is over them)"
    )
    p.add_argument(
        "--servers",
        default=";".join(SERVER_CANDIDATES),
        help="gRPC server settings to A/B after the sweep, ';'-separated (trainer/cluster/server_config.py; "
        "'stock' = TF's own), each on a fresh cluster; '' = none",
    )
    p.add_argument(
        "--envs",
        default="malloc-thp-keep;malloc-thp;malloc-keep",
        help=f"process environments to A/B on the stock server, ';'-separated: NAME=VALUE or one of "
        f"{', '.join(ENV_CANDIDATES)}; '' = none",
    )
    p.add_argument(
        "--ab-payload",
        default="resnet50",
        help=f"the payload(s) the A/B times (RING/0, one pack), comma-separated ({', '.join(PAYLOADS)})",
    )
    p.add_argument(
        "--rounds",
        type=int,
        default=1,
        help="A/B rounds: every setting once per round, odd rounds in reverse order (interleaved)",
    )
    p.add_argument("--out", type=Path, default=Path(".run/bench-comm"), help="writes OUT.json and OUT.png")
    return p


def _task_args(args: argparse.Namespace) -> list[str]:
    """What every task's sweep (trainer.bench.allreduce_sweep) is asked to time."""
    sizes = [sweep.parse_bytes(s) for s in args.sizes.split(",") if s]
    return [
        "--sizes",
        ",".join(map(str, sizes)),
        "--variants",
        args.variants,
        "--repeats",
        str(args.repeats),
        "--shapes",
        json.dumps(payload_shapes(args.payloads)),
    ]


def _endpoints(args: argparse.Namespace) -> tuple[str, list, Callable[[], None]]:
    """Where the tasks run (auto: the stack's containers if up, else local processes), and their cleanup."""
    where = args.where
    if where == "auto":
        where = "docker" if stack_containers(args.project) else "local"
    if where == "docker":
        return (where, *docker_endpoints(args.project))
    if where == "bridge":
        return (where, *bridge_endpoints(args.image, args.project, args.workers))
    return where, local_endpoints(args.workers), lambda: None


def _measure(where: str, endpoints: list, args: argparse.Namespace) -> tuple[list, int, list, dict | None]:
    """The sweep, the server-settings A/B, and iperf3 at TensorFlow's own stream count."""
    print(
        f"bench-comm: {len(endpoints)} tasks ({where}): "
        + ", ".join(f"{e.task}@{e.address}" for e in endpoints),
        file=sys.stderr,
        flush=True,
    )
    # as every task runs (containers have it already; local processes get it here)
    results, streams = _run_sweep(endpoints, _task_args(args), dict(server_config.ENVIRONMENT))
    ab, loads = server_ab(endpoints, args)
    tcp = None
    if len(endpoints) > 1:
        print(
            f"bench-comm: TensorFlow held {streams} TCP connection(s) between {endpoints[0].task} and "
            f"{endpoints[1].task} (ss, sampled during the sweep): iperf3 -P {max(streams, 1)}",
            file=sys.stderr,
        )
        tcp = tcp_throughput(endpoints[0], endpoints[1], max(streams, 1))
    return results, streams, (ab, loads), tcp


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    where, endpoints, cleanup = _endpoints(args)
    try:
        results, streams, (ab, loads), tcp = _measure(where, endpoints, args)
    finally:
        cleanup()
    n = results[0]["n"]
    table = rows([t for r in results for t in r["timings"]], n)
    if table:  # empty when only the A/B was asked for (--sizes '' --payloads '')
        print(format_table(table, tcp, max(streams, 1)))
    if ab:
        ab_table = rows(ab, n)
        print(f"\ngRPC server settings A/B ({args.ab_payload}, RING/0, each on a fresh cluster):")
        print(format_table(ab_table, tcp, max(streams, 1)))
        print(format_cpu(ab))
        if args.rounds > 1:
            print(format_rounds(ab, args.repeats))
        print(
            f"load average (1 min) before/after each A/B cluster, {args.rounds} round(s): "
            f"{min(loads):.1f}-{max(loads):.1f} (median {statistics.median(loads):.1f})"
        )
        table = table + ab_table
    Result(where=where, n=n, tf_version=results[0]["tf_version"], tcp=tcp, rows=tuple(table)).write(
        args.out.with_suffix(".json")
    )
    written = [args.out.with_suffix(".json")]
    if any(r.payload == sweep.EQUAL for r in table):  # the plot's axis is the equal-tensor sizes
        write_png(table, tcp, n, where, args.out.with_suffix(".png"))
        written.append(args.out.with_suffix(".png"))
    print(f"bench-comm: wrote {' and '.join(map(str, written))}", file=sys.stderr)
    return 0
