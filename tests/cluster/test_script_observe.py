"""A user's unmodified script under the SCRIPT= wrapper, as local processes: every step is counted,
and the sampled split agrees with a near-full profiler trace of the same run (TRAINER_SPLIT_CHECK=1:
windows back to back, only those at the period exported)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.cluster.local import ROOT

SCRIPTS = ROOT / "tests" / "scripts"
CHECK = re.compile(r"^\[(\S+)\] observe-check: (\{.*\})$", re.M)
SUMMARY = re.compile(
    r"^\[(\S+)\] .* observe: (\d+) steps, [\d.]+ ms/step, global step (\d+), (\d+) examples", re.M
)
TOLERANCE = 0.10
"""Exported share vs the trace's, relative (the brief's 10 %)."""


def _run(script: str, **env: str):
    # local.launch keeps the caller's TRAINER_* out: these runs need their own.
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    settings = {"TRAINER_SPLIT_PERIOD_S": "4", "TRAINER_SPLIT_CHECK": "1", "TF_CPP_MIN_LOG_LEVEL": "2"}
    cmd = [sys.executable, "-m", "bench.launch", "--workers", "1", "--metrics-port", "0"]
    cmd += ["--module", "trainer.run_script", str(SCRIPTS / script)]
    out = subprocess.run(
        cmd,
        cwd=ROOT,
        env={**clean, **settings, **env},
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    assert out.returncode == 0, out.stdout[-3000:]
    return out.stdout


def _agreement(stdout: str) -> dict[str, dict]:
    checks = {task: json.loads(text) for task, text in CHECK.findall(stdout)}
    assert set(checks) == {"chief", "worker-0"}, stdout[-3000:]
    for task, check in checks.items():
        exported, reference = check["exported"], check["reference"]
        assert check["samples"] >= 2 and check["reference_calls"] > check["samples"], (task, check)
        for part in ("compute", "allreduce"):
            deviation = abs(exported[part] - reference[part]) / reference[part]
            print(
                f"{task} {part}: exported {exported[part]:.1%} trace {reference[part]:.1%} ({deviation:.1%})"
            )
            assert deviation <= TOLERANCE, (task, part, check)
    return checks


def test_fit_script_split_agrees_with_the_trace_and_every_step_counts():
    stdout = _run("fit_cnn.py", EPOCHS="6", STEPS_PER_EPOCH="100", STEPS_PER_EXECUTION="10", BATCH="32")
    _agreement(stdout)
    summaries = {task: tuple(map(int, rest)) for task, *rest in SUMMARY.findall(stdout)}
    # fit's batch is not static (no drop_remainder): steps counted, examples honestly not.
    assert summaries == {t: (600, 600, 0) for t in ("chief", "worker-0")}, stdout[-2000:]


@pytest.mark.parametrize("distribute", ["function", "dataset"])
def test_custom_loop_split_agrees_with_the_trace_and_every_step_counts(distribute):
    stdout = _run("custom_loop.py", STEPS="1500", DISTRIBUTE=distribute, BATCH="32")
    _agreement(stdout)
    summaries = {task: tuple(map(int, rest)) for task, *rest in SUMMARY.findall(stdout)}
    # The first call traces the function and is not timed; the global step is the optimizer's.
    assert summaries == {t: (1499, 1500, 1499 * 32) for t in ("chief", "worker-0")}, stdout[-2000:]
