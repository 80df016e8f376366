"""The sweep's numbers: rows from every task's timings (median, min-max, busbw as nccl-tests), the
winner of a cell (only beyond the runner-up's spread), and the printed tables."""

from __future__ import annotations

import statistics

from contract.benchcomm import Result, Row
from trainer.host import allreduce_sweep as sweep


def busbw(algbw: float, n: int) -> float:
    """nccl-tests' bus bandwidth of an all-reduce: what each link carries, comparable across n."""
    return algbw * 2 * (n - 1) / n


def rows(timings: list[dict], n: int) -> list[Row]:
    """Per (variant, payload, size): each repeat's slowest task (a collective ends when its last task
    does), then the median, min and max over the repeats."""
    out = []
    for key in dict.fromkeys((t["variant"], t.get("payload", sweep.EQUAL), t["size"]) for t in timings):
        per_task = [
            t["samples"] for t in timings if (t["variant"], t.get("payload", sweep.EQUAL), t["size"]) == key
        ]
        repeats = [max(times) for times in zip(*per_task)]
        seconds = statistics.median(repeats)
        variant, payload, size = key
        out.append(
            Row(
                variant,
                size,
                seconds,
                size / seconds,
                busbw(size / seconds, n),
                payload=payload,
                seconds_min=min(repeats),
                seconds_max=max(repeats),
            )
        )
    return sorted(out, key=lambda r: (r.payload != sweep.EQUAL, r.size))


def winner(cell: list[Row]) -> str:
    """The fastest setting of one (payload, size), named only when its slowest repeat beats the
    runner-up's fastest (the spreads do not overlap); else "no clear winner"."""
    first, second = sorted(cell, key=lambda r: r.seconds)[:2] if len(cell) > 1 else (cell[0], None)
    if second is None or first.seconds_max < second.seconds_min:
        return first.variant
    return "no clear winner"


def _ms(seconds: float) -> str:
    ms = seconds * 1e3
    return f"{ms:.3g}" if ms < 1000 else f"{ms:.0f}"


def _cell(r: Row | None) -> str:
    if r is None:
        return "| " + " " * 31
    spread = f"{_ms(r.seconds_min)}-{_ms(r.seconds_max)}"
    return f"| {r.seconds * 1e3:>8.3f} {spread:>13} {r.busbw / 1e6:>7.1f} "


def format_table(table: list[Row], tcp: float | None, streams: int = 1) -> str:
    variants = list(dict.fromkeys(r.variant for r in table))
    head = (
        f"{'payload':>8} {'size':>11} " + "".join(f"| {v:^30} " for v in variants) + "| best (beyond spread)"
    )
    sub = f"{'':>20} " + "| {:>8} {:>13} {:>7} ".format("median", "min-max ms", "busbw") * len(variants)
    lines = [head, sub]
    for payload, size in dict.fromkeys((r.payload, r.size) for r in table):
        cell = [r for r in table if (r.payload, r.size) == (payload, size)]
        by_variant = {r.variant: r for r in cell}
        lines.append(
            f"{payload:>8} {sweep.human(size):>11} "
            + "".join(_cell(by_variant.get(v)) for v in variants)
            + f"| {winner(cell)}"
        )
    lines.append(
        "times in ms per all-reduce, median and min-max over the repeats; busbw in MB/s (1e6 bytes/s) = size/time x 2(n-1)/n "
        "(nccl-tests)"
    )
    if tcp:
        b = Result("", 0, "", tcp, tuple(table)).best
        lines.append(
            f"raw TCP (iperf3, {streams} stream{'s' * (streams > 1)}) between the first two tasks: "
            f"{tcp / 1e6:.0f} MB/s"
        )
        lines.append(
            f"best busbw at {sweep.human(b.size)} ({b.payload}): {b.variant} {b.busbw / 1e6:.1f} MB/s = "
            f"{100 * b.busbw / tcp:.1f}% of raw TCP"
        )
    return "\n".join(lines)


def merged_rounds(timings: list[dict]) -> list[dict]:
    """One timing per (task, variant, payload, size), its rounds' repeats concatenated in order."""
    merged: dict[tuple, dict] = {}
    for t in timings:
        key = (t.get("task"), t["variant"], t.get("payload", sweep.EQUAL), t["size"])
        if key not in merged:
            merged[key] = {**t, **{k: list(t[k]) for k in ("samples", "cpu", "faults") if k in t}}
            continue
        for k in ("samples", "cpu", "faults"):
            if k in t:
                merged[key][k] += t[k]
    return list(merged.values())


def format_cpu(timings: list[dict]) -> str:
    """CPU seconds and minor page faults per all-reduce summed over the tasks (median and min-max
    over the repeats): the cost of a setting whatever else shares the cores, which moves its wall
    time on a loaded machine."""
    lines = ["CPU per all-reduce, all tasks (ms, median and min-max over the repeats; page faults, median):"]
    for payload in dict.fromkeys(t.get("payload", sweep.EQUAL) for t in timings):
        of_payload = [t for t in timings if t.get("payload", sweep.EQUAL) == payload]
        for variant in dict.fromkeys(t["variant"] for t in of_payload):
            total = _summed(of_payload, variant, "cpu")
            faults = _summed(of_payload, variant, "faults")
            if total:
                lines.append(
                    f"  {payload:>8} {variant:<50} {statistics.median(total) * 1e3:8.2f} "
                    f"{min(total) * 1e3:.2f}-{max(total) * 1e3:.2f}"
                    + (f"  {statistics.median(faults):9.0f} faults" if faults else "")
                )
    return "\n".join(lines)


def format_rounds(timings: list[dict], repeats: int) -> str:
    """Each cluster's median wall time per all-reduce (each repeat's slowest task), in round order:
    how far apart two clusters of one setting land, which the pooled spread hides."""
    lines = ["ms per all-reduce, each round's cluster's median (the rounds in order):"]
    for payload in dict.fromkeys(t.get("payload", sweep.EQUAL) for t in timings):
        for variant in dict.fromkeys(
            t["variant"] for t in timings if t.get("payload", sweep.EQUAL) == payload
        ):
            per_task = [
                t["samples"]
                for t in timings
                if t["variant"] == variant and t.get("payload", sweep.EQUAL) == payload
            ]
            slowest = [max(v) for v in zip(*per_task)]
            medians = [statistics.median(slowest[i : i + repeats]) for i in range(0, len(slowest), repeats)]
            lines.append(f"  {payload:>8} {variant:<50} " + " ".join(f"{m * 1e3:.2f}" for m in medians))
    return "\n".join(lines)


def _summed(timings: list[dict], variant: str, key: str) -> list[float]:
    """Per repeat, `key` summed over the tasks that measured `variant`."""
    return [sum(v) for v in zip(*(t[key] for t in timings if t["variant"] == variant and key in t))]
