"""Trainer knobs on a `make up`: one path from a make variable to every task's TRAINER_* variable."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import yaml

from compose import emit, knobs
from trainer.config import Config


def task_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **environ: str) -> dict[str, str]:
    """What `make up NAME=VALUE ...` gives the chief: the Compose target reading its environment, as up.sh does."""
    for name in knobs.names():
        monkeypatch.delenv(name, raising=False)
    for name, value in environ.items():
        monkeypatch.setenv(name, value)
    assert emit.main(["--target", "compose", "--workers", "1", "--gpus", "0", "--out", str(tmp_path)]) == 0
    services = yaml.safe_load((tmp_path / "compose.tasks.yaml").read_text())["services"]
    return services["chief"]["environment"]


def test_every_trainer_flag_is_a_knob_but_what_the_stack_sets() -> None:
    fields = {f.name.upper() for f in dataclasses.fields(Config)}
    stack_set = {"METRICS_PORT", "METRICS_LINGER", "CHECKPOINT_DIR", "DATA", "LOGDIR", "PROFILER_PORT"}
    assert set(knobs.names()) == fields - stack_set


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


def test_default_job_trains_for_minutes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    steps = int(task_env(tmp_path, monkeypatch).get("TRAINER_STEPS", Config.steps))
    # Prometheus scrapes every 5 s: the default job must outlast many scrapes at the measured rate.
    assert steps / knobs.MEASURED_STEPS_PER_SECOND >= 180, f"the default job trains {steps} steps"
    err = capsys.readouterr().err
    assert f"training {steps} steps, ~4 min" in err and "STEPS=N to change" in err


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
    monkeypatch.setenv(name, value)
    assert (
        emit.main(["--target", "compose", "--workers", "1", "--gpus", "0", "--out", str(tmp_path / "run")])
        == 2
    )
    err = capsys.readouterr().err
    assert says in err and err.count("\n") == 1, err
    assert not (tmp_path / "run").exists()
