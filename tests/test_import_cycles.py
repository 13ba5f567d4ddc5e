"""No import cycle between Shoal's modules, imports inside functions included.

import-linter sees an import inside a function like any other, but its contracts only
forbid what they name; a cycle hidden behind a function-level import (one module reading
what the other writes) is found here. Every `import` and `from ... import` of every module
under the five packages is an edge; a strongly connected component of more than one module
is a cycle.
"""

from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("serving", "functions", "autoscaler", "deploy", "loadtests")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def modules() -> dict[str, Path]:
    return {module_name(p): p for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def imports_of(name: str, path: Path, known: set[str]) -> set[str]:
    """The project modules `name` imports anywhere in its body. `from pkg import x` is an edge to
    `pkg.x` when that is a module, else to `pkg`; relative imports are resolved against `name`."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out.update(alias.name for alias in node.names if alias.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(anchor + ([base] if base else []))
            for alias in node.names:
                full = f"{base}.{alias.name}"
                if full in known:
                    out.add(full)
                elif base in known:
                    out.add(base)
    out.discard(name)
    return out


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_cycles_finds_a_cycle_hidden_in_a_function():
    # a -> b at the top, b -> a inside a function: one component {a, b}; c alone is none
    graph = {"a": {"b"}, "b": {"a"}, "c": {"a"}}
    assert cycles(graph) == [["a", "b"]]


def test_imports_of_reads_function_level_and_relative_imports(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("def f():\n    from deploy.cluster import plane\n    from . import sibling\n")
    known = {"deploy.cluster", "deploy.cluster.plane", "deploy.cli.sibling", "deploy.cli.m"}
    assert imports_of("deploy.cli.m", path, known) == {"deploy.cluster.plane", "deploy.cli.sibling"}


def test_no_import_cycle_between_modules():
    found = modules()
    known = set(found)
    graph = {name: imports_of(name, path, known) for name, path in found.items()}
    assert len(graph) > 80, f"only {len(graph)} modules found under {PACKAGES}"
    assert cycles(graph) == [], "import cycles (imports inside functions count):\n" + \
        "\n".join(" <-> ".join(c) for c in cycles(graph))


