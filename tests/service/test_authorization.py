"""Authorization on every route, route × role × ownership.

The route list comes from the app's OpenAPI document: :data:`EXPECTED` must name every
``(method, path)`` of it, so a new route cannot ship without saying who may call it. Every
route is called as each of: the bootstrap admin (``FEDTUNE_API_TOKEN``), a member and a viewer
of the study's project ``p1``, a member of another project ``p2``, no token, a revoked token and
an expired one — on SQLite and on PostgreSQL. A caller who may not read a study gets 404 exactly
as for one that does not exist (no existence oracle); a viewer changing something gets 403; an
admin-only route answers 403 to everyone else; a bad credential is always 401.

Before this, one token was everybody's: each of these callers read, listed and cancelled
everything (the old code fails every "other"/"viewer" expectation below).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import io
import json
import re
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import inspect, text

from fedtune.service import identity
from fedtune.service.api.app import create_app
from fedtune.service.code_url import code_token, code_url_key
from fedtune.service.models import Study
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState

from .conftest import TOKEN, settings_in
from .helpers import FakeBackend, pg_schema, tiny_spec

ROLES = ("admin", "member", "viewer", "other", "none", "revoked", "expired")
OK = "ok"  # 2xx (or 409: allowed, but not in this state)

#: (method, path) -> role -> what it answers: OK, or a status code
READ = {"admin": OK, "member": OK, "viewer": OK, "other": 404}
WRITE = {"admin": OK, "member": OK, "viewer": 403, "other": 404}
ANYONE = {"admin": OK, "member": OK, "viewer": OK, "other": OK}
ADMIN_ONLY = {"admin": OK, "member": 403, "viewer": 403, "other": 403}
EXPECTED: dict[tuple[str, str], dict[str, Any]] = {
    ("GET", "/v1/studies"): ANYONE,
    ("POST", "/v1/studies"): {"admin": OK, "member": OK, "viewer": 403, "other": 422},
    ("GET", "/v1/studies/{study_id}"): READ,
    ("POST", "/v1/studies/{study_id}/cancel"): WRITE,
    ("GET", "/v1/studies/{study_id}/trials"): READ,
    ("GET", "/v1/studies/{study_id}/trials/{number}/curve"): READ,
    ("GET", "/v1/studies/{study_id}/tradeoff"): READ,
    ("GET", "/v1/compare"): READ,
    ("POST", "/v1/compare"): WRITE,
    ("POST", "/v1/methods"): {"admin": OK, "member": OK, "viewer": 403, "other": 422},
    ("GET", "/v1/methods/{group_id}"): READ,
    ("POST", "/v1/code"): WRITE,
    ("GET", "/v1/studies/{study_id}/code.zip"): "own credential",
    ("GET", "/v1/algorithms"): ANYONE,
    ("GET", "/v1/tasks"): ANYONE,
    ("GET", "/v1/search-spaces"): ANYONE,
    ("GET", "/v1/whoami"): ANYONE,
    ("GET", "/v1/users"): ADMIN_ONLY,
    ("POST", "/v1/users"): ADMIN_ONLY,
    ("POST", "/v1/users/{name}/tokens"): {"admin": OK, "member": OK, "viewer": 403, "other": 403},
    ("POST", "/v1/users/{name}/revoke"): ADMIN_ONLY,
    # an admin, or the user itself; 404 here: this service keeps no MLflow workspaces
    ("POST", "/v1/users/{name}/mlflow-login"): {
        "admin": 404,
        "member": 403,
        "viewer": 403,
        "other": 403,
    },
    ("PUT", "/v1/users/{name}/projects/{project}"): ADMIN_ONLY,
    ("GET", "/v1/projects"): ANYONE,
    ("POST", "/v1/projects"): ADMIN_ONLY,
    ("GET", "/v1/projects/{project}"): READ,
    ("PUT", "/v1/projects/{project}/quota"): ADMIN_ONLY,
}
#: routes that need no token (the light client's wheel is public code: test_client_wheel.py)
OPEN = {
    "/healthz",
    "/readyz",
    "/metrics",
    "/client/",
    "/client/simple/",
    "/client/simple/{project}/",
    "/client/{filename}",
}
SCRAPE_TOKEN = "scrape-token-of-the-authz-tests-0123"


def _zip() -> bytes:
    """The same bytes on every call (fixed entry times: writestr would stamp the clock's, and
    two uploads a second apart would then be two packages)."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in (("authz_lab/__init__.py", ""), ("authz_lab/tasks.py", "X = 1\n")):
            archive.writestr(zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0)), text)
    return buffer.getvalue()


