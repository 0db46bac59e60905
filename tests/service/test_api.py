"""The REST API in-process (FastAPI TestClient), with a scripted backend."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading
from collections.abc import Callable, Iterator
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient

from fedtune.service.api import create_app
from fedtune.service.backends.base import DriverStatus
from fedtune.service.errors import DatabaseUnavailableError
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState
from fedtune.service.warmup import Warmup

from .conftest import TOKEN
from .helpers import FakeBackend, tiny_spec

AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture
def client(make_settings: Callable, fake_backend: FakeBackend) -> Iterator[TestClient]:
    app = create_app(
        make_settings(api_token=TOKEN, max_request_bytes=64 * 1024),
        backend=fake_backend,
        schedule=False,
    )
    with TestClient(app, headers=AUTH) as c:
        yield c


def _runtime(c: TestClient):
    return c.app.state.runtime


def _submit(c: TestClient, **kw) -> dict:
    r = c.post("/v1/studies", json=tiny_spec(**kw))
    assert r.status_code == 201, r.text
    return r.json()


# ---------------------------------------------------------------- health, auth, limits


def test_health_readiness_metrics_and_openapi_are_open(client: TestClient) -> None:
    bare = {"Authorization": ""}
    assert client.get("/healthz", headers=bare).json() == {"status": "ok"}
    assert _runtime(client).ctx.warmup.done.wait(300)
    ready = client.get("/readyz", headers=bare).json()
    assert ready == {
        "status": "ready",
        "database": "sqlite",
        "revision": "0010",
        "backend": {"kind": "local", "up": True, "reason": None},
        "auth": "token",
        "code_sandbox": None,  # code upload is off
        "mlflow": None,  # no MLflow workspaces to sync
    }
    assert client.get("/metrics", headers=bare).status_code == 200
    spec = client.get("/openapi.json", headers=bare).json()
    assert {"/v1/studies", "/v1/studies/{study_id}/tradeoff", "/v1/algorithms"} <= set(
        spec["paths"]
    )
    assert spec["components"]["securitySchemes"]["HTTPBearer"]["scheme"] == "bearer"


def test_readiness_waits_for_the_warm_up(client: TestClient, monkeypatch) -> None:
    loading = Warmup()  # never started: still loading
    monkeypatch.setattr(_runtime(client), "ctx", replace(_runtime(client).ctx, warmup=loading))
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["error"]["code"] == "warming_up"
    loading.done.set()
    assert client.get("/readyz").status_code == 200


def test_the_first_submission_after_ready_imports_nothing(tmp_path) -> None:
    """Once /readyz says ready, a submission loads no module (the tuning stack is warm)."""
    script = textwrap.dedent(
        f"""
        import sys
        from fastapi.testclient import TestClient
        from fedtune.service.api import create_app
        from fedtune.service.settings import Settings

        app = create_app(Settings(database_url="sqlite:///{tmp_path}/w.db"), backend=None)
        with TestClient(app) as client:
            app.state.runtime.ctx.warmup.done.wait(300)
            assert client.get("/readyz").status_code == 200
            before = set(sys.modules)
            r = client.post("/v1/studies", json={{**WARM_SPEC, "name": "first"}})
            assert r.status_code == 201, r.text
            print("new", sorted(m for m in set(sys.modules) - before
                                if m.split(".")[0] in ("fedtune", "optuna", "torch", "pydantic")))
        """
    )
    prelude = "from fedtune.service.warmup import WARM_SPEC\n"
    out = subprocess.run(
        [sys.executable, "-c", prelude + script], capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "new []" in out.stdout, out.stdout


def test_readiness_fails_when_the_database_does(client: TestClient, monkeypatch) -> None:
    def down() -> None:
        raise DatabaseUnavailableError("the database is unavailable; retry later")

    assert _runtime(client).ctx.warmup.done.wait(300)  # readiness then reflects the database
    monkeypatch.setattr(_runtime(client).db, "ping", down)
    r = client.get("/readyz")
    assert r.status_code == 503 and r.json()["error"]["code"] == "database_unavailable"


@pytest.mark.parametrize("path", ["/v1/studies", "/v1/algorithms", "/v1/studies/0123456789ab"])
def test_bearer_token_required(client: TestClient, path: str, caplog) -> None:
    caplog.set_level(logging.DEBUG)
    r = client.get(path, headers={"Authorization": ""})
    assert r.status_code == 401 and r.json()["error"]["code"] == "unauthorized"
    assert r.headers["WWW-Authenticate"] == "Bearer"
    r = client.get(path, headers={"Authorization": "Bearer wrong-token-of-some-length"})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_token"
    r = client.post("/v1/studies", json=tiny_spec(), headers={"Authorization": "Basic abc"})
    assert r.status_code == 401
    assert all(
        TOKEN not in rec.getMessage() and "wrong-token" not in rec.getMessage()
        for rec in caplog.records
    )


def test_request_size_limit(client: TestClient) -> None:
    spec = tiny_spec(description="x" * 70_000)
    r = client.post("/v1/studies", json=spec)
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    chunks = (b" " * 1024 for _ in range(80))  # streamed, no Content-Length
    r = client.post("/v1/studies", content=chunks, headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and r.json()["error"]["code"] == "payload_too_large"
    assert client.get("/v1/studies").json()["total"] == 0


# ---------------------------------------------------------------- submit, validate, idempotency


def test_submit_returns_the_queued_study(client: TestClient) -> None:
    r = client.post("/v1/studies", json=tiny_spec(trials=3))
    assert r.status_code == 201
    body = r.json()
    assert r.headers["Location"] == f"/v1/studies/{body['id']}"
    assert body["state"] == "queued" and body["trials_requested"] == 3
    assert body["progress"]["requested"] == 3 and body["progress"]["finished"] == 0
    assert body["spec"]["budget"]["trials"] == 3 and body["spec"]["sampler"]["name"] == "random"
    assert body["best"] is None


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"budget": {"trials": 0}}, "budget.trials"),
        ({"name": "Bad Name; rm -rf /"}, "name"),
        ({"budgett": {}}, "budgett"),
        ({"algorithm": "nope"}, "algorithm"),
        ({"search": {"space": "../../etc/passwd"}}, "search.space"),
        ({"search": {"space": ["fedavg", "/tmp/x.yaml"]}}, "search.space[1]"),
        ({"tracking": {"uri": "file:///etc"}}, "tracking.uri"),
        ({"budget": {"trials": 10**6}}, "budget.trials"),
        # an unknown model used to pass and fail every trial in turn
        ({"task": {"name": "quadratic", "clients": 6, "dim": 3, "model": "nope"}}, "task.model"),
        ({"hparams": {"client_lrr": 0.1}}, "hparams.client_lrr"),
    ],
)
def test_invalid_specs_are_422_with_the_field_path(client: TestClient, change, field) -> None:
    r = client.post("/v1/studies", json=tiny_spec() | change)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["code"] == "invalid_config" and error["field"] == field, error


@pytest.mark.parametrize("body", [b"[1, 2]", b'"spec"'])
def test_bodies_that_are_not_objects_are_422(client: TestClient, body: bytes) -> None:
    r = client.post("/v1/studies", content=body, headers={"Content-Type": "application/json"})
    assert r.status_code == 422 and r.json()["error"]["code"] == "invalid_request"


def test_a_body_that_is_not_json_is_400(client: TestClient) -> None:
    r = client.post(
        "/v1/studies", content=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"


@pytest.mark.parametrize(("auth", "status"), [("", 401), ("Bearer wrong-token-0123456789", 401)])
@pytest.mark.parametrize("body", [b"{not json", b"[1]", b"x" * 64])
def test_auth_is_checked_before_the_body(client: TestClient, auth, status, body) -> None:
    """An unauthenticated request gets 401 whatever its body: malformed, invalid or over the
    size limit (the body is never read)."""
    headers = {"Content-Type": "application/json", "Authorization": auth}
    r = client.post("/v1/studies", content=body, headers=headers)
    assert r.status_code == status, r.text
    huge = {**headers, "Content-Length": str(10**12)}
    r = client.post("/v1/studies", content=body, headers=huge)
    assert r.status_code == status, r.text


def test_openapi_documents_every_error_and_the_real_body(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    for path, operations in spec["paths"].items():
        if not path.startswith("/v1"):
            continue
        for method, operation in operations.items():
            for status in ("400", "401", "403", "413", "422"):
                answer = operation["responses"].get(status)
                assert answer, f"{method.upper()} {path} does not document {status}"
                schema = answer["content"]["application/json"]["schema"]
                assert schema == {"$ref": "#/components/schemas/ErrorResponse"}
    body = spec["paths"]["/v1/studies"]["post"]["requestBody"]["content"]["application/json"]
    assert body["schema"] == {"$ref": "#/components/schemas/StudySpec"}
    study = spec["components"]["schemas"]["StudySpec"]
    assert {"task", "algorithm", "train", "search", "budget", "resources"} <= set(
        study["properties"]
    )
    refs = {v["$ref"].rsplit("/", 1)[1] for v in _refs(study)}
    assert refs and refs <= set(spec["components"]["schemas"]), refs


def _refs(node):
    if isinstance(node, dict):
        if "$ref" in node:
            yield node
        for value in node.values():
            yield from _refs(value)
    elif isinstance(node, list):
        for value in node:
            yield from _refs(value)


def test_idempotency_key(client: TestClient) -> None:
    key = {"Idempotency-Key": "submit-1"}
    first = client.post("/v1/studies", json=tiny_spec(), headers=key)
    again = client.post("/v1/studies", json=tiny_spec(), headers=key)
    assert first.status_code == 201 and again.status_code == 200
    assert again.headers["Idempotent-Replayed"] == "true"
    assert again.json()["id"] == first.json()["id"]
    other = client.post("/v1/studies", json=tiny_spec(name="other"), headers=key)
    assert other.status_code == 409 and other.json()["error"]["code"] == "idempotency_key_reused"
    bad = client.post("/v1/studies", json=tiny_spec(), headers={"Idempotency-Key": "a b"})
    assert bad.status_code == 422
    assert client.get("/v1/studies").json()["total"] == 1


def test_concurrent_retries_with_one_key_create_one_study(client: TestClient) -> None:
    answers: list[int] = []

    def post() -> None:
        r = client.post("/v1/studies", json=tiny_spec(), headers={"Idempotency-Key": "same"})
        answers.append(r.status_code)

    threads = [threading.Thread(target=post) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(answers) == [200] * 7 + [201]
    assert client.get("/v1/studies").json()["total"] == 1


# ---------------------------------------------------------------- list, get, cancel


def test_list_filters_and_paginates(client: TestClient) -> None:
    ids = [_submit(client, name=f"s{i}")["id"] for i in range(5)]
    client.post(f"/v1/studies/{ids[0]}/cancel")
    page = client.get("/v1/studies", params={"limit": 2, "offset": 1}).json()
    assert page["total"] == 5 and [s["id"] for s in page["items"]] == [ids[3], ids[2]]
    queued = client.get("/v1/studies", params={"state": "queued"}).json()
    assert queued["total"] == 4 and ids[0] not in [s["id"] for s in queued["items"]]
    for bad in ({"state": "sleeping"}, {"limit": 0}, {"limit": 501}, {"offset": -1}):
        r = client.get("/v1/studies", params=bad)
        assert r.status_code == 422 and r.json()["error"]["field"].startswith("query."), bad


def test_unknown_studies_are_404(client: TestClient) -> None:
    for path in (
        "/v1/studies/0123456789ab",
        "/v1/studies/not-an-id",
        "/v1/studies/0123456789ab/trials",
        "/v1/studies/0123456789ab/tradeoff",
        "/v1/studies/0123456789ab/trials/0/curve",
    ):
        r = client.get(path)
        assert r.status_code == 404 and r.json()["error"]["code"] == "study_not_found", path
    r = client.post("/v1/studies/0123456789ab/cancel")
    assert r.status_code == 404
    sid = _submit(client)["id"]
    r = client.get(f"/v1/studies/{sid}/trials/5/curve")
    assert r.status_code == 404 and r.json()["error"]["code"] == "trial_not_found"


def test_cancel_lifecycle(client: TestClient, fake_backend: FakeBackend) -> None:
    killed: list = []
    scheduler = _runtime(client).scheduler
    scheduler._kill_runs = lambda *args: killed.append(args)
    queued = _submit(client, name="q")["id"]
    r = client.post(f"/v1/studies/{queued}/cancel")
    assert r.status_code == 200 and r.json()["state"] == "cancelled"
    assert client.post(f"/v1/studies/{queued}/cancel").json()["state"] == "cancelled"

    running = _submit(client, name="r")["id"]
    scheduler.tick()  # dispatches it
    assert client.get(f"/v1/studies/{running}").json()["state"] == "running"
    db = _runtime(client).db
    with db.session() as s:
        Repository(s).start_trial(running, 0, {"hparams.client_lr": 0.1})
        Repository(s).update_study(running, mlflow_run_id="a" * 32, mlflow_experiment_id="1")
    body = client.post(f"/v1/studies/{running}/cancel").json()
    assert body["state"] == "cancelled" and body["progress"]["killed"] == 1
    scheduler.tick()  # stops the driver and marks MLflow runs KILLED
    assert fake_backend.stopped == [{"study": running, "attempt": 1}]
    assert killed and killed[0][1:3] == ("1", "a" * 32)

    with db.session() as s:
        done = _submit(client, name="d")["id"]
        Repository(s).transition(done, StudyState.RUNNING)
        Repository(s).transition(done, StudyState.SUCCEEDED)
    r = client.post(f"/v1/studies/{done}/cancel")
    assert r.status_code == 409 and r.json()["error"]["code"] == "illegal_state_change"


# ---------------------------------------------------------------- trials, curves, trade-off


def test_progress_counts_configuration_rounds_against_their_budget(client: TestClient) -> None:
    budget = {"configuration_rounds": 10, "max_concurrent": 1}
    sid = _submit(client, budget=budget)["id"]
    with _runtime(client).db.session() as s:
        repo = Repository(s)
        for n, rounds in ((0, 4), (1, 2)):  # a whole trial of 4 rounds, one stopped after 2
            repo.start_trial(sid, n, {"hparams.client_lr": 0.01})
            for r in range(1, rounds + 1):
                repo.record_round(sid, n, r, {"client_loss": 1.0 / r})
        repo.finish_trial(sid, 0, TrialState.COMPLETED, 0.3, "completed")
    progress = client.get(f"/v1/studies/{sid}").json()["progress"]
    assert progress["configuration_rounds"] == 6
    # 1 finished of at most FEDTUNE_MAX_TRIALS, but 6 of 10 configuration-rounds
    assert progress["fraction"] == pytest.approx(0.6)


def test_trials_curves_tradeoff_and_best(client: TestClient) -> None:
    sid = _submit(client, trials=3)["id"]
    curves = {0: [4.0, 3.0, 1.0, 0.5], 1: [2.0, 1.5, 1.4, 1.4]}
    with _runtime(client).db.session() as s:
        repo = Repository(s)
        for n, losses in curves.items():
            repo.start_trial(sid, n, {"hparams.client_lr": 0.1 * (n + 1)})
            for r, loss in enumerate(losses, start=1):
                repo.record_round(sid, n, r, {"client_loss": loss, "update_norm": 1.0})
            repo.finish_trial(sid, n, TrialState.COMPLETED, sum(losses[-2:]) / 2, "completed")
        repo.start_trial(sid, 2, {"hparams.client_lr": 0.3})
    trials = client.get(f"/v1/studies/{sid}/trials").json()
    assert [(t["number"], t["state"]) for t in trials] == [
        (0, "completed"),
        (1, "completed"),
        (2, "running"),
    ]
    assert (
        client.get(f"/v1/studies/{sid}/trials", params={"state": "running"}).json()[0]["number"]
        == 2
    )
    curve = client.get(f"/v1/studies/{sid}/trials/0/curve").json()
    assert [p["round"] for p in curve["rounds"]] == [1, 2, 3, 4]
    assert curve["rounds"][2]["metrics"]["client_loss"] == 1.0
    detail = client.get(f"/v1/studies/{sid}").json()
    assert detail["best"] == {"number": 0, "value": 0.75, "params": {"hparams.client_lr": 0.1}}
    assert detail["progress"] | {} == detail["progress"] and detail["progress"]["finished"] == 2
    assert detail["progress"]["running"] == 1 and detail["progress"]["fraction"] == pytest.approx(
        2 / 3
    )
    t = client.get(f"/v1/studies/{sid}/tradeoff").json()
    assert t["metric"] == "client_loss" and 0 in t["pareto"]
    losses = [p["loss"] for p in t["envelope"]]
    assert losses == sorted(losses, reverse=True) and t["envelope"][0]["trial_id"] == 1
    assert {s["trial_id"] for s in t["trials"]} == {0, 1}


# ---------------------------------------------------------------- discovery, metrics


def test_discovery(client: TestClient) -> None:
    algorithms = {a["name"]: a for a in client.get("/v1/algorithms").json()}
    assert "fedavg" in algorithms and "client_lr" in algorithms["fedavg"]["params"]
    assert "quadratic" in {t["name"] for t in client.get("/v1/tasks").json()}
    spaces = {s["name"]: s for s in client.get("/v1/search-spaces").json()}
    assert "fedavg" in spaces and spaces["fedavg"]["parameters"]


def test_metrics_reflect_the_database(client: TestClient, fake_backend: FakeBackend) -> None:
    ids = [_submit(client, name=f"m{i}")["id"] for i in range(3)]
    _runtime(client).scheduler.tick()  # max_concurrent_studies = 2 → two dispatched
    with _runtime(client).db.session() as s:
        Repository(s).start_trial(ids[0], 0, {})
    text = client.get("/metrics", headers={"Authorization": ""}).text  # a scrape: no token
    assert 'fedtune_studies{state="running"} 2.0' in text
    assert 'fedtune_studies{state="queued"} 1.0' in text
    assert "fedtune_queue_length 1.0" in text and "fedtune_trials_running 1.0" in text
    assert 'route="/v1/studies",status="201"' in text
    fake_backend.finish(ids[0], 1, DriverStatus.SUCCEEDED)  # exited without a final state
    _runtime(client).scheduler.tick()  # recovered and re-dispatched first (FIFO by creation)
    again = client.get(f"/v1/studies/{ids[0]}").json()
    assert again["state"] == "running" and again["attempts"] == 2
    assert "re-dispatching" in again["error"]
    assert client.get(f"/v1/studies/{ids[2]}").json()["state"] == "queued"


def test_an_unknown_task_parameter_is_a_422_at_submission(client: TestClient) -> None:
    """Refused at submit, naming the field (the study used to be accepted
    and fail in every trial)."""
    spec = tiny_spec()
    spec["task"] = {**spec["task"], "clinets": 10}
    r = client.post("/v1/studies", json=spec)
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"] == "task.clinets"
    assert "unknown key" in r.json()["error"]["message"]


def test_a_short_study_is_not_refused_for_a_default_it_never_wrote(client: TestClient) -> None:
    """``train.rounds: 3`` with no scheduler, strategy or objective key is accepted (the
    defaults scale to the study); a round count the user did write and that does not fit is
    a 422 naming that field."""
    spec = tiny_spec(name="short", rounds=3)
    for key in ("scheduler", "objective", "sampler"):
        spec.pop(key)
    r = client.post("/v1/studies", json=spec)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["objective"]["last_rounds"] <= 3
    asha = {**spec, "name": "short-asha", "scheduler": {"name": "asha"}}
    r = client.post("/v1/studies", json=asha)
    assert r.status_code == 201, r.text
    assert r.json()["spec"]["scheduler"]["grace_rounds"] == 1
    written = {**asha, "name": "short-written", "scheduler": {"name": "asha", "grace_rounds": 10}}
    r = client.post("/v1/studies", json=written)
    assert r.status_code == 422, r.text
    error = r.json()["error"]
    assert error["field"] == "scheduler.grace_rounds", error
    assert "10 exceeds train.rounds = 3" in error["message"], error
