"""A chief + workers as local processes (`bench.launch`), run to the end: what the cluster
tests that only read the output share. The caller's TRAINER_* and TF_CONFIG never leak in."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPTS = ROOT / "tests" / "scripts"
"""The user scripts (tests/scripts/README.md)."""
FIT_MNIST = (
    "--model mnist --batch 32 --steps-per-epoch 100 --steps-per-execution 10"
    " --no-drop-remainder --no-prefetch --verbose 2"
).split()
"""tests/scripts/fit_cnn.py as the cluster tests run it (add --epochs): ~1 MB of weights all-reduced a
step, ten steps a call, a batch of no static size (its examples are not counted), Keras' epoch lines."""


def launch(
    *args: str, workers: int = 1, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess:
    """Every task's output in stdout, each line prefixed `[task] `; `env` on top of the caller's clean one."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    cmd = [
        sys.executable,
        "-m",
        "bench.launch",
        "--workers",
        str(workers),
        "--metrics-port",
        "0",
        *args,
    ]
    return subprocess.run(
        cmd,
        cwd=ROOT,
        env={**clean, "TF_CPP_MIN_LOG_LEVEL": "2", **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def start_script(
    script: Path, metrics_port: int, env: dict[str, str], args: Sequence[str] = ()
) -> subprocess.Popen:
    """A chief + 1 worker running `script args` under the SCRIPT= wrapper in the background, metrics
    on metrics_port (chief) and metrics_port + 1 (worker-0); `env` on top of the caller's clean one."""
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    cmd = [sys.executable, "-m", "bench.launch", "--workers", "1", "--metrics-port", str(metrics_port)]
    return subprocess.Popen(
        [*cmd, "--module", "trainer.script.wrapper", str(script), *args],
        cwd=ROOT,
        env={**clean, "TF_CPP_MIN_LOG_LEVEL": "2", **env},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
