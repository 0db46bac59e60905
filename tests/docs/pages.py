"""The documentation pages as the tests read them: front matter, fenced blocks, run scripts.

The contract is docs/development/docs.md: a page's ``bash`` blocks run as one script
(``set -euo pipefail``), its ``python`` blocks as one process; a block whose title begins with
``Needs`` is shown, not run; ``docs_env:`` in the front matter says who runs the page.
A script keeps every block at the line it has on its page (blank lines pad the gaps), so
bash's ``$LINENO`` and Python's tracebacks name the page's own line numbers.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RUNNABLE = ("bash", "python")
#: the title of a ``text`` block that shows what the runnable block before it prints
OUTPUT = "Output"
#: in an expected output: any text within a line; a line of it alone, any number of lines
ANY = "…"
ENVIRONMENTS = ("local", "service", "light", "operator", "team")
#: the title of a ``bash`` block a member runs on their laptop: under ``docs_env: team`` it runs
#: with only the light install on ``PATH`` (``$DOCS_LAPTOP_PATH``), the rest on the service's
#: machine
LAPTOP = "On the member's laptop"
#: a line of a page that is a `make` command (README: `make run`, `make test`)
MAKE_LINE = re.compile(r"^\s*make\s+([A-Za-z0-9_.-]+)\s*$")
_FENCE = re.compile(
    r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*(?P<lang>[\w+-]*)(?P<rest>.*)$"
)
_TITLE = re.compile(r"""title=(?:"([^"]*)"|'([^']*)')""")
_SNIPPET = re.compile(r"""^\s*-{2}8<-{2}\s+["']([^"']+)["']\s*$""")


@dataclass(frozen=True)
class Block:
    """One fenced block of a page.

    Args:
        lang: its language tag (``bash``, ``python``, ``text``, ...).
        title: its ``title="..."`` attribute, or an empty string.
        line: the page line of its first content line (1-based).
        lines: its content, dedented by the fence's indentation, snippet includes expanded.
    """

    lang: str
    title: str
    line: int
    lines: tuple[str, ...]

    @property
    def needs(self) -> bool:
        """Whether the block is marked as not runnable here (a title beginning with ``Needs``)."""
        return self.title.startswith("Needs")

    @property
    def runnable(self) -> bool:
        """Whether the harness runs the block."""
        return self.lang in RUNNABLE and not self.needs


@dataclass(frozen=True)
class Page:
    """A Markdown page.

    Args:
        path: the file.
        env: its ``docs_env`` (``local`` when the front matter has none).
        timeout: seconds its scripts may take (``docs_timeout``, default 900).
        blocks: its fenced blocks, in page order.
    """

    path: Path
    env: str
    timeout: float
    blocks: tuple[Block, ...]

    @property
    def name(self) -> str:
        """The page's path relative to the repository (``docs/tutorials/own-model.md``)."""
        try:
            return str(self.path.relative_to(REPO))
        except ValueError:
            return str(self.path)

    def runnable(self, lang: str) -> list[Block]:
        """The blocks of ``lang`` the harness runs.

        Args:
            lang: ``bash`` or ``python``.

        Returns:
            Those blocks, in page order.
        """
        return [b for b in self.blocks if b.lang == lang and b.runnable]

    def expected(self, block: Block) -> Block | None:
        """The ``text`` block titled ``Output`` that follows ``block``: what it prints.

        Args:
            block: a runnable block of the page.

        Returns:
            The output block (only blank lines between the two), or None.
        """
        after = self.blocks.index(block) + 1
        if after >= len(self.blocks):
            return None
        shown = self.blocks[after]
        if shown.lang != "text" or shown.title != OUTPUT:
            return None
        text = self.path.read_text().splitlines()
        between = text[block.line - 1 + len(block.lines) + 1 : shown.line - 2]
        return shown if not any(line.strip() for line in between) else None

    @property
    def skipped(self) -> list[Block]:
        """The ``bash``/``python`` blocks marked ``Needs ...``."""
        return [b for b in self.blocks if b.lang in RUNNABLE and b.needs]


def front_matter(text: str) -> dict:
    """The YAML front matter of a page (``---`` lines at its top), or an empty mapping.

    Args:
        text: the page.

    Returns:
        The parsed mapping.
    """
    match = re.match(r"^---\n(.*?)\n---\n", text, re.S)
    if not match:
        return {}
    data = yaml.safe_load(match.group(1))
    return data if isinstance(data, dict) else {}


