"""Headless Chromium logs into the MLflow UI as each user and sees only its projects' experiments.

A real ``fedtune mlflow-server`` (``mlflow server --enable-workspaces --app-name fedtune``, the one
``tests/integration/test_mlflow_tenancy.py`` starts) with two projects and three users synced by
:class:`~fedtune.service.mlflow_tenancy.MlflowTenancy`: ``ana`` (member of team-a), ``vic``
(viewer of team-a), ``bob`` (member of team-b). The UI is a single-page app whose requests are
relative ``fetch`` calls, so credentials in the URL do not reach them; Chromium is driven over
the DevTools protocol instead and sends the user's basic-auth header with every request
(``Network.setExtraHTTPHeaders``), as the browser does once a person typed the login into its
prompt. The UI's workspace is the ``workspace`` parameter of its route.
"""

from __future__ import annotations

import json
import time
import urllib.parse
import urllib.request
from collections.abc import Iterator

import httpx
import pytest

from fedtune.service.mlflow_tenancy import MlflowTenancy
from tests.chromium import CHROMIUM, Contexts, browser_contexts, evaluate
from tests.integration.conftest import stop_group
from tests.integration.test_mlflow_tenancy import ADMIN_PASSWORD, start_server
from tests.needs import need

#: the experiments list page as it is now: its route, title, the text, its rows' names, whether
#: it shows the empty-state prompt, and whether rows are still loading (skeleton rows are
#: ``aria-busy``; meanwhile the table's header is already there, and so is the login)
STATE = """JSON.stringify({
    hash: location.hash,
    title: document.title,
    text: document.body ? document.body.innerText : "",
    names: Array.from(
        document.querySelectorAll('[data-testid="experiment-list-item-link"]'),
        (link) => link.innerText.trim(),
    ),
    empty: document.querySelector(
        '[data-testid="create-experiment-table-empty-state-button"]') !== null,
    busy: document.querySelector('[aria-busy="true"]') !== null,
})"""
#: the title of the experiments list (the home page, whose recent-experiments table has the same
#: header, is "Home - MLflow")
TITLE = "Experiments - MLflow"
ROLES = {"ana": {"team-a": "member"}, "vic": {"team-a": "viewer"}, "bob": {"team-b": "member"}}


def on_route(state: dict, workspace: str) -> bool:
    """Whether the page's route is the experiments list of ``workspace``.

    Args:
        state: What :data:`STATE` read.
        workspace: The workspace asked for.

    Returns:
        Whether ``location.hash`` is ``#/experiments?workspace=<workspace>``.
    """
    route = urllib.parse.urlsplit(state["hash"].removeprefix("#"))
    named = urllib.parse.parse_qs(route.query).get("workspace")
    return route.path == "/experiments" and named == [workspace]


def experiments_text(
    base: str,
    workspace: str,
    user: str,
    password: str,
    browser: Contexts,
    sees: str | None,
    timeout: float = 60,
) -> str:
    """The text of the experiments list of ``workspace`` in Chromium logged in as ``user``.

    It waits until the page is that list (the app navigated elsewhere: it is navigated there
    again), shows the login, and has its rows or its empty-state prompt in, no row still loading;
    and, when ``sees`` is given, until a row is named ``sees`` (rows come in asynchronously).

    Args:
        base: The UI's base URL.
        workspace: The workspace to list.
        user: The MLflow user.
        password: Its password.
        browser: The Chromium; the page opens in a browser context of its own.
        sees: An experiment name to wait for, or None.
        timeout: Seconds to wait.

    Returns:
        ``document.body.innerText`` of the list; at the timeout, that of a loaded list without a
        row named ``sees``.

    Raises:
        AssertionError: No loaded list of ``workspace`` as ``user`` by the timeout.
    """
    url = f"{base}/#/experiments?{urllib.parse.urlencode({'workspace': workspace})}"
    with browser.logged_in(user, password) as call:
        call("Page.navigate", url=url)
        state, loaded, navigations = {}, None, 1
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = evaluate(call, STATE)  # none while a document replaces another
            state = json.loads(value) if isinstance(value, str) else {}
            if state and state["text"] and not on_route(state, workspace):
                call("Page.navigate", url=url)  # the app, drawn, went elsewhere (its home page)
                navigations += 1
            elif (
                state
                and state["title"] == TITLE
                and user in state["text"].splitlines()  # logged in as itself
                and not state["busy"]
                and (state["names"] or state["empty"])  # the list's answer is in
            ):
                loaded = state["text"]
                if sees is None or sees in state["names"]:
                    return loaded
            time.sleep(0.5)
        if loaded is not None:
            return loaded
        seen = {key: shown for key, shown in state.items() if key != "text"}
        raise AssertionError(
            f"{url} as {user}: no loaded experiment list after {timeout} s, "
            f"{navigations} navigations; last page {seen}:\n{state.get('text', '')}"
        )


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Contexts]:
    """One headless Chromium for the module; each page a browser context of its own (its own
    cookies, storage and cache, as a fresh profile), so a launch (~1 CPU-s) is not paid per
    page."""
    need("chromium", None if CHROMIUM.is_file() else f"{CHROMIUM} is not installed")
    pytest.importorskip("websockets.sync.client")
    with browser_contexts(tmp_path_factory.mktemp("chromium")) as contexts:
        yield contexts


