"""A misspelt searched parameter or key through the API (422) and ``fedtune submit --set``:
the same "did you mean ...?" as a local ``fedtune tune`` (``tests/unit/test_suggestions.py``)."""

from __future__ import annotations

import pytest
import yaml
from fastapi.testclient import TestClient

from fedtune.cli import main, remote
from fedtune.client import Client
from fedtune.service.api import create_app

from .helpers import tiny_spec


@pytest.fixture
def app_client(make_settings, fake_backend, monkeypatch):
    app = create_app(make_settings(), backend=fake_backend, schedule=False)
    with TestClient(app) as tc:
        monkeypatch.setattr(
            remote, "_client", lambda args: Client(args.url, transport=tc._transport, retries=0)
        )
        yield tc


def test_the_api_answers_422_with_the_spaces_parameters(app_client: TestClient) -> None:
    spec = tiny_spec()
    spec["search"]["override"]["clinet_lr"] = {"high": 0.05}
    r = app_client.post("/v1/studies", json=spec)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "search.override.clinet_lr"
    assert error["message"].startswith(
        "not a parameter of the space 'fedavg' (did you mean client_lr?); its parameters: "
        "client_lr, "
    )
    r = app_client.post("/v1/studies", json={**tiny_spec(), "budget": {"trails": 2}})
    assert r.status_code == 422 and r.json()["error"]["field"] == "budget.trails"
    assert r.json()["error"]["message"].startswith("unknown key; did you mean trials? (known: ")


def test_fedtune_submit_set_says_it_in_one_line(app_client: TestClient, tmp_path, capsys) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tiny_spec()))
    code = main(["submit", str(path), "--set", "search.override.clinet_lr.high=0.05"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1, lines
    assert lines[0].startswith(
        "fedtune: error: search.override.clinet_lr: not a parameter of the space 'fedavg' "
        "(did you mean client_lr?); its parameters: client_lr, "
    )
    assert app_client.get("/v1/studies").json()["items"] == []  # nothing was queued
