"""A SCRIPT= run's target steps come from the script's own run, never from the stack's STEPS: `make up`
sets TRAINER_STEPS (its default 8000) whether or not the script reads it, and a custom loop training
6000 steps showed `step 3920 of 8000` (issue 29)."""

from __future__ import annotations

import subprocess
import sys

from tests.cluster.local import ROOT

PROBE = """
from prometheus_client import CollectorRegistry
import contract
from trainer import observe
from trainer.cluster.spec import TaskId
from trainer.telemetry.metrics import Metrics
registry = CollectorRegistry()
sampler = observe.install(Metrics(registry, TaskId("chief", 0)), {"TRAINER_STEPS": "8000"})
sampler.close()
print([s.value for m in registry.collect() for s in m.samples if s.name == contract.TARGET_STEPS.name])
"""


def test_the_stacks_steps_are_not_the_scripts_target() -> None:
    # A process of its own: install() wraps tf-keras and tf.function for good.
    out = subprocess.run(
        [sys.executable, "-c", PROBE], cwd=ROOT, capture_output=True, text=True, timeout=300, check=False
    )
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split()[-1] == "[0.0]", out.stdout  # 0: the exporter's "unknown"
