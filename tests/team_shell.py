"""A terminal on each machine of the team's network, and a page's blocks typed into them.

A page section written for two machines (``docs/how-to/team-one-machine.md``, "On a real
network") titles each block with where it runs: :data:`ON_BOX` or :data:`ON_LAPTOP`. Both titles
begin with ``Needs``, so ``tests/docs`` shows them without running them (it has one machine);
``tests/e2e/test_team_network.py`` runs them here, each block's lines as printed, in page order,
in one ``bash`` per machine (:class:`Shell`): variables set, background jobs started and
``wait`` behave as in the reader's own terminal on that machine. Nothing crosses from one
terminal to the other but what the test hands over, as the operator hands a member their token.

Each block runs as ``{ <its lines> } < /dev/null > <out>/<line>.txt 2>&1`` under ``set -Eeuo
pipefail``; its output is compared with the ``Output`` block after it (``…`` matches any text),
and a failing command ends the terminal, its message naming the page's line.
"""

from __future__ import annotations

import contextlib
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from tests.docs.pages import Block, Page, matches, parse_page

__all__ = ["ON_BOX", "ON_LAPTOP", "SectionBlock", "Shell", "close_input", "section_blocks"]

#: the title of a block the operator runs on the service's machine
ON_BOX = "Needs a network: on the box"
#: the title of a block a member runs on their laptop
ON_LAPTOP = "Needs a network: on the member's laptop"


def close_input(proc: subprocess.Popen, kill: Callable[[], None]) -> None:
    """End a process that reads its work from standard input: close its input, give it 30 s
    to exit, else ``kill`` it and wait 10 s more.

    Args:
        proc: the process, started with ``stdin=PIPE``.
        kill: how to kill it (the process alone, or its group).
    """
    with contextlib.suppress(OSError):
        assert proc.stdin is not None
        proc.stdin.close()
    try:
        proc.wait(30)
    except subprocess.TimeoutExpired:
        kill()
        proc.wait(10)


@dataclass(frozen=True)
class SectionBlock:
    """One block of a two-machine section.

    Attributes:
        block: the block.
        where: ``box`` or ``laptop``.
        expected: the ``Output`` block after it, or None.
    """

    block: Block
    where: str
    expected: Block | None


def section_blocks(path: Path, heading: str) -> tuple[Page, list[SectionBlock]]:
    """The runnable-on-two-machines blocks of the page's section ``heading`` (its ``##`` line
    up to the next ``##``), in page order.

    Args:
        path: the page.
        heading: the section's heading text (``On a real network``).

    Returns:
        The page and the blocks.

    Raises:
        AssertionError: no such section, or one without a block of each machine.
    """
    page = parse_page(path)
    lines = path.read_text().splitlines()
    start = next((n for n, t in enumerate(lines, 1) if t.strip() == f"## {heading}"), None)
    assert start is not None, f"{path} has no section '## {heading}'"
    end = next((n for n, t in enumerate(lines, 1) if n > start and t.startswith("## ")), len(lines))
    found = []
    for block in page.blocks:
        if start < block.line < end and block.title in (ON_BOX, ON_LAPTOP):
            where = "box" if block.title == ON_BOX else "laptop"
            found.append(SectionBlock(block, where, page.expected(block)))
    assert {b.where for b in found} == {"box", "laptop"}, f"{heading}: a block for each machine"
    return page, found


class Shell:
    """One ``bash`` on one machine, fed a block at a time (a reader's terminal).

    Args:
        argv: the command that starts ``bash -s`` there (``ip netns exec …``).
        env: its environment.
        cwd: its working directory.
        root: where its log and the blocks' outputs go.
        page: the page name its error messages name.
    """

    def __init__(
        self, argv: Sequence[str], env: Mapping[str, str], cwd: Path, root: Path, page: str
    ) -> None:
        self.root = root
        self.page = page
        self.outputs = root / "outputs"
        self.outputs.mkdir(parents=True, exist_ok=True)
        self.log_path = root / "shell.log"
        with self.log_path.open("w") as log:
            self.proc = subprocess.Popen(
                list(argv),
                env=dict(env),
                cwd=cwd,
                stdin=subprocess.PIPE,
                stdout=log,
                stderr=subprocess.STDOUT,
                text=True,
                start_new_session=True,
            )
        self._steps = 0
        self._send(
            "set -Eeuo pipefail; __page=0; __first=0\n"
            f"trap 'echo \"docs: {page}:$((__page + LINENO - __first)): exit $?\" >&2' ERR\n"
        )

    def _send(self, text: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(text)
        self.proc.stdin.flush()

    def run(self, lines: Sequence[str], line: int = 0, timeout: float = 900) -> str:
        """Run ``lines`` (a block's, or the test's own commands with ``line`` 0) and wait.

        Args:
            lines: the commands.
            line: the page line of the first (names the output file and failing lines).
            timeout: seconds it may take.

        Returns:
            What it printed (stdout and stderr).

        Raises:
            AssertionError: a command failed (the terminal ended), or the timeout passed.
        """
        self._steps += 1
        name = f"{line or 'step'}-{self._steps}"
        out, done = self.outputs / f"{name}.txt", self.outputs / f"{name}.done"
        self._send(
            f"__page={line}; __first=$((LINENO + 1)); {{\n"
            + "\n".join(lines)
            + f"\n}} < /dev/null > {out} 2>&1\n: > {done}\n"
        )
        deadline = time.monotonic() + timeout
        while not done.exists():
            if self.proc.poll() is not None or time.monotonic() > deadline:
                text = out.read_text(errors="replace") if out.exists() else ""
                why = "timed out" if self.proc.poll() is None else "failed"
                raise AssertionError(
                    f"{self.page}:{line}: the block {why}\n{text[-4000:]}\n"
                    f"--- terminal\n{self.log_path.read_text(errors='replace')[-2000:]}"
                )
            time.sleep(0.3)
        return out.read_text(errors="replace")

    def run_block(self, item: SectionBlock, timeout: float = 900) -> str:
        """Run a page's block as printed; check what it printed against its ``Output`` block.

        Args:
            item: the block.
            timeout: seconds it may take.

        Returns:
            What it printed.
        """
        printed = self.run(item.block.lines, item.block.line, timeout)
        if item.expected is not None:
            want = list(item.expected.lines)
            assert matches(want, printed.splitlines()), (
                f"{self.page}:{item.expected.line}: the block at line {item.block.line} printed"
                f"\n{printed}\n--- expected (… matches anything)\n" + "\n".join(want)
            )
        return printed

    def close(self) -> None:
        """End the terminal (its background jobs are the test's to stop)."""
        close_input(self.proc, self.proc.kill)
