"""pyproject.toml declares what the code imports, requirements.in (the host lock's input) says the
same, and `pip install --no-deps .` gives an importable trainer, in a fresh venv, from any directory."""

from __future__ import annotations

import ast
import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
IN_CONTAINER, HOST = ["contract", "trainer"], ["bench", "compose", "monitoring"]


def _name(requirement: str) -> str:
    """A requirement's distribution name, normalised (PEP 503)."""
    return re.sub(r"[-_.]+", "-", re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)[1]).lower()


def _requirements_in() -> list[str]:
    lines = (ROOT / "requirements.in").read_text().splitlines()
    return [ln.strip() for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _declared(*extras: str) -> set[str]:
    reqs = PROJECT["dependencies"] + [r for e in extras for r in PROJECT["optional-dependencies"][e]]
    return {_name(r) for r in reqs}


def _third_party_imports(folders: list[str], skip: str = "") -> set[str]:
    """Top-level modules imported by the Python files under `folders` that are not the standard
    library or this project (lazy imports inside functions count)."""
    local = {"contract", "trainer", "bench", "compose", "monitoring", "tests"}
    found = set()
    for folder in folders:
        for path in (ROOT / folder).rglob("*.py"):
            if skip and path.is_relative_to(ROOT / skip):
                continue
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Import):
                    found |= {a.name.split(".")[0] for a in node.names}
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    found.add(node.module.split(".")[0])
    return found - local - set(sys.stdlib_module_names)


def _distributions(modules: set[str]) -> set[str]:
    dists = importlib.metadata.packages_distributions()
    missing = sorted(m for m in modules if m not in dists)
    assert not missing, f"imported but installed by no distribution here: {missing}"
    return {_name(d) for m in modules for d in dists[m]}


def test_requirements_in_is_pyproject_dependencies_and_extras():
    in_file = sorted(_requirements_in())
    declared = sorted(
        PROJECT["dependencies"] + [r for e in PROJECT["optional-dependencies"].values() for r in e]
    )
    assert in_file == declared, "requirements.in and pyproject.toml must list the same requirements"


def test_ruff_is_pinned():
    assert any(re.fullmatch(r"ruff==[\d.]+", r) for r in _requirements_in())


def test_in_container_trainer_imports_only_its_dependencies():
    used = _distributions(_third_party_imports(IN_CONTAINER))
    assert used <= _declared(), f"undeclared: {sorted(used - _declared())}"


def test_host_side_code_imports_only_dependencies_and_the_host_extra():
    used = _distributions(_third_party_imports(HOST))
    assert used <= _declared("host"), f"undeclared: {sorted(used - _declared('host'))}"


ALIASED = {"keras": "tf_keras"}
"""A user's `import keras` (tests/scripts/fit_keras3.py) imports tf-keras under the SCRIPT= wrapper
(trainer/script/keras3.py); Keras 3 itself comes only with tensorflow-cpu."""


def test_tests_import_only_declared_distributions():
    used = _distributions({ALIASED.get(m, m) for m in _third_party_imports(["tests"])})
    allowed = _declared(*PROJECT["optional-dependencies"])
    assert used <= allowed, f"undeclared: {sorted(used - allowed)}"


def test_the_cpu_image_installs_every_dependency():
    lock = (ROOT / "images" / "requirements-cpu.lock").read_text()
    locked = {_name(ln) for ln in lock.splitlines() if re.match(r"[A-Za-z0-9]", ln)}
    assert _declared() <= locked, f"missing from the image's lock: {sorted(_declared() - locked)}"


def test_pip_install_no_deps_gives_an_importable_trainer(tmp_path):
    """A wheel built from a copy (pip would leave build/ and egg-info in the tree), offline, installed
    into a fresh venv and run from elsewhere, so only the installed copy can be imported."""
    src = tmp_path / "src"
    for package in ("contract", "trainer", "bench"):
        shutil.copytree(ROOT / package, src / package, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(ROOT / "pyproject.toml", src)
    offline = ["--no-deps", "--no-index", "-q"]
    wheel = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            *offline,
            "--no-build-isolation",
            str(src),
            "-w",
            str(tmp_path / "dist"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert wheel.returncode == 0, wheel.stderr[-2000:]
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    install = subprocess.run(
        [py, "-m", "pip", "install", *offline, *map(str, (tmp_path / "dist").glob("*.whl"))],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert install.returncode == 0, install.stderr[-2000:]
    code = (
        "import sys, importlib.metadata as md, trainer, bench.launch; "
        "from trainer.__main__ import main; "
        "print(trainer.__file__); print(sorted(md.requires('mwms-stack'))); "
        "sys.exit(main(['--task', 'nope'], {}))"
    )
    run = subprocess.run([py, "-c", code], capture_output=True, text=True, timeout=60, cwd=tmp_path)
    assert run.returncode == 2, run.stderr  # the entry point ran: a bad --task is a configuration error
    where, requires = run.stdout.splitlines()
    assert where.startswith(str(venv)), where
    assert all(d in requires for d in PROJECT["dependencies"]), requires
