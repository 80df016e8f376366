"""A real MWMS cluster started with the TF_CONFIG the Kubeflow training operator writes: its DNS names,
its extra `"environment": "cloud"` key, its field order.

The names are resolved the way a pod resolves them, through the resolver, not rewritten: the tasks run
in a private user, mount and network namespace (`unshare`) whose /etc/hosts is a bind mount of a file
the test writes; the host's /etc/hosts and network are untouched. TensorFlow binds 0.0.0.0:<port>,
so the two tasks use the ports a TFJob with different `tfjob-port`s per replica type gets.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from trainer import cluster
from trainer.cluster import TaskId

pytestmark = pytest.mark.cluster
ROOT = Path(__file__).resolve().parents[2]
NAMES = {"job": "mnist", "namespace": "team-a"}
PORTS = {"chief": 2222, "worker": 2223}
# Inside the namespace: loopback up, the hosts file over /etc/hosts, then both tasks; prints their codes.
SCRIPT = """
set -u
ip link set lo up
mount --bind "$HOSTS_FILE" /etc/hosts
TF_CONFIG="$TF_CHIEF" "$PY" -m trainer "$@" & chief=$!
TF_CONFIG="$TF_WORKER" "$PY" -m trainer "$@" & worker=$!
wait $chief; c=$?
wait $worker; w=$?
echo "exit codes: chief=$c worker=$w"
"""


def operator_tf_config(task: TaskId) -> str:
    """genTFConfigJSONStr's output for a TFJob whose Chief listens on 2222 and Worker on 2223."""
    addrs = {t: tfjob_addr(t) for t in PORTS}
    doc = {"cluster": {t: [a] for t, a in addrs.items()}, "task": {"type": task.type, "index": task.index},
           "environment": "cloud"}
    return json.dumps(doc, separators=(",", ":"))


def tfjob_addr(task_type: str) -> str:
    return cluster.TFJOB_ADDRESS.format(type=task_type, i=0, port=PORTS[task_type], **NAMES)


def namespaces_available() -> None:
    ok = shutil.which("unshare") and subprocess.run(["unshare", "-rmn", "true"], capture_output=True,
                                                    check=False).returncode == 0
    if not ok:
        message = "unshare -rmn (user, mount and network namespaces) is not available here"
        pytest.fail(message) if os.environ.get("CI") == "true" else pytest.skip(message)


def test_cluster_forms_with_the_operators_names_and_tf_config(tmp_path: Path) -> None:
    namespaces_available()
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1 localhost\n"
                     f"127.0.0.2 {tfjob_addr('chief').rpartition(':')[0]}\n"
                     f"127.0.0.3 {tfjob_addr('worker').rpartition(':')[0]}\n")
    tf_chief, tf_worker = operator_tf_config(TaskId("chief", 0)), operator_tf_config(TaskId("worker", 0))
    assert cluster.parse_tf_config(tf_worker).address(TaskId("chief", 0)) == "mnist-chief-0.team-a.svc:2222"
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    env.update(HOSTS_FILE=str(hosts), TF_CHIEF=tf_chief, TF_WORKER=tf_worker, PY=sys.executable,
               TF_CPP_MIN_LOG_LEVEL="2", PYTHONUNBUFFERED="1")
    done = subprocess.run(["unshare", "-rmn", "bash", "-c", SCRIPT, "k8s-names", "--steps", "30",
                           "--log-every", "10", "--metrics-port", "0", "--cluster-timeout", "60"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=240, check=False)
    out = done.stdout + done.stderr
    assert "exit codes: chief=0 worker=0" in out, out[-4000:]
    assert "chief | step 30/30" in out and "worker-0 | step 30/30" in out, out[-4000:]
    assert "cluster_spec = {'chief': ['mnist-chief-0.team-a.svc:2222']" in out, out[-4000:]
