"""`make tune`: the candidate settings the running job's verdict names, each tried from the job's own
checkpoint against the current settings in interleaved turns, with a plain-vs-plain null; a table,
the winner only when it is beyond the null's spread, written where `make up` reads it (docs/tune.md).

    python -m monitoring.tune [--project P] [--run-dir D] [--seconds S] [--candidates "NAME=v ..."] [--apply]

The job is paused while the trials run (they need the cores), then continues: its tasks restart from its
last checkpoint (TensorFlow's heartbeats stopped while it was paused); with --apply it restarts with the
winner, resuming from its checkpoint. Exit 0 tuned (a winner or none), 2 refused or
failed (one line), the job left running as it was.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import contract as c
from compose import lifecycle
from compose.engine import Engine, EngineError
from compose.projectlock import LockHeld, ProjectLock
from compose.settings import Settings
from monitoring import diagnose, runs
from monitoring.prom.client import DEFAULT_URL, Prometheus, PrometheusError
from monitoring.rules import recording as rules
from monitoring.tune import candidates as cand
from monitoring.tune import incontainer, reference, table, trial, winner
from monitoring.tune import job as job_lib
from monitoring.verdicts import verdict

TURN_S = 1.0
HEARTBEAT_SAFE_S = 5.0
"""A SCRIPT= cluster keeps TensorFlow's 10 s coordination heartbeat: no cluster may wait longer than this
between its turns (two cycles' worst gap is 2 (n-1) turns). The built-in loop's trials raise theirs."""
CYCLES = 3
"""Turns per round: a round's rate spans three turns, so a call cut by a turn's end counts once."""
MAX_TURN_S = 8.0
"""The longest turn of the built-in loop's trials: turns double up to it while a cluster ends no call in
its turns (its calls outlast them: at load 34 the current settings' cluster had "no rounds", and the
tune said "no better setting found" having measured nothing). A SCRIPT= job's stay within
HEARTBEAT_SAFE_S."""
SECONDS = 90.0
"""Default TUNE_SECONDS: the turns' total; with the clusters' start (~1-2 min on 2 cores) the tune of the
default job takes about three minutes."""
MAX_CANDIDATES = 3
RESUMES = "its tasks restart: TensorFlow's heartbeats stopped while it was paused"
"""Why a job paused longer than its heartbeat timeout (10 s) goes on from its checkpoint, not its step."""
ROOT = Path(__file__).resolve().parents[2]


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
    recorded = runs.settings(prom, sel).get(run, {})
    return d.cluster.code, max(shares, key=shares.get), recorded


def refuse_finished(code: int, project: str) -> None:
    """A finished job whose containers still serve their last metrics (METRICS_LINGER) is not tuned:
    its trials would train past its end, and nothing would take the winner."""
    if code == verdict.FINISHED:
        raise job_lib.JobError(
            f"project {project}'s job has finished: nothing to tune (make up STEPS=<more> trains on; then make tune)"
        )


def pick(args, code: int, largest: str, recorded: dict[str, str], script: str) -> list[cand.Candidate]:
    if args.candidates:
        return cand.parse(args.candidates)
    if script:
        return cand.script_candidates(recorded, os.cpu_count() or 1)
    return cand.loop_candidates(recorded, code, largest)[: args.max]


def trial_all(job: job_lib.Job, chosen: list[cand.Candidate], args, clusters: list[trial.Cluster]) -> None:
    """Trial every setting where the job runs (monitoring/tune/incontainer.py); `clusters` gets each
    cluster as it is made, so the caller stops every one that started whatever fails."""
    eng = Engine()
    tasks = incontainer.tasks(job.containers, eng)
    named = [(table.CURRENT, ()), (table.NULL, ()), *((k.name, k.settings) for k in chosen)]
    volumes = incontainer.copies(tasks, len(named), job.project, eng)
    for i, (n, s) in enumerate(named):
        clusters.append(incontainer.Cluster(n, i, tasks, dict(s), volumes[i], job.project, eng))
    keep = (table.CURRENT, table.NULL)
    left = trial.start_all(clusters, args.start_timeout, keep)
    running = [cl for cl in clusters if cl.name not in left]
    turn = TURN_S if not job.script else min(TURN_S, HEARTBEAT_SAFE_S / (2 * (len(running) - 1)))
    rounds = max(2, int(args.seconds // (turn * CYCLES * len(running))))
    left |= trial.run_turns(running, turn, rounds * CYCLES, keep, args.rng)
    longest = turn if job.script else MAX_TURN_S
    turn = longer_turns(running, turn, longest, rounds * CYCLES, keep, left, args.rng)
    measured(running, left, turn)
    for name, why in left.items():
        print(f"tune: {name} left out: {why.splitlines()[0]}", flush=True)
        args.failed.add(name)


def unmeasured(clusters: list[trial.Cluster], left: dict[str, str]) -> list[str]:
    """The current settings or the null, if it has no round's rate: no call of its ended inside a round
    (a candidate's missing rate only means it cannot win)."""
    return [
        cl.name
        for cl in clusters
        if cl.name in (table.CURRENT, table.NULL)
        and cl.name not in left
        and not table.round_rates(cl.turns, CYCLES)
    ]


def longer_turns(
    running: list[trial.Cluster],
    turn: float,
    longest: float,
    turns: int,
    keep: tuple[str, ...],
    left: dict,
    rng: random.Random,
) -> float:
    """While the current settings or the null has no round's rate, every cluster's turns again, each
    twice as long (up to `longest`): a call longer than a turn ends in none of a round's readings. The
    turn used, returned."""
    while (short := unmeasured(running, left)) and turn < longest:
        turn = min(2 * turn, longest)
        print(
            f"tune: {', '.join(short)}: no call ended within the turns; again with {turn:g} s turns",
            flush=True,
        )
        for cl in running:
            cl.turns.clear()
        left |= trial.run_turns([cl for cl in running if cl.name not in left], turn, turns, keep, rng)
    return turn


def measured(running: list[trial.Cluster], left: dict[str, str], turn: float) -> None:
    """The current settings and the null have a rate in at least one round, or nothing is judged: a table
    of "no rounds" would read as "no better setting found"."""
    if missing := unmeasured(running, left):
        raise trial.TrialError(
            f"{', '.join(missing)}: no call ended within its {turn:g} s turns, so nothing was measured (its"
            " calls outlast the turns on this machine now): make tune again when the machine is less busy"
        )


def tabulate(clusters: list[trial.Cluster], chosen: list[cand.Candidate], failed: set[str]):
    """The current settings', the null's and each candidate's rows; one that crashed or diverged has none:
    it cannot win."""
    by = {cl.name: cl for cl in clusters}
    base = table.round_rates(by[table.CURRENT].turns, CYCLES)
    current = table.summary(table.CURRENT, by[table.CURRENT].turns, CYCLES, base)
    null = table.summary(table.NULL, by[table.NULL].turns, CYCLES, base)
    rows = [
        table.summary(k.name, by[k.name].turns, CYCLES, base, k.changes_optimisation)
        for k in chosen
        if k.name not in failed and len(by[k.name].turns) >= CYCLES
    ]
    return current, null, rows


def apply(args) -> int:
    """Restart the job with the winner at once (compose/lifecycle.py's apply_tuned, under this tune's
    lock): every task saves the same step and stops, and `make up` starts it again with its own knobs but
    the winner's, resuming from that save, at the size it has now."""
    for sig in (signal.SIGTERM, signal.SIGHUP):  # the job is unpaused: no unwinding to do, stop with it
        signal.signal(sig, signal.SIG_DFL)
    environ = {
        **os.environ,
        "RUN_DIR": os.path.relpath(args.run_dir.resolve(), ROOT),
        "PROJECT": args.project,
    }
    try:
        return lifecycle.apply_tuned(Settings.parse(environ), Engine(), environ)
    except (lifecycle.Refused, ValueError, EngineError) as err:
        print(f"tune: {err}", file=sys.stderr)
        return 2
    except subprocess.CalledProcessError as err:
        return err.returncode or 1


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m monitoring.tune", description=__doc__.splitlines()[0])
    p.add_argument("--prometheus", default=os.environ.get("PROMETHEUS_URL", DEFAULT_URL))
    p.add_argument("--project", default=c.DEFAULT_PROJECT)
    p.add_argument("--run", default="")
    p.add_argument("--run-dir", type=Path, default=Path(".run"))
    p.add_argument("--seconds", type=float, default=SECONDS, help="the turns' total (TUNE_SECONDS)")
    p.add_argument("--candidates", default="", help='TUNE_CANDIDATES: "NAME=value NAME=value+NAME=value"')
    p.add_argument("--max", type=int, default=MAX_CANDIDATES)
    p.add_argument("--start-timeout", type=float, default=300.0)
    p.add_argument("--apply", action="store_true", help="APPLY=1: restart the job with the winner")
    p.add_argument(
        "--restart-ok",
        action="store_true",
        help="TUNE_RESTART_OK=1: tune a SCRIPT= job that keeps no checkpoint (it trains again from its start)",
    )
    args = p.parse_args(argv)
    args.failed = set()
    args.run_dir.mkdir(parents=True, exist_ok=True)
    typed = f"make tune{'' if args.project == c.DEFAULT_PROJECT else f' PROJECT={args.project}'}"
    lock = ProjectLock(
        args.run_dir, typed, args.project, say=lambda line: print(f"tune: {line}", file=sys.stderr)
    )
    try:
        lock.acquire()  # held until the process exits: the apply at its end included
    except LockHeld as err:
        print(f"tune: {err}", file=sys.stderr)
        return 2
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, _interrupted)
    try:
        return tune(args)
    except KeyboardInterrupt:
        print("tune: interrupted: the trials stopped, the job continues as it was", file=sys.stderr)
        return 130
    except (job_lib.JobError, trial.TrialError, incontainer.InContainerError, EngineError, PrometheusError,
            ValueError) as err:  # fmt: skip
        print(f"tune: {str(err).splitlines()[0]}", file=sys.stderr)
        if isinstance(err, trial.TrialError) and len(str(err).splitlines()) > 1:
            print("\n".join(str(err).splitlines()[1:]), file=sys.stderr)
        return 2


def _interrupted(signum, frame) -> None:
    """SIGTERM or SIGHUP (a closed terminal, a CI timeout) unwinds like Ctrl-C: the trial clusters are
    stopped and the job unpaused (tune's finally), where dying at once would leave it paused."""
    raise KeyboardInterrupt


def tune(args) -> int:
    started = time.monotonic()
    job = job_lib.find(args.project)
    prom = Prometheus(url=args.prometheus, timeout=20.0)
    run = runs.resolve(prom, args.project, args.run)
    if not run:
        raise job_lib.JobError(f"project {args.project} has no run in Prometheus at {args.prometheus}")
    code, largest, recorded = current_verdict(prom, args.project, run)
    refuse_finished(code, args.project)
    chosen = pick(args, code, largest, recorded, job.script)
    if not chosen:
        raise ValueError("no candidate setting applies to this job (docs/tune.md)")
    cand.check(chosen, job.env, bool(job.script))
    job_lib.refuse_unsaved_script(job, args.restart_ok)
    split = reference.job_split(prom, rules.selector(args.project, run))
    seed = random.SystemRandom().randrange(1 << 32)
    args.rng = random.Random(seed)
    print(
        f"tune: run {run}, verdict {verdict.NAMES.get(code, code)}, largest part {largest}; trying "
        + ", ".join(k.name for k in chosen)
        + f" against the current settings and a null, {args.seconds:.0f} s of turns (order seed {seed}),"
        + " in the job's own containers",
        flush=True,
    )
    clusters: list[trial.Cluster] = []
    leftovers(args.project)
    try:
        job_lib.pause(job)  # in the try: a pause that fails half way (a task just exited) is undone
        trial_all(job, chosen, args, clusters)
    finally:
        for cl in clusters:
            cl.stop()
        incontainer.remove(args.project, Engine())
        if still := job_lib.unpause(job):
            ids = " ".join(job.containers[t] for t in still)
            print(f"tune: the job's {', '.join(still)} still paused: docker unpause {ids}", file=sys.stderr)
    current, null, rows = tabulate(clusters, chosen, args.failed)
    best = table.winner(rows, null)
    elapsed = time.monotonic() - started
    print(table.render(rows, current, null, best))
    close = split.line(current.split_ms["step"], reference.trial_share(current.split_ms)) if split else ""
    print(close or "step split: Prometheus has no minute of the job's steps to hold the trial against")
    trial_split = {"job": split, "current": current.split_ms, "seed": seed}
    winner.record(args.run_dir, run, rows, null, best, elapsed, project=args.project, split=trial_split)
    if best is not None:
        keep(best, chosen, run, args.run_dir)
    applied = best is not None and args.apply
    where = "its script's own checkpoint, or its start" if job.script else "its last checkpoint"
    print(
        f"tune: took {elapsed:.0f} s; the job "
        + ("restarts with the winner" if applied else f"continues from {where} ({RESUMES})"),
        flush=True,
    )
    return apply(args) if applied else 0


def leftovers(project: str) -> None:
    """A tune killed with SIGKILL left its trial containers and volumes: removed first, said in a line."""
    if n := incontainer.remove(project, Engine()):
        print(f"tune: removed {n} trial containers and volumes an earlier tune left behind", flush=True)


def keep(best: table.Row, chosen: list[cand.Candidate], run: str, run_dir: Path) -> None:
    """Write the winner where `make up` reads it (a trainer flag, or a process setting every task gets)."""
    k = next(k for k in chosen if k.name == best.name)
    why = f"make tune {time.strftime('%Y-%m-%d %H:%M', time.gmtime())} UTC on run {run}: {best.name} {best.median:.2f}x steps/s"
    path = winner.write(run_dir, k.settings, why, k.changes_optimisation)
    print(f"tune: wrote {path}; the next make up uses it (undo: rm {path})")


if __name__ == "__main__":
    sys.exit(main())
