"""Projects all the way into MLflow, against a real ``mlflow server`` with workspaces and auth.

One server (``fedtune mlflow-server``: ``--enable-workspaces --app-name fedtune``, MLflow's
basic-auth app with the user list scoped, ``fedtune/service/mlflow_app.py``; SQLite backend,
served artifacts) for
the module; :class:`~fedtune.service.mlflow_tenancy.MlflowTenancy` syncs two projects
(``team-a``, ``team-b``) and three users into it: ``ana`` (member of team-a), ``vic`` (viewer of
team-a) and ``bob`` (member of team-b). Each study driver logs with its workspace's driver
credential through fedtune's own :class:`~fedtune.tuning.mlflow.tracking.StudyTracker`. Then every
experiment, run, metric-history and artifact route answers each user according to role.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from fedtune.service.mlflow_tenancy import MlflowTenancy
from fedtune.service.mlflow_workspaces import driver_user, workspace_for
from tests.integration.conftest import BIN, stop_group, wait_http
from tests.ports import free_port

ADMIN_PASSWORD = "tenancy-admin-password-0123456789"


def start_server(root: Path, *options: str) -> tuple[subprocess.Popen, str]:
    """``fedtune mlflow-server`` (``mlflow server --enable-workspaces --app-name fedtune`` with
    basic auth, as the chart runs it) on a free port of 127.0.0.1.

    Args:
        root: Folder of its databases, artifacts, auth config and log (``server.log``).
        *options: More of its options (``--workers 2``, ``--backend-store-uri …``).

    Returns:
        The process (its own session) and its base URL, once ``/health`` answers.
    """
    port = free_port()
    env = {**os.environ, "MLFLOW_AUTH_ADMIN_PASSWORD": ADMIN_PASSWORD}
    for name in ("MLFLOW_TRACKING_URI", "MLFLOW_WORKSPACE", "MLFLOW_BACKEND_STORE_URI"):
        env.pop(name, None)
    cmd = [
        str(BIN / "fedtune"),
        "mlflow-server",
        "--dir",
        str(root / "mlflow"),
        "--port",
        str(port),
        *options,
    ]
    log = root / "server.log"
    with log.open("w") as fh:
        proc = subprocess.Popen(
            cmd, stdout=fh, stderr=subprocess.STDOUT, env=env, start_new_session=True
        )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_http(f"{url}/health", proc, timeout=150, log=log)
    except BaseException:
        stop_group(proc)
        raise
    return proc, url


@pytest.fixture(scope="module")
def mlflow_auth_server(tmp_path_factory) -> Iterator[str]:
    """A real MLflow server with workspaces and basic auth (one retry on a failed start)."""
    proc = None
    for attempt in (1, 2):
        root = tmp_path_factory.mktemp(f"mlflow-auth-{attempt}")
        try:
            proc, url = start_server(root)
            break
        except (RuntimeError, TimeoutError):
            if attempt == 2:
                raise
    try:
        yield url
    finally:
        stop_group(proc)


@pytest.fixture(scope="module")
def world(mlflow_auth_server, tmp_path_factory) -> Iterator[dict]:
    """Two projects, three users and one study of each project, logged by its driver."""
    from fedtune.tuning.mlflow.tracking import StudyTracker

    url = mlflow_auth_server
    tenancy = MlflowTenancy(url, "admin", ADMIN_PASSWORD)
    roles = {"ana": {"team-a": "member"}, "vic": {"team-a": "viewer"}, "bob": {"team-b": "member"}}
    first = tenancy.sync(["team-a", "team-b"], roles)
    assert {"team-a", "team-b"} <= set(first.workspaces)
    assert not tenancy.sync(["team-a", "team-b"], roles).changed  # idempotent
    passwords = {name: tenancy.issue_password(name) for name in roles}
    studies = {}
    saved = {k: os.environ.get(k) for k in tenancy.driver_env("x")}
    try:
        for project in ("team-a", "team-b"):
            os.environ.update(tenancy.driver_env(project))
            tracker = StudyTracker(url, f"study-{project}")
            run = tracker.client.create_run(tracker.experiment_id, run_name="parent")
            run_id = run.info.run_id
            tracker.client.log_metric(run_id, "loss", 0.5, step=1)
            tracker.client.log_text(run_id, "hello", "note.txt")
            studies[project] = {
                "experiment_id": tracker.experiment_id,
                "run_id": run_id,
                "artifact_uri": run.info.artifact_uri,
            }
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    yield {"url": url, "tenancy": tenancy, "passwords": passwords, "studies": studies}
    tenancy.close()


def client(world: dict, user: str, project: str) -> httpx.Client:
    return httpx.Client(
        base_url=world["url"],
        auth=(user, world["passwords"][user]),
        headers={"X-MLFLOW-WORKSPACE": workspace_for(project)},
        timeout=30,
    )


def reads(world: dict, user: str, project: str, target: str) -> dict[str, int]:
    """The status of every read route of ``target``'s study for ``user`` in ``project``."""
    study = world["studies"][target]
    run, exp = study["run_id"], study["experiment_id"]
    rel = study["artifact_uri"].split("mlflow-artifacts:/", 1)[1]
    with client(world, user, project) as c:
        return {
            "experiments/get": c.get(
                "/api/2.0/mlflow/experiments/get", params={"experiment_id": exp}
            ).status_code,
            "experiments/get-by-name": c.get(
                "/api/2.0/mlflow/experiments/get-by-name",
                params={"experiment_name": f"study-{target}"},
            ).status_code,
            "runs/get": c.get("/api/2.0/mlflow/runs/get", params={"run_id": run}).status_code,
            "metrics/get-history": c.get(
                "/api/2.0/mlflow/metrics/get-history", params={"run_id": run, "metric_key": "loss"}
            ).status_code,
            "metrics/get-history-bulk-interval": c.get(
                "/ajax-api/2.0/mlflow/metrics/get-history-bulk-interval",
                params={"run_ids": run, "metric_key": "loss"},
            ).status_code,
            "artifacts/list": c.get(
                "/api/2.0/mlflow/artifacts/list", params={"run_id": run}
            ).status_code,
            "get-artifact": c.get(
                "/get-artifact", params={"run_id": run, "path": "note.txt"}
            ).status_code,
            "mlflow-artifacts": c.get(
                f"/api/2.0/mlflow-artifacts/artifacts/{rel}/note.txt"
            ).status_code,
        }


