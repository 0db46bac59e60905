"""Every documented command runs: the ``bash`` and ``python`` blocks of each page (README.md
and docs/**), in the environment its ``docs_env`` names (docs/development/docs.md).

The newcomer paths have their own test ids (``test_newcomer_path[...]``); the harness is
proven on small pages of its own under ``tests/docs/fixtures/``.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import pytest

from .conftest import DEV_BIN, MEMBER, PROJECT, SHARED_GROUP, Environment, run_page
from .pages import REPO, bash_script, first_command, parse_page, python_script
from .pages import pages as all_pages

pytestmark = [pytest.mark.slow, pytest.mark.integration]

FIXTURES = Path(__file__).parent / "fixtures"
#: the readers the docs are written for: test id -> (page, the docs_env it runs in)
NEWCOMER_PATHS = {
    "researcher-own-model": ("docs/tutorials/own-model.md", "local"),
    "mlflow-comparison": ("docs/tutorials/mlflow-comparison.md", "local"),
    "team-member-light-client": ("docs/how-to/team-service.md", "light"),
    "team-one-machine": ("docs/how-to/team-one-machine.md", "team"),
    "operator-helm-kuberay": ("docs/how-to/helm-kuberay.md", "operator"),
}
#: the ``docs_env`` values whose pages use the session's light venv or shared server
#: (conftest.py's ``light_venv``, ``shared_service``)
SHARED_ENVS = ("service", "light", "team")
#: keeps the tests that use those session fixtures on one pytest-xdist worker: split over two
#: (``--dist loadgroup`` hands ungrouped tests to either), each worker built its own light venv
#: and started its own server; the server stops after the group's last test (conftest.py)
SHARED = pytest.mark.xdist_group(SHARED_GROUP)
#: keeps the pages that begin with the same command (README.md's ``make run`` and
#: first-study.md's ``fedtune tune examples/quickstart.yaml``) on one worker, in collection
#: order: the later one goes on in the earlier one's directory (conftest.py's ``first_runs``)
SAME_START = pytest.mark.xdist_group("docs-same-first-command")
MAKEFILE = REPO / "Makefile"
QUICKSTART = "docs/tutorials/first-study.md"


def _start(page) -> tuple[str, str] | None:
    """The key under which a page's directory is shared: its ``docs_env`` and first command
    (``local`` pages only: the others start services of their own, or run on a laptop)."""
    command = first_command(page, MAKEFILE) if page.env == "local" else None
    return (page.env, command) if command else None


def _runnable_pages() -> list:
    newcomers = {page for page, _ in NEWCOMER_PATHS.values()}
    found, starts = [], []
    for path in all_pages():
        name = str(path.relative_to(REPO))
        try:
            page = parse_page(path)
        except ValueError:  # an unclosed fence, an unknown docs_env: its test says so
            found.append((name, None))
            continue
        if name not in newcomers and (page.runnable("bash") or page.runnable("python")):
            found.append((name, page))
            starts.append(_start(page))
    params = []
    for name, page in found:
        if page is None:
            params.append(name)
            continue
        marks = [SHARED] if page.env in SHARED_ENVS else []
        if (start := _start(page)) is not None and starts.count(start) > 1:
            marks.append(SAME_START)
        params.append(pytest.param(name, marks=marks, id=name))
    return params


def _newcomer_paths() -> list:
    return [
        pytest.param(name, env, marks=[SHARED] if env in SHARED_ENVS else [], id=test_id)
        for test_id, (name, env) in NEWCOMER_PATHS.items()
    ]


def _check(name: str, environment_for, tmp_path: Path, first_runs: dict) -> None:
    """Run a page; one whose first command a page that passed ran first in a fresh directory
    of the same ``docs_env`` goes on in that directory (the command's run from nothing was
    checked there), and a page that passes leaves its directory for the next."""
    page = parse_page(REPO / name)
    for block in page.skipped:
        print(f"SKIP {page.name}:{block.line} ({block.title})")
    start = _start(page)
    work = first_runs.get(start)
    if work is not None:
        print(f"{page.name}: goes on in {work}, where a page ran {start[1]!r} first and passed")
    result = run_page(page, tmp_path, environment_for(page), work)
    print(result.output)
    assert result.ok, f"{result.where}: a documented command failed\n{result.output[-4000:]}"
    if start is not None and work is None:
        first_runs[start] = tmp_path / "work"


@pytest.mark.parametrize("name", _runnable_pages())
def test_page_commands_run(name: str, environment_for, tmp_path: Path, first_runs) -> None:
    """A page's runnable blocks run in its environment and exit 0."""
    _check(name, environment_for, tmp_path, first_runs)


@pytest.mark.parametrize("name, env", _newcomer_paths())
def test_newcomer_path(name: str, env: str, environment_for, tmp_path: Path, first_runs) -> None:
    """A newcomer's page documents commands, and every one of them runs as its reader would."""
    page = parse_page(REPO / name)
    assert page.env == env, f"{name}: docs_env is {page.env}, its reader's is {env}"
    assert page.runnable("bash") or page.runnable("python"), (
        f"{name} shows no runnable command: the newcomer path is not documented yet"
    )
    _check(name, environment_for, tmp_path, first_runs)


# ---------------------------------------------------------------------------- the harness


