"""The SDK (``fedtune.client``) against the real app in-process, through an injected transport."""

from __future__ import annotations

import io
from collections.abc import Iterator

import httpx
import pytest
import yaml
from fastapi.testclient import TestClient

from fedtune import wire_models
from fedtune.client import Client, StudyStatus, TrialInfo
from fedtune.errors import ConfigError
from fedtune.service.api import create_app
from fedtune.service.errors import (
    DatabaseUnavailableError,
    IllegalStateChangeError,
    InvalidTokenError,
    ServiceUnreachableError,
    StudyNotFoundError,
    UnauthorizedError,
)
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState
from fedtune.tuning.spec import StudySpec

from .conftest import TOKEN
from .helpers import tiny_spec


class Flaky(httpx.BaseTransport):
    """Forwards to the app; loses the first ``lose`` answers (after the app handled them) and
    answers 503 to the next ``unavailable`` requests without forwarding them."""

    def __init__(self, inner: httpx.BaseTransport, lose: int = 0, unavailable: int = 0) -> None:
        self.inner, self.lose, self.unavailable = inner, lose, unavailable
        self.calls = 0

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        self.calls += 1
        if self.unavailable:
            self.unavailable -= 1
            return httpx.Response(
                503,
                json={"error": {"code": "database_unavailable", "message": "down", "field": None}},
            )
        response = self.inner.handle_request(request)
        if self.lose:
            self.lose -= 1
            response.read()
            raise httpx.ReadError("connection reset by peer")
        return response


@pytest.fixture
def app_client(make_settings, fake_backend) -> Iterator[TestClient]:
    app = create_app(make_settings(api_token=TOKEN), backend=fake_backend, schedule=False)
    with TestClient(app) as tc:
        yield tc


@pytest.fixture
def sleeps() -> list[float]:
    return []


def _sdk(tc: TestClient, sleeps: list[float], token: str | None = TOKEN, **kw) -> Client:
    transport = kw.pop("transport", tc._transport)
    return Client("http://testserver", token=token, transport=transport, sleep=sleeps.append, **kw)


def test_submit_status_and_list(app_client: TestClient, sleeps, tmp_path) -> None:
    with _sdk(app_client, sleeps) as sdk:
        study = sdk.submit(tiny_spec(trials=3))
        status = study.status()
        assert isinstance(status, StudyStatus) and status.state == StudyState.QUEUED
        assert status.progress.requested == 3 and status.best is None and not status.done
        path = tmp_path / "study.yaml"
        path.write_text(yaml.safe_dump(tiny_spec(name="from-file")))
        assert sdk.submit(path).status().name == "from-file"
        typed = StudySpec.from_dict(tiny_spec(name="typed"))
        assert sdk.submit(typed).status().name == "typed"
        names = [s.name for s in sdk.studies(state="queued")]
        assert names == ["typed", "from-file", "tiny"]
        algorithms = sdk.algorithms()
        assert all(isinstance(a, wire_models.AlgorithmOut) for a in algorithms)
        assert "fedavg" in {a.name for a in algorithms}
        assert "quadratic" in {t.name for t in sdk.tasks()}
        spaces = sdk.search_spaces()
        assert spaces and all(isinstance(s, wire_models.SearchSpaceOut) for s in spaces)
    assert sleeps == []


def test_typed_exceptions(app_client: TestClient, sleeps, tmp_path) -> None:
    with _sdk(app_client, sleeps) as sdk:
        with pytest.raises(ConfigError) as err:
            sdk.submit(tiny_spec() | {"budget": {"trials": 0}})
        assert err.value.field == "budget.trials" and err.value.status == 422
        with pytest.raises(StudyNotFoundError):
            sdk.study("0123456789ab").status()
        with pytest.raises(ConfigError, match="cannot read"):
            sdk.submit(tmp_path / "missing.yaml")
        study = sdk.submit(tiny_spec())
        db = app_client.app.state.runtime.db
        with db.session() as s:
            Repository(s).transition(study.id, StudyState.RUNNING)
            Repository(s).transition(study.id, StudyState.SUCCEEDED)
        with pytest.raises(IllegalStateChangeError):
            study.cancel()
    with pytest.raises(UnauthorizedError), _sdk(app_client, sleeps, token=None) as anonymous:
        anonymous.studies()
    with pytest.raises(InvalidTokenError), _sdk(app_client, sleeps, token="x" * 20) as wrong:
        wrong.studies()  # a token that authenticates nobody: 401 invalid_token
    assert sleeps == []  # 4xx answers are never retried


