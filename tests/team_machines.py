"""The team's two machines as a test drives them: a terminal on each (tests/team_shell.py), the
member's browser on the laptop (tests/team_browser.py), and what a member and a member of
another project see of a study in MLflow.

The box runs the development venv (``fedtune[all]``; ``PYTHONPATH`` names the checkout under
test); the laptop only the light install (:attr:`Team.light`); neither inherits fedtune's,
MLflow's or Ray's variables from the test process. The box's terminal has its own nginx
folders (:data:`NGINX_DIRS`: bind mounts of the test's folders in a mount namespace of its own),
so ``cp … /etc/nginx/conf.d/`` and ``nginx -s reload`` act on the box's copy of Debian's
configuration, not this machine's.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from tests.needs import REPO_ROOT
from tests.team_net import TeamNet
from tests.team_shell import Shell, close_input
from tests.tls_ca import TestTls

__all__ = [
    "NGINX_DIRS",
    "Browser",
    "Chromium",
    "Team",
    "box_env",
    "box_shell",
    "browse",
    "laptop_shell",
    "member_sees_the_study",
    "other_member_sees_none",
    "printed_link",
    "runs_list",
    "shown",
]

DEV_BIN = Path(sys.executable).parent
#: what no terminal inherits from the test process (as tests/docs/conftest.py)
DROPPED = ("FEDTUNE_", "MLFLOW_", "RAY_", "VIRTUAL_ENV", "PYTHONPATH", "KUBECONFIG")
#: the folders of the box's own nginx, bind-mounted in its terminal's mount namespace
NGINX_DIRS = ("/etc/nginx", "/var/log/nginx", "/var/lib/nginx", "/run")


@dataclass
class Team:
    """The two machines and what the test made for them.

    Attributes:
        net: the namespaces and the processes started in them.
        root: the test's folder (logs, terminals, screenshots and page reports).
        tls: the CA and the proxy's certificate.
        light: the light install's venv (None: the laptop runs no client).
    """

    net: TeamNet
    root: Path
    tls: TestTls
    light: Path | None = None
    chromium: Chromium | None = None

    def browser(self) -> Chromium:
        """The laptop's one Chromium, started on first use (:class:`Chromium`), again after
        ``net.stop_all()`` ended it."""
        if self.chromium is not None and self.chromium.proc.poll() is not None:
            self.close()
        if self.chromium is None:
            self.chromium = Chromium(self)
        return self.chromium

    def close(self) -> None:
        """End the laptop's Chromium, if one was started."""
        if self.chromium is not None:
            self.chromium.close()
            self.chromium = None


# ---- the machines' terminals -------------------------------------------------------------
def machine_env(home: Path, path: list[Path], **extra: str) -> dict[str, str]:
    """A terminal's variables: this process's without fedtune's, MLflow's and Ray's, a home of
    its own, ``path`` first on ``PATH`` (the development venv only where it is named)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(DROPPED)}
    system = [p for p in env.get("PATH", "").split(os.pathsep) if p and Path(p) != DEV_BIN]
    home.mkdir(parents=True, exist_ok=True)
    env.update(
        PATH=os.pathsep.join([*map(str, path), *system]),
        HOME=str(home),
        XDG_CACHE_HOME=str(home / ".cache"),
        NO_COLOR="1",
        PYTHONDONTWRITEBYTECODE="1",
    )
    return env | extra


def box_env(team: Team, name: str) -> dict[str, str]:
    """The box: the development venv (``fedtune[all]``); PYTHONPATH names the checkout under
    test, which selects the code, not the tools."""
    return machine_env(team.root / f"{name}-home", [DEV_BIN], PYTHONPATH=str(REPO_ROOT))


def laptop_env(team: Team, name: str) -> dict[str, str]:
    """The laptop: only the light install on ``PATH``."""
    return machine_env(team.root / f"{name}-home", [team.light / "bin"] if team.light else [])


def box_nginx(team: Team, name: str) -> list[Path]:
    """The box's own nginx folders (:data:`NGINX_DIRS`): Debian's configuration as installed,
    the test's certificate in ``tls/``, empty log, state and run folders."""
    made = [team.root / f"{name}-nginx{d.replace('/', '-')}" for d in NGINX_DIRS]
    shutil.copytree("/etc/nginx", made[0], symlinks=True)
    (made[0] / "tls").mkdir()
    shutil.copy(team.tls.cert, made[0] / "tls" / "box.pem")
    shutil.copy(team.tls.key, made[0] / "tls" / "box.key")
    for folder in made[1:]:
        folder.mkdir()
    return made


