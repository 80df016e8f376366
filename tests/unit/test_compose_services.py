"""The seam: one description of every service (compose/services.py), one interface per target
(compose/targets/), one command line, header and writer (compose/emit.py).

The drift these guard against happened before: Swarm's Grafana, hand-written apart from Compose's,
lacked its GF_ANALYTICS_* settings.
"""

from __future__ import annotations

import dataclasses
import subprocess
from pathlib import Path

import pytest
import yaml

from compose import emit, services, targets
from compose.services import ConfigDir, Healthcheck, Service

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "10.210.0.10:5000/mwms/trainer@sha256:" + "0" * 64
EXTRA = Service(
    name="extra",
    title="Extra",
    image="mwms/extra:1.0",
    command=("extra", "--port", "7000"),
    publish=(7000,),
    user="1000:1000",
    volumes=(("extra-data", "/data"),),
    configs=(ConfigDir("monitoring/config/prometheus/tests", "/etc/extra", ("*.yml",)),),
    healthcheck=Healthcheck(("extra", "--check")),
    depends_on=("prometheus",),
    elsewhere="run Extra next to the cluster",
)
"""A service added as one entry, the way docs/architecture.md says (TensorBoard, Alertmanager)."""


def compose_files(tmp_path: Path) -> dict:
    emit.write(emit.run(["--target", "compose", "--workers", "1", "--gpus", "0", "--out", str(tmp_path)]))
    return yaml.safe_load((tmp_path / "compose.base.yaml").read_text())


def swarm_stack(tmp_path: Path, *extra: str) -> dict:
    secrets = tmp_path / "secrets"
    secrets.mkdir(exist_ok=True)
    (secrets / "grafana_admin_password").write_text("x")
    argv = ["--target", "swarm", "--workers", "1", "--image", IMAGE, "--out", str(tmp_path / "swarm")]
    emit.write(emit.run([*argv, "--secrets-dir", str(secrets), *extra]))
    return yaml.safe_load((tmp_path / "swarm" / "stack.yaml").read_text())


def test_every_module_in_targets_is_a_target() -> None:
    assert {"compose", "swarm", "tfjob", "jobset"} <= set(targets.names())
    for name in targets.names():
        target = targets.load(name)
        assert isinstance(target, targets.Target), name


def test_an_unknown_target_is_one_line(capsys: pytest.CaptureFixture) -> None:
    with pytest.raises(SystemExit) as exit_:
        emit.main(["--target", "nomad", "--workers", "1"])
    assert exit_.value.code == 2 and "invalid choice: 'nomad'" in capsys.readouterr().err


def test_one_header_names_the_target_and_how_to_regenerate(tmp_path: Path) -> None:
    for name in targets.names():
        r = emit.run(
            ["--target", name, "--workers", "1", "--gpus-per-worker", "0", "--out", str(tmp_path / name)]
        )
        for path in emit.write(r):
            if path.suffix == ".yaml":
                first = path.read_text().splitlines()[0]
                assert first == f"# {emit.header(name, r.target)}", path
                assert f"--target {name}`" in first and r.target.REMAKE in first


@pytest.mark.parametrize("service", services.SERVICES, ids=lambda s: s.name)
def test_compose_and_swarm_run_the_same_service(tmp_path: Path, service: Service) -> None:
    compose = compose_files(tmp_path)["services"][service.name]
    swarm = swarm_stack(tmp_path, f"--{service.name}-image", service.image)["services"][service.name]
    for key in ("environment", "command", "user", "secrets", "healthcheck"):
        if key == "secrets":
            assert [s["source"] for s in swarm.get(key, [])] == compose.get(key, []), key
        else:
            assert swarm.get(key) == compose.get(key), f"{service.name}: {key} differs"
    assert [p["published"] for p in swarm.get("ports", [])] == list(service.publish)
    assert [p.rsplit(":", 2)[1:] for p in compose.get("ports", [])] == [
        [str(p), str(p)] for p in service.publish
    ]


def test_up_starts_each_optional_service_whose_image_is_here(tmp_path: Path, monkeypatch) -> None:
    """make up asks images.sh whether each optional service's image (the description's, or the one the
    environment names) is present or pullable, and starts only those (their Compose profiles)."""
    from compose import up
    from compose.settings import Settings

    asked = []

    def run(cmd, **kw):
        asked.append(cmd[-1])
        return subprocess.CompletedProcess(cmd, 0 if cmd[-1] == "my/grafana:1" else 1)

    monkeypatch.setattr(up.subprocess, "run", run)
    s = Settings(secrets_dir=tmp_path / "secrets")
    optional = [x for x in services.SERVICES if x.optional]
    assert up.optional_services(s, {}) == [] and asked == [x.image for x in optional]
    assert up.optional_services(s, {"GRAFANA_IMAGE": "my/grafana:1"}) == ["grafana"]
    password = tmp_path / "secrets" / "grafana_admin_password"
    assert len(password.read_text()) == 24 and oct(password.stat().st_mode)[-3:] == "644"


def test_compose_publishes_every_port_on_bind_addr_only(tmp_path: Path) -> None:
    for name, service in compose_files(tmp_path)["services"].items():
        assert all(p.startswith("${BIND_ADDR:-127.0.0.1}:") for p in service.get("ports", [])), name


def test_a_new_service_is_one_entry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys) -> None:
    monkeypatch.setattr(services, "SERVICES", (*services.SERVICES, EXTRA))
    compose = compose_files(tmp_path)
    extra = compose["services"]["extra"]
    assert extra["ports"] == ["${BIND_ADDR:-127.0.0.1}:7000:7000"]
    assert extra["depends_on"] == {"prometheus": {"condition": "service_healthy"}}
    assert extra["read_only"] is True and extra["cap_drop"] == ["ALL"] and "/tmp" in extra["tmpfs"]
    assert "extra-data" in compose["volumes"]
    stack = swarm_stack(tmp_path)
    assert stack["services"]["extra"]["image"] == "mwms/extra:1.0"
    assert {"source": "verdict_test", "target": "/etc/extra/verdict_test.yml"} in stack["services"]["extra"][
        "configs"
    ]
    assert "extra-data" in stack["volumes"]
    assert emit.main(["--target", "jobset", "--workers", "1", "--out", str(tmp_path / "k8s")]) == 0
    assert "dropped service extra: run Extra next to the cluster" in capsys.readouterr().err


def test_two_services_shipping_one_config_key_fail_on_swarm(tmp_path: Path, monkeypatch) -> None:
    twin = dataclasses.replace(
        EXTRA, configs=(ConfigDir("monitoring/config/prometheus", "/etc/x", ("rules/*.yml",)),)
    )
    monkeypatch.setattr(services, "SERVICES", (*services.SERVICES, twin))
    with pytest.raises(ValueError, match="clash with another service's"):
        swarm_stack(tmp_path)


def test_the_stacks_own_checks_cost_at_most_a_few_execs_a_minute() -> None:
    """Each check is an exec (~120 ms of CPU here, compose/services.py Healthcheck): at 5 s intervals a
    stack's checks took ~6 % of a core from the training beside them. Every check still fails its
    service within UNHEALTHY_AFTER_S."""
    checks = [s.healthcheck for s in services.SERVICES if s.healthcheck]
    assert checks and sum(60 / h.interval_s for h in checks) <= 10
    for h in checks:
        assert h.retries * h.interval_s >= services.UNHEALTHY_AFTER_S > (h.retries - 1) * h.interval_s
