"""House style habit 8 (``docs/development/style.md``): modules of about 300 lines of code.

Lines of code are the lines Python runs: docstrings, comments and blank lines are not counted,
because habit 9 puts an interface's mathematics and contract in its docstrings. "About 300" is
held at 350: a module above it holds more than one role, or one role that should be parts.
"""

from __future__ import annotations

import ast
import io
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "fedtune"
LIMIT = 350
_SKIPPED = {
    tokenize.COMMENT,
    tokenize.NL,
    tokenize.NEWLINE,
    tokenize.INDENT,
    tokenize.DEDENT,
    tokenize.ENDMARKER,
}


def code_lines(source: str) -> int:
    """Lines of ``source`` that hold code: not blank, not only a comment, not a docstring."""
    docstrings: set[int] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
            first = node.body[0] if node.body else None
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                docstrings.update(range(first.lineno, (first.end_lineno or first.lineno) + 1))
    lines: set[int] = set()
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type not in _SKIPPED:
            lines.update(range(token.start[0], token.end[0] + 1))
    return len(lines - docstrings)


def test_code_lines_count_code_not_prose():
    source = '"""A module.\n\nProse.\n"""\n\nimport os  # why\n\n\ndef f():\n    """Doc."""\n    return (\n        1\n    )\n'
    assert code_lines(source) == 5  # import, def, and the three lines of the return


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_about_300_lines_of_code(path):
    count = code_lines(path.read_text())
    assert count <= LIMIT, f"{path.relative_to(ROOT.parent)}: {count} lines of code (> {LIMIT})"
