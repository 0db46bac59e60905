"""The tuning package's subpackages are layers (``docs/explanation/architecture.md`` §1): each
imports only those below it, so no two of them import each other and a new upward import fails
here.

An import counts wherever it runs: at module level, inside a function (a lazy import is still a
dependency at run time), or by name through ``importlib.import_module``/``import_soon``. Only an
import under ``if TYPE_CHECKING:`` does not count (it never runs). The modules at the root of
``fedtune/tuning/`` (``keys``, ``env``, ``strategies``, …) belong to no layer: a subpackage that
reaches another through them depends on it as if it imported it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedtune.tuning import _LAZY as LAZY

PACKAGE = "fedtune.tuning"
ROOT = Path(__file__).resolve().parents[2] / "fedtune" / "tuning"

#: top to bottom: a layer may import any layer after it, none before it
LAYERS = [
    "driver",  # run_study: its phases, Ray, the fit, a pack's members as trials, progress
    "mlflow",  # what a study writes to MLflow (the one importer of MLflow)
    "optuna",  # the searcher, the study's storage, the round ledger, the table of its trials
    "analysis",  # what the trials mean: trade-off, comparisons, figures, theory link
    "trials",  # one Ray Tune trial: its trainable, its results, stop rules, the scheduler
    "spec",  # the study spec
    "packing",  # a pack's own pieces: plan, probes, runs, the box, the limits
    "common",  # what every layer shares: the start-up timeline, the SQLite stores' commits
]


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def imported_names(source: str, module: str, is_package: bool) -> Iterator[tuple[str, int]]:
    """Every module name ``source`` may import when it runs, with its line: ``import a.b``,
    ``from a import b`` (``a.b``, and ``a`` itself), relative imports resolved against
    ``module``, and literal names given to ``import_module``/``import_soon``; not what an
    ``if TYPE_CHECKING:`` block imports.

    Args:
        source: The module's text.
        module: Its dotted name.
        is_package: Whether it is a package's ``__init__``.

    Returns:
        ``(name, line)`` pairs; a name may be a module's attribute rather than a module.
    """
    here = module.split(".") if is_package else module.split(".")[:-1]
    pending: list[ast.AST] = [ast.parse(source)]
    while pending:
        node = pending.pop()
        if isinstance(node, ast.If) and _type_checking(node.test):
            pending.extend(node.orelse)
            continue
        if isinstance(node, ast.Import):
            yield from ((alias.name, node.lineno) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = here[: len(here) - node.level + 1]
                base = ".".join(parts + ([node.module] if node.module else []))
            yield base, node.lineno
            yield from ((f"{base}.{alias.name}", node.lineno) for alias in node.names)
        elif (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None))
            in ("import_module", "import_soon")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.lineno
        pending.extend(ast.iter_child_nodes(node))


def _part(name: str) -> str | None:
    """The part of the tuning package a module name falls in: a subpackage (``driver``), a
    root module (``keys``), or None (outside it, or the package itself). A name the package
    imports lazily (``fedtune.tuning.run_study``) falls in its module's part."""
    parts = name.split(".")
    if parts[:2] != PACKAGE.split(".") or len(parts) < 3:
        return None
    first = LAZY.get(parts[2], parts[2]).split(".")[0]
    return first if (ROOT / first).is_dir() or (ROOT / f"{first}.py").is_file() else None


def subpackages() -> list[str]:
    return sorted(p.name for p in ROOT.iterdir() if (p / "__init__.py").is_file())


def import_graph() -> dict[str, dict[str, list[str]]]:
    """``{importer: {imported: ["path:line name", …]}}`` between the parts of the tuning
    package (subpackages and root modules)."""
    graph: dict[str, dict[str, list[str]]] = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT.parents[1]).with_suffix("")
        is_package = path.name == "__init__.py"
        module = ".".join(rel.parts[:-1] if is_package else rel.parts)
        source = _part(module)
        if source is None:
            continue
        edges = graph.setdefault(source, {})
        for name, line in imported_names(path.read_text(), module, is_package):
            target = _part(name)
            if target is not None and target != source:
                edges.setdefault(target, []).append(f"{path.relative_to(ROOT)}:{line} {name}")
    return graph


