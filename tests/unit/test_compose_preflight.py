"""`make up` refuses early, each fault in one line, before any download, build or container: a PROJECT
Compose would reject, GPUs the host does not have, a published port already taken, a second `make up`
of a project that is starting. The refusals run through `python -m compose.lifecycle up` itself, with `docker` and
`nvidia-smi` replaced by stubs that record being called: nothing may reach them but queries."""

from __future__ import annotations

import contextlib
import os
import random
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import contract
from compose import preflight

ROOT = Path(__file__).resolve().parents[2]


def fake(runtimes: str = '{"runc": {}}', smi: str = "") -> preflight.gpus.Runner:
    return lambda cmd: smi if cmd[0] == "nvidia-smi" else runtimes if "info" in cmd else ""


@pytest.mark.parametrize("name", ["Foo", "-mwms", "my project", "a.b", ""])
def test_a_project_name_compose_rejects_is_refused_with_a_fix(name):
    problem = preflight.project_problem(name)
    assert problem and "PROJECT=" in problem and "\n" not in problem
    fixed = problem.rsplit("PROJECT=", 1)[1]
    assert preflight.project_problem(fixed) is None, fixed


@pytest.mark.parametrize("name", ["mwms", "alerts-b", "a_1", "9lives"])
def test_good_project_names_pass(name):
    assert preflight.project_problem(name) is None


def test_gpus_the_host_lacks_are_refused():
    assert "no GPU that containers can use" in preflight.gpu_problem("7", fake())
    with_gpus = fake(runtimes='{"nvidia": {}, "runc": {}}', smi="0\n1\n")
    assert preflight.gpu_problem("2", with_gpus) is None
    assert preflight.gpu_problem("0,1", with_gpus) is None
    assert preflight.gpu_problem("0,5", with_gpus) == "GPUS=0,5: GPU 5 is not on this host (it has 0,1)"
    assert "no GPU" in preflight.gpu_problem("1", fake(smi="0\n")), "GPUs without Docker's nvidia runtime"
    assert preflight.gpu_problem("0", fake()) is None and preflight.gpu_problem("auto", fake()) is None
    assert "GPUS=x" in preflight.gpu_problem("x", fake())


def listener(addr: str = "127.0.0.1") -> socket.socket:
    s = socket.socket()
    s.bind((addr, 0))
    s.listen()
    return s


def test_a_taken_port_is_refused_unless_this_project_holds_it():
    with listener() as taken:
        port = taken.getsockname()[1]
        other = lambda cmd: (
            f"other-stack|other-stack-prometheus-1|127.0.0.1:{port}->{contract.PROMETHEUS_PORT}/tcp\n"
        )  # noqa: E731
        problem = preflight.port_problem("127.0.0.1", "prometheus", port, "mine", other)
        assert problem.startswith(f"127.0.0.1:{port} (prometheus) is already in use by container")
        assert "other-stack-prometheus-1" in problem and "BIND_ADDR=" in problem
        ours = lambda cmd: f"mine|mine-prometheus-1|127.0.0.1:{port}->{contract.PROMETHEUS_PORT}/tcp\n"  # noqa: E731
        assert preflight.port_problem("127.0.0.1", "prometheus", port, "mine", ours) is None
    assert preflight.port_problem("127.0.0.1", "prometheus", port, "mine", other) is None, "free again"


# --- Through compose/lifecycle.py, with stubs for every tool that could download, build or start ---


@pytest.fixture
def stubs(tmp_path: Path) -> Path:
    """docker, nvidia-smi, mmdebstrap stubs: queries answer empty, and every call is logged."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in ("docker", "nvidia-smi", "mmdebstrap", "apt-get"):
        script = bin_dir / tool
        script.write_text(f'#!/bin/sh\necho "{tool} $*" >> {tmp_path}/calls\nexit 0\n')
        script.chmod(script.stat().st_mode | stat.S_IEXEC)
    return bin_dir


def free_loopback() -> str:
    """A loopback address where none of the stack's ports is taken (other stacks share this host)."""
    for last in range(2, 250):
        addr = f"127.0.{random.randrange(200, 255)}.{last}"
        if not any(preflight.port_in_use(addr, port) for _, port in preflight.published_ports()):
            return addr
    raise AssertionError("no free loopback address")


def up(stubs: Path, tmp_path: Path, command: str = "up", **env: str) -> subprocess.CompletedProcess:
    environ = {
        **os.environ,
        "PATH": f"{stubs}:{os.environ['PATH']}",
        "RUN_DIR": str(tmp_path / "run"),
        "PROJECT": "alerts-preflight",
        "BIND_ADDR": free_loopback(),
        "GPUS": "0",
        "PYTHON": "python3",
        **env,
    }
    return subprocess.run(
        [sys.executable, "-m", "compose.lifecycle", command],
        cwd=ROOT,
        env=environ,
        capture_output=True,
        text=True,
        timeout=60,
    )


