"""Keep the files the docs show identical to the files: a block titled with a path holds that file.

    python tools/docs_includes.py --write    # copy each named file into its block (make docs-gen)
    python tools/docs_includes.py --check    # exit 1, one line per stale block (make docs)

A fenced block whose ``title="…"`` names a file of the repository (```` ```yaml
title="examples/quickstart.yaml" ````) shows that file, byte for byte. The text is in the page
itself, so the page reads the same on GitHub, in an editor and on the built site (a snippet
include, ``--8<--``, shows as a literal line everywhere but the site); this tool writes it there
and checks that nobody edited one without the other.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PAGES = ("README.md", "docs")
_FENCE = re.compile(r"^(?P<indent>[ \t]*)(?P<fence>`{3,}|~{3,})[ \t]*[\w+-]*(?P<rest>.*)$")
_TITLE = re.compile(r"""title=(?:"([^"]*)"|'([^']*)')""")


def pages(root: Path = REPO) -> list[Path]:
    """The Markdown pages this tool keeps.

    Args:
        root: the repository.

    Returns:
        README.md and every page under docs/, sorted.
    """
    found = []
    for name in PAGES:
        path = root / name
        found += [path] if path.is_file() else sorted(path.rglob("*.md"))
    return found


def expanded(text: str, root: Path = REPO) -> str:
    """``text`` with each block titled with a repository file holding that file's text.

    Args:
        text: a Markdown page.
        root: where the titled paths are read from.

    Returns:
        The page, every such block's body replaced (indented as its fence is).
    """
    lines = text.splitlines(keepends=True)
    out: list[str] = []
    i = 0
    while i < len(lines):
        match = _FENCE.match(lines[i])
        if not match:
            out.append(lines[i])
            i += 1
            continue
        indent, fence = match.group("indent"), match.group("fence")
        end = i + 1
        while end < len(lines) and not lines[end].strip().startswith(fence):
            end += 1
        title = _TITLE.search(match.group("rest"))
        path = title and (title.group(1) or title.group(2))
        source = root / path if path else None
        out.append(lines[i])
        if source is not None and source.is_file() and source.resolve().is_relative_to(root):
            body = source.read_text().splitlines(keepends=True)
            out += [indent + line if line.strip() else line for line in body]
            if body and not body[-1].endswith("\n"):
                out.append("\n")
        else:
            out += lines[i + 1 : end]
        out += lines[end : end + 1]
        i = end + 1
    return "".join(out)


def stale(root: Path = REPO) -> list[str]:
    """One line per page whose titled blocks differ from their files.

    Args:
        root: the repository.

    Returns:
        The problems (empty: every page is current).
    """
    problems = []
    for page in pages(root):
        text = page.read_text()
        if expanded(text, root) != text:
            problems.append(
                f"{page.relative_to(root)}: a block titled with a file differs from the file "
                "(run `make docs-gen`)"
            )
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--write", action="store_true", help="rewrite the pages")
    mode.add_argument("--check", action="store_true", help="exit 1 when a page is stale")
    args = parser.parse_args(argv)
    if args.write:
        for page in pages():
            text = page.read_text()
            if (new := expanded(text)) != text:
                page.write_text(new)
                print(f"wrote {page.relative_to(REPO)}")
        return 0
    problems = stale()
    for line in problems:
        print(line, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