def cycles(graph: dict[str, dict[str, list[str]]]) -> list[list[str]]:
    """The strongly connected components of more than one part (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in graph.get(node, {}):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layer_edges(
    graph: dict[str, dict[str, list[str]]], layers: set[str]
) -> dict[tuple[str, str], list[str]]:
    """Each layer's imports of other layers, directly or through root modules (the parts of
    ``graph`` that are not in ``layers``)."""
    out: dict[tuple[str, str], list[str]] = {}
    for source in layers:
        seen: set[str] = set()
        pending = [(target, why) for target, why in graph.get(source, {}).items()]
        while pending:
            target, why = pending.pop()
            if target in seen:
                continue
            seen.add(target)
            if target in layers:
                out.setdefault((source, target), []).extend(why)
            else:  # a root module: what it imports, this subpackage depends on
                pending.extend((t, why + w) for t, w in graph.get(target, {}).items())
    return out


@pytest.fixture(scope="module")
def graph() -> dict[str, dict[str, list[str]]]:
    return import_graph()


def test_the_scanner_counts_runtime_imports_and_skips_type_checking():
    source = (
        "from typing import TYPE_CHECKING\n"
        "from ..keys import ROUND\n"
        "from . import box\n"
        "if TYPE_CHECKING:\n"
        "    from ..driver.fit import fit\n"
        "else:\n"
        "    import fedtune.tuning.common.timeline\n"
        "def f():\n"
        "    from ..optuna.store import StudyStore\n"
        "    import_soon('fedtune.tuning.analysis.plots')\n"
    )
    names = {n for n, _ in imported_names(source, "fedtune.tuning.trials.trainable", False)}
    assert {
        "fedtune.tuning.keys.ROUND",
        "fedtune.tuning.trials.box",
        "fedtune.tuning.common.timeline",
        "fedtune.tuning.optuna.store.StudyStore",
        "fedtune.tuning.analysis.plots",
    } <= names
    assert not [n for n in names if "driver" in n]
    package = {n for n, _ in imported_names("from .sections import X", "fedtune.tuning.spec", True)}
    assert "fedtune.tuning.spec.sections.X" in package
    assert _part("fedtune.tuning.run_study") == "driver"  # a lazy name: its module's part
    assert _part("fedtune.tuning.keys.ROUND") == "keys" and _part("fedtune.trainers") is None


def test_cycles_and_layer_edges_are_found_where_they_are():
    graph = {"a": {"keys": ["a.py:1"]}, "keys": {"b": ["keys.py:2"]}, "b": {"a": ["b.py:3"]}}
    assert cycles(graph) == [["a", "b", "keys"]]
    assert cycles({"a": {"b": ["x"]}, "b": {}}) == []
    through = layer_edges(graph, {"a", "b"})  # a reaches b through the root module keys
    assert through == {("a", "b"): ["a.py:1", "keys.py:2"], ("b", "a"): ["b.py:3"]}


def test_the_layers_are_the_subpackages():
    assert sorted(LAYERS) == subpackages()


def test_no_two_parts_of_the_tuning_package_import_each_other(graph):
    found = cycles(graph)
    detail = [
        f"{a} -> {b}: {graph[a][b][0]}"
        for component in found
        for a in component
        for b in component
        if b in graph.get(a, {})
    ]
    assert not found, "\n".join(detail)


def test_each_layer_imports_only_the_layers_below_it(graph):
    edges = layer_edges(graph, set(subpackages()))
    assert ("driver", "trials") in edges  # the scan sees the imports it checks
    upward = [
        f"{source} imports {target} ({why[0]})"
        for (source, target), why in sorted(edges.items())
        if LAYERS.index(target) < LAYERS.index(source)
    ]
    assert not upward, "\n".join(upward)
