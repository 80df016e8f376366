"""What the Makefile hands each command (`make -n`: printed, not run)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import contract

ROOT = Path(__file__).resolve().parents[2]
PROJECT = f"mwms-unit-makefile-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}"
"""One per test process: make test runs the unit tests on every core, each its own run folder."""
COMMANDS = ("status", "diagnose", "report", "bench-comm")
LIFECYCLE = ("wait", "logs", "down", "clean", "config", "output", "resize")
"""Targets that are one call of compose/lifecycle.py: the project reaches it in the environment."""


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


def recorded_run(folder: Path, *args: str) -> str:
    """What `make args` hands its Python commands: PY and PYTHON are a stand-in that records its argv
    and exits 0 (recipes take values from their environment, "$PROJECT", so `make -n` shows names,
    not values); stand-in `docker`, `apt-get` and `iperf3` first on PATH, so nothing else runs."""
    record, bin_dir = folder / "argv.txt", folder / "bin"
    bin_dir.mkdir(exist_ok=True)
    for name in ("docker", "apt-get", "iperf3"):
        (bin_dir / name).write_text("#!/bin/sh\nexit 1\n")
        (bin_dir / name).chmod(0o755)
    stub = bin_dir / "python-stub"
    stub.write_text(f'#!/bin/sh\necho "$*" >>{record}\n')
    stub.chmod(0o755)
    environ = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
    done = subprocess.run(
        ["make", "--no-print-directory", *args, f"PY={stub}", f"PYTHON={stub}"],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return record.read_text() if record.exists() else ""


RECORDED = ("status", "diagnose", "report", "bench-comm")
"""Recipes that hand every value in the environment: checked by running them with a stand-in Python."""


@pytest.mark.parametrize("command", COMMANDS)
def test_project_reaches_every_command(project_stack: Path, tmp_path: Path, command: str) -> None:
    if command in RECORDED:
        out = recorded_run(tmp_path, command, f"PROJECT={PROJECT}")
    else:
        out = dry_run(command, f"PROJECT={PROJECT}")
    assert PROJECT in out, f"make {command} PROJECT={PROJECT} ran: {out}"
    assert f".run/{PROJECT}" in out or "-p " + PROJECT in out or command in ("status", "wait"), out
    assert "-p mwms " not in out and "mwms/bench" not in out


@pytest.mark.parametrize("command", LIFECYCLE)
def test_project_reaches_every_lifecycle_command(project_stack: Path, command: str, tmp_path: Path) -> None:
    python, seen = recording_python(tmp_path)
    result = subprocess.run(
        ["make", "--no-print-directory", command, f"PROJECT={PROJECT}", f"PYTHON={python}"],
        cwd=ROOT, env={"PATH": os.environ["PATH"]}, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    got = json.loads(seen.read_text())
    assert (got["PROJECT"], got["RUN_DIR"]) == (PROJECT, f".run/{PROJECT}"), got


@pytest.mark.parametrize("command", ["status", "diagnose", "report"])
def test_the_projects_prometheus_is_asked(project_stack: Path, tmp_path: Path, command: str) -> None:
    args = (command, f"PROJECT={PROJECT}")
    out = recorded_run(tmp_path, *args) if command in RECORDED else dry_run(*args)
    assert f"http://127.0.0.9:{contract.PROMETHEUS_PORT}" in out


def test_no_value_is_pasted_into_the_shell_line() -> None:
    """Stack settings and trainer knobs reach compose/lifecycle.py in its environment, not re-quoted in its line."""
    line = dry_run("up", "STEPS=5", "WORKERS=3", "ARGS=--x 1").strip()
    assert line.endswith(" -m compose.lifecycle up") and "STEPS" not in line and "--x" not in line, line


HOSTILE = {
    "ARGS": "--note 'a b' --path \"$HOME\" `id` ; echo injected; '; touch /tmp/pwned; '",
    "SCRIPT": "my_scripts/train+1.py",
    "DATA": "/data/records@2,a%b",
    "OUTPUT": "out:put/next",
    "STEPS": "5'; echo injected; '",
    "TRAINER_INPUT_DELAY_MS": "$(id) `id` 'q'",
}
"""Values a user may type, each to arrive as typed: free text (ARGS, trainer knobs) with quotes, spaces,
$, backticks and ;, and paths with every character the path rule allows (compose/values.py; a path
with a space, quote, $ or newline is refused at parse time: tests/unit/test_hostile_values.py)."""


def recording_python(folder: Path) -> tuple[Path, Path]:
    """A PYTHON for make's recipes: it records the environment it got in a JSON file and exits 0, so
    nothing else runs."""
    seen, python = folder / "env.json", folder / "python"
    python.write_text(
        f'#!/bin/sh\n{shutil.which("python3")} -c \'import json, os; json.dump(dict(os.environ), open("{seen}", "w"))\'\n'
        "echo 'exit 0'\n"
    )
    python.chmod(0o755)
    return python, seen


@pytest.mark.parametrize("target", ["up", "images"])
def test_values_reach_the_lifecycle_as_typed(tmp_path: Path, target: str) -> None:
    """make up runs $PYTHON -m compose.lifecycle: a stand-in records the environment it got, so the real
    make -> Python path is what is checked, nothing started."""
    python, seen = recording_python(tmp_path)
    environ = {"PATH": os.environ["PATH"], "TRAINER_INPUT_DELAY_MS": HOSTILE["TRAINER_INPUT_DELAY_MS"]}
    typed = [f"{k}={v}" for k, v in HOSTILE.items() if not k.startswith("TRAINER_")]
    result = subprocess.run(
        ["make", "--no-print-directory", target, f"PYTHON={python}", f"PROJECT={PROJECT}", *typed],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0 and "injected" not in result.stdout + result.stderr, result
    got = json.loads(seen.read_text())
    assert {k: got.get(k) for k in HOSTILE} == HOSTILE
    assert got["WORKERS"] == str(contract.DEFAULT_WORKERS)  # a default of make's one list (STACK_VARS)
    assert not Path("/tmp/pwned").exists()


def _bad_inputs() -> list[tuple[str, str]]:
    from compose import preflight

    too_many = (
        preflight.available_mib(field="MemTotal") or 0
    ) // preflight.MEMORY_PER_TASK_MIB + 2  # no host empties to fit
    return [
        ("WORKERS=abc", "WORKERS='abc'"),
        (f"WORKERS={too_many}", f"WORKERS={too_many}: {too_many + 1} tasks need at least"),
        ("STEPS=0", "STEPS=0"),
        ("TASK=no_such_task", "no_such_task"),
        ("SCRIPT=/no/such/train.py", "/no/such/train.py"),
        ("DATA=/no/such/records", "/no/such/records"),
    ]


def up_with_stub(tmp_path: Path, command: str, body: str, setting: str) -> subprocess.CompletedProcess:
    """`make up setting` with a stand-in `command` (a shell script of `body`) first on PATH."""
    stub = tmp_path / "bin" / command
    stub.parent.mkdir()
    stub.write_text(f"#!/bin/sh\n{body}\n")
    stub.chmod(0o755)
    environ = {"PATH": f"{stub.parent}:{os.environ['PATH']}", "HOME": os.environ.get("HOME", "/root")}
    return subprocess.run(
        ["make", "--no-print-directory", "up", f"PROJECT={PROJECT}", f"RUN_DIR={tmp_path}/run", setting],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("setting,named", _bad_inputs())
def test_bad_settings_are_refused_in_one_line_before_docker(tmp_path: Path, setting: str, named: str) -> None:
    """Issue 29: WORKERS, STEPS, TASK, SCRIPT and DATA were checked after the engine check and the image
    builds; WORKERS=abc printed argparse's usage naming --workers. A `docker` that records being run
    stands first on PATH: nothing may reach it."""
    called = tmp_path / "docker-called"
    result = up_with_stub(tmp_path, "docker", f'echo "$@" >>{called}\nexit 1', setting)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("make: ***")]
    assert result.returncode != 0 and len(lines) == 1 and named in lines[0], result.stderr
    assert "usage:" not in result.stderr and not called.exists(), (
        called.read_text() if called.exists() else ""
    )


def test_images_variant_gpu_hands_up_sh_its_gpu_layout(tmp_path: Path) -> None:
    """images.mk's target-specific overrides reach up.sh's environment (a GPU overlay to build from)."""
    python, seen = recording_python(tmp_path)
    done = subprocess.run(
        ["make", "--no-print-directory", "images", "VARIANT=gpu", "WORKERS=5", f"PYTHON={python}"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    got = json.loads(seen.read_text())
    assert (got["WORKERS"], got["GPUS"], got["GPUS_PER_WORKER"], got["RUN_DIR"]) == (
        "0",
        "1",
        "1",
        ".run/images-gpu",
    )


def test_a_second_make_test_images_waits_for_the_first_and_builds_nothing(tmp_path: Path) -> None:
    """.ci/run starts make test-images during its set-up and make test starts its own: the second
    checked every image again once the first was done (20 s for the GPU one's context, with the unit
    tests done and waiting for it)."""
    log, lock = tmp_path / "logs" / "images.log", tmp_path / "images.lock"
    started = tmp_path / "started"
    build = f"touch {started}; sleep 2; echo built"
    cmd = ["make", "--no-print-directory", "test-images", f"PREBUILD={build}"]
    cmd += [f"TEST_IMAGES_LOG={log}", f"TEST_IMAGES_LOCK={lock}"]
    first = subprocess.Popen(cmd, cwd=ROOT)
    while not started.exists():  # the first holds the lock
        assert first.poll() is None, "the first make test-images ended before its build began"
        time.sleep(0.05)
    second = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert "built" in log.read_text(), "the second returned while the first still built"
    assert first.wait() == 0 and second.returncode == 0, second.stderr
    assert log.read_text().count("built") == 1, log.read_text()
    assert "waiting for it" in log.read_text()


def test_a_version_managers_python_shim_runs_once_per_make(tmp_path: Path) -> None:
    """pyenv's `python3` is a shell shim that finds the interpreter at every call (~0.12 CPU-s of bash
    each; a make up made six calls). make resolves it once: a counting shim first on PATH runs once,
    however many Python steps up.sh takes before its refusal (STEPS=0, before any docker)."""
    count = tmp_path / "shim-calls"
    result = up_with_stub(tmp_path, "python3", f'echo call >>{count}\nexec {sys.executable} "$@"', "STEPS=0")
    assert result.returncode != 0 and "STEPS=0" in result.stderr, result.stderr
    assert count.read_text().splitlines() == ["call"], f"the shim ran {len(count.read_text().split())} times"