class World:
    """Projects p1, p2; users of each role; a study of p1 with a trial and a curve."""

    def __init__(self, client: Any, db: Any) -> None:
        self.client, self.db = client, db  # any httpx-like client: in-process or real servers
        self.tokens: dict[str, str | None] = {"admin": TOKEN, "none": None}
        past = dt.datetime.now(dt.UTC) - dt.timedelta(days=1)
        with self.db.session() as s:
            for project in ("p1", "p2", "p3"):
                identity.create_project(s, project)
            for role, user, project, kind in (
                ("member", "mia", "p1", "member"),
                ("viewer", "vic", "p1", "viewer"),
                ("other", "otto", "p2", "member"),
                ("revoked", "rita", "p1", "member"),
                ("expired", "eddie", "p1", "member"),
            ):
                identity.create_user(s, user)
                identity.add_member(s, user, project, kind)
                issued = identity.issue_token(
                    s, user, expires_at=past if role == "expired" else None
                )
                self.tokens[role] = issued.secret
            identity.revoke(s, "rita")

    def headers(self, role: str) -> dict[str, str]:
        token = self.tokens[role]
        return {"Authorization": f"Bearer {token}"} if token else {"Authorization": ""}

    def study(self, project: str = "p1", with_trial: bool = True) -> str:
        r = self.client.post(
            "/v1/studies", json=tiny_spec(project=project), headers=self.headers("admin")
        )
        assert r.status_code == 201, r.text
        sid = r.json()["id"]
        if with_trial:
            with self.db.session() as s:
                repo = Repository(s)
                repo.transition(sid, StudyState.RUNNING, attempts=1)
                repo.start_trial(sid, 0, {"hparams.client_lr": 0.1})
                repo.record_round(sid, 0, 1, {"client_loss": 1.0})
                repo.finish_trial(sid, 0, TrialState.COMPLETED, 1.0, "completed")
        return sid

    def call(self, method: str, path: str, role: str, fresh: Callable[[], str]) -> Any:
        """Call ``path`` (params filled in) as ``role``; mutating calls get fresh objects."""
        sid = fresh() if path.endswith("/cancel") else self.sid
        stamp = f"{role}-{next(_COUNT)}"
        # {name}: mia (the member) for her tokens — herself for the member, another user for
        # the rest; nemo (no project) where an admin's call would change someone
        user = "mia" if path.endswith("/tokens") else "nemo"
        if "{group_id}" in path and getattr(self, "group", None) is None:
            spec = tiny_spec(name="g", project="p1", algorithm=["fedavg", "fedsgd"], search={})
            r = self.client.post("/v1/methods", json=spec, headers=self.headers("admin"))
            assert r.status_code == 201, r.text
            self.group = r.json()["group"]
        concrete = (
            path.replace("{group_id}", getattr(self, "group", ""))
            .replace("{study_id}", sid)
            .replace("{number}", "0")
            .replace("{project}", "p1")
            .replace("{name}", user)
        )
        kwargs: dict[str, Any] = {"headers": self.headers(role)}
        if (method, path) == ("POST", "/v1/studies"):
            kwargs["json"] = tiny_spec(name=f"s{stamp}", project="p1")
        elif (method, path) == ("POST", "/v1/methods"):
            kwargs["json"] = tiny_spec(
                name=f"m{stamp}", project="p1", algorithm=["fedavg", "fedsgd"], search={}
            )
        elif path == "/v1/compare":
            if getattr(self, "second", None) is None:
                self.second = self.study()
            kwargs["params"] = {"studies": f"{sid},{self.second}"}
        elif (method, path) == ("POST", "/v1/code"):
            kwargs["content"] = _zip()
            kwargs["params"] = {"project": "p1"}
            kwargs["headers"] = {**kwargs["headers"], "Content-Type": "application/zip"}
        elif (method, path) == ("POST", "/v1/users"):
            kwargs["json"] = {"name": f"u{stamp}"}
        elif (method, path) == ("POST", "/v1/projects"):
            kwargs["json"] = {"name": f"q{stamp}"}
        elif method in ("POST", "PUT") and path.startswith(("/v1/users", "/v1/projects")):
            kwargs["json"] = (
                {"role": "viewer"}
                if path.endswith("{project}")
                else {"gpus": 4}
                if path.endswith("/quota")
                else {}
            )
            if path.endswith("{project}"):  # nemo's role in p3: harmless to the others
                concrete = "/v1/users/nemo/projects/p3"
        return self.client.request(method, concrete, **kwargs)


