"""`make scaling`: the same short job on a chief + 0, 1, ..., N workers; where does scaling break?

    python -m bench.scaling --max-workers 2 [--seconds 20] [--out .run/scaling] [trainer flags]

Each size is a fresh local cluster (bench.launch) trained for the same wall time. Every task's
/metrics is read twice a second; the figures are the difference between the first reading past the
warm-up (tracing, first collectives) and the last one, so start-up does not count. Per size:
cluster throughput (examples/s, all tasks), scaling efficiency throughput_r / (r x throughput_1)
with r tasks (one replica each on CPU), and the mean step breakdown. Writes OUT.json and OUT.png.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import socket
import sys
import time
import urllib.request
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

import contract
from bench import projection

PARTS = ("compute", "allreduce", "input")
HISTOGRAMS = {
    "step": contract.STEP,
    "compute": contract.COMPUTE,
    "allreduce": contract.ALLREDUCE,
    "input": contract.INPUT_WAIT,
}
STEPS, EXAMPLES, BYTES = contract.STEPS.name, contract.EXAMPLES.name, contract.ALLREDUCE_BYTES.name


@dataclass(frozen=True)
class Snapshot:
    at: float
    values: dict[str, float]
    """Sample name (the contract's counters, histogram _sum and _count) -> value."""


@dataclass(frozen=True)
class Point:
    tasks: int
    examples_per_s: float
    steps_per_s: float
    step_ms: float
    compute_ms: float
    allreduce_ms: float
    input_ms: float
    efficiency: float = 1.0
    allreduce_bytes_per_step: float = 0.0
    """Gradient bytes each task all-reduces per step (for the projection's model check)."""

    @property
    def other_ms(self) -> float:
        return self.step_ms - self.compute_ms - self.allreduce_ms - self.input_ms


def parse_metrics(text: str) -> dict[str, float]:
    wanted = {STEPS, EXAMPLES, BYTES} | {n for h in HISTOGRAMS.values() for n in (h.sum, h.count)}
    return {
        s.name: s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name in wanted
    }


def point(tasks: int, first: list[Snapshot], last: list[Snapshot]) -> Point:
    """Cluster throughput and mean breakdown between two readings of every task. Pure."""

    def delta(i: int, name: str) -> float:
        return last[i].values.get(name, 0.0) - first[i].values.get(name, 0.0)

    examples = sum(delta(i, EXAMPLES) / (last[i].at - first[i].at) for i in range(tasks))
    steps = sum(delta(i, STEPS) / (last[i].at - first[i].at) for i in range(tasks)) / tasks
    means = {}
    for part, hist in HISTOGRAMS.items():
        per_task = [
            delta(i, hist.sum) / delta(i, hist.count) for i in range(tasks) if delta(i, hist.count) > 0
        ]
        means[part] = 1000 * sum(per_task) / len(per_task) if per_task else float("nan")
    step_count = delta(0, STEPS)
    nbytes = delta(0, BYTES) / step_count if step_count else 0.0
    return Point(
        tasks,
        examples,
        steps,
        means["step"],
        means["compute"],
        means["allreduce"],
        means["input"],
        allreduce_bytes_per_step=nbytes,
    )


def with_efficiency(points: list[Point]) -> list[Point]:
    """throughput_r / (r x throughput_1), relative to the one-task run."""
    base = next(p for p in points if p.tasks == 1).examples_per_s
    return [Point(**{**asdict(p), "efficiency": p.examples_per_s / (p.tasks * base)}) for p in points]


def consecutive_free_ports(count: int, start: int = 20000, end: int = 60000) -> int:
    for base in range(start, end, count + 1):
        socks = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError("no free consecutive ports")


def scrape(port: int) -> Snapshot | None:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2) as r:
            return Snapshot(time.time(), parse_metrics(r.read().decode()))
    except OSError:
        return None


