"""`make status`: the per-task table, its project, and its figures evaluated by a real PromQL engine
(promtool) on series like a real run's, not stubbed query results."""

from __future__ import annotations

import math
import subprocess
from pathlib import Path

import yaml

import contract
from compose.wait import error_line
from monitoring import status
from monitoring.rules import promtests

# `promtool`: the fixture in tests/conftest.py (fails in CI, skips elsewhere when it is missing).


def test_steps_per_second_is_what_the_clock_sees(promtool, tmp_path: Path) -> None:
    """A long run stepping every 0.1 s in 0.08 s steps must show 10 steps/s (the clock's), not 12.5
    (1 / the step time); a task gone after 60 s its own run's 10, not its last minute over the window;
    a 100-step run over between two scrapes shows none (one scrape holds no rate)."""
    doc = {
        "evaluation_interval": "5s",
        "tests": [
            {
                "interval": "5s",
                "input_series": promtests.short_run_series()
                + promtests.long_run_series()
                + promtests.gone_run_series()
                + promtests.restarted_run_series(),
                "promql_expr_test": promtests.steps_expectations(status.QUERIES["steps/s"]),
            }
        ],
    }
    path = tmp_path / "status_test.yml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    result = subprocess.run(
        [promtool, "test", "rules", str(path)], check=False, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_table_rows_per_task_in_order() -> None:
    states = {
        "worker-1": "running",
        "prometheus": "running",
        "chief": "exited (0)",
        "worker-0": "running",
        "worker-10": "running",
        "worker-2": "running",
    }
    values = {
        "step": {"chief": 120.0, "worker-0": 118.0},
        "steps/s": {"chief": 80.0},
        "step time": {"chief": 0.0125},
        "all-reduce": {"chief": 0.25},
        "input wait": {"chief": 0.05},
        "outside steps": {"chief": 0.1},
        "checkpoint": {"chief": 100.0},
        "target": {"chief": 600.0, "worker-0": 0.0},
    }
    columns = {expr: col for col, expr in status.QUERIES.items()}
    query = lambda expr: values.get(columns[expr], {})  # noqa: E731
    rows = status.table(states, query)
    assert rows[0] == status.COLUMNS
    assert rows[1] == (
        "chief",
        "exited (0)",
        "120",
        "20%",
        "80.0",
        "0.013 s",
        "25%",
        "5%",
        "10%",
        "100",
        "6s",
    )
    assert [r[0] for r in rows[1:]] == ["chief", "worker-0", "worker-1", "worker-2", "worker-10"]
    assert rows[2][2:5] == ("118", "-", "-")  # a target of 0: unknown, no progress shown
    assert status.job_line(rows, query) == "job: step 120 of 600 (20%), ETA 6s at 80.0 steps/s"
    assert status.render(rows).splitlines()[0].startswith("task ")


def test_progress_and_eta() -> None:
    assert status.progress(300, 600, 10) == (0.5, 30.0)
    assert status.progress(600, 600, math.nan) == (1.0, 0.0)  # finished: nothing left, rate gone
    assert all(map(math.isnan, status.progress(300, 0, 10)))  # 0: the exporter's "unknown"
    assert [status.duration(s) for s in (45, 185, 7800)] == ["45s", "3m05s", "2h10m"]
    assert status.job_line([status.COLUMNS, ("chief",)], lambda expr: {}) is None


def test_a_run_that_does_not_say_its_steps_shows_no_progress_and_says_why() -> None:
    """A SCRIPT= custom loop exports target 0: progress and ETA are `-` with the reason, never a number."""
    values = {"step": {"chief": 3920.0}, "steps/s": {"chief": 20.0}, "target": {"chief": 0.0}}
    columns = {expr: col for col, expr in status.QUERIES.items()}
    query = lambda expr: values.get(columns[expr], {})  # noqa: E731
    rows = status.table({"chief": "running"}, query)
    col = {name: i for i, name in enumerate(status.COLUMNS)}
    assert (rows[1][col["progress"]], rows[1][col["ETA"]]) == ("-", "-")
    assert status.job_line(rows, query) == f"job: step 3920; {status.UNKNOWN_TARGET}"
    values["step"] = {"chief": 0.0}  # starting: nothing said yet, by a script or the built-in loop
    assert status.job_line(status.table({"chief": "running"}, query), query) == "job: no step yet"


def test_services_that_are_tasks() -> None:
    assert [
        s for s in ("chief", "worker-12", "prometheus", "grafana", "worker-x", "chief-0") if status.is_task(s)
    ] == ["chief", "worker-12"]


def test_project_comes_from_the_arguments(monkeypatch, capsys) -> None:
    asked = []
    monkeypatch.setattr(status, "containers", lambda project: asked.append(project) or {})
    assert status.main(["--project", "mwms-x"]) == 1
    assert asked == ["mwms-x"]
    assert "no trainer tasks in project mwms-x" in capsys.readouterr().err
    status.main([])
    assert asked[-1] == contract.DEFAULT_PROJECT


def test_a_task_killed_from_outside_says_what_starts_it_again() -> None:
    states = {"chief": "running", "worker-0": "exited (137)", "worker-1": "running", "prometheus": "running"}
    (note,) = status.killed_notes(states)
    assert note.startswith("worker-0: killed from outside") and "`make wait` starts it again" in note
    assert status.killed_notes({"chief": "exited (0)", "worker-0": "exited (137)"}) == []


def test_a_task_that_failed_for_good_shows_its_one_line_error_as_make_wait_does() -> None:
    """A SCRIPT= task whose script imports a module the image lacks: the line names it and REQUIREMENTS=
    (trainer/script/failure.py), read from the task's log as compose/wait.py's error_line reads it."""
    line = (
        "train.py line 2 imports pandas, which the trainer image lacks: "
        "add it with REQUIREMENTS=path/to/requirements.txt (docs/script.md)"
    )
    logs = {"chief": f"2026-12-07 13:00:01,000 E {line}\n2026-12-07 13:00:01,001 I observe: 0 steps"}
    states = {
        "chief": "exited (2)",
        "worker-0": "exited (5), 1 restarts",
        "worker-1": "exited (0)",
        "worker-2": "exited (137)",
        "prometheus": "exited (1)",
    }
    notes = status.failed_notes(states, lambda task: error_line(task, run=lambda cmd: logs.get(cmd[-1], "")))
    assert notes == [
        f"chief: failed for good: exit code 2 (bad configuration): {line}",
        "worker-0: failed for good: exit code 5 (a peer failed for good)",
    ]