_COUNT = iter(range(10**6))


@contextlib.contextmanager
def built_world(request: pytest.FixtureRequest, root: Path) -> Iterator[World]:
    """A :class:`World` on ``request.param``'s database (PostgreSQL: a schema of its own),
    its app's files under ``root``; comparisons are recorded in the session's one MLflow store
    (:func:`mlflow_store`)."""
    with contextlib.ExitStack() as stack:
        overrides = {
            "api_token": TOKEN,
            "allow_code_upload": True,
            "metrics_token": SCRAPE_TOKEN,
            "mlflow_tracking_uri": request.getfixturevalue("mlflow_store"),
        }
        if request.param == "postgresql":
            request.getfixturevalue("pg_available")
            overrides["database_url"] = stack.enter_context(pg_schema())
        settings = settings_in(root, **overrides)
        client = stack.enter_context(
            TestClient(create_app(settings, backend=FakeBackend(), schedule=False))
        )
        w = World(client, client.app.state.runtime.db)
        with w.db.session() as s:
            identity.create_user(s, "nemo")
        w.sid = w.study()
        yield w


@pytest.fixture(scope="session")
def mlflow_store(tmp_path_factory) -> str:
    """One MLflow store for every world's comparisons (``POST /v1/compare`` records one as a
    run): MLflow creates and migrates a new SQLite store's tables, about a CPU-second, and a
    study's default store is a new one in its workdir."""
    return f"sqlite:///{tmp_path_factory.mktemp('authz-mlflow') / 'mlflow.db'}"


@pytest.fixture(params=["sqlite", "postgresql"])
def world(request, tmp_path) -> Iterator[World]:
    """A world of the test's own: for a test that changes something."""
    with built_world(request, tmp_path) as w:
        yield w


def _state(w: World) -> list:
    """What a test of :func:`shared_world` may not change: every table's rows, in order."""
    with w.db.session(readonly=True) as s:
        names = sorted(inspect(s.connection()).get_table_names())
        return [(n, sorted(map(repr, s.execute(text(f"SELECT * FROM {n}")).all()))) for n in names]


@pytest.fixture(scope="module", params=["sqlite", "postgresql"])
def shared_world(request, tmp_path_factory) -> Iterator[World]:
    """One world per database for the tests that only read, or whose calls are all refused (an
    app, a schema, users, tokens and a study built once, not once per parametrized case);
    afterwards every table holds what it held before they ran."""
    with built_world(request, tmp_path_factory.mktemp("authz")) as w:
        before = _state(w)
        yield w
        assert _state(w) == before, "a test of the shared world changed it"


def test_every_route_is_in_the_matrix(shared_world: World) -> None:
    paths = shared_world.client.get("/openapi.json").json()["paths"]
    routes = {(m.upper(), p) for p, ops in paths.items() for m in ops if p not in OPEN}
    assert routes == set(EXPECTED), (
        f"routes without an authorization expectation: {sorted(routes - set(EXPECTED))}; "
        f"expectations of no route: {sorted(set(EXPECTED) - routes)}"
    )


def test_route_role_ownership_matrix(world: World) -> None:
    """Every route × role; an "ok" means 2xx or 409 (allowed, not in this state)."""
    wrong = run_matrix(world)
    assert not wrong, "\n".join(wrong)


