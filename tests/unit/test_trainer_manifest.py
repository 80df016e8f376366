"""trainer/state/manifest.py without TensorFlow: what a published checkpoint is, and `make up`'s question
to the checkpoint volume before any task starts (python -m trainer.state.manifest)."""

from __future__ import annotations

import pytest

from trainer.config import Config
from trainer.errors import EXIT_CONFIG
from trainer.state import manifest


def _save(folder, step: int) -> None:
    prefix = folder / f"ckpt-{step}"
    (folder / f"ckpt-{step}.index").write_bytes(b"i" * 10)
    (folder / f"ckpt-{step}.data-00000-of-00001").write_bytes(b"d" * 100)
    manifest.publish(str(prefix), step, manifest.job_settings(Config(), 2))


def test_scan_takes_the_newest_intact_and_says_why_it_skipped(tmp_path):
    for step in (20, 40, 60):
        _save(tmp_path, step)
    (tmp_path / "ckpt-60.data-00000-of-00001").write_bytes(b"d" * 99)
    (tmp_path / "ckpt-80.index").write_bytes(b"half a save")
    found = manifest.scan(str(tmp_path))
    assert found.step == 40 and found.intact == (str(tmp_path / "ckpt-20"), str(tmp_path / "ckpt-40"))
    assert found.skipped == (
        f"skipping checkpoint {tmp_path}/ckpt-80: no ckpt-80.manifest.json: its save never finished "
        "(a crash or a full disk during the save)",
        f"skipping checkpoint {tmp_path}/ckpt-60: ckpt-60.data-00000-of-00001 is truncated (99 of 100 bytes)",
    )


def test_same_size_corruption_and_a_garbled_manifest_are_caught(tmp_path):
    _save(tmp_path, 20)
    _save(tmp_path, 40)
    (tmp_path / "ckpt-40.index").write_bytes(b"x" * 10)
    assert "corrupt" in manifest.damage(str(tmp_path / "ckpt-40"))
    (tmp_path / "ckpt-20.manifest.json").write_text("{not json")
    assert manifest.damage(str(tmp_path / "ckpt-20")) == "ckpt-20.manifest.json is garbled"


def test_differences_name_each_job_setting_and_ignore_the_rest():
    saved = manifest.job_settings(Config(), 2)
    now = manifest.job_settings(Config(seed=1, steps=999, log_every=3), None)
    assert manifest.differences(saved, now) == [
        "--seed: checkpoint 0, now 1 (another initialisation and synthetic teacher: a resumed run would learn "
        "another problem)"
    ]


def _up(tmp_path, capsys, **env: str) -> tuple[int, str]:
    code = manifest.main(["--checkpoint-dir", str(tmp_path)], env=env)
    return code, capsys.readouterr().err


def test_make_up_says_at_once_that_there_is_nothing_to_train(tmp_path, capsys):
    _save(tmp_path, 300)
    code, err = _up(tmp_path, capsys, TRAINER_STEPS="200")
    assert code == manifest.NOTHING_TO_TRAIN
    assert "nothing to train: the checkpoint volume holds step 300" in err and "STEPS=200" in err
    assert "STEPS=N above 300" in err and "make clean" in err


@pytest.mark.parametrize("accept, expected", [("0", EXIT_CONFIG), ("1", 0)])
def test_make_up_refuses_other_settings_unless_told(tmp_path, capsys, accept, expected):
    _save(tmp_path, 300)
    code, err = _up(
        tmp_path,
        capsys,
        TRAINER_STEPS="400",
        TRAINER_LEARNING_RATE="0.05",
        TRAINER_RESUME_NEW_SETTINGS=accept,
    )
    assert code == expected, err
    if expected:
        assert "--learning-rate: checkpoint 0.01, now 0.05" in err and "RESUME_NEW_SETTINGS=1" in err
    else:
        assert "resuming at step 300 of 400" in err


def test_an_empty_volume_starts(tmp_path, capsys):
    assert _up(tmp_path, capsys, TRAINER_STEPS="10") == (0, "")


def test_a_script_after_the_demo_starts_its_own_folder_and_keeps_the_demos(tmp_path, capsys):
    """Issue 29: `make up TASK=mlp`, `make down`, `make up SCRIPT=train.py` was refused over --task and
    --learning-rate, flags a script does not have; the advice (`make clean`) would delete the demo's."""
    _save(tmp_path, 300)
    script_env = {"TRAINER_TASK": "cnn", "TRAINER_LEARNING_RATE": "0.003", "TRAINER_STEPS": "8000"}
    assert manifest.main(["--checkpoint-dir", str(tmp_path)], env=script_env) == EXIT_CONFIG  # as before
    capsys.readouterr()
    env = {**script_env, "TRAINER_CHECKPOINT_DIR": f"{tmp_path}/script"}
    assert manifest.main(["--checkpoint-dir", str(tmp_path), "--script"], env=env) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "task mlp, step 300" in err and f"{tmp_path}/script" in err, err
    assert manifest.scan(str(tmp_path)).step == 300  # the demo's checkpoint is still there


def test_a_script_runs_checkpoints_in_its_own_folder_on_every_target():
    from compose import deployment

    d = deployment.Deployment(workers=1, script="tests/scripts/fit_cnn.py")
    assert deployment.trainer_env(d)["TRAINER_CHECKPOINT_DIR"] == deployment.SCRIPT_CHECKPOINT_DIR
    assert (
        deployment.trainer_env(deployment.Deployment(workers=1))["TRAINER_CHECKPOINT_DIR"] == "/checkpoints"
    )


def _resize(tmp_path, capsys, replicas: int, **env: str) -> tuple[int, str]:
    code = manifest.main(["--checkpoint-dir", str(tmp_path), "--replicas", str(replicas)], env=env)
    return code, capsys.readouterr().err


def test_make_up_at_another_world_size_goes_on_and_says_what_changed(tmp_path, capsys):
    _save(tmp_path, 300)  # 2 replicas of 32
    code, err = _resize(tmp_path, capsys, 4, TRAINER_STEPS="400")
    assert code == 0, err
    assert (
        "up: resized at step 300: 2 -> 4 replicas, global batch 64 -> 128 (4 x 32), peak lr 0.02 -> 0.04"
        in err
    )
    assert "resuming at step 300 of 400" in err
    assert _resize(tmp_path, capsys, 2, TRAINER_STEPS="400") == (0, "up: resuming at step 300 of 400\n")


def test_make_up_refuses_a_kept_global_batch_that_does_not_divide_and_other_settings_still(tmp_path, capsys):
    _save(tmp_path, 300)
    code, err = _resize(tmp_path, capsys, 3, TRAINER_STEPS="400", TRAINER_RESIZE_KEEP="global-batch")
    assert code == EXIT_CONFIG and err.count("\n") == 1
    assert "global batch 64 does not divide over 3 replicas" in err
    code, err = _resize(tmp_path, capsys, 4, TRAINER_STEPS="400", TRAINER_SEED="7")
    assert code == EXIT_CONFIG and "--seed: checkpoint 0, now 7" in err