def listed(world: dict, user: str, project: str) -> tuple[set[str], set[str]]:
    """The experiment names and run ids ``user`` sees listed in ``project``'s workspace."""
    ids = [s["experiment_id"] for s in world["studies"].values()]
    with client(world, user, project) as c:
        exps = c.post("/api/2.0/mlflow/experiments/search", json={"max_results": 100})
        runs = c.post("/api/2.0/mlflow/runs/search", json={"experiment_ids": ids})
    assert exps.status_code == 200 and runs.status_code == 200
    names = {e["name"] for e in exps.json().get("experiments", [])}
    run_ids = {r["info"]["run_id"] for r in runs.json().get("runs", [])}
    return names, run_ids


def test_studies_land_in_their_projects_workspace(world):
    tenancy: MlflowTenancy = world["tenancy"]
    for project, study in world["studies"].items():
        with httpx.Client(base_url=world["url"], auth=("admin", ADMIN_PASSWORD)) as admin:
            body = admin.get(
                "/api/2.0/mlflow/experiments/get",
                params={"experiment_id": study["experiment_id"]},
                headers={"X-MLFLOW-WORKSPACE": project},
            ).json()
        assert body["experiment"]["workspace"] == project
        assert tenancy.driver_env(project)["MLFLOW_TRACKING_USERNAME"] == driver_user(project)


@pytest.mark.parametrize("user", ["ana", "vic"])
def test_team_a_reads_its_runs(world, user):
    assert set(reads(world, user, "team-a", "team-a").values()) == {200}
    names, runs = listed(world, user, "team-a")
    assert names == {"study-team-a"}
    assert runs == {world["studies"]["team-a"]["run_id"]}


def test_bob_reads_team_b_only(world):
    assert set(reads(world, "bob", "team-b", "team-b").values()) == {200}
    assert listed(world, "bob", "team-b") == (
        {"study-team-b"},
        {world["studies"]["team-b"]["run_id"]},
    )


@pytest.mark.parametrize(
    ("user", "project", "target"),
    [
        ("bob", "team-b", "team-a"),  # the other project's runs, from his workspace
        ("bob", "team-a", "team-a"),  # ... and naming their workspace
        ("ana", "team-a", "team-b"),
        ("vic", "team-b", "team-b"),
    ],
)
def test_other_projects_runs_are_hidden(world, user, project, target):
    answers = reads(world, user, project, target)
    assert set(answers.values()) <= {403, 404}, answers
    names, runs = listed(world, user, project)
    assert f"study-{target}" not in names
    assert world["studies"][target]["run_id"] not in runs