def test_harness_a_passing_page_runs_its_blocks_and_skips_needs_blocks(tmp_path: Path) -> None:
    page = parse_page(FIXTURES / "passing.md")
    assert [b.title for b in page.skipped] == ["Needs a Kubernetes cluster"]
    result = run_page(page, tmp_path, Environment([DEV_BIN]))
    assert result.ok, result.output
    work = tmp_path / "work"
    assert (work / "bash-ran").read_text().strip() == "quickstart-digits-fedavgm"
    assert (work / "python-ran").read_text() == "2"  # python saw the bash block's two files
    assert not (work / "needs-ran").exists()
    assert (tmp_path / "home" / "was-home").exists()  # HOME is the page's own


@pytest.mark.parametrize("fixture, lang", [("failing.md", "bash"), ("failing_python.md", "python")])
def test_harness_a_failing_block_is_reported_with_its_page_line(
    fixture: str, lang: str, tmp_path
) -> None:
    path = FIXTURES / fixture
    lines = path.read_text().splitlines()
    expected = next(i + 1 for i, line in enumerate(lines) if "FAILS HERE" in line)
    page = parse_page(path)
    result = run_page(page, tmp_path, Environment([DEV_BIN]))
    assert not result.ok
    assert result.where == f"{page.name}:{expected}", result.output
    assert "after the failure" not in result.output  # nothing ran after it


def test_harness_an_output_block_is_what_its_block_prints(tmp_path: Path) -> None:
    page = parse_page(FIXTURES / "output.md")
    result = run_page(page, tmp_path, Environment([DEV_BIN]))
    assert result.ok, result.output
    assert "submitted 687f86080436" in result.output  # still printed, as without a check


def test_harness_a_changed_message_fails_its_output_block(tmp_path: Path) -> None:
    page = parse_page(FIXTURES / "wrong_output.md")
    result = run_page(page, tmp_path, Environment([DEV_BIN]))
    assert not result.ok
    assert result.where == f"{page.name}:12"  # the Output block's first line
    assert "got 0" in result.output and "Input should be" in result.output


def test_harness_make_lines_become_the_recipe_or_a_printed_skip(tmp_path: Path) -> None:
    page = parse_page(FIXTURES / "make.md")
    script = bash_script(page, tmp_path / "m", REPO / "Makefile")
    assert "fedtune tune examples/quickstart.yaml" in script  # make run: its recipe
    assert "skipped `make test`" in script and "\nmake test" not in script
    assert python_script(page, tmp_path / "m") is None


def test_harness_a_page_that_begins_as_another_goes_on_in_its_directory() -> None:
    readme, first = parse_page(REPO / "README.md"), parse_page(REPO / QUICKSTART)
    assert first_command(parse_page(FIXTURES / "make.md"), MAKEFILE) == (
        "fedtune tune examples/quickstart.yaml"
    )  # make run: its recipe, as the page's script runs it
    assert _start(readme) == _start(first) == ("local", "fedtune tune examples/quickstart.yaml")
    assert _start(parse_page(REPO / "docs/how-to/compare.md")) is None  # continued on line 2
    assert first_command(parse_page(REPO / "docs/how-to/resume.md")) is None  # a here-document
    assert first_command(parse_page(FIXTURES / "passing.md")) == "fedtune --help > /dev/null"


@SHARED
def test_harness_a_service_page_reaches_a_real_server_as_a_member(
    environment_for, tmp_path
) -> None:
    page = parse_page(FIXTURES / "service.md")
    environment = environment_for(page)
    assert set(environment.env) == {"FEDTUNE_URL", "FEDTUNE_TOKEN"}
    result = run_page(page, tmp_path, environment)
    assert result.ok, result.output
    assert (tmp_path / "work" / "whoami.txt").read_text().split() == [MEMBER, PROJECT]


@pytest.mark.e2e
@SHARED
def test_harness_a_light_page_runs_without_the_engine(environment_for, tmp_path) -> None:
    page = parse_page(FIXTURES / "light.md")
    environment = environment_for(page)
    assert environment.python.parent.parent != Path(sys.prefix)
    result = run_page(page, tmp_path, environment)
    assert result.ok, result.output
    assert (tmp_path / "work" / "light.txt").read_text().split() == ["no-torch", MEMBER]


@pytest.mark.e2e
@SHARED
def test_harness_a_laptop_block_has_the_light_client_only_and_nothing_outlives_the_page(
    environment_for, tmp_path
) -> None:
    page = parse_page(FIXTURES / "team.md")
    result = run_page(page, tmp_path, environment_for(page))
    assert result.ok, result.output
    work = tmp_path / "work"
    assert (work / "laptop.txt").read_text().splitlines() == [
        "laptop after machine",
        "machine again",
    ]
    left = int((work / "left-running.pid").read_text())
    stat = Path(f"/proc/{left}/stat")
    deadline = time.monotonic() + 10  # SIGKILL was sent as the page ended; it lands at once
    while _state(stat) not in (None, "Z"):
        assert time.monotonic() < deadline, f"{left} outlived its page"
        time.sleep(0.1)


def _state(stat: Path) -> str | None:
    """A process's state letter from its ``/proc/<pid>/stat``; None once it is gone (reaped
    between any two looks: its file vanishes, or a read of it fails).

    Args:
        stat: The process's ``/proc/<pid>/stat``.

    Returns:
        Its state (``Z``: a zombie), or None.
    """
    try:
        return stat.read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return None


def test_harness_an_operator_page_renders_the_chart_offline(environment_for, tmp_path) -> None:
    page = parse_page(FIXTURES / "operator.md")
    result = run_page(page, tmp_path, environment_for(page))
    assert result.ok, result.output
    assert "kind: Deployment" in (tmp_path / "work" / "rendered.yaml").read_text()
