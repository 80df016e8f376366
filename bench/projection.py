"""Beyond this machine, on paper: an alpha-beta model of the ring all-reduce, fitted from what
`make bench-comm` measured and checked against what `make scaling` measured.

Ring all-reduce of B bytes over n tasks: 2(n-1) latency hops and 2(n-1)/n x B bytes per task,
    T(n, B) = 2(n-1) alpha + 2(n-1)/n x B / beta.
alpha and beta are fitted (least squares) to bench-comm's times of one variant over its sizes.
The projected step is compute (of one task with its own cores, the 1-task run) + input + the
all-reduce, or with overlap only what the backward pass (taken as 2/3 of compute) does not hide;
compression halves B. Real networks have their own alpha; the fitted one (loopback, TensorFlow's
gRPC ring) is kept, which makes the projection optimistic for latency-bound sizes.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

NETWORKS_GBPS = (10, 25, 100)
WORKERS = (4, 8, 16, 32, 64)
DEFAULT_VARIANT = "AUTO/0"
BACKWARD_SHARE = 2 / 3  # of compute: what overlap can hide the all-reduce behind


@dataclass(frozen=True)
class Ring:
    alpha: float
    """Seconds per hop."""
    beta: float
    """Bytes per second per link."""

    def seconds(self, n: int, nbytes: float) -> float:
        if n < 2:
            return 0.0
        return 2 * (n - 1) * self.alpha + 2 * (n - 1) / n * nbytes / self.beta


def fit(n: int, sizes_seconds: list[tuple[float, float]]) -> Ring:
    """Least squares of T = a x + b y with x = 2(n-1), y = 2(n-1)/n x size; alpha = a, beta = 1/b.

    In relative error (each equation divided by its T): sizes span 4 KiB to 64 MiB, and plain least
    squares would let the largest decide alone, leaving the latency to chance."""
    xs = [(2 * (n - 1) / t, 2 * (n - 1) / n * size / t, 1.0) for size, t in sizes_seconds]
    sxx = sum(x * x for x, _, _ in xs)
    sxy = sum(x * y for x, y, _ in xs)
    syy = sum(y * y for _, y, _ in xs)
    sxt = sum(x * t for x, _, t in xs)
    syt = sum(y * t for _, y, t in xs)
    det = sxx * syy - sxy * sxy
    a, b = (sxt * syy - syt * sxy) / det, (syt * sxx - sxt * sxy) / det
    return Ring(alpha=max(a, 0.0), beta=1 / b)


def from_bench_comm(report: dict, variant: str | None = None) -> tuple[str, Ring]:
    """Fitted to the trainer's default setting (AUTO, one pack) when bench-comm measured it, since the
    scaling runs use it; else to bench-comm's best setting."""
    rows = [r for r in report["rows"] if r.get("payload", "equal8") == "equal8"]  # the size sweep
    variant = variant or (
        DEFAULT_VARIANT if any(r["variant"] == DEFAULT_VARIANT for r in rows) else report["best"]["variant"]
    )
    return variant, fit(report["n"], [(r["size"], r["seconds"]) for r in rows if r["variant"] == variant])


def step_seconds(ring: Ring, n: int, *, compute: float, nbytes: float, setting: tuple[bool, bool]) -> float:
    """`setting` = (overlap, compress)."""
    overlap, compress = setting
    comm = ring.seconds(n, nbytes / 2 if compress else nbytes)
    if overlap:
        comm = max(0.0, comm - BACKWARD_SHARE * compute)
    return compute + comm


def check(ring: Ring, points: list[dict]) -> list[str]:
    """Model vs measured all-reduce of the 2..n task runs (ms), with the relative error."""
    lines = []
    for p in points:
        if p["tasks"] < 2 or not p.get("allreduce_bytes_per_step"):
            continue
        model = 1000 * ring.seconds(p["tasks"], p["allreduce_bytes_per_step"])
        lines.append(
            f"  {p['tasks']} tasks: all-reduce measured {p['allreduce_ms']:.2f} ms, model {model:.2f} ms "
            f"(error {(model - p['allreduce_ms']) / p['allreduce_ms']:+.0%})"
        )
    return lines


def projection(ring: Ring, *, compute: float, nbytes: float) -> list[str]:
    lines = [f"  {'workers':>7} {'Gb/s':>5} | step ms and scaling efficiency: plain | bf16 | overlap | both"]
    for gbps in NETWORKS_GBPS:
        link = Ring(alpha=ring.alpha, beta=gbps * 1e9 / 8)
        for n in WORKERS:
            cells = []
            for overlap, compress in ((False, False), (False, True), (True, False), (True, True)):
                t = step_seconds(link, n, compute=compute, nbytes=nbytes, setting=(overlap, compress))
                cells.append(f"{1000 * t:7.2f} {compute / t:4.0%}")
            lines.append(f"  {n:>7} {gbps:>5} | " + " | ".join(cells))
    return lines


def report(scaling: dict, bench_comm: dict) -> str:
    variant, ring = from_bench_comm(bench_comm)
    points = scaling["points"]
    one = next(p for p in points if p["tasks"] == 1)
    nbytes = max(p.get("allreduce_bytes_per_step", 0.0) for p in points)
    lines = [
        (
            f"projection: ring all-reduce fitted to bench-comm ({variant}, {bench_comm['n']} tasks): "
            f"alpha {1e6 * ring.alpha:.0f} us per hop, beta {ring.beta / 1e6:.0f} MB/s"
        )
    ]
    lines += check(ring, points)
    lines.append(
        f"  compute {one['compute_ms']:.2f} ms per step (1 task), gradients {nbytes / 1e6:.2f} MB per step; "
        f"overlap hides up to {BACKWARD_SHARE:.0%} of compute"
    )
    lines += projection(ring, compute=one["compute_ms"] / 1000, nbytes=nbytes)
    return "\n".join(lines)


def main(scaling_json: Path, bench_comm_json: Path) -> str | None:
    if not bench_comm_json.exists():
        return f"projection: no {bench_comm_json} (run make bench-comm first), nothing to fit"
    return report(json.loads(scaling_json.read_text()), json.loads(bench_comm_json.read_text()))
