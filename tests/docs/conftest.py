"""Fixtures of the documentation tests: the environments a page's commands run in.

These tests need the full development venv (``.[all,dev,docs]``). Each ``docs_env`` of
docs/development/docs.md is built here:

* ``local``: the development venv's ``bin`` first on ``PATH``;
* ``service``: as ``local``, plus a real ``fedtune serve`` (SQLite, ``local`` backend), a
  project and a member of exactly that project, started once per session and shared by the
  ``service`` and ``light`` pages (they read, or submit studies of their own), stopped after
  the last of them (an idle server still ticks); the page sees ``FEDTUNE_URL`` and
  ``FEDTUNE_TOKEN`` (the member's);
* ``light``: as ``service``, but ``PATH`` starts with a venv holding only ``pip install .``
  (no extras), built once per session; the development venv is not on ``PATH``;
* ``operator``: as ``local``, plus ``helm``: the binary when one is installed, else a
  ``helm`` command backed by ``helm-python-sdk`` (``helm_shim.py``).

Every page runs in a fresh directory holding copies of ``examples/`` and ``helm/``, with
``HOME`` there too, so a command cannot write into the checkout; the reader's cache
(``XDG_CACHE_HOME``) is one for the session, as a reader's ``~/.cache`` outlives a page
(``reader_cache``). A missing helm follows the
repository's rule (``tests/needs.py``): a printed skip, a failure under
``FEDTUNE_REQUIRE_HELM=1``.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from tests.needs import need

from .pages import REPO, Page, bash_script, matches, output_file, python_script

DEV_BIN = Path(sys.executable).parent
#: what a page's commands must not inherit from the test process
_DROPPED_PREFIXES = ("FEDTUNE_", "MLFLOW_", "RAY_", "VIRTUAL_ENV", "PYTHONPATH", "KUBECONFIG")
#: the admin token of the services started for pages (never shown to a page)
ADMIN_TOKEN = "docs-admin-token-0123456789abcdef"
PROJECT = "docs"
MEMBER = "reader"


@dataclass
class RunResult:
    """What running a page's scripts gave.

    Args:
        ok: whether every script exited 0.
        where: ``page:line`` of the failing block (empty when ok).
        output: the scripts' stdout and stderr, in order.
    """

    ok: bool
    where: str = ""
    output: str = ""


@dataclass
class Environment:
    """Who runs a page: the ``PATH`` entries before the system's, extra variables, a python.

    Args:
        path: directories put first on ``PATH``.
        env: variables the page's commands see.
        python: the interpreter of the page's python blocks.
    """

    path: list[Path]
    env: dict[str, str] = field(default_factory=dict)
    python: Path = Path(sys.executable)
    #: the working directory holds the checkout's ``examples/`` and ``helm/`` (False: a light
    #: client's laptop, which has only what ``pip install fedtune`` gave it)
    checkout: bool = True
    #: the reader's cache (``XDG_CACHE_HOME``), kept from page to page as a reader's
    #: ``~/.cache`` is (:func:`reader_cache`); None: one in the page's own home
    cache: Path | None = None


def base_environment(home: Path, path: list[Path], cache: Path | None = None) -> dict[str, str]:
    """The variables a page runs with: the test process's, minus fedtune's and Ray's, plus a
    private ``HOME``, ``PATH`` starting with ``path`` and one OpenMP thread.

    Args:
        home: the page's home directory.
        path: directories put first on ``PATH``.
        cache: the reader's cache directory (``XDG_CACHE_HOME``); None: ``.cache`` in ``home``.

    Returns:
        The environment.
    """
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_PREFIXES)}
    system = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != DEV_BIN]
    env["PATH"] = os.pathsep.join([*(str(p) for p in path), *system])
    env.update(
        {
            "HOME": str(home),
            "XDG_CACHE_HOME": str(cache or home / ".cache"),
            "PYTHONDONTWRITEBYTECODE": "1",
            "MPLBACKEND": "Agg",
            "NO_COLOR": "1",
            # one torch/OpenMP thread per command, as the suite's own processes run
            # (tests/conftest.py): two pytest workers share the CI's 2 CPUs, and a
            # command's second thread spins for the core the other worker holds (`fedtune
            # train` of train-one.md: 8.1 -> 2.8 CPU-s, the same records)
            "OMP_NUM_THREADS": "1",
        }
    )
    return env


def workspace(tmp: Path, checkout: bool = True) -> tuple[Path, Path]:
    """A fresh working directory with copies of ``examples/`` and ``helm/``, and a home.

    Args:
        tmp: an empty temporary directory.
        checkout: copy the checkout's folders (False: a laptop with ``pip install fedtune``,
            which has neither).

    Returns:
        (working directory, home directory).
    """
    work, home = tmp / "work", tmp / "home"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("examples", "helm") if checkout else ():
        if (REPO / name).is_dir():
            shutil.copytree(REPO / name, work / name, ignore=ignore)
    work.mkdir(exist_ok=True)
    home.mkdir()
    return work, home


def run_page(
    page: Page, tmp: Path, environment: Environment, work: Path | None = None
) -> RunResult:
    """Run a page's ``bash`` script, then its ``python`` program.

    Args:
        page: the page.
        tmp: an empty temporary directory (working directory, home, scripts).
        environment: who runs it.
        work: the working directory another page left (the page goes on where that one
            ended); None: a fresh one in ``tmp``.

    Returns:
        The outcome, naming the failing block's ``page:line``.
    """
    if work is None:
        work, home = workspace(tmp, environment.checkout)
    else:
        home = tmp / "home"
        home.mkdir()
    env = base_environment(home, environment.path, environment.cache) | environment.env
    marker = tmp / "block"
    outputs = tmp / "outputs"
    outputs.mkdir()
    output = []
    scripts = [
        ("bash", bash_script(page, marker, REPO / "Makefile", outputs), ["bash"]),
        ("python", python_script(page, marker), [str(environment.python)]),
    ]
    for lang, script, argv in scripts:
        if script is None:
            continue
        path = tmp / f"page.{'sh' if lang == 'bash' else 'py'}"
        path.write_text(script)
        try:
            done = _run_in_session([*argv, str(path)], work, env, page.timeout)
        except subprocess.TimeoutExpired as exc:
            where = marker.read_text().strip() if marker.exists() else page.name
            text = f"{exc.stdout or ''}{exc.stderr or ''}"
            return RunResult(
                False, where, "".join(output) + f"{text}\n[timed out after {page.timeout} s]"
            )
        output.append(f"--- {lang} of {page.name}\n{done.stdout}{done.stderr}")
        if done.returncode != 0:
            return RunResult(False, _where(page, lang, path, marker, done.stderr), "".join(output))
        if lang == "bash" and (wrong := _wrong_output(page, outputs)) is not None:
            return RunResult(False, wrong[0], "".join(output) + wrong[1])
    return RunResult(True, "", "".join(output))


def _run_in_session(
    argv: list[str], cwd: Path, env: dict[str, str], timeout: float
) -> subprocess.CompletedProcess:
    """Run a page's script in a session of its own; whatever it left running in that session
    (a server started with ``&`` and not stopped) is killed when it ends, or at ``timeout``."""
    proc = subprocess.Popen(
        argv,
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired as exc:
        _kill_session(proc.pid)
        exc.stdout, exc.stderr = proc.communicate()
        raise
    finally:
        _kill_session(proc.pid)
    return subprocess.CompletedProcess(argv, proc.returncode, stdout, stderr)


def _kill_session(pid: int) -> None:
    """SIGKILL the process group ``pid`` leads (the script's session), if any is left."""
    import signal

    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def _wrong_output(page: Page, outputs: Path) -> tuple[str, str] | None:
    """The first ``Output`` block that differs from what its bash block printed: its
    ``page:line`` and the two texts; None when every one matches."""
    for block in page.runnable("bash"):
        shown = page.expected(block)
        if shown is None:
            continue
        printed = output_file(outputs, block).read_text().splitlines()
        if not matches(list(shown.lines), printed):
            expected = "\n".join(shown.lines)
            return (
                f"{page.name}:{shown.line}",
                f"\n--- expected ({page.name}:{shown.line}, … matches anything)\n{expected}"
                f"\n--- printed by the block at {page.name}:{block.line}\n" + "\n".join(printed),
            )
    return None


def _where(page: Page, lang: str, script: Path, marker: Path, stderr: str) -> str:
    """``page:line`` of the failure: the line bash's trap or Python's traceback names (the
    scripts keep the page's line numbers), else the block the marker recorded."""
    import re

    if lang == "bash":
        found = re.findall(rf"docs: {re.escape(page.name)}:(\d+): exit", stderr)
    else:
        found = re.findall(rf'File "{re.escape(str(script))}", line (\d+)', stderr)
    if found:
        return f"{page.name}:{found[-1]}"
    return marker.read_text().strip() if marker.exists() else page.name


# ---------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="session")
def light_venv(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A venv with only the light install (fedtune's wheel, no extras), once per session.

    The wheel is built from a copy of the sources, so building it writes nothing into the
    checkout, by the development venv's pip and setuptools (no isolated build environment to
    install); that pip installs it and its dependencies into a venv made without pip of its
    own (``ensurepip`` would cost seconds, and no page runs pip). Returns the venv's ``bin``.
    """
    root = tmp_path_factory.mktemp("light")
    src = root / "src"
    src.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(REPO / "fedtune", src / "fedtune", ignore=ignore)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        if (REPO / name).is_file():
            shutil.copy(REPO / name, src / name)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHONPATH"))}

    def pip(step: str, *argv: str) -> None:
        done = subprocess.run(
            [sys.executable, "-m", "pip", *argv], env=env, capture_output=True, text=True,
            timeout=900,
        )  # fmt: skip
        assert done.returncode == 0, (
            f"pip {step} of the light package failed:\n{done.stderr[-3000:]}"
        )

    pip("wheel", "wheel", "-q", "--no-deps", "--no-build-isolation", "-w", str(root), str(src))
    wheel = next(root.glob("fedtune-*.whl"))  # --python goes before pip's subcommand
    pip("install", "--python", str(venv / "bin" / "python"), "install", "-q", str(wheel))
    return venv / "bin"


@pytest.fixture(scope="session")
def helm_bin(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory with a ``helm`` command: the installed binary, else the SDK-backed shim."""
    found = shutil.which("helm")
    if found:
        return Path(found).parent
    try:
        import helm_python

        helm_python.helm_sdk_version()
    except Exception as exc:  # not installed, or its libhelm_c does not load
        need("helm", f"no helm binary on PATH and helm-python-sdk is unusable ({exc})")
    bin_dir = tmp_path_factory.mktemp("helm-bin")
    shim = bin_dir / "helm"
    shim.write_text(
        f'#!/bin/sh\nexec {sys.executable} {Path(__file__).parent / "helm_shim.py"} "$@"\n'
    )
    shim.chmod(0o755)
    return bin_dir


@contextlib.contextmanager
def started_service(tmp: Path, cache: Path | None = None) -> Iterator[dict[str, str]]:
    """A real ``fedtune serve`` (uvicorn, SQLite, ``local`` backend) with one project and one
    member of exactly that project, stopped on exit.

    Args:
        tmp: an empty directory for its database, work directory and log.
        cache: the cache its studies' drivers use (``XDG_CACHE_HOME``; None: one in ``tmp``).

    Returns:
        A context manager giving ``FEDTUNE_URL`` and ``FEDTUNE_TOKEN`` (the member's).
    """
    from fedtune import Client
    from tests.service.helpers import Server

    tmp.mkdir(parents=True, exist_ok=True)
    database = f"sqlite:///{tmp / 'fedtune.db'}"
    env = base_environment(tmp, [DEV_BIN], cache) | {
        "FEDTUNE_DATABASE_URL": database,
        "FEDTUNE_WORKDIR": str(tmp / "work"),
        "FEDTUNE_BACKEND": "local",
        "FEDTUNE_API_TOKEN": ADMIN_TOKEN,
    }
    server = Server(env, tmp / "serve.log")
    server.env = env  # exactly these variables, not the test process's
    server.start(timeout=120)
    try:
        # through the API the server has loaded already: two admin CLI processes would each
        # import the service's stack first
        with Client(server.url, token=ADMIN_TOKEN) as admin:
            admin.create_project(PROJECT)
            token = admin.create_user(MEMBER, project=PROJECT, role="member").token
        yield {"FEDTUNE_URL": server.url, "FEDTUNE_TOKEN": token}
    finally:
        server.stop()


#: the pytest-xdist group of the tests that use the session's shared server or light venv
#: (test_snippets.py's ``SHARED``): ``--dist loadgroup`` runs them on one worker, one after another
SHARED_GROUP = "docs-shared-service"
_SERVICE = pytest.StashKey["SharedService"]()


class SharedService:
    """The one ``fedtune serve`` of the :data:`SHARED_GROUP` tests: started by the first that
    asks, stopped as the group's last test ends (:func:`pytest_runtest_teardown`).

    An idle server still ticks its scheduler (a few database reads a second): kept until the
    session ended, the one started at the group's first test idled through the rest of the
    worker's tests (13.6 CPU-s in a CI run, of which ~1 s was its start).

    Args:
        root: an empty directory for its database, work directory and log.
        cache: the cache its studies' drivers use (the pages', :func:`reader_cache`).
    """

    def __init__(self, root: Path, cache: Path | None = None) -> None:
        self._root = root
        self._cache = cache
        self._stack: contextlib.ExitStack | None = None
        self._service: dict[str, str] = {}
        self._starts = 0

    def get(self) -> dict[str, str]:
        """``FEDTUNE_URL`` and ``FEDTUNE_TOKEN`` (the member's); the server starts if it is
        not running (again, in a fresh directory, for a test after the group's last)."""
        if self._stack is None:
            self._starts += 1
            stack = contextlib.ExitStack()
            self._service = stack.enter_context(
                started_service(self._root / str(self._starts), self._cache)
            )
            self._stack = stack
        return self._service

    def stop(self) -> None:
        """Stop the server, if it runs."""
        stack, self._stack = self._stack, None
        if stack is not None:
            stack.close()


def _shared(item: pytest.Item) -> bool:
    """Whether a test is one of the :data:`SHARED_GROUP`."""
    return any(
        (m.args[0] if m.args else m.kwargs.get("name")) == SHARED_GROUP
        for m in item.iter_markers("xdist_group")
    )


def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    """Stop the shared server once the last :data:`SHARED_GROUP` test of the session (in
    collection order, the order ``--dist loadgroup`` runs a group in) has run.

    Args:
        item: the test that ran.
        nextitem: the next test (unused: under pytest-xdist it is only what the worker has
            been sent so far).
    """
    service = item.config.stash.get(_SERVICE, None)
    if service is None or not _shared(item):
        return
    if item is next((i for i in reversed(item.session.items) if _shared(i)), None):
        service.stop()


@pytest.fixture(scope="session")
def reader_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The reader's cache (``XDG_CACHE_HOME``), one for the session's pages and shared server.

    A reader's ``~/.cache`` outlives a page: what a first command caches there, the next finds
    (fedtune's empty MLflow store, whose making runs MLflow's migrations, about 1.1 CPU-s, in
    each new study's MLflow process; matplotlib's font list). With a cache per page, every
    page that runs a study made both again.
    """
    return tmp_path_factory.mktemp("reader-cache")


@pytest.fixture(scope="session")
def _shared_service(
    request: pytest.FixtureRequest,
    tmp_path_factory: pytest.TempPathFactory,
    reader_cache: Path,
) -> Iterator[SharedService]:
    """The session's :class:`SharedService`, stopped at the latest when the session ends."""
    service = SharedService(tmp_path_factory.mktemp("service"), reader_cache)
    request.config.stash[_SERVICE] = service
    try:
        yield service
    finally:
        service.stop()
        del request.config.stash[_SERVICE]


@pytest.fixture
def shared_service(_shared_service: SharedService) -> dict[str, str]:
    """One ``fedtune serve`` for every ``service`` and ``light`` page of the session.

    Starting a server and making its project and member costs seconds per page; the pages only
    read (``whoami``, ``studies``) or submit studies of their own, and a page that lists studies
    is the only one that submits, so one server serves them all.

    Returns:
        ``FEDTUNE_URL`` and ``FEDTUNE_TOKEN`` (the member's).
    """
    return _shared_service.get()


@pytest.fixture(scope="session")
def first_runs() -> dict[tuple[str, str], Path]:
    """The working directories of the pages that passed, by their ``docs_env`` and the command
    they ran first in a fresh one (:func:`~tests.docs.pages.first_command`), for the session.

    A page whose first command another page ran first in a fresh directory of the same
    ``docs_env``, and passed, goes on in that page's directory (README.md's ``make run`` is
    first-study.md's ``fedtune tune examples/quickstart.yaml``: run from nothing once, read
    again by the other).
    """
    return {}


@pytest.fixture
def environment_for(request: pytest.FixtureRequest, tmp_path: Path, reader_cache: Path):
    """``environment_for(page) -> Environment`` of the page's ``docs_env`` (a ``service`` or
    ``light`` page gets the session's shared server), with the session's reader cache."""

    def pick(page: Page) -> Environment:
        if page.env == "local":
            return Environment([DEV_BIN])
        if page.env == "operator":
            return Environment([DEV_BIN, request.getfixturevalue("helm_bin")])
        if page.env == "team":  # the page starts its service; its laptop blocks: the light client
            light = request.getfixturevalue("light_venv")
            laptop = base_environment(tmp_path, [light])["PATH"]
            return Environment([DEV_BIN], {"DOCS_LAPTOP_PATH": laptop}, checkout=False)
        service = request.getfixturevalue("shared_service")
        if page.env == "service":
            return Environment([DEV_BIN], service)
        light = request.getfixturevalue("light_venv")
        return Environment([light], service, light / "python", checkout=False)

    def make(page: Page) -> Environment:
        return replace(pick(page), cache=reader_cache)

    return make
