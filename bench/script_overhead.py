"""What observing a user's script costs (`make bench`): a user's `model.fit` script's steps/s under
the SCRIPT= wrapper (trainer.run_script: hooks, every step's split marked in its graph, metrics
served, as a team gets it by default) / the same script run plainly, both as a local chief + workers cluster, rounds interleaved
(each round runs every setting twice, mirrored: plain, observed, observed, plain; the next round
rotated). Steps/s comes from the script's own epoch timing line (tests/scripts/fit_cnn.py prints
each epoch's seconds); the first epoch (tracing) is left out.

Why mirrored: one cluster's rate differs from the next's by far more than what is measured (six
plain runs in a row, chief + 2 workers on 2 cores: 26.1-35.1 steps/s), and a drift within a round
(or a slow-fast alternation) favours whoever runs at the favoured positions; each setting's mean over
positions i and n-1-i cancels a linear drift and a period-2 pattern. Why chief + 1 worker by default:
one task per core, as in a deployment; three TF processes on two cores measured the scheduler (round
ratios 0.79-1.62 for the same wrapper).

    python -m bench.script_overhead [--rounds 5] [--workers 1] [--epochs 8] [--steps-per-epoch 100]
                                    [--variants observed,no-marks,no-server]

Variants besides `observed` (as a team gets it) take parts away, to show what each costs: no-marks
(TRAINER_SPLIT_MARKS=0: the hooks and the metrics server, no split), no-server (no marks and no
metrics server: the hooks alone). Each runs in every round, interleaved with the others, the order
rotated each round (a load that drifts during a round would favour whoever runs last).
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from trainer.observe.config import ObserveConfig

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "fit_cnn.py"
EPOCH = re.compile(r"^\[chief\] epoch (\d+) done, loss [\d.]+, ([\d.]+) s, ([\d.]+) s CPU$", re.M)
TARGET = 0.97
VARIANTS = {
    "observed": {},
    "no-marks": {"TRAINER_SPLIT_MARKS": "0"},
    "no-server": {"TRAINER_SPLIT_MARKS": "0", "TRAINER_METRICS_PORT": "0"},
}
"""The observed runs' extra environment, by name (`observed`: the wrapper's defaults)."""


@dataclass(frozen=True)
class Run:
    rate: float
    """The chief's steps/s over every epoch but the first."""
    cpu_ms: float
    """The chief process's CPU ms per step (all threads) over the same epochs: what observing costs
    whatever else shares the cores, which moves the rate on a loaded machine."""


def measure(stdout: str, steps_per_epoch: int) -> Run:
    epochs = [(float(s), float(cpu)) for epoch, s, cpu in EPOCH.findall(stdout) if int(epoch) > 0]
    if not epochs:
        raise RuntimeError(f"no epoch timing lines in the run's output:\n{stdout[-2000:]}")
    steps = steps_per_epoch * len(epochs)
    return Run(steps / sum(s for s, _ in epochs), 1e3 * sum(c for _, c in epochs) / steps)


def one_run(module: str, args: argparse.Namespace, extra: dict[str, str] | None = None) -> Run:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    env.update(
        TF_CPP_MIN_LOG_LEVEL="2",
        EPOCHS=str(args.epochs),
        STEPS_PER_EPOCH=str(args.steps_per_epoch),
        STEPS_PER_EXECUTION=str(args.steps_per_execution),
        TRAINER_SPLIT_PERIOD_S=str(args.period),
        **(extra or {}),
    )
    cmd = [
        sys.executable,
        "-m",
        "bench.launch",
        "--workers",
        str(args.workers),
        "--module",
        module,
        str(SCRIPT),
    ]
    out = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=1200, check=False)
    if out.returncode:
        raise RuntimeError(f"{module} exited {out.returncode}:\n{out.stdout[-2000:]}")
    return measure(out.stdout, args.steps_per_epoch)


def mirrored(order: list[str], r: int) -> list[str]:
    """Round r's runs: the settings rotated by r, then the same in reverse (ABBA)."""
    rotated = order[r % len(order) :] + order[: r % len(order)]
    return rotated + rotated[::-1]


def one_round(order: list[str], r: int, args: argparse.Namespace) -> dict[str, Run]:
    """Each setting's mean over its two runs of round r."""
    runs: dict[str, list[Run]] = {v: [] for v in order}
    for v in mirrored(order, r):
        module = "bench.plain_script" if v == "plain" else "trainer.run_script"
        runs[v].append(one_run(module, args, VARIANTS.get(v)))
        print(f"  {v}: {runs[v][-1].rate:.1f} steps/s, {runs[v][-1].cpu_ms:.1f} ms CPU/step", flush=True)
    return {
        v: Run(statistics.fmean(x.rate for x in pair), statistics.fmean(x.cpu_ms for x in pair))
        for v, pair in runs.items()
    }


def spread(values: list[float]) -> str:
    return f"min {min(values):.3f} / median {statistics.median(values):.3f} / max {max(values):.3f}"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.script_overhead", description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--steps-per-epoch", type=int, default=100)
    p.add_argument("--steps-per-execution", type=int, default=10)
    p.add_argument(
        "--period",
        type=float,
        default=ObserveConfig().period_s,
        help="TRAINER_SPLIT_PERIOD_S of the observed runs (default: the wrapper's, no profiler windows)",
    )
    p.add_argument(
        "--variants",
        default="observed",
        help=f"observed runs per round, comma-separated, from {', '.join(VARIANTS)}",
    )
    args = p.parse_args(argv)
    variants = [v for v in args.variants.split(",") if v]
    if args.rounds < 1 or args.epochs < 2:
        p.error("--rounds must be 1 or more and --epochs 2 or more (the first epoch is not counted)")
    if not variants or set(variants) - set(VARIANTS):
        p.error(f"--variants {args.variants!r}: choose from {', '.join(VARIANTS)}")
    runs: dict[str, list[Run]] = {"plain": [], **{v: [] for v in variants}}
    for r in range(args.rounds):
        for v, pair in one_round(["plain", *variants], r, args).items():
            runs[v].append(pair)
        plain = runs["plain"][-1]
        print(
            f"script-overhead round {r + 1}/{args.rounds} (two runs each, mean): plain {plain.rate:.1f} steps/s "
            f"{plain.cpu_ms:.1f} ms CPU/step, "
            + ", ".join(
                f"{v} {x.rate:.1f} steps/s (ratio {x.rate / plain.rate:.3f}) {x.cpu_ms:.1f} ms CPU/step"
                for v in variants
                for x in [runs[v][-1]]
            ),
            flush=True,
        )
    with open("/proc/loadavg") as f:
        load = " ".join(f.read().split()[:3])
    plain = runs["plain"]
    for v in variants:
        rate = [x.rate / p.rate for x, p in zip(runs[v], plain)]
        cpu = [x.cpu_ms / p.cpu_ms for x, p in zip(runs[v], plain)]
        name = "(f) user fit script observed" if v == "observed" else f"(f) variant {v}"
        print(
            f"{name} / plain steps/s over {args.rounds} mirrored rounds: {spread(rate)}"
            + (f" (target median >= {TARGET})" if v == "observed" else "")
            + f"; the chief's CPU per step / plain's: {spread(cpu)}"
            + f"; plain {spread([p.rate for p in plain])} steps/s; load {load}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
