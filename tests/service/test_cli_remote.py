"""``fedtune submit | status | wait | cancel | trials | tradeoff`` through the SDK (in-process)."""

from __future__ import annotations

import json

import pytest
import yaml
from fastapi.testclient import TestClient

from fedtune.cli import main, remote
from fedtune.client import Client
from fedtune.service.api import create_app
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState

from .helpers import tiny_spec


@pytest.fixture
def app_client(make_settings, fake_backend, monkeypatch):
    app = create_app(make_settings(), backend=fake_backend, schedule=False)
    with TestClient(app) as tc:
        monkeypatch.setattr(
            remote,
            "_client",
            lambda args: Client(args.url, transport=tc._transport, retries=0),
        )
        yield tc


def test_remote_verbs(app_client: TestClient, tmp_path, capsys) -> None:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(tiny_spec(trials=2)))
    assert main(["submit", str(path)]) == 0
    sid = capsys.readouterr().out.strip()
    assert len(sid) == 12

    with app_client.app.state.runtime.db.session() as s:
        repo = Repository(s)
        repo.transition(sid, StudyState.RUNNING)
        for n in range(2):
            repo.start_trial(sid, n, {"hparams.client_lr": 0.5 / (n + 1)})
            for r, loss in enumerate([2.0, 1.0 + n], 1):
                repo.record_round(sid, n, r, {"client_loss": loss})
            repo.finish_trial(sid, n, TrialState.COMPLETED, 1.0 + n, ("completed", "diverged")[n])

    assert main(["status", sid]) == 0
    out = capsys.readouterr().out
    assert "running" in out and "2/2 finished" in out and "best" in out

    assert main(["trials", sid, "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert [(r["number"], r["value"]) for r in rows] == [(0, 1.0), (1, 2.0)]
    assert main(["trials", sid]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert "outcome" in lines[0] and "hparams.client_lr=0.5" in lines[1]
    assert lines[1].split()[2] == "completed" and lines[2].split()[2] == "diverged"

    assert main(["tradeoff", sid]) == 0
    assert "Pareto set" in capsys.readouterr().out

    assert main(["wait", sid, "--timeout", "0.01", "--quiet"]) == remote.EXIT_TIMEOUT
    capsys.readouterr()
    assert main(["cancel", sid]) == 0
    assert capsys.readouterr().out.strip() == f"{sid} cancelled"
    assert main(["wait", sid, "--quiet"]) == 1  # cancelled: not a success


def test_errors_are_one_line_with_exit_codes(app_client: TestClient, tmp_path, capsys) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(tiny_spec() | {"budget": {"trials": 0}}))
    assert main(["submit", str(bad)]) == 2
    assert "budget.trials" in capsys.readouterr().err
    assert main(["status", "0123456789ab"]) == 1
    assert "no study" in capsys.readouterr().err