@pytest.mark.parametrize("route", ["/api/2.0/mlflow/users/list", "/ajax-api/2.0/mlflow/users/list"])
def test_a_member_lists_only_the_users_of_their_own_projects(world, route):
    """MLflow's basic-auth app lists every user to any member: the other projects' members and
    drivers (``fedtune-driver-<project>``), so their names. fedtune's app lists a member the
    users sharing a workspace with them; an admin still sees everyone."""

    def answer(user: str, project: str, auth=None) -> httpx.Response:
        with httpx.Client(base_url=world["url"], timeout=30) as c:
            return c.get(
                route,
                auth=auth or (user, world["passwords"][user]),
                headers={"X-MLFLOW-WORKSPACE": workspace_for(project)},
            )

    def names(user: str, project: str, auth=None) -> set[str]:
        listed = answer(user, project, auth)
        assert listed.status_code == 200, listed.text
        return {u["username"] for u in listed.json()["users"]}

    team_a = {"ana", "vic", driver_user(workspace_for("team-a"))}
    assert names("ana", "team-a") == team_a
    assert names("bob", "team-b") == {"bob", driver_user(workspace_for("team-b"))}
    assert answer("vic", "team-a").status_code == 403  # MLflow lists users to members only
    assert answer("bob", "team-a").status_code == 403  # and in their own workspaces
    everyone = names("admin", "team-a", auth=("admin", ADMIN_PASSWORD))
    assert team_a | {"bob", driver_user(workspace_for("team-b"))} <= everyone


def test_member_edits_viewer_only_reads(world):
    study = world["studies"]["team-a"]
    log = {"run_id": study["run_id"], "key": "loss", "value": 0.1, "timestamp": 1, "step": 2}
    with client(world, "ana", "team-a") as ana, client(world, "vic", "team-a") as vic:
        assert ana.post("/api/2.0/mlflow/runs/log-metric", json=log).status_code == 200
        new = {"experiment_id": study["experiment_id"]}
        assert ana.post("/api/2.0/mlflow/runs/create", json=new).status_code == 200
        assert vic.post("/api/2.0/mlflow/runs/log-metric", json=log).status_code == 403
        assert vic.post("/api/2.0/mlflow/runs/create", json=new).status_code == 403
        created = vic.post("/api/2.0/mlflow/experiments/create", json={"name": "vic-exp"})
        assert created.status_code == 403
    with client(world, "bob", "team-a") as bob:
        assert bob.post("/api/2.0/mlflow/runs/log-metric", json=log).status_code in (403, 404)


def test_driver_writes_only_its_workspace(world):
    env = world["tenancy"].driver_env("team-b")
    auth = (env["MLFLOW_TRACKING_USERNAME"], env["MLFLOW_TRACKING_PASSWORD"])
    study = world["studies"]["team-a"]
    with httpx.Client(base_url=world["url"], auth=auth, timeout=30) as driver:
        for workspace in ("team-a", "default"):
            made = driver.post(
                "/api/2.0/mlflow/experiments/create",
                json={"name": "intruder"},
                headers={"X-MLFLOW-WORKSPACE": workspace},
            )
            assert made.status_code == 403
        run = driver.post(
            "/api/2.0/mlflow/runs/create",
            json={"experiment_id": study["experiment_id"]},
            headers={"X-MLFLOW-WORKSPACE": "team-a"},
        )
        assert run.status_code in (403, 404)


def test_role_change_and_revocation_take_effect_on_sync(world):
    tenancy: MlflowTenancy = world["tenancy"]
    roles = {"ana": {"team-a": "member"}, "vic": {"team-a": "viewer"}, "bob": {"team-b": "member"}}
    # bob becomes a viewer of team-a, too
    moved = {**roles, "bob": {"team-b": "member", "team-a": "viewer"}}
    assert tenancy.sync(["team-a", "team-b"], moved).assigned == ["bob:team-a:fedtune-viewer"]
    assert set(reads(world, "bob", "team-a", "team-a").values()) == {200}
    # ... and loses it again
    assert tenancy.sync(["team-a", "team-b"], roles).unassigned == ["bob:team-a:fedtune-viewer"]
    assert set(reads(world, "bob", "team-a", "team-a").values()) <= {403, 404}
    # vic is disabled: her MLflow user goes, so her login fails
    without = {k: v for k, v in roles.items() if k != "vic"}
    report = tenancy.sync(["team-a", "team-b"], without, disabled=["vic"])
    assert report.deleted == ["vic"]
    with client(world, "vic", "team-a") as vic:
        assert vic.post("/api/2.0/mlflow/experiments/search", json={}).status_code == 401
    tenancy.sync(["team-a", "team-b"], roles)
    world["passwords"]["vic"] = tenancy.issue_password("vic")
    assert set(reads(world, "vic", "team-a", "team-a").values()) == {200}


