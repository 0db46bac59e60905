"""The harness of a page's section for two machines (tests/team_shell.py), on a fixture page and
with plain ``bash`` for both terminals: what tests/e2e/test_team_network.py relies on when it
runs them on two network namespaces."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.team_shell import ON_BOX, ON_LAPTOP, Shell, section_blocks

from .pages import parse_page

FIXTURE = Path(__file__).parent / "fixtures" / "two_machines.md"
SHELL = ["bash", "--noprofile", "--norc", "-s"]


def test_a_sections_blocks_are_its_own_and_the_docs_tests_skip_them() -> None:
    page, blocks = section_blocks(FIXTURE, "On a real network")
    assert [(b.where, b.block.line) for b in blocks] == [("box", 13), ("laptop", 24), ("box", 32)]
    assert [b.expected is not None for b in blocks] == [True, True, False]
    assert {b.title for b in parse_page(FIXTURE).skipped} == {ON_BOX, ON_LAPTOP}
    assert not page.runnable("bash")[0].title  # the ordinary block stays the docs tests'
    with pytest.raises(AssertionError, match="no section"):
        section_blocks(FIXTURE, "Elsewhere")


def test_each_machine_has_its_terminal_and_a_failing_line_is_named(tmp_path: Path) -> None:
    _, blocks = section_blocks(FIXTURE, "On a real network")
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)}
    box = Shell(SHELL, env, tmp_path, tmp_path / "box", FIXTURE.name)
    laptop = Shell(SHELL, env, tmp_path, tmp_path / "laptop", FIXTURE.name)
    try:
        assert box.run_block(blocks[0]) == "hello from the box\n"
        with pytest.raises(AssertionError, match=r"two_machines\.md:28: the block at line 24"):
            laptop.run_block(blocks[1])  # the box's variable is not the laptop's
        laptop.run(["token='a token'"])  # what the test hands over
        assert laptop.run_block(blocks[1]) == "the laptop has no greeting and a token\n"
        with pytest.raises(AssertionError, match=r"two_machines\.md:32: the block failed") as e:
            box.run_block(blocks[2])
        assert "the box's job ended" in str(e.value)  # its own job: `wait` waited for it
        assert "docs: two_machines.md:34: exit 1" in str(e.value)  # the page's line of `false`
        assert "never printed" not in str(e.value)
    finally:
        box.close()
        laptop.close()
