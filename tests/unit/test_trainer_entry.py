"""The entry point rejects every bad TF_CONFIG and flag before TensorFlow is imported: exit 2, one line
naming the field."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

GOOD = {
    "cluster": {"chief": ["chief:2222"], "worker": ["worker-0:2222"]},
    "task": {"type": "worker", "index": 0},
}


def _tf_config(**task_or_cluster):
    doc = json.loads(json.dumps(GOOD))
    for key, value in task_or_cluster.items():
        part, _, field = key.partition("__")
        doc[part][field] = value
    return json.dumps(doc)


CASES = [
    ("{not json", "not valid JSON"),
    ('["a"]', "JSON object"),
    (json.dumps({"task": GOOD["task"]}), "TF_CONFIG.cluster"),
    (json.dumps({"cluster": GOOD["cluster"]}), "TF_CONFIG.task"),
    (_tf_config(task__type="evaluator"), "TF_CONFIG.task.type"),
    (_tf_config(task__index=5), "TF_CONFIG.task.index"),
    (_tf_config(task__index=-1), "TF_CONFIG.task.index"),
    (_tf_config(task__index="1"), "TF_CONFIG.task.index"),
    (_tf_config(cluster__ps=["ps:2222"]), "TF_CONFIG.cluster.ps"),
    (_tf_config(cluster__worker=[]), "TF_CONFIG.cluster.worker"),
    (_tf_config(cluster__worker=["chief:2222"]), "share the address"),
    (_tf_config(cluster__worker=["worker-0:http"]), "TF_CONFIG.cluster.worker[0]"),
    (_tf_config(cluster__worker=["worker-0"]), "TF_CONFIG.cluster.worker[0]"),
    (_tf_config(cluster__chief=["a:1", "b:2"]), "TF_CONFIG.cluster.chief"),
]


# `python -m trainer ARGS`, failing (exit 1, a traceback) if it imported TensorFlow before exiting.
NO_TENSORFLOW = """
import runpy, sys
sys.argv = ["trainer", *sys.argv[1:]]
try:
    runpy.run_module("trainer", run_name="__main__", alter_sys=True)
finally:
    assert "tensorflow" not in sys.modules, "TensorFlow was imported"
"""


def _run(env_extra, *args):
    env = {**os.environ, **env_extra}
    env.pop("TF_CONFIG", None)
    env.update(env_extra)
    return subprocess.run(
        [sys.executable, "-c", NO_TENSORFLOW, *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=os.path.dirname(os.path.dirname(os.path.dirname(__file__))),
    )


@pytest.mark.parametrize("tf_config, field", CASES)
def test_bad_tf_config_exits_2_with_one_line(tf_config, field):
    proc = _run({"TF_CONFIG": tf_config})
    assert proc.returncode == 2, proc.stderr
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and field in lines[0], proc.stderr


def test_bad_env_var_exits_2():
    proc = _run({"TRAINER_STEPS": "many"})
    assert proc.returncode == 2 and "TRAINER_STEPS" in proc.stderr


def test_mirrored_with_tf_config_is_a_config_error():
    proc = _run({"TF_CONFIG": json.dumps(GOOD)}, "--strategy", "mirrored")
    assert proc.returncode == 2 and "--strategy mirrored" in proc.stderr


def test_config_path_does_not_import_tensorflow():
    code = (
        "import sys; from trainer import config, errors; "
        "from trainer.cluster import spec, preflight, agreement; from trainer.telemetry import metrics; "
        "from trainer.train import progress, loop; from trainer.core import timing, fault; from trainer.state import summary; "
        "assert 'tensorflow' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=30)


@pytest.mark.parametrize("task", ["nope", "no_such_package.module:fn", "pkg.module:", "a b:c"])
def test_unknown_task_exits_2_with_one_line_before_tensorflow(task):
    proc = _run({}, "--task", task)
    lines = [ln for ln in proc.stderr.splitlines() if ln.strip()]
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "--task" in lines[0] and "TRAINER_TASK" in lines[0], lines[0]


def test_unknown_task_from_the_environment_exits_2():
    proc = _run({"TRAINER_TASK": "nope"})
    assert proc.returncode == 2 and "TRAINER_TASK" in proc.stderr, proc.stderr


def test_sigusr2_writes_every_threads_stack_and_the_task_goes_on(tmp_path) -> None:
    import signal
    import time

    script = tmp_path / "task.py"
    script.write_text(
        "import sys, threading, time\n"
        "from trainer.__main__ import dump_stacks_on_signal\n"
        "dump_stacks_on_signal()\n"
        "def blocked_input():\n"
        "    threading.Event().wait()\n"
        "threading.Thread(target=blocked_input, daemon=True).start()\n"
        "print('ready', flush=True)\n"
        "time.sleep(3600)\n"
    )
    root = Path(__file__).resolve().parents[2]
    child = subprocess.Popen(
        [sys.executable, str(script)],
        cwd=root,
        env={"PYTHONPATH": str(root)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout.readline().strip() == "ready"
        child.send_signal(signal.SIGUSR2)
        time.sleep(1.0)
        assert child.poll() is None, "the dump must not end the task (its supervisor does)"
    finally:
        child.kill()
    err = child.communicate()[1]
    assert "in blocked_input" in err and "in <module>" in err and "in wait_and_dump" in err, err
