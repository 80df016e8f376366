"""A script's failure in one line (trainer/script/failure.py), from real exceptions raised by files run
as the wrapper runs them, and that line is the one compose/wait.py's error_line picks from the log."""

from __future__ import annotations

import runpy
import types
from pathlib import Path

import pytest

from compose.wait import error_line
from trainer.script import failure


def raised(tmp_path: Path, source: str, **files: str) -> tuple[BaseException, str]:
    for name, text in files.items():
        (tmp_path / f"{name}.py").write_text(text)
    script = tmp_path / "train.py"
    script.write_text(source)
    try:
        runpy.run_path(str(script), run_name="__main__")
    except Exception as err:  # noqa: BLE001
        return err, str(script)
    raise AssertionError("the script did not fail")


def test_a_module_the_image_lacks_is_named_with_requirements(tmp_path: Path) -> None:
    err, script = raised(tmp_path, "import os\nimport pandas_not_in_this_image as pd\n")
    known = failure.explain(err, script, aliased=False)
    assert known == failure.Failure(
        2,
        "train.py line 2 imports pandas_not_in_this_image, which the trainer image lacks: "
        "add it with REQUIREMENTS=path/to/requirements.txt (docs/script.md)",
    )


def test_a_missing_module_in_the_scripts_own_module_names_both_lines(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.syspath_prepend(str(tmp_path))  # the wrapper puts the script's folder first, as python does
    err, script = raised(tmp_path, "import helper\n", helper="\n\nfrom sklearn_absent import svm\n")
    line = failure.explain(err, script, aliased=False).line
    assert line.startswith(
        "helper.py line 3 (from train.py line 1) imports sklearn_absent, which the trainer"
    )


def test_a_missing_submodule_of_a_present_package_is_not_a_requirement(tmp_path: Path) -> None:
    err, script = raised(tmp_path, "import json.no_such_part\n")
    known = failure.explain(err, script, aliased=False)
    assert known.code == 2 and "imports json.no_such_part, which the image's json does not have" in known.line
    assert "REQUIREMENTS" not in known.line


def test_a_keras_3_attribute_met_at_run_time_is_one_line_when_keras_is_tf_keras(tmp_path: Path) -> None:
    keras = types.ModuleType("tf_keras")  # what `import keras` gives under the alias
    script = tmp_path / "train.py"
    script.write_text("def step(keras):\n    return keras.ops.sum(1)\n")
    with pytest.raises(AttributeError) as raised_:
        runpy.run_path(str(script))["step"](keras)
    err, script = raised_.value, str(script)
    known = failure.explain(err, script, aliased=True)
    assert known == failure.Failure(
        2,
        "train.py line 2 uses keras.ops, which only Keras 3 has: Keras 3 cannot train under "
        "MultiWorkerMirroredStrategy (keras-team/keras#20585), so `import keras` trains with tf-keras here, "
        "which lacks it; write that part with tf-keras or TensorFlow (tf.*) instead (docs/script.md, Keras 3 scripts)",
    )
    # Not aliased (the script imported tf_keras itself): its own AttributeError, reported as such.
    assert failure.explain(err, script, aliased=False).code == 1


def test_from_keras_import_a_keras_3_name_is_one_line(tmp_path: Path) -> None:
    err = ImportError("cannot import name 'ops' from 'tf_keras' (/site-packages/tf_keras/__init__.py)")
    assert failure.keras3_name(err) == "keras.ops"
    assert failure.keras3_name(
        ModuleNotFoundError("No module named 'keras.random'", name="keras.random")
    ) == ("keras.random")
    assert failure.keras3_name(ImportError("cannot import name 'x' from 'numpy'")) is None


def keras3_fit_error(tmp_path: Path) -> BaseException:
    """Keras 3's ValueError, raised from a file under keras/src/trainers as Keras 3's fit raises it."""
    trainers = tmp_path / "site" / "keras" / "src" / "trainers"
    trainers.mkdir(parents=True)
    (trainers / "trainer.py").write_text(
        "def fit():\n    raise ValueError('Attempt to convert a value (PerReplica:{\\n  0: <tf.Tensor>\\n})"
        " with an unsupported type (<class PerReplica>) to a Tensor.')\n"
    )
    fit = runpy.run_path(str(trainers / "trainer.py"))["fit"]
    try:
        fit()
    except ValueError as err:
        return err
    raise AssertionError


@pytest.mark.parametrize(
    ("legacy", "tf_keras_there", "fix"),
    [
        ("0", True, "leave TF_USE_LEGACY_KERAS unset (it is '0'"),
        ("1", True, "write `import tf_keras as keras`"),
        ("1", False, "the image lacks tf-keras: add tf-keras==2.21.0 with REQUIREMENTS="),
    ],
)
def test_keras_3_training_under_mwms_is_one_line_naming_the_fix(
    tmp_path, legacy, tf_keras_there, fix
) -> None:
    err = keras3_fit_error(tmp_path)
    known = failure.explain(
        err,
        "/script/train.py",
        aliased=False,
        env={"TF_USE_LEGACY_KERAS": legacy},
        find_spec=lambda name: object() if tf_keras_there else None,
    )
    assert known.code == 2 and not known.traceback and "\n" not in known.line
    assert known.line.startswith(
        "train.py trains with Keras 3: Keras 3 cannot train under MultiWorkerMirroredStrategy (keras-team/keras#20585): "
    )
    assert fix in known.line


def test_anything_else_is_final_with_where_and_what_after_its_traceback(tmp_path: Path) -> None:
    err, script = raised(tmp_path, "def f():\n    raise RuntimeError('boom\\nmore')\n\nf()\n")
    assert failure.explain(err, script, aliased=True) == failure.Failure(
        1, "train.py line 2: RuntimeError: boom", traceback=True
    )


def test_make_wait_picks_the_line_over_what_the_task_printed_after_it() -> None:
    """The issue's log: a traceback, then observe's summary; make wait showed `observe: 0 steps`."""
    log = "\n".join(
        [
            "2026-12-07 13:00:00,000 I keras: `import keras` trains with tf-keras 2.21.0 here: ...",
            "Traceback (most recent call last):",
            '  File "/script/train.py", line 2, in <module>',
            "ModuleNotFoundError: No module named 'pandas'",
            "2026-12-07 13:00:01,000 E train.py line 2 imports pandas, which the trainer image lacks: "
            "add it with REQUIREMENTS=path/to/requirements.txt (docs/script.md)",
            "2026-12-07 13:00:01,001 I observe: 0 steps, global step 0, 0 examples",
            "supervise: exited 2 (bad configuration): final, not restarting: train.py line 2 imports pandas, ...",
        ]
    )
    assert error_line("cid", run=lambda _cmd: log) == (
        "train.py line 2 imports pandas, which the trainer image lacks: "
        "add it with REQUIREMENTS=path/to/requirements.txt (docs/script.md)"
    )


def test_an_unknown_failure_inside_tf_keras_hints_at_keras_3_when_keras_was_aliased(tmp_path: Path) -> None:
    """`keras.layers.Dense(4, lora_rank=2)`: Keras 3 takes it, tf-keras raises a TypeError of its own."""
    layer = tmp_path / "site" / "tf_keras" / "src" / "layers" / "dense.py"
    layer.parent.mkdir(parents=True)
    layer.write_text(
        "def Dense(units, **kwargs):\n    raise TypeError(f'unexpected keyword {list(kwargs)}')\n"
    )
    dense = runpy.run_path(str(layer))["Dense"]
    script = tmp_path / "train.py"
    script.write_text("def build(Dense):\n    return Dense(4, lora_rank=2)\n")
    with pytest.raises(TypeError) as raised_:
        runpy.run_path(str(script))["build"](dense)
    line = failure.explain(raised_.value, str(script), aliased=True).line
    assert line.endswith(  # (the fake tf_keras here is not under site-packages: where() names it too)
        "(from train.py line 2): TypeError: unexpected keyword ['lora_rank'] "
        "(`import keras` is tf-keras here: a Keras 3 argument? docs/script.md, Keras 3 scripts)"
    )
    assert "tf-keras" not in failure.explain(raised_.value, str(script), aliased=False).line
