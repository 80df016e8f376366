"""Who imports whom, read from the source with ast (nothing is imported): no module imports one that
imports it back, and the in-container trainer (trainer/ outside trainer/host/) reaches neither the
host-side tools nor compose/ or monitoring/, which are not in its image."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("trainer", "compose", "monitoring")
HOST_ONLY = ("trainer.host", "compose", "monitoring")


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
    assert "trainer.cluster" in edges["trainer.host.launch"]
    assert "trainer.config" in edges["trainer.__main__"]


def test_cycle_finder_finds_a_cycle():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_no_module_imports_one_that_imports_it_back():
    assert _cycle(graph()) is None, f"import cycle: {' -> '.join(_cycle(graph()))}"


def test_container_trainer_imports_no_host_side_module():
    bad = sorted(
        (src, dst)
        for src, dsts in graph().items()
        for dst in dsts
        if _is_under(src, "trainer")
        and not _is_under(src, "trainer.host")
        and any(_is_under(dst, h) for h in HOST_ONLY)
    )
    assert not bad, f"in-container modules importing host-side ones: {bad}"
