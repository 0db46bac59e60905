"""The SDK speaks HTTP only: it imports no server module, its answers are the very classes the
service answers with (:mod:`fedtune.wire_models`), whose fields the API's OpenAPI schemas are
derived from, and fields it does not know are kept, not dropped."""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import sys
import textwrap

import pytest

from fedtune import client as sdk
from fedtune import results, wire_models
from fedtune.service import schemas
from fedtune.service.api import create_app
from fedtune.states import StudyState
from fedtune.wire_base import WireModel

from .conftest import TOKEN

#: route (method, path) → the shared class it answers with
ROUTES = {
    ("POST", "/v1/studies"): wire_models.StudyDetail,
    ("GET", "/v1/studies"): wire_models.StudyPage,
    ("GET", "/v1/studies/{study_id}"): wire_models.StudyDetail,
    ("POST", "/v1/studies/{study_id}/cancel"): wire_models.StudyDetail,
    ("GET", "/v1/studies/{study_id}/trials/{number}/curve"): wire_models.CurveOut,
    ("GET", "/v1/studies/{study_id}/tradeoff"): results.TradeOff,
    ("GET", "/v1/whoami"): wire_models.Identity,
    ("POST", "/v1/users"): wire_models.TokenOut,
    ("POST", "/v1/users/{name}/tokens"): wire_models.TokenOut,
    ("POST", "/v1/users/{name}/mlflow-login"): wire_models.MlflowLoginOut,
    ("POST", "/v1/users/{name}/revoke"): wire_models.Revoked,
    ("PUT", "/v1/users/{name}/projects/{project}"): wire_models.MembershipOut,
    ("POST", "/v1/projects"): wire_models.ProjectOut,
    ("GET", "/v1/projects/{project}"): wire_models.ProjectDetail,
    ("PUT", "/v1/projects/{project}/quota"): wire_models.ProjectOut,
    ("GET", "/v1/compare"): results.Comparison,
    ("POST", "/v1/compare"): results.Comparison,
}
#: the SDK's name → the shared class
SDK_NAMES = {
    "StudyStatus": wire_models.StudyDetail,
    "StudyOut": wire_models.StudyOut,
    "Progress": wire_models.Progress,
    "BestTrial": wire_models.BestTrial,
    "MlflowLinks": wire_models.MlflowLinks,
    "TrialInfo": wire_models.TrialOut,
    "CurvePoint": wire_models.CurvePoint,
    "TradeOff": results.TradeOff,
    "StudyPage": wire_models.StudyPage,
    "Comparison": results.Comparison,
}
#: every answer class, once (an older name of a class is no second class)
SHARED = [
    cls
    for module in (wire_models, results)
    for name in module.__all__
    if isinstance(cls := getattr(module, name), type)
    and issubclass(cls, WireModel)
    and cls is not WireModel
    and cls.__name__ == name
]


@pytest.fixture(scope="module")
def openapi(tmp_path_factory) -> dict:
    from fedtune.service.settings import Settings

    db = tmp_path_factory.mktemp("oas") / "f.db"
    app = create_app(Settings(database_url=f"sqlite:///{db}", api_token=TOKEN), backend=None)
    return app.openapi()


@pytest.mark.parametrize("name", list(SDK_NAMES))
def test_the_sdk_and_the_service_use_one_class(name: str) -> None:
    shared = SDK_NAMES[name]
    assert getattr(sdk, name) is shared
    assert getattr(schemas, shared.__name__) is shared


@pytest.mark.parametrize(
    ("route", "model"), list(ROUTES.items()), ids=[" ".join(r) for r in ROUTES]
)
def test_each_route_answers_with_the_shared_class(route, model, openapi) -> None:
    method, path = route
    ok = next(iter(openapi["paths"][path][method.lower()]["responses"].values()))
    assert ok["content"]["application/json"]["schema"] == {
        "$ref": f"#/components/schemas/{model.__name__}"
    }
    trials = openapi["paths"]["/v1/studies/{study_id}/trials"]["get"]["responses"]["200"]
    assert trials["content"]["application/json"]["schema"]["items"] == {
        "$ref": "#/components/schemas/TrialOut"
    }


@pytest.mark.parametrize("model", SHARED, ids=lambda m: m.__name__)
def test_each_schema_is_derived_from_the_shared_class(model: type, openapi: dict) -> None:
    schema = openapi["components"]["schemas"][model.__name__]
    fields = dataclasses.fields(model)
    assert list(schema["properties"]) == [f.name for f in fields]
    assert schema.get("required", []) == [
        f.name
        for f in fields
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
    ]
    for f in fields:
        shown = schema["properties"][f.name]
        assert shown.get("description") == f.metadata.get("description"), f.name
        if f.default not in (dataclasses.MISSING, None):
            assert shown["default"] == f.default, f.name


