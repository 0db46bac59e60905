"""One validation style: a document's shape is checked by ``fedtune.errors.as_mapping``.

A section of a study spec, a space file, a request body or a training configuration is
validated by its typed model, whose errors go through ``config_error``; before the model reads
it, the one shape check that can fail is ``as_mapping`` (the field, "must be a mapping …, got
<type>"). So an ``if`` that tests ``not isinstance(x, Mapping | dict)`` and then raises a
``ConfigError`` (or ``InvalidRequestError``) writes that check a second time, and fails here.
What is left of ``isinstance(…, Mapping | dict)`` in ``fedtune/`` walks JSON trees, sniffs a
document's kind, passes a non-mapping on to a model's own error, or reads data fedtune wrote
itself or got from another program, tolerating what it does not know.
"""

from __future__ import annotations

import ast
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OWNER = "fedtune/errors.py"
_CONFIG_ERRORS = {"ConfigError", "InvalidRequestError"}
_MAPPINGS = {"Mapping", "dict", "MutableMapping"}
#: (module, function) whose check is not of a document's shape, each with its reason
ALLOWED: dict[tuple[str, str], str] = {
    ("fedtune/tuning/mlflow/comparisons.py", "local_input"): (
        "a parent run or its spec.yaml that MLflow does not give back: one error naming the store"
    ),
}


def _tests_not_a_mapping(test: ast.expr) -> bool:
    """Whether ``test`` is, or has as an ``or`` operand, ``not isinstance(x, <mapping>)``."""
    parts = test.values if isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or) else [test]
    for part in parts:
        if not (isinstance(part, ast.UnaryOp) and isinstance(part.op, ast.Not)):
            continue
        call = part.operand
        is_check = isinstance(call, ast.Call) and getattr(call.func, "id", None) == "isinstance"
        if is_check and _names(call.args[1]) & _MAPPINGS:
            return True
    return False


def _names(kinds: ast.expr) -> set[str]:
    """The type names of an ``isinstance`` argument: a name, ``abc.Name``, a tuple, ``A | B``."""
    if isinstance(kinds, ast.Tuple):
        return set().union(*(_names(e) for e in kinds.elts))
    if isinstance(kinds, ast.BinOp) and isinstance(kinds.op, ast.BitOr):
        return _names(kinds.left) | _names(kinds.right)
    if isinstance(kinds, ast.Attribute):
        return {kinds.attr}
    return {kinds.id} if isinstance(kinds, ast.Name) else set()


def _raises_a_config_error(body: list[ast.stmt]) -> bool:
    first = body[0]
    if not (isinstance(first, ast.Raise) and isinstance(first.exc, ast.Call)):
        return False
    return getattr(first.exc.func, "id", None) in _CONFIG_ERRORS


def _shape_checks(source: str) -> list[tuple[int, str]]:
    """``(line, function)`` of each ``if not isinstance(x, Mapping): raise ConfigError(...)``."""
    tree = ast.parse(source)
    checks = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and _tests_not_a_mapping(node.test)
        and _raises_a_config_error(node.body)
    ]
    if not checks:  # the usual case: no need to find the functions around them
        return []
    where = {
        inner: node.name
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        for inner in ast.walk(node)
    }
    return [(node.lineno, where.get(node, "")) for node in checks]


def _may_have_shape_checks(source: str) -> bool:
    """Whether ``source`` names both ``isinstance`` and an error of :data:`_CONFIG_ERRORS`:
    a shape check (:func:`_shape_checks`) needs both names, so a module without them is not
    parsed."""
    return "isinstance" in source and any(error in source for error in _CONFIG_ERRORS)


def test_a_documents_shape_is_checked_by_as_mapping_only():
    found, allowed = [], set()
    for path in sorted((REPO / "fedtune").rglob("*.py")):
        name = path.relative_to(REPO).as_posix()
        source = path.read_text()
        if name != OWNER and _may_have_shape_checks(source):
            for line, fn in _shape_checks(source):
                if (name, fn) in ALLOWED:
                    allowed.add((name, fn))
                else:
                    found.append(f"{name}:{line}")
    assert found == [], f"use fedtune.errors.as_mapping: {found}"
    assert allowed == set(ALLOWED), "an exception that no longer exists: remove it"


def test_the_rule_sees_a_shape_check_written_again():
    written_again = (
        "def f(data):\n"
        "    if data is None or not isinstance(data, Mapping):\n"
        "        raise ConfigError('x', 'must be a mapping')\n"
        "    if not isinstance(data, dict | list):\n"
        "        raise InvalidRequestError('<body>', 'a JSON object')\n"
        "    if not isinstance(data, Mapping):\n"
        "        return data\n"
        "    if not isinstance(data, str):\n"
        "        raise ConfigError('x', 'a name')\n"
    )
    assert [line for line, _ in _shape_checks(written_again)] == [2, 4]
    spelled = "if not isinstance(d, (abc.Mapping, list)):\n    raise ConfigError('x', 'y')\n"
    assert _shape_checks(spelled) == [(1, "")]


def test_as_mapping_names_the_field_the_type_and_the_error_class():
    import pytest

    from fedtune.errors import ConfigError, InvalidRequestError, as_mapping

    assert as_mapping({"a": 1}, "train") == {"a": 1}
    with pytest.raises(ConfigError) as caught:
        as_mapping([3], "train", "study.yaml", what=" of train's keys")
    assert caught.value.field == "train" and caught.value.source == "study.yaml"
    assert caught.value.reason == "must be a mapping of train's keys, got list"
    with pytest.raises(InvalidRequestError):
        as_mapping("x", "<body>", error=InvalidRequestError)
