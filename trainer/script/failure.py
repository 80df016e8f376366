"""A user's script failed: the one line that says what to change, where one is known.

`make wait` and `make status` show a task's last error line (compose/wait.py error_line), and the
supervisor's final line repeats it; before this, a script's failure left only a traceback in the
task's log, and the line shown was whatever it printed last (`observe: 0 steps ...`). Three failures
have a known fix, each told in one line without the traceback, and each final (exit 2, bad
configuration: a restart would fail the same way):

- a module the image lacks (`import pandas`): name it and REQUIREMENTS=, which adds packages to the image;
- a Keras 3 API tf-keras lacks, met at run time (trainer/script/keras3.py finds most in the source first);
- Keras 3 training under MultiWorkerMirroredStrategy anyway (TF_USE_LEGACY_KERAS=0, or no tf-keras):
  its `Attempt to convert a value (PerReplica:...) with an unsupported type` from keras/src/trainers.

Anything else is 1 with `<script> line N: <Error>: <message>` after the traceback (raised inside
tf-keras by an aliased `import keras`: with a hint that a Keras 3 argument may be why). Standard library only.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sysconfig
import traceback
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from trainer.errors import EXIT_CONFIG, EXIT_FAILED
from trainer.script.keras3 import KERAS, TF_KERAS, WHY

REQUIREMENTS = "REQUIREMENTS=path/to/requirements.txt"
CANNOT_IMPORT = re.compile(r"cannot import name '([^']+)' from '([^']+)'")
LIBRARIES = tuple(
    str(Path(p).resolve()) + os.sep for p in {sysconfig.get_path(k) for k in ("stdlib", "purelib", "platlib")}
)
"""Frames under these are Python's or an installed package's, not the user's."""


@dataclass(frozen=True)
class Failure:
    code: int
    line: str
    traceback: bool = False
    """Whether the traceback helps (an unknown failure) or only buries the line (a known one)."""


def _chain(err: BaseException) -> Iterator[BaseException]:
    seen: set[int] = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__


def where(err: BaseException, script: str) -> str:
    """`train.py line 12`: the deepest frame of the user's own files in the traceback (not Python's or a
    package's), with the script's line that led there when that is another file's."""
    frames = traceback.extract_tb(err.__traceback__)
    path = str(Path(script).resolve())
    mine = [f for f in frames if str(Path(f.filename).resolve()) == path]
    own = [f for f in frames if not f.filename.startswith("<") and
           not str(Path(f.filename).resolve()).startswith(LIBRARIES)]  # fmt: skip
    at = [f"{Path(f.filename).name} line {f.lineno}" for f in (own[-1:] + mine[-1:])]
    if not at:
        return Path(script).name
    return at[0] if len(at) == 1 or at[0] == at[1] else f"{at[0]} (from {at[1]})"


def keras3_name(err: BaseException) -> str | None:
    """`keras.ops` for tf-keras' `module 'tf_keras' has no attribute 'ops'` (and its import forms)."""
    if isinstance(err, ModuleNotFoundError) and err.name and err.name.startswith(KERAS + "."):
        return err.name
    if isinstance(err, AttributeError) and getattr(err, "obj", None) is not None:
        module = getattr(err.obj, "__name__", "")
        if type(err.obj).__name__ == "module" and module.split(".")[0] == TF_KERAS:
            return f"{KERAS}{module[len(TF_KERAS) :]}.{err.name}"
    if type(err) is ImportError and (m := CANNOT_IMPORT.search(str(err))):
        name, module = m.groups()
        if module.split(".")[0] == TF_KERAS:
            return f"{KERAS}{module[len(TF_KERAS) :]}.{name}"
    return None


def keras3_training(err: BaseException) -> bool:
    """Keras 3's fit under MWMS (keras-team/keras#20585), raised from Keras 3's own trainer."""
    text = str(err)
    if not (isinstance(err, ValueError) and "PerReplica" in text and "unsupported type" in text):
        return False
    return any(
        f"{os.sep}keras{os.sep}src{os.sep}" in f.filename for f in traceback.extract_tb(err.__traceback__)
    )


def explain(
    err: BaseException,
    script: str,
    *,
    aliased: bool,
    env: Mapping[str, str] = os.environ,
    find_spec: Callable[[str], object] = importlib.util.find_spec,
) -> Failure:
    """The one line for a script's exception (`aliased`: its `import keras` gave tf-keras)."""
    name = Path(script).name
    for e in _chain(err):
        if aliased and (api := keras3_name(e)):
            return Failure(
                EXIT_CONFIG,
                f"{where(e, script)} uses {api}, which only Keras 3 has: {WHY}, so `import keras` trains "
                "with tf-keras here, which lacks it; write that part with tf-keras or TensorFlow (tf.*) "
                "instead (docs/script.md, Keras 3 scripts)",
            )
        if keras3_training(e):
            legacy = env.get("TF_USE_LEGACY_KERAS", "")
            fix = (
                f"leave TF_USE_LEGACY_KERAS unset (it is {legacy!r}; the wrapper sets 1, and then "
                "`import keras` trains with tf-keras)"
                if legacy not in ("1", "true", "True")
                else "write `import tf_keras as keras` (or `from tensorflow import keras`)"
                if find_spec(TF_KERAS) is not None
                else "the image lacks tf-keras: add tf-keras==2.21.0 with " + REQUIREMENTS
            )
            return Failure(
                EXIT_CONFIG, f"{name} trains with Keras 3: {WHY}: {fix} (docs/script.md, Keras 3 scripts)"
            )
        if isinstance(e, ModuleNotFoundError) and e.name:
            top = e.name.split(".")[0]
            if top != e.name and find_spec(top) is not None:
                lacks = f"which the image's {top} does not have"
                fix = "check the name against the image's version of it (docs/script.md)"
            else:
                lacks, fix = "which the trainer image lacks", f"add it with {REQUIREMENTS} (docs/script.md)"
            return Failure(EXIT_CONFIG, f"{where(e, script)} imports {e.name}, {lacks}: {fix}")
    first = (str(err).splitlines() or [""])[0][:200]
    hint = ""
    if aliased and any(
        f"{os.sep}{TF_KERAS}{os.sep}" in f.filename for f in traceback.extract_tb(err.__traceback__)
    ):
        hint = " (`import keras` is tf-keras here: a Keras 3 argument? docs/script.md, Keras 3 scripts)"
    return Failure(EXIT_FAILED, f"{where(err, script)}: {type(err).__name__}: {first}{hint}", traceback=True)