@pytest.fixture(scope="module")
def ui(tmp_path_factory) -> Iterator[dict]:
    need("chromium", None if CHROMIUM.is_file() else f"{CHROMIUM} is not installed")
    pytest.importorskip("websockets.sync.client")
    proc = None
    for attempt in (1, 2):  # one retry of a failed start
        try:
            proc, url = start_server(tmp_path_factory.mktemp(f"mlflow-ui-{attempt}"))
            break
        except (RuntimeError, TimeoutError):
            if attempt == 2:
                raise
    try:
        tenancy = MlflowTenancy(url, "admin", ADMIN_PASSWORD)
        tenancy.sync(["team-a", "team-b"], ROLES)
        passwords = {name: tenancy.issue_password(name) for name in ROLES}
        runs = {}
        for project in ("team-a", "team-b"):  # each study's driver logs its experiment
            env = tenancy.driver_env(project)
            auth = (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
            made = httpx.post(
                f"{url}/api/2.0/mlflow/experiments/create",
                json={"name": f"study-{project}"},
                auth=auth,
                headers={"X-MLFLOW-WORKSPACE": project},
                timeout=30,
            )
            assert made.status_code == 200, made.text
            run = httpx.post(
                f"{url}/api/2.0/mlflow/runs/create",
                json={"experiment_id": made.json()["experiment_id"], "run_name": f"run-{project}"},
                auth=auth,
                headers={"X-MLFLOW-WORKSPACE": project},
                timeout=30,
            )
            assert run.status_code == 200, run.text
            runs[project] = (made.json()["experiment_id"], run.json()["run"]["info"]["run_id"])
        yield {"url": url, "passwords": passwords, "runs": runs}
        tenancy.close()
    finally:
        stop_group(proc)


@pytest.mark.parametrize(
    ("user", "workspace", "sees", "hidden"),
    [
        ("ana", "team-a", "study-team-a", "study-team-b"),
        ("vic", "team-a", "study-team-a", "study-team-b"),
        ("bob", "team-b", "study-team-b", "study-team-a"),
        ("bob", "team-a", None, "study-team-a"),  # naming another project's workspace
    ],
)
def test_each_user_sees_only_its_projects_experiments(ui, browser, user, workspace, sees, hidden):
    text = experiments_text(ui["url"], workspace, user, ui["passwords"][user], browser, sees)
    assert user in text.splitlines()  # logged in as itself
    if sees is not None:
        assert sees in text
    assert hidden not in text


def run_page_text(
    url: str, user: str, password: str, browser: Contexts, timeout: float = 60
) -> str:
    """The text Chromium, logged in as ``user``, shows for ``url`` (a run's page) once it has
    drawn the run's name or the workspace picker (or, at the timeout, whatever it shows).

    Args:
        url: The link to open.
        user: The MLflow user.
        password: Its password.
        browser: The Chromium; the page opens in a browser context of its own.
        timeout: Seconds to wait.

    Returns:
        ``document.body.innerText``.
    """
    text = ""
    with browser.logged_in(user, password) as call:
        call("Page.navigate", url=url)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = evaluate(call, "document.body.innerText")
            text = value if isinstance(value, str) else ""
            if "run-team-" in text or "Select workspace" in text:
                return text
            time.sleep(0.5)
    return text


def test_a_run_link_fedtune_hands_out_opens_the_run_for_its_member(ui, browser) -> None:
    """The link ``GET /v1/studies`` and ``compare`` give (``mlflow_urls.run_url``, with the
    run's workspace) opens the run itself for its project's member; without the workspace the
    UI stops at its workspace picker; another project's member never sees the run."""
    from fedtune.tuning.mlflow.urls import run_url

    experiment, run = ui["runs"]["team-a"]
    link = run_url(ui["url"], experiment, run, "team-a")
    text = run_page_text(link, "ana", ui["passwords"]["ana"], browser)
    assert "run-team-a" in text and "Select workspace" not in text, text[:2000]
    bare = run_url(ui["url"], experiment, run)  # the link before it named the workspace
    text = run_page_text(bare, "ana", ui["passwords"]["ana"], browser)
    assert "Select workspace" in text and "run-team-a" not in text, text[:2000]
    text = run_page_text(link, "bob", ui["passwords"]["bob"], browser, timeout=20)
    assert "bob" in text.splitlines() and "run-team-a" not in text, text[:2000]  # "loading"
