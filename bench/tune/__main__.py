"""`make tune`: the candidate settings the running job's verdict names, each tried from the job's own
checkpoint against the current settings in interleaved turns, with a plain-vs-plain null; a table,
the winner only when it is beyond the null's spread, written where `make up` reads it (docs/tune.md).

    python -m bench.tune [--project P] [--run-dir D] [--seconds S] [--candidates "NAME=v ..."] [--apply]

The job is paused while the trials run (they need the cores) and continues as it was; with --apply it
restarts with the winner, resuming from its checkpoint. Exit 0 tuned (a winner or none), 2 refused or
failed (one line), the job left running as it was.
"""

from __future__ import annotations

import argparse
import fcntl
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import contract as c
from bench.tune import candidates as cand
from bench.tune import job as job_lib
from bench.tune import table, trial, winner
from monitoring import diagnose, rules, runlist, runs, verdict
from monitoring.prom_client import DEFAULT_URL, Prometheus, PrometheusError

TURN_S = 1.0
HEARTBEAT_SAFE_S = 5.0
"""A SCRIPT= cluster keeps TensorFlow's 10 s coordination heartbeat: no cluster may wait longer than this
between its turns (two cycles' worst gap is 2 (n-1) turns). The built-in loop's trials raise theirs."""
CYCLES = 3
"""Turns per round: a round's rate spans three turns, so a call cut by a turn's end counts once."""
SECONDS = 90.0
"""Default TUNE_SECONDS: the turns' total; with the clusters' start (~1-2 min on 2 cores) the tune of the
default job takes about three minutes."""
MAX_CANDIDATES = 3


def current_verdict(prom: Prometheus, project: str, run: str) -> tuple[int, str, dict[str, str]]:
    """(cluster verdict code, the largest part of the step, the run's recorded settings)."""
    sel = rules.selector(project, run)
    tasks = diagnose.samples({n: prom.query(e) for n, e in diagnose.queries(sel).items()})
    d = verdict.diagnose(tasks)
    shares = {
        "all-reduce": statistics.median([t.allreduce_share or 0 for t in tasks] or [0]),
        "input wait": statistics.median([t.input_share or 0 for t in tasks] or [0]),
        "compute": statistics.median([t.compute_share or 0 for t in tasks] or [0]),
    }
    recorded = runlist.settings(prom, sel).get(run, {})
    return d.cluster.code, max(shares, key=shares.get), recorded


def pick(args, code: int, largest: str, recorded: dict[str, str], script: str) -> list[cand.Candidate]:
    if args.candidates:
        return cand.parse(args.candidates)
    if script:
        return cand.script_candidates(recorded, os.cpu_count() or 1)
    return cand.loop_candidates(recorded, code, largest)[: args.max]


