"""Who imports whom, read from the source with ast (nothing is imported): no module imports one that
imports it back, and the top-level folders form layers that import only downwards:

    contract/    the shared, stdlib-only contract (in the image and on the host)
    trainer/     runs in the container (its image holds contract/ and trainer/ only)
    compose/     host: the deployment description, its emitters, the lifecycle and the engine adapter
    monitoring/  host: rules, dashboards and the commands people type (status, diagnose, compare, tune),
                 which read the job through compose's engine adapter (its config/ is mounted, not imported)
    bench/       host: the local launcher and the benchmarks

Inside trainer/ the same holds one level down: its subfolders (trainer/train/, trainer/state/, ...) and
top-level modules (trainer/config.py, ...) form no cycle either, so a folder below never imports the
folder that uses it (STYLE.md 21; trainer/README.md gives their order).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
LAYERS = ("contract", "trainer", "compose", "monitoring", "bench")
PACKAGES = LAYERS


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(path: Path, modules: set[str]) -> set[str]:
    """Project modules `path` imports (at any depth: lazy imports in functions count too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module] + [f"{node.module}.{a.name}" for a in node.names]
        else:
            continue
        found |= {n for n in names if n in modules}
    return found


def graph() -> dict[str, set[str]]:
    paths = {_module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}
    modules = set(paths)
    return {name: _imports(path, modules) - {name} for name, path in paths.items()}


def _cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One import cycle as a path of module names, or None (depth-first, colours)."""
    state: dict[str, str] = {}

    def visit(node: str, path: list[str]) -> list[str] | None:
        state[node] = "open"
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == "open":
                return path[path.index(nxt) :] + [node, nxt] if nxt in path else [node, nxt]
            if nxt not in state and (found := visit(nxt, path + [node])):
                return found
        state[node] = "done"
        return None

    return next((c for n in sorted(edges) if n not in state and (c := visit(n, [])) is not None), None)


def _is_under(module: str, prefix: str) -> bool:
    return module == prefix or module.startswith(prefix + ".")


def test_the_graph_sees_known_edges():
    edges = graph()
    assert "trainer.host" in edges["bench.launch"]
    assert "trainer.config" in edges["trainer.__main__"]


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_one_that_imports_it_back():
    assert _cycle(graph()) is None, f"import cycle: {' -> '.join(_cycle(graph()))}"


def folder(module: str, package: str = "trainer") -> str | None:
    """The subfolder or top-level module of `package` that `module` belongs to (None: outside it)."""
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == package and len(parts) > 1 else None


def folder_graph(edges: dict[str, set[str]], package: str = "trainer") -> dict[str, set[str]]:
    """`edges` folded onto `package`'s subfolders: a -> b if any module under a imports one under b."""
    folded: dict[str, set[str]] = {}
    for src, dsts in edges.items():
        if (a := folder(src, package)) is not None:
            folded.setdefault(a, set()).update(b for d in dsts if (b := folder(d, package)) not in (None, a))
    return folded


def test_the_folder_graph_folds_modules_onto_subfolders():
    edges = {"trainer.a.x": {"trainer.b.y", "contract"}, "trainer.b.z": {"trainer.a.w"}, "trainer.c": set()}
    assert _cycle(edges) is None, "no module cycle here"
    assert folder_graph(edges) == {"trainer.a": {"trainer.b"}, "trainer.b": {"trainer.a"}, "trainer.c": set()}
    assert _cycle(folder_graph(edges)) == ["trainer.a", "trainer.b", "trainer.a"], "but a folder cycle"
    real = folder_graph(graph())
    assert "trainer.train" in real["trainer.assembly"] and "trainer.assembly" in real["trainer.run"]


def test_trainer_subfolders_import_one_way():
    folders = folder_graph(graph())
    cycle = _cycle(folders)
    assert cycle is None, f"trainer/'s subfolders import each other in a cycle: {' -> '.join(cycle)}"


def _layer(module: str) -> int:
    return LAYERS.index(module.split(".")[0])


def test_top_level_folders_import_only_downwards():
    up = sorted((src, dst) for src, dsts in graph().items() for dst in dsts if _layer(dst) > _layer(src))
    assert not up, f"imports up the layers {' < '.join(LAYERS)}: {up}"


def test_contract_is_stdlib_only():
    for path in (ROOT / "contract").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            third = [n for n in names if n.split(".")[0] not in sys.stdlib_module_names | {"contract"}]
            assert not third, f"{path.relative_to(ROOT)} imports {third}: the contract is stdlib-only"


HOST = ("monitoring", "compose", "bench")
SEAMS = {"trainer", "trainer.host"}
"""What host code may import of the trainer: the package (it sets TF_USE_LEGACY_KERAS) and its seam."""


def test_host_code_reaches_the_trainer_only_through_its_seam():
    reach = sorted(
        (src, dst)
        for src, dsts in graph().items()
        if src.split(".")[0] in HOST
        for dst in dsts
        if _is_under(dst, "trainer") and dst not in SEAMS
    )
    assert not reach, f"host code imports trainer internals, not trainer/host.py: {reach}"


def test_the_seam_names_resolve():
    import trainer.host as host

    missing = [name for name in host.__all__ if name not in host.IN_PROCESS and not hasattr(host, name)]
    assert not missing, f"trainer/host.py lists names it does not define: {missing}"
    assert all(name in host.__all__ for name in host.IN_PROCESS)


def test_the_light_seam_does_not_load_tensorflow():
    import subprocess

    code = (
        "import sys, trainer.host; assert 'tensorflow' not in sys.modules, 'trainer.host loaded TensorFlow'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60, cwd=ROOT)