def test_unknown_fields_are_kept_in_extra() -> None:
    body = {"number": 3, "value": 0.5, "params": {"client_lr": 0.1}, "rank": 1, "new": [1, 2]}
    best = sdk.BestTrial.from_json(body)
    assert best.number == 3 and best.params == {"client_lr": 0.1}
    assert best.extra == {"rank": 1, "new": [1, 2]}
    assert best.to_json() == body
    assert sdk.BestTrial.from_json({"number": 1, "value": None, "params": {}}).extra == {}


def test_from_json_builds_the_typed_answer_and_to_json_gives_the_wire_back() -> None:
    summary = {
        "id": "0123456789ab",
        "name": "s",
        "state": "running",
        "algorithm": "fedavg",
        "task": "quadratic",
        "trials_requested": 2,
        "backend": None,
        "attempts": 1,
        "error": None,
        "created_at": "2026-01-02T03:04:05+00:00",
        "updated_at": "2026-01-02T03:04:06+00:00",
        "started_at": None,
        "finished_at": None,
        "heartbeat_at": None,
        "code_sha256": None,
        "project": "p",
        "owner": "o",
        "priority": 0,
        "queued_reason": None,
    }
    page = sdk.StudyPage.from_json(
        {"items": [summary], "total": 1, "limit": 10, "offset": 0, "next_page_token": None}
    )
    (item,) = page.items
    assert isinstance(item, sdk.StudyOut) and item.state is StudyState.RUNNING and not item.done
    assert item.created_at == dt.datetime(2026, 1, 2, 3, 4, 5, tzinfo=dt.UTC)
    assert page.to_json()["items"] == [summary]


def test_the_sdk_works_without_any_server_module(tmp_path) -> None:
    """`pip install fedtune` (no service extra): importing and using fedtune.Client must not need
    fedtune.service, FastAPI, SQLAlchemy, Ray, MLflow or Optuna."""
    script = textwrap.dedent(
        """
        import sys, importlib.abc

        BLOCKED = ("fedtune.service", "fastapi", "sqlalchemy", "starlette", "ray", "mlflow",
                   "optuna", "alembic", "uvicorn")

        class Block(importlib.abc.MetaPathFinder):
            def find_spec(self, name, path=None, target=None):
                if any(name == b or name.startswith(b + ".") for b in BLOCKED):
                    raise ImportError(f"blocked: {name}")
                return None

        sys.meta_path.insert(0, Block())
        import httpx
        from fedtune import Client
        from fedtune.errors import StudyNotFoundError

        def handler(request):
            if request.url.path.endswith("/missing"):
                return httpx.Response(404, json={"error": {"code": "study_not_found",
                                                           "message": "no study missing",
                                                           "field": None}})
            return httpx.Response(200, json={"status": "ok"})

        client = Client("http://sdk.test", transport=httpx.MockTransport(handler), retries=0)
        try:
            client.study("missing").status()
        except StudyNotFoundError as exc:
            print("typed", exc.status, exc.code)
        loaded = sorted(m for m in sys.modules if m.startswith(BLOCKED))
        print("loaded", loaded)
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert "typed 404 study_not_found" in out.stdout
    assert "loaded []" in out.stdout


def test_an_answer_still_reads_as_the_dict_it_was() -> None:
    """Code written when the SDK answered identity and projects as dicts keeps working."""
    body = {
        "name": "vision",
        "owner": None,
        "quota": {"gpus": 2.0, "trials": None, "studies": 4, "gpu_hours": 10.0},
        "weight": 1.0,
        "max_priority": 0,
        "queue_name": None,
        "usage": {
            "studies": {"queued": 1, "running": 0},
            "gpus": 0.0,
            "trials": 0,
            "gpu_hours": 0.5,
        },
        "newer": "a field of a newer service",
    }
    project = wire_models.ProjectDetail.from_json(body)
    assert project.quota.gpus == project["quota"]["gpus"] == 2.0
    assert project["usage"]["studies"]["queued"] == 1 and project["newer"] == body["newer"]
    with pytest.raises(KeyError):
        project["missing"]
    assert project.to_json() == body
    # an older service's answer, before GPU-hour quotas: the new fields read as null
    older = {**body, "quota": {"gpus": 2.0, "trials": None, "studies": 4}}
    older["usage"] = {k: v for k, v in body["usage"].items() if k != "gpu_hours"}
    old = wire_models.ProjectDetail.from_json(older)
    assert old.quota.gpu_hours is None and old.usage.gpu_hours is None