def trial_all(job: job_lib.Job, chosen: list[cand.Candidate], work: Path, args) -> list[trial.Cluster]:
    ckpt = work / "checkpoint"
    job_lib.copy_checkpoint(job, ckpt)
    env = {**job.env, "TF_USE_LEGACY_KERAS": "1"}
    module, margs = (job_lib.WRAPPER, list(job.script)) if job.script else ("trainer", [])
    named = [(table.CURRENT, ()), (table.NULL, ()), *((k.name, k.settings) for k in chosen)]
    clusters = [
        trial.cluster(_dirname(n), env, dict(s), ckpt, work, job.workers, module, margs) for n, s in named
    ]
    for cl, (n, _) in zip(clusters, named, strict=True):
        cl.name = n
    trial.start_all(clusters, timeout=args.start_timeout)
    turn = TURN_S if not job.script else min(TURN_S, HEARTBEAT_SAFE_S / (2 * (len(clusters) - 1)))
    rounds = max(2, int(args.seconds // (turn * CYCLES * len(clusters))))
    for name, why in trial.run_turns(
        clusters, turn, rounds * CYCLES, keep=(table.CURRENT, table.NULL)
    ).items():
        print(f"tune: {name} left out: {why.splitlines()[0]}", flush=True)
        args.failed.add(name)
    return clusters


def _dirname(name: str) -> str:
    return "".join(ch if ch.isalnum() else "_" for ch in name)


def tabulate(clusters: list[trial.Cluster], chosen: list[cand.Candidate]):
    by = {cl.name: cl for cl in clusters}
    base = table.round_rates(by[table.CURRENT].turns, CYCLES)
    current = table.summary(table.CURRENT, by[table.CURRENT].turns, CYCLES, base)
    null = table.summary(table.NULL, by[table.NULL].turns, CYCLES, base)
    rows = [
        table.summary(k.name, by[k.name].turns, CYCLES, base, k.changes_optimisation)
        for k in chosen
        if len(by[k.name].turns) >= CYCLES
    ]
    return current, null, rows


def apply(job: job_lib.Job, args) -> int:
    """Restart the job with the winner: `make down` then `make up` with the job's own settings (the
    winner file on top), resuming from its checkpoint."""
    env = {**os.environ, **job.env, "WORKERS": str(job.workers)}
    make = ["make", "--no-print-directory", f"PROJECT={job.project}"]
    for target in ("down", "up"):
        r = subprocess.run([*make, target], env=env)
        if r.returncode:
            return r.returncode
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.tune", description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default=os.environ.get("PROMETHEUS_URL", DEFAULT_URL))
    p.add_argument("--project", default=c.DEFAULT_PROJECT)
    p.add_argument("--run", default="")
    p.add_argument("--run-dir", type=Path, default=Path(".run"))
    p.add_argument("--seconds", type=float, default=SECONDS, help="the turns' total (TUNE_SECONDS)")
    p.add_argument("--candidates", default="", help='TUNE_CANDIDATES: "NAME=value NAME=value+NAME=value"')
    p.add_argument("--max", type=int, default=MAX_CANDIDATES)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--apply", action="store_true", help="APPLY=1: restart the job with the winner")
    args = p.parse_args(argv)
    args.failed = set()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    lock = open(args.run_dir / ".tune.lock", "w")  # noqa: SIM115 - held until the process exits
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        print(
            f"tune: another make tune of project {args.project} is running ({args.run_dir}/.tune.lock)",
            file=sys.stderr,
        )
        return 2
    try:
        return tune(args)
    except (job_lib.JobError, trial.TrialError, PrometheusError, ValueError) as err:
        print(f"tune: {str(err).splitlines()[0]}", file=sys.stderr)
        if isinstance(err, trial.TrialError) and len(str(err).splitlines()) > 1:
            print("\n".join(str(err).splitlines()[1:]), file=sys.stderr)
        return 2


def tune(args) -> int:
    started = time.monotonic()
    job = job_lib.find(args.project)
    prom = Prometheus(url=args.prometheus, timeout=20.0)
    run = runs.resolve(prom, args.project, args.run)
    if not run:
        raise job_lib.JobError(f"project {args.project} has no run in Prometheus at {args.prometheus}")
    code, largest, recorded = current_verdict(prom, args.project, run)
    chosen = pick(args, code, largest, recorded, job.script)
    if not chosen:
        raise ValueError("no candidate setting applies to this job (docs/tune.md)")
    print(
        f"tune: run {run}, verdict {verdict.NAMES.get(code, code)}, largest part {largest}; trying "
        + ", ".join(k.name for k in chosen)
        + f" against the current settings and a null, {args.seconds:.0f} s of turns",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="tune-", dir=args.run_dir))
    clusters: list[trial.Cluster] = []
    job_lib.pause(job)
    try:
        clusters = trial_all(job, chosen, work, args)
    finally:
        for cl in clusters:
            cl.stop()
        shutil.rmtree(work, ignore_errors=True)
        job_lib.unpause(job)
    current, null, rows = tabulate(clusters, chosen)
    best = table.winner(rows, null)
    elapsed = time.monotonic() - started
    print(table.render(rows, current, null, best))
    winner.record(args.run_dir, run, rows, null, best, elapsed)
    if best is not None:
        k = next(k for k in chosen if k.name == best.name)
        if not cand.applies(k):
            print(
                f"tune: {best.name} is a process setting: measured here, make up does not set it (docs/tune.md)"
            )
            return 0
        why = f"make tune {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on run {run}: {best.name} {best.median:.2f}x steps/s"
        path = winner.write(args.run_dir, k.settings, why, k.changes_optimisation)
        print(f"tune: wrote {path}; the next make up uses it (undo: rm {path})")
    print(
        f"tune: took {elapsed:.0f} s; the job "
        + ("restarts with the winner" if best and args.apply else "continues as it was"),
        flush=True,
    )
    return apply(job, args) if best is not None and args.apply else 0


if __name__ == "__main__":
    sys.exit(main())
