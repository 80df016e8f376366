"""Kubernetes manifests, validated offline: no API server can run here, so every object goes through
the strictest checker available for its kind.

- TFJob: the training operator's own Python SDK models (kubeflow-training). Deserializing drops
  unknown keys silently, so the test compares the serialized round trip with the input.
- Core kinds (the PVC, each TFJob pod template as a PodTemplate, each JobSet job template as a
  batch/v1 Job): kubernetes-validate --strict, which rejects unknown fields.
- JobSet and PodMonitor (CRDs without a Python model here): their keys against the fields of the
  JobSet v1alpha2 Go types (v0.8.2) and the Prometheus Operator's PodMonitor, listed below.
Golden files freeze the output; `make golden` rewrites them after an intended change.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from kubeflow.training.api_client import ApiClient

from compose import deployment, emit
from compose.deployment import Deployment
from compose.targets import _kube
from trainer import errors
from trainer.cluster.spec import TFJOB_ADDRESS

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
K8S_VERSIONS = ("1.31.0", "1.37.0")
"""Oldest supported (podFailurePolicy is GA from 1.31) and the newest kubernetes-validate knows."""
CPU = Deployment(workers=1, knobs=(("steps", "200"),), run="20261201T090000Z")
GPU = Deployment(
    workers=3, knobs=(("steps", "200"),), gpu_ids=deployment.fake_gpu_ids(3, 1), run="20261201T090000Z"
)
NAMES = _kube.Names()
TARGETS = ("tfjob", "jobset", "trainjob")
JOBSET_FIELDS = {
    "spec": {
        "replicatedJobs",
        "network",
        "successPolicy",
        "failurePolicy",
        "startupPolicy",
        "suspend",
        "coordinator",
        "managedBy",
        "ttlSecondsAfterFinished",
    },
    "network": {"enableDNSHostnames", "subdomain", "publishNotReadyAddresses"},
    "successPolicy": {"operator", "targetReplicatedJobs"},
    "failurePolicy": {"maxRestarts", "restartStrategy", "rules"},
    "rule": {"name", "action", "onJobFailureReasons", "targetReplicatedJobs"},
    "replicatedJob": {"name", "template", "replicas", "dependsOn"},
}
PODMONITOR_ENDPOINT_FIELDS = {
    "port",
    "path",
    "interval",
    "honorLabels",
    "relabelings",
    "scheme",
    "scrapeTimeout",
}


def write(d: Deployment, tmp_path: Path) -> dict[str, Path]:
    """Every Kubernetes target's files for `d`, written by the one writer: file name -> path."""
    paths = {}
    for name in TARGETS:
        r = emit.emit_deployment(name, d, tmp_path)
        paths.update({rel: tmp_path / rel for rel in r.emitted.files})
    return paths


def manifests(d: Deployment, tmp_path: Path) -> dict[str, list[dict]]:
    return {name: list(yaml.safe_load_all(path.read_text())) for name, path in write(d, tmp_path).items()}


def by_kind(docs: list[dict], kind: str) -> dict:
    return next(d for d in docs if d["kind"] == kind)


@pytest.mark.parametrize(("label", "d"), [("cpu-workers-1", CPU), ("gpu-workers-3", GPU)])
def test_manifests_match_golden(tmp_path: Path, label: str, d: Deployment) -> None:
    for name, path in write(d, tmp_path).items():
        golden = GOLDEN / f"{label}.{name}"
        if os.environ.get("UPDATE_GOLDEN") == "1":
            golden.write_text(path.read_text())
        assert golden.exists(), f"{golden} is missing: run `make golden`"
        assert path.read_text() == golden.read_text(), f"{golden.name} differs: run `make golden` if intended"


class _Response:
    def __init__(self, doc: dict) -> None:
        self.data = json.dumps(doc)


def sdk_round_trip(doc: dict) -> dict:
    client = ApiClient()
    return client.sanitize_for_serialization(client.deserialize(_Response(doc), "KubeflowOrgV1TFJob"))


@pytest.mark.parametrize("d", [CPU, GPU])
def test_tfjob_survives_the_operator_sdk_round_trip(tmp_path: Path, d: Deployment) -> None:
    job = by_kind(manifests(d, tmp_path)["tfjob.yaml"], "TFJob")
    assert sdk_round_trip(job) == job


