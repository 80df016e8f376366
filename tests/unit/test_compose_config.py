"""Every generated variant, rendered by Compose itself (`docker compose config`), GPU included.

Needs only the Compose CLI, not a running engine (the `compose_cli` fixture: fails in CI, skips
elsewhere). The security properties of every service are tested once, in tests/e2e/test_security.py.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from compose import emit, services

MONITORING_SERVICES = tuple(s.name for s in services.SERVICES)

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
VARIANTS = {
    "cpu-1": ["--workers", "1", "--gpus", "0"],
    "cpu-3": ["--workers", "3", "--gpus", "0"],
    "gpu-1": ["--workers", "1", "--gpus", "2"],
    "gpu-3": ["--workers", "3", "--gpus", "8", "--gpus-per-worker", "2"],
    "script-data": ["--workers", "2", "--gpus", "0", "--script", "SCRIPT", "--data", "DATA"],
}


@pytest.fixture(autouse=True)
def _compose(compose_cli) -> None:
    """Every test here renders with the Compose CLI."""


def render(tmp_path: Path, args: list[str], *extra: str) -> subprocess.CompletedProcess:
    (tmp_path / "user").mkdir(exist_ok=True)
    (tmp_path / "user" / "train.py").write_text("pass\n")
    args = [
        str(tmp_path / "user" / "train.py") if a == "SCRIPT" else str(tmp_path / "user") if a == "DATA" else a
        for a in args
    ]
    run_dir = tmp_path / "run"
    r = emit.run(["--target", "compose", "--out", str(run_dir), *args])
    emit.write(r)
    files = r.emitted.extra["compose_files"]
    env = {
        **os.environ,
        "RUN_DIR": str(run_dir),
        "SECRETS_DIR": str(tmp_path / "secrets"),
        "COMPOSE_PROFILES": "grafana",
        "PROMETHEUS_IMAGE": "mwms/prometheus:2.42.0-bookworm",
    }
    env.pop("BIND_ADDR", None)
    cmd = ["docker", "compose", "--project-directory", str(ROOT)]
    for f in files:
        cmd += ["-f", str(f if f.is_absolute() else ROOT / f)]
    return subprocess.run([*cmd, "config", *extra], capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_is_valid(tmp_path: Path, variant: str) -> None:
    result = render(tmp_path, VARIANTS[variant], "-q")
    assert result.returncode == 0, result.stderr


def test_gpu_devices_are_disjoint(tmp_path: Path) -> None:
    result = render(tmp_path, VARIANTS["gpu-3"], "--format", "json")
    assert result.returncode == 0, result.stderr
    seen: list[str] = []
    for name, svc in json.loads(result.stdout)["services"].items():
        if name in MONITORING_SERVICES:
            continue
        device = svc["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["driver"] == "nvidia" and len(device["device_ids"]) == 2
        seen += device["device_ids"]
        assert int(svc["shm_size"]) >= 2**31 and svc["image"].endswith("-gpu")
    assert sorted(seen, key=int) == [str(i) for i in range(8)]
