"""make test's side-by-side order (tests/schedule.py): the longest unit first, lanes beyond the cores'
count only for the modules that wait, and every unit it names is one that exists."""

from __future__ import annotations

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
