"""What observing a user's script costs (`make bench`): a user's `model.fit` script's steps/s under
the SCRIPT= wrapper (trainer.script.wrapper: hooks, every step's split marked in its graph, metrics
served and scraped, as a team gets it by default) / the same script run plainly, each a local chief +
worker cluster. Steps/s comes from the script's own epoch timing lines (tests/scripts/fit_cnn.py
prints each epoch's seconds and CPU seconds); the first epoch (tracing) is left out. The script runs
its mnist model (~1 MB of weights all-reduced a step), batch 32 per replica, with Keras' epoch lines.

At two steps_per_execution, each in rounds of its own: 1 (Keras' default, what most scripts run:
the hooks' per-call work is paid every step) and 10 (spread over ten). A Prometheus (bench/scrape.py)
scrapes the observed tasks' metrics servers at the stack's interval (a cluster running one turn in
three is scraped three times as often per second of its own running as in a stack: the scrape
weighs more here, not less).

Time-sliced: every round starts one cluster per setting, lets them trace together, then runs them in
turns (SIGSTOP/SIGCONT of their tasks, `--slice` seconds each, one cluster at a time) until one
finishes; each cluster's rate is its epochs over the time it was running. Why: this machine's own
speed moves by up to 2x from one second to the next with nothing of ours running (a pure-Python loop
on an idle machine: 107-208 ms a lap; with both vCPUs busy a steady ~210 ms: the vCPUs share a
core with each other or a neighbour), so runs one after another (as this bench did, mirrored ABBA)
measured the machine (round ratios 0.83-1.16, a plain run 37.8-60.7 steps/s); turns of half a second
give every setting the same machine. Each resume refills caches; whatever that costs, every setting
pays it alike (the rates are not comparable with an unsliced run's). Plain against plain
(`plain-again`, run by default) measures the method's own spread beside every figure.

    python -m bench.script_overhead [--rounds 5] [--workers 1] [--epochs 8] [--steps-per-epoch 100]
                                    [--steps-per-execution 1,10] [--slice 0.5] [--no-scrape]
                                    [--variants observed,no-marks,no-server,plain-again]

Variants besides `observed` (as a team gets it) take parts away, to show what each costs: no-marks
(TRAINER_SPLIT_MARKS=0: the hooks and the metrics server, no split), no-server (no marks and no
metrics server: the hooks alone), plain-again (a second plain cluster: the method's null).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from bench import scrape
from monitoring.tune.table import active_seconds
from trainer.host import observe_config

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "fit_cnn.py"
SCRIPT_ARGS = "--model mnist --batch 32 --no-drop-remainder --no-prefetch --verbose 2".split()
"""The script's arguments besides the epochs and steps this bench sets."""
EPOCH = re.compile(r"^\[chief\] epoch (\d+) done, loss [\d.]+, ([\d.]+) s, ([\d.]+) s CPU$")
PID = re.compile(r"^\[launch\] \S+: pid (\d+), ([\d.]+):(\d+), (?:metrics http://([\d.]+:\d+)/metrics)?")
TARGET = 0.97
EPOCHS = 8
"""Epochs per cluster by default: the first traces, the others are counted."""
VARIANTS = {
    "observed": {},
    "no-marks": {"TRAINER_SPLIT_MARKS": "0"},
    "no-server": {"TRAINER_SPLIT_MARKS": "0", "TRAINER_METRICS_PORT": "0"},
    "plain-again": {},
}
"""The observed runs' extra environment, by name (`observed`: the wrapper's defaults; `plain-again`:
a second plain cluster, the method's null)."""
SERVED = ("observed", "no-marks")
"""The variants whose tasks serve metrics: what the Prometheus scrapes."""


@dataclass(frozen=True)
class Run:
    rate: float
    """The chief's steps/s over the epochs counted."""
    cpu_ms: float
    """The chief process's CPU ms per step (all threads) over the same epochs."""


def _environment(args: argparse.Namespace, extra: dict[str, str] | None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        TRAINER_SPLIT_PERIOD_S=str(args.period),
        **(extra or {}),
    )
    return env


