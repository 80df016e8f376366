"""The Swarm target: golden bundle, the facts it is built around, and offline validation.

A golden diff means `make stack-up` now deploys something different: `make golden` and review it.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
import yaml

from compose import emit, knobs, services
from compose.targets import compose as compose_target
from compose.targets import swarm as stack

MONITORING_SERVICES = tuple(s.name for s in services.SERVICES)

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
IMAGE = "10.210.0.10:5000/mwms/trainer@sha256:" + "0" * 64
RUN = ("--run", "20261201T090000Z")


def bundle(out: Path, *extra: str, workers: int = 2) -> tuple[dict, str]:
    argv = ["--target", "swarm", "--workers", str(workers), "--image", IMAGE, "--out", str(out), *RUN, *extra]
    emit.write(emit.run(argv, environ=knobs.on_command_line(STEPS="200")))
    return yaml.safe_load((out / "stack.yaml").read_text()), (out / "translation.txt").read_text()


def trainers(doc: dict) -> dict:
    return {k: v for k, v in doc["services"].items() if k not in MONITORING_SERVICES}


@pytest.mark.parametrize("name", ["stack.yaml", "translation.txt"])
def test_bundle_matches_golden(tmp_path: Path, name: str) -> None:
    bundle(tmp_path)
    golden = GOLDEN / f"swarm-workers-2.{name}"
    if os.environ.get("UPDATE_GOLDEN") == "1":
        golden.write_text((tmp_path / name).read_text())
    assert golden.exists(), f"{golden} is missing: run `make golden`"
    assert (tmp_path / name).read_text() == golden.read_text(), (
        f"{name} differs from tests/golden: make golden"
    )


def test_version_39_and_no_top_level_name(tmp_path: Path) -> None:
    doc, _ = bundle(tmp_path)
    assert doc["version"] == "3.9"  # the 20.10 CLI reads a file without it as version 1.0
    assert "name" not in doc


def test_every_trainer_is_one_dnsrr_replica_on_any_node_with_a_renewing_budget(tmp_path: Path) -> None:
    doc, _ = bundle(tmp_path)
    services = trainers(doc)
    assert list(services) == ["chief", "worker-0", "worker-1"]
    for name, service in services.items():
        assert "placement" not in service["deploy"], f"{name} is pinned: its node's loss would strand it"
        assert service["deploy"]["replicas"] == 1 and service["deploy"]["endpoint_mode"] == "dnsrr"
        assert service["deploy"]["restart_policy"] == {
            "condition": "on-failure",
            "delay": "5s",
            "max_attempts": 3,
            "window": stack.RESTART_WINDOW,
        }
        # The supervisor's state (a final exit stays final) follows the task, not the container.
        assert service["hostname"] == f"{name}-{RUN[1]}"
    assert all(
        "placement" in doc["services"][s]["deploy"] for s in MONITORING_SERVICES if s in doc["services"]
    )


def test_keys_a_stack_drops_are_translated_not_passed_through(tmp_path: Path) -> None:
    doc, report = bundle(tmp_path, "--gpus-per-worker", "1")
    for name, service in trainers(doc).items():
        for key in (
            "restart",
            "tmpfs",
            "shm_size",
            "security_opt",
            "dns_opt",
            "build",
            "pull_policy",
            "expose",
        ):
            assert key not in service, f"{name} still has {key}"
        tmpfs = {v["target"]: v.get("tmpfs") for v in service["volumes"] if isinstance(v, dict)}
        assert tmpfs["/tmp"] is None and tmpfs["/dev/shm"] == {"size": 2 * 1024**3}
        assert service["deploy"]["resources"] == stack.gpu_resources(1)
    for key in ("restart", "tmpfs", "shm_size", "security_opt", "dns_opt", "deploy"):
        assert f"rewrote {key} -> " in report or f"dropped {key}: " in report, (
            f"the report does not mention {key}"
        )


def test_every_task_keeps_its_copy_in_its_nodes_checkpoint_volume(tmp_path: Path) -> None:
    doc, _ = bundle(tmp_path)
    for name, service in trainers(doc).items():
        assert "checkpoints:/checkpoints" in service["volumes"], name
        targets = [v["target"] for v in service["volumes"] if isinstance(v, dict)]
        assert "/checkpoints" not in targets, f"{name}: a tmpfs would lose its copy with the container"


def test_monitoring_is_published_in_host_mode_from_versioned_configs(tmp_path: Path) -> None:
    doc, _ = bundle(tmp_path)
    prometheus = doc["services"]["prometheus"]
    assert [p["mode"] for p in prometheus["ports"]] == ["host"]
    targets = {c["target"] for c in prometheus["configs"]}
    assert {"/etc/prometheus/prometheus.yml", "/etc/prometheus/targets/trainers.json"} <= targets
    for key, config in doc["configs"].items():
        text = (tmp_path / config["file"]).read_text()
        assert config["name"] == f"{key}_{stack._digest(text)}"  # immutable: new content, new name


def test_grafana_secret_gets_a_new_name_with_a_new_password(tmp_path: Path) -> None:
    names = []
    for password in ("first", "second"):
        secrets = tmp_path / "secrets"
        secrets.mkdir(exist_ok=True)
        (secrets / "grafana_admin_password").write_text(password)
        argv = ["--target", "swarm", "--workers", "1", "--image", IMAGE, "--out", str(tmp_path / "out")]
        argv += ["--grafana-image", "grafana/grafana:11.6.0", "--secrets-dir", str(secrets)]
        emit.write(emit.run(argv))
        names.append(
            yaml.safe_load((tmp_path / "out/stack.yaml").read_text())["secrets"]["grafana_admin_password"][
                "name"
            ]
        )
    assert names[0] != names[1]


def test_alertmanager_ships_the_users_receivers_under_a_new_config_name(tmp_path: Path) -> None:
    """The one file users edit is what the swarm's Alertmanager reads (Compose mounts the same file);
    ALERTMANAGER_CONFIG= ships another in its place, as a config with a new name (configs are immutable)."""
    shipped, _ = bundle(tmp_path / "shipped")
    assert (tmp_path / "shipped/configs/alertmanager").read_text() == (
        stack.REPO / stack.ALERTMANAGER_CONFIG
    ).read_text()
    mine = tmp_path / "mine.yml"
    mine.write_text((stack.REPO / stack.ALERTMANAGER_CONFIG).read_text() + "# my receiver\n")
    doc, _ = bundle(tmp_path / "mine", "--alertmanager-config", str(mine))
    assert (tmp_path / "mine/configs/alertmanager").read_text() == mine.read_text()
    assert doc["configs"]["alertmanager"]["name"] != shipped["configs"]["alertmanager"]["name"]
    (target,) = [
        c["target"] for c in doc["services"]["alertmanager"]["configs"] if c["source"] == "alertmanager"
    ]
    assert f"--config.file={target}" in doc["services"]["alertmanager"]["command"]


def test_a_missing_alertmanager_config_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--target", "swarm", "--workers", "1", "--image", IMAGE, "--out", str(tmp_path / "out")]
    assert emit.main([*argv, "--alertmanager-config", str(tmp_path / "none.yml")]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "none.yml" in err, err


def test_an_unknown_compose_key_fails_the_translation(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    real = compose_target.tasks_file
    monkeypatch.setattr(
        compose_target,
        "tasks_file",
        lambda cfg: {"services": {n: {**s, "privileged": True} for n, s in real(cfg)["services"].items()}},
    )
    with pytest.raises(ValueError, match="no Swarm translation for the Compose key 'privileged'"):
        bundle(tmp_path)


def test_compose_without_docker_restarts_still_gets_a_bounded_swarm_restart(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # With an in-container supervisor Compose says restart "no"; a task lost with its node still
    # needs the orchestrator, within the restart budget.
    real = compose_target.tasks_file
    monkeypatch.setattr(
        compose_target,
        "tasks_file",
        lambda cfg: {"services": {n: {**s, "restart": "no"} for n, s in real(cfg)["services"].items()}},
    )
    doc, _ = bundle(tmp_path, "--max-restarts", "5")
    for service in trainers(doc).values():
        assert service["deploy"]["restart_policy"] == {
            "condition": "on-failure",
            "delay": "5s",
            "max_attempts": 5,
            "window": stack.RESTART_WINDOW,
        }


def test_tensorboard_runs_the_trainers_pushed_image_beside_prometheus(tmp_path: Path) -> None:
    doc, report = bundle(tmp_path)
    tensorboard = doc["services"]["tensorboard"]
    assert tensorboard["image"] == IMAGE == doc["services"]["chief"]["image"]
    assert tensorboard["deploy"]["placement"] == doc["services"]["prometheus"]["deploy"]["placement"]
    assert "tensorboard-logs:/logs" in tensorboard["volumes"]
    assert "volume tensorboard-logs -> node-local" in report


def test_bad_node_count_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    argv = ["--target", "swarm", "--workers", "2", "--image", IMAGE, "--out", str(tmp_path), "--nodes", "0"]
    assert emit.main(argv) == 2
    assert capsys.readouterr().err.strip().endswith("NODES=0: a swarm needs at least one node")


@pytest.mark.parametrize(
    "extra", [(), ("--gpus-per-worker", "1"), ("--grafana-image", "grafana/grafana:11.6.0")]
)
def test_docker_stack_config_accepts_the_bundle(
    tmp_path: Path, extra: tuple[str, ...], stack_cli: str
) -> None:
    if "--grafana-image" in extra:
        (tmp_path / "secrets").mkdir()
        (tmp_path / "secrets/grafana_admin_password").write_text("x")
        extra = (*extra, "--secrets-dir", str(tmp_path / "secrets"))
    bundle(tmp_path / "bundle", *extra)
    done = subprocess.run(
        [stack_cli, "stack", "config", "-c", "stack.yaml"],
        cwd=tmp_path / "bundle",
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr


def test_overlays_are_encrypted_only_when_asked_and_the_report_says_so(tmp_path: Path) -> None:
    """Not by default: on kernels without ESP (these hosts) swarm installs the IPsec policy without its
    SAs and drops every packet between nodes (docs/security.md, compose/swarm/overlay-cost.sh)."""
    plain, report = bundle(tmp_path / "plain")
    assert all("driver_opts" not in net for net in plain["networks"].values())
    assert "overlay networks -> unencrypted (SWARM_ENCRYPT=1: IPsec)" in report
    encrypted, report = bundle(tmp_path / "encrypted", "--encrypt-overlay")
    assert all(net["driver_opts"] == {"encrypted": ""} for net in encrypted["networks"].values())
    assert "overlay networks" not in report
