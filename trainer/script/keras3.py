"""`import keras` in a user's script trains with tf-keras, said in one line; Keras 3's own APIs are refused.

keras.io teaches `import keras`, which is Keras 3, and Keras 3 cannot train under
MultiWorkerMirroredStrategy: `model.fit` ends in `ValueError: Attempt to convert a value
(PerReplica:...) with an unsupported type` from keras/src/trainers (keras-team/keras#20585).
TF_USE_LEGACY_KERAS=1 only changes what `tf.keras` is. So the wrapper puts an import alias first on
`sys.meta_path` before the script runs: `keras` and every `keras.X` import tf-keras' module of the same
name (`tf_keras`, `tf_keras.X`), which is what `import tf_keras as keras` gives. The two share the API
an ordinary fit script uses (Sequential, Model, Input, layers, losses, optimizers, metrics, callbacks,
compile, fit, save). What only Keras 3 has (keras.ops, keras.config, keras.random, ...) would fail later
with an AttributeError, after the cluster formed: `uses` finds such names in the script's source
before anything runs, against tf-keras' public API read from its own generated `__init__.py` files
(nothing imported), and the wrapper refuses the script in one line naming the fix. A use the source
does not show (another module of the script's, a name built at run time) is explained in one line
when it fails (trainer/script/failure.py). Standard library only; nothing here imports TensorFlow.
"""

from __future__ import annotations

import ast
import importlib.abc
import importlib.machinery
import importlib.util
import logging
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger("trainer.script.keras3")
KERAS, TF_KERAS = "keras", "tf_keras"
ISSUE = "keras-team/keras#20585"
WHY = f"Keras 3 cannot train under MultiWorkerMirroredStrategy ({ISSUE})"


def aliased(name: str) -> bool:
    return name == KERAS or name.startswith(KERAS + ".")


class Api:
    """tf-keras' public names, read from the generated `__init__.py` of each package under `root`."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._names: dict[tuple[str, ...], set[str]] = {}

    @classmethod
    def installed(cls) -> Api | None:
        spec = importlib.util.find_spec(TF_KERAS)
        if spec is None or not spec.submodule_search_locations:
            return None
        return cls(Path(list(spec.submodule_search_locations)[0]))

    def names(self, package: tuple[str, ...]) -> set[str]:
        if package not in self._names:
            init = self.root.joinpath(*package, "__init__.py")
            found: set[str] = set()
            if init.is_file():
                for node in ast.parse(init.read_text(), str(init)).body:
                    if isinstance(node, (ast.Import, ast.ImportFrom)):
                        found |= {(a.asname or a.name).split(".")[0] for a in node.names}
                    elif isinstance(node, (ast.FunctionDef, ast.ClassDef)):
                        found.add(node.name)
                    elif isinstance(node, ast.Assign):
                        found |= {t.id for t in node.targets if isinstance(t, ast.Name)}
            self._names[package] = found
        return self._names[package]

    def is_package(self, package: tuple[str, ...]) -> bool:
        return self.root.joinpath(*package, "__init__.py").is_file()

    def missing(self, path: tuple[str, ...]) -> tuple[str, ...] | None:
        """The first prefix of `keras.<path>` that tf-keras lacks; None when tf-keras has it (as far as
        packages go: the attributes of a class or function are not checked)."""
        for i, name in enumerate(path):
            package = path[:i]
            if name not in self.names(package) and not self.is_package((*package, name)):
                return path[: i + 1]
            if not self.is_package((*package, name)):
                return None
        return None


@dataclass(frozen=True)
class Use:
    """A Keras 3 name the script uses that tf-keras lacks, where the source uses it first."""

    name: str
    line: int


def _chain(node: ast.AST) -> tuple[str, tuple[str, ...]] | None:
    """`a.b.c` as ("a", ("b", "c")); None for anything but a name and its attributes."""
    attrs: list[str] = []
    while isinstance(node, ast.Attribute):
        attrs.append(node.attr)
        node = node.value
    return (node.id, tuple(reversed(attrs))) if isinstance(node, ast.Name) else None


def _imports(tree: ast.AST) -> Iterator[tuple[ast.stmt, tuple[str, ...], str | None]]:
    """(statement, keras path it imports, the local name bound to it or None) for every keras import."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                if aliased(a.name):
                    path = tuple(a.name.split(".")[1:])
                    yield node, path, a.asname
                    if a.asname is None:  # `import keras.ops` binds `keras`
                        yield node, (), KERAS
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module and aliased(node.module):
            base = tuple(node.module.split(".")[1:])
            for a in node.names:
                if a.name != "*":
                    yield node, (*base, a.name), a.asname or a.name


