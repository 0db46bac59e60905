"""The SDK speaks HTTP only: it imports no server module, its response models match the API's
OpenAPI schemas field for field, and fields it does not know are kept, not dropped."""

from __future__ import annotations

import dataclasses
import subprocess
import sys
import textwrap

import pytest

from fedtune import client as sdk
from fedtune.service.api import create_app

from .conftest import TOKEN

#: SDK model → the API schema (components/schemas) whose objects it is built from
PAIRS = {
    sdk.StudyStatus: "StudyDetail",
    sdk.Progress: "Progress",
    sdk.BestTrial: "BestTrial",
    sdk.TrialInfo: "TrialOut",
    sdk.CurvePoint: "CurvePoint",
    sdk.TradeOff: "TradeoffOut",
    sdk.StudyPage: "StudyPage",
}


@pytest.fixture(scope="module")
def openapi(tmp_path_factory) -> dict:
    from fedtune.service.settings import Settings

    db = tmp_path_factory.mktemp("oas") / "f.db"
    app = create_app(Settings(database_url=f"sqlite:///{db}", api_token=TOKEN), backend=None)
    return app.openapi()


@pytest.mark.parametrize("model", list(PAIRS), ids=lambda m: m.__name__)
def test_sdk_models_have_exactly_the_api_fields(model: type, openapi: dict) -> None:
    schema = openapi["components"]["schemas"][PAIRS[model]]
    api_fields = set(schema["properties"])
    sdk_fields = {f.name for f in dataclasses.fields(model)} - {"extra"}
    assert sdk_fields == api_fields, (
        f"{model.__name__} vs {PAIRS[model]}: only in the SDK {sorted(sdk_fields - api_fields)}, "
        f"only in the API {sorted(api_fields - sdk_fields)}"
    )


def test_unknown_fields_are_kept_in_extra() -> None:
    body = {"number": 3, "value": 0.5, "params": {"client_lr": 0.1}, "rank": 1, "new": [1, 2]}
    best = sdk._build(sdk.BestTrial, body)
    assert best.number == 3 and best.params == {"client_lr": 0.1}
    assert best.extra == {"rank": 1, "new": [1, 2]}


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
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr[-3000:]
    assert "typed 404 study_not_found" in out.stdout
    assert "loaded []" in out.stdout