def test_a_retried_submission_creates_one_study(app_client: TestClient, sleeps) -> None:
    flaky = Flaky(app_client._transport, lose=2)
    with _sdk(app_client, sleeps, transport=flaky, backoff_s=0.25) as sdk:
        study = sdk.submit(tiny_spec())
        assert flaky.calls == 3 and sleeps == [0.25, 0.5]
        assert [s.id for s in sdk.studies()] == [study.id]


def test_retries_on_503_then_gives_up(app_client: TestClient, sleeps) -> None:
    flaky = Flaky(app_client._transport, unavailable=2)
    with _sdk(app_client, sleeps, transport=flaky) as sdk:
        assert sdk.studies() == [] and flaky.calls == 3
        flaky.unavailable = 10
        with pytest.raises(DatabaseUnavailableError):  # the service's own answer, typed
            sdk.studies()
        assert flaky.calls == 3 + 5


def test_unreachable_service(sleeps) -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused")

    sdk = Client(
        "http://127.0.0.1:9", transport=httpx.MockTransport(refuse), retries=2, sleep=sleeps.append
    )
    with pytest.raises(ServiceUnreachableError):
        sdk.studies()
    assert sleeps == [0.5, 1.0]


def test_wait_progress_trials_curve_tradeoff_best(app_client: TestClient, sleeps) -> None:
    with _sdk(app_client, sleeps) as sdk:
        study = sdk.submit(tiny_spec(trials=2))
        with pytest.raises(TimeoutError):
            study.wait(timeout=0.05, poll_s=0.01, stream=io.StringIO())
        with app_client.app.state.runtime.db.session() as s:
            repo = Repository(s)
            repo.transition(study.id, StudyState.RUNNING)
            # every trial ran all 4 rounds of tiny_spec (an earlier end would be "stopped")
            for n, losses in {0: [3.0, 2.0, 1.0, 1.0], 1: [2.0, 2.0, 2.0, 2.0]}.items():
                repo.start_trial(study.id, n, {"hparams.client_lr": 0.1 * (n + 1)})
                for r, loss in enumerate(losses, 1):
                    repo.record_round(study.id, n, r, {"client_loss": loss})
                repo.finish_trial(study.id, n, TrialState.COMPLETED, losses[-1], "completed")
            repo.transition(study.id, StudyState.SUCCEEDED, best_trial=0, best_value=1.0)
        stream = io.StringIO()
        final = study.wait(stream=stream, poll_s=0.01)
        assert final.state == StudyState.SUCCEEDED and final.done
        assert (
            "2/2 trials finished" in stream.getvalue() and "best 1 (trial 0)" in stream.getvalue()
        )
        trials = study.trials()
        assert all(isinstance(t, TrialInfo) for t in trials)
        assert [(t.number, t.state, t.value) for t in trials] == [
            (0, TrialState.COMPLETED, 1.0),
            (1, TrialState.COMPLETED, 2.0),
        ]
        assert [p.metrics["client_loss"] for p in study.curve(0)] == [3.0, 2.0, 1.0, 1.0]
        best = study.best()
        assert best is not None and (best.number, best.value) == (0, 1.0)
        tradeoff = study.tradeoff()
        assert tradeoff.metric == "client_loss" and tradeoff.pareto[0] == 0
        assert study.frontier() == tradeoff
