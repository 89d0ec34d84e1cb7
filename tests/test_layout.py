"""The package layout is an architecture: keep it one.

tokentop is layered. ``loadgen.model`` (snapshots, histograms, windows) is the shared vocabulary
and depends on nothing; the worker, the recorder, the fleet link and the probes speak that
vocabulary only; ``loadgen.run`` wires them together; ``loadgen.analysis`` reads what runs leave
behind; the console (``tui``) sits on top of everything. ``loadgen.sim`` is a separate program
(a fake inference server) and shares nothing with the rest.

Nothing at run time enforces that, and a deferred ``import`` inside a function breaks it as
surely as one at the top of a file. So these tests read every module under loadgen/, probes/,
tui/ and themes/ with ``ast`` (nothing is imported or executed), collect every import of ours —
top-level and deferred, ``import a.b``, ``from a import b``, relative ones resolved,
``from loadgen import model`` taken as an import of the subpackage — and fail on:

* an edge between packages that the ``ALLOWED`` table below does not permit (imports under
  ``if TYPE_CHECKING:`` count here: a type-only dependency is still a dependency);
* an import cycle between modules (deferred imports count, ``if TYPE_CHECKING:`` blocks do not,
  as they never run).

The package of a module is its first two dotted parts under ``loadgen`` (``loadgen.run``) and
its first part otherwise (``tui``). A package may always import itself.
"""

from __future__ import annotations

import ast
import itertools
from collections import deque
from pathlib import Path
from typing import NamedTuple

import pytest

# ----------------------------------------------------------------------------------------------
# The architecture: package -> the other packages of ours it may import.
# The root package ``loadgen`` holds only __version__, so any loadgen package may import it.

_BASE = frozenset({"loadgen", "loadgen.model"})  # the root package and the shared vocabulary
_LOADGEN = frozenset(
    {"loadgen", "loadgen.model", "loadgen.worker", "loadgen.run", "loadgen.record",
     "loadgen.analysis", "loadgen.fleet", "loadgen.sim", "loadgen.eval"}
)

ALLOWED: dict[str, frozenset[str]] = {
    "loadgen": frozenset(),
    "loadgen.model": frozenset({"loadgen"}),
    "loadgen.worker": _BASE,
    "loadgen.record": _BASE,
    "loadgen.fleet": _BASE,
    "probes": _BASE,
    "loadgen.sim": frozenset({"loadgen"}),
    "loadgen.run": _BASE
    | {"loadgen.worker", "loadgen.record", "loadgen.fleet", "probes", "loadgen.sim"},
    "loadgen.analysis": _BASE
    | {"loadgen.worker", "loadgen.run", "loadgen.record", "loadgen.fleet", "probes", "loadgen.sim"},
    # the evaluation battery: runs (sessions, sweeps) and their analysis, over the rest
    "loadgen.eval": _BASE
    | {"loadgen.worker", "loadgen.run", "loadgen.record", "loadgen.analysis", "probes",
       "loadgen.sim"},
    "tui": _LOADGEN | {"probes", "themes"},
    "themes": frozenset(),
}
# Note what is absent: nothing under loadgen/ or probes/ may import tui.

ROOT = Path(__file__).resolve().parents[1]
TOP_LEVEL = ("loadgen", "probes", "tui", "themes")


# ----------------------------------------------------------------------------------------------
# Reading the sources


class Edge(NamedTuple):
    path: str  # relative to the repository root
    line: int
    importer: str
    imported: str
    type_only: bool  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        return f"{self.path}:{self.line}  {self.importer} -> {self.imported}"


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def find_modules() -> dict[str, Path]:
    """Every module of ours, by dotted name (a package by the name of its __init__.py)."""
    modules = {}
    for top in TOP_LEVEL:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "__pycache__" not in path.parts:
                modules[module_name(path)] = path
    return modules


def is_ours(name: str) -> bool:
    return name.split(".")[0] in TOP_LEVEL


def _is_type_checking(test: ast.expr) -> bool:
    if isinstance(test, ast.Name):
        return test.id == "TYPE_CHECKING"
    return isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"


def _absolute_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from ... import` names, with a relative one resolved against `module`."""
    if not node.level:
        return node.module or ""
    package = module if is_package else module.rpartition(".")[0]
    parts = package.split(".")
    if node.level - 1 >= len(parts):
        raise ValueError(f"{module}: relative import beyond the top-level package")
    base = ".".join(parts[: len(parts) - (node.level - 1)])
    return f"{base}.{node.module}" if node.module else base


class _ImportCollector(ast.NodeVisitor):
    """Collects the imports of one module, wherever they sit in it."""

    def __init__(self, module: str, path: Path, known: set[str]) -> None:
        self.module = module
        self.path = path.relative_to(ROOT).as_posix()
        self.is_package = path.name == "__init__.py"
        self.known = known
        self.type_only = False
        self.edges: list[Edge] = []

    def _add(self, node: ast.stmt, imported: str) -> None:
        if is_ours(imported):
            self.edges.append(Edge(self.path, node.lineno, self.module, imported, self.type_only))

    def visit_If(self, node: ast.If) -> None:
        if not _is_type_checking(node.test):
            self.generic_visit(node)
            return
        outer, self.type_only = self.type_only, True
        for stmt in node.body:
            self.visit(stmt)
        self.type_only = outer
        for stmt in node.orelse:
            self.visit(stmt)

    def visit_Import(self, node: ast.Import) -> None:
        for alias in node.names:
            self._add(node, alias.name)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        base = _absolute_base(node, self.module, self.is_package)
        for alias in node.names:
            # `from loadgen import model` imports the subpackage; `from loadgen import
            # __version__` imports the package itself.
            submodule = f"{base}.{alias.name}"
            self._add(node, submodule if submodule in self.known else base)