def test_the_service_makes_workspaces_logins_and_revokes_them(world, tmp_path):
    """Through the API: a new project gets its workspace at once; a member asks for its MLflow
    login and uses it; once its tokens are revoked, the next sync deletes that login."""
    from fastapi.testclient import TestClient

    from fedtune.service.api.app import create_app
    from fedtune.service.settings import load_settings

    bootstrap = "bootstrap-token-0123456789abcdef"
    settings = load_settings(
        database_url=f"sqlite:///{tmp_path}/fedtune.db",
        api_token=bootstrap,
        workdir=str(tmp_path / "work"),
        mlflow_workspaces=True,
        mlflow_tracking_uri=world["url"],
        mlflow_admin_password=ADMIN_PASSWORD,
    )
    admin_headers = {"Authorization": f"Bearer {bootstrap}"}
    with (
        TestClient(create_app(settings, backend=None, schedule=False)) as api,
        httpx.Client(base_url=world["url"], auth=("admin", ADMIN_PASSWORD), timeout=30) as admin,
    ):
        # MLflow's own admin (also fedtune's bootstrap admin's name) gets no new password
        refused = api.post("/v1/users/admin/mlflow-login", headers=admin_headers)
        assert refused.status_code == 403
        assert admin.get("/api/3.0/mlflow/workspaces").status_code == 200
        made = api.post("/v1/projects", json={"name": "team-c"}, headers=admin_headers)
        assert made.status_code == 201, made.text
        assert admin.get("/api/3.0/mlflow/workspaces/team-c").status_code == 200
        user = api.post(
            "/v1/users",
            json={"name": "cleo", "project": "team-c", "role": "member"},
            headers=admin_headers,
        )
        token = user.json()["token"]
        login = api.post(
            "/v1/users/cleo/mlflow-login", headers={"Authorization": f"Bearer {token}"}
        )
        assert login.status_code == 201, login.text
        assert login.json()["workspaces"] == ["team-c"]
        assert ADMIN_PASSWORD not in login.text
        cleo = httpx.Client(
            base_url=world["url"],
            auth=("cleo", login.json()["password"]),
            headers={"X-MLFLOW-WORKSPACE": "team-c"},
            timeout=30,
        )
        assert cleo.post("/api/2.0/mlflow/experiments/create", json={"name": "c1"}).is_success
        other = cleo.post(
            "/api/2.0/mlflow/experiments/search",
            json={"max_results": 100},
            headers={"X-MLFLOW-WORKSPACE": "team-a"},
        )
        assert other.status_code in (200, 403) and "study-team-a" not in other.text
        tenancy = api.app.state.runtime.ctx.tenancy
        assert "cleo" not in tenancy.sync_now().deleted
        revoked = api.post("/v1/users/cleo/revoke", json={}, headers=admin_headers)
        assert revoked.status_code == 200, revoked.text
        assert "cleo" in tenancy.sync_now().deleted
        denied = cleo.post("/api/2.0/mlflow/experiments/search", json={"max_results": 100})
        assert denied.status_code == 401


