"""The package's import graph, function-level imports included, has no cycles.

The layer contracts in ``pyproject.toml`` (checked by ``make lint``) catch cycles between sibling
modules and across layers; this test also catches one that runs through a package's
``__init__`` (a child importing its parent), and it needs nothing beyond the standard library.
"""

from __future__ import annotations

import ast
from pathlib import Path

import msm_mem

ROOT = Path(msm_mem.__file__).parent

# cycles that exist today and are being removed where they live; none may be added
KNOWN_CYCLES: set[frozenset[str]] = set()


def _modules() -> dict[str, Path]:
    out = {}
    for path in sorted(ROOT.rglob("*.py")):
        parts = ("msm_mem", *path.relative_to(ROOT).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def _imports(name: str, path: Path, modules: dict[str, Path]) -> set[str]:
    """The package modules that ``name`` imports anywhere in its body."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()

    def add(target: str) -> None:
        while target and target not in modules:  # `from x import name`: name is not a module
            target = target.rpartition(".")[0]
        if target:
            found.add(target)

    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                add(alias.name)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            for alias in node.names:
                add(f"{base}.{alias.name}")
    found.discard(name)
    return found


def _cycles(graph: dict[str, set[str]]) -> set[frozenset[str]]:
    """The strongly connected components with more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    out: set[frozenset[str]] = set()
    for start in sorted(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, edges = work[-1]
            nxt = next(edges, None)
            if nxt is not None:
                if nxt not in index:
                    index[nxt] = low[nxt] = len(index)
                    stack.append(nxt)
                    on_stack.add(nxt)
                    work.append((nxt, iter(sorted(graph[nxt]))))
                elif nxt in on_stack:
                    low[node] = min(low[node], index[nxt])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = set()
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.add(member)
                    if member == node:
                        break
                if len(component) > 1:
                    out.add(frozenset(component))
    return out


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(name, path, modules) for name, path in modules.items()}


def test_the_graph_sees_relative_and_function_level_imports() -> None:
    """Relative imports resolve to package modules, and imports inside functions count."""
    graph = _graph()
    assert "msm_mem._errors" in graph["msm_mem._records"]
    # the backbone plugins are imported lazily, inside a function
    assert "msm_mem.plugins.backbones.nonparametric" in graph["msm_mem.plugins.backbones"]


def test_a_cycle_through_a_package_init_is_found() -> None:
    """A child importing its parent package while the parent imports the child is a cycle."""
    graph = {"p": {"p.a"}, "p.a": {"p"}, "q": set()}
    assert _cycles(graph) == {frozenset({"p", "p.a"})}


def test_no_import_cycles() -> None:
    """No module reaches itself through imports, at module or function level."""
    assert _cycles(_graph()) == KNOWN_CYCLES
