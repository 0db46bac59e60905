"""Every recipe declares how it packs (issue 61, item 1): what its round is (``round_form``),
whether it packs (``packable``, or the reason it does not) and what members may differ in
(``member_hparams``). No module infers any of it from which function ``build`` is."""

from __future__ import annotations

import ast
from pathlib import Path

from fedtune.trainers import algorithms, get_recipe
from fedtune.trainers.algorithms.recipe import MEMBER_HPARAMS

ROOT = Path(__file__).resolve().parents[2] / "fedtune"
#: the built-ins that run one configuration per process, and what their refusal names
UNPACKED = {
    "maml": "differentiates through exactly K inner steps",
    "scaffold": "per-client control variates",
    "scaffold_ga": "fresh control variates",
    "fedga": "gradient-alignment correction",
    "gradalign": "gradient-alignment correction",
    "fedavg_mass": "MaSS",
    "fedavg_mass_literal": "MaSS",
    "fedavg_nesterov": "MaSS",
    "mixed_pt": "central data",
    "mixed_gt1": "central data",
    "mixed_gt2": "central data",
    "mixed_fl": "central data",
}
_NAMES = ("__name__", "__qualname__", "__code__", "__module__")


def _is_build(node: ast.AST) -> bool:
    return (isinstance(node, ast.Attribute) and node.attr == "build") or (
        isinstance(node, ast.Name) and node.id == "build"
    )


def build_comparisons(source: str) -> list[int]:
    """Lines of ``source`` that compare a ``build`` with something other than None (which
    function it is) or read its name."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            others = [o for o in operands if not _is_build(o)]
            if len(others) < len(operands) and not all(
                isinstance(o, ast.Constant) and o.value is None for o in others
            ):
                lines.append(node.lineno)
        elif isinstance(node, ast.Attribute) and node.attr in _NAMES and _is_build(node.value):
            lines.append(node.lineno)
    return lines


def test_the_check_finds_what_it_looks_for():
    """The two forms this issue removed are found; a presence test is not."""
    assert build_comparisons("ok = recipe.build.__name__ != '_build_local_update'") == [1]
    assert build_comparisons("ok = self.build is _build_local_update") == [1]
    assert build_comparisons("ok = build == other") == [1]
    assert build_comparisons("given = self.build is not None") == []


def test_no_module_compares_build_by_identity_or_name():
    found = [
        f"{path.relative_to(ROOT.parent)}:{line}"
        for path in sorted(ROOT.rglob("*.py"))
        for line in build_comparisons(path.read_text())
    ]
    assert not found, f"these compare a build: {found}"


def test_every_built_in_recipe_call_says_its_round_and_whether_it_packs():
    """Each ``Recipe(...)`` of the built-ins names ``round_form`` and ``packable``; the plain
    ones are made by ``local_update_recipe``, which says both."""
    calls = 0
    for path in sorted((ROOT / "trainers" / "algorithms").glob("*.py")):
        if path.name == "recipe.py":  # the helper: round_form and packable from its arguments
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Recipe":
                calls += 1
                said = {k.arg for k in node.keywords}
                assert {"round_form", "packable"} <= said, f"{path.name}:{node.lineno}"
    assert calls >= 5


def test_the_built_ins_pack_as_before_with_their_reasons():
    """Every built-in outside :data:`UNPACKED` packs, members differing in all the engine
    holds; the others refuse in one line that names the algorithm and the reason."""
    for name, recipe in sorted(algorithms().items()):
        if name.startswith("ft_") or recipe.paper == "":
            continue  # a test's user recipe
        if name in UNPACKED:
            assert not recipe.packable, name
            why = recipe.pack_refusal
            assert f"algorithm {name!r} does not pack" in why and UNPACKED[name] in why
            assert "\n" not in why and why.endswith("one configuration per process")
        else:
            assert recipe.packable and recipe.pack_refusal is None, name
            assert recipe.round_form == "local_update", name
            assert recipe.member_hparams == MEMBER_HPARAMS, name
    assert get_recipe("maml").round_form == "local_update"
    assert {get_recipe(n).round_form for n in UNPACKED if n != "maml"} == {"own"}