def calls(tmp_path: Path) -> list[str]:
    path = tmp_path / "calls"
    return path.read_text().splitlines() if path.exists() else []


def refused(result: subprocess.CompletedProcess, tmp_path: Path, words: str) -> None:
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1 and words in lines[0], result.stderr
    queries = (["docker", "ps"], ["docker", "info"], ["nvidia-smi", "--query-gpu=index"])
    starts = [c for c in calls(tmp_path) if c.split()[:2] not in queries]
    assert not starts, f"called before refusing: {starts}"


def test_up_refuses_a_bad_project_first(stubs, tmp_path):
    refused(up(stubs, tmp_path, PROJECT="Foo"), tmp_path, "PROJECT='Foo'")


def test_up_refuses_gpus_the_host_lacks_first(stubs, tmp_path):
    refused(up(stubs, tmp_path, GPUS="7"), tmp_path, "GPUS=7: this host has no GPU")


def test_up_refuses_a_taken_port_first(stubs, tmp_path):
    addr = free_loopback()
    with socket.socket() as taken:
        taken.bind((addr, preflight.published_ports()[0][1]))
        taken.listen()
        refused(up(stubs, tmp_path, BIND_ADDR=addr), tmp_path, "is already in use")


@contextlib.contextmanager
def lock_held(tmp_path: Path, seconds: float) -> Iterator[subprocess.Popen]:
    """Another `make up` of the project: a process holding its lock (compose/projectlock.py) for `seconds`."""
    lock = tmp_path / "run" / ".lock"
    lock.parent.mkdir(exist_ok=True)
    holder = subprocess.Popen(["flock", str(lock), "sleep", str(seconds)])
    try:
        deadline = time.time() + 10
        while subprocess.run(["flock", "-n", str(lock), "true"]).returncode == 0:
            assert time.time() < deadline, "the holder never took the lock"
            time.sleep(0.05)
        yield holder
    finally:
        holder.kill()
        holder.wait()


def test_up_refuses_a_second_start_of_the_same_project(stubs, tmp_path):
    with lock_held(tmp_path, 30):
        refused(up(stubs, tmp_path), tmp_path, "PROJECT=alerts-preflight is busy")


def test_a_build_only_waits_for_another_make_up_of_the_project(stubs, tmp_path):
    """`make images` (compose.lifecycle images) beside another build of the project waits, then goes on: a
    refusal had left make test's images to its tests (.ci/run's own make test-images held the lock)."""
    with lock_held(tmp_path, 2) as holder:
        built = up(stubs, tmp_path, "images")
        assert "is busy" not in built.stderr, built.stderr
        assert holder.poll() is not None, "it went on while the other held the lock"


def test_a_running_stack_of_the_project_counts_as_free_memory(monkeypatch):
    """`make up` again, or `make resize`, replaces this project's containers: what they hold is freed
    before the new tasks start, so a resize from 2 to 3 workers on a host with one task's memory to
    spare is not refused. Another project's containers are not counted."""
    running = "chief\nworker-0\nworker-1\nprometheus\nalertmanager\n"

    def docker(cmd):
        return running if "label=com.docker.compose.project=mine" in cmd else ""

    assert preflight.own_mib("mine", docker) == 3 * preflight.MEMORY_PER_TASK_MIB + preflight.MONITORING_MIB
    assert preflight.own_mib("other", docker) == 0
    spare = preflight.MEMORY_PER_TASK_MIB + 10  # what the host has free beside the running job
    ns = preflight.argparse.Namespace(
        project="mine", gpus="0", workers="3", starting=True, bind_addr="127.0.0.250"
    )
    monkeypatch.setattr(
        preflight, "available_mib", lambda field="MemAvailable": spare if field == "MemAvailable" else 1 << 15
    )
    assert not [p for p in preflight.problems(ns, docker) if "GiB" in p]
    ns.project = "other"
    assert [p for p in preflight.problems(ns, docker) if "WORKERS=3: 4 tasks need" in p]


def test_docker_is_asked_about_the_running_job_only_when_its_memory_decides(monkeypatch):
    """A job that fits in what is free, or that even an emptied host could not hold, is decided before
    the engine is touched: make up's refusals come before docker (CI stop 34: WORKERS=67 and STEPS=0
    reached a docker stub through this count)."""
    asked = []

    def docker(cmd):
        asked.append(cmd)
        return "chief\nworker-0\n"

    free, total = 2000, 8000
    monkeypatch.setattr(
        preflight, "available_mib", lambda field="MemAvailable": free if field == "MemAvailable" else total
    )
    fits = (free - preflight.MONITORING_MIB) // preflight.MEMORY_PER_TASK_MIB - 1
    never = total // preflight.MEMORY_PER_TASK_MIB
    assert preflight.freed_mib("mine", fits, docker) == free and not asked
    assert preflight.freed_mib("mine", never, docker) == free and not asked
    assert preflight.freed_mib("mine", fits + 2, docker) == free + 2 * preflight.MEMORY_PER_TASK_MIB and asked
