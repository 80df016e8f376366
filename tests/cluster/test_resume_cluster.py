"""Resuming a real MWMS cluster (chief + 1 worker as processes) across SIGKILLs: the input position,
what non-chiefs leave in their temporary folder, and a resume with new settings on every task."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from bench.launch import free_ports
from tests.cluster.local import ROOT
from trainer.cluster import on_ports

pytestmark = pytest.mark.cluster
BATCH = "8"  # 1024 steps per epoch of a pipeline's shard: every run here stays inside the first epoch


def _env(tmp_path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    return {**env, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp_path), **extra}


def _launch(tmp_path, *args: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "bench.launch", "--workers", "1", "--metrics-port", "0"]
    cmd += ["--per-replica-batch", BATCH, *args]
    log = open(tmp_path / "launch.log", "a")  # noqa: SIM115 (closed with the process)
    return subprocess.Popen(cmd, cwd=ROOT, env=_env(tmp_path / "tmp"), stdout=log, stderr=subprocess.STDOUT)


def _log(tmp_path) -> str:
    return (tmp_path / "launch.log").read_text()[-4000:]


def _finish(tmp_path, *args: str) -> None:
    proc = _launch(tmp_path, *args)
    assert proc.wait(timeout=300) == 0, _log(tmp_path)


def _ids(out) -> set[int]:
    ids = [json.load(open(out / f"{t}.json"))["example_ids"] for t in ("chief", "worker-0")]
    assert not set(ids[0]) & set(ids[1]), "tasks overlapped"
    return set(ids[0]) | set(ids[1])


def _latest(ckpt) -> int:
    found = [int(m.group(1)) for n in os.listdir(ckpt) if (m := re.match(r"ckpt-(\d+)\.manifest\.json$", n))]
    return max(found, default=0)


def test_input_resumes_across_kills_and_temporary_copies_do_not_pile_up(tmp_path):
    ckpt = tmp_path / "ckpt"
    (tmp_path / "tmp").mkdir()
    left = []
    for _ in range(5):
        before = _latest(ckpt) if ckpt.exists() else 0
        proc = _launch(tmp_path, "--steps", "100000", "--save-every", "20", "--checkpoint-dir", str(ckpt))
        deadline = time.monotonic() + 240
        while not ckpt.exists() or _latest(ckpt) < before + 20:
            assert proc.poll() is None and time.monotonic() < deadline, _log(tmp_path)
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)  # its tasks die with it (PR_SET_PDEATHSIG)
        proc.wait()
        time.sleep(1)
        left.append(len([n for n in os.listdir(tmp_path / "tmp") if n.startswith("trainer-ckpt-")]))
    assert max(left) <= 1, f"non-chief temporary checkpoint folders after each kill: {left}"

    at = _latest(ckpt)
    _finish(
        tmp_path, "--steps", str(at + 20), "--checkpoint-dir", str(ckpt), "--output-dir", str(tmp_path / "r")
    )
    assert f"resumed at step {at}" in _log(tmp_path)
    _finish(tmp_path, "--steps", str(at), "--output-dir", str(tmp_path / "a"))
    _finish(tmp_path, "--steps", str(at + 20), "--output-dir", str(tmp_path / "b"))
    resumed, before, whole = _ids(tmp_path / "r"), _ids(tmp_path / "a"), _ids(tmp_path / "b")
    assert not resumed & before, f"{len(resumed & before)} examples seen again after the resume"
    assert resumed == whole - before, f"{len(whole - before - resumed)} examples skipped"
    assert not [n for n in os.listdir(tmp_path / "tmp") if n.startswith("trainer-ckpt-")], (
        "a finished run leaves none"
    )


def test_resume_with_new_settings_keeps_every_task_identical(tmp_path):
    """The worker cannot read the chief's folder, as in the stack: it must still get the new rate."""
    ckpt = tmp_path / "ckpt"
    common = {"TRAINER_PER_REPLICA_BATCH": BATCH, "TRAINER_LR_SCALING": "none", "TRAINER_METRICS_PORT": "0"}

    def run(**extra: str) -> list[subprocess.CompletedProcess]:
        spec = on_ports("127.0.0.1", free_ports(2))
        procs = []
        for task in spec.tasks:
            own = str(ckpt) if task.type == "chief" else str(tmp_path / "not-shared")
            env = _env(tmp_path, TF_CONFIG=spec.with_task(task).to_tf_config(), TRAINER_CHECKPOINT_DIR=own)
            procs.append(
                subprocess.Popen(
                    [sys.executable, "-m", "trainer"],
                    cwd=ROOT,
                    env={**env, **common, **extra},
                    text=True,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.STDOUT,
                )
            )
        outs = [p.communicate(timeout=300)[0] for p in procs]
        assert [p.returncode for p in procs] == [0, 0], outs[0][-3000:] + outs[1][-3000:]
        return outs

    run(TRAINER_STEPS="20", TRAINER_LEARNING_RATE="0.01")
    out = tmp_path / "out"
    run(
        TRAINER_STEPS="40",
        TRAINER_LEARNING_RATE="0.05",
        TRAINER_RESUME_NEW_SETTINGS="1",
        TRAINER_OUTPUT_DIR=str(out),
    )
    summaries = [json.load(open(out / f"{t}.json")) for t in ("chief", "worker-0")]
    assert [s["start_step"] for s in summaries] == [20, 20]
    assert summaries[0]["weights_sha256"] == summaries[1]["weights_sha256"], "tasks drifted apart"