def run_matrix(world: World) -> list[str]:
    """Call every route of :data:`EXPECTED` as every role; the answers that were wrong."""
    wrong: list[str] = []
    for (method, path), expected in EXPECTED.items():
        if expected == "own credential":
            continue
        for role in ROLES:
            want = expected.get(role, 401)  # none, revoked, expired: always 401
            r = world.call(method, path, role, fresh=world.study)
            got = r.status_code
            ok = (200 <= got < 300 or got == 409) if want == OK else got == want
            if not ok:
                wrong.append(f"{method} {path} as {role}: {got} (want {want}) {r.text[:120]}")
            if got == 401 and r.headers.get("WWW-Authenticate") != "Bearer":
                wrong.append(f"{method} {path} as {role}: 401 without WWW-Authenticate")
    return wrong


def test_lists_hold_only_what_the_caller_may_read(world: World) -> None:
    other = world.study(project="p2", with_trial=False)
    seen = {}
    for role in ("admin", "member", "viewer", "other"):
        r = world.client.get("/v1/studies?limit=500", headers=world.headers(role))
        seen[role] = {s["id"] for s in r.json()["items"]}
        projects = {
            p["name"] for p in world.client.get("/v1/projects", headers=world.headers(role)).json()
        }
        if role in ("member", "viewer"):
            assert projects == {"p1"}
        if role == "other":
            assert projects == {"p2"}
    assert {world.sid, other} <= seen["admin"]
    assert world.sid in seen["member"] and other not in seen["member"]
    assert world.sid in seen["viewer"] and other not in seen["viewer"]
    assert seen["other"] == {other}


def test_a_study_of_another_project_and_a_missing_one_look_the_same(shared_world: World) -> None:
    as_other = shared_world.client.get(
        f"/v1/studies/{shared_world.sid}", headers=shared_world.headers("other")
    )
    missing = shared_world.client.get(
        "/v1/studies/0123456789ab", headers=shared_world.headers("other")
    )
    assert as_other.status_code == missing.status_code == 404
    assert as_other.json()["error"]["code"] == missing.json()["error"]["code"]
    assert re.sub(r"[0-9a-f]{12}", "X", as_other.text) == re.sub(r"[0-9a-f]{12}", "X", missing.text)


def test_code_belongs_to_the_project_that_uploaded_it(world: World) -> None:
    up = world.client.post(
        "/v1/code",
        content=_zip(),
        params={"project": "p1"},
        headers={**world.headers("member"), "Content-Type": "application/zip"},
    )
    assert up.status_code == 201, up.text
    digest = up.json()["sha256"]
    spec = tiny_spec(name="borrow", project="p2", code={"sha256": digest, "modules": ["x.y"]})
    r = world.client.post("/v1/studies", json=spec, headers=world.headers("other"))
    assert r.status_code == 422 and r.json()["error"]["field"] == "code.sha256"  # not its code
    again = world.client.post(
        "/v1/code",
        content=_zip(),
        params={"project": "p2"},
        headers={**world.headers("other"), "Content-Type": "application/zip"},
    )
    assert again.status_code == 201 and again.json()["sha256"] == digest  # uploads it too


def test_code_zip_answers_404_to_a_wrong_credential(world: World) -> None:
    up = world.client.post(
        "/v1/code",
        content=_zip(),
        params={"project": "p1"},
        headers={**world.headers("admin"), "Content-Type": "application/zip"},
    )
    digest = up.json()["sha256"]
    with world.db.session() as s:
        s.get(Study, world.sid).code_sha256 = digest
    key = code_url_key(world.client.app.state.settings)
    good = world.client.get(
        f"/v1/studies/{world.sid}/code.zip", params={"token": code_token(key, world.sid, digest)}
    )
    assert good.status_code == 200
    for token in ("0" * 64, code_token(key, "0123456789ab", digest)):
        bad = world.client.get(f"/v1/studies/{world.sid}/code.zip", params={"token": token})
        assert bad.status_code == 404


