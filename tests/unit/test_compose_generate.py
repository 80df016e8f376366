"""The Compose target and GPU assignment, without Docker: contracts other parts rely on."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from compose import emit, gpus
from compose import knobs as knobs_lib
from compose.deployment import Deployment
from trainer.cluster import server_config
from trainer.cluster.spec import parse_tf_config


def build(tmp_path: Path, *args: str, knobs: dict[str, str] | None = None) -> Deployment:
    r = emit.run(
        ["--target", "compose", "--out", str(tmp_path), *args],
        environ=knobs_lib.on_command_line(**(knobs or {})),
    )
    emit.write(r)
    return r.deployment


def main(*args: str) -> int:
    return emit.main(["--target", "compose", *args])


def services(tmp_path: Path, name: str = "compose.tasks.yaml") -> dict:
    return yaml.safe_load((tmp_path / name).read_text())["services"]


def test_one_service_per_task_with_its_own_tf_config(tmp_path: Path) -> None:
    build(tmp_path, "--workers", "3", "--gpus", "0")
    svc = services(tmp_path)
    assert list(svc) == ["chief", "worker-0", "worker-1", "worker-2"]
    for name, service in svc.items():
        spec = parse_tf_config(service["environment"]["TF_CONFIG"])
        assert spec.task.name == name and spec.num_tasks == 4
        assert spec.address(spec.task) == f"{name}:2222"


def test_image_is_built_once_on_the_chief(tmp_path: Path) -> None:
    build(tmp_path, "--workers", "2", "--gpus", "0")
    svc = services(tmp_path)
    assert [n for n, s in svc.items() if "build" in s] == ["chief"]
    assert all(s["pull_policy"] == "never" for n, s in svc.items() if n != "chief")
    assert len({s["image"] for s in svc.values()}) == 1


def test_environment_contract_with_the_trainer(tmp_path: Path) -> None:
    build(
        tmp_path,
        "--workers",
        "1",
        "--gpus",
        "0",
        knobs={
            "STEPS": "7",
            "TASK": "mlp",
            "PER_REPLICA_BATCH": "16",
            "STRATEGY": "mwms",
            "SAVE_EVERY": "5",
            "CLUSTER_TIMEOUT": "30",
        },
    )
    env = services(tmp_path)["chief"]["environment"]
    assert env == {
        "TF_CONFIG": env["TF_CONFIG"],
        "TRAINER_METRICS_PORT": "8000",
        "TRAINER_METRICS_LINGER": "12",
        "TRAINER_CHECKPOINT_DIR": "/checkpoints",
        "TRAINER_LOGDIR": "/logs",
        "TRAINER_PROFILER_PORT": "6009",
        "TRAINER_STEPS": "7",
        "TRAINER_TASK": "mlp",
        "TRAINER_PER_REPLICA_BATCH": "16",
        "TRAINER_STRATEGY": "mwms",
        "TRAINER_SAVE_EVERY": "5",
        "TRAINER_CLUSTER_TIMEOUT": "30",
        "SUPERVISE_MAX_RESTARTS": "3",
        "SUPERVISE_STATE_DIR": "/var/lib/supervise",
        **server_config.ENVIRONMENT,
    }


def test_unset_knobs_are_left_to_the_trainer_defaults_but_the_job_length(tmp_path: Path) -> None:
    """Unset knobs keep the trainer's defaults, but for make up's job: its length, task and that task's rate."""
    build(tmp_path, "--workers", "1", "--gpus", "0")
    assert set(services(tmp_path)["worker-0"]["environment"]) == {
        "TF_CONFIG",
        "TRAINER_METRICS_PORT",
        "TRAINER_METRICS_LINGER",
        "TRAINER_CHECKPOINT_DIR",
        "TRAINER_LOGDIR",
        "TRAINER_PROFILER_PORT",
        "TRAINER_STEPS",
        "TRAINER_TASK",
        "TRAINER_LEARNING_RATE",
        "SUPERVISE_MAX_RESTARTS",
        "SUPERVISE_STATE_DIR",
        *server_config.ENVIRONMENT,
    }


