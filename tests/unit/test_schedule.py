"""make test's side-by-side order (tests/schedule.py): the longest unit first, lanes beyond the cores'
count only for the modules that wait, and every unit it names is one that exists."""

from __future__ import annotations

import heapq

from tests import schedule
from tests.conftest import ROOT, SESSION_STACK_GROUP


def test_the_longest_unit_starts_first_and_unknown_units_count_as_short():
    queue = ["tests/cluster/test_new.py", "tests/e2e/test_runs.py", "tests/e2e/test_swarm.py"]
    assert schedule.longest_first(queue) == [
        "tests/e2e/test_swarm.py",
        "tests/e2e/test_runs.py",
        "tests/cluster/test_new.py",
    ]


def test_a_core_lane_takes_the_longest_cpu_bound_unit_then_the_waiting_ones():
    queue = ["tests/e2e/test_alerts.py", "tests/e2e/test_runs.py", "tests/e2e/test_faults.py"]
    assert schedule.pick(queue, waiting_lane=False) == "tests/e2e/test_runs.py"
    waiting = ["tests/e2e/test_alerts.py", "tests/e2e/test_faults.py"]
    longest = max(waiting, key=schedule.SECONDS.__getitem__)
    assert schedule.pick(waiting, waiting_lane=False) == longest


def test_a_waiting_lane_takes_only_waiting_units_and_ends_when_none_is_left():
    queue = ["tests/e2e/test_swarm.py", "tests/e2e/test_alerts.py", "tests/e2e/test_runs.py"]
    assert schedule.pick(queue, waiting_lane=True) == "tests/e2e/test_alerts.py"
    assert schedule.pick(["tests/e2e/test_swarm.py"], waiting_lane=True) is None
    assert schedule.pick([], waiting_lane=False) is None


def test_a_waiting_lane_takes_the_units_with_nodes_after_the_others():
    queue = ["tests/e2e/test_chaos.py", "tests/e2e/test_engine_faults.py", "tests/e2e/test_stuck.py"]
    assert schedule.SECONDS["tests/e2e/test_chaos.py"] > schedule.SECONDS["tests/e2e/test_stuck.py"]
    assert schedule.pick(queue, waiting_lane=True) == "tests/e2e/test_stuck.py"
    assert schedule.pick(queue[:2], waiting_lane=True) == max(queue[:2], key=schedule.SECONDS.__getitem__)


def test_every_unit_named_exists():
    named = (set(schedule.SECONDS) | schedule.WAITING | schedule.NODES) - {SESSION_STACK_GROUP}
    assert [u for u in sorted(named) if not (ROOT / u).is_file()] == []


def _lane_ends(seconds: dict[str, float], lanes: int) -> list[float]:
    """When each of `lanes` lanes would end if every unit took its measured span: each lane, as it comes
    free, takes what schedule.pick gives it (the first HEAVY_AT_ONCE lanes are the core lanes)."""
    queue, free, ends = list(seconds), [(0.0, lane) for lane in range(lanes)], [0.0] * lanes
    heapq.heapify(free)
    while free:
        now, lane = heapq.heappop(free)
        unit = schedule.pick(queue, waiting_lane=lane >= schedule.HEAVY_AT_ONCE)
        if unit is None:
            ends[lane] = now
            continue
        queue.remove(unit)
        heapq.heappush(free, (now + seconds[unit], lane))
    return ends


def test_the_measured_units_keep_every_lane_busy_to_near_the_end():
    # make test's E2E_JOBS=4. With resize on a core lane the waiting lanes ended 6 minutes before the core
    # lanes (823 and 828 s of 1191 in the 1662cda trial), idle while a core lane still ran 7 modules.
    ends = _lane_ends(schedule.SECONDS, lanes=4)
    assert min(ends) >= 0.75 * max(ends), ends
