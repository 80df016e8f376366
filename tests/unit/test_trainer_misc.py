"""Agreement check, summary files, launcher helpers, bring-your-own-script wrapper."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bench import launch
from trainer.cluster import agreement
from trainer.cluster.spec import TaskId, on_ports
from trainer.config import Config
from trainer.core.timing import LoopResult
from trainer.errors import ConfigError
from trainer.state import summary

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_agreement_names_the_task_that_differs():
    spec = on_ports("127.0.0.1", [1, 2, 3])
    ok = agreement.fingerprints(spec, Config(), "2.21.0", "0.1.0")
    other_tf = agreement.fingerprints(spec, Config(), "2.20.0", "0.1.0")
    agreement.check(["chief", "worker-0", "worker-1"], [ok, ok, ok])
    with pytest.raises(ConfigError, match="worker-1 differs from chief in TensorFlow version"):
        agreement.check(["chief", "worker-0", "worker-1"], [ok, ok, other_tf])


def test_agreement_ignores_per_task_settings():
    spec = on_ports("127.0.0.1", [1, 2])
    a = agreement.fingerprints(spec, Config(metrics_port=1, output_dir="/a"), "x", "y")
    b = agreement.fingerprints(spec, Config(metrics_port=2, output_dir="/b"), "x", "y")
    c = agreement.fingerprints(spec, Config(steps=5), "x", "y")
    assert a == b and a != c
    assert all(v < 2**53 for v in a)  # exact in float64


def test_agreement_gather_traces_once_for_every_call():
    """A start gathers ~5 times (agreement, sizing, resume, steps per call): one function, traced once,
    whatever the values and their number (a function per call was traced each time, and warned of)."""
    import tensorflow as tf

    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    got = [agreement.gather(strategy, v) for v in ([1.0, 2.0], [3.0], [4.0, 5.0, 6.0], [7.0], [8.0], [9.0])]
    assert got[0] == [[1.0, 2.0]] and got[2] == [[4.0, 5.0, 6.0]] and got[-1] == [[9.0]]
    assert agreement._gather_function(strategy).experimental_get_tracing_count() == 1


class V:
    def __init__(self, value):
        self.value = np.asarray(value, np.float32)

    def numpy(self):
        return self.value


def test_summary_written_atomically(tmp_path):
    result = LoopResult(
        start_step=0, final_step=10, loss=0.1, accuracy=0.9, ids=[np.array([5, 1]), np.array([3])]
    )
    s = summary.build("worker-0", result, [V([1, 2]), V([3])])
    path = summary.write(s, str(tmp_path))
    with open(path) as f:
        doc = json.load(f)
    assert doc["example_ids"] == [1, 3, 5] and doc["final_step"] == 10
    assert doc["weights_sha256"] == summary.weights_digest([V([1, 2]), V([3])])
    assert doc["weights_sha256"] != summary.weights_digest([V([1, 2]), V([4])])


def test_free_ports_distinct():
    ports = launch.free_ports(5)
    assert len(set(ports)) == 5


class _ReusingSocket:
    """bind(port 0) takes the lowest port no open socket holds, as the kernel may: a port freed
    by one free_ports call is handed out again by the next."""

    held: set = set()

    def bind(self, addr):
        self.port = min(set(range(40000, 40100)) - self.held)
        self.held.add(self.port)

    def getsockname(self):
        return ("127.0.0.1", self.port)

    def close(self):
        self.held.discard(self.port)


def test_launcher_ports_are_distinct_even_when_the_kernel_reuses_freed_ports(monkeypatch):
    monkeypatch.setattr(launch.socket, "socket", _ReusingSocket)
    cluster, metrics = launch.plan_ports(2, None, "127.0.0.1")
    assert len(set(cluster + metrics)) == 6, (cluster, metrics)
    cluster, metrics = launch.plan_ports(2, 40001, "127.0.0.1")  # given ports the kernel would hand out
    assert metrics == [40001, 40002, 40003] and len(set(cluster + metrics)) == 6, cluster


def test_launcher_stops_the_others_and_returns_the_failure():
    ok = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    bad = subprocess.Popen([sys.executable, "-c", "import sys; sys.exit(3)"])
    assert launch.wait([("chief", ok), ("worker-0", bad)], poll_s=0.05) == 3
    assert ok.poll() is not None


def test_run_script_serves_metrics_and_returns_the_status(tmp_path):
    port = launch.free_ports(1)[0]
    script = tmp_path / "train.py"
    script.write_text(
        "import sys, urllib.request\n"
        f"text = urllib.request.urlopen('http://127.0.0.1:{port}/metrics').read().decode()\n"
        'assert \'trainer_state{task_index="1",task_type="worker",trainer_state="training"} 1.0\' in text, text\n'
        "assert 'process_cpu_seconds_total{task_index=\"1\"' in text\n"
        "assert 'trainer_network_receive_bytes_total' in text and 'trainer_build_info' in text\n"
        "assert sys.argv[1:] == ['--epochs', '2'], sys.argv\n"
        "sys.exit(5)\n"
    )
    tf_config = on_ports("127.0.0.1", [1, 2, 3]).with_task(TaskId("worker", 1)).to_tf_config()
    env = {**os.environ, "TRAINER_METRICS_PORT": str(port), "TF_CONFIG": tf_config}
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.script.wrapper", str(script), "--epochs", "2"],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 5, proc.stderr


@pytest.mark.parametrize(
    ("raise_", "code"),
    [
        # What fit raises on a survivor of a lost peer, even wrapped by the script: retryable, 200.
        ("raise tf.errors.UnavailableError(None, None, 'Collective ops is aborted by: ...')", 200),
        (
            "try:\n    raise tf.errors.AbortedError(None, None, 'aborted')\n"
            "except Exception as e:\n    raise RuntimeError('my wrapper') from e",
            200,
        ),
        ("raise tf.errors.InvalidArgumentError(None, None, 'bad shape')", 1),  # a bug: final
        ("raise ValueError('no such file')", 1),
    ],
)
def test_run_script_makes_a_lost_peer_retryable(tmp_path, raise_, code):
    script = tmp_path / "train.py"
    script.write_text("import tensorflow as tf\n" + raise_ + "\n")
    reason = tmp_path / "reason"
    env = {**os.environ, "TRAINER_METRICS_PORT": "0", "SUPERVISE_REASON_FILE": str(reason)}
    env.pop("TF_CONFIG", None)
    proc = subprocess.run(
        [sys.executable, "-m", "trainer.script.wrapper", str(script)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == code, proc.stderr[-2000:]
    # The one line `make wait` shows: where in the script, then the error (trainer/script/failure.py).
    assert reason.read_text().startswith(
        "a peer was lost"
        if code == 200
        else ("train.py line 2: InvalidArgument", "train.py line 2: ValueError")
    )