def collect_edges(modules: dict[str, Path]) -> list[Edge]:
    known = set(modules)
    edges = []
    for name, path in modules.items():
        collector = _ImportCollector(name, path, known)
        collector.visit(ast.parse(path.read_text(encoding="utf-8"), filename=str(path)))
        edges.extend(collector.edges)
    return list(dict.fromkeys(edges))  # `from a import b, c` is one edge when b, c are names


# ----------------------------------------------------------------------------------------------
# The two checks, as plain functions of names and graphs


def package_of(module: str) -> str:
    parts = module.split(".")
    return ".".join(parts[:2]) if parts[0] == "loadgen" else parts[0]


def forbidden_reason(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None when the table allows it."""
    source, target = package_of(importer), package_of(imported)
    if source not in ALLOWED:
        return f"no rule for package {source} in ALLOWED"
    if target == source or target in ALLOWED[source]:
        return None
    allowed = ", ".join(sorted(ALLOWED[source])) or "nothing of ours"
    return f"{source} may import only: {allowed}"


def find_cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    cycles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for succ in sorted(graph.get(node, ())):
            if succ not in index:
                visit(succ)
                low[node] = min(low[node], low[succ])
            elif succ in on_stack:
                low[node] = min(low[node], index[succ])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                cycles.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(cycles)


def example_loop(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest path from the component's first module back to itself, inside it."""
    start, members = component[0], set(component)
    came_from: dict[str, str] = {}
    queue = deque([start])
    while queue:
        node = queue.popleft()
        for succ in sorted(graph.get(node, ())):
            if succ == start:
                path = [node]
                while path[-1] != start:
                    path.append(came_from[path[-1]])
                return [*reversed(path), start]
            if succ in members and succ not in came_from:
                came_from[succ] = node
                queue.append(succ)
    return component


def module_graph(edges: list[Edge], modules: dict[str, Path]) -> dict[str, set[str]]:
    """What runs: module -> modules it imports, without `if TYPE_CHECKING:` or self-imports."""
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for edge in edges:
        if not edge.type_only and edge.imported in modules and edge.imported != edge.importer:
            graph[edge.importer].add(edge.imported)
    return graph


# ----------------------------------------------------------------------------------------------
# Tests


@pytest.fixture(scope="module")
def modules() -> dict[str, Path]:
    return find_modules()


@pytest.fixture(scope="module")
def edges(modules) -> list[Edge]:
    return collect_edges(modules)


def test_no_forbidden_imports(edges):
    offending = [
        f"  {edge}{'  [TYPE_CHECKING]' if edge.type_only else ''}  ({reason})"
        for edge in edges
        if (reason := forbidden_reason(edge.importer, edge.imported))
    ]
    assert not offending, (
        f"{len(offending)} import(s) break the layering (see ALLOWED in tests/test_layout.py):\n"
        + "\n".join(offending)
    )


def test_no_import_cycles(edges, modules):
    graph = module_graph(edges, modules)
    where = {(e.importer, e.imported): f"{e.path}:{e.line}" for e in reversed(edges)}
    report = []
    for component in find_cycles(graph):
        report.append(f"  [{', '.join(component)}]")
        loop = example_loop(graph, component)
        for a, b in itertools.pairwise(loop):
            report.append(f"      {a} -> {b}  ({where[a, b]})")
    assert not report, (
        f"{len(find_cycles(graph))} import cycle(s) (deferred imports count, TYPE_CHECKING "
        "blocks do not); each with one loop through it:\n" + "\n".join(report)
    )


def test_the_graph_is_not_vacuous(edges, modules):
    assert len(modules) >= 60, sorted(modules)
    pairs = {(edge.importer, edge.imported) for edge in edges}
    assert ("loadgen.run.coordinator", "loadgen.model.snapshot") in pairs  # top-level
    assert ("tui.commands.args", "loadgen.run.config") in pairs  # deferred, inside a function
    assert ("tui.commands.console", "loadgen") in pairs  # `from loadgen import __version__`
    assert any(edge.type_only for edge in edges)


def test_the_checks_can_fail():
    assert forbidden_reason("loadgen.model.snapshot", "loadgen.run.config")
    assert forbidden_reason("loadgen.fleet.agent", "tui.cli")
    assert forbidden_reason("themes", "loadgen")
    assert forbidden_reason("loadgen.run.coordinator", "loadgen.model.snapshot") is None
    assert forbidden_reason("loadgen.sim.server", "loadgen.sim.model") is None

    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert find_cycles(graph) == [["a", "b", "c"]]
    assert example_loop(graph, ["a", "b", "c"]) == ["a", "b", "c", "a"]
    assert find_cycles({"a": {"b"}, "b": set()}) == []


def test_relative_imports_resolve():
    def base(source: str, module: str, is_package: bool) -> str:
        node = ast.parse(source).body[0]
        assert isinstance(node, ast.ImportFrom)
        return _absolute_base(node, module, is_package)

    assert base("from . import hdr", "loadgen.model", True) == "loadgen.model"
    assert base("from .hdr import X", "loadgen.model.snapshot", False) == "loadgen.model.hdr"
    assert base("from ..model import hdr", "loadgen.run.config", False) == "loadgen.model"
