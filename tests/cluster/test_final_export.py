"""The end of a job with BatchNorm (the default `cnn` task) and a copy-out folder: the final model
and summary reach --export-dir and every task exits 0. The chief alone once read BatchNorm's
sync-on-read statistics for the summary after its peers had left: that read is a collective, so the
chief lost its peers, restarted, and waited for tasks that had finished (seen on `make up WORKERS=3`)."""

import json

import pytest

from tests.cluster.local import launch

pytestmark = pytest.mark.cluster


def test_a_batchnorm_job_copies_its_model_out_and_every_task_exits_0(tmp_path):
    ckpt, out = tmp_path / "ckpt", tmp_path / "out"
    run = launch(
        *("--task", "cnn", "--steps", "20", "--save-every", "10", "--log-every", "10"),
        *("--checkpoint-dir", str(ckpt), "--export-dir", str(out), "--heartbeat-timeout", "10"),
        timeout=600,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_step"] == 20
    assert (out / "model" / "saved_model.pb").exists(), sorted(p.name for p in out.iterdir())
