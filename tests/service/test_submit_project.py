"""Where a study that names no ``project:`` goes, and the client's ways of naming one.

A member of exactly one project lands in it; a member of several gets a 422 on ``project`` that
lists them; an admin (the bootstrap token, an open service's caller) keeps ``default``. The CLI
takes ``--project``/``$FEDTUNE_PROJECT`` and ``--set``, the SDK ``project=``. Before, every
study without ``project:`` went to ``default`` (``422 no project 'default' that you may submit
to`` for anyone not in it).
"""

from __future__ import annotations

import io
import zipfile
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from fastapi.testclient import TestClient

from fedtune.cli import main, remote
from fedtune.client import Client
from fedtune.errors import ConfigError
from fedtune.service import identity
from fedtune.service.api.app import create_app

from .conftest import TOKEN
from .helpers import FakeBackend, tiny_spec


class Team:
    """Projects p1, p2; solo (member of p1), duo (member of p1 and p2), vic (viewer of p1)."""

    def __init__(self, client: TestClient) -> None:
        self.client = client
        self.tokens: dict[str, str] = {"admin": TOKEN}
        db = client.app.state.runtime.db
        with db.session() as s:
            for project in ("p1", "p2"):
                identity.create_project(s, project)
            for user, roles in (
                ("solo", {"p1": "member"}),
                ("duo", {"p1": "member", "p2": "member"}),
                ("vic", {"p1": "viewer"}),
            ):
                identity.create_user(s, user)
                for project, role in roles.items():
                    identity.add_member(s, user, project, role)
                self.tokens[user] = identity.issue_token(s, user).secret

    def sdk(self, user: str) -> Client:
        return Client(
            "http://testserver",
            token=self.tokens[user],
            transport=self.client._transport,
            retries=0,
        )


@pytest.fixture
def team(make_settings) -> Iterator[Team]:
    settings = make_settings(api_token=TOKEN, allow_code_upload=True)
    with TestClient(create_app(settings, backend=FakeBackend(), schedule=False)) as client:
        yield Team(client)


def _project(sdk: Client, study_id: str) -> str | None:
    return sdk.study(study_id).status().project


def test_a_member_of_one_project_submits_there_without_naming_it(team: Team) -> None:
    with team.sdk("solo") as sdk:
        study = sdk.submit(tiny_spec())
        assert _project(sdk, study.id) == "p1"


def test_a_member_of_several_projects_is_told_which_it_may_name(team: Team) -> None:
    r = team.client.post(
        "/v1/studies", json=tiny_spec(), headers={"Authorization": f"Bearer {team.tokens['duo']}"}
    )
    assert r.status_code == 422
    error = r.json()["error"]
    assert error["field"] == "project"
    assert "p1, p2" in error["message"] and "default" not in error["message"]
    with team.sdk("duo") as sdk:
        assert _project(sdk, sdk.submit(tiny_spec(), project="p2").id) == "p2"
        assert _project(sdk, sdk.submit(tiny_spec(project="p1")).id) == "p1"


def test_a_caller_who_may_submit_nowhere_gets_a_422_on_project(team: Team) -> None:
    with team.sdk("vic") as sdk, pytest.raises(ConfigError) as err:
        sdk.submit(tiny_spec())
    assert err.value.field == "project" and "no project" in str(err.value)


def test_the_admin_and_an_open_service_keep_the_default_project(
    team: Team, make_settings, tmp_path
) -> None:
    with team.sdk("admin") as sdk:
        assert _project(sdk, sdk.submit(tiny_spec()).id) == "default"
    open_settings = make_settings(database_url=f"sqlite:///{tmp_path / 'open.db'}")
    with TestClient(create_app(open_settings, backend=FakeBackend(), schedule=False)) as client:
        sdk = Client("http://testserver", transport=client._transport, retries=0)
        assert _project(sdk, sdk.submit(tiny_spec()).id) == "default"


def _zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        archive.writestr("solo_lab/__init__.py", "")
    return buffer.getvalue()


def test_code_uploaded_without_a_project_belongs_to_the_callers_only_one(team: Team) -> None:
    headers = {"Authorization": f"Bearer {team.tokens['solo']}", "Content-Type": "application/zip"}
    up = team.client.post("/v1/code", content=_zip(), headers=headers)
    assert up.status_code == 201, up.text
    duo = team.client.post(
        "/v1/code",
        content=_zip(),
        headers={**headers, "Authorization": f"Bearer {team.tokens['duo']}"},
    )
    assert duo.status_code == 422 and duo.json()["error"]["field"] == "project"


@pytest.fixture
def cli_as(team: Team, monkeypatch) -> Any:
    """``fedtune`` verbs against the team's service, as a user."""

    def as_user(user: str) -> None:
        monkeypatch.setattr(remote, "_client", lambda args: team.sdk(user))

    return as_user


def test_cli_project_option_and_variable(team: Team, cli_as, tmp_path, capsys, monkeypatch) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tiny_spec()))
    cli_as("duo")
    assert main(["submit", str(path)]) == 2
    assert "p1, p2" in capsys.readouterr().err
    assert main(["submit", str(path), "--project", "p2"]) == 0
    sid = capsys.readouterr().out.strip()
    monkeypatch.setenv("FEDTUNE_PROJECT", "p1")
    assert main(["submit", str(path)]) == 0
    sid_env = capsys.readouterr().out.strip()
    with team.sdk("duo") as sdk:
        assert (_project(sdk, sid), _project(sdk, sid_env)) == ("p2", "p1")
    # the file's project: wins over the variable, --project over the file
    path.write_text(yaml.safe_dump(tiny_spec(project="p2")))
    assert main(["submit", str(path)]) == 0
    in_file = capsys.readouterr().out.strip()
    assert main(["submit", str(path), "--project", "p1"]) == 0
    flag = capsys.readouterr().out.strip()
    with team.sdk("duo") as sdk:
        assert (_project(sdk, in_file), _project(sdk, flag)) == ("p2", "p1")
    # a listing filter too: $FEDTUNE_PROJECT is p1
    assert main(["studies", "--json"]) == 0
    listed = {s["project"] for s in yaml.safe_load(capsys.readouterr().out)["items"]}
    assert listed == {"p1"}


def test_cli_submit_set_overrides_before_validation(team: Team, cli_as, tmp_path, capsys) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tiny_spec(trials=2)))
    cli_as("solo")
    assert main(["submit", str(path), "--set", "budget.trials=3", "--set", "name=renamed"]) == 0
    sid = capsys.readouterr().out.strip()
    with team.sdk("solo") as sdk:
        status = sdk.study(sid).status()
    assert (status.name, status.progress.requested) == ("renamed", 3)
    assert main(["submit", str(path), "--set", "budget.trials=0"]) == 2
    assert "budget.trials" in capsys.readouterr().err
    assert main(["submit", str(path), "--set", "name.first=x"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "name: must be a mapping to set name.first" in err, err