def uses(source: str, api: Api, filename: str = "<script>") -> list[Use]:
    """Keras 3 names in `source` that tf-keras lacks, each once, in the order of the source."""
    tree = ast.parse(source, filename)
    bound: dict[str, tuple[str, ...]] = {}
    found: dict[str, int] = {}

    def check(path: tuple[str, ...], line: int) -> None:
        if (gap := api.missing(path)) is not None:
            name = ".".join((KERAS, *gap))
            found[name] = min(found.get(name, line), line)

    for node, path, local in _imports(tree):
        check(path, node.lineno)
        if local is not None:
            bound[local] = path
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and (chain := _chain(node)) and chain[0] in bound:
            check((*bound[chain[0]], *chain[1]), node.lineno)  # keras.ops.sum and keras.ops: keras.ops once
    return sorted((Use(n, line) for n, line in found.items()), key=lambda u: (u.line, u.name))


def imports_keras(source: str, filename: str = "<script>") -> bool:
    return any(True for _ in _imports(ast.parse(source, filename)))


INSTEAD = {
    **{
        f"keras.{c}": f"keras.{m}.{c}"
        for m, c in (
            ("layers", "Layer"),
            ("layers", "InputSpec"),
            ("losses", "Loss"),
            ("metrics", "Metric"),
            ("optimizers", "Optimizer"),
            ("regularizers", "Regularizer"),
            ("initializers", "Initializer"),
        )
    },  # fmt: skip
    "keras.ops": "tf.* ops",
    "keras.random": "tf.random",
    "keras.utils.PyDataset": "keras.utils.Sequence or tf.data",
    "keras.utils.clear_session": "keras.backend.clear_session",
}
"""What tf-keras (or TensorFlow) has for a few Keras 3 names the refusal names (the line says it)."""


def refusal(script: str, found: list[Use], shown: int = 3) -> str:
    """One line refusing `script` for the Keras 3 names it uses (the first `shown` named, with their lines)."""

    def named(u: Use) -> str:
        return f"{u.name} (line {u.line}" + (f"; tf-keras: {INSTEAD[u.name]})" if u.name in INSTEAD else ")")

    names = ", ".join(map(named, found[:shown]))
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return (
        f"{Path(script).name} uses {names}{more}, which only Keras 3 has: {WHY}, so `import keras` trains "
        "with tf-keras here, which lacks it; write that part with tf-keras or TensorFlow (tf.*) instead "
        "(docs/script.md, Keras 3 scripts)"
    )


class Alias(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """`keras` and `keras.X` import tf-keras' module of the same name (`name` and `to`: the test's own);
    the first import says so in one line."""

    def __init__(self, say: Callable[[str], None], name: str = KERAS, to: str = TF_KERAS) -> None:
        self._say, self._name, self._to = say, name, to
        self.used = False
        """Whether `import keras` came through here (and a later failure may be a Keras 3 API's)."""
        self._spec: dict[str, object] = {}

    def _target(self, fullname: str) -> str | None:
        if fullname == self._name or fullname.startswith(self._name + "."):
            return self._to + fullname[len(self._name) :]
        return None

    def find_spec(self, fullname, path=None, target=None):
        to = self._target(fullname)
        if to is None or importlib.util.find_spec(to) is None:
            return None  # `keras.ops` and the like: Python's own "No module named 'keras.ops'"
        return importlib.machinery.ModuleSpec(fullname, self)

    def create_module(self, spec):
        module = importlib.import_module(self._target(spec.name))
        self._spec[spec.name] = module.__spec__  # importlib sets the alias's spec on it: put back below
        if spec.name == self._name and not self.used:
            self.used = True
            self._say(
                f"keras: `import {self._name}` trains with tf-keras {getattr(module, '__version__', '')} here: "
                f"{WHY}; Keras 3's own APIs (keras.ops, keras.config, ...) are refused (docs/script.md, Keras 3 scripts)"
            )
        return module

    def exec_module(self, module) -> None:
        module.__spec__ = self._spec.pop(module.__spec__.name, module.__spec__)


def install(say: Callable[[str], None] = log.info, name: str = KERAS, to: str = TF_KERAS) -> Alias | None:
    """Put the alias first on sys.meta_path (None, and nothing done, without tf-keras or after `keras`
    was imported already: then a script's Keras 3 fails as Keras 3, explained by failure.py)."""
    if importlib.util.find_spec(to) is None or name in sys.modules:
        return None
    alias = Alias(say, name, to)
    sys.meta_path.insert(0, alias)
    return alias


def uninstall(alias: Alias | None) -> None:
    if alias in sys.meta_path:
        sys.meta_path.remove(alias)