def parse_page(path: Path, root: Path = REPO) -> Page:
    """Read a page's front matter and fenced blocks.

    Args:
        path: the Markdown file.
        root: where snippet includes (``--8<-- "examples/x.yaml"``) are read from.

    Returns:
        The page.

    Raises:
        ValueError: on an unknown ``docs_env`` or a fence left open.
    """
    text = path.read_text()
    meta = front_matter(text)
    env = str(meta.get("docs_env", "local"))
    if env not in ENVIRONMENTS:
        raise ValueError(f"{path}: docs_env {env!r} is not one of {', '.join(ENVIRONMENTS)}")
    blocks = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            i += 1
            continue
        indent, fence = match.group("indent"), match.group("fence")
        title = _TITLE.search(match.group("rest"))
        start = i + 1
        body: list[str] = []
        i += 1
        while i < len(lines):
            stripped = lines[i].strip()
            if stripped.startswith(fence) and set(stripped) == {fence[0]}:
                break
            body.append(
                lines[i][len(indent) :] if lines[i].startswith(indent) else lines[i].lstrip()
            )
            i += 1
        else:
            raise ValueError(f"{path}:{start}: a fenced block is never closed")
        blocks.append(
            Block(
                lang=match.group("lang").lower(),
                title=(title.group(1) or title.group(2) or "") if title else "",
                line=start + 1,
                lines=tuple(_expand_snippets(body, root)),
            )
        )
        i += 1
    return Page(
        path=path, env=env, timeout=float(meta.get("docs_timeout", 900)), blocks=tuple(blocks)
    )


def _expand_snippets(body: list[str], root: Path) -> list[str]:
    """A block's lines with each ``--8<-- "file"`` line replaced by the file's text, as
    ``pymdownx.snippets`` shows it (a multi-line file shifts the lines after it in the script;
    the failure report then names the block's first line)."""
    out = []
    for line in body:
        match = _SNIPPET.match(line)
        if match:
            out.append((root / match.group(1)).read_text().rstrip("\n"))
        else:
            out.append(line)
    return out


def pages(root: Path = REPO) -> list[Path]:
    """Every page the harness checks: ``docs/**/*.md`` and ``README.md``.

    Args:
        root: the repository.

    Returns:
        The files, sorted.
    """
    found = sorted((root / "docs").rglob("*.md"))
    readme = root / "README.md"
    return [*found, readme] if readme.is_file() else found


def _padded(blocks: list[Block], first: str) -> list[str]:
    """Lines of a script with each block at its page line (``first`` on line 1).

    Each block starts with a marker statement on its fence's line, so its content keeps the
    page's line numbers (a multi-line snippet include shifts the lines after it)."""
    script = [first]
    for block in blocks:
        while len(script) < block.line - 1:
            script.append("")
        for line in block.lines:
            script.extend(line.split("\n"))
    return script


def output_file(outputs: Path, block: Block) -> Path:
    """Where the script writes what ``block`` prints (a block with an expected output)."""
    return outputs / f"{block.line}.txt"


