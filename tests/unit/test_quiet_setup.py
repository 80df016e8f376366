"""Set-up steps (the venv, the images, the wheelhouse) print one line each; the tool's own output
goes to the log that line names, and a failure prints the log's tail and keeps the exit code."""

from __future__ import annotations

import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUIET = ROOT / "images" / "quiet.sh"


def _run(tmp_path: Path, script: str, **env: str) -> subprocess.CompletedProcess:
    log = tmp_path / "logs" / "step.log"
    return subprocess.run(
        [str(QUIET), str(log), "step: doing it", "bash", "-c", script],
        capture_output=True,
        text=True,
        timeout=30,
        env={"PATH": "/usr/bin:/bin", **env},
    )


def test_a_step_that_works_prints_one_line(tmp_path):
    out = _run(tmp_path, "for i in $(seq 200); do echo pip line $i; done; echo warning >&2")
    assert out.returncode == 0 and out.stdout == ""
    assert out.stderr.count("\n") == 1 and out.stderr.startswith("step: doing it ... ok (")
    assert f"log: {tmp_path / 'logs' / 'step.log'}" in out.stderr
    logged = (tmp_path / "logs" / "step.log").read_text()
    assert "pip line 200" in logged and "warning" in logged


def test_a_step_that_fails_prints_the_tail_of_its_log_and_its_code(tmp_path):
    out = _run(tmp_path, "seq 100; echo 'ERROR: no matching distribution' >&2; exit 7")
    assert out.returncode == 7
    first, *tail = out.stderr.splitlines()
    assert first.startswith("step: doing it ... FAILED (exit 7; log: ")
    assert tail[-1] == "  | ERROR: no matching distribution" and len(tail) == 30 and "  | 1" not in tail


def test_quiet_0_shows_the_output_and_still_logs(tmp_path):
    out = _run(tmp_path, "echo visible", QUIET="0")
    assert out.returncode == 0 and "visible" in out.stderr
    assert (tmp_path / "logs" / "step.log").read_text() == "visible\n"


def test_the_venv_target_goes_through_it():
    recipe = subprocess.run(
        ["make", "-n", "-s", "/nonexistent/venv/.stamp", "VENV=/nonexistent/venv"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=30,
    ).stdout
    assert "images/quiet.sh build/logs/venv.log" in recipe and "pip install" in recipe
