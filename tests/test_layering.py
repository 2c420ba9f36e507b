"""Layering of python/bnfold: no import cycles (module-level and function-level imports
alike; only `if TYPE_CHECKING:` blocks, which never run, are left out), and the fold
patterns do not reach into the quantization subpackage."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "python" / "bnfold"


def modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        found[".".join(parts)] = path
    return found


def _runs(tree: ast.AST) -> list[ast.AST]:
    """Every node that can run: `if TYPE_CHECKING:` bodies are left out."""
    found: list[ast.AST] = []
    stack = [tree]
    while stack:
        node = stack.pop()
        found.append(node)
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                stack.extend(child.orelse)
                continue
            stack.append(child)
    return found


def imports(name: str, path: Path, known: set[str]) -> set[str]:
    """The package's modules `name` imports when it runs (a submodule brings its parent
    subpackages; the top-level package `bnfold` itself is left out: every module is in it)."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    targets: set[str] = set()
    for node in _runs(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            targets |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                head = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(head + ([node.module] if node.module else []))
            targets.add(base)
            targets |= {f"{base}.{a.name}" for a in node.names}
    found: set[str] = set()
    for target in targets:
        while target and target != "bnfold":
            if target in known:
                found.add(target)
            target = target.rpartition(".")[0]
    return found - {name}


def graph() -> dict[str, set[str]]:
    found = modules()
    return {name: imports(name, path, set(found)) for name, path in found.items()}


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on.add(v)
        for w in sorted(edges[v]):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(edges):
        if v not in index:
            visit(v)
    return found


def test_the_graph_sees_function_level_imports():
    edges = graph()
    assert "bnfold.passes" in edges["bnfold.pipeline"] or \
        "bnfold.overlay" in edges["bnfold.pipeline"], "function-level imports are edges"
    assert cycles({"a": {"b"}, "b": {"a"}, "c": set()}) == [["a", "b"]]


def test_no_import_cycles():
    found = cycles(graph())
    assert not found, "import cycles inside bnfold:\n" + "\n".join(" <-> ".join(c) for c in found)


def test_fold_patterns_do_not_import_quantization():
    edges = graph()
    for name in edges:
        if name.startswith("bnfold.patterns"):
            assert not {e for e in edges[name] if e.startswith("bnfold.quant")}, name
