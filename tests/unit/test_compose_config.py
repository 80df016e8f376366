"""Every generated variant, rendered by Compose itself (`docker compose config`), GPU included.

Needs only the Compose CLI, not a running engine. With CI=true a missing Compose fails the run.
Checks the stack's security properties on the rendered configuration, for every service.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from compose import generate

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
TRAINER_PORTS = {"2222", "8000"}
VARIANTS = {
    "cpu-1": ["--workers", "1", "--gpus", "0"],
    "cpu-3": ["--workers", "3", "--gpus", "0"],
    "gpu-1": ["--workers", "1", "--gpus", "2"],
    "gpu-3": ["--workers", "3", "--gpus", "8", "--gpus-per-worker", "2"],
    "script-data": ["--workers", "2", "--gpus", "0", "--script", "SCRIPT", "--data", "DATA"],
}


def compose_cli() -> None:
    ok = shutil.which("docker") and subprocess.run(["docker", "compose", "version"],
                                                   capture_output=True).returncode == 0
    if not ok:
        message = "Docker Compose v2 is missing: run `make engine`"
        pytest.fail(message) if os.environ.get("CI") == "true" else pytest.skip(message)


def render(tmp_path: Path, args: list[str], *extra: str) -> subprocess.CompletedProcess:
    compose_cli()
    (tmp_path / "user").mkdir(exist_ok=True)
    (tmp_path / "user" / "train.py").write_text("pass\n")
    args = [str(tmp_path / "user" / "train.py") if a == "SCRIPT" else str(tmp_path / "user") if a == "DATA"
            else a for a in args]
    run_dir = tmp_path / "run"
    ns = generate.parse_args(["--out", str(run_dir), *args])
    files = generate.write(generate.config_from_args(ns, runner=lambda _cmd: ""), run_dir)
    env = {**os.environ, "RUN_DIR": str(run_dir), "SECRETS_DIR": str(tmp_path / "secrets"),
           "COMPOSE_PROFILES": "grafana", "PROMETHEUS_IMAGE": "mwms/prometheus:2.42.0-bookworm"}
    env.pop("BIND_ADDR", None)
    cmd = ["docker", "compose", "--project-directory", str(ROOT)]
    for f in files:
        cmd += ["-f", str(f if f.is_absolute() else ROOT / f)]
    return subprocess.run([*cmd, "config", *extra], capture_output=True, text=True, env=env, cwd=ROOT)


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_config_is_valid(tmp_path: Path, variant: str) -> None:
    result = render(tmp_path, VARIANTS[variant], "-q")
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_security_properties_of_every_service(tmp_path: Path, variant: str) -> None:
    result = render(tmp_path, VARIANTS[variant], "--format", "json")
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    services = config["services"]
    assert "grafana" in services and "prometheus" in services
    for name, svc in services.items():
        user = svc.get("user", "")
        assert user and user.split(":")[0] not in ("0", "root"), f"{name} runs as root"
        assert svc.get("cap_drop") == ["ALL"], name
        assert "no-new-privileges:true" in svc.get("security_opt", []), name
        assert svc.get("read_only") is True, name
        for vol in svc.get("volumes", []):
            assert "docker.sock" not in vol.get("source", ""), f"{name} mounts the Docker socket"
        env = svc.get("environment") or {}
        assert not any("PASSWORD" in k and not k.endswith("__FILE") for k in env), f"{name}: password in env"
        published = svc.get("ports", [])
        if name in ("prometheus", "grafana"):
            assert [(p["host_ip"], p["target"]) for p in published] == \
                [("127.0.0.1", 9090 if name == "prometheus" else 3000)]
        else:
            assert not published, f"{name} publishes {published}"
            assert set(svc["expose"]) == TRAINER_PORTS
            assert svc["networks"].keys() == {"cluster"}
            assert svc["init"] is True and svc["restart"] == "no"  # trainer.supervise restarts tasks
            writable = [v for v in svc.get("volumes", []) if not v.get("read_only")]
            assert [v["target"] for v in writable] == (["/checkpoints"] if name == "chief" else [])
    assert config["networks"]["cluster"]["internal"] is True
    assert services["grafana"]["secrets"][0]["source"] == "grafana_admin_password"


def test_gpu_devices_are_disjoint(tmp_path: Path) -> None:
    result = render(tmp_path, VARIANTS["gpu-3"], "--format", "json")
    assert result.returncode == 0, result.stderr
    seen: list[str] = []
    for name, svc in json.loads(result.stdout)["services"].items():
        if name in ("prometheus", "grafana"):
            continue
        device = svc["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["driver"] == "nvidia" and len(device["device_ids"]) == 2
        seen += device["device_ids"]
        assert int(svc["shm_size"]) >= 2 ** 31 and svc["image"].endswith("-gpu")
    assert sorted(seen, key=int) == [str(i) for i in range(8)]


def test_bind_addr_moves_every_published_port(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("BIND_ADDR", "10.1.2.3")
    compose_cli()
    run_dir = tmp_path / "run"
    files = generate.write(generate.config_from_args(
        generate.parse_args(["--workers", "1", "--gpus", "0", "--out", str(run_dir)]), runner=lambda _c: ""), run_dir)
    cmd = ["docker", "compose", "--project-directory", str(ROOT), "--profile", "grafana"]
    for f in files:
        cmd += ["-f", str(f if f.is_absolute() else ROOT / f)]
    out = subprocess.run([*cmd, "config", "--format", "json"], capture_output=True, text=True, cwd=ROOT,
                         env={**os.environ, "RUN_DIR": str(run_dir), "SECRETS_DIR": str(tmp_path)}, check=True)
    ports = [p for svc in json.loads(out.stdout)["services"].values() for p in svc.get("ports", [])]
    assert {p["host_ip"] for p in ports} == {"10.1.2.3"} and len(ports) == 2