def test_round_trip_catches_an_unknown_key(tmp_path: Path) -> None:
    job = by_kind(manifests(CPU, tmp_path)["tfjob.yaml"], "TFJob")
    job["spec"]["tfReplicaSpecs"]["Chief"]["restartpolicy"] = "ExitCode"
    assert sdk_round_trip(job) != job


def core_objects(docs: dict[str, list[dict]]) -> list[dict]:
    """Every core object, plus the pod and job templates nested in the two CRDs, as core kinds."""
    objects = [by_kind(docs[f], kind) for f in docs for kind in ("PersistentVolumeClaim", "NetworkPolicy")]
    for spec in by_kind(docs["tfjob.yaml"], "TFJob")["spec"]["tfReplicaSpecs"].values():
        objects.append(
            {
                "apiVersion": "v1",
                "kind": "PodTemplate",
                "metadata": {"name": "t"},
                "template": spec["template"],
            }
        )
    for rjob in by_kind(docs["jobset.yaml"], "JobSet")["spec"]["replicatedJobs"]:
        objects.append(
            {
                "apiVersion": "batch/v1",
                "kind": "Job",
                "metadata": {"name": "j"},
                "spec": rjob["template"]["spec"],
            }
        )
    return objects


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("d", [CPU, GPU])
def test_core_kinds_pass_strict_schema_validation(tmp_path: Path, d: Deployment, version: str) -> None:
    for obj in core_objects(manifests(d, tmp_path)):
        kubernetes_validate.validate(obj, version, strict=True)


def test_strict_validation_rejects_a_misspelt_field() -> None:
    bad = {
        "apiVersion": "v1",
        "kind": "PodTemplate",
        "metadata": {"name": "t"},
        "template": {
            "spec": {"containers": [{"name": "c", "image": "i", "securityContext": {"readOnly": True}}]}
        },
    }
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, K8S_VERSIONS[0], strict=True)


def test_jobset_uses_only_jobset_v1alpha2_fields(tmp_path: Path) -> None:
    spec = by_kind(manifests(GPU, tmp_path)["jobset.yaml"], "JobSet")["spec"]
    assert set(spec) <= JOBSET_FIELDS["spec"]
    for part in ("network", "successPolicy", "failurePolicy"):
        assert set(spec[part]) <= JOBSET_FIELDS[part], part
    assert all(set(r) <= JOBSET_FIELDS["rule"] for r in spec["failurePolicy"]["rules"])
    assert all(set(r) <= JOBSET_FIELDS["replicatedJob"] for r in spec["replicatedJobs"])


def pod_specs(docs: dict[str, list[dict]]) -> list[tuple[str, dict]]:
    tf = by_kind(docs["tfjob.yaml"], "TFJob")["spec"]["tfReplicaSpecs"]
    js = by_kind(docs["jobset.yaml"], "JobSet")["spec"]["replicatedJobs"]
    return [(f"tfjob {t}", s["template"]) for t, s in tf.items()] + [
        (f"jobset {r['name']}", r["template"]["spec"]["template"]) for r in js
    ]


def test_every_pod_mirrors_the_compose_hardening(tmp_path: Path) -> None:
    for where, pod in pod_specs(manifests(GPU, tmp_path)):
        spec, (container,) = pod["spec"], pod["spec"]["containers"]
        pod_ctx = spec["securityContext"]
        assert pod_ctx["runAsNonRoot"] and pod_ctx["runAsUser"] == deployment.UID
        ctx = container["securityContext"]
        assert ctx["allowPrivilegeEscalation"] is False and ctx["readOnlyRootFilesystem"] is True, where
        assert ctx["capabilities"] == {"drop": ["ALL"]}, where
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in spec["volumes"]}
        assert volumes[mounts["/dev/shm"]]["emptyDir"]["medium"] == "Memory", where
        assert "emptyDir" in volumes[mounts["/tmp"]], where
        assert container["resources"]["limits"]["nvidia.com/gpu"] == "1", where
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(deployment.METRICS_PORT)


