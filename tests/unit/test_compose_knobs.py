"""Trainer knobs on a `make up`: one path from a make variable to every task's TRAINER_* variable."""

from __future__ import annotations

import dataclasses
import os
import subprocess
from pathlib import Path

import pytest
import yaml

from compose import emit, knobs
from trainer.config import Config


def task_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **environ: str) -> dict[str, str]:
    """What `make up NAME=VALUE ...` gives the chief: the Compose target reading its environment, as up.sh does."""
    for name in knobs.names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("TRAINER_SEED", raising=False)
    for name, value in knobs.on_command_line(**environ).items():
        monkeypatch.setenv(name, value)
    assert emit.main(["--target", "compose", "--workers", "1", "--gpus", "0", "--out", str(tmp_path)]) == 0
    services = yaml.safe_load((tmp_path / "compose.tasks.yaml").read_text())["services"]
    return services["chief"]["environment"]


def test_every_trainer_flag_is_a_knob_but_what_the_stack_sets() -> None:
    fields = {f.name.upper() for f in dataclasses.fields(Config)}
    assert set(knobs.names()) == fields - {
        "METRICS_PORT",
        "METRICS_LINGER",
        "CHECKPOINT_DIR",
        "DATA",
        "EXPORT_DIR",
        "LOGDIR",
        "PROFILER_PORT",
    }


def test_any_trainer_flag_reaches_every_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    env = task_env(tmp_path, monkeypatch, STEPS="7", INPUT_DELAY_MS="20", LEARNING_RATE="0.05", TASK="cnn")
    assert {
        k: v
        for k, v in env.items()
        if k in {"TRAINER_STEPS", "TRAINER_INPUT_DELAY_MS", "TRAINER_LEARNING_RATE", "TRAINER_TASK"}
    } == {
        "TRAINER_STEPS": "7",
        "TRAINER_INPUT_DELAY_MS": "20",
        "TRAINER_LEARNING_RATE": "0.05",
        "TRAINER_TASK": "cnn",
    }


FASTEST_DEFAULT_JOB = 46.0
"""steps/s: the default job's fastest rate seen on these 2-core machines (33-40 usual; docs/measurements.md)."""


def test_default_job_trains_for_minutes_and_up_claims_no_duration(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    steps = int(task_env(tmp_path, monkeypatch).get("TRAINER_STEPS", Config.steps))
    # Prometheus scrapes every 5 s: the default job must outlast many scrapes even at its fastest.
    assert steps / FASTEST_DEFAULT_JOB >= 120, f"the default job trains {steps} steps"
    err = capsys.readouterr().err
    assert f"training {steps} steps;" in err and "STEPS=N to change" in err
    # A rate measured on other settings is no estimate of this job's (issue 29 #3: WORKERS=3 ran 34/s).
    assert "steps/s" not in err and " min " not in err, err


def test_empty_knob_keeps_the_default(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert task_env(tmp_path, monkeypatch, STEPS="", TASK="")["TRAINER_STEPS"] == knobs.UP_DEFAULTS["steps"]


@pytest.mark.parametrize(
    ("name", "value", "says"),
    [
        ("STEPS", "0", "STEPS=0: --steps (TRAINER_STEPS): must be 1 or more"),
        (
            "PER_REPLICA_BATCH",
            "many",
            "PER_REPLICA_BATCH=many: TRAINER_PER_REPLICA_BATCH='many': must be an integer",
        ),
        ("STRATEGY", "ps", "STRATEGY=ps: --strategy (TRAINER_STRATEGY): must be one of mwms, mirrored"),
        ("METRICS_PORT", "9000", "METRICS_PORT is set by the stack"),
    ],
)
def test_bad_knob_is_one_line_before_any_file(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    name: str,
    value: str,
    says: str,
) -> None:
    for key, val in knobs.on_command_line(**{name: value}).items():
        monkeypatch.setenv(key, val)
    assert (
        emit.main(["--target", "compose", "--workers", "1", "--gpus", "0", "--out", str(tmp_path / "run")])
        == 2
    )
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()


def test_the_default_task_brings_its_rate_a_given_task_does_not(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    default = task_env(tmp_path, monkeypatch, TASK="")
    assert (default["TRAINER_TASK"], default["TRAINER_LEARNING_RATE"]) == (
        knobs.UP_TASK["task"],
        knobs.UP_TASK["learning_rate"],
    )
    given = task_env(tmp_path, monkeypatch, TASK="mlp")
    assert given["TRAINER_TASK"] == "mlp" and "TRAINER_LEARNING_RATE" not in given


def test_a_shell_variable_sharing_a_flags_name_changes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OUTPUT_DIR", "/home/me/results")  # someone else's variable, in the user's shell
    monkeypatch.setenv("SEED", "42")
    env = task_env(tmp_path, monkeypatch, STEPS="7")
    assert "TRAINER_OUTPUT_DIR" not in env and "TRAINER_SEED" not in env
    assert env["TRAINER_STEPS"] == "7"


def test_trainer_variables_in_the_environment_are_knobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    for name in knobs.names():
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("TRAINER_SEED", "42")
    assert emit.main(["--target", "compose", "--workers", "1", "--gpus", "0", "--out", str(tmp_path)]) == 0
    services = yaml.safe_load((tmp_path / "compose.tasks.yaml").read_text())["services"]
    assert services["chief"]["environment"]["TRAINER_SEED"] == "42"


def test_make_names_only_its_command_line_variables() -> None:
    """The real Makefile's MAKE_COMMAND_LINE: what the emitters trust as knobs."""
    env = {k: v for k, v in os.environ.items() if k != "MAKEFLAGS"}
    out = subprocess.run(
        [
            "make",
            "--no-print-directory",
            "--eval",
            "show: ; @echo $$MAKE_COMMAND_LINE",
            "show",
            "STEPS=7",
            "TASK=cnn",
        ],
        cwd=Path(__file__).resolve().parents[2],
        env={**env, "OUTPUT_DIR": "/stray", "SEED": "42"},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    ).stdout.split()
    assert sorted(out) == ["STEPS", "TASK"]