def test_only_the_chief_mounts_the_checkpoint_volume_every_task_the_log_volume(tmp_path: Path) -> None:
    build(tmp_path, "--workers", "2", "--gpus", "0")
    svc = services(tmp_path)
    assert svc["chief"]["volumes"] == [
        "checkpoints:/checkpoints",
        "supervise:/var/lib/supervise",
        "tensorboard-logs:/logs",
    ]
    for name in ("worker-0", "worker-1"):
        assert svc[name]["volumes"] == ["supervise:/var/lib/supervise", "tensorboard-logs:/logs"]
        # its own checkpoint copy (trainer/state/checkpoint.py: replicas/<task>), written as the task's user:
        # Docker mounts a tmpfs root-owned (PermissionError on every worker before the owner was set)
        uid, gid = svc[name]["user"].split(":")
        assert f"/checkpoints:uid={uid},gid={gid}" in svc[name]["tmpfs"]


def test_fault_handling_settings(tmp_path: Path) -> None:
    build(tmp_path, "--workers", "1", "--gpus", "0", "--max-restarts", "5")
    for service in services(tmp_path).values():
        # The supervisor restarts a task on a retryable exit, its budget from MAX_RESTARTS; Docker only
        # brings back a container whose processes died (its state keeps a final exit final). SIGTERM reaches Python
        # through tini and the preemption save has a minute; outside names fail in 1 s, not 10.
        assert service["command"][:4] == ["python", "-m", "trainer.supervise.supervisor", "--"]
        assert service["environment"]["SUPERVISE_MAX_RESTARTS"] == "5"
        assert service["restart"] == "on-failure" and service["init"] is True
        assert service["environment"]["SUPERVISE_STATE_DIR"] == "/var/lib/supervise"
        assert service["stop_grace_period"] == "60s"
        assert service["dns_opt"] == ["timeout:1", "attempts:1"]


def test_script_and_data_are_read_only_binds(tmp_path: Path) -> None:
    script, data = tmp_path / "user" / "train.py", tmp_path / "data"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    data.mkdir()
    build(tmp_path, "--workers", "1", "--gpus", "0", "--script", str(script), "--data", str(data))
    for service in services(tmp_path).values():
        assert service["command"][4:] == ["python", "-m", "trainer.script.wrapper", "/script/train.py"]
        assert service["environment"]["TRAINER_DATA"] == "/data"
        binds = {v["target"]: v for v in service["volumes"] if isinstance(v, dict)}
        assert binds["/script"]["source"] == str(script.parent) and binds["/script"]["read_only"]
        assert binds["/data"]["source"] == str(data) and binds["/data"]["read_only"]
        # Every task of a script sees the one checkpoint directory (BackupAndRestore restores from it).
        assert "checkpoints:/checkpoints" in service["volumes"] and "/checkpoints" not in service["tmpfs"]


def test_split_sampling_reaches_a_scripts_tasks_and_only_a_scripts(tmp_path: Path) -> None:
    """`make up SCRIPT=... TRAINER_SPLIT_PERIOD_S=30`: the wrapper in every task gets it (the split is
    off by default, docs/script.md); the built-in trainer, which times its own split, does not."""
    script = tmp_path / "user" / "train.py"
    script.parent.mkdir()
    script.write_text("print('hi')\n")
    split = {"TRAINER_SPLIT_PERIOD_S": "30", "TRAINER_SPLIT_WINDOW_S": "2"}
    r = emit.run(
        [
            "--target",
            "compose",
            "--out",
            str(tmp_path),
            "--workers",
            "1",
            "--gpus",
            "0",
            "--script",
            str(script),
        ],
        environ=split,
    )
    emit.write(r)
    for service in services(tmp_path).values():
        assert split.items() <= service["environment"].items()
    r = emit.run(
        ["--target", "compose", "--out", str(tmp_path / "b"), "--workers", "1", "--gpus", "0"], environ=split
    )
    emit.write(r)
    for service in services(tmp_path / "b").values():
        assert "TRAINER_SPLIT_PERIOD_S" not in service["environment"]


def test_a_bad_split_period_is_refused_before_any_container(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="TRAINER_SPLIT_PERIOD_S='often'"):
        emit.run(
            ["--target", "compose", "--out", str(tmp_path), "--workers", "1", "--gpus", "0"],
            environ={"TRAINER_SPLIT_PERIOD_S": "often"},
        )