def test_tokens_rotate_and_revoke_and_are_stored_hashed(world: World) -> None:
    me = world.client.get("/v1/whoami", headers=world.headers("member")).json()
    assert me == {"name": "mia", "admin": False, "projects": {"p1": "member"}, "via": "token"}
    second = world.client.post(
        "/v1/users/mia/tokens", json={}, headers=world.headers("member")
    ).json()
    assert second["token"].startswith("ftk_") and len(second["token"]) >= 4 + 12 + 1 + 43
    both = [world.tokens["member"], second["token"]]
    for token in both:
        assert (
            world.client.get("/v1/whoami", headers={"Authorization": f"Bearer {token}"}).status_code
            == 200
        )
    with world.db.session(readonly=True) as s:
        rows = s.execute(text("SELECT * FROM api_tokens")).all()
    stored = " ".join(str(v) for row in rows for v in row)
    assert all(t.split("_", 2)[2] not in stored for t in both)  # only hashes are kept
    r = world.client.post(
        "/v1/users/mia/revoke",
        json={"token_id": second["token_id"]},
        headers=world.headers("admin"),
    )
    assert r.json() == {"revoked": 1}
    gone = world.client.get("/v1/whoami", headers={"Authorization": f"Bearer {second['token']}"})
    assert gone.status_code == 401 and gone.json()["error"]["code"] == "invalid_token"
    assert world.client.get("/v1/whoami", headers=world.headers("member")).status_code == 200


def test_project_usage_against_quota_in_the_api_and_in_metrics(world: World) -> None:
    """``GET /v1/projects/{p}`` shows usage against quota; /metrics exports it per project to a
    scrape with the scrape token. The world's running study of p1 reserves 1 trial
    (max_concurrent 1)."""
    r = world.client.put(
        "/v1/projects/p1/quota",
        json={"gpus": 8, "trials": 4, "studies": 3, "gpu_hours": 12.5},
        headers=world.headers("admin"),
    )
    quota = {"gpus": 8.0, "trials": 4, "studies": 3, "gpu_hours": 12.5}
    assert r.status_code == 200 and r.json()["quota"] == quota
    p1 = world.client.get("/v1/projects/p1", headers=world.headers("viewer")).json()
    assert p1["usage"]["studies"]["running"] == 1 and p1["usage"]["trials"] == 1
    assert p1["usage"]["gpu_hours"] == 0.0  # its running study holds no GPU
    scrape = {"Authorization": f"Bearer {SCRAPE_TOKEN}"}
    text = world.client.get("/metrics", headers=scrape).text
    assert 'fedtune_project_quota_gpus{project="p1"} 8.0' in text
    assert 'fedtune_project_quota_gpu_hours{project="p1"} 12.5' in text
    assert 'fedtune_project_gpu_hours{project="p1"} 0.0' in text
    assert 'fedtune_project_reserved_trials{project="p1"} 1.0' in text
    assert 'fedtune_project_quota_gpus{project="p2"}' not in text  # unlimited: no sample


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"studies": 576460752303423489}, "studies"),  # overflowed the INTEGER column: was a 500
        ({"trials": 2**31}, "trials"),
        ({"trials": -1}, "trials"),
        ({"trials": 1.5}, "trials"),
        ({"gpus": 1e300}, "gpus"),
        ({"gpus": True}, "gpus"),
        ({"gpu_hours": -1}, "gpu_hours"),
        ({"gpu_hours": 1e10}, "gpu_hours"),
        ({"gpu_hours": "2h"}, "gpu_hours"),
        ({"weight": 5e-324}, "weight"),  # feeds the fair-share division: was accepted
        ({"weight": 0}, "weight"),
        ({"weight": None}, "weight"),
        ({"weight": 1e7}, "weight"),
        ({"max_priority": False}, "max_priority"),  # a bool is no number: was accepted
        ({"max_priority": -1}, "max_priority"),
        ({"max_priority": 1001}, "max_priority"),
        ({"max_priority": None}, "max_priority"),
    ],
)
def test_quota_weight_and_priority_are_bounded(shared_world: World, body, field) -> None:
    r = shared_world.client.put(
        "/v1/projects/p1/quota", json=body, headers=shared_world.headers("admin")
    )
    assert r.status_code == 422, r.text
    assert r.json()["error"]["field"].rsplit(".", 1)[-1] == field, r.json()


