"""The trainer reads top-down: no function in trainer/ takes more than 5 parameters (self and cls
not counted, checked on the source with ast), and its READMEs list the modules that exist."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MAX_PARAMETERS = 5


def _parameters(node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda) -> list[str]:
    a = node.args
    names = [x.arg for x in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    names += [x.arg for x in (a.vararg, a.kwarg) if x is not None]
    return [n for n in names if n not in ("self", "cls")]


def too_many(source: str) -> list[tuple[str, int]]:
    """(function name, parameter count) of every function or lambda over the limit."""
    return [
        (getattr(node, "name", "<lambda>"), len(_parameters(node)))
        for node in ast.walk(ast.parse(source))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
        and len(_parameters(node)) > MAX_PARAMETERS
    ]


def test_counter_sees_keyword_only_and_star_args():
    assert too_many("def f(a, b, *, c, d, e, f): pass") == [("f", 6)]
    assert too_many("def g(self, a, *args, b, c, **kw): pass") == []
    assert too_many("h = lambda a, b, c, d, e, f: a") == [("<lambda>", 6)]


def test_no_function_in_trainer_takes_more_than_five_parameters():
    found = {
        f"{path.relative_to(ROOT)}:{name}": count
        for path in sorted((ROOT / "trainer").rglob("*.py"))
        for name, count in too_many(path.read_text())
    }
    assert found == {}, f"more than {MAX_PARAMETERS} parameters: {found}"


def _listed(readme: Path) -> set[str]:
    """Every `name.py` a README names."""
    return set(re.findall(r"`([\w/]+\.py)`", readme.read_text()))


@pytest.mark.parametrize("folder", ["trainer", "trainer/bench", "bench"])
def test_readme_lists_the_modules_that_exist(folder):
    """trainer/README.md lists every module of its subpackages by path (`train/step.py`), the others
    their own folder's; observe/ is described as one part, its modules in docs/script.md."""
    base = ROOT / folder
    readme = base / "README.md"
    nested = folder == "trainer"
    paths = base.rglob("*.py") if nested else base.glob("*.py")
    modules = {
        p.relative_to(base).as_posix()
        for p in paths
        if p.name != "__init__.py" and not (nested and p.parts[-2] in ("observe", "bench"))
    }
    listed = {name for name in _listed(readme) if nested or "/" not in name}
    listed = {name for name in listed if not name.startswith(("../", "bench/", "tests/"))}
    unlisted = modules - listed
    assert not unlisted, f"{readme} does not list {sorted(unlisted)}"
    assert listed <= modules, f"{readme} lists modules that do not exist: {sorted(listed - modules)}"
