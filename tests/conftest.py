"""What every test that needs a service shares: with CI=true a missing service fails the run, elsewhere
the test is skipped with what to install. Ask with a fixture (`docker_engine`, `compose_cli`,
`promtool`) or, outside a test's arguments, with `need(...)`."""

from __future__ import annotations

import os
import shutil
import subprocess
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


DOCKER_CLI = "/usr/local/bin/docker"
"""Docker CLI 28: `docker stack config` checks a stack file without a swarm (Debian's 20.10 cannot)."""


def _stack_config() -> bool:
    return (
        bool(shutil.which(DOCKER_CLI))
        and subprocess.run([DOCKER_CLI, "stack", "config", "--help"], capture_output=True).returncode == 0
    )


SERVICES = {
    "docker engine": (_engine, "no Docker engine with Compose v2: run `make engine`"),
    "compose": (_compose, "no Docker Compose v2 CLI: run `make engine`"),
    "docker stack config": (
        _stack_config,
        f"{DOCKER_CLI} has no `docker stack config` (docker CLI 24 or later)",
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
def promtool() -> str:
    need("promtool")
    return shutil.which("promtool") or "promtool"


@pytest.fixture(scope="session")
def amtool() -> str:
    need("amtool")
    return shutil.which("amtool") or "amtool"
