"""The import graph of engine/ and app/: no cycles, and imports run one way (pages → features → runner → store).

Function-level (lazy) imports count like module-level ones: a cycle hidden inside a function is still a cycle a reader
has to hold in their head.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

# The runner and what lies below it: none of these may import a feature (bench, profiling, ir, levels, llm, …).
RUNNER = ("engine.store", "engine.jobs", "engine.worker", "engine.device_lock", "engine.forkserver")
FEATURES = ("engine.bench", "engine.train", "engine.profiling", "engine.ir", "engine.levels", "engine.llm",
            "engine.plan", "engine.explain", "engine.cli", "engine.ceilings")


def module_name(root: Path, path: Path) -> str:
    name = ".".join(path.relative_to(root).with_suffix("").parts)
    return name.removesuffix(".__init__")


def import_graph(root: Path, packages: tuple[str, ...] = ("engine", "app")) -> dict[str, set[str]]:
    """{module: the project's modules it imports anywhere in its body}; `from a.b import c` imports a.b and, where
    it is a module, a.b.c."""
    files = {module_name(root, p): p for pkg in packages for p in (root / pkg).rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = name.split(".")
                    keep = len(parts) - node.level + (1 if is_package else 0)
                    base = ".".join(parts[:keep] + ([node.module] if node.module else []))
                found.add(base)
                found.update(f"{base}.{alias.name}" for alias in node.names)
        graph[name] = {m for m in found if m in files and m != name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for start in graph:
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def test_the_detector_finds_a_planted_cycle_even_inside_a_function(tmp_path: Path) -> None:
    pkg = tmp_path / "engine"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("from engine import b\n")
    (pkg / "b.py").write_text("def f():\n    from engine.c import g\n")
    (pkg / "c.py").write_text("from .a import x\n")
    (pkg / "d.py").write_text("import engine.a\n")
    assert cycles(import_graph(tmp_path, ("engine",))) == [["engine.a", "engine.b", "engine.c"]]


def test_engine_and_app_have_no_import_cycle() -> None:
    assert cycles(import_graph(REPO)) == []


@pytest.mark.parametrize("lower", RUNNER)
def test_the_runner_and_the_store_import_no_feature(lower: str) -> None:
    graph = import_graph(REPO)
    upward = sorted(m for m in graph[lower] if m.startswith(FEATURES))
    assert upward == [], f"{lower} imports {upward}"


def test_the_engine_never_imports_streamlit_or_the_app() -> None:
    for path in (REPO / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("streamlit", "app")), f"{path.relative_to(REPO)} imports {name}"
