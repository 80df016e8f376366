"""The one deployment description and the address templates every emitter renders TF_CONFIG with."""

from __future__ import annotations

import argparse

import pytest

from compose import deployment, knobs
from compose.deployment import Change, Deployment
from trainer.cluster import server_config
from trainer.cluster import spec as cluster
from trainer.cluster.spec import ClusterSpecError


def test_compose_template_is_the_service_name() -> None:
    spec = cluster.from_template(2, cluster.COMPOSE_ADDRESS, port=2222)
    assert spec == cluster.for_hosts(2)
    assert spec.cluster_dict() == {"chief": ["chief:2222"], "worker": ["worker-0:2222", "worker-1:2222"]}


def test_tfjob_template_matches_the_operator() -> None:
    spec = cluster.from_template(1, cluster.TFJOB_ADDRESS, port=2222, job="mnist", namespace="team-a")
    assert spec.cluster_dict() == {
        "chief": ["mnist-chief-0.team-a.svc:2222"],
        "worker": ["mnist-worker-0.team-a.svc:2222"],
    }


def test_jobset_template_matches_pod_hostnames() -> None:
    spec = cluster.from_template(2, cluster.JOBSET_ADDRESS, port=2222, jobset="mwms")
    assert spec.cluster_dict() == {
        "chief": ["mwms-chief-0-0.mwms:2222"],
        "worker": ["mwms-worker-0-0.mwms:2222", "mwms-worker-0-1.mwms:2222"],
    }


def test_template_missing_a_name_says_which() -> None:
    with pytest.raises(ClusterSpecError, match="needs a value for namespace"):
        cluster.from_template(1, cluster.TFJOB_ADDRESS, job="x")


def test_trainer_env_is_the_same_for_every_target() -> None:
    d = Deployment(workers=1, knobs=(("steps", "7"), ("save_every", "5")), data="/somewhere")
    assert deployment.trainer_env(d) == {
        "TRAINER_METRICS_PORT": "8000",
        "TRAINER_METRICS_LINGER": "12",
        "TRAINER_CHECKPOINT_DIR": "/checkpoints",
        "TRAINER_LOGDIR": "/logs",
        "TRAINER_PROFILER_PORT": "6009",
        "TRAINER_STEPS": "7",
        "TRAINER_SAVE_EVERY": "5",
        "TRAINER_DATA": "/data",
        "SUPERVISE_MAX_RESTARTS": "3",
        **server_config.ENVIRONMENT,  # the allocator settings every task starts with
    }


def test_the_stall_bound_reaches_every_task_and_a_bad_one_is_refused() -> None:
    p = argparse.ArgumentParser()
    deployment.add_arguments(p)
    d = deployment.from_args(p.parse_args(["--workers", "1"]), None, environ={"SUPERVISE_STALL": "20,10,60"})
    assert deployment.trainer_env(d)["SUPERVISE_STALL"] == "20,10,60"
    assert "SUPERVISE_STALL" not in deployment.trainer_env(Deployment(workers=1))
    with pytest.raises(ValueError, match="SUPERVISE_STALL='10': must be multiple,floor,ceiling"):
        Deployment(workers=1, stall="10")


def test_every_target_runs_the_trainer_under_the_supervisor() -> None:
    assert deployment.command(Deployment(workers=1))[:4] == [
        "python",
        "-m",
        "trainer.supervise.supervisor",
        "--",
    ]
    assert deployment.command(Deployment(workers=1, script="/x/train.py"))[:4] == [
        "python",
        "-m",
        "trainer.supervise.supervisor",
        "--",
    ]


def test_unknown_knob_is_rejected() -> None:
    with pytest.raises(ValueError, match="'stepz' is not a trainer setting"):
        Deployment(workers=1, knobs=(("stepz", "7"),))


def test_gpu_count_per_task() -> None:
    assert Deployment(workers=1).gpus_per_task == 0
    d = Deployment(workers=1, gpu_ids=deployment.fake_gpu_ids(1, 2))
    assert d.gpus_per_task == 2 and d.variant == "gpu" and d.image().endswith("-gpu")
    with pytest.raises(ValueError, match="same number of GPUs"):
        Deployment(workers=1, gpu_ids={"chief": ("0",), "worker-0": ("1", "2")})


def test_knobs_from_the_environment_in_a_fixed_order() -> None:
    p = argparse.ArgumentParser()
    deployment.add_arguments(p)
    ns = p.parse_args(["--workers", "2", "--args", "--seed 3"])
    d = deployment.from_args(ns, None, environ=knobs.on_command_line(SAVE_EVERY="5", STEPS="9", TASK="mlp"))
    assert d.knobs == (("steps", "9"), ("task", "mlp"), ("save_every", "5")) and d.extra_args == (
        "--seed",
        "3",
    )


def test_report_lists_each_change() -> None:
    text = deployment.report("k8s", [Change("shm_size", "", "why"), Change("restart", "ExitCode", "because")])
    assert text.splitlines() == [
        "k8s: 2 setting(s) dropped or rewritten",
        "  dropped shm_size: why",
        "  rewrote restart -> ExitCode: because",
    ]
    assert deployment.report("x", []) == "x: nothing dropped"