def matches(expected: list[str], printed: list[str]) -> bool:
    """Whether ``printed`` is ``expected``, ``…`` standing for any text within a line and a
    line of ``…`` alone for any number of lines (trailing blanks ignored).

    Args:
        expected: the lines an ``Output`` block shows.
        printed: the lines the block printed.

    Returns:
        True when they match.
    """

    def line_matches(want: str, got: str) -> bool:
        parts = [re.escape(part) for part in want.rstrip().split(ANY)]
        return re.fullmatch(".*".join(parts), got.rstrip(), re.S) is not None

    want, got = list(expected), list(printed)
    while want and not want[-1].strip():
        want.pop()
    while got and not got[-1].strip():
        got.pop()

    @functools.cache
    def match(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i].strip() == ANY:
            return any(match(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and line_matches(want[i], got[j]) and match(i + 1, j + 1)

    return match(0, 0)


def bash_script(
    page: Page, marker: Path, makefile: Path | None = None, outputs: Path | None = None
) -> str | None:
    """The page's ``bash`` blocks as one script, each block at its page line.

    Before each block the script writes ``page:line`` to ``marker``; a failing command prints
    ``docs: page:LINE: exit N`` (the page's line) on stderr. A line ``make run`` becomes the
    ``run`` recipe of ``makefile``; any other ``make`` line is skipped with a printed reason
    (it acts on the checkout, and ``make test`` is this suite).

    Args:
        page: the page.
        marker: the file the script records the block being run in.
        makefile: the repository's Makefile.
        outputs: where a block with an expected output (:meth:`Page.expected`) writes what it
            prints (:func:`output_file`), which it also still prints.

    Returns:
        The script, or None when the page runs no bash block.
    """
    blocks = page.runnable("bash")
    if not blocks:
        return None
    recipes = make_recipes(makefile) if makefile and makefile.is_file() else {}
    marked = []
    for block in blocks:
        lines = [f"printf '%s\\n' '{page.name}:{block.line}' > \"$DOCS_MARKER\""]
        for n, line in enumerate(block.lines):
            make = MAKE_LINE.match(line)
            if make and make.group(1) == "run" and recipes.get("run"):
                line = " && ".join(recipes["run"])
            elif make:
                line = (
                    f"echo 'docs: skipped `make {make.group(1)}` at {page.name}:"
                    f"{block.line + n}: it acts on the checkout (make test is this suite)'"
                )
            lines.append(line)
        end = []  # on the closing fence's line: the block's own lines keep their page lines
        if block.title.startswith(LAPTOP):
            lines[0] += (
                "; DOCS_PATH=$PATH; PATH=${DOCS_LAPTOP_PATH:?a laptop block needs docs_env team}; hash -r"
            )
            end.append("PATH=$DOCS_PATH; hash -r")
        if outputs is not None and page.expected(block) is not None:
            into = _sh_quote(str(output_file(outputs, block)))
            lines[0] += "; {"
            end.insert(0, f"}} > {into} 2>&1; cat {into}")
        if end:
            lines.append("; ".join(end))
        marked.append(Block(block.lang, block.title, block.line - 1, tuple(lines)))
    head = (
        f"set -Eeuo pipefail; DOCS_MARKER={_sh_quote(str(marker))}; "
        f"trap 'echo \"docs: {page.name}:$LINENO: exit $?\" >&2' ERR"
    )
    return "\n".join(_padded(marked, head)) + "\n"


def first_command(page: Page, makefile: Path | None = None) -> str | None:
    """The command a page runs first, as :func:`bash_script` runs it: the first line of its
    first ``bash`` block (``make run`` as its recipe), when that line is a whole command.

    Args:
        page: the page.
        makefile: the repository's Makefile.

    Returns:
        The command; None when the page runs no bash block, or its first line is not a whole
        command (continued with ``\\``, a here-document, ``make`` of another target) or runs
        on a laptop.
    """
    blocks = page.runnable("bash")
    if not blocks or not blocks[0].lines or blocks[0].title.startswith(LAPTOP):
        return None
    line = blocks[0].lines[0].strip()
    if make := MAKE_LINE.match(line):
        recipes = make_recipes(makefile) if makefile and makefile.is_file() else {}
        run = recipes.get("run") if make.group(1) == "run" else None
        return " && ".join(run) if run else None
    return None if not line or line.endswith("\\") or "<<" in line else line


def python_script(page: Page, marker: Path) -> str | None:
    """The page's ``python`` blocks as one program, each block at its page line.

    Args:
        page: the page.
        marker: the file the program records the block being run in.

    Returns:
        The program, or None when the page runs no python block.
    """
    blocks = page.runnable("python")
    if not blocks:
        return None
    marked = []
    for block in blocks:
        mark = f"open({str(marker)!r}, 'w').write({page.name + ':' + str(block.line)!r})"
        marked.append(Block(block.lang, block.title, block.line - 1, (mark, *block.lines)))
    return "\n".join(_padded(marked, "# the python blocks of " + page.name)) + "\n"


def make_recipes(makefile: Path) -> dict[str, list[str]]:
    """The recipes of a Makefile's targets, with ``$(BIN)/`` dropped (the venv is on PATH).

    Args:
        makefile: the file.

    Returns:
        ``{target: [command, ...]}``.
    """
    recipes: dict[str, list[str]] = {}
    target = None
    for line in makefile.read_text().splitlines():
        head = re.match(r"^([A-Za-z0-9_.-]+):(?!=)", line)
        if head:
            target = head.group(1)
            recipes[target] = []
        elif line.startswith("\t") and target:
            recipes[target].append(line.strip().replace("$(BIN)/", ""))
        elif line.strip() and not line.startswith("#"):
            target = None
    return recipes


def _sh_quote(text: str) -> str:
    return "'" + text.replace("'", "'\\''") + "'"


def documentation(root: Path = REPO) -> dict[str, str]:
    """The text of every page (:func:`pages`), for tests that check what a page states.

    Args:
        root: the repository.

    Returns:
        ``{path relative to the repository: text}``.
    """
    return {str(p.relative_to(root)): p.read_text() for p in pages(root)}
