"""Security of the stack, read from the configuration Compose would actually run: the one place
these properties are tested.

`docker compose config --format json` over the generated files (CPU and GPU, 1 and 3 workers, a
user's SCRIPT and DATA, every profile), then for every service: published ports bound to BIND_ADDR
only, TensorFlow gRPC and metrics never published, non-root users, `cap_drop: [ALL]`,
`no-new-privileges`, read-only root filesystems with a tmpfs for scratch and only the chief writing
checkpoints, no Docker socket, no privileged or host namespaces, no passwords in environment
variables or images, secrets as files. Needs the Compose CLI only, not a running engine.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

import contract
from compose import emit
from compose import services as described
from compose.deployment import LOG_DIR, METRICS_PORT, TF_PORT, Deployment
from contract import PROFILER_PORT

MONITORING_SERVICES = tuple(s.name for s in described.SERVICES)
PUBLISHED = {
    "prometheus": contract.PROMETHEUS_PORT,
    "alertmanager": contract.ALERTMANAGER_PORT,
    "grafana": contract.GRAFANA_PORT,
    "tensorboard": contract.TENSORBOARD_PORT,
}

pytestmark = pytest.mark.docker
ROOT = Path(__file__).resolve().parents[2]
SECRET_WORDS = re.compile(r"PASSWORD|PASSWD|SECRET|TOKEN|API_KEY", re.I)
VARIANTS = {
    "cpu-1": {"workers": 1},
    "cpu-3": {"workers": 3},
    "gpu-3": {"workers": 2, "gpu_ids": {"chief": ("0", "1"), "worker-0": ("2", "3"), "worker-1": ("4", "5")}},
    "script-data": {"workers": 2, "script": "SCRIPT", "data": "DATA"},
}


def stack_config(tmp_path: Path, variant: str) -> Deployment:
    settings = dict(VARIANTS.get(variant, {"workers": 2}))
    user = tmp_path / "user"
    user.mkdir(parents=True, exist_ok=True)
    (user / "train.py").write_text("pass\n")
    if "script" in settings:
        settings.update(script=str(user / "train.py"), data=str(user))
    return Deployment(**settings)


def render(tmp_path: Path, variant: str, bind_addr: str = "127.0.0.1", more_env: str = "") -> dict:
    out = tmp_path / variant
    files = emit.emit_deployment("compose", stack_config(tmp_path, variant), out).emitted.extra[
        "compose_files"
    ]
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "grafana_admin_password").write_text("not-a-default")
    env = out / "stack.env"
    # What compose/up.sh writes, with every profile enabled so Grafana is checked too.
    env.write_text(
        f"COMPOSE_PROJECT_NAME=mwms-security\nCOMPOSE_PROFILES=grafana\nBIND_ADDR={bind_addr}\n"
        f"PROMETHEUS_IMAGE=mwms/prometheus:2.42.0-bookworm\nRUN_DIR={out}\nSECRETS_DIR={secrets}\n" + more_env
    )
    args = [a for f in files for a in ("-f", str(f))]
    result = subprocess.run(
        [
            "docker",
            "compose",
            "--project-directory",
            str(ROOT),
            "--env-file",
            str(env),
            *args,
            "config",
            "--format",
            "json",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module", params=sorted(VARIANTS))
def config(request, tmp_path_factory, compose_cli) -> dict:
    return render(tmp_path_factory.mktemp("security"), request.param)


def services(config: dict) -> dict[str, dict]:
    found = config["services"]
    assert {"prometheus", "grafana", "chief", "worker-0"} <= set(found), sorted(found)
    return found


def test_published_ports_bind_to_loopback_and_only_the_uis(config) -> None:
    for name, service in services(config).items():
        published = [(p.get("host_ip"), p["target"]) for p in service.get("ports", [])]
        if name in MONITORING_SERVICES:
            assert published == [("127.0.0.1", PUBLISHED[name])], (name, published)
        else:
            assert not published, f"{name} publishes {published}"
            assert set(service["expose"]) == {str(TF_PORT), str(METRICS_PORT), str(PROFILER_PORT)}, name


def test_bind_addr_moves_every_published_port(tmp_path, compose_cli) -> None:
    rendered = render(tmp_path, "cpu", bind_addr="127.0.0.5")
    published = [(n, p["host_ip"]) for n, s in rendered["services"].items() for p in s.get("ports", [])]
    assert published and all(ip == "127.0.0.5" for _, ip in published), published


def test_every_service_runs_unprivileged(config) -> None:
    for name, service in services(config).items():
        user = str(service.get("user", ""))
        assert user and user.split(":")[0] not in ("0", "root"), (
            f"{name} runs as {user or 'the image default'}"
        )
        assert service.get("cap_drop") == ["ALL"], name
        assert not service.get("cap_add"), name
        assert "no-new-privileges:true" in service.get("security_opt", []), name
        assert not service.get("privileged"), name
        for mode in ("network_mode", "pid", "ipc", "userns_mode"):
            assert service.get(mode) != "host", (name, mode)


def test_every_root_filesystem_is_read_only_with_a_scratch_tmpfs(config) -> None:
    for name, service in services(config).items():
        assert service.get("read_only") is True, name
        assert "/tmp" in service.get("tmpfs", []), name
        writable = [v["target"] for v in service.get("volumes", []) if not v.get("read_only")]
        if name not in MONITORING_SERVICES:
            # The checkpoints (the chief's; every task's under SCRIPT=, whose own callbacks save from
            # every worker); every task's supervisor state (its budget across container restarts); every task's
            # TensorBoard log folder (summaries and `make profile`'s traces).
            shared = name == "chief" or "trainer.script.wrapper" in service["command"]
            expected = (["/checkpoints"] if shared else []) + ["/var/lib/supervise", LOG_DIR]
            assert writable == expected, (name, writable)


def test_no_docker_socket_anywhere(config) -> None:
    for name, service in services(config).items():
        for volume in service.get("volumes", []):
            assert "docker.sock" not in f"{volume.get('source', '')} {volume.get('target', '')}", (
                name,
                volume,
            )


def test_no_secret_in_environment_only_file_secrets(config) -> None:
    for name, service in services(config).items():
        for key, value in (service.get("environment") or {}).items():
            if SECRET_WORDS.search(key):
                assert key.endswith("__FILE") and str(value).startswith("/run/secrets/"), (name, key)
            assert not SECRET_WORDS.search(
                str(value) if not str(value).startswith("/run/secrets/") else ""
            ), (name, key)
    for name, secret in config.get("secrets", {}).items():
        assert set(secret) <= {"name", "file"}, f"secret {name} is not a file: {secret}"
    grafana = config["services"]["grafana"]
    assert [s["source"] for s in grafana.get("secrets", [])] == ["grafana_admin_password"]
    assert grafana["environment"].get("GF_AUTH_ANONYMOUS_ENABLED") == "false"


def test_trainer_network_is_internal(config) -> None:
    assert config["networks"]["cluster"].get("internal") is True
    for name, service in services(config).items():
        if name not in MONITORING_SERVICES:
            assert set(service["networks"]) == {"cluster"}, name


def test_no_secret_baked_into_images() -> None:
    for dockerfile in sorted((ROOT / "images").glob("*Dockerfile*")):
        for line in dockerfile.read_text().splitlines():
            if re.match(r"\s*(ENV|ARG)\s", line):
                assert not SECRET_WORDS.search(line), f"{dockerfile.name}: {line}"


# --- Hardening of the monitoring services (docs/security.md) ---


def prometheus_flags(config: dict) -> list[str]:
    return list(config["services"]["prometheus"]["command"])


def test_prometheus_lifecycle_api_is_off_unless_asked(tmp_path, compose_cli) -> None:
    """POST /-/quit and /-/reload have no authentication: off by default, on with PROMETHEUS_LIFECYCLE=1
    (which `make up` turns into this flag in stack.env)."""
    default = prometheus_flags(render(tmp_path, "cpu"))
    assert "--web.enable-lifecycle" not in default and "--no-web.enable-lifecycle" in default
    asked = render(tmp_path / "asked", "cpu", more_env="PROMETHEUS_LIFECYCLE_FLAG=--web.enable-lifecycle\n")
    assert "--web.enable-lifecycle" in prometheus_flags(asked)


def test_prometheus_retention_by_time_and_size(tmp_path, compose_cli) -> None:
    default = prometheus_flags(render(tmp_path, "cpu"))
    assert f"--storage.tsdb.retention.time={described.RETENTION_TIME}" in default
    assert f"--storage.tsdb.retention.size={described.RETENTION_SIZE}" in default
    # `make up` writes the variables empty when not given: the defaults hold.
    empty = "PROMETHEUS_RETENTION_TIME=\nPROMETHEUS_RETENTION_SIZE=\n"
    assert prometheus_flags(render(tmp_path / "empty", "cpu", more_env=empty)) == default
    given = "PROMETHEUS_RETENTION_TIME=2d\nPROMETHEUS_RETENTION_SIZE=500MB\n"
    flags = prometheus_flags(render(tmp_path / "given", "cpu", more_env=given))
    assert {"--storage.tsdb.retention.time=2d", "--storage.tsdb.retention.size=500MB"} <= set(flags)


def test_every_container_log_is_rotated(config) -> None:
    for name, service in services(config).items():
        logging = service.get("logging", {})
        assert logging.get("driver") == "json-file", name
        assert set(logging.get("options", {})) == {"max-size", "max-file"}, name
