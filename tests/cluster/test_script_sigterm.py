"""SIGTERM reaches a user's script under the SCRIPT= wrapper (trainer/script/sigterm.py).

MWMS's coordination service swallows SIGTERM (TensorFlow's preemption notifier only records it), so
`docker stop` of a SCRIPT task waited out the stop grace for the engine's SIGKILL (`make down` took
61 s on a fit script). Two local processes under the wrapper; worker-0 gets SIGTERM mid-run, as its
supervisor forwards `docker stop`'s: it must end well within the grace, and a handler the script
set before building its strategy must be the one that runs. A task still inside that constructor,
waiting for a peer that is gone, cannot act on SIGTERM at all: its supervisor must end it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

import contract
from compose.deployment import STOP_GRACE_SECONDS
from tests.cluster.local import ROOT, start_script
from tests.cluster.test_script_stuck import scrape
from tests.unit.test_monitoring_live import free_port

SCRIPT = textwrap.dedent(
    """
    import os, signal, sys
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    if os.environ.get("OWN_HANDLER"):
        def saved(signum, frame):  # the user's own: write where it got to, then leave
            open(os.environ["OWN_HANDLER"], "w").write("saved")
            sys.exit(0)
        signal.signal(signal.SIGTERM, saved)
    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    ds = tf.data.Dataset.from_tensor_slices(tf.random.normal((256, 8))).repeat().batch(16)
    ds = ds.map(lambda x: (x, tf.reduce_sum(x, axis=1, keepdims=True)))
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=5)
    model.fit(ds, epochs=1, steps_per_epoch=10_000_000, verbose=0)
    """
)


def worker_pid(launcher: subprocess.Popen) -> int:
    """The wrapper process of worker-0 among the launcher's children (by its TF_CONFIG)."""
    children = Path(f"/proc/{launcher.pid}/task/{launcher.pid}/children").read_text().split()
    for pid in map(int, children):
        env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        config = next(e for e in env if e.startswith(b"TF_CONFIG=")).split(b"=", 1)[1]
        if json.loads(config)["task"] == {"type": "worker", "index": 0}:
            return pid
    raise AssertionError(f"no worker-0 among {children}")


def alive(pid: int) -> bool:
    """Running: not gone and not a zombie waiting for the launcher to reap it."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def wait_training(port: int, launcher: subprocess.Popen) -> None:
    """Worker-0 has stepped past fit's tracing call (no time bound but the run's: a loaded machine
    is slow to get there, and a run that ends first fails)."""
    deadline = time.monotonic() + 900
    while (step := scrape(port, contract.GLOBAL_STEP.name)) is None or step < 20:
        assert launcher.poll() is None, f"the run ended with {launcher.returncode} before training"
        assert time.monotonic() < deadline, "worker-0 never trained"
        time.sleep(1)


@pytest.mark.parametrize("own_handler", [False, True], ids=["default", "the-scripts-own-handler"])
def test_sigterm_ends_a_script_task_within_the_stop_grace(tmp_path, own_handler) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    marker = tmp_path / "saved"
    port = free_port()
    launcher = start_script(script, port, {"OWN_HANDLER": str(marker)} if own_handler else {})
    try:
        wait_training(port + 1, launcher)
        pid = worker_pid(launcher)
        sent = time.monotonic()
        os.kill(pid, signal.SIGTERM)
        while alive(pid):
            assert time.monotonic() - sent < STOP_GRACE_SECONDS / 2, (
                "worker-0 still runs: SIGTERM was swallowed"
            )
            time.sleep(0.2)
        print(f"worker-0 ended {time.monotonic() - sent:.1f} s after SIGTERM")
        if own_handler:
            assert marker.read_text() == "saved"
    finally:
        launcher.kill()
        launcher.wait()


def test_sigterm_ends_a_script_task_still_waiting_for_a_missing_peer(tmp_path) -> None:
    """`make down` of a job with a task gone (killed, its node lost) took 61 s: its peers' scripts
    sat in MWMS's constructor waiting for it, where TensorFlow holds SIGTERM and the GIL (not even
    /metrics answers). The chief of a chief + 1 worker runs under its supervisor; the worker never starts."""
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    cluster = [f"127.0.0.1:{free_port()}" for _ in range(2)]
    tf_config = {
        "cluster": {"chief": cluster[:1], "worker": cluster[1:]},
        "task": {"type": "chief", "index": 0},
    }
    log = tmp_path / "chief.log"
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    env = {**clean, "TF_CONFIG": json.dumps(tf_config), "TRAINER_METRICS_PORT": str(free_port())}
    command = [
        sys.executable,
        "-m",
        "trainer.supervise.supervisor",
        "--",
        sys.executable,
        "-m",
        "trainer.script.wrapper",
    ]
    with log.open("w") as out:  # no stdout: a wrapper left behind by a failure must not hold pytest's
        chief = subprocess.Popen(
            [*command, str(script)],
            cwd=ROOT,
            env={**env, "TF_CPP_MIN_LOG_LEVEL": "0"},
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
    try:
        deadline = time.monotonic() + 900  # the run's bound, not a time: a loaded machine imports slowly
        while "Waiting for 1/2 tasks to connect" not in log.read_text():  # TensorFlow's coordination service
            assert chief.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.5)
        sent = time.monotonic()
        chief.send_signal(signal.SIGTERM)
        try:
            chief.wait(timeout=STOP_GRACE_SECONDS / 2)
        except subprocess.TimeoutExpired:
            raise AssertionError("the chief still waits for its peer: SIGTERM was swallowed") from None
        print(f"the chief ended {time.monotonic() - sent:.1f} s after SIGTERM")
        assert "SIGTERM while joining its cluster (nothing to save): SIGKILL" in log.read_text()
    finally:
        wrapper = Path(f"/proc/{chief.pid}/task/{chief.pid}/children")
        for pid in map(int, wrapper.read_text().split() if wrapper.exists() else ()):
            os.killpg(pid, signal.SIGKILL)  # its own session (the supervisor's start_new_session)
        chief.kill()
        chief.wait()
