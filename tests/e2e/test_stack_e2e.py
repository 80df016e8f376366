"""`make up WORKERS=2` on the real engine, offline images: every task trains, Prometheus sees it all."""

from __future__ import annotations

import json
import re
import statistics
import subprocess
import time

import pytest

from contract import STEPS
from tests.e2e import places

pytestmark = pytest.mark.docker


def test_every_task_is_a_target_with_one_task_type_and_index(stack) -> None:
    targets = json.loads((stack.run_dir / "targets" / "trainers.json").read_text())
    assert [(t["labels"]["task_type"], t["labels"]["task_index"]) for t in targets] == stack.tasks
    # honor_labels: no exported_task_type / exported_task_index duplicates on any trainer series.
    for expr in (
        'count({job="trainer", exported_task_type!=""})',
        'count({job="trainer", exported_task_index!=""})',
    ):
        assert stack.query(expr) == {}, expr


def test_first_step_seen(stack) -> None:
    # A figure for the report, not a timed assertion: it depends on the machine's load.
    print(
        f"make up: {stack.up_seconds:.1f} s; first step in Prometheus after {stack.first_step_seconds:.1f} s"
    )
    assert stack.first_step_seconds == stack.first_step_seconds, "Prometheus never saw a step"


def test_every_task_starts_with_the_allocator_settings_and_its_glibc_takes_them(stack) -> None:
    """trainer.cluster.server_config.ENVIRONMENT reaches the containers (through the deployment's trainer
    environment) and the image's glibc knows every tunable: an unknown one is silently ignored, so a
    new base image whose glibc lacks one fails here, not as a slower all-reduce. Read from the chief
    container's configuration and its image, so it holds whether or not the shared stack still trains."""
    from trainer.cluster import server_config

    inspect = subprocess.run(
        ["docker", "inspect", stack.container("chief"), "--format", "{{json .Config.Env}} {{.Config.Image}}"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert inspect.returncode == 0, inspect.stderr
    env_json, image = inspect.stdout.rsplit(" ", 1)
    env = dict(item.split("=", 1) for item in json.loads(env_json))
    assert {k: env.get(k) for k in server_config.ENVIRONMENT} == dict(server_config.ENVIRONMENT)
    listed = subprocess.run(
        ["docker", "run", "--rm", "-e", f"GLIBC_TUNABLES={env['GLIBC_TUNABLES']}", "--entrypoint"]
        + ["/lib64/ld-linux-x86-64.so.2", image.strip(), "--list-tunables"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert listed.returncode == 0, listed.stderr
    got = dict(re.findall(r"^(\S+): (\S+)", listed.stdout, re.MULTILINE))
    wanted = dict(item.split("=", 1) for item in env["GLIBC_TUNABLES"].split(":"))
    assert {name: int(got.get(name, "-1"), 0) for name in wanted} == {
        name: int(value) for name, value in wanted.items()
    }, listed.stdout


def test_training_completes_and_wait_returns_zero(stack) -> None:
    result = stack.make("wait", timeout=600)
    assert result.returncode == 0, result.stderr
    # Over the whole run, however long ago it ended: other modules share this stack and may have run
    # for more than half an hour since (a 30 min window found nothing once the suite grew).
    since = int(time.time() - stack.started) + 60
    steps = stack.query(f"max by (task_type, task_index) (max_over_time({STEPS.name}[{since}s]))")
    assert set(steps) == set(stack.tasks), steps
    assert all(v >= stack.steps for v in steps.values()), f"steps seen in Prometheus: {steps}"


def test_make_up_says_how_long_it_trains_and_how_to_change_it(stack) -> None:
    assert f"training {stack.steps} steps" in stack.up_output and "STEPS=N to change" in stack.up_output


def test_make_up_prints_no_compose_warning(stack) -> None:
    """Compose's builder choice (Bake needs buildx; COMPOSE_BAKE=false is deprecated) is not the user's to fix."""
    warnings = [
        line for line in stack.up_output.splitlines() if "level=warning" in line or "deprecated" in line
    ]
    assert not warnings, warnings


def test_unreadable_script_stops_make_up_before_any_container(stack, tmp_path) -> None:
    """A script in a folder only its owner can read (as `mktemp -d` makes): one line with the chmod, exit 2."""
    folder = tmp_path / "mine"
    folder.mkdir(mode=0o700)
    (folder / "train.py").write_text("print('never runs')\n")
    # Its own place: it shared Chaos' address, and beside the Chaos job make up refused the port first.
    project, bind = places.SCRIPT_REFUSED
    result = stack.make(
        "up",
        f"PROJECT={project}",
        f"RUN_DIR={tmp_path / 'run'}",
        f"BIND_ADDR={bind}",
        f"SCRIPT={folder / 'train.py'}",
        "OFFLINE=1",
        "GPUS=0",
        timeout=600,
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if "cannot read" in line]
    assert len(errors) == 1 and errors[0].endswith(f"chmod o+rx {folder}"), result.stderr[-2000:]
    started = subprocess.run(
        ["docker", "ps", "-aq", "--filter", f"label=com.docker.compose.project={project}"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    assert not started, f"make up started {started} for an unreadable script"


def test_status_steps_per_second_matches_the_chiefs_log(stack) -> None:
    """`make status` once divided a minute's steps by 60 s (2 steps/s for a task logging 80): its figure
    must agree, within 15 %, with the rate the chief itself logged over the same run."""
    assert stack.make("wait", timeout=600).returncode == 0
    status = stack.make("status", timeout=60)
    assert status.returncode == 0, status.stderr
    header, *rows = status.stdout.splitlines()
    # Columns are aligned and cells may hold spaces ("exited (0)"): read the cell under the header.
    start = header.index("steps/s")
    chief = next(row[start:].split()[0] for row in rows if row.split()[0] == "chief")
    logs = subprocess.run(
        ["docker", "logs", stack.container("chief")], capture_output=True, text=True, check=True
    )
    logged = [float(m) for m in re.findall(r"\| ([0-9.]+) steps/s \|", logs.stdout + logs.stderr)]
    assert len(logged) >= 3, f"the chief logged {len(logged)} progress lines"
    # The first interval holds the function tracing; the median of the rest is the chief's own pace.
    own = statistics.median(logged[1:])
    print(f"make status: chief {chief} steps/s; the chief's log: median {own:.1f} steps/s")
    assert float(chief) == pytest.approx(own, rel=0.15)