def test_a_comparison_run_obeys_the_same_rules(world, monkeypatch, tmp_path):
    """The service records a comparison of team-a's studies in team-a's workspace (its own MLflow
    calls under ``mlflow_workspace``): team-a reads it, only its member may edit it, team-b's
    member neither finds nor lists it."""
    from types import SimpleNamespace

    from mlflow import MlflowClient

    from fedtune.service.mlflow_workspaces import mlflow_workspace
    from fedtune.tuning.analysis.compare import RunRef, StudyInput, compare
    from fedtune.tuning.analysis.tradeoff import TrialCurve, analyze_tradeoff
    from fedtune.tuning.mlflow.comparisons import record_comparison

    url, study = world["url"], world["studies"]["team-a"]
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "admin")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", ADMIN_PASSWORD)
    settings = SimpleNamespace(mlflow_workspaces=True)
    task = {"name": "quadratic", "clients": 4, "dim": 2, "seed": 0}
    inputs = []
    with mlflow_workspace(settings, "team-a"):
        second = MlflowClient(url).create_run(study["experiment_id"], run_name="parent-2")
        for i, (run_id, algorithm) in enumerate(
            [(study["run_id"], "fedavg"), (second.info.run_id, "fedprox")]
        ):
            curve = TrialCurve(0, {"client_lr": 0.1}, [1, 2, 3], [3.0, 2.0 - i, 1.5 - i])
            doc = {"name": f"s{i}", "algorithm": algorithm, "task": task, "objective": {}}
            t = analyze_tradeoff([curve], last_rounds=2, smooth_window=1).to_dict()
            run = RunRef(url, study["experiment_id"], run_id)
            inputs.append(StudyInput(label=f"s{i}", document=doc, tradeoff=t, run=run))
        done = record_comparison(compare(inputs), tmp_path, url, parent_uris={"s0": url, "s1": url})
    assert done["experiment_id"] == study["experiment_id"]  # beside the compared studies
    for user in ("ana", "vic"):
        with client(world, user, "team-a") as c:
            got = c.get("/api/2.0/mlflow/runs/get", params={"run_id": done["run_id"]})
            assert got.status_code == 200
            assert got.json()["run"]["data"]["tags"]
        assert done["run_id"] in listed(world, user, "team-a")[1]
    for project in ("team-b", "team-a"):
        with client(world, "bob", project) as c:
            got = c.get("/api/2.0/mlflow/runs/get", params={"run_id": done["run_id"]})
            assert got.status_code in (403, 404)
        assert done["run_id"] not in listed(world, "bob", project)[1]
    log = {"run_id": done["run_id"], "key": "x", "value": 1.0, "timestamp": 1, "step": 0}
    with client(world, "vic", "team-a") as vic, client(world, "ana", "team-a") as ana:
        assert vic.post("/api/2.0/mlflow/runs/log-metric", json=log).status_code == 403
        assert ana.post("/api/2.0/mlflow/runs/log-metric", json=log).status_code == 200


def test_an_oidc_users_mlflow_roles_follow_its_groups(world, tmp_path):
    """An OIDC user (no fedtune token, roles from its groups ``fedtune:<project>[:viewer]``) asks
    for its MLflow login with its JWT: its MLflow roles are its groups' at that moment, and the
    next login after its groups change replaces them."""
    from fastapi.testclient import TestClient

    from fedtune.service.api.app import create_app
    from fedtune.service.settings import load_settings
    from tests.service.test_oidc import Issuer

    issuer = Issuer()
    settings = load_settings(
        database_url=f"sqlite:///{tmp_path}/fedtune.db",
        oidc_issuer=issuer.url,
        oidc_audience="fedtune",
        workdir=str(tmp_path / "work"),
        mlflow_workspaces=True,
        mlflow_tracking_uri=world["url"],
        mlflow_admin_password=ADMIN_PASSWORD,
    )
    study = world["studies"]["team-a"]
    log = {"run_id": study["run_id"], "key": "loss", "value": 0.2, "timestamp": 1, "step": 3}
    try:
        with TestClient(create_app(settings, backend=None, schedule=False)) as api:

            def login(groups: tuple[str, ...]) -> httpx.Client:
                jwt = issuer.token(groups=groups)
                r = api.post(
                    "/v1/users/alice/mlflow-login", headers={"Authorization": f"Bearer {jwt}"}
                )
                assert r.status_code == 201, r.text
                return httpx.Client(
                    base_url=world["url"], auth=("alice", r.json()["password"]), timeout=30
                )

            a = {"X-MLFLOW-WORKSPACE": "team-a"}
            search = {"max_results": 100}
            b = {"X-MLFLOW-WORKSPACE": "team-b"}
            run = {"run_id": study["run_id"]}
            with login(("fedtune:team-a:viewer",)) as alice:
                assert (
                    alice.get("/api/2.0/mlflow/runs/get", params=run, headers=a).status_code == 200
                )
                wrote = alice.post("/api/2.0/mlflow/runs/log-metric", json=log, headers=a)
                assert wrote.status_code == 403
                theirs = alice.post("/api/2.0/mlflow/experiments/search", json=search, headers=b)
                assert theirs.status_code in (200, 403) and "study-team-b" not in theirs.text
            with login(("fedtune:team-b",)) as alice:  # its groups changed: a new login
                read = alice.get("/api/2.0/mlflow/runs/get", params=run, headers=a)
                assert read.status_code in (403, 404)
                mine = alice.post("/api/2.0/mlflow/experiments/search", json=search, headers=b)
                assert mine.status_code == 200 and "study-team-b" in mine.text
    finally:
        issuer.server.shutdown()
        issuer.server.server_close()
