"""What every test that needs a service shares: with CI=true a missing service fails the run, elsewhere
the test is skipped with what to install. Ask with a fixture (`docker_engine`, `compose_cli`,
`promtool`) or, outside a test's arguments, with `need(...)`."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _engine() -> bool:
    return subprocess.run([str(ROOT / "compose" / "engine.sh"), "check"], capture_output=True).returncode == 0


def _compose() -> bool:
    return (
        bool(shutil.which("docker"))
        and subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0
    )


def _namespaces() -> bool:
    return (
        bool(shutil.which("unshare"))
        and subprocess.run(["unshare", "-rmn", "true"], capture_output=True).returncode == 0
    )


def docker_cli() -> subprocess.CompletedProcess:
    """`compose/engine.sh docker-cli`: the path of the docker CLI with `docker stack config` (Debian
    bookworm's 20.10 has none), named, pinned and checked in that one place; `make engine` installs it.
    Exit 1 with what is wrong when it is not there."""
    return subprocess.run([str(ROOT / "compose" / "engine.sh"), "docker-cli"], capture_output=True, text=True)


SERVICES = {
    "docker engine": (_engine, "no Docker engine with Compose v2: run `make engine`"),
    "compose": (_compose, "no Docker Compose v2 CLI: run `make engine`"),
    "docker stack config": (
        lambda: docker_cli().returncode == 0,
        "no docker CLI with `docker stack config`: run `make engine` (`compose/engine.sh docker-cli` says why)",
    ),
    "promtool": (
        lambda: bool(shutil.which("promtool")),
        "promtool not on PATH: `make engine` installs it (apt-get install prometheus)",
    ),
    "amtool": (
        lambda: bool(shutil.which("amtool")),
        "amtool not on PATH: `make engine` installs it (apt-get install prometheus-alertmanager)",
    ),
    "prometheus": (
        lambda: bool(shutil.which("prometheus")),
        "prometheus not on PATH: `make engine` installs it (apt-get install prometheus)",
    ),
    "chromium": (
        lambda: bool(shutil.which("chromium") and shutil.which("chromedriver")),
        "no headless Chromium: run `make browser` (apt-get install chromium chromium-driver)",
    ),
    "user namespaces": (
        _namespaces,
        "unshare -rmn (user, mount and network namespaces) is not available here",
    ),
}


def need(service: str) -> None:
    """Fail (CI=true) or skip unless `service` (a key of SERVICES) is here."""
    available, fix = SERVICES[service]
    if not available():
        pytest.fail(f"{fix} (CI=true)") if os.environ.get("CI") == "true" else pytest.skip(fix)


@pytest.fixture(scope="session")
def docker_engine() -> None:
    need("docker engine")


@pytest.fixture(scope="session")
def compose_cli() -> None:
    need("compose")


@pytest.fixture(scope="session")
def stack_cli() -> str:
    """The docker CLI that has `docker stack config`."""
    need("docker stack config")
    return docker_cli().stdout.strip()


@pytest.fixture(scope="session")
def promtool() -> str:
    need("promtool")
    return shutil.which("promtool") or "promtool"


@pytest.fixture(scope="session")
def amtool() -> str:
    need("amtool")
    return shutil.which("amtool") or "amtool"


# --- make test's side-by-side stage (pytest-xdist -n N --dist loadscope) ---
# A module's tests share its stacks and module fixtures, so a module is one unit of work for one xdist
# worker, and the modules on the session stack (tests/e2e/conftest.py) are one unit together. xdist's
# own xdist_group marks do not reach its scheduler under pytest 9 (the nodeid suffix they rely on is
# no longer written), so the scheduler here groups by file; tests/schedule.py says which unit a lane
# takes next (the longest first; a lane beyond the cores' count only the modules that wait).
SESSION_STACK_GROUP = "session-stack"
SESSION_STACK_MODULES = frozenset(
    {"tests/e2e/test_stack_e2e.py", "tests/e2e/test_dashboards_live.py", "tests/e2e/test_report_live.py"}
)


def _unit(nodeid: str) -> str:
    """The unit of work a test belongs to: its module, or the session stack's group."""
    path = nodeid.split("::", 1)[0]
    return SESSION_STACK_GROUP if path in SESSION_STACK_MODULES else path


def _uses_the_session_stack(item: pytest.Item) -> bool:
    defs = getattr(item, "_fixtureinfo", None) and item._fixtureinfo.name2fixturedefs.get("stack", ())
    return bool(defs) and defs[-1].scope == "session"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    stray = sorted(
        {i.nodeid.split("::")[0] for i in items if _uses_the_session_stack(i)} - SESSION_STACK_MODULES
    )
    if stray:  # it would start a second session stack beside the first, on the same ports
        raise pytest.UsageError(
            f"{', '.join(stray)} use the session stack: add them to SESSION_STACK_MODULES"
        )


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadscope":
        return None
    from xdist.scheduler import LoadScopeScheduling

    from tests import schedule

    class ModuleScheduling(LoadScopeScheduling):
        """Whole modules, longest first; lanes beyond schedule.HEAVY_AT_ONCE take only the modules
        that wait (tests/schedule.py)."""

        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

        def _assign_work_unit(self, node) -> None:
            lane = int(node.gateway.id.removeprefix("gw"))
            unit = schedule.pick(self.workqueue, waiting_lane=lane >= schedule.HEAVY_AT_ONCE)
            if unit is None:  # a waiting lane with no waiting unit left: it ends (and runs what it holds)
                node.shutdown()
                return
            work_unit = self.workqueue.pop(unit)
            self.assigned_work.setdefault(node, {})[unit] = work_unit
            collection = self.registered_collections[node]
            node.send_runtest_some([collection.index(n) for n, done in work_unit.items() if not done])

        def _reschedule(self, node) -> None:
            # xdist claims a lane's next unit while it has 2 tests left: a 2-test module claimed its
            # successor at its start and held it for its whole span (Chaos waited 7 min behind Stuck
            # on the waiting lane while a core lane idled). A worker runs its last test only once it
            # knows the next or is told to stop, so a lane claims when its last test is what it holds.
            if node.shutting_down:
                return
            if not self.workqueue:
                node.shutdown()
            elif self._pending_of(self.assigned_work.get(node, {})) <= 1:
                self._assign_work_unit(node)

    return ModuleScheduling(config, log)


# --- the side-by-side stage's lanes (tests/lanes.py): what each lane ran, and when it ended ---
# xdist's workers run with dist "no": the controller tells them, in their workerinput, to record.
def _side_by_side(config: pytest.Config) -> bool:
    return config.getvalue("dist") == "loadscope"


def pytest_sessionstart(session: pytest.Session) -> None:
    if _side_by_side(session.config):
        from tests import lanes

        lanes.LOG.parent.mkdir(parents=True, exist_ok=True)
        lanes.LOG.write_text("")


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node) -> None:
    if _side_by_side(node.config):
        node.workerinput["record_lanes"] = True


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    start = time.time()
    yield
    worker = getattr(item.config, "workerinput", {})
    if worker.get("record_lanes"):
        from tests import lanes

        lanes.record(worker["workerid"], _unit(item.nodeid), start, time.time())


def pytest_terminal_summary(terminalreporter, exitstatus: int, config: pytest.Config) -> None:
    from tests import lanes

    if _side_by_side(config) and lanes.LOG.exists():
        for line in lanes.summary(lanes.LOG.read_text().splitlines()):
            terminalreporter.write_line(f"lanes: {line}")
