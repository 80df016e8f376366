"""TF_CONFIG as Kubernetes hands it to the trainer: the training operator's exact JSON, and the
JobSet form that trainer.cluster.jobset_entry builds from the pod's identity."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainer.cluster import jobset_entry
from trainer.cluster import spec as cluster
from trainer.cluster.spec import ClusterSpecError, TaskId

ROOT = Path(__file__).resolve().parents[2]
# Byte for byte what the operator's genTFConfigJSONStr marshals (Go struct order: cluster, task,
# environment; map keys sorted) for TFJob "mnist" in namespace "team-a", chief + 2 workers.
OPERATOR_TF_CONFIG = (
    '{"cluster":{"chief":["mnist-chief-0.team-a.svc:2222"],'
    '"worker":["mnist-worker-0.team-a.svc:2222","mnist-worker-1.team-a.svc:2222"]},'
    '"task":{"type":"worker","index":1},"environment":"cloud"}'
)
# The same with CUSTOM_CLUSTER_DOMAIN=cluster.local set on the operator.
OPERATOR_WITH_DOMAIN = (
    '{"cluster":{"chief":["mnist-chief-0.team-a.svc.cluster.local:2222"],"worker":'
    '["mnist-worker-0.team-a.svc.cluster.local:2222"]},"task":{"type":"chief","index":0},'
    '"environment":"cloud"}'
)
JOBSET_ENV = {
    "JOBSET_NAME": "mwms",
    "JOBSET_REPLICATED_JOB": "worker",
    "JOB_COMPLETION_INDEX": "1",
    "JOBSET_WORKERS": "2",
}


def operator_tf_config(spec: cluster.ClusterSpec) -> str:
    """What the operator would write for `spec`: its field order and its extra `environment` key."""
    doc = {
        "cluster": spec.cluster_dict(),
        "task": {"type": spec.task.type, "index": spec.task.index},
        "environment": "cloud",
    }
    return json.dumps(doc, separators=(",", ":"))


def test_trainer_accepts_the_operators_exact_tf_config() -> None:
    spec = cluster.parse_tf_config(OPERATOR_TF_CONFIG)
    assert spec.task == TaskId("worker", 1) and spec.num_tasks == 3 and not spec.is_chief
    assert spec.address(spec.task) == "mnist-worker-1.team-a.svc:2222"


def test_tfjob_template_renders_what_the_operator_writes() -> None:
    spec = cluster.from_template(2, cluster.TFJOB_ADDRESS, port=2222, job="mnist", namespace="team-a")
    assert operator_tf_config(spec.with_task(TaskId("worker", 1))) == OPERATOR_TF_CONFIG


def test_custom_cluster_domain_names_are_accepted() -> None:
    spec = cluster.parse_tf_config(OPERATOR_WITH_DOMAIN)
    assert spec.is_chief
    assert spec.address(TaskId("worker", 0)) == "mnist-worker-0.team-a.svc.cluster.local:2222"


def test_jobset_entry_builds_tf_config_from_the_pod_identity() -> None:
    spec = cluster.parse_tf_config(jobset_entry.tf_config(JOBSET_ENV))
    assert spec.task == TaskId("worker", 1)
    assert spec.cluster_dict() == {
        "chief": ["mwms-chief-0-0.mwms:2222"],
        "worker": ["mwms-worker-0-0.mwms:2222", "mwms-worker-0-1.mwms:2222"],
    }
    chief = cluster.parse_tf_config(
        jobset_entry.tf_config({**JOBSET_ENV, "JOBSET_REPLICATED_JOB": "chief", "JOB_COMPLETION_INDEX": "0"})
    )
    assert chief.is_chief and chief.fingerprint() == spec.fingerprint()


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"JOBSET_NAME": ""}, "JOBSET_NAME is not set"),
        ({"JOB_COMPLETION_INDEX": "x"}, "JOB_COMPLETION_INDEX='x': must be a number"),
        ({"JOB_COMPLETION_INDEX": "2"}, "index 2 is out of range"),
        ({"JOBSET_REPLICATED_JOB": "evaluator"}, "name the replicated jobs chief and worker"),
    ],
)
def test_jobset_entry_rejects_a_wrong_environment(change: dict, message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message):
        jobset_entry.tf_config({**JOBSET_ENV, **change})


def run_entry(env: dict[str, str], *cmd: str) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if k != "TF_CONFIG" and not k.startswith("JOB")}
    return subprocess.run(
        [sys.executable, "-m", "trainer.cluster.jobset_entry", *cmd],
        cwd=ROOT,
        env={**clean, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def test_jobset_entry_execs_the_command_with_tf_config() -> None:
    done = run_entry(JOBSET_ENV, sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == jobset_entry.tf_config(JOBSET_ENV)


def test_jobset_entry_leaves_a_given_tf_config_alone() -> None:
    done = run_entry(
        {"TF_CONFIG": OPERATOR_TF_CONFIG}, sys.executable, "-c", "import os; print(os.environ['TF_CONFIG'])"
    )
    assert done.stdout.strip() == OPERATOR_TF_CONFIG


def test_jobset_entry_bad_environment_exits_2_in_one_line() -> None:
    done = run_entry({}, sys.executable, "-c", "print('never')")
    assert done.returncode == 2 and "never" not in done.stdout
    assert "JOBSET_NAME is not set" in done.stderr and done.stderr.count("\n") == 1
