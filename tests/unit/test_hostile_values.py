"""Any value, any target (issue 46): no value a user gives make runs as shell or make code.

The matrix (targets x variables), from compose/values.py's table and the Makefile's own targets:
  - every CHECKED variable (values.CHECKED: names, counts, paths, URLs, ...), from the command line or
    the environment, with any hostile value (quotes, $(...), backticks, ;, a newline, ../, a leading -):
    refused at parse time, before any target runs, in one line naming it: the same for every target
    (test_every_target_refuses_at_parse_time runs each target once with one of them hostile);
  - every FREE variable (values.FREE: ARGS, PYTEST_ARGS, BENCH_ARGS, ..., and trainer knobs such as
    STEPS): passed through, only in the environment; every target runs for real with all of them hostile
    at once (stand-in docker, apt-get, sudo, ... first on PATH, PY a stand-in) and the payload never runs.
`python -m compose.values --table` prints the variables, kinds and rules.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from compose import values

ROOT = Path(__file__).resolve().parents[2]
ENV = {"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"), "PYTHON": sys.executable}
"""PYTHON given: make resolves no python3 (a $(shell)) at each of the many parses below."""
INSTALLS = {"engine", "venv", "lock", "browser", "test", "test-images", "images", "images-gpu"}
"""Targets that install or download: never run for real here (test runs the others; textual check below)."""


def hostile(payload: Path) -> list[str]:
    return [
        "a'b\"c",
        f"$(touch {payload})",
        f"`touch {payload}`",
        f"x; touch {payload} #",
        f"x\ntouch {payload}",
        "../x",
        "-x",
        f"$(shell touch {payload})",
    ]


def make(*args: str, env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["make", "--no-print-directory", "-o", ".venv/.stamp", *args],
        cwd=ROOT,
        env={**ENV, **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def targets() -> list[str]:
    """Every target make help lists: a new target is tested without an edit here."""
    out = make("help").stdout
    return re.findall(r"^  \x1b\[36m([a-zA-Z0-9_.-]+)", out, re.M)


def assert_refused(done: subprocess.CompletedProcess, name: str, payload: Path) -> None:
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1 and f"*** {name}=" in lines[0], done.stderr
    assert done.stdout == "" and not payload.exists()


def test_the_generated_fragment_is_committed() -> None:
    """compose/values.mk is what `python -m compose.values --make` prints (no make rule regenerates it)."""
    assert (ROOT / "compose/values.mk").read_text() == values.make_fragment()


def test_make_and_python_agree_on_every_variable_and_hostile_value(tmp_path: Path) -> None:
    """The whole matrix in one make: the committed checks, each `$(error` made an `$(info`, run for every
    checked variable and value (given through the environment, taken as typed): refused exactly where
    values.problem() refuses, with its very line."""
    payload = tmp_path / "P"
    fragment = (ROOT / "compose/values.mk").read_text().replace("$(error ", "$(info REFUSED ")
    head, _, checks = fragment.partition("\nifneq (")
    blocks = {
        m.group(1): m.group(0)
        for m in re.finditer(r"ifneq \(\$\(filter (\w+),.*?\nendif\n", "ifneq (" + checks, re.S)
    }
    cases = [(n, v) for n in values.CHECKED for v in [*hostile(payload), values.VARIABLES[n].example, ""]]
    env, lines = {}, [head.split("_values_all :=")[0]]
    for i, (name, value) in enumerate(cases):
        env[f"CASE_{i}"] = value
        lines += [f"override {name} := $(value CASE_{i})", f"_values_given := {name}", blocks[name]]
    harness = tmp_path / "harness.mk"
    harness.write_text("\n".join(lines) + "\nall:\n\t@:\n")
    done = subprocess.run(
        ["make", "-s", "-f", str(harness)], env={**ENV, **env}, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    got = [line.removeprefix("REFUSED ") for line in done.stdout.splitlines()]
    want = [p for p in (values.problem(n, v) for n, v in cases) if p]
    assert got == want and not payload.exists()
    assert all(values.problem(n, values.VARIABLES[n].example) is None for n in values.VARIABLES)
    for name in values.CHECKED:  # every hostile value is refused, but ../x where a path may be relative
        refused = [v for v in hostile(payload) if values.problem(name, v)]
        kind = values.VARIABLES[name].kind
        assert len(refused) == len(hostile(payload)) - (kind in ("path", "url", "image")), (name, refused)


@pytest.mark.parametrize("where", ["command line", "environment"])
def test_each_checked_variable_is_refused_by_make_in_one_line(tmp_path: Path, where: str) -> None:
    """make -n help with each checked variable hostile (values taken in turn), from the command line or
    the environment (CI may set PROJECT there; make would expand a $ in it): refused, one line, nothing ran."""
    payload = tmp_path / "P"
    cases = hostile(payload)
    for i, name in enumerate(values.CHECKED):
        value = next(v for v in cases[i % len(cases) :] + cases if values.problem(name, v))
        if where == "environment":
            done = make("-n", "help", env={name: value})
        else:
            done = make("-n", "help", f"{name}={value}")
        assert_refused(done, name, payload)


def test_every_target_refuses_at_parse_time(tmp_path: Path) -> None:
    """Each target once, a different checked variable hostile each time: the refusal comes before any target."""
    payload = tmp_path / "P"
    for i, target in enumerate(targets()):
        name = values.CHECKED[i % len(values.CHECKED)]
        done = make("-n", target, f"{name}=$(touch {payload})")
        assert_refused(done, name, payload)


STAND_INS = (
    "docker",
    "apt-get",
    "sudo",
    "iperf3",
    "promtool",
    "amtool",
    "chromium",
    "curl",
    "wget",
    "nvidia-smi",
    "flock",
)


def free_hostile(payload: Path) -> str:
    return (
        f"--x 'a b' \"c d\" $(touch {payload}) `touch {payload}` ; touch {payload} && touch {payload} $$HOME"
    )


@pytest.mark.parametrize("target", [t for t in targets() if t not in INSTALLS])
def test_free_text_runs_nowhere(tmp_path: Path, target: str) -> None:
    """Every target run for real with every free-text variable hostile at once (and a trainer knob):
    stand-ins that record and exit 1 first on PATH, PY a stand-in, the test's own PROJECT and RUN_DIR,
    a Prometheus nobody listens on: the payload never runs."""
    payload = tmp_path / "P"
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in (*STAND_INS, "py"):
        (bin_dir / name).write_text(f'#!/bin/sh\necho "{name} $*" >>{tmp_path}/called\nexit 1\n')
        (bin_dir / name).chmod(0o755)
    free = {name: free_hostile(payload) for name in values.FREE} | {"STEPS": free_hostile(payload)}
    done = make(
        target,
        f"PY={bin_dir}/py",
        f"PROJECT=hostile-{os.environ.get('PYTEST_XDIST_WORKER', 'main')}",
        f"RUN_DIR={tmp_path}/run",
        f"K8S_DIR={tmp_path}/k8s",
        "PROMETHEUS_URL=http://127.0.0.1:9",
        *[f"{k}={v}" for k, v in free.items()],
        env={"PATH": f"{bin_dir}:{os.environ['PATH']}"},
        timeout=60,
    )
    assert not payload.exists(), done.stdout + done.stderr


def test_make_test_splits_pytest_args_as_test_unit_does() -> None:
    """make test is not run here (it runs everything): its recipe splits PYTEST_ARGS as test-unit's does."""
    text = (ROOT / "Makefile").read_text()
    recipe = text.split("\ntest: ")[1].split("\n\n")[0]
    assert "$(PYTEST_ARGS)" not in text and recipe.count("$(call with_args,PYTEST_ARGS)") == 3
    assert "\t$(call with_args,PYTEST_ARGS) $(UNIT)" in text.split("\ntest-unit: ")[1]


