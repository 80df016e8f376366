"""Which module `make test`'s side-by-side stage starts next (tests/conftest.py wires it into xdist).

Two rules, from a profile of the stage (docs/measurements.md, 2026-12-05):
- Longest first. A module is one unit of work (its tests share its stacks), so the stage ends when the
  last unit does: starting the long ones first lets the short ones fill the lanes at the end (xdist's
  own order, by number of tests, left Chaos alone on one lane for its last 4 minutes).
- At most HEAVY_AT_ONCE lanes run a module that keeps the cores busy (the cores are the limit: 2 here);
  a further lane runs the modules that spend their time waiting with their job idle or blocked (an
  alert's 120 s threshold, a stuck task's bound, a fault's recovery), which cost a lane of wall time
  but little CPU (0.1-0.4 of a core each, measured from their containers' cgroups).
"""

from __future__ import annotations

from collections.abc import Iterable

HEAVY_AT_ONCE = 2
"""Lanes that run CPU-bound modules: the 2 cores of the machines CI runs on. Lanes beyond them (make
test's E2E_JOBS=4) take only the modules that wait."""

SECONDS = {
    # Each module's span in the side-by-side stage of a cold clean-clone trial (2026-12-06 19:00, 1662cda;
    # make test prints each lane's spans at the stage's end: tests/lanes.py).
    "tests/e2e/test_swarm.py": 788,  # mlp on the nodes; with the node-loss job that shrinks and grows back
    "tests/e2e/test_compare_tune.py": 1430,  # with APPLY=1 and SCRIPT=; its jobs paced (50 ms, 100 ms); each compared run
    # steps the 10 windows a side that keep compare's chance rate at 5 % (+300 s, 2026-12-07); the slow-link job
    # whose trials run in its containers: its make up, steady windows and tune (+~400 s, 2026-12-07)
    "tests/e2e/test_chaos.py": 418,
    "tests/e2e/test_alerts.py": 410,
    "tests/e2e/test_faults.py": 309,
    "tests/e2e/test_engine_faults.py": 290,  # a DinD node's start and image load, then three engine faults
    "tests/e2e/test_stuck.py": 224,
    "tests/e2e/test_resize.py": 186,  # its end sized from its first resize's wall time
    "tests/cluster/test_resume_cluster.py": 125,
    "tests/e2e/test_runs.py": 91,
    "session-stack": 65,
    "tests/e2e/test_tensorboard.py": 57,
    "tests/e2e/test_gpu_image.py": 54,  # its image built before the stage (make test-images)
    "tests/cluster/test_compression.py": 51,
    "tests/cluster/test_resize_cluster.py": 51,
    "tests/cluster/test_trainer_cluster.py": 45,
    "tests/cluster/test_resume_after_a_cut_save.py": 34,
    "tests/cluster/test_k8s_names.py": 18,
    "tests/cluster/test_final_export.py": 16,
}
"""Units not listed are taken as short (DEFAULT_SECONDS): add a new long module here."""

DEFAULT_SECONDS = 15

WAITING = frozenset(
    {
        "tests/e2e/test_alerts.py",  # a blocked job waits out TrainingStalled's 120 s + for: + delivery
        "tests/e2e/test_faults.py",  # its jobs train at --input-delay-ms 40; waits on exits and recoveries
        "tests/e2e/test_stuck.py",  # a hung or blocked task waits out the stall bound
        "tests/e2e/test_chaos.py",  # one job at --input-delay-ms 40, waiting out each fault's recovery
        "tests/e2e/test_engine_faults.py",  # a 600-step job at --input-delay-ms 40 (its node: 71 CPU-s
        # of its ~200 s, 2026-12-05 profile), waiting out each engine's recovery
    }
)
"""Units that mostly wait (their containers used 0.1-0.4 of a core on average over their span). Resize
(0.25) is not one: on a waiting lane (b64bed3) it pushed chaos' and engine faults' node loads into
compare/tune's tunes, and the two clean-clone trials that followed were no faster (docs/measurements.md)."""

NODES = frozenset({"tests/e2e/test_swarm.py", "tests/e2e/test_engine_faults.py", "tests/e2e/test_chaos.py"})
"""Units that start Docker-in-Docker nodes and load the stack's images into them (`docker save | load`:
~2 min of disk and CPU per node). A waiting lane takes them after the other waiting units, so that their
loads do not meet the Swarm's and compare/tune's start: with all three at the stage's start (load 34),
engine faults' waits fell behind its job and make tune's current settings ended no call in its turns."""


def longest_first(units: Iterable[str]) -> list[str]:
    """The units in the order to start them: the longest measured first, ties by name."""
    return sorted(units, key=lambda u: (-SECONDS.get(u, DEFAULT_SECONDS), u))


def pick(queue: Iterable[str], waiting_lane: bool) -> str | None:
    """The unit a lane takes next: a waiting lane the longest unit that waits, those with nodes last (None:
    none left, the lane ends); another lane the longest CPU-bound unit, then, when none is left, the
    longest that waits."""
    ordered = longest_first(queue)
    waiting = sorted((u for u in ordered if u in WAITING), key=lambda u: u in NODES)  # stable: longest first
    if waiting_lane:
        return waiting[0] if waiting else None
    return next((u for u in ordered if u not in WAITING), waiting[0] if waiting else None)
