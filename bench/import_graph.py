"""stepplan's import graph, read from the source: an AST walk, nothing imported.

``tests/test_architecture.py`` holds the code to the import map with it, and
``bench/architecture_figure.py`` draws the map from it, so the figure shows what the
test checks. Relative imports are resolved, ``from package import module`` names the
module, and ``importlib.import_module("...")`` with a literal name counts as an import.
"""

from __future__ import annotations

import ast
from collections.abc import Collection, Iterator
from pathlib import Path

import attrs
import networkx as nx

ROOT = Path(__file__).resolve().parents[1]
#: The import packages, in data-flow order: ``stepplan.<name>`` is the folder ``<name>/``
#: (pyproject.toml's package-dir).
PACKAGES = ("planner", "executor", "sim", "plots")
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)


@attrs.frozen
class Import:
    """One import statement's target, as the module that holds it sees it.

    Attributes:
        source: the importing module (``stepplan.sim.run``).
        target: the imported module, absolute (``stepplan.planner``, ``numpy``).
        line: where the statement is in the source file.
        local: inside a function: it runs when the function is called, not on import.
        typing_only: under ``if TYPE_CHECKING:``: it never runs.
    """

    source: str
    target: str
    line: int
    local: bool = False
    typing_only: bool = False

    @property
    def at_import(self) -> bool:
        """Whether importing ``source`` runs this import."""
        return not (self.local or self.typing_only)


def modules(root: Path = ROOT, packages: Collection[str] = PACKAGES) -> dict[str, Path]:
    """``{dotted name: file}`` of every module of the packages under ``root``."""
    found = {}
    for package in packages:
        for path in sorted((root / package).rglob("*.py")):
            parts = path.relative_to(root / package).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("stepplan", package, *parts))] = path
    return found


def imports(name: str, path: Path, known: Collection[str] = ()) -> list[Import]:
    """Every import of module ``name`` (its file ``path``); ``known`` holds the module
    names that ``from package import name`` may name (else the package is the target)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    return list(_walk(tree, name, package, set(known), local=False, typing_only=False))


def _walk(
    node: ast.AST, name: str, package: str, known: set[str], *, local: bool, typing_only: bool
) -> Iterator[Import]:
    if isinstance(node, ast.If) and _is_type_checking(node.test):
        for child in node.body:
            yield from _walk(child, name, package, known, local=local, typing_only=True)
        for child in node.orelse:
            yield from _walk(child, name, package, known, local=local, typing_only=typing_only)
        return
    line = getattr(node, "lineno", 0)
    for target in _targets(node, package, known):
        yield Import(name, target, line, local, typing_only)
    # A function's body runs when called; its decorators and defaults run on import.
    body = getattr(node, "body", []) if isinstance(node, _FUNCTIONS) else []
    deferred = {id(child) for child in (body if isinstance(body, list) else [body])}
    for child in ast.iter_child_nodes(node):
        inner = local or id(child) in deferred
        yield from _walk(child, name, package, known, local=inner, typing_only=typing_only)


def _is_type_checking(test: ast.expr) -> bool:
    """``TYPE_CHECKING`` or ``typing.TYPE_CHECKING`` (not ``not TYPE_CHECKING``)."""
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _targets(node: ast.AST, package: str, known: set[str]) -> list[str]:
    """The absolute modules one statement or call imports (none for other nodes)."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    if isinstance(node, ast.ImportFrom):
        base = node.module or ""
        if node.level:
            parts = package.split(".")
            anchor = parts[: len(parts) - node.level + 1]
            base = ".".join([*anchor, *([base] if base else [])])
        named = [f"{base}.{alias.name}" for alias in node.names]
        return [module if module in known else base for module in named]
    if isinstance(node, ast.Call) and node.args:
        func, first = node.func, node.args[0]
        called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
        if called in ("import_module", "__import__") and literal:
            return [first.value]
    return []


def all_imports(found: dict[str, Path]) -> list[Import]:
    """The imports of every module of ``found`` (see :func:`modules`)."""
    return [item for name, path in found.items() for item in imports(name, path, found)]


def import_graph(found: dict[str, Path]) -> nx.DiGraph:
    """Module -> module edges among ``found``'s modules, for the imports that run when
    the importing module is imported. A module importing a package it sits in (its
    re-exports) is no edge: that package's ``__init__`` is loaded first anyway."""
    graph = nx.DiGraph()
    graph.add_nodes_from(found)
    for item in all_imports(found):
        inside = item.source.startswith(f"{item.target}.")
        if item.at_import and item.target in found and item.target != item.source and not inside:
            graph.add_edge(item.source, item.target, line=item.line)
    return graph


def package_of(module: str) -> str:
    """``sim`` for ``stepplan.sim.cli.options``; ``""`` outside stepplan."""
    parts = module.split(".")
    return parts[1] if parts[0] == "stepplan" and len(parts) > 1 else ""
