"""The gRPC server settings reach the server MultiWorkerMirroredStrategy starts (trainer/cluster/server_config.py).

A one-task cluster (a chief on a free port) in a fresh process: the trainer's own make_strategy with
DEFAULT replaced by non-default values, then the running server's default_session_config is read back.
A TensorFlow the hook was not checked against must fail loudly, before any strategy exists.
"""

import json
import subprocess
import sys

import pytest

from tests.cluster.local import ROOT

pytestmark = pytest.mark.cluster

PROBE = """
import json, os, sys
os.environ["TF_USE_LEGACY_KERAS"] = "1"
import trainer
from trainer import config as config_lib
from trainer.cluster import server_config
from trainer.assembly import training
from trainer.cluster.spec import parse_tf_config
wanted = json.loads(sys.argv[1])
server_config.DEFAULT = wanted
spec = parse_tf_config(os.environ["TF_CONFIG"])
training.make_strategy(config_lib.from_args([], {}), spec)
print("IN_SERVER", json.dumps(server_config.in_server()))
"""


def _run(wanted: dict, extra: str = "") -> subprocess.CompletedProcess:
    from bench.launch import free_ports
    from trainer.cluster.spec import on_ports

    spec = on_ports("127.0.0.1", free_ports(1))
    return subprocess.run(
        [sys.executable, "-c", extra + PROBE, json.dumps(wanted)],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "TF_CPP_MIN_LOG_LEVEL": "2", "TF_CONFIG": spec.to_tf_config()},
        capture_output=True,
        text=True,
        timeout=300,
    )


def test_the_trainers_settings_reach_the_running_server():
    wanted = {"recv_buf_max_chunk": -1, "num_channels_per_target": 4}
    out = _run(wanted)
    found = [line.split(" ", 1)[1] for line in out.stdout.splitlines() if line.startswith("IN_SERVER ")]
    assert out.returncode == 0 and found, out.stderr[-3000:]
    assert json.loads(found[0]) == wanted


def test_an_unchecked_tensorflow_fails_loudly():
    out = _run({"recv_buf_max_chunk": -1}, "import tensorflow as tf; tf.__version__ = '9.0.0'\n")
    assert out.returncode != 0
    assert "TensorFlow 9.0.0 was not checked" in out.stderr, out.stderr[-2000:]