def run_size(workers: int, seconds: float, warmup: float, trainer_args: list[str], log: Path) -> Point:
    """Train on a fresh chief + `workers` cluster until `seconds` past the warm-up, then stop it."""
    from bench import launch

    tasks = workers + 1
    base = consecutive_free_ports(tasks)
    argv = ["--steps", "100000000", "--save-every", "0", *trainer_args]
    out = open(log, "a")  # the launcher's log pumps write here until the tasks exit
    with contextlib.redirect_stdout(out):
        procs = launch.start(argv, workers, metrics_port=base)
    seen: list[float | None] = [None] * tasks
    first: list[Snapshot | None] = [None] * tasks
    last: list[Snapshot | None] = [None] * tasks
    try:
        while not (all(first) and min(b.at - a.at for a, b in zip(first, last)) >= seconds):
            failed = [(n, p.returncode) for n, p in procs if p.poll() is not None]
            if failed:
                raise RuntimeError(f"WORKERS={workers}: {failed} exited early; see {log}")
            for i in range(tasks):
                snap = scrape(base + i)
                if snap is None or snap.values.get(STEPS, 0) == 0:
                    continue
                last[i] = snap
                seen[i] = seen[i] or snap.at
                if first[i] is None and snap.at - seen[i] >= warmup:
                    first[i] = snap
            time.sleep(0.5)
    finally:
        launch.stop(procs)
        time.sleep(0.2)  # let the pumps drain
        out.close()
    return point(tasks, first, last)


def write_png(points: list[Point], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    x = [p.tasks for p in points]
    fig, (a, b, c) = plt.subplots(1, 3, figsize=(14, 4.2))
    a.plot(x, [p.examples_per_s for p in points], marker="o", label="measured")
    a.plot(x, [points[0].examples_per_s * n / points[0].tasks for n in x], "k--", label="linear")
    a.set(xlabel="tasks (replicas)", ylabel="examples/s (cluster)", title="Throughput")
    b.plot(x, [100 * p.efficiency for p in points], marker="o")
    b.set(
        xlabel="tasks (replicas)", ylabel="%", title="Scaling efficiency thr_N / (N x thr_1)", ylim=(0, 110)
    )
    bottom = [0.0] * len(points)
    for part in (*PARTS, "other"):
        values = [getattr(p, f"{part}_ms") for p in points]
        c.bar(x, values, bottom=bottom, label=part)
        bottom = [u + v for u, v in zip(bottom, values)]
    c.set(xlabel="tasks (replicas)", ylabel="ms per step (mean of tasks)", title="Step breakdown")
    for ax in (a, b, c):
        ax.set_xticks(x)
        ax.grid(True, alpha=0.3)
    a.legend()
    c.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def format_table(points: list[Point]) -> str:
    lines = [
        f"{'tasks':>5} {'examples/s':>11} {'steps/s':>8} {'efficiency':>10} {'step ms':>8} = "
        f"{'compute':>8} + {'allreduce':>9} + {'input':>6} + {'other':>6}"
    ]
    for p in points:
        lines.append(
            f"{p.tasks:>5} {p.examples_per_s:>11.0f} {p.steps_per_s:>8.1f} {100 * p.efficiency:>9.0f}% "
            f"{p.step_ms:>8.1f} = {p.compute_ms:>8.1f} + {p.allreduce_ms:>9.1f} + {p.input_ms:>6.1f} + "
            f"{p.other_ms:>6.1f}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m bench.scaling",
        description=__doc__.splitlines()[0],
        epilog="Other flags go to every trainer task (python -m trainer --help).",
    )
    p.add_argument("--max-workers", type=int, default=2, help="largest WORKERS (a chief plus that many)")
    p.add_argument("--seconds", type=float, default=20.0, help="measured seconds per size, after the warm-up")
    p.add_argument(
        "--warmup", type=float, default=5.0, help="seconds from a task's first step before measuring"
    )
    p.add_argument("--out", type=Path, default=Path(".run/scaling"))
    p.add_argument(
        "--bench-comm",
        type=Path,
        default=Path(".run/bench-comm.json"),
        help="make bench-comm's result, to fit the projection's all-reduce model",
    )
    args, trainer_args = p.parse_known_args(argv)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    log = args.out.with_suffix(".log")
    log.write_text("")
    points = []
    for workers in range(args.max_workers + 1):
        print(
            f"scaling: chief + {workers} workers, {args.seconds:g} s past a {args.warmup:g} s warm-up "
            f"(log {log})",
            file=sys.stderr,
            flush=True,
        )
        points.append(run_size(workers, args.seconds, args.warmup, trainer_args, log))
    points = with_efficiency(points)
    print(format_table(points))
    args.out.with_suffix(".json").write_text(
        json.dumps(
            {
                "seconds": args.seconds,
                "warmup": args.warmup,
                "trainer_args": trainer_args,
                "points": [{**asdict(q), "other_ms": q.other_ms} for q in points],
            },
            indent=2,
        )
        + "\n"
    )
    write_png(points, args.out.with_suffix(".png"))
    print(projection.main(args.out.with_suffix(".json"), args.bench_comm))
    print(
        f"scaling: wrote {args.out.with_suffix('.json')} and {args.out.with_suffix('.png')}", file=sys.stderr
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
