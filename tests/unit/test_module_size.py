"""House style habit 8 (``docs/development/style.md``): one role a module, about 300 lines of code.

Lines of code are the lines Python runs: docstrings, comments and blank lines are not counted,
because habit 9 puts an interface's mathematics and contract in its docstrings. 350 is a backstop:
a module above it holds more than one role, or one role that should be parts. A module of 301 to
350 lines must be a row of habit 8's table, which says why it is one role; a row whose module has
300 or fewer is stale and fails too.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "fedtune"
STYLE = ROOT.parent / "docs" / "development" / "style.md"
LIMIT = 350
#: above this a module needs a row, with its reason, in habit 8's table
REASONED = 300
_TABLE = "<!-- habit-8-one-role: tests/unit/test_module_size.py reads this table -->"
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


@functools.cache
def module_code_lines(path: Path) -> int:
    """:func:`code_lines` of the module at ``path``, counted once per process: the cap's test
    of each module and the table's test of them all read the same counts.

    Args:
        path: a module of ``fedtune/``.

    Returns:
        Its lines of code.
    """
    return code_lines(path.read_text())


def test_code_lines_count_code_not_prose():
    source = '"""A module.\n\nProse.\n"""\n\nimport os  # why\n\n\ndef f():\n    """Doc."""\n    return (\n        1\n    )\n'
    assert code_lines(source) == 5  # import, def, and the three lines of the return


@pytest.mark.parametrize("path", sorted(ROOT.rglob("*.py")), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_module_is_about_300_lines_of_code(path):
    count = module_code_lines(path)
    assert count <= LIMIT, f"{path.relative_to(ROOT.parent)}: {count} lines of code (> {LIMIT})"


def one_role_table(text: str) -> dict[str, str]:
    """Habit 8's table: module path -> the reason it is one role (the rows after the marker)."""
    rows: dict[str, str] = {}
    lines = text.split(_TABLE, 1)[1].lstrip("\n").splitlines()
    for line in lines[2:]:  # the header and its rule
        match = re.fullmatch(r"\| `([^`]+)` \| (.+) \|", line.strip())
        if match is None:
            break
        rows[match[1]] = match[2]
    return rows


def test_one_role_table_reads_its_rows():
    text = f"x\n{_TABLE}\n| module | why |\n|---|---|\n| `fedtune/a.py` | one role |\n\nlater\n"
    assert one_role_table(text) == {"fedtune/a.py": "one role"}


def test_modules_near_the_cap_say_why_they_are_one_role():
    table = one_role_table(STYLE.read_text())
    counts = {
        str(path.relative_to(ROOT.parent)): module_code_lines(path)
        for path in sorted(ROOT.rglob("*.py"))
    }
    unlisted = [f"{m} ({n})" for m, n in counts.items() if n > REASONED and m not in table]
    assert not unlisted, (
        f"above {REASONED} lines of code, not in habit 8's table (split it by role, or add a row "
        f"saying why it is one role): {unlisted}"
    )
    stale = [f"{m} ({counts.get(m, 'gone')})" for m in table if counts.get(m, 0) <= REASONED]
    assert not stale, f"habit 8's table lists modules of {REASONED} lines or fewer: {stale}"
