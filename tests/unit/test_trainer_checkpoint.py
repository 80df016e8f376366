"""Checkpoint integrity, the job-settings check and the input position, on the real trainer in-process
(MirroredStrategy, one replica, tiny MLP): what a crash, a full disk or a changed command leaves."""

import json
import logging
import os
import shutil
import subprocess

import pytest

import trainer  # noqa: F401 (sets TF_USE_LEGACY_KERAS before TensorFlow is imported)

# isort: split
from tests.unit.test_trainer_training import Recorder
from trainer.assembly import training
from trainer.cluster.spec import TaskId
from trainer.config import Config
from trainer.errors import ConfigError
from trainer.state import checkpoint, manifest, output


def _run(out, **overrides) -> dict:
    config = Config(
        **{"strategy": "mirrored", "metrics_port": 0, "output_dir": str(out), "save_every": 20, **overrides}
    )
    training.run(config, None, TaskId("chief", 0), Recorder(), release_port=lambda: None)
    return json.loads((out / "chief.json").read_text())


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A finished 60-step run saving every 20 steps: ckpt-20, -40, -60, and its summary."""
    root = tmp_path_factory.mktemp("trained")
    summary = _run(root / "out", steps=60, checkpoint_dir=str(root / "ckpt"))
    return root / "ckpt", summary


def _copy(trained, tmp_path):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(trained[0], ckpt)
    return ckpt


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


DAMAGE = {
    "index missing": (lambda c: os.remove(c / "ckpt-60.index"), "ckpt-60.index is missing"),
    "data missing": (
        lambda c: os.remove(c / "ckpt-60.data-00000-of-00001"),
        "data-00000-of-00001 is missing",
    ),
    "data truncated": (lambda c: _truncate(c / "ckpt-60.data-00000-of-00001"), "is truncated"),
    "index truncated": (lambda c: _truncate(c / "ckpt-60.index"), "ckpt-60.index is truncated"),
    "manifest missing (save never finished)": (
        lambda c: os.remove(c / "ckpt-60.manifest.json"),
        "its save never finished",
    ),
    "state file empty": (lambda c: (c / "checkpoint").write_text(""), None),
    "state file garbled": (lambda c: (c / "checkpoint").write_text("\x00garbage {{{"), None),
}


@pytest.mark.parametrize("kind", DAMAGE)
def test_damaged_newest_checkpoint_is_skipped_with_a_warning(trained, tmp_path, caplog, kind):
    ckpt = _copy(trained, tmp_path)
    damage, why = DAMAGE[kind]
    damage(ckpt)
    with caplog.at_level(logging.INFO):
        summary = _run(tmp_path / "out", steps=80, checkpoint_dir=str(ckpt))
    expected = 40 if why else 60  # a broken state file alone loses nothing: the files are intact
    assert summary["start_step"] == expected and summary["final_step"] == 80
    warnings = [
        r.getMessage() for r in caplog.records if r.levelno == logging.WARNING and "skipping" in r.message
    ]
    if why:
        assert len(warnings) == 1 and f"{ckpt}/ckpt-60" in warnings[0] and why in warnings[0], warnings
    else:
        assert not warnings
    assert manifest.scan(str(ckpt)).step == 80  # and the next save is intact again


def test_every_checkpoint_damaged_starts_at_zero_saying_why(trained, tmp_path, caplog):
    ckpt = _copy(trained, tmp_path)
    for step in (20, 40, 60):
        os.remove(ckpt / f"ckpt-{step}.index")
    with caplog.at_level(logging.WARNING):
        summary = _run(tmp_path / "out", steps=30, checkpoint_dir=str(ckpt))
    assert summary["start_step"] == 0
    assert len([r for r in caplog.records if "skipping checkpoint" in r.getMessage()]) == 3


def test_changed_job_settings_stop_before_training(trained, tmp_path):
    ckpt = _copy(trained, tmp_path)
    with pytest.raises(ConfigError) as err:
        _run(tmp_path / "out", steps=80, checkpoint_dir=str(ckpt), learning_rate=0.05, seed=3)
    text = str(err.value)
    assert "--learning-rate: checkpoint 0.01, now 0.05" in text and "--seed: checkpoint 0, now 3" in text
    assert "make clean" in text and manifest.ACCEPT_FLAG in text
    assert not (tmp_path / "out").exists(), "nothing may train"


def test_changed_settings_resume_when_accepted_with_the_new_rate(trained, tmp_path):
    ckpt = _copy(trained, tmp_path)
    summary = _run(
        tmp_path / "out",
        steps=70,
        checkpoint_dir=str(ckpt),
        learning_rate=0.05,
        lr_scaling="none",
        resume_new_settings=1,
    )
    assert summary["start_step"] == 60
    saved = manifest.read(str(ckpt / "ckpt-70"))["settings"]
    assert saved["learning_rate"] == 0.05 and saved["lr_scaling"] == "none"


def test_settings_that_do_not_define_the_job_may_change(trained, tmp_path):
    ckpt = _copy(trained, tmp_path)
    summary = _run(tmp_path / "out", steps=70, checkpoint_dir=str(ckpt), log_every=3, save_every=5)
    assert summary["start_step"] == 60


def test_input_resumes_where_the_checkpoint_left_it(trained, tmp_path):
    """Steps 0-60 then 60-80 see exactly the examples of one uninterrupted 0-80 run."""
    ckpt = _copy(trained, tmp_path)
    resumed = _run(tmp_path / "out", steps=80, checkpoint_dir=str(ckpt))
    whole = _run(tmp_path / "whole", steps=80)
    first, second = set(trained[1]["example_ids"]), set(resumed["example_ids"])
    assert not first & second, f"{len(first & second)} examples seen twice"
    assert first | second == set(whole["example_ids"])


@pytest.fixture
def small_disk(tmp_path):
    """A 1 MiB tmpfs: room for a couple of checkpoints of the MLP (~85 kB each), not for the export."""
    mount = tmp_path / "disk"
    mount.mkdir()
    rc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=False
    ).returncode
    if rc != 0:
        pytest.fail("cannot mount a tmpfs (the test runs as root on CI)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False)


def test_full_disk_keeps_the_previous_checkpoint_and_ends_in_one_line(trained, tmp_path, small_disk):
    for name in os.listdir(trained[0]):
        if name.startswith("ckpt-60") or name == "checkpoint":
            shutil.copy(trained[0] / name, small_disk / name)
    filler = small_disk / "filler"
    free = os.statvfs(small_disk).f_bavail * os.statvfs(small_disk).f_frsize
    filler.write_bytes(b"\0" * (free - 20_000))  # the next checkpoint (~85 kB) cannot fit
    with pytest.raises(checkpoint.SaveError) as err:
        _run(tmp_path / "out", steps=80, checkpoint_dir=str(small_disk))
    message = str(err.value)
    assert "\n" not in message and "saving checkpoint step 80" in message, message
    assert "ckpt-60 is intact" in message
    filler.unlink()
    assert manifest.scan(str(small_disk)).step == 60
    assert not [n for n in os.listdir(small_disk) if n.startswith("ckpt-80")], "partial files left behind"


def test_scratch_export_folder_of_a_non_chief_is_one_per_task_and_job(tmp_path):
    a = checkpoint.private_dir(str(tmp_path / "job"), "worker-0")
    assert a == checkpoint.private_dir(str(tmp_path / "job"), "worker-0")
    assert a != checkpoint.private_dir(str(tmp_path / "job"), "worker-1")
    assert a != checkpoint.private_dir(str(tmp_path / "other"), "worker-0")


def _replica(trained, ckpt, task: str, drop: tuple[int, ...] = ()) -> str:
    """A copy of the trained job's saves as task `task` keeps them, without the steps in `drop`."""
    folder = checkpoint.task_dir(str(ckpt), task, task == "chief")
    shutil.copytree(trained[0], folder, dirs_exist_ok=True)
    for step in drop:
        for name in os.listdir(folder):
            if name.startswith(f"ckpt-{step}."):
                os.remove(os.path.join(folder, name))
    return folder


