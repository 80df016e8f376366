"""What the Makefile hands each command (`make -n`: printed, not run)."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

import contract
from compose import knobs

ROOT = Path(__file__).resolve().parents[2]
PROJECT = f"mwms-unit-makefile-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
"""One per test process: make test runs the unit tests on every core, each its own run folder."""
COMMANDS = ("status", "wait", "diagnose", "report", "bench-comm", "logs", "down", "clean", "config")


def dry_run(*args: str) -> str:
    result = subprocess.run(
        ["make", "--no-print-directory", "-n", *args], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture
def project_stack() -> Iterator[Path]:
    """What `make up PROJECT=... BIND_ADDR=127.0.0.9` leaves: its run folder, published on that address."""
    run_dir = ROOT / ".run" / PROJECT
    run_dir.mkdir(parents=True)
    (run_dir / "stack.env").write_text(f"COMPOSE_PROJECT_NAME={PROJECT}\nBIND_ADDR=127.0.0.9\n")
    (run_dir / "compose.args").write_text(f"-f {run_dir}/compose.base.yaml\n")
    yield run_dir
    shutil.rmtree(run_dir)


@pytest.mark.parametrize("command", COMMANDS)
def test_project_reaches_every_command(project_stack: Path, command: str) -> None:
    out = dry_run(command, f"PROJECT={PROJECT}")
    assert PROJECT in out, f"make {command} PROJECT={PROJECT} ran: {out}"
    assert f".run/{PROJECT}" in out or "-p " + PROJECT in out or command in ("status", "wait"), out
    assert "-p mwms " not in out and "mwms/bench" not in out


@pytest.mark.parametrize("command", ["status", "diagnose", "report"])
def test_the_projects_prometheus_is_asked(project_stack: Path, command: str) -> None:
    assert f"http://127.0.0.9:{contract.PROMETHEUS_PORT}" in dry_run(command, f"PROJECT={PROJECT}")


def test_stack_settings_pass_through_one_list_and_no_trainer_knob() -> None:
    """Trainer knobs reach the emitters through the environment (compose/knobs.py), not as make's list."""
    up = dry_run("up", "STEPS=5", "WORKERS=3")
    assert "WORKERS='3'" in up and "compose/up.sh" in up
    assert not [name for name in knobs.names() if f" {name}='" in f" {up}"], up