def box_shell(team: Team, name: str, cwd: Path, page: str = "") -> Shell:
    """The operator's terminal on the box, in a mount namespace where :data:`NGINX_DIRS` are the
    box's own (:func:`box_nginx`)."""
    mounts = " && ".join(f'mount --bind "${n + 1}" {d}' for n, d in enumerate(NGINX_DIRS))
    argv = team.net.argv(
        "box",
        [
            "unshare",
            "--mount",
            "--propagation",
            "private",
            "sh",
            "-c",
            f"{mounts} && exec bash --noprofile --norc -s",
            "sh",
            *box_nginx(team, name),
        ],
    )
    return Shell(argv, box_env(team, name), cwd, team.root / f"{name}-box-shell", page)


def laptop_shell(team: Team, name: str, cwd: Path, page: str = "") -> Shell:
    """The member's terminal on the laptop (``page``: the page whose blocks it runs)."""
    argv = team.net.argv("laptop", ["bash", "--noprofile", "--norc", "-s"])
    return Shell(argv, laptop_env(team, name), cwd, team.root / f"{name}-laptop-shell", page)


# ---- the member's browser -------------------------------------------------------------------
class Chromium:
    """The laptop's Chromium (tests/team_browser.py): one browser for every member the test
    lets browse, each :class:`Browser` a browser context of its own in it.

    Args:
        team: the team (its profile ``<root>/chromium``, its log ``<root>/chromium.log``).
    """

    def __init__(self, team: Team) -> None:
        session = {
            "profile": str(team.root / "chromium"),
            "flags": [f"--ignore-certificate-errors-spki-list={team.tls.spki}"],
        }
        self.log_path = team.root / "chromium.log"
        env = laptop_env(team, "chromium") | {"PYTHONPATH": str(REPO_ROOT)}
        argv = [sys.executable, "-m", "tests.team_browser", json.dumps(session)]
        with self.log_path.open("a") as log:
            self.proc = subprocess.Popen(
                team.net.argv("laptop", argv),
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
                start_new_session=True,
            )

    def ask(self, asked: dict, timeout: float) -> dict:
        """Send one line to the browser; its answer (a JSON line)."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write(json.dumps(asked) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        line = self.proc.stdout.readline() if ready else ""
        assert line.strip(), self.log_path.read_text(errors="replace")[-3000:]
        return json.loads(line)

    def close(self) -> None:
        """End the browser (end of its input), SIGKILL to its group after 30 s."""

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)

        close_input(self.proc, kill)
        assert self.proc.stdout is not None
        self.proc.stdout.close()


class Browser:
    """A member's browser on the laptop, logged in as ``login``: a browser context of its own
    (its own cookies, storage, cache, as a separate profile) in the laptop's Chromium
    (:meth:`Team.browser`), for the pages a person opens one after the other, each page a new
    document.

    Args:
        team: the team.
        name: the member's visit (the pages' reports are named by :meth:`look`).
        login: the MLflow login it sends.
    """

    def __init__(self, team: Team, name: str, login: tuple[str, str]) -> None:
        self.team = team
        self.name = name
        self.chromium = team.browser()
        self.context = self.chromium.ask({"login": list(login)}, 120)["context"]

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def look(
        self,
        name: str,
        url: str,
        until: list[str],
        timeout: float = 90,
        answered: tuple[str, ...] = (),
    ) -> dict:
        """Open ``url`` and wait until it shows ``until`` and MLflow answered the page's
        ``answered`` requests (tests/team_browser.py); what it showed, kept in
        ``<root>/<name>.json`` beside its screenshot ``<root>/<name>.png``."""
        page = {
            "url": url,
            "screenshot": str(self.team.root / f"{name}.png"),
            "until": until,
            "answered": list(answered),
            "timeout": timeout,
        }
        shown = self.chromium.ask(page, timeout + 120)
        (self.team.root / f"{name}.json").write_text(json.dumps(shown))  # beside the screenshot
        return shown

    def close(self) -> None:
        """Close the member's browser context (its pages, cookies and storage)."""
        assert self.chromium.ask({"end": True}, 60) == {"ended": self.context}