def _newest(ckpt, own: str) -> manifest.Scan:
    return manifest.newest([manifest.scan(f) for f in checkpoint.copies(str(ckpt), own)])


def test_restore_source_is_the_newest_intact_copy_in_any_tasks_folder(trained, tmp_path):
    ckpt = tmp_path / "ckpt"
    _replica(trained, ckpt, "chief", drop=(60,))
    worker0 = _replica(trained, ckpt, "worker-0")
    worker1 = _replica(trained, ckpt, "worker-1")
    index = os.path.join(worker1, "ckpt-60.index")
    with open(index, "r+b") as f:  # damaged: its copy of 60 is skipped
        first = f.read(1)
        f.seek(0)
        f.write(bytes([first[0] ^ 0xFF]))
    for own in (str(ckpt), worker1):
        found = _newest(ckpt, own)
        assert (found.step, found.prefix) == (60, os.path.join(worker0, "ckpt-60")), own
    shutil.rmtree(worker0)
    # A tie goes to the asking task's own folder, then the chief's.
    assert _newest(ckpt, worker1).prefix == os.path.join(worker1, "ckpt-40")
    assert _newest(ckpt, str(ckpt)).prefix == os.path.join(str(ckpt), "ckpt-40")
    assert _newest(tmp_path / "none", str(tmp_path / "none")).prefix is None