def test_the_bounds_themselves_are_accepted(world: World) -> None:
    top = {
        "gpus": 100_000,
        "trials": 1_000_000,
        "studies": 1_000_000,
        "gpu_hours": 1e9,
        "weight": 1e6,
        "max_priority": 1000,
    }
    low = {"gpus": 0, "trials": 0, "studies": 0, "gpu_hours": 0, "weight": 1e-3, "max_priority": 0}
    unlimited = {"gpus": None, "trials": None, "studies": None, "gpu_hours": None}
    for body in (top, low, unlimited):
        r = world.client.put("/v1/projects/p1/quota", json=body, headers=world.headers("admin"))
        assert r.status_code == 200, r.text


def test_what_the_schema_declares_valid_is_accepted(world: World) -> None:
    """The name pattern, the role enum and the bounds are in the OpenAPI document, so a value
    it declares valid is not refused, and one it declares invalid is refused (422)."""
    doc = world.client.get("/openapi.json").json()
    schemas = doc["components"]["schemas"]
    name = schemas["ProjectIn"]["properties"]["name"]
    assert name["pattern"] == identity.NAME.pattern and name["maxLength"] == 63
    assert schemas["UserIn"]["properties"]["name"]["pattern"] == identity.NAME.pattern
    assert schemas["UserIn"]["properties"]["role"]["enum"] == list(identity.ROLES)
    assert schemas["RoleIn"]["properties"]["role"]["enum"] == list(identity.ROLES)
    priority = schemas["QuotaIn"]["properties"]["max_priority"]
    assert (priority["minimum"], priority["maximum"], priority["type"]) == (0, 1000, "integer")
    assert schemas["QuotaIn"]["properties"]["weight"]["minimum"] == 1e-3
    for path in ("/v1/users", "/v1/projects"):
        assert "409" in doc["paths"][path]["post"]["responses"], path
    admin = world.headers("admin")
    for body in (
        {"name": "Bad_Name"},
        {"name": "-x"},
        {"name": "x", "role": "owner"},
        {"name": "x", "admin": 1},
    ):
        assert world.client.post("/v1/users", json=body, headers=admin).status_code == 422, body
    assert world.client.post("/v1/projects", json={"name": "a"}, headers=admin).status_code == 201
    again = world.client.post("/v1/projects", json={"name": "a"}, headers=admin)
    assert again.status_code == 409 and again.json()["error"]["code"]
    r = world.client.put("/v1/users/nemo/projects/p3", json={"role": "owner"}, headers=admin)
    assert r.status_code == 422 and r.json()["error"]["field"].endswith("role")


def test_the_cli_bounds_quotas_as_the_api_does(world: World, capsys) -> None:
    from fedtune.cli import main

    url = str(world.db.url) if hasattr(world.db, "url") else None
    argv = ["projects", "quota", "p1", "--studies", "576460752303423489", "--database-url", url]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "studies" in err and "between 0 and" in err and "DataError" not in err
    assert main(["projects", "quota", "p1", "--weight", "5e-324", "--database-url", url]) == 2
    assert "weight" in capsys.readouterr().err
    assert main(["projects", "quota", "p1", "--weight", "2", "--database-url", url]) == 0
    capsys.readouterr()
    assert main(["projects", "quota", "p1", "--gpu-hours", "-1", "--database-url", url]) == 2
    assert "gpu_hours" in capsys.readouterr().err
    assert main(["projects", "quota", "p1", "--gpu-hours", "40", "--database-url", url]) == 0
    assert json.loads(capsys.readouterr().out)["quota"]["gpu_hours"] == 40.0
    assert main(["projects", "list", "--database-url", url]) == 0
    line = next(x for x in capsys.readouterr().out.splitlines() if x.startswith("p1 "))
    assert "gpu-hours 0/40" in line
    argv = ["projects", "quota", "p1", "--unlimited", "gpu_hours", "--database-url", url]
    assert main(argv) == 0
    assert json.loads(capsys.readouterr().out)["quota"]["gpu_hours"] is None
