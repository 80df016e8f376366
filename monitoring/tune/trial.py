"""The trials' turns: one cluster per setting (monitoring/tune/incontainer.py runs them where the job
runs), each from its own copy of the job's checkpoint, run in turns (SIGSTOP/SIGCONT of its processes,
one cluster at a time, the method of bench/script_overhead.py) so that every setting meets the same
machine and the same links. Each turn ends with a reading of the cluster's chief
(monitoring/tune/scrape.py) taken while it still runs."""

from __future__ import annotations

import math
import random
import signal
import time
from dataclasses import dataclass

from monitoring.tune import scrape


@dataclass
class Turn:
    start: float
    stop: float
    reading: scrape.Reading


class Cluster:
    """A trial cluster as the turns see it: started, read, signalled, stopped. The one that runs where the
    job runs is monitoring/tune/incontainer.py's; tests hand in their own."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.turns: list[Turn] = []

    def start(self) -> None:
        raise NotImplementedError

    def failed(self) -> str:
        """Empty while it runs; else why it ended (one line), then its last lines."""
        raise NotImplementedError

    def reading(self) -> scrape.Reading | None:
        """Its chief's /metrics now; None when it does not answer (yet, or any more)."""
        raise NotImplementedError

    def signal(self, sig: int) -> None:
        """SIGSTOP or SIGCONT to every process of the cluster: the turns."""
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


def start_all(clusters: list[Cluster], timeout: float, keep: tuple[str, ...]) -> dict[str, str]:
    """Start every cluster (each has ports of its own: none waits for another's), then wait until every
    chief has ended two timed calls past its checkpoint (the trainer sizes its calls again after the
    first one, which ran on prefetched batches: with slow input that call took seconds, and 1 s turns
    inside it saw no step); stop them all. Not each as soon as it steps: a SCRIPT= job's clusters keep
    TensorFlow's 10 s coordination heartbeat (the script builds its own strategy), and one stopped while
    the others started (a minute under load) was declared dead on its first turn (a cold trial: the
    null's cluster exited 200). A candidate that fails to start (refused, out of memory) is left out
    (name -> why, returned); one of `keep` failing ends the trial."""
    deadline, left, stepping, first_end = time.monotonic() + timeout, {}, set(), {}
    for c in clusters:
        c.start()
    while len(stepping) + len(left) < len(clusters):
        _in_time([c for c in clusters if c.name not in stepping and c.name not in left], deadline)
        for c in clusters:
            if c.name in stepping or _failed(c, keep, left):
                continue
            r = c.reading()
            if r and r.ended > 0 and first_end.setdefault(c.name, r.ended) != r.ended:
                stepping.add(c.name)
        time.sleep(0.2)
    for c in clusters:
        c.signal(signal.SIGSTOP)
    return left


def _failed(c: Cluster, keep: tuple[str, ...], left: dict[str, str]) -> bool:
    """Whether `c` has ended (then in `left`); raises TrialError when it is one of `keep`."""
    if c.name in left:
        return True
    why = c.failed()
    if why and c.name in keep:
        raise TrialError(f"{c.name}: {why}")
    if why:
        left[c.name] = why
    return bool(why)


def _in_time(waiting: list[Cluster], deadline: float) -> None:
    if time.monotonic() > deadline:
        raise TrialError(
            "the trial clusters did not start stepping in time: " + ", ".join(c.name for c in waiting)
        )


class TrialError(RuntimeError):
    """A trial cluster failed (its name and last lines) or never started."""


def run_turns(
    clusters: list[Cluster], turn_s: float, cycles: int, keep: tuple[str, ...], rng: random.Random
) -> dict[str, str]:
    """`cycles` cycles of one turn per cluster, in an order drawn per cycle from `rng` (a fixed rotation
    always ran the null right after the current settings; the tune seeds it anew each time and prints the
    seed); a reading ends each turn. A cluster that fails or whose loss is not finite leaves the rotation
    (name -> why, returned); one of `keep` ends the trial."""
    out = {}
    for _ in range(cycles):
        for c in rng.sample(clusters, len(clusters)):
            if c.name in out:
                continue
            c.signal(signal.SIGCONT)
            start = time.time()
            time.sleep(turn_s)  # the turn itself: the time this cluster runs alone
            reading = c.reading()
            c.signal(signal.SIGSTOP)
            why = c.failed() or (
                f"its loss is {reading.loss} (diverged)"
                if reading and not math.isfinite(reading.loss)
                else ""
            )
            if why and c.name in keep:
                raise TrialError(f"{c.name}: {why}")
            if why:
                out[c.name] = why
            elif reading is not None:
                c.turns.append(Turn(start, time.time(), reading))
    return out