class Cluster:
    """One setting's local cluster (bench.launch), its output read as it comes: the tasks' pids (to
    stop and resume them; the launcher keeps running, so a line arrives when it is printed) and when
    each of the chief's epoch lines arrived."""

    def __init__(self, variant: str, args: argparse.Namespace) -> None:
        module = "bench.plain_script" if variant.startswith("plain") else "trainer.script.wrapper"
        cmd = [
            sys.executable,
            "-m",
            "bench.launch",
            "--workers",
            str(args.workers),
            "--module",
            module,
            str(SCRIPT),
            *SCRIPT_ARGS,
            *("--epochs", str(args.epochs), "--steps-per-epoch", str(args.steps_per_epoch)),
            *("--steps-per-execution", str(args.steps_per_execution)),
        ]
        self.variant, self.tasks = variant, args.workers + 1
        self.pids: list[int] = []
        self.ports: list[tuple[str, int]] = []
        self.metrics: list[str] = []
        """host:port of each task's metrics server (scraped when the variant serves them)."""
        self.epochs: list[tuple[float, float]] = []
        """(arrival time, CPU seconds) of every epoch line after the first (tracing) one."""
        self.log: list[str] = []
        self.proc = subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_environment(args, VARIANTS.get(variant)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            now = time.monotonic()
            self.log.append(line)
            if m := PID.match(line):
                self.pids.append(int(m.group(1)))
                self.ports.append((m.group(2), int(m.group(3))))
                self.metrics += [m.group(4)] if m.group(4) else []
            elif (m := EPOCH.match(line.rstrip("\n"))) and int(m.group(1)) > 0:
                self.epochs.append((now, float(m.group(3))))

    def listening(self) -> bool:
        """Every task's server has bound its cluster port (the next cluster may draw ports then)."""
        return len(self.ports) == self.tasks and all(_accepts(addr) for addr in self.ports)

    def ready(self) -> bool:
        """Every task started and the chief's tracing epoch done."""
        return len(self.pids) == self.tasks and bool(self.epochs)

    def signal(self, sig: int) -> None:
        for pid in self.pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)

    def check(self, *, running: bool = False) -> None:
        """Raise, with the cluster's last lines, if it failed (or, `running`: if it ended at all)."""
        code = self.proc.poll()
        if code or (running and code is not None):
            raise RuntimeError(
                f"{self.variant} exited {code} (before its turns: {running}):\n{''.join(self.log[-40:])}"
            )


def _accepts(addr: tuple[str, int]) -> bool:
    with contextlib.suppress(OSError), socket.create_connection(addr, timeout=1):
        return True
    return False


def start_one_after_another(variants: list[str], args: argparse.Namespace) -> list[Cluster]:
    """The clusters, each started once the one before has bound its ports: a launcher draws free
    ports and frees them for its tasks to bind, so two launchers started together could draw the same
    port (a round of `make bench` (f) died "Could not start gRPC server" so, 2026-12-02)."""
    clusters: list[Cluster] = []
    for v in variants:
        for c in clusters[-1:]:
            while not c.listening():
                c.check(running=True)
                time.sleep(0.1)
        clusters.append(Cluster(v, args))
    return clusters


def sliced_run(
    epochs: list[tuple[float, float]], turns: list[tuple[float, float]], end: float, steps_per_epoch: int
) -> Run:
    """A cluster's rate and CPU per step over the epochs that ended during its turns: from the first
    such epoch line to the last, over the time it ran between them."""
    inside = [(t, cpu) for t, cpu in epochs if turns and turns[0][0] <= t <= end]
    if len(inside) < 2:
        raise RuntimeError(f"{len(inside)} epoch lines during the turns: raise --epochs")
    steps = steps_per_epoch * (len(inside) - 1)
    active = active_seconds(turns, inside[0][0], inside[-1][0])
    return Run(steps / active, 1e3 * sum(cpu for _, cpu in inside[1:]) / steps)


def one_round(
    order: list[str], r: int, args: argparse.Namespace, prometheus: scrape.NoScrape
) -> dict[str, Run]:
    """Round r: one cluster per setting, traced together, then run in turns, the order rotated by r;
    the Prometheus scrapes the clusters whose tasks serve metrics while they run."""
    order = order[r % len(order) :] + order[: r % len(order)]
    clusters = start_one_after_another(order, args)
    turns: dict[str, list[tuple[float, float]]] = {v: [] for v in order}
    try:
        while not all(c.ready() for c in clusters):
            for c in clusters:
                c.check(running=True)  # one that ended before its tracing epoch would never be ready
            time.sleep(0.05)
        prometheus.targets([a for c in clusters if c.variant in SERVED for a in c.metrics])
        for c in clusters:
            c.signal(signal.SIGSTOP)
        turn = 0
        while all(c.proc.poll() is None for c in clusters):
            c = clusters[turn % len(clusters)]
            turn += 1
            c.signal(signal.SIGCONT)
            start = time.monotonic()
            time.sleep(args.slice)
            c.signal(signal.SIGSTOP)
            turns[c.variant].append((start, time.monotonic()))
        end = time.monotonic()
    finally:
        prometheus.targets([])
        for c in clusters:
            c.signal(signal.SIGCONT)
    for c in clusters:
        c.proc.wait(timeout=600)
        c.reader.join(timeout=10)
        c.check()
    runs = {c.variant: sliced_run(c.epochs, turns[c.variant], end, args.steps_per_epoch) for c in clusters}
    for v, x in runs.items():
        print(f"  {v}: {x.rate:.1f} steps/s, {x.cpu_ms:.1f} ms CPU/step ({len(turns[v])} turns)", flush=True)
    return runs


