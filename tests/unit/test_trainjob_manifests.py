"""The fifth target, Kubeflow Trainer v2 (compose/targets/trainjob.py), validated offline.

- TrainingRuntime and TrainJob: Kubeflow Trainer's own API models (kubeflow-trainer-api 2.3.0,
  pydantic). `from_dict` keeps only the fields it knows, so the test compares the round trip with
  the input: it must drop nothing (a misspelt or unknown field fails it); the one thing it may add
  is a default the models fill in (a container port's protocol TCP, as the API server does).
- The replicated jobs' Job templates: kubernetes-validate --strict, as batch/v1 Jobs.
- What the Trainer's admission webhook and its PlainML plugin require of a runtime (v2.3.0:
  pkg/webhooks/trainingruntime_webhook.go, pkg/runtime/framework/plugins/plainml/plainml.go).
- TF_CONFIG as trainer.cluster.jobset_entry builds it in each pod names the pods by the hostnames the
  Trainer gives them (pkg/runtime/framework/plugins/jobset/jobset.go IdentifyPodNetwork:
  `<trainjob>-<replicated job>-<job index>-<pod index>.<trainjob>`).
The golden files (tests/golden/*.trainjob.yaml) are checked with the other Kubernetes targets'
in tests/unit/test_k8s_manifests.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubeflow_trainer_api import models

from compose import deployment, emit
from compose.deployment import Deployment
from compose.targets import trainjob
from trainer.cluster import jobset_entry

CPU = Deployment(workers=1, knobs=(("steps", "200"),))
GPU = Deployment(workers=3, knobs=(("steps", "200"),), gpu_ids=deployment.fake_gpu_ids(3, 1))
ALONE = Deployment(workers=0)
K8S_VERSIONS = ("1.31.0", "1.37.0")


def manifests(d: Deployment, tmp_path: Path, *flags: str) -> dict[str, dict]:
    emit.emit_deployment("trainjob", d, tmp_path, *flags)
    return {doc["kind"]: doc for doc in yaml.safe_load_all((tmp_path / "trainjob.yaml").read_text())}


def differences(given: object, back: object, path: str = "") -> tuple[list[str], list[str]]:
    """(paths the round trip dropped or changed, paths it added)."""
    if isinstance(given, dict) and isinstance(back, dict):
        dropped, added = [], [f"{path}/{k}" for k in back if k not in given]
        for key, value in given.items():
            if key not in back:
                dropped.append(f"{path}/{key}")
            else:
                more = differences(value, back[key], f"{path}/{key}")
                dropped, added = dropped + more[0], added + more[1]
        return dropped, added
    if isinstance(given, list) and isinstance(back, list) and len(given) == len(back):
        found = [differences(a, b, f"{path}[{i}]") for i, (a, b) in enumerate(zip(given, back))]
        return [p for f in found for p in f[0]], [p for f in found for p in f[1]]
    return ([] if given == back else [path]), []


def round_trip(model: type, doc: dict) -> tuple[list[str], list[str]]:
    return differences(doc, model.from_dict(doc).to_dict())


def rjobs(runtime: dict) -> dict[str, dict]:
    return {r["name"]: r for r in runtime["spec"]["template"]["spec"]["replicatedJobs"]}


@pytest.mark.parametrize("d", [CPU, GPU, ALONE], ids=["cpu-1", "gpu-3", "chief-only"])
def test_runtime_and_trainjob_survive_the_trainer_api_round_trip(tmp_path: Path, d: Deployment) -> None:
    docs = manifests(d, tmp_path)
    for model, doc in (
        (models.TrainerV1alpha1TrainingRuntime, docs["TrainingRuntime"]),
        (models.TrainerV1alpha1TrainJob, docs["TrainJob"]),
    ):
        dropped, added = round_trip(model, doc)
        assert dropped == [], f"{doc['kind']}: the Trainer API models drop {dropped}"
        assert all(p.endswith("/protocol") and "/ports[" in p for p in added), added


def test_round_trip_catches_an_unknown_key(tmp_path: Path) -> None:
    runtime = manifests(CPU, tmp_path)["TrainingRuntime"]
    runtime["spec"]["template"]["spec"]["replicatedJobs"][1]["template"]["spec"]["paralelism"] = 1
    path = "/spec/template/spec/replicatedJobs[1]/template/spec/paralelism"
    assert round_trip(models.TrainerV1alpha1TrainingRuntime, runtime)[0] == [path]
    job = manifests(CPU, tmp_path)["TrainJob"]
    job["spec"]["trainer"]["numNode"] = 2
    assert round_trip(models.TrainerV1alpha1TrainJob, job)[0] == ["/spec/trainer/numNode"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("d", [CPU, GPU])
def test_job_templates_pass_strict_schema_validation(tmp_path: Path, d: Deployment, version: str) -> None:
    docs = manifests(d, tmp_path)
    kubernetes_validate.validate(docs["PersistentVolumeClaim"], version, strict=True)
    for name, rjob in rjobs(docs["TrainingRuntime"]).items():
        job = {
            "apiVersion": "batch/v1",
            "kind": "Job",
            "metadata": {"name": name},
            "spec": rjob["template"]["spec"],
        }
        kubernetes_validate.validate(job, version, strict=True)


@pytest.mark.parametrize("d", [CPU, GPU, ALONE], ids=["cpu-1", "gpu-3", "chief-only"])
def test_what_the_trainer_requires_of_a_runtime(tmp_path: Path, d: Deployment) -> None:
    docs = manifests(d, tmp_path)
    runtime, job = docs["TrainingRuntime"], docs["TrainJob"]
    steps = [
        r
        for r in rjobs(runtime).values()
        if r["template"].get("metadata", {}).get("labels", {}).get(trainjob.ANCESTOR_LABEL)
    ]
    (step,) = steps  # one trainer step; the webhook: replicas 1 and a container named `node`
    assert step["replicas"] == 1 and step["name"] == ("worker" if d.workers else "chief")
    pod = step["template"]["spec"]["template"]["spec"]
    assert [c["name"] for c in pod["containers"]] == [trainjob.CONTAINER]
    # PlainML sets the trainer step's pod count from numNodes: the runtime's, then the TrainJob's.
    nodes = step["template"]["spec"]["parallelism"]
    assert runtime["spec"]["mlPolicy"] == {"numNodes": nodes} and job["spec"]["trainer"]["numNodes"] == nodes
    assert job["spec"]["runtimeRef"] == {
        "apiGroup": "trainer.kubeflow.org",
        "kind": "TrainingRuntime",
        "name": runtime["metadata"]["name"],
    }
    assert job["metadata"]["namespace"] == runtime["metadata"]["namespace"]  # a TrainingRuntime is namespaced
    for rjob in rjobs(runtime).values():
        (rule,) = rjob["template"]["spec"]["podFailurePolicy"]["rules"]
        assert rule["onExitCodes"]["containerName"] == trainjob.CONTAINER


def _pod_env(rjob: dict, jobset: str, index: int) -> dict[str, str]:
    """The environment a pod of this replicated job gets: the annotations' values filled in."""
    (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
    filled = {jobset_entry.ENV_JOBSET: jobset, jobset_entry.ENV_REPLICATED_JOB: rjob["name"]}
    env = {e["name"]: e.get("value", filled.get(e["name"], "")) for e in container["env"]}
    return {**env, jobset_entry.ENV_INDEX: str(index)}


@pytest.mark.parametrize("workers", [0, 1, 3])
def test_tf_config_names_the_pods_the_trainer_creates(tmp_path: Path, workers: int) -> None:
    name = "team-job"
    runtime = manifests(Deployment(workers=workers), tmp_path, "--name", name)["TrainingRuntime"]
    pods = [(r, i) for r in rjobs(runtime).values() for i in range(r["template"]["spec"]["parallelism"])]
    endpoints = [f"{name}-{r['name']}-0-{i}.{name}:{deployment.TF_PORT}" for r, i in pods]
    for rjob, index in pods:
        config = json.loads(jobset_entry.tf_config(_pod_env(rjob, name, index)))
        assert sorted(sum(config["cluster"].values(), [])) == sorted(endpoints)
        assert config["task"] == {"type": rjob["name"], "index": index}
        (container,) = rjob["template"]["spec"]["template"]["spec"]["containers"]
        assert container["command"][:3] == ["python", "-m", "trainer.cluster.jobset_entry"]


def test_the_report_says_where_the_jobset_went(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    assert emit.main(["--target", "trainjob", "--workers", "2", "--out", str(tmp_path)]) == 0
    err = capsys.readouterr().err
    assert "k8s TrainJob:" in err and "TrainingRuntime mwms-tensorflow" in err
    assert "trainer.numNodes 2" in err and "dropped service prometheus" in err
