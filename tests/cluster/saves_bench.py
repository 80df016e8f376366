"""What saves cost the loop (issue 49): steps/s and the share of the wall clock outside steps, per arm,
side by side in rounds on one machine, a local chief + N workers of the cnn task. Not a test: a
measurement, its rows go to docs/measurements.md.

    .venv/bin/python -m tests.cluster.saves_bench --rounds 3 [--steps 1500] [--before /work/main]

Arms (interleaved, each round runs every arm once): `none` (--save-every 0), `async` (this tree,
--save-every 100, --save-seconds 0), `default` (this tree's defaults), and `sync` (--before TREE: the
same job on a tree from before asynchronous saves, its defaults). Outside steps is `make status`'s
figure, 1 - steps/s x mean step time, over the window from the first scrape past --warmup steps to the
last before the end, from every task's /metrics, and the mean of the tasks.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

import contract as c
from bench.launch import free_ports

ROOT = Path(__file__).resolve().parents[2]
SERIES = {
    "steps": c.STEPS.name,
    "sum": c.STEP.sum,
    "count": c.STEP.count,
    "last": c.LAST_STEP_TIME.name,
    "blocked": c.CHECKPOINT_BLOCKED.name,
}


def scrape(port: int) -> dict[str, float] | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
    except OSError:
        return None
    out = {}
    for key, name in SERIES.items():
        m = re.search(rf"^{name}{{[^}}]*}} (\S+)$", text, re.M)
        if m:
            out[key] = float(m.group(1))
    return out if "steps" in out else None


def run(tree: Path, args: list[str], workers: int, steps: int, warmup: int) -> dict[str, float]:
    ports = _consecutive(workers + 1)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    cmd = [str(ROOT / ".venv/bin/python"), "-m", "bench.launch", "--workers", str(workers)]
    cmd += [
        "--metrics-port",
        str(ports[0]),
        "--task",
        "cnn",
        "--steps",
        str(steps),
        "--metrics-linger",
        "3",
        *args,
    ]
    load = os.getloadavg()[0]
    scratch = tempfile.TemporaryDirectory(prefix="saves-bench-")
    cmd += ["--checkpoint-dir", os.path.join(scratch.name, "ckpt")]
    env["TMPDIR"] = scratch.name
    proc = subprocess.Popen(
        cmd,
        cwd=tree,
        env={**env, "TF_CPP_MIN_LOG_LEVEL": "2"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.STDOUT,
    )
    first: dict[int, dict] = {}
    last: dict[int, dict] = {}
    while proc.poll() is None:
        for p in ports:
            got = scrape(p)
            if got is None:
                continue
            if p not in first and got["steps"] >= warmup:
                first[p] = got
            if got["steps"] < steps:  # the end's own save and export are not the loop's
                last[p] = got
        time.sleep(0.25)
    scratch.cleanup()
    assert proc.returncode == 0, f"{tree}: exit {proc.returncode}"
    rates, outside, blocked = [], [], []
    for p in ports:
        a, b = first[p], last[p]
        dt = b["last"] - a["last"]
        rate = (b["steps"] - a["steps"]) / dt
        mean_step = (b["sum"] - a["sum"]) / (b["count"] - a["count"])
        rates.append(rate)
        outside.append(1 - rate * mean_step)
        blocked.append((b.get("blocked", 0) - a.get("blocked", 0)) / dt)
    return {
        "steps/s": statistics.mean(rates),
        "outside": statistics.mean(outside),
        "blocked": statistics.mean(blocked),
        "load": load,
    }


def _consecutive(n: int) -> list[int]:
    while True:
        base = free_ports(1)[0]
        if base + n < 65536 and all(_free(base + i) for i in range(n)):
            return [base + i for i in range(n)]


def _free(port: int) -> bool:
    import socket

    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--workers", type=int, default=c.DEFAULT_WORKERS)
    p.add_argument("--steps", type=int, default=1500)
    p.add_argument("--warmup", type=int, default=200)
    p.add_argument("--before", type=Path, help="a tree from before asynchronous saves: the `sync` arm")
    p.add_argument("--arms", default="none,async,default,sync")
    ns = p.parse_args(argv)
    arms = {
        "none": (ROOT, ["--save-every", "0", "--save-seconds", "0"]),
        "async": (ROOT, ["--save-every", "100", "--save-seconds", "0"]),
        "default": (ROOT, []),
        "sync": (ns.before, ["--save-every", "100"]),
    }
    chosen = [a for a in ns.arms.split(",") if a != "sync" or ns.before]
    rows: dict[str, list[dict]] = {a: [] for a in chosen}
    for r in range(ns.rounds):
        for arm in chosen:
            tree, args = arms[arm]
            got = run(tree, args, ns.workers, ns.steps, ns.warmup)
            rows[arm].append(got)
            print(
                f"round {r + 1} {arm:8s} {got['steps/s']:6.1f} steps/s  outside {got['outside']:6.1%}  "
                f"blocked {got['blocked']:6.2%}  load {got['load']:.1f}",
                flush=True,
            )
    print("arm       steps/s (median, min-max)    outside steps (median, min-max)   blocked on saves")
    for arm, got in rows.items():
        rate = [g["steps/s"] for g in got]
        out = [g["outside"] for g in got]
        blk = [g["blocked"] for g in got]
        print(
            f"{arm:8s}  {statistics.median(rate):5.1f} ({min(rate):.1f}-{max(rate):.1f})"
            f"            {statistics.median(out):6.1%} ({min(out):.1%}-{max(out):.1%})"
            f"             {statistics.median(blk):.2%}"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
