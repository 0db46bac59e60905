"""``fedtune users …`` and ``fedtune projects …``: one contract on the database and over the API.

The contract table runs both implementations of ``fedtune.cli.admin_target.Admin`` through the
same checks: ``DatabaseAdmin`` on a database, and the SDK's ``Client`` against the real app
in-process (whose routes call ``DatabaseAdmin`` after their checks). The verbs themselves: where
no database is, they make none and say in one line where they looked (exit 2); over the API they
need neither the database nor the service extra. (Against real servers, from another folder:
``tests/deploy/test_systemd_units.py``.)
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from fedtune import cli
from fedtune.client import Client
from fedtune.errors import ConflictError, InvalidRequestError, NotFoundError
from fedtune.service.admin_db import DatabaseAdmin
from fedtune.service.api import create_app

from .conftest import TOKEN

HOW = (
    "point at the service's with --config FILE (or FEDTUNE_CONFIG), --database-url URL (or "
    "FEDTUNE_DATABASE_URL), or use its API with --url URL --token TOKEN"
)


@pytest.fixture(params=["database", "api"])
def admin(request, sqlite_db, make_settings, fake_backend) -> Iterator:
    settings = make_settings(database_url=sqlite_db.url, api_token=TOKEN)
    if request.param == "database":
        yield DatabaseAdmin(sqlite_db, settings)
        return
    app = create_app(settings, backend=fake_backend, schedule=False)
    with TestClient(app) as tc, Client("http://t", token=TOKEN, transport=tc._transport) as sdk:
        yield sdk


def test_users_and_tokens(admin) -> None:
    admin.create_project("vision")
    issued = admin.create_user("dave", "vision", expires_in_days=2)
    assert (issued.user, issued.token.startswith(f"ftk_{issued.token_id}_")) == ("dave", True)
    assert issued.expires_at is not None
    again = admin.new_token("dave")
    assert again.token_id != issued.token_id and again.expires_at is None
    dave = next(u for u in admin.users() if u.name == "dave")
    assert (dave.admin, dave.projects) == (False, {"vision": "member"})
    assert sorted(t.id for t in dave.tokens) == sorted([issued.token_id, again.token_id])
    assert admin.set_role("dave", "vision", "viewer").role == "viewer"
    assert admin.revoke("dave", issued.token_id) == 1
    assert admin.revoke("dave") == 1
    dave = next(u for u in admin.users() if u.name == "dave")
    assert (dave.projects, dave.tokens) == ({"vision": "viewer"}, [])
    assert admin.create_user("root", admin=True).user == "root"
    assert next(u for u in admin.users() if u.name == "root").admin is True


def test_projects_and_quotas(admin) -> None:
    made = admin.create_project("audio")
    assert (made.name, made.quota.gpus, made.weight) == ("audio", None, 1.0)
    assert "audio" in [p.name for p in admin.projects()]
    changed = admin.set_quota("audio", gpus=2.5, trials=8, weight=2.0)
    assert (changed.quota.gpus, changed.quota.trials, changed.weight) == (2.5, 8, 2.0)
    changed = admin.set_quota("audio", trials=None)  # unlimited again; the rest kept
    assert (changed.quota.gpus, changed.quota.trials) == (2.5, None)
    detail = admin.project("audio")
    assert (detail.usage.gpus, detail.usage.studies.running, detail.quota.gpus) == (0, 0, 2.5)


def test_bad_requests_are_the_same_errors(admin) -> None:
    admin.create_project("vision")
    admin.create_user("dave", "vision")
    with pytest.raises(ConflictError):
        admin.create_user("dave")
    with pytest.raises(ConflictError):
        admin.create_project("vision")
    for call in (lambda: admin.revoke("nobody"), lambda: admin.project("nowhere")):
        with pytest.raises(NotFoundError):
            call()
    with pytest.raises(NotFoundError):
        admin.set_role("dave", "nowhere", "member")
    with pytest.raises(InvalidRequestError):
        admin.set_quota("vision", gpus=-1.0)


# ---------------------------------------------------------------------------- the verbs


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    import os

    for name in list(os.environ):
        if name.startswith(("FEDTUNE_", "MLFLOW_")):
            monkeypatch.delenv(name)
    here = tmp_path / "here"
    here.mkdir()
    monkeypatch.chdir(here)
    return here


@pytest.mark.parametrize(
    "argv, env, where",
    [
        ([], {}, "the default database (./fedtune.db in the working directory)"),
        (["--database-url", "sqlite:///gone.db"], {}, "--database-url"),
        ([], {"FEDTUNE_DATABASE_URL": "sqlite:///gone.db"}, "FEDTUNE_DATABASE_URL"),
        ([], {"FEDTUNE_CONFIG": "../srv/team.toml"}, "../srv/team.toml (its default database)"),
        (["--config", "../srv/team.toml"], {"FEDTUNE_URL": "http://x:1"}, "../srv/team.toml"),
    ],
)
def test_no_database_makes_none_and_says_where_it_looked(
    clean: Path, monkeypatch, capsys, argv, env, where
) -> None:
    (clean.parent / "srv").mkdir()
    (clean.parent / "srv" / "team.toml").write_text('[serve]\nbackend = "none"\n')
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    for verb in (["users", "create", "dave", "--project", "vision"], ["projects", "list"]):
        assert cli.main([*verb, *argv]) == 2
        out = capsys.readouterr()
        assert out.out == ""
        lines = out.err.splitlines()
        assert len(lines) == 1 and lines[0].startswith(f"fedtune: error: {where}"), lines
        assert lines[0].endswith(f": no service database at {_looked(clean, argv, env)}; {HOW}")
    assert not list(clean.iterdir()) and not list((clean.parent / "srv").glob("*.db"))


def _looked(here: Path, argv: list[str], env: dict[str, str]) -> Path:
    if "--database-url" in argv or "FEDTUNE_DATABASE_URL" in env:
        return here / "gone.db"
    if "--config" in argv or "FEDTUNE_CONFIG" in env:
        return here.parent / "srv" / "fedtune.db"
    return here / "fedtune.db"


def test_the_api_and_a_database_together_is_an_error(clean: Path, capsys) -> None:
    argv = ["users", "list", "--url", "http://127.0.0.1:9", "--database-url", "sqlite:///x.db"]
    assert cli.main(argv) == 2
    assert capsys.readouterr().err == (
        "fedtune: error: --url: give --url/--token (the API) or --database-url/--config, not both\n"
    )


def test_over_the_api_the_verbs_need_no_service_extra(clean: Path, monkeypatch, capsys) -> None:
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "sqlalchemy" else real(name, *a),
    )
    assert cli.main(["users", "list"]) == 2  # on the database: the service extra
    assert "needs the service extra (sqlalchemy is not installed)" in capsys.readouterr().err
    monkeypatch.setenv("FEDTUNE_URL", "http://127.0.0.1:9")  # nothing listens on port 9
    monkeypatch.setenv("FEDTUNE_TOKEN", "ftk_0123456789ab_sentinel-secret-0123456789")
    assert cli.main(["users", "list"]) == 1  # went for the API: the service is not there
    err = capsys.readouterr().err
    assert err.startswith("fedtune: error: ") and "extra" not in err
    assert "sentinel-secret" not in err
    assert not list(clean.iterdir())
