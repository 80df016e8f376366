"""A stuck task of a user's script is found: each task of a SCRIPT= run exports `trainer_input_step`
(the step whose batch it has taken) from the marks in its own graph, so when one task's input blocks
for ever and every task freezes in the collective, that task is the one behind (what trainer/supervise/supervisor.py
reads to name and end it; tests/e2e/test_stuck.py covers the supervisor's side on containers).

Two local processes under the wrapper, an unmodified-style `fit` script whose input map blocks for
ever on worker-0 after BLOCK_AT batches (set by the test through the environment).
"""

from __future__ import annotations

import subprocess
import textwrap
import time
import urllib.request

import contract
from tests.cluster.local import start_script
from tests.unit.test_monitoring_live import free_port

BLOCK_AT = 60
"""Batches worker-0 takes before its input blocks: past fit's tracing call (steps_per_execution 5)."""

SCRIPT = textwrap.dedent(
    """
    import json, os, threading
    os.environ.setdefault("TF_USE_LEGACY_KERAS", "1")
    import tensorflow as tf

    strategy = tf.distribute.MultiWorkerMirroredStrategy()
    task = json.loads(os.environ["TF_CONFIG"])["task"]
    block = task["type"] == "worker" and task["index"] == 0
    taken = [0]

    def read(x):  # the user's slow reader: on worker-0 it never returns after BLOCK_AT batches
        taken[0] += 1
        if block and taken[0] > int(os.environ["BLOCK_AT"]):
            threading.Event().wait()
        return x

    ds = tf.data.Dataset.from_tensor_slices(tf.random.normal((256, 8))).repeat().batch(16)
    ds = ds.map(lambda x: tf.ensure_shape(tf.numpy_function(read, [x], tf.float32), (16, 8)))
    ds = ds.map(lambda x: (x, tf.reduce_sum(x, axis=1, keepdims=True)))
    options = tf.data.Options()
    options.autotune.enabled = False  # read() counts batches as the step takes them, not ahead
    ds = ds.with_options(options)
    with strategy.scope():
        model = tf.keras.Sequential([tf.keras.layers.Input((8,)), tf.keras.layers.Dense(1)])
        model.compile(optimizer="sgd", loss="mse", steps_per_execution=5)
    model.fit(ds, epochs=1, steps_per_epoch=10_000, verbose=0)
    """
)


def scrape(port: int, name: str) -> float | None:
    try:
        text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    except OSError:
        return None
    values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + "{")]
    return values[0] if values else None


def test_the_task_whose_input_blocks_is_behind_its_peers(tmp_path) -> None:
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    port = free_port()
    proc = start_script(script, port, {"BLOCK_AT": str(BLOCK_AT)})
    ports = {"chief": port, "worker-0": port + 1}
    try:
        frozen = wait_frozen(ports, proc)
        inputs = {task: scrape(p, contract.INPUT_STEP.name) for task, p in ports.items()}
        assert inputs["worker-0"] is not None and inputs["chief"] is not None, inputs
        # worker-0 took BLOCK_AT batches and blocks in the next; the chief took that next one too
        assert inputs["worker-0"] < inputs["chief"], (inputs, frozen)
        assert inputs["worker-0"] >= frozen, (inputs, frozen)
    finally:
        proc.kill()
        proc.wait()


def wait_frozen(ports: dict[str, int], proc: subprocess.Popen) -> float:
    """The chief's global step once it is near BLOCK_AT (prefetching takes a few batches early) and
    has not moved for 3 polls. No time bound but the job's: it freezes only there, however slowly
    a loaded machine gets to it, and a run that ends or never gets there fails."""
    last, still = None, 0
    deadline = time.monotonic() + 900
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended with {proc.returncode} before its input blocked"
        step = scrape(ports["chief"], contract.GLOBAL_STEP.name)
        still = still + 1 if step is not None and step == last and step >= BLOCK_AT - 10 else 0
        if still >= 3:
            return step
        last = step
        time.sleep(2)
    raise AssertionError(f"the chief's step never froze near {BLOCK_AT} (last {last})")
