"""`python -m trainer.telemetry.profile_capture --logdir /logs --seconds 2 --keep 5 chief worker-0 ...`

One profiler trace of every named task at once, filed as one TensorBoard run per task, the oldest
captures beyond --keep deleted. `make profile` runs it inside the stack (in the TensorBoard container,
which is on the cluster network and mounts the log volume), against each task's profiler server
(trainer/telemetry/tensorboard.py starts it on TRAINER_PROFILER_PORT, the built-in trainer and SCRIPT runs alike).

TensorFlow's client traces every address of one comma-separated list in the same window, and each
task's profiler server writes `plugins/profile/<capture>/<host>_<port>.xplane.pb` itself, under the
given directory on its own filesystem (hence a staging folder on the shared log volume, which every
task mounts); each file is then moved to
`<logdir>/profile/<task>/plugins/profile/<capture>/<task>.xplane.pb`, so TensorBoard's profile tab
lists `profile/<task>/<capture>` for every task. A task that did not answer is named, exit 1.

Then each new trace is opened once, one after the other, through the TensorBoard of this container
(--board): xprof converts a trace for its Trace Viewer on the first request of a capture and keeps
the result next to it. Two first requests at once (the page's own and a second tab, a reload, a test)
both convert, into the same files, and one finds the other's half-written SSTABLE: `404 No Data`
(xprof 2.24.2 logs "<task>.SSTABLE; No such file or directory"). Once converted, every request
reads the kept result, so no view of the capture races, and the first one opens at once.
"""

from __future__ import annotations

import argparse
import logging
import os
import shutil
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path
from urllib.parse import urlencode

import contract
from trainer.telemetry.tensorboard import PROFILE_RUNS

log = logging.getLogger("trainer.telemetry.profile_capture")
SESSIONS = Path("plugins") / "profile"
"""Where TensorBoard's profile plugin looks for captures under a run."""
TRACE_VIEWER = "trace_viewer@"
"""The profile plugin's Trace Viewer (streaming): the tool whose first conversion races."""
WARM_TIMEOUT_S = 300
"""One conversion of a 2 s trace took 1.5-5 s on the 2 loaded cores; a slow one only warns."""


def addresses(tasks: Sequence[str], port: int) -> str:
    return ",".join(f"grpc://{task}:{port}" for task in tasks)


def trace(tasks: Sequence[str], port: int, seconds: float, staging: Path) -> Path | None:
    """One trace of every task into `staging`; the capture's folder (named by its start time), None
    when no task wrote one. Each task's profiler server writes its own file into `staging` on its own
    filesystem, so `staging` must be on the log volume every task mounts."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # the client's INFO lines say nothing to act on
    import tensorflow as tf

    tf.profiler.experimental.client.trace(addresses(tasks, port), str(staging), int(seconds * 1000))
    captures = sorted((staging / SESSIONS).glob("*")) if (staging / SESSIONS).is_dir() else []
    return captures[-1] if captures else None


def file_by_task(capture: Path, tasks: Sequence[str], port: int, logdir: Path) -> list[str]:
    """Move each task's trace to its own run; the tasks whose trace is missing."""
    missing = []
    for task in tasks:
        found = capture / f"{task}_{port}.xplane.pb"
        if not found.exists():
            missing.append(task)
            continue
        session = logdir / PROFILE_RUNS / task / SESSIONS / capture.name
        session.mkdir(parents=True, exist_ok=True)
        shutil.move(found, session / f"{task}.xplane.pb")
        log.info("%s: %s (%.1f MB)", task, session, (session / f"{task}.xplane.pb").stat().st_size / 1e6)
    return missing


def trace_url(board: str, task: str, capture: str) -> str:
    """The profile plugin's data URL of one task's trace in one capture, as the PROFILE tab asks for it."""
    run = f"{PROFILE_RUNS}/{task}/{capture}"
    return f"{board}/data/plugin/profile/data?" + urlencode({"run": run, "tag": TRACE_VIEWER, "host": task})


def warm(board: str, tasks: Sequence[str], capture: str, timeout: float = WARM_TIMEOUT_S) -> list[str]:
    """Have TensorBoard convert each task's new trace once, in turn; the tasks it could not convert
    (the trace stays filed: its first view converts it then)."""
    failed = []
    for task in tasks:
        start = time.monotonic()
        try:
            with urllib.request.urlopen(trace_url(board, task, capture), timeout=timeout) as reply:
                reply.read()
        except (urllib.error.URLError, OSError) as err:
            log.warning("%s: TensorBoard did not convert the trace (%s): its first view will", task, err)
            failed.append(task)
            continue
        log.info("%s: trace viewer ready (%.1f s)", task, time.monotonic() - start)
    return failed


def prune(logdir: Path, keep: int) -> list[Path]:
    """Delete every task's captures but the newest `keep` (names are start times, so they sort)."""
    removed = []
    for sessions in sorted((logdir / PROFILE_RUNS).glob(f"*/{SESSIONS}")):
        for old in sorted(p for p in sessions.iterdir() if p.is_dir())[:-keep]:
            shutil.rmtree(old)
            removed.append(old)
    return removed


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m trainer.telemetry.profile_capture", description=__doc__.splitlines()[0]
    )
    p.add_argument("tasks", nargs="+", help="task names, which are also their hosts on the cluster network")
    p.add_argument("--logdir", type=Path, required=True)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--keep", type=int, default=5, help="captures kept per task (older ones are deleted)")
    p.add_argument("--port", type=int, default=contract.PROFILER_PORT)
    p.add_argument(
        "--board",
        default=f"http://127.0.0.1:{contract.TENSORBOARD_PORT}",
        help="the TensorBoard that converts each new trace once (empty: none)",
    )
    ns = p.parse_args(argv)
    if ns.seconds <= 0:
        p.error(f"--seconds {ns.seconds:g}: must be positive (PROFILE_SECONDS)")
    if ns.keep < 1:
        p.error(f"--keep {ns.keep}: must be 1 or more (PROFILE_KEEP)")
    return ns


def main(argv: Sequence[str] | None = None) -> int:
    logging.basicConfig(level=logging.INFO, format="profile: %(message)s")
    ns = parse_args(sys.argv[1:] if argv is None else argv)
    # A hidden folder on the volume, removed whatever happens; TensorBoard lists runs by folder name.
    with tempfile.TemporaryDirectory(prefix=".capture-", dir=ns.logdir) as staging:
        try:
            capture = trace(ns.tasks, ns.port, ns.seconds, Path(staging))
        except Exception as err:  # noqa: BLE001 (the client raises RuntimeError, UnavailableError, ...)
            capture, why = None, str(err).splitlines()[0]
        else:
            why = "no trace written"
        if capture is None:
            log.error("no task answered on port %d (%s): is a job running?", ns.port, why)
            return 1
        missing = file_by_task(capture, ns.tasks, ns.port, ns.logdir)
    if ns.board:
        warm(ns.board, [t for t in ns.tasks if t not in missing], capture.name)
    for old in prune(ns.logdir, ns.keep):
        log.info("removed %s (--keep %d)", old, ns.keep)
    if missing:
        log.error("no trace from %s: not running, or started without a profiler server", ", ".join(missing))
        return 1
    log.info("capture %s of %d tasks: open the PROFILE tab of TensorBoard", capture.name, len(ns.tasks))
    return 0


if __name__ == "__main__":
    sys.exit(main())
