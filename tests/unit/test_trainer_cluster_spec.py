"""The cluster spec: every malformed TF_CONFIG is rejected with a message naming the field."""

import json

import pytest

from trainer.cluster import spec as cluster
from trainer.cluster.spec import ClusterSpecError, TaskId

GOOD = {
    "cluster": {"chief": ["chief:2222"], "worker": ["worker-0:2222", "worker-1:2222"]},
    "task": {"type": "worker", "index": 1},
}


def _with(**changes):
    doc = json.loads(json.dumps(GOOD))
    for path, value in changes.items():
        *parents, leaf = path.split("__")
        node = doc
        for key in parents:
            node = node[key]
        if value is KeyError:
            del node[leaf]
        else:
            node[leaf] = value
    return json.dumps(doc)


def test_parses_good_config():
    spec = cluster.parse_tf_config(json.dumps(GOOD))
    assert spec.task == TaskId("worker", 1)
    assert spec.num_tasks == 3 and not spec.is_chief
    assert [t.name for t in spec.tasks] == ["chief", "worker-0", "worker-1"]
    assert [t.name for t in spec.peers] == ["chief", "worker-0"]
    assert spec.address(TaskId("chief", 0)) == "chief:2222"


def test_absent_config_is_single_process():
    assert cluster.parse_tf_config(None) is None
    assert cluster.parse_tf_config("  ") is None


def test_round_trip_and_fingerprint_ignores_task():
    spec = cluster.for_hosts(3)
    again = cluster.parse_tf_config(spec.to_tf_config())
    assert again == spec
    assert spec.with_task(TaskId("worker", 2)).fingerprint() == spec.fingerprint()
    assert cluster.for_hosts(2).fingerprint() != spec.fingerprint()
    assert spec.fingerprint() < 2**52


def test_chiefless_cluster_makes_worker_0_chief():
    spec = cluster.parse_tf_config('{"cluster":{"worker":["a:1","b:2"]},"task":{"type":"worker","index":0}}')
    assert spec.is_chief


@pytest.mark.parametrize(
    "text, field",
    [
        ("{not json", "not valid JSON"),
        ("[1, 2]", "JSON object"),
        (_with(cluster=KeyError), "TF_CONFIG.cluster"),
        (_with(task=KeyError), "TF_CONFIG.task"),
        (_with(task__type="evaluator"), "TF_CONFIG.task.type"),
        (_with(task__type="ps"), "TF_CONFIG.task.type"),
        (_with(task__index=5), "TF_CONFIG.task.index 5"),
        (_with(task__index=-1), "TF_CONFIG.task.index -1"),
        (_with(task__index="1"), "must be a JSON integer"),
        (_with(task__index=True), "must be a JSON integer"),
        (_with(cluster__ps=["ps:2222"]), "TF_CONFIG.cluster.ps"),
        (_with(cluster__evaluator=["e:2222"]), "TF_CONFIG.cluster.evaluator"),
        (_with(cluster__worker=[]), "TF_CONFIG.cluster.worker"),
        (_with(cluster__worker="worker-0:2222"), "TF_CONFIG.cluster.worker"),
        (_with(cluster__worker=["worker-0:2222", "chief:2222"]), "share the address"),
        (_with(cluster__worker=["worker-0:http", "w:1"]), "TF_CONFIG.cluster.worker[0]"),
        (_with(cluster__worker=["worker-0", "w:1"]), "TF_CONFIG.cluster.worker[0]"),
        (_with(cluster__worker=["worker-0:70000", "w:1"]), "port"),
        (_with(cluster__chief=["a:1", "b:2"]), "exactly one chief"),
        (_with(cluster__chief=KeyError, task__type="chief", task__index=0), 'task.type "chief"'),
    ],
)
def test_rejects_malformed_config(text, field):
    with pytest.raises(ClusterSpecError) as err:
        cluster.parse_tf_config(text)
    message = str(err.value)
    assert field in message
    assert "\n" not in message


def test_for_hosts_names_services():
    spec = cluster.for_hosts(2)
    assert spec.cluster_dict() == {"chief": ["chief:2222"], "worker": ["worker-0:2222", "worker-1:2222"]}
    with pytest.raises(ClusterSpecError, match="WORKERS=-1"):
        cluster.for_hosts(-1)


@pytest.mark.parametrize(
    ("address", "host"),
    [
        ("127.0.0.1:2222", "127.0.0.1"),  # bench.launch: loopback only
        ("127.0.0.5:2222", "127.0.0.5"),
        ("localhost:2222", "127.0.0.1"),
        ("chief:2222", "0.0.0.0"),  # a container reached by its service name
        ("10.0.0.3:2222", "0.0.0.0"),
        ("[::1]:2222", "0.0.0.0"),  # our listeners are IPv4: an IPv6 peer address keeps every address
    ],
)
def test_a_task_listens_on_loopback_only_when_its_tf_config_address_is_loopback(address, host):
    assert cluster.listen_host(address) == host
    local = cluster.on_ports("127.0.0.1", [2222, 2223]).with_task(TaskId("worker", 0))
    assert local.listen_host == "127.0.0.1" and cluster.for_hosts(1).listen_host == "0.0.0.0"
