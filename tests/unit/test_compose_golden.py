"""Golden files: the Compose target's output for WORKERS=1 and 3, CPU and GPU, frozen byte for byte.

A diff here means `make up` now starts something different. If that is intended, run `make golden`
and review the diff of tests/golden/ like code.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from compose import emit, knobs

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
FIXED = ["--base-image", "mwms/python:3.11-bookworm", "--run", "20261201T090000Z"]
KNOBS = knobs.on_command_line(STEPS="200")


def render(workers: int, variant: str, out: Path) -> dict[str, str]:
    gpu_flag = ["--gpus", "0"] if variant == "cpu" else ["--gpus", "0,1,2,3", "--gpus-per-worker", "1"]
    argv = ["--target", "compose", "--workers", str(workers), "--out", str(out), *gpu_flag, *FIXED]
    emit.write(emit.run(argv, environ=KNOBS))
    files = {
        "compose.tasks.yaml": out / "compose.tasks.yaml",
        "targets.json": out / "targets" / "trainers.json",
    }
    if workers == 1:  # the services beside the trainers do not depend on the number of workers
        files["compose.base.yaml"] = out / "compose.base.yaml"
    if variant == "gpu":
        files = {"compose.gpu.yaml": out / "compose.gpu.yaml"}
    return {f"{variant}-workers-{workers}.{name}": path.read_text() for name, path in files.items()}


@pytest.mark.parametrize("variant", ["cpu", "gpu"])
@pytest.mark.parametrize("workers", [1, 3])
def test_generated_files_match_golden(tmp_path: Path, workers: int, variant: str) -> None:
    for name, text in render(workers, variant, tmp_path).items():
        golden = GOLDEN / name
        if os.environ.get("UPDATE_GOLDEN") == "1":
            golden.write_text(text)
        assert golden.exists(), f"{golden} is missing: run `make golden`"
        assert text == golden.read_text(), f"{name} differs from tests/golden: run `make golden` if intended"


def test_cpu_run_writes_no_gpu_overlay(tmp_path: Path) -> None:
    (tmp_path / "compose.gpu.yaml").write_text("stale")
    render(1, "cpu", tmp_path)
    assert not (tmp_path / "compose.gpu.yaml").exists()
    assert "compose.gpu.yaml" not in (tmp_path / "compose.args").read_text()