def test_missing_script_is_a_one_line_error(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main("--workers", "1", "--gpus", "0", "--script", "nope.py", "--out", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "nope.py does not exist" in err and err.count("\n") == 1


def test_targets_have_one_task_type_and_index_each_and_the_run(tmp_path: Path) -> None:
    build(tmp_path, "--workers", "2", "--gpus", "0", "--project", "alerts-x", "--run", "20261201T090000Z")
    targets = json.loads((tmp_path / "targets" / "trainers.json").read_text())
    run = {"project": "alerts-x", "run": "20261201T090000Z"}
    assert targets == [
        {"targets": ["chief:8000"], "labels": {**run, "task_type": "chief", "task_index": "0"}},
        {"targets": ["worker-0:8000"], "labels": {**run, "task_type": "worker", "task_index": "0"}},
        {"targets": ["worker-1:8000"], "labels": {**run, "task_type": "worker", "task_index": "1"}},
    ]


def test_every_run_gets_a_new_id_that_sorts_by_start(tmp_path: Path) -> None:
    from compose.deployment import run_id

    assert run_id(0) == "19700101T000000Z" and run_id(59) < run_id(60) < run_id(3600)
    assert build(tmp_path, "--workers", "1", "--gpus", "0").run[:2] == run_id()[:2]


def test_gpu_overlay_gives_each_task_its_own_devices(tmp_path: Path) -> None:
    build(tmp_path, "--workers", "2", "--gpus", "6", "--gpus-per-worker", "2")
    svc = services(tmp_path, "compose.gpu.yaml")
    ids = {n: s["deploy"]["resources"]["reservations"]["devices"][0]["device_ids"] for n, s in svc.items()}
    assert ids == {"chief": ["0", "1"], "worker-0": ["2", "3"], "worker-1": ["4", "5"]}
    for service in svc.values():
        device = service["deploy"]["resources"]["reservations"]["devices"][0]
        assert device["driver"] == "nvidia" and device["capabilities"] == ["gpu"]
        assert service["shm_size"] == "2gb" and service["image"].endswith("-gpu")
    assert svc["chief"]["build"] == {"args": {"VARIANT": "gpu"}}
    assert "compose.gpu.yaml" in (tmp_path / "compose.args").read_text()


def test_gpu_ids_in_turn_from_an_explicit_list() -> None:
    assert gpus.assign(["chief", "worker-0", "worker-1"], gpus.parse("3,1,0"), 1) == {
        "chief": ("3",),
        "worker-0": ("1",),
        "worker-1": ("0",),
    }


@pytest.mark.parametrize(("tasks", "ids", "per_task"), [(3, 2, 1), (2, 3, 2), (1, 0, 1)])
def test_fewer_gpus_than_tasks_need_is_an_error(tasks: int, ids: int, per_task: int) -> None:
    names = [f"t{i}" for i in range(tasks)]
    with pytest.raises(gpus.GpuError, match=f"need {tasks * per_task} GPUs but only {ids} are available"):
        gpus.assign(names, [str(i) for i in range(ids)], per_task)


def test_generator_reports_gpu_shortage_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert main("--workers", "3", "--gpus", "2", "--out", str(tmp_path)) == 2
    err = capsys.readouterr().err
    assert "4 tasks x GPUS_PER_WORKER=1 need 4 GPUs but only 2" in err and err.count("\n") == 1


@pytest.mark.parametrize("bad", ["x", "0,0", "1,a", "-1"])
def test_bad_gpus_values(bad: str) -> None:
    with pytest.raises(gpus.GpuError):
        gpus.parse(bad)


def test_auto_uses_gpus_only_with_the_nvidia_runtime() -> None:
    smi = "0\n1\n"

    def fake(runtimes: str) -> gpus.Runner:
        return lambda cmd: smi if cmd[0] == "nvidia-smi" else runtimes

    assert gpus.parse("auto", fake('{"nvidia": {}, "runc": {}}')) == ("0", "1")
    assert gpus.parse("auto", fake('{"runc": {}}')) == ()
    assert gpus.parse("auto", lambda _cmd: "") == ()
    assert gpus.parse("0") == ()


def test_dollar_in_values_is_not_interpolated(tmp_path: Path) -> None:
    from compose import yamltext

    assert yamltext.dump({"a": "pa$$word $HOME"}) == 'a: "pa$$$$word $$HOME"\n'