def test_split_keeps_quotes() -> None:
    """make test PYTEST_ARGS="-k 'a and b'" still works: one -k, one expression."""
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "compose.values",
            "--with-args",
            "A",
            sys.executable,
            "-c",
            "import sys; print(sys.argv[1:])",
        ],
        cwd=ROOT,
        env={**ENV, "A": "-k 'a and b' $(x) `y`"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.stdout.strip() == str(["-k", "a and b", "$(x)", "`y`"])


HELP_ORDER = [
    "General", "Cluster", "Monitoring", "Diagnose", "Tune", "TensorBoard", "Swarm (multi-host)",
    "Kubernetes", "Setup", "Local runs and benchmarks", "Trainer", "Tests", "Lint",
]  # fmt: skip
LIFECYCLE_PENDING = set(re.findall(r"^([a-z0-9-]+):.*##", (ROOT / "compose/compose.mk").read_text(), re.M))
"""compose/compose.mk's targets: its help phrases are shortened with the lifecycle's rewrite of that file."""


def test_help_lines_fit_and_sections_come_in_order() -> None:
    out = re.sub(r"\x1b\[[0-9;]*m", "", make("help").stdout)
    sections = [line for line in out.splitlines()[1:] if line and not line.startswith(" ")][: len(HELP_ORDER)]
    assert sections == HELP_ORDER
    long = [line for line in out.splitlines() if len(line) > 120 and line.split()[0] not in LIFECYCLE_PENDING]
    assert not long
    setup = out.split("\nSetup\n")[1].split("\n\n")[0]
    assert "images-gpu" in setup
