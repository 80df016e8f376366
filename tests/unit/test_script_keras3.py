"""`import keras` in a SCRIPT= run (trainer/script/keras3.py): Keras 3 names tf-keras lacks are found in
the source before anything runs, against tf-keras' public API read from its generated files, and the
import alias hands `keras` and `keras.X` tf-keras' modules (here a fake pair of packages: no TensorFlow)."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pytest

from trainer.script import keras3


def write_package(root: Path, files: dict[str, str]) -> None:
    for name, text in files.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


@pytest.fixture
def api(tmp_path: Path) -> keras3.Api:
    """A tf-keras shaped tree: generated `__init__.py` files that import their public names."""
    write_package(
        tmp_path / "tf_keras",
        {
            "__init__.py": """
                from tf_keras import layers
                from tf_keras import optimizers
                from tf_keras.src.engine.sequential import Sequential
                __version__ = "2.21.0"
            """,
            "layers/__init__.py": "from tf_keras.src.layers.core.dense import Dense\n",
            "optimizers/__init__.py": "from tf_keras.src.optimizers.adam import Adam\n",
            "src/__init__.py": "",
        },
    )
    return keras3.Api(tmp_path / "tf_keras")


def test_an_ordinary_fit_script_uses_nothing_tf_keras_lacks(api: keras3.Api) -> None:
    source = """
        import keras
        from keras import layers
        from keras.optimizers import Adam
        model = keras.Sequential([layers.Dense(1)])
        model.compile(optimizer=Adam(1e-3), loss="mse")
        keras.Sequential.fit  # a class's attributes are not checked
    """
    assert keras3.imports_keras(textwrap.dedent(source))
    assert keras3.uses(textwrap.dedent(source), api) == []


def test_keras_3_names_are_found_once_each_at_their_first_line(api: keras3.Api) -> None:
    source = """
        import keras
        import keras.random as kr
        from keras import ops, layers
        from keras.layers import Dense, RMSNormalization
        x = ops.sum(1)
        keras.config.set_backend("jax")
        keras.ops.mean(ops.sum(2))
        L = keras.layers.Dense
    """
    found = keras3.uses(textwrap.dedent(source), api)
    assert found == [
        keras3.Use("keras.random", 3),
        keras3.Use("keras.ops", 4),
        keras3.Use("keras.layers.RMSNormalization", 5),
        keras3.Use("keras.config", 7),
    ]
    line = keras3.refusal("/script/train.py", found)
    assert "\n" not in line
    assert line.startswith(
        "train.py uses keras.random (line 3; tf-keras: tf.random), keras.ops (line 4; tf-keras: tf.* ops), "
        "keras.layers.RMSNormalization (line 5)"
        " and 1 more, which only Keras 3 has: Keras 3 cannot train under MultiWorkerMirroredStrategy"
        " (keras-team/keras#20585)"
    )
    assert "write that part with tf-keras or TensorFlow (tf.*)" in line
    subclass = keras3.refusal("train.py", [keras3.Use("keras.Layer", 7)])
    assert subclass.startswith("train.py uses keras.Layer (line 7; tf-keras: keras.layers.Layer), which only")


def test_a_script_without_keras_is_not_read_further(api: keras3.Api) -> None:
    source = "import tensorflow as tf\nops = tf\nops.config\n"
    assert not keras3.imports_keras(source)
    assert keras3.uses(source, api) == []


def test_the_installed_tf_keras_api_is_read_from_its_files() -> None:
    api = keras3.Api.installed()
    assert api is not None and {"Sequential", "layers", "callbacks", "optimizers"} <= api.names(())
    assert api.missing(("layers", "Dense")) is None and api.missing(("ops", "sum")) == ("ops",)
    assert api.missing(("callbacks", "BackupAndRestore")) is None


def test_the_fit_seed_written_for_keras_3_passes() -> None:
    script = Path(__file__).resolve().parents[1] / "scripts" / "fit_keras3.py"
    assert keras3.uses(script.read_text(), keras3.Api.installed()) == []


@pytest.fixture
def alias_pair(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """`userlib` aliased to `fakepkg` (a package with a submodule), as `keras` is to `tf_keras`."""
    write_package(
        tmp_path,
        {
            "fakepkg/__init__.py": "__version__ = '9.9'\nfrom fakepkg import layers\n",
            "fakepkg/layers/__init__.py": "class Dense: pass\n",
        },
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    said: list[str] = []
    alias = keras3.install(said.append, name="userlib", to="fakepkg")
    yield alias, said
    keras3.uninstall(alias)
    for name in [n for n in sys.modules if n.split(".")[0] in ("userlib", "fakepkg")]:
        del sys.modules[name]


def test_the_alias_hands_out_the_same_modules_and_says_so_once(alias_pair) -> None:
    alias, said = alias_pair
    fakepkg = importlib.import_module("fakepkg")
    userlib = importlib.import_module("userlib")
    layers = importlib.import_module("userlib.layers")
    dense = __import__("userlib.layers", fromlist=["Dense"]).Dense  # `from userlib.layers import Dense`

    assert userlib is fakepkg and layers is fakepkg.layers and dense is fakepkg.layers.Dense
    assert fakepkg.__spec__.name == "fakepkg" and fakepkg.layers.__spec__.name == "fakepkg.layers"
    assert alias.used and len(said) == 1
    assert said[0].startswith("keras: `import userlib` trains with tf-keras 9.9 here: Keras 3 cannot train")


def test_what_the_target_lacks_fails_as_python_fails_it(alias_pair) -> None:
    """(importlib, not import statements: tests/unit/test_packaging.py reads those as distributions.)"""
    importlib.import_module("userlib")
    with pytest.raises(ModuleNotFoundError) as missing:
        importlib.import_module("userlib.ops")
    assert missing.value.name == "userlib.ops"
    with pytest.raises(ImportError, match="cannot import name 'ops' from 'fakepkg'"):
        exec("from userlib import ops", {})  # noqa: S102


def test_no_alias_without_its_target() -> None:
    assert keras3.install(lambda _: None, name="userlib", to="no_such_package_here") is None
