"""Real MWMS clusters started the way Kubernetes starts them, names and all.

- TFJob: the TF_CONFIG the Kubeflow training operator writes (its DNS names, its extra
  `"environment": "cloud"` key, its field order), given to `python -m trainer`.
- JobSet: only the pod's identity (JobSet name, replicated job, JOB_COMPLETION_INDEX, worker count);
  `python -m trainer.cluster.jobset_entry` builds TF_CONFIG from it, every task on port 2222 as in pods.

Names are resolved the way a pod resolves them, through the resolver, not rewritten: the tasks run
in a private user, mount and network namespace (`unshare -rmn`) whose /etc/hosts is a bind mount of
a file the test writes; the host's /etc/hosts and network are untouched. TensorFlow binds
0.0.0.0:<port>, so two tasks on one port need two network namespaces: the JobSet worker gets its
own, joined to the chief's by a veth pair with addresses that exist only inside these namespaces.
The TFJob tasks share one namespace, on the ports a TFJob with a different `tfjob-port` per replica
type gets.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import need
from trainer.cluster import spec as cluster
from trainer.cluster.spec import TaskId

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
NAMES = {"job": "mnist", "namespace": "team-a"}
PORTS = {"chief": 2222, "worker": 2223}
TRAINER_ARGS = ("--steps", "30", "--log-every", "10", "--metrics-port", "0", "--cluster-timeout", "60")
# Inside the namespace: loopback up, the hosts file over /etc/hosts, then both tasks; prints their codes.
TFJOB_SCRIPT = """
set -u
ip link set lo up
mount --bind "$HOSTS_FILE" /etc/hosts
TF_CONFIG="$TF_CHIEF" "$PY" -m trainer "$@" & chief=$!
TF_CONFIG="$TF_WORKER" "$PY" -m trainer "$@" & worker=$!
wait $chief; c=$?
wait $worker; w=$?
echo "exit codes: chief=$c worker=$w"
"""
# The chief in the first network namespace, the worker in a second one behind a veth pair.
CHIEF_IP, WORKER_IP = "10.213.7.1", "10.213.7.2"
JOBSET_SCRIPT = f"""
set -u
ip link set lo up
mount --bind "$HOSTS_FILE" /etc/hosts
ip link add veth-c type veth peer name veth-w
ip addr add {CHIEF_IP}/30 dev veth-c && ip link set veth-c up
JOBSET_REPLICATED_JOB=worker unshare -n bash -c '
  until ip link show veth-w >/dev/null 2>&1; do sleep 0.05; done
  ip link set lo up && ip addr add {WORKER_IP}/30 dev veth-w && ip link set veth-w up
  exec "$PY" -m trainer.cluster.jobset_entry "$PY" -m trainer "$@"' worker "$@" & worker=$!
until [ "$(readlink /proc/$worker/ns/net)" != "$(readlink /proc/$$/ns/net)" ]; do sleep 0.05; done
ip link set veth-w netns $worker
JOBSET_REPLICATED_JOB=chief "$PY" -m trainer.cluster.jobset_entry "$PY" -m trainer "$@" & chief=$!
wait $chief; c=$?
wait $worker; w=$?
echo "exit codes: chief=$c worker=$w"
"""


def operator_tf_config(task: TaskId) -> str:
    """genTFConfigJSONStr's output for a TFJob whose Chief listens on 2222 and Worker on 2223."""
    doc = {
        "cluster": {t: [tfjob_addr(t)] for t in PORTS},
        "task": {"type": task.type, "index": task.index},
        "environment": "cloud",
    }
    return json.dumps(doc, separators=(",", ":"))


def tfjob_addr(task_type: str) -> str:
    return cluster.TFJOB_ADDRESS.format(type=task_type, i=0, port=PORTS[task_type], **NAMES)


def run_in_namespace(script: str, hosts: dict[str, str], tmp_path: Path, **env: str) -> str:
    """Runs script under `unshare -rmn` with `hosts` (name -> IP) as /etc/hosts; returns its output."""
    need("user namespaces")
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text("127.0.0.1 localhost\n" + "".join(f"{ip} {name}\n" for name, ip in hosts.items()))
    clean = {
        k: v for k, v in os.environ.items() if not k.startswith(("TRAINER_", "JOB")) and k != "TF_CONFIG"
    }
    clean.update(
        HOSTS_FILE=str(hosts_file), PY=sys.executable, TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1", **env
    )
    proc = subprocess.Popen(
        ["unshare", "-rmn", "bash", "-c", script, "k8s-names", *TRAINER_ARGS],
        cwd=ROOT,
        env=clean,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    try:
        return proc.communicate(timeout=300)[0]
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)  # every task of the script is in its process group
        raise AssertionError("cluster timed out:\n" + proc.communicate()[0][-4000:]) from None


def assert_trained(out: str, chief_address: str) -> None:
    assert "exit codes: chief=0 worker=0" in out, out[-4000:]
    assert "chief | step 30/30" in out and "worker-0 | step 30/30" in out, out[-4000:]
    assert f"cluster_spec = {{'chief': ['{chief_address}']" in out, out[-4000:]


def test_cluster_forms_with_the_operators_names_and_tf_config(tmp_path: Path) -> None:
    ips = {"chief": "127.0.0.2", "worker": "127.0.0.3"}
    hosts = {tfjob_addr(t).rpartition(":")[0]: ip for t, ip in ips.items()}
    tf_chief, tf_worker = operator_tf_config(TaskId("chief", 0)), operator_tf_config(TaskId("worker", 0))
    out = run_in_namespace(TFJOB_SCRIPT, hosts, tmp_path, TF_CHIEF=tf_chief, TF_WORKER=tf_worker)
    assert_trained(out, "mnist-chief-0.team-a.svc:2222")


def test_cluster_forms_from_the_jobset_pod_identity(tmp_path: Path) -> None:
    hosts = {"mwms-chief-0-0.mwms": CHIEF_IP, "mwms-worker-0-0.mwms": WORKER_IP}
    out = run_in_namespace(
        JOBSET_SCRIPT, hosts, tmp_path, JOBSET_NAME="mwms", JOB_COMPLETION_INDEX="0", JOBSET_WORKERS="1"
    )
    assert_trained(out, "mwms-chief-0-0.mwms:2222")
    assert "'worker': ['mwms-worker-0-0.mwms:2222']" in out, out[-4000:]
