"""Nothing the repository ships points at a file outside it: the package, the docs, the README,
the examples, the chart, the Dockerfile and the benchmarks name no design notes, paper text
files or ``../shared`` paths, and every relative Markdown link of the docs and the README
resolves inside the repository.

(Tests may reach ``../shared`` only through their documented variables, e.g.
``FEDTUNE_CRD_DIR``; they are not scanned.)
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from .pages import REPO

#: what points outside the repository, and why it is named here
OUTSIDE = {
    "a design note of the workspace": re.compile(r"\b(?:ALGORITHMS|ARCHITECTURE|STYLE)\.md\b"),
    "the workspace's shared folder": re.compile(r"shared/(?:design|seeds)\b|\.\./shared\b"),
    "a paper's text file": re.compile(r"\b\d{3}_[0-9a-f]{16}\.txt\b"),
}
SCANNED = ("fedtune", "docs", "README.md", "examples", "helm", "Dockerfile", "benchmarks")
_BINARY = {".png", ".jpg", ".jpeg", ".gif", ".ico", ".h5", ".db", ".zip", ".whl", ".gz", ".pyc"}
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)(?:\s+\"[^\"]*\")?\)|!\[[^\]\n]*\]\(([^)\s]+)\)")


def shipped_files(root: Path = REPO) -> list[Path]:
    """The files the pointer check reads.

    Args:
        root: the repository.

    Returns:
        Text files under :data:`SCANNED`, sorted (caches and binaries left out).
    """
    files = []
    for name in SCANNED:
        path = root / name
        candidates = [path] if path.is_file() else sorted(path.rglob("*")) if path.is_dir() else []
        for file in candidates:
            if (
                file.is_file()
                and file.suffix not in _BINARY
                and not any(part in ("__pycache__", ".ipynb_checkpoints") for part in file.parts)
            ):
                files.append(file)
    return files


def outside_pointers(files: list[Path], root: Path = REPO) -> list[str]:
    """Every line of ``files`` that names a file outside the repository.

    Args:
        files: the files to read.
        root: the repository (for the paths reported).

    Returns:
        ``path:line: what (the text)`` per offending line.
    """
    found = []
    for file in files:
        try:
            text = file.read_text()
        except UnicodeDecodeError:
            continue
        for number, line in enumerate(text.splitlines(), 1):
            for what, pattern in OUTSIDE.items():
                match = pattern.search(line)
                if match:
                    found.append(f"{file.relative_to(root)}:{number}: {what} ({match.group(0)})")
    return found


def broken_links(files: list[Path], root: Path = REPO) -> list[str]:
    """Relative Markdown links of ``files`` that name no file or folder of the repository.

    Args:
        files: Markdown files.
        root: the repository; a link may not leave it.

    Returns:
        ``path:line: target`` per broken link.
    """
    found = []
    for file in files:
        in_fence = False
        for number, line in enumerate(file.read_text().splitlines(), 1):
            if re.match(r"^\s*(`{3,}|~{3,})", line):
                in_fence = not in_fence
                continue
            if in_fence:
                continue
            for match in _LINK.finditer(re.sub(r"`[^`]*`", "", line)):
                target = (match.group(1) or match.group(2)).split("#", 1)[0]
                if not target or re.match(r"^[a-z][a-z0-9+.-]*:", target) or target.startswith("/"):
                    continue  # an anchor, a URL or a site path
                resolved = (file.parent / target).resolve()
                if not resolved.is_relative_to(root) or not resolved.exists():
                    found.append(f"{file.relative_to(root)}:{number}: {target}")
    return found


def test_no_file_points_outside_the_repository() -> None:
    found = outside_pointers(shipped_files())
    assert not found, "pointers to files outside the repository:\n" + "\n".join(found)


def test_relative_links_of_the_docs_resolve() -> None:
    pages = [
        p
        for p in shipped_files()
        if p.suffix == ".md" and (p.name == "README.md" or p.is_relative_to(REPO / "docs"))
    ]
    found = broken_links(pages)
    assert not found, "relative links to nothing:\n" + "\n".join(found)


@pytest.mark.parametrize(
    "line, what",
    [
        ("see ALGORITHMS.md §2", "a design note of the workspace"),
        ("read ../shared/k8s/crds", "the workspace's shared folder"),
        ("(`001_2dc7ddae5cbdc81f.txt` §8.3)", "a paper's text file"),
    ],
)
def test_the_check_finds_each_kind_of_pointer(line: str, what: str, tmp_path: Path) -> None:
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    page.write_text(f"# A page\n\nfine\n{line}\n")
    assert outside_pointers([page], tmp_path) == [
        f"docs/page.md:4: {what} ({OUTSIDE[what].search(line).group(0)})"
    ]


def test_the_check_finds_a_broken_link_and_one_leaving_the_repository(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "there.md").write_text("# There\n")
    page = tmp_path / "docs" / "page.md"
    page.write_text(
        "[ok](there.md#x) [gone](missing.md)\n\n```text\n[in a fence](nowhere.md)\n```\n"
        "[out](../../outside.md) [web](https://example.org/x.md) `[code](no.md)`\n"
    )
    assert broken_links([page], tmp_path) == [
        "docs/page.md:1: missing.md",
        "docs/page.md:6: ../../outside.md",
    ]
