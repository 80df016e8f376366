"""Keras 3 scripts and missing modules under the SCRIPT= wrapper, as real local clusters (chief + 1 worker).

Issue 48: a fit script written as keras.io teaches it (`import keras`) ended in a 70-line traceback
from keras/src/trainers (`Attempt to convert a value (PerReplica:...)`, keras-team/keras#20585) and
`make wait` showed `observe: 0 steps`. Now `import keras` trains with tf-keras, said in one line
(trainer/script/keras3.py); a script using Keras 3's own APIs is refused in one line, as is Keras 3
training anyway (TF_USE_LEGACY_KERAS=0); a module the image lacks is named with REQUIREMENTS=
(trainer/script/failure.py), in the line compose/wait.py's error_line picks from the task's log.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from compose.wait import ERROR_LINE, error_line
from tests.cluster.local import ROOT, SCRIPTS, launch
from tests.unit.test_monitoring_live import free_port
from trainer.host import on_ports

SCRIPT = SCRIPTS / "fit_keras3.py"
TASKS = ("chief", "worker-0")
ALIAS_LINE = "keras: `import keras` trains with tf-keras 2.21.0 here"
KERAS3_ONLY = "\nprint(keras.ops.sum(model(tf.ones((2, 16)))))\n"
"""A Keras 3 API after an otherwise ordinary fit: refused before anything runs."""


def run(script: Path, *args: str, env: dict[str, str] | None = None) -> tuple[int, dict[str, list[str]]]:
    """A chief + 1 worker under the wrapper as local processes: exit code, each task's output lines."""
    done = launch("--module", "trainer.script.wrapper", str(script), *args, workers=1, timeout=600, env=env)
    lines: dict[str, list[str]] = {task: [] for task in TASKS}
    for line in done.stdout.splitlines():
        task, _, text = line.partition("] ")
        if task[1:] in lines:
            lines[task[1:]].append(text)
    return done.returncode, lines


def errors(lines: list[str]) -> list[str]:
    return [m[1] for m in map(ERROR_LINE.match, lines) if m]


def losses(lines: list[str]) -> list[float]:
    return [float(m[1]) for m in map(re.compile(r"^epoch \d+ loss (\S+)$").match, lines) if m]


def test_an_import_keras_fit_script_trains_with_tf_keras_said_in_one_line() -> None:
    code, out = run(SCRIPT, "--epochs", "6")
    assert code == 0, out
    for task in TASKS:
        print(task, losses(out[task]))
        assert sum(ALIAS_LINE in line for line in out[task]) == 1, out[task]
        assert not errors(out[task]) and not any("Traceback" in line for line in out[task]), out[task]
        assert len(losses(out[task])) == 6 and losses(out[task])[-1] < losses(out[task])[0] / 2, out[task]
    assert losses(out["chief"]) == losses(out["worker-0"])  # one model, all-reduced: the same losses


def test_a_script_using_a_keras_3_api_is_refused_in_one_line(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    source = SCRIPT.read_text() + KERAS3_ONLY
    script.write_text(source)
    line = source.count("\n")
    code, out = run(script)
    assert code == 2, out
    for task in TASKS:
        assert errors(out[task]) == [
            f"train.py uses keras.ops (line {line}; tf-keras: tf.* ops), which only Keras 3 has: Keras 3 cannot train under "
            "MultiWorkerMirroredStrategy (keras-team/keras#20585), so `import keras` trains with tf-keras here, "
            "which lacks it; write that part with tf-keras or TensorFlow (tf.*) instead "
            "(docs/script.md, Keras 3 scripts)"
        ], out[task]
        assert not any("Traceback" in ln for ln in out[task]), out[task]
    print(errors(out["chief"])[0])


def test_keras_3_training_anyway_is_one_line_not_its_traceback() -> None:
    """TF_USE_LEGACY_KERAS=0 (the user's own): `import keras` is Keras 3, whose fit fails under MWMS."""
    code, out = run(SCRIPT, "--epochs", "1", env={"TF_USE_LEGACY_KERAS": "0"})
    assert code == 2, out
    chief = errors(out["chief"])
    print(chief)
    assert chief == [
        "fit_keras3.py trains with Keras 3: Keras 3 cannot train under MultiWorkerMirroredStrategy "
        "(keras-team/keras#20585): leave TF_USE_LEGACY_KERAS unset (it is '0'; the wrapper sets 1, and then "
        "`import keras` trains with tf-keras) (docs/script.md, Keras 3 scripts)"
    ], out["chief"]
    # Keras 3's own UserWarning (keras/src/trainers/epoch_iterator.py: shuffle) may stay; its traceback not.
    assert not any("Traceback" in ln or "PerReplica" in ln for ln in out["chief"]), out["chief"]


def supervised(script: Path, logs: Path) -> dict[str, str]:
    """A chief + 1 worker, each under its supervisor as in a container; each task's whole log (what
    `docker logs` replays: the supervisor's lines and the wrapper's, one stream)."""
    spec = on_ports("127.0.0.1", [free_port(), free_port()])
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TRAINER_") and k != "TF_CONFIG"}
    command = [sys.executable, "-m", "trainer.supervise.supervisor", "--"]
    command += [sys.executable, "-m", "trainer.script.wrapper", str(script)]
    procs = {}
    for task in spec.tasks:
        env = {
            **clean,
            "TF_CONFIG": spec.with_task(task).to_tf_config(),
            "TRAINER_METRICS_PORT": str(free_port()),
            "SUPERVISE_NOTICE_SECONDS": "1",
            "TF_CPP_MIN_LOG_LEVEL": "2",
        }
        with (logs / task.name).open("w") as out:
            procs[task.name] = subprocess.Popen(
                command, cwd=ROOT, env=env, stdout=out, stderr=subprocess.STDOUT
            )
    for proc in procs.values():
        assert proc.wait(timeout=600) == 2
    return {name: (logs / name).read_text() for name in procs}


def test_a_module_the_image_lacks_is_named_with_requirements_in_the_line_make_wait_shows(
    tmp_path: Path,
) -> None:
    script = tmp_path / "train.py"
    script.write_text("import tensorflow as tf\nimport pandas_is_not_in_this_image as pd\n")
    logs = supervised(script, tmp_path)
    line = (
        "train.py line 2 imports pandas_is_not_in_this_image, which the trainer image lacks: "
        "add it with REQUIREMENTS=path/to/requirements.txt (docs/script.md)"
    )
    for task, log in logs.items():
        print(f"--- {task}\n{log}")
        assert errors(log.splitlines()) == [line], log
        assert "Traceback" not in log, log
        assert f"supervise: exited 2 (bad configuration): final, not restarting: {line}" in log, log
        # What `make wait` and `make status` print after `... failed for good: exit code 2 (bad configuration): `
        assert error_line(task, run=lambda _cmd, log=log: log) == line