def test_the_cluster_restores_from_the_task_with_the_newest_step_the_chief_on_a_tie():
    assert checkpoint.holder([[40.0, 0.0], [60.0, 1.0], [60.0, 2.0]]) == 1
    assert checkpoint.holder([[60.0, 0.0], [60.0, 1.0]]) == 0
    assert checkpoint.holder([[-1.0, 0.0], [20.0, 1.0]]) == 1
    assert checkpoint.holder([[-1.0, 0.0], [-1.0, 1.0]]) is None


def test_a_chief_whose_own_saves_are_lost_resumes_from_a_workers_copy(trained, tmp_path):
    """Swarm: the chief's node is gone with its volume; it restarts where worker-0's copy lives."""
    ckpt = tmp_path / "ckpt"
    _replica(trained, ckpt, "worker-0")
    summary = _run(tmp_path / "out", steps=80, checkpoint_dir=str(ckpt))
    assert summary["start_step"] == 60, summary
    assert manifest.scan(str(ckpt)).step == 80, "the chief saves its own copy again"


def test_the_final_model_and_summary_are_copied_out(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "output"
    _run(tmp_path / "out", steps=20, checkpoint_dir=str(ckpt))
    assert output.uncopied(str(ckpt)), "a final model only in the checkpoint folder"
    _run(tmp_path / "out", steps=30, checkpoint_dir=str(ckpt), export_dir=str(out))
    assert (out / "model" / "saved_model.pb").exists()
    body = json.loads((out / "summary.json").read_text())
    assert body["final_step"] == 30 and body["settings"]["task"] == "mlp"
    assert not output.uncopied(str(ckpt))
    _run(tmp_path / "out", steps=40, checkpoint_dir=str(ckpt))  # a later export, not copied: uncopied again
    assert output.uncopied(str(ckpt))
    assert output.main(["copy", "--checkpoint-dir", str(ckpt), "--to", str(out)]) == 0  # `make output`
    assert json.loads((out / "summary.json").read_text())["final_step"] == 40 and not output.uncopied(
        str(ckpt)
    )


def test_a_peer_lost_during_a_save_is_retryable_not_a_failed_disk(tmp_path, monkeypatch):
    """Swarm, the chief's node removed during a save: worker-0's save failed in its collective
    (DeadlineExceededError) and was booked as a failed disk (exit 1, final), ending the job."""
    import tensorflow as tf

    ckpt = checkpoint.Checkpointer(
        checkpoint.Place(str(tmp_path / "ckpt"), "worker-0", is_chief=False),
        tf.Module(),
        tf.Module(),
        settings={},
    )
    aborted = tf.errors.DeadlineExceededError(None, None, "Collective ops is aborted by: Deadline Exceeded")

    def save(checkpoint_number=None):
        open(os.path.join(ckpt.manager.directory, f"ckpt-{checkpoint_number}.index"), "w").close()
        raise aborted

    monkeypatch.setattr(ckpt.manager, "save", save)
    with pytest.raises(tf.errors.DeadlineExceededError):
        ckpt.save(100)
    assert not manifest.steps_in(ckpt.manager.directory), "the unfinished save's files are left"
