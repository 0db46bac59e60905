"""Who did what, and one way to print a number: ``fedtune studies`` has an owner column (the
member whose token submitted each study), and ``fedtune status`` prints the best value and its
parameters with the formatter ``fedtune trials`` uses (``fedtune.cli.common.figure``, four
significant digits) instead of Python's 16-digit repr (the real app, in-process)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import yaml
from fastapi.testclient import TestClient

from fedtune.cli import main, remote
from fedtune.cli.common import figure
from fedtune.client import Client
from fedtune.client_settings import setting
from fedtune.service import identity
from fedtune.service.api import create_app
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState

from .conftest import TOKEN
from .helpers import tiny_spec

VALUE = 0.123456789012345  # a best value with more digits than any output shows
RATE = 0.000987654321


@pytest.fixture
def world(make_settings, fake_backend, monkeypatch) -> Iterator[tuple[TestClient, dict]]:
    app = create_app(make_settings(api_token=TOKEN), backend=fake_backend, schedule=False)
    with TestClient(app) as tc:
        tokens = {}
        with tc.app.state.runtime.db.session() as s:
            identity.create_project(s, "lab")
            for user in ("alice", "bob"):
                identity.create_user(s, user)
                identity.add_member(s, user, "lab")
                tokens[user] = identity.issue_token(s, user).secret
        monkeypatch.setattr(
            remote,
            "_client",
            lambda args: Client(
                args.url,
                token=setting("token").resolve(args.token),
                transport=tc._transport,
                retries=0,
            ),
        )
        yield tc, tokens


def _submit(tmp_path, name: str, token: str, capsys) -> str:
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(tiny_spec(name=name, project="lab")))
    assert main(["submit", str(path), "--token", token]) == 0
    return capsys.readouterr().out.strip()


def test_studies_shows_each_studys_owner(world, tmp_path, capsys) -> None:
    _, tokens = world
    ids = {user: _submit(tmp_path, f"by-{user}", tokens[user], capsys) for user in tokens}
    assert main(["studies", "--token", tokens["alice"]]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["id", "state", "project", "owner", "created", "(UTC)", "name"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    for user, sid in ids.items():
        assert rows[sid][1:4] == ["queued", "lab", user]
        assert rows[sid][-1] == f"by-{user}"
    assert main(["studies", "--json", "--token", tokens["bob"]]) == 0  # the API carries it
    listed = yaml.safe_load(capsys.readouterr().out)["items"]
    assert {s["id"]: s["owner"] for s in listed} == {ids["alice"]: "alice", ids["bob"]: "bob"}


def test_status_and_trials_print_the_best_value_alike(world, tmp_path, capsys) -> None:
    tc, tokens = world
    sid = _submit(tmp_path, "digits", tokens["alice"], capsys)
    with tc.app.state.runtime.db.session() as s:
        repo = Repository(s)
        repo.transition(sid, StudyState.RUNNING)
        repo.start_trial(sid, 0, {"hparams.client_lr": RATE, "hparams.local_steps": 3})
        repo.finish_trial(sid, 0, TrialState.COMPLETED, VALUE, "completed")
    assert main(["status", sid, "--token", tokens["alice"]]) == 0
    best = next(ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("best"))
    assert best.split(None, 1)[1] == (
        f"{figure(VALUE)} (trial 0) hparams.client_lr={figure(RATE)} hparams.local_steps=3"
    )
    assert repr(VALUE) not in best and figure(VALUE) == "0.1235"
    assert main(["trials", sid, "--token", tokens["alice"]]) == 0
    row = capsys.readouterr().out.splitlines()[1].split()
    assert row[3] == figure(VALUE)  # the value column: the same figure as status's best
    assert f"hparams.client_lr={figure(RATE)}" in row
