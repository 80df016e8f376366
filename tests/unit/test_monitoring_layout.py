"""monitoring/ reads by concern: at most 10 modules and folders at its top (the commands people type,
and one folder per concern), and every folder's README names the modules that exist: the top
README every module by its path (`rules/recording.py`), each folder's README its own."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MONITORING = ROOT / "monitoring"
MAX_TOP = 10
PACKAGES = sorted(p.parent.name for p in MONITORING.glob("*/__init__.py"))


def top_level() -> list[str]:
    """monitoring/'s modules and packages; config/ and docs/ are mounted files and pictures."""
    modules = [p.name for p in MONITORING.glob("*.py") if p.name != "__init__.py"]
    return sorted(modules + [f"{name}/" for name in PACKAGES])


def test_at_most_ten_modules_and_folders_at_the_top():
    top = top_level()
    assert len(top) <= MAX_TOP, f"monitoring/ has {len(top)} modules and folders at its top: {top}"


def test_every_folder_is_a_package_or_not_python():
    stray = [
        p.relative_to(ROOT).as_posix()
        for p in MONITORING.rglob("*.py")
        if p.parent != MONITORING and not (p.parent / "__init__.py").exists()
    ]
    assert not stray, f"Python files outside a package: {stray}"


def _listed(readme: Path) -> set[str]:
    """Every `name.py` a README names, other than another folder's (`../x.py`, `tests/...`)."""
    names = set(re.findall(r"`([\w/]+\.py)`", readme.read_text()))
    return {n for n in names if not n.startswith(("tests/", "contract/", "bench/", "trainer/"))}


@pytest.mark.parametrize("folder", ["", *PACKAGES], ids=lambda f: f or "top")
def test_readme_names_the_modules_that_exist(folder):
    base = MONITORING / folder
    readme = base / "README.md"
    assert readme.exists(), f"{readme.relative_to(ROOT)} is missing"
    paths = base.rglob("*.py") if folder == "" else base.glob("*.py")
    every = {p.relative_to(base).as_posix() for p in paths}
    modules = {name for name in every if not name.endswith("__init__.py")}
    listed = _listed(readme)
    assert not modules - listed, f"{readme.relative_to(ROOT)} does not name {sorted(modules - listed)}"
    assert listed <= every, (
        f"{readme.relative_to(ROOT)} names modules that do not exist: {sorted(listed - every)}"
    )


ORDER = ("verdicts", "rules", "prom", "dashboards")
"""monitoring/'s folders, bottom first: each imports only those before it; the commands at the top
import any of them."""
UPWARD = {("monitoring.rules.promtests", "monitoring.status")}
"""The one import that goes up, lazily: the promtool tests evaluate the queries `make status` sends."""


TOP = ("tune",)
"""Above the commands: the tune reads a run's verdict (diagnose) and its runs before it tries a fix."""


def _level(module: str) -> int:
    part = module.split(".")[1] if module.count(".") else ""
    if part in TOP:
        return len(ORDER) + 1
    return ORDER.index(part) if part in ORDER else len(ORDER)


def test_folders_import_only_the_folders_below():
    from tests.unit.test_import_graph import graph

    up = sorted(
        (src, dst)
        for src, dsts in graph().items()
        if src.startswith("monitoring.")
        for dst in dsts
        if dst.startswith("monitoring.") and _level(dst) > _level(src) and (src, dst) not in UPWARD
    )
    assert not up, f"imports up monitoring's folders {' < '.join(ORDER)} < the commands: {up}"
    assert set(ORDER + TOP) == set(PACKAGES), f"place every folder in ORDER or TOP: {PACKAGES}"
