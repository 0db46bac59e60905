"""``GET /v1/compare`` and ``Client.compare``: studies compared through the service, each read
with the caller's rights (another project's study: 404, as if it did not exist), studies of a
different task refused (422) unless forced."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient

from fedtune import wire_models as sdk_types
from fedtune.client import Client, Comparison
from fedtune.errors import ConfigError, NotFoundError, StudyNotFoundError
from fedtune.service import identity
from fedtune.service.api import create_app
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState

from .conftest import TOKEN
from .helpers import FakeBackend, tiny_spec


@pytest.fixture
def app(make_settings) -> Iterator[TestClient]:
    settings = make_settings(api_token=TOKEN)
    with TestClient(create_app(settings, backend=FakeBackend(), schedule=False)) as client:
        with client.app.state.runtime.db.session() as s:
            for project in ("p1", "p2"):
                identity.create_project(s, project)
            identity.create_user(s, "mia")
            identity.add_member(s, "mia", "p1", "member")
            client.mia = identity.issue_token(s, "mia").secret
        yield client


def _study(client: TestClient, project: str, losses: list[float], **extra) -> str:
    """A study of ``project`` with one finished trial whose curve is ``losses``."""
    spec = tiny_spec(name=f"s-{project}-{len(losses)}", project=project, **extra)
    r = client.post("/v1/studies", json=spec, headers={"Authorization": f"Bearer {TOKEN}"})
    assert r.status_code == 201, r.text
    sid = r.json()["id"]
    _run(client, sid, losses)
    return sid


def _run(client: TestClient, sid: str, losses: list[float], end: StudyState | None = None) -> None:
    """Give study ``sid`` one finished trial whose curve is ``losses`` (and end it in ``end``)."""
    with client.app.state.runtime.db.session() as s:
        repo = Repository(s)
        repo.transition(sid, StudyState.RUNNING, attempts=1)
        repo.start_trial(sid, 0, {"hparams.client_lr": 0.01})
        for i, loss in enumerate(losses, start=1):
            repo.record_round(sid, 0, i, {"client_loss": loss})
        repo.finish_trial(sid, 0, TrialState.COMPLETED, losses[-1], "completed")
        if end is not None:
            repo.transition(sid, end)


def _sdk(client: TestClient, token: str) -> Client:
    return Client("http://testserver", token=token, transport=client._transport, retries=0)


def test_a_member_compares_the_studies_of_her_project(app: TestClient) -> None:
    a = _study(app, "p1", [4.0, 3.0, 2.0, 1.0])
    b = _study(app, "p1", [4.0, 3.5, 3.0, 2.5, 2.0])
    with _sdk(app, app.mia) as sdk:
        c = sdk.compare([a, b])
    assert isinstance(c, Comparison) and c.comparable
    assert [s["label"] for s in c.studies] == [a, b]
    whole = {r["key"]: r["final_loss"] for r in c.matched if r["budget"] == "whole study"}
    assert whole == {"s-p1-4": pytest.approx(1.5), "s-p1-5": pytest.approx(2.25)}
    trials = [r for r in c.matched if r["budget"] == "equal total rounds"]
    assert {r["amount"] for r in trials} == {4}  # a spent 4 rounds, b 5: matched at 4
    assert [r["key"] for r in trials] == ["s-p1-4"]  # b's only trial does not fit in 4 rounds


def test_a_study_of_another_project_is_not_found(app: TestClient) -> None:
    mine = _study(app, "p1", [4.0, 3.0, 2.0])
    theirs = _study(app, "p2", [4.0, 2.0, 1.0])
    r = app.get(
        "/v1/compare",
        params={"studies": f"{mine},{theirs}"},
        headers={"Authorization": f"Bearer {app.mia}"},
    )
    missing = app.get(
        "/v1/compare",
        params={"studies": f"{mine},0123456789ab"},
        headers={"Authorization": f"Bearer {app.mia}"},
    )
    assert r.status_code == missing.status_code == 404
    assert r.json()["error"]["code"] == "study_not_found"
    assert theirs in r.text and "p2" not in r.text and "s-p2" not in r.text
    with _sdk(app, app.mia) as sdk, pytest.raises(StudyNotFoundError):
        sdk.compare([mine, theirs])
    with _sdk(app, TOKEN) as admin:  # the admin reads both projects
        assert admin.compare([mine, theirs]).comparable


def test_studies_of_another_task_are_refused_unless_forced(app: TestClient) -> None:
    a = _study(app, "p1", [4.0, 3.0, 2.0])
    other = _study(app, "p1", [4.0, 3.0], task={"name": "quadratic", "clients": 8, "dim": 3})
    with _sdk(app, app.mia) as sdk:
        with pytest.raises(ConfigError, match="different data") as err:
            sdk.compare([a, other])
        assert err.value.status == 422
        forced = sdk.compare([a, other], force=True)
    assert not forced.comparable and forced.forced and "clients=8" in forced.differences[0]


def test_one_study_or_a_repeated_one_is_no_comparison(app: TestClient) -> None:
    a = _study(app, "p1", [4.0, 3.0])
    headers = {"Authorization": f"Bearer {app.mia}"}
    for studies in (a, f"{a},{a}"):
        r = app.get("/v1/compare", params={"studies": studies}, headers=headers)
        assert r.status_code == 422 and r.json()["error"]["field"] == "studies"


def test_a_study_of_methods_is_one_submission(app: TestClient) -> None:
    spec = tiny_spec(name="m", project="p1")
    spec["algorithm"] = ["fedavg", {"name": "fedprox", "search": {"space": "fedprox"}}]
    with _sdk(app, app.mia) as sdk:
        fedavg, fedprox = sdk.submit_methods(spec)
        a, b = fedavg.status(), fedprox.status()
        assert (a.name, a.algorithm, b.name, b.algorithm) == (
            "m-fedavg",
            "fedavg",
            "m-fedprox",
            "fedprox",
        )
        assert a.spec["task"] == b.spec["task"] and a.spec["budget"] == b.spec["budget"]
        assert a.project == b.project == "p1"
        before = len(sdk.studies())
        bad = {**spec, "algorithm": ["fedavg", "no-such-algorithm"]}
        with pytest.raises(ConfigError):
            sdk.submit_methods(bad)
        assert len(sdk.studies()) == before  # nothing queued when one spec is invalid


def test_a_recorded_comparison_is_an_mlflow_run(make_settings, tmp_path) -> None:
    from mlflow import MlflowClient

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = make_settings(api_token=TOKEN, mlflow_tracking_uri=uri)
    with TestClient(create_app(settings, backend=FakeBackend(), schedule=False)) as client:
        a = _study(client, "default", [4.0, 3.0, 2.0])
        b = _study(client, "default", [4.0, 3.5, 3.0, 2.5])
        with _sdk(client, TOKEN) as sdk:
            assert sdk.compare([a, b]).mlflow is None  # GET records nothing
            recorded = sdk.compare([a, b], record=True)
    run = MlflowClient(uri).get_run(recorded.mlflow.run_id)
    assert run.data.tags["fedtune.kind"] == "comparison"
    assert run.data.metrics["s-default-3.final_loss_all"] == pytest.approx(2.5)
    files = {f.path for f in MlflowClient(uri).list_artifacts(run.info.run_id, "comparison")}
    assert "comparison/comparison.html" in files and "comparison/comparison.png" in files


def test_the_service_records_a_study_of_methods_once_every_study_has_ended(
    make_settings, tmp_path
) -> None:
    from mlflow import MlflowClient

    from fedtune.service.comparisons import record_ended_groups

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    settings = make_settings(api_token=TOKEN, mlflow_tracking_uri=uri)
    spec = tiny_spec(name="m")
    spec["algorithm"] = ["fedavg", "fedprox", {"name": "fedavgm", "search": {"space": "fedavgm"}}]
    with TestClient(create_app(settings, backend=FakeBackend(), schedule=False)) as client:
        ctx = client.app.state.runtime.ctx
        with client.app.state.runtime.db.session() as s:
            identity.create_project(s, "p2")
            identity.create_user(s, "bo")
            identity.add_member(s, "bo", "p2", "member")
            bo = identity.issue_token(s, "bo").secret
        with _sdk(client, TOKEN) as sdk:
            studies = sdk.submit_methods(spec, idempotency_key="k1")
            again = sdk.submit_methods(spec, idempotency_key="k1")  # a retried submission
            assert again.group == studies.group and [s.id for s in again] == [s.id for s in studies]
            a, b, c = (s.id for s in studies)
            _run(client, a, [4.0, 3.0, 2.0], StudyState.SUCCEEDED)
            _run(client, b, [4.0, 3.5, 3.0], StudyState.SUCCEEDED)
            assert record_ended_groups(ctx) == []  # c still queued: nothing to record
            assert sdk.method_group(studies.group).comparison is None
            with client.app.state.runtime.db.session() as s:
                Repository(s).transition(c, StudyState.CANCELLED)
            assert record_ended_groups(ctx) == [studies.group]
            assert record_ended_groups(ctx) == []  # recorded once
            group = sdk.method_group(studies.group)
        with _sdk(client, bo) as other, pytest.raises(NotFoundError):
            other.method_group(studies.group)  # another project's study of methods
    assert [s["state"] for s in group.studies] == ["succeeded", "succeeded", "cancelled"]
    run = MlflowClient(uri).get_run(group.comparison.run_id)
    assert run.data.tags["fedtune.kind"] == "comparison"
    compared = {k for k in run.data.metrics if k.endswith(".final_loss_all")}
    assert compared == {"m-fedavg.final_loss_all", "m-fedprox.final_loss_all"}  # not the cancelled


def test_a_study_of_methods_with_one_success_says_why_there_is_no_comparison(app) -> None:
    from fedtune.service.comparisons import record_ended_groups

    spec = tiny_spec(name="m1", project="p1")
    spec["algorithm"] = ["fedavg", "fedprox"]
    with _sdk(app, app.mia) as sdk:
        studies = sdk.submit_methods(spec)
        _run(app, studies[0].id, [4.0, 3.0], StudyState.SUCCEEDED)
        _run(app, studies[1].id, [4.0, 9.0], StudyState.FAILED)
        assert record_ended_groups(app.app.state.runtime.ctx) == [studies.group]
        group = sdk.method_group(studies.group)
    assert isinstance(group.comparison, sdk_types.RecordedRun) and group.comparison.run_id is None
    assert group.comparison.error == "1 of the group's studies succeeded: nothing to compare"


def test_the_scheduler_tick_ends_with_its_after_step(make_settings) -> None:
    from fedtune.service.scheduler import Scheduler

    calls: list[int] = []
    settings = make_settings(api_token=TOKEN)
    with TestClient(create_app(settings, backend=FakeBackend(), schedule=False)) as client:
        runtime = client.app.state.runtime
        scheduler = Scheduler(
            runtime.db, FakeBackend(), settings, after_tick=lambda: calls.append(1) or ["g"]
        )
        assert scheduler.tick().after == ["g"] and calls == [1]
