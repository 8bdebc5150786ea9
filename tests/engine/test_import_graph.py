"""The import graph of engine/ and app/: no cycles, and imports run one way (pages → features → runner → store).

Function-level (lazy) imports count like module-level ones: a cycle hidden inside a function is still a cycle a reader
has to hold in their head.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]

# engine/ by layer, lowest first: a module may import its own layer and those below it, never one above.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("store", ("engine.store",)),
    ("runner", ("engine.runner",)),
    ("measurement and building blocks", ("engine.measure", "engine.workloads", "engine.modes", "engine.kernels",
                                         "engine.native")),
    ("features", ("engine.bench", "engine.housing", "engine.profiling", "engine.ir", "engine.levels", "engine.llm",
                  "engine.compare", "engine.explain")),
    ("cli", ("engine.cli", "engine.__main__")),
    ("app", ("app",)),
]


def layer_of(module: str) -> int | None:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    return None


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


def test_every_engine_folder_has_a_layer() -> None:
    engine = REPO / "engine"
    folders = sorted(f"engine.{p.name}" for p in engine.iterdir() if (p / "__init__.py").exists())
    assert [f for f in folders if layer_of(f) is None] == []
    assert sorted(p.name for p in engine.glob("*.py")) == ["__init__.py", "__main__.py"]


def test_the_layer_detector_finds_a_planted_upward_import() -> None:
    graph = {"engine.store.db": {"engine.runner.jobs"}, "engine.runner.jobs": {"engine.store.db"}}
    assert upward_imports(graph) == ["engine.store.db (store) imports engine.runner.jobs (runner)"]


def upward_imports(graph: dict[str, set[str]]) -> list[str]:
    found = []
    for module, imported in sorted(graph.items()):
        mine = layer_of(module)
        for other in sorted(imported):
            theirs = layer_of(other)
            if mine is not None and theirs is not None and theirs > mine:
                found.append(f"{module} ({LAYERS[mine][0]}) imports {other} ({LAYERS[theirs][0]})")
    return found


def test_imports_run_one_way_folder_by_folder() -> None:
    assert upward_imports(import_graph(REPO)) == []


def test_the_engine_never_imports_streamlit_or_the_app() -> None:
    for path in (REPO / "engine").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert not name.startswith(("streamlit", "app")), f"{path.relative_to(REPO)} imports {name}"
