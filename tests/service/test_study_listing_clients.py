"""The SDK and the CLI page through the study list (the real app in-process).

``Client.list_studies`` returns one page with its ``next_page_token``; ``Client.iter_studies``
follows the tokens to the end; ``fedtune studies`` prints a page and, when more exist, the
command of the next page (``--page-token``), or every page with ``--all``. Before, the SDK's
only list call took one state and an offset, and the CLI had no list verb at all.
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from fedtune.cli import main, remote
from fedtune.client import Client, StudyPage
from fedtune.errors import ConfigError
from fedtune.service import identity
from fedtune.service.api import create_app
from fedtune.service.models import Study
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState

T0 = dt.datetime(2026, 3, 1, tzinfo=dt.UTC)
STATES = [StudyState.SUCCEEDED, StudyState.QUEUED, StudyState.RUNNING, StudyState.CANCELLED]


@pytest.fixture
def app_client(make_settings, fake_backend, monkeypatch) -> Iterator[TestClient]:
    """23 studies, one a minute, over projects default/lab and four states."""
    app = create_app(make_settings(), backend=fake_backend, schedule=False)
    with TestClient(app) as tc:
        with tc.app.state.runtime.db.session() as s:
            identity.create_project(s, "lab")
            repo = Repository(s)
            for i in range(23):
                repo.add_study(
                    Study(
                        id=f"{i:012x}",
                        name=f"s{i}",
                        state=STATES[i % 4],
                        spec={},
                        algorithm="fedavg",
                        task="quadratic",
                        trials_requested=2,
                        attempts=0,
                        project=("default", "lab")[i % 2],
                        created_at=T0 + dt.timedelta(minutes=i),
                    )
                )
        monkeypatch.setattr(
            remote, "_client", lambda args: Client(args.url, transport=tc._transport, retries=0)
        )
        yield tc


@pytest.fixture
def client(app_client) -> Client:
    return Client("http://testserver", transport=app_client._transport, retries=0)


def test_list_studies_is_one_page_with_the_next_token(client) -> None:
    first = client.list_studies(limit=10)
    assert isinstance(first, StudyPage) and first.total == 23
    assert [s.name for s in first.items] == [f"s{i}" for i in range(22, 12, -1)]
    second = client.list_studies(limit=10, page_token=first.next_page_token)
    assert second.total is None and second.items[0].name == "s12"
    last = client.list_studies(limit=10, page_token=second.next_page_token)
    assert len(last.items) == 3 and last.next_page_token is None


def test_iter_studies_follows_the_tokens_to_the_end(client) -> None:
    oldest_first = [s.name for s in client.iter_studies(order="asc", page_size=4)]
    assert oldest_first == [f"s{i}" for i in range(23)]
    live = list(client.iter_studies(["queued", StudyState.RUNNING], project="lab", page_size=2))
    expected = [i for i in range(22, -1, -1) if i % 2 == 1 and STATES[i % 4] in STATES[1:3]]
    assert [s.name for s in live] == [f"s{i}" for i in expected]
    with pytest.raises(ConfigError, match="sleeping"):
        client.list_studies("sleeping")


def test_the_cli_prints_a_page_and_the_next_pages_command(app_client, capsys) -> None:
    assert main(["studies", "--limit", "5"]) == 0
    out, err = capsys.readouterr()
    rows = out.splitlines()
    assert rows[0].split()[:3] == ["id", "state", "project"]
    assert [r.split()[-1] for r in rows[1:]] == ["s22", "s21", "s20", "s19", "s18"]
    assert err.startswith("more studies: fedtune studies --limit 5 --page-token ")
    token = err.split("--page-token ")[1].strip()

    assert main(["studies", "--limit", "5", "--page-token", token]) == 0
    out, _ = capsys.readouterr()
    assert [r.split()[-1] for r in out.splitlines()[1:]] == ["s17", "s16", "s15", "s14", "s13"]


def test_the_cli_lists_everything_with_all_and_filters(app_client, capsys) -> None:
    assert (
        main(
            [
                "studies",
                "--all",
                "--limit",
                "2",
                "--state",
                "queued,running",
                "--state",
                "cancelled",
                "--order",
                "asc",
                "--json",
            ]
        )
        == 0
    )
    out, err = capsys.readouterr()
    answer = json.loads(out)
    assert [s["name"] for s in answer["items"]] == [f"s{i}" for i in range(23) if i % 4]
    assert answer["next_page_token"] is None and err == ""

    assert main(["studies", "--project", "lab", "--state", "succeeded"]) == 0
    out, err = capsys.readouterr()
    assert [r.split()[-1] for r in out.splitlines()[1:]] == []  # odd ids: never succeeded
    assert err == ""


def test_the_cli_refuses_bad_tokens_and_options(app_client, capsys) -> None:
    assert main(["studies", "--page-token", "garbage"]) == 2
    assert "page_token" in capsys.readouterr().err
    assert main(["studies", "--all", "--page-token", "x"]) == 2
    assert "--page-token" in capsys.readouterr().err
    assert main(["studies", "--state", "sleeping"]) == 2
    assert "sleeping" in capsys.readouterr().err