def spread(values: list[float]) -> str:
    return f"min {min(values):.3f} / median {statistics.median(values):.3f} / max {max(values):.3f}"


def summary(k: int, runs: dict[str, list[Run]], variants: list[str], said: str) -> list[str]:
    """The result lines of one steps_per_execution: each variant / plain, with the load now."""
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    plain, rounds, lines = runs["plain"], len(runs["plain"]), []
    for v in variants:
        rate = [x.rate / p.rate for x, p in zip(runs[v], plain)]
        cpu = [x.cpu_ms / p.cpu_ms for x, p in zip(runs[v], plain)]
        name = "user fit script observed" if v == "observed" else f"variant {v}"
        lines.append(
            f"(f) steps_per_execution {k}: {name} / plain steps/s over {rounds} time-sliced rounds: {spread(rate)}"
            + (f" (target median >= {TARGET})" if v == "observed" else "")
            + f"; the chief's CPU per step / plain's: {spread(cpu)}"
            + f"; plain {spread([p.rate for p in plain])} steps/s; {said}; load {load}"
        )
    return lines


def measure(k: int, variants: list[str], args: argparse.Namespace, prometheus: scrape.NoScrape) -> list[str]:
    """Every round at steps_per_execution k; the result lines."""
    args = argparse.Namespace(**{**vars(args), "steps_per_execution": k})
    runs: dict[str, list[Run]] = {"plain": [], **{v: [] for v in variants}}
    for r in range(args.rounds):
        for v, run in one_round(["plain", *variants], r, args, prometheus).items():
            runs[v].append(run)
        plain = runs["plain"][-1]
        print(
            f"script-overhead steps_per_execution {k} round {r + 1}/{args.rounds} (in turns of {args.slice} s): "
            f"plain {plain.rate:.1f} steps/s {plain.cpu_ms:.1f} ms CPU/step, "
            + ", ".join(
                f"{v} {x.rate:.1f} steps/s (ratio {x.rate / plain.rate:.3f}) {x.cpu_ms:.1f} ms CPU/step"
                for v in variants
                for x in [runs[v][-1]]
            )
            + f"; {prometheus.scrapes()} scrapes so far",
            flush=True,
        )
    return summary(k, runs, variants, prometheus.said)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.script_overhead", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--epochs", type=int, default=EPOCHS, help="per cluster; the turns end when one finishes")
    p.add_argument("--steps-per-epoch", type=int, default=100)
    p.add_argument(
        "--steps-per-execution",
        default="1,10",
        help="the script's steps_per_execution, comma-separated, each measured in its own rounds "
        "(default %(default)s: Keras' default, and ten steps per call)",
    )
    p.add_argument(
        "--slice", type=float, default=0.5, help="seconds of each cluster's turn (default %(default)s)"
    )
    p.add_argument(
        "--period",
        type=float,
        default=observe_config.ObserveConfig().period_s,
        help="TRAINER_SPLIT_PERIOD_S of the observed runs (default: the wrapper's, no profiler windows)",
    )
    p.add_argument(
        "--variants",
        default="observed,plain-again",
        help=f"runs beside plain in every round, comma-separated, from {', '.join(VARIANTS)} "
        "(default %(default)s: plain-again is the method's null)",
    )
    p.add_argument(
        "--no-scrape", action="store_true", help="no Prometheus (default: one scrapes the observed tasks)"
    )
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    try:
        per_call = [int(k) for k in args.steps_per_execution.split(",") if k]
    except ValueError:
        per_call = []
    if args.rounds < 1 or args.epochs < 4 or args.slice <= 0:
        p.error("--rounds must be 1 or more, --epochs 4 or more (the first is tracing) and --slice above 0")
    if not variants or set(variants) - set(VARIANTS):
        p.error(f"--variants {args.variants!r}: choose from {', '.join(VARIANTS)}")
    if not per_call or min(per_call) < 1:
        p.error(
            f"--steps-per-execution {args.steps_per_execution!r}: whole numbers of 1 or more, comma-separated"
        )
    # SIGTERM runs the finally blocks (the clusters resumed, the Prometheus stopped and its folder removed)
    previous = signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    prometheus = scrape.NoScrape("unscraped (--no-scrape)") if args.no_scrape else scrape.start()
    try:
        lines = [line for k in per_call for line in measure(k, variants, args, prometheus)]
    finally:
        prometheus.close()
        signal.signal(signal.SIGTERM, previous)
    print("\n".join(lines), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