def browse(
    team: Team,
    name: str,
    url: str,
    login: tuple[str, str],
    until: list[str],
    timeout: float = 90,
    answered: tuple[str, ...] = (),
) -> dict:
    """Open ``url`` in a browser context of its own on the laptop, logged in as ``login``
    (:class:`Browser`, :meth:`Browser.look`); what it showed, kept in ``<root>/<name>.json``
    beside its screenshot ``<root>/<name>.png``."""
    with Browser(team, name, login) as browser:
        return browser.look(name, url, until, timeout, answered)


def runs_list(link: str) -> str:
    """The experiment's runs list of a run's link (same server, route and query but the run)."""
    base, _, route = link.partition("#")
    path, _, query = route.partition("?")
    experiment = path.split("/runs/")[0]
    return f"{base}#{experiment}/runs?{query}"


def printed_link(printed: str) -> str:
    """The ``mlflow`` line's link in ``fedtune status``'s output."""
    found = re.search(r"^mlflow\s+(\S+)", printed, re.M)
    assert found, f"no mlflow line in:\n{printed}"
    return found.group(1)


def shown(page: dict) -> str:
    """A page's report without its answers' bodies, for a failure message."""
    calls = [f"{method} {path} -> {status}" for method, path, status, _ in page["api"]]
    return f"{page['href']}: settled {page['settled']}, errors {page['errors']}\n" + "\n".join(
        [*calls, page["text"][:1500]]
    )


#: the runs search a page's runs (a run's children, an experiment's runs) come from
SEARCH = ("/runs/search",)


def member_sees_the_study(team: Team, name: str, link: str, login: tuple[str, str]) -> str:
    """The member opens ``link``: the run with its two trials under "Child runs", then the
    experiment's runs list with the run and its trials counted; MLflow answered every request of
    both pages (none refused: no "Request error"). Returns the run's (the study's) name."""
    trials = ["trial-0000", "trial-0001"]
    with Browser(team, name, login) as browser:
        page = browser.look(f"{name}-run", link, ["Child runs", *trials], answered=SEARCH)
        study = page["text"].split("\nOverview\n")[0].splitlines()[-1]  # the run's heading
        listed = browser.look(
            f"{name}-runs", runs_list(link), [study, "3 matching runs"], answered=SEARCH
        )
    for seen in (page, listed):
        assert seen["settled"] and not seen["errors"], shown(seen)
        assert all(status == 200 for _, _, status, _ in seen["api"]), shown(seen)
        searched = [body for _, path, _, body in seen["api"] if "/runs/search" in path]
        assert searched and all(t in searched[-1] for t in trials), shown(seen)
    return study


def other_member_sees_none(
    team: Team, name: str, link: str, login: tuple[str, str], study: str
) -> None:
    """Another project's member opens the same link and the runs list: logged in as itself,
    MLflow answered the page's questions about the run and the experiment, and neither the
    pages nor any answer holds the study, its trials or its run."""
    run_id = link.split("/runs/")[1].split("?")[0]
    with Browser(team, name, login) as browser:
        pages = [  # each page once MLflow answered its question: the run, the runs list
            browser.look(f"{name}-{page_name}", url, [login[0]], timeout=60, answered=asked)
            for page_name, url, asked in (
                ("run", link, ("GetRun",)),
                ("runs", runs_list(link), SEARCH),
            )
        ]
    for page in pages:
        assert page["settled"], shown(page)  # drawn, as the member, every answer in
        asked = [
            (path, body)
            for _, path, _, body in page["api"]
            if "mlflowGetRun" in body or "mlflowGetExperiment" in body or "/runs/search" in path
        ]
        assert asked, shown(page)  # the run or the experiment was asked for
        for hidden in (study, "trial-0000", run_id):
            assert hidden not in page["text"], (hidden, shown(page))
            leaked = [path for _, path, _, body in page["api"] if hidden in body]
            assert not leaked, (hidden, leaked)
