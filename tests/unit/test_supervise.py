"""trainer.supervise with real child processes: which exits are retried, the budget, signals."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from trainer import supervise
from trainer.cluster import TaskId
from trainer.errors import EXIT_GAVE_UP

ROOT = Path(__file__).resolve().parents[2]


def child(tmp_path: Path, body: str) -> tuple[str, ...]:
    """A Python child that knows its run number (`run`, from 1) and can report a checkpoint step."""
    script = tmp_path / "child.py"
    script.write_text(
        textwrap.dedent(f"""\
        import os, signal, sys, time
        from pathlib import Path
        runs = Path({str(tmp_path / "runs")!r})
        run = len(runs.read_text()) + 1 if runs.exists() else 1
        runs.write_text("x" * run)
        def checkpoint(step):
            Path({str(tmp_path / "step")!r}).write_text(str(step))
            time.sleep(1.0)  # polls (every 0.05 s) see it, even on a loaded machine
        """)
        + textwrap.dedent(body)
    )
    return (sys.executable, str(script))


def runs(tmp_path: Path) -> int:
    return len((tmp_path / "runs").read_text())


def supervisor(tmp_path: Path, command: tuple[str, ...], max_restarts: int = 2) -> supervise.Supervisor:
    def progress(_url: str) -> int | None:
        step = tmp_path / "step"
        text = step.read_text() if step.exists() else ""
        return int(text) if text else None  # write_text truncates first: a poll can read it empty

    settings = supervise.Settings(command=command, max_restarts=max_restarts, restart_delay=0.01, poll=0.05)
    return supervise.Supervisor(settings, log=lambda _m: None, progress=progress)


@pytest.mark.parametrize(
    ("body", "code", "expected_runs"),
    [
        ("sys.exit(0)", 0, 1),
        ("sys.exit(2)", 2, 1),  # bad configuration: never retried
        ("sys.exit(1)", 1, 1),  # permanent failure
        ("sys.exit(3)", 3, 1),  # a peer never came: final on the first run
        ("sys.exit(201 if run < 3 else 0)", 0, 3),  # preempted twice, then done
        ("sys.exit(200 if run == 1 else 3 if run == 2 else 0)", 0, 3),  # a peer missing while recovering
        ("sys.exit(200 if run == 1 else 2)", 2, 2),  # retryable, then final
        ("os.kill(os.getpid(), signal.SIGKILL) if run == 1 else sys.exit(0)", 0, 2),  # a crash
        ("sys.exit(200)", EXIT_GAVE_UP, 3),  # budget 2: the third failure is the last
    ],
)
def test_exit_codes(tmp_path: Path, body: str, code: int, expected_runs: int) -> None:
    assert supervisor(tmp_path, child(tmp_path, body)).run() == code
    assert runs(tmp_path) == expected_runs


def test_a_new_checkpoint_renews_the_budget(tmp_path: Path) -> None:
    # Budget 1, six failures: survivable only because every run saves a newer checkpoint first.
    body = "checkpoint(100 * run); sys.exit(200 if run <= 6 else 0)"
    assert supervisor(tmp_path, child(tmp_path, body), max_restarts=1).run() == 0
    assert runs(tmp_path) == 7


def test_failures_without_a_new_checkpoint_spend_the_budget(tmp_path: Path) -> None:
    body = "checkpoint(100); sys.exit(200)"  # the same step every time: no progress
    assert supervisor(tmp_path, child(tmp_path, body), max_restarts=2).run() == EXIT_GAVE_UP
    assert runs(tmp_path) == 3


def run_cli(tmp_path: Path, body: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "trainer.supervise", "--", *child(tmp_path, body)],
        cwd=ROOT,
        env={**os.environ, "TRAINER_METRICS_PORT": "0", **(env or {})},
        stderr=subprocess.PIPE,
        text=True,
    )


def test_sigterm_is_forwarded_and_the_child_is_not_restarted(tmp_path: Path) -> None:
    body = """\
        signal.signal(signal.SIGTERM, lambda *_: (Path(sys.argv[0] + ".term").write_text("1"), sys.exit(201)))
        Path(sys.argv[0] + ".ready").write_text("1")
        time.sleep(60)
        """
    proc = run_cli(tmp_path, body)
    deadline = time.time() + 30
    while not (tmp_path / "child.py.ready").exists():
        assert time.time() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 201  # the child's own code (a preemption: it saved)
    assert (tmp_path / "child.py.term").exists()  # the child got the signal
    assert runs(tmp_path) == 1  # ... and was not restarted: the container is stopping
    assert "after SIGTERM" in proc.stderr.read()


def test_cli_takes_the_budget_from_the_environment_and_says_why_it_gives_up(tmp_path: Path) -> None:
    proc = run_cli(tmp_path, "sys.exit(200)", env={supervise.MAX_RESTARTS_ENV: "1"})
    assert proc.wait(timeout=60) == EXIT_GAVE_UP
    assert runs(tmp_path) == 2
    last = proc.stderr.read().strip().splitlines()[-1]
    assert last.startswith(
        "supervise: exited 200 (peer lost): gave up, 1 restart(s) without a new checkpoint"
    ), last


@pytest.mark.parametrize(
    ("argv", "env", "message"),
    [
        (
            ["--", "python"],
            {supervise.MAX_RESTARTS_ENV: "lots"},
            "SUPERVISE_MAX_RESTARTS='lots': must be an integer",
        ),
        (["--max-restarts", "-1", "--", "python"], {}, "must be 0 or more"),
        ([], {}, "no command to supervise"),
        (["--", "/nonexistent/trainer"], {}, "cannot run '/nonexistent/trainer'"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    argv: list[str], env: dict[str, str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert supervise.main(argv, env) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1, err


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_reads_the_checkpoint_step_from_the_trainers_own_metrics() -> None:
    from trainer import metrics as metrics_lib

    assert supervise.checkpoint_step("") is None  # metrics disabled: no progress is ever seen
    port = free_port()
    url = f"http://127.0.0.1:{port}/metrics"
    metrics, server = metrics_lib.for_task(TaskId("worker", 1), port=port)
    try:
        assert supervise.checkpoint_step(url) == 0
        metrics.checkpointed(300)
        assert supervise.checkpoint_step(url) == 300
    finally:
        server.close()
    assert supervise.checkpoint_step(url) is None  # the child is gone


@pytest.mark.parametrize(
    ("code", "words"),
    [
        (0, "done"),
        (2, "bad configuration"),
        (3, "missing peers"),
        (200, "peer lost"),
        (201, "preempted"),
        (137, "killed by SIGKILL"),
        (-9, "killed by SIGKILL"),
        (143, "killed by SIGTERM"),
        (250, "retryable"),
        (7, "final"),
    ],
)
def test_meaning(code: int, words: str) -> None:
    assert supervise.meaning(code) == words