def test_tfjob_follows_the_operator_conventions(tmp_path: Path) -> None:
    job = by_kind(manifests(GPU, tmp_path)["tfjob.yaml"], "TFJob")
    specs = job["spec"]["tfReplicaSpecs"]
    assert list(specs) == ["Chief", "Worker"] and specs["Worker"]["replicas"] == 3
    for spec in specs.values():
        (container,) = spec["template"]["spec"]["containers"]
        assert spec["restartPolicy"] == "ExitCode" and container["name"] == "tensorflow"
        assert {"name": "tfjob-port", "containerPort": 2222} in container["ports"]
    claims = [v for v in specs["Chief"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]
    assert claims == [{"name": "checkpoints", "persistentVolumeClaim": {"claimName": NAMES.claim}}]
    assert not [v for v in specs["Worker"]["template"]["spec"]["volumes"] if "persistentVolumeClaim" in v]


def test_our_exit_codes_match_the_operators_retry_rule() -> None:
    """The operator (pkg/util/train IsRetryableExitCode) retries exactly exit codes >= 128."""
    codes = {v for k, v in vars(errors).items() if k.startswith("EXIT_")}
    for code in range(256):
        assert errors.is_retryable(code) == (code >= 128), code
    assert {c for c in codes if c and not errors.is_retryable(c)} == set(_kube.PERMANENT_EXIT_CODES)
    assert {errors.EXIT_PEER_LOST, errors.EXIT_PREEMPTED} <= {c for c in codes if errors.is_retryable(c)}


def test_jobset_restarts_the_gang_and_succeeds_on_the_chief(tmp_path: Path) -> None:
    spec = by_kind(manifests(GPU, tmp_path)["jobset.yaml"], "JobSet")["spec"]
    assert spec["successPolicy"] == {"operator": "All", "targetReplicatedJobs": ["chief"]}
    assert spec["failurePolicy"]["maxRestarts"] == GPU.max_restarts
    (rule,) = spec["failurePolicy"]["rules"]
    assert rule["action"] == "FailJobSet" and rule["onJobFailureReasons"] == ["PodFailurePolicy"]
    for rjob in spec["replicatedJobs"]:
        job = rjob["template"]["spec"]
        assert rjob["replicas"] == 1 and job["backoffLimit"] == 0 and job["completionMode"] == "Indexed"
        assert job["template"]["spec"]["restartPolicy"] == "Never"
        (fail,) = job["podFailurePolicy"]["rules"]
        assert fail["onExitCodes"]["values"] == list(_kube.PERMANENT_EXIT_CODES)
        (container,) = job["template"]["spec"]["containers"]
        assert container["command"][:3] == ["python", "-m", "trainer.cluster.jobset_entry"]


def test_pod_monitor_selects_the_pods_and_keeps_the_trainer_job_label(tmp_path: Path) -> None:
    docs = manifests(CPU, tmp_path)
    monitor = by_kind(docs["jobset.yaml"], "PodMonitor")
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert set(endpoint) <= PODMONITOR_ENDPOINT_FIELDS and endpoint["port"] == "metrics"
    assert endpoint["interval"] == "5s" and endpoint["honorLabels"] is True
    assert endpoint["relabelings"] == [
        {"action": "replace", "targetLabel": "job", "replacement": "trainer"},
        {"action": "replace", "targetLabel": "project", "replacement": CPU.project},
        {"action": "replace", "targetLabel": "run", "replacement": CPU.run},
    ], "every series carries the project and run, as with Compose's file_sd targets"
    for _, pod in pod_specs(docs):
        assert monitor["spec"]["selector"]["matchLabels"].items() <= pod["metadata"]["labels"].items()


def test_dollar_in_args_stays_literal(tmp_path: Path) -> None:
    d = Deployment(workers=0, extra_args=("--note", "$(HOME)"))
    job = by_kind(manifests(d, tmp_path)["tfjob.yaml"], "TFJob")
    (chief,) = job["spec"]["tfReplicaSpecs"]["Chief"]["template"]["spec"]["containers"]
    assert chief["command"][-1] == "$$(HOME)"
    assert "Worker" not in job["spec"]["tfReplicaSpecs"]


def test_cli_prints_a_translation_report_per_target(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    for target in TARGETS:
        assert (
            emit.main(["--target", target, "--workers", "1", "--out", str(tmp_path), "--script", "x.py"]) == 0
        )
    err = capsys.readouterr().err
    assert "k8s TFJob:" in err and "k8s JobSet:" in err and TFJOB_ADDRESS in err
    assert "dropped script bind x.py" in err and "only the supervisor's budget bounds retries" in err


@pytest.mark.parametrize(
    ("args", "message"),
    [(["--name", "Bad_Name"], "--name 'Bad_Name'"), (["--gpus-per-worker", "-1"], "GPUS_PER_WORKER=-1")],
)
def test_cli_bad_input_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, args: list[str], message: str
) -> None:
    assert emit.main(["--target", "jobset", "--workers", "1", "--out", str(tmp_path), *args]) == 2
    err = capsys.readouterr().err
    assert message in err and err.count("\n") == 1


def test_a_pinned_image_reference_replaces_the_tag(tmp_path: Path) -> None:
    ref = "127.0.0.1:5000/mwms/trainer@sha256:" + "0" * 64
    docs = manifests(Deployment(workers=1, image_ref=ref), tmp_path)
    assert {c["image"] for _, pod in pod_specs(docs) for c in pod["spec"]["containers"]} == {ref}


# --- Hardening (docs/security.md) ---


def test_pods_are_guaranteed_with_requests_equal_to_limits_from_the_description(tmp_path: Path) -> None:
    d = Deployment(workers=1, cpu="3", memory="6Gi", gpu_ids=deployment.fake_gpu_ids(1, 1))
    for where, pod in pod_specs(manifests(d, tmp_path)):
        (container,) = pod["spec"]["containers"]
        want = {"cpu": "3", "memory": "6Gi", "nvidia.com/gpu": "1"}
        assert container["resources"] == {"requests": want, "limits": want}, where
    for where, pod in pod_specs(manifests(CPU, tmp_path / "cpu")):
        (container,) = pod["spec"]["containers"]
        assert container["resources"]["requests"] == {"cpu": CPU.cpu, "memory": CPU.memory}, where


def test_pods_get_no_service_account_token(tmp_path: Path) -> None:
    for where, pod in pod_specs(manifests(CPU, tmp_path)):
        assert pod["spec"]["automountServiceAccountToken"] is False, where


def test_only_the_jobs_own_pods_reach_the_grpc_port(tmp_path: Path) -> None:
    for name, docs in manifests(CPU, tmp_path).items():
        policy = by_kind(docs, "NetworkPolicy")["spec"]
        assert policy["podSelector"] == {"matchLabels": NAMES.labels}, name
        assert policy["policyTypes"] == ["Ingress"], name
        grpc = [r for r in policy["ingress"] if {"protocol": "TCP", "port": deployment.TF_PORT} in r["ports"]]
        assert grpc == [
            {
                "from": [{"podSelector": {"matchLabels": NAMES.labels}}],
                "ports": [{"protocol": "TCP", "port": deployment.TF_PORT}],
            }
        ], name
        others = [r for r in policy["ingress"] if r not in grpc]
        assert others == [{"ports": [{"protocol": "TCP", "port": deployment.METRICS_PORT}]}], name
    for where, pod in pod_specs(manifests(CPU, tmp_path)):
        assert NAMES.labels.items() <= pod["metadata"]["labels"].items(), where


def test_the_start_up_wait_tolerates_slow_scheduling(tmp_path: Path) -> None:
    """Missing peers after the wait is a permanent exit (3): the wait must outlast a slow image pull
    or an autoscaled node, not the 300 s that suit one Compose host."""
    from trainer.config import Config

    for where, pod in pod_specs(manifests(CPU, tmp_path)):
        (container,) = pod["spec"]["containers"]
        env = {e["name"]: e.get("value") for e in container["env"]}
        assert float(env["TRAINER_CLUSTER_TIMEOUT"]) == _kube.STARTUP_TIMEOUT_S > Config.cluster_timeout, (
            where
        )
    given = Deployment(workers=1, knobs=(("cluster_timeout", "600"),))
    for where, pod in pod_specs(manifests(given, tmp_path / "given")):
        (container,) = pod["spec"]["containers"]
        assert {"name": "TRAINER_CLUSTER_TIMEOUT", "value": "600"} in container["env"], where
