"""The service end to end: a real ``fedtune serve`` (uvicorn subprocess on a free port, stopped
or SIGKILLed by its PID), driven through the SDK, running real (tiny) studies with the local
backend — embedded Ray, Optuna, MLflow.

* a study from submission to trade-off and MLflow runs, on SQLite and on PostgreSQL;
* ``kill -9`` of the service and of the study driver mid-study, restart: the study resumes and
  ends with exactly the requested trials, none lost or repeated;
* cancelling a running study stops its driver and marks its MLflow runs KILLED;
* 20 concurrent submissions; bearer-token authentication; an OpenAPI fuzz run (schemathesis)
  of every operation as an admin, a member and a viewer on PostgreSQL, with zero 5xx answers
  and every answer as the OpenAPI document states it.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest

from fedtune.client import Client, StudyStatus
from fedtune.service.db import Database
from fedtune.service.models import CodePackageRow
from fedtune.service.repository import Repository
from fedtune.service.states import StudyState, TrialState
from tests.needs import need
from tests.service.helpers import Server, pg_schema, pg_unreachable_reason, tiny_spec

pytestmark = pytest.mark.slow
FUZZ_REQUEST_TIMEOUT_S = 120

TOKEN = "e2e-token-0123456789abcdef"
#: scheduler ticks and test polls every 0.5 s: a 0.2 s tick costs an idle service ~2 % of a core
#: (0.6 CPU-s in 30 s, against 0.05 at 1 s), and each status poll ~8 ms of CPU
FAST = {"FEDTUNE_SCHEDULER_INTERVAL_S": "0.5", "FEDTUNE_HEARTBEAT_S": "1"}
POLL_S = 0.5


def service_env(
    root: Path,
    backend: str = "local",
    token: str | None = TOKEN,
    database_url: str | None = None,
    **extra: str,
) -> dict[str, str]:
    """The settings of a test's service kept under ``root`` (its SQLite file unless
    ``database_url``, its workdir), quick scheduler ticks, and ``extra``."""
    return {
        "FEDTUNE_DATABASE_URL": database_url or f"sqlite:///{root / 'fedtune.db'}",
        "FEDTUNE_WORKDIR": str(root / "work"),
        "FEDTUNE_BACKEND": backend,
        "FEDTUNE_API_TOKEN": token or "",
        **FAST,
        **extra,
    }


def _server(
    root: Path,
    database_url: str | None = None,
    backend: str = "local",
    token: str | None = TOKEN,
    log: str = "serve.log",
    **extra: str,
) -> Server:
    """A started server kept under ``root``, running one study at a time."""
    env = service_env(
        root, backend, token, database_url, **{"FEDTUNE_MAX_CONCURRENT_STUDIES": "1", **extra}
    )
    env.pop("MLFLOW_TRACKING_URI", None)
    server = Server(env, root / log)
    return server.start(timeout=120)  # a loaded machine: 60 s was seen to be too short


def _stop(server: Server) -> None:
    server.stop()
    _kill_drivers(server.env["FEDTUNE_DATABASE_URL"])


@pytest.fixture
def serve(tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """``serve(database_url=..., backend=..., token=...)`` → a started server; all stopped after."""
    servers: list[Server] = []

    def start(*args, **kwargs) -> Server:
        servers.append(_server(tmp_path, *args, **kwargs))
        return servers[-1]

    yield start
    for server in servers:
        _stop(server)


#: the roots of the module's local services started so far (:func:`local_server`)
_LOCAL_STARTED: set[Path] = set()


@pytest.fixture(scope="module")
def local_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SQLite store and workdir of the module's local service (:func:`local_server`)."""
    return tmp_path_factory.mktemp("local")


@pytest.fixture(scope="module")
def local_server(local_root: Path) -> Iterator[Server]:
    """A service with the local backend on SQLite, shared by the tests that each run one study
    on it to its end or cancel it (one starts only when the one before has ended: a study at a
    time), and look only at their own study: one service's start, not one per test. The
    kill -9 test comes first: its killed service ran on this store, and this one is its
    restart (one service's start less)."""
    _LOCAL_STARTED.add(local_root)
    server = _server(local_root)
    try:
        yield server
    finally:
        _stop(server)


@pytest.fixture(scope="module")
def queue_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """A service that runs no study (backend ``none``), shared by the tests that only submit
    to it or read from it: its studies stay queued, and the only test that submits any
    (``test_twenty_concurrent_submissions``) is the only one that counts them."""
    root = tmp_path_factory.mktemp("queue")
    server = Server(service_env(root, "none"), root / "serve.log")
    server.env.pop("MLFLOW_TRACKING_URI", None)
    try:
        yield server.start()
    finally:
        server.stop()


def _kill_drivers(url: str) -> None:
    """Safety net: SIGKILL the process groups of drivers the test's servers left behind."""
    with contextlib.suppress(Exception):
        db = Database(url)
        with db.session(readonly=True) as s:
            refs = [st.driver_ref for st in Repository(s).page_studies(limit=500)]
        db.dispose()
        for ref in refs:
            if ref and "pid" in ref and _same_process(ref):
                with contextlib.suppress(OSError):
                    os.killpg(ref["pid"], signal.SIGKILL)


def _same_process(ref: dict) -> bool:
    from fedtune.service.backends.local import process_start_ticks

    return process_start_ticks(ref["pid"]) == ref.get("start_ticks")


def _sdk(server: Server, token: str | None = TOKEN) -> Client:
    return Client(server.url, token=token, timeout=30)


def _watch(study, timeout: float) -> list[StudyStatus]:
    seen, deadline = [], time.monotonic() + timeout
    while time.monotonic() < deadline:
        seen.append(study.status())
        if seen[-1].done:
            return seen
        time.sleep(POLL_S)
    raise AssertionError(f"study not done after {timeout} s: {seen[-1]}")


def _until(predicate, timeout: float, what: str, poll_s: float = POLL_S):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(poll_s)
    raise AssertionError(f"timed out waiting for {what}")


def _driver_ref(url: str, study_id: str) -> dict:
    db = Database(url)
    try:
        with db.session(readonly=True) as s:
            return dict(Repository(s).require_study(study_id).driver_ref or {})
    finally:
        db.dispose()


def _mlflow_runs(
    status: StudyStatus, server: Server | None = None, local_store: str | None = None
) -> tuple[object, list]:
    """The study's MLflow parent run and children. The service shows an MLflow server's URI
    (credentials removed) but never a local store's path on its own disk:
    then the test, which knows the store (``local_store``, else the server's workdir's),
    finds it itself."""
    from mlflow.tracking import MlflowClient

    from fedtune.service.paths import study_tracking_uri
    from fedtune.service.settings import load_settings

    uri = status.mlflow.tracking_uri or local_store
    if uri is None:
        assert server is not None, "a local MLflow store: pass the server"
        uri = study_tracking_uri(load_settings(workdir=server.env["FEDTUNE_WORKDIR"]), status.id)
    client = MlflowClient(tracking_uri=uri)
    parent = client.get_run(status.mlflow.run_id)
    children = client.search_runs(
        [parent.info.experiment_id],
        filter_string=f"tags.`mlflow.parentRunId` = '{parent.info.run_id}'",
    )
    return parent, children


# ---------------------------------------------------------------- crash and resume


def test_kill_9_of_service_and_driver_then_the_study_resumes(
    local_root: Path, request: pytest.FixtureRequest
) -> None:
    """Killed with its driver mid-study, the service restarts on the same store (the module's
    :func:`local_server`, which this test starts) and the study resumes."""
    assert local_root not in _LOCAL_STARTED, "this test comes before local_server's first start"
    url = f"sqlite:///{local_root / 'fedtune.db'}"
    first = _server(local_root, log="serve-killed.log")
    try:
        with _sdk(first) as sdk:
            study = sdk.submit(tiny_spec(name="resumed", trials=4, rounds=120))
            _until(lambda: study.status().progress.completed >= 1, 240, "a first finished trial")
        ref = _driver_ref(url, study.id)
        assert _same_process(ref)
        first.kill9()
        os.kill(ref["pid"], signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.killpg(ref["pid"], signal.SIGKILL)  # its embedded Ray, if anything is left
    except BaseException:
        _stop(first)  # and the driver it started
        raise

    db = Database(url)
    with db.session(readonly=True) as s:
        before = {t.number: (t.state, t.value) for t in Repository(s).list_trials(study.id)}
    assert sum(state == TrialState.COMPLETED for state, _ in before.values()) >= 1

    second = request.getfixturevalue("local_server")  # the restart, on the same store
    with _sdk(second) as sdk:
        final = sdk.study(study.id).wait(progress=False, timeout=300, poll_s=0.5)
        assert final.state == StudyState.SUCCEEDED, final.error
        assert final.attempts == 2
        trials = sdk.study(study.id).trials()
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers))
    completed = [t for t in trials if t.state == TrialState.COMPLETED]
    assert len(completed) == 4 and final.progress.completed == 4
    for number, (state, value) in before.items():  # finished trials were kept, not re-run
        if state == TrialState.COMPLETED:
            again = next(t for t in trials if t.number == number)
            assert (again.state, again.value) == (state, value)
    assert all(t.state in (TrialState.COMPLETED, TrialState.KILLED) for t in trials)
    db.dispose()


# ---------------------------------------------------------------- a study, end to end


def _run_one_study(server: Server) -> None:
    with _sdk(server) as sdk:
        study = sdk.submit(tiny_spec(name="e2e", trials=3, rounds=6))
        seen = _watch(study, timeout=240)
        final = seen[-1]
        assert final.state == StudyState.SUCCEEDED, final.error
        finished = [s.progress.finished for s in seen]
        assert finished == sorted(finished) and finished[-1] == 3
        assert any(s.state == StudyState.RUNNING for s in seen)  # progress was visible

        trials = study.trials()
        assert [t.number for t in trials] == [0, 1, 2]
        assert all(t.state == TrialState.COMPLETED and t.last_round == 6 for t in trials)
        for t in trials:
            assert [p.round for p in study.curve(t.number)] == list(range(1, 7))
        best = study.best()
        assert best is not None and best.number == final.best.number
        tradeoff = study.tradeoff()
        assert set(tradeoff.pareto) <= {0, 1, 2} and tradeoff.pareto
        assert [p["round"] for p in tradeoff.envelope] == list(range(1, 7))

        parent, children = _mlflow_runs(final, server)
        assert parent.info.status == "FINISHED"
        # the experiment the driver reported with the parent run, while running and at the end
        reported = {s.mlflow.experiment_id for s in seen if s.mlflow.run_id}
        assert reported == {parent.info.experiment_id}
        assert sorted(r.info.run_id for r in children) == sorted(t.mlflow_run_id for t in trials)
        assert all(r.info.status == "FINISHED" for r in children)


def test_a_study_end_to_end_on_sqlite(local_server) -> None:
    _run_one_study(local_server)


def test_a_study_end_to_end_on_postgresql(serve) -> None:
    need("postgres", pg_unreachable_reason())
    with pg_schema() as url:
        server = serve(database_url=url)
        try:
            _run_one_study(server)
        finally:
            server.stop()


# ---------------------------------------------------------------- cancellation


def test_cancel_stops_the_driver_and_kills_mlflow_runs(local_server) -> None:
    from fedtune.service.backends.local import group_members

    server = local_server
    url = server.env["FEDTUNE_DATABASE_URL"]
    with _sdk(server) as sdk:
        study = sdk.submit(tiny_spec(name="cancelled", trials=50, rounds=200))
        status = _until(
            lambda: (s := study.status()).progress.running >= 1 and s.mlflow.run_id and s,
            240,
            "a running trial",
        )
        ref = _driver_ref(url, study.id)
        cancelled = study.cancel()
        assert cancelled.state == StudyState.CANCELLED and cancelled.progress.running == 0
        _until(lambda: not _same_process(ref), 60, "the driver to exit")
        _until(
            lambda: _mlflow_runs(status, server)[0].info.status == "KILLED",
            30,
            "the parent run KILLED",
        )
        _, children = _mlflow_runs(status, server)
        assert children and all(r.info.status != "RUNNING" for r in children)
        # nothing of the dying driver (its Ray, its tracker: its process group) can write now
        _until(
            lambda: not group_members(ref["pid"]), 60, "every process of the driver's group to exit"
        )
        again = study.status()
        assert again.state == StudyState.CANCELLED  # the dying driver did not overwrite it
        assert all(t.state != TrialState.RUNNING for t in study.trials())
    # The interrupted trial is not left queued (WAITING) in Optuna
    import optuna

    work = Path(server.env["FEDTUNE_WORKDIR"])
    storage = f"sqlite:///{work / 'studies' / study.id / 'optuna.db'}"
    left = optuna.load_study(study_name="cancelled", storage=storage).get_trials()
    assert left and not [t.number for t in left if t.state == optuna.trial.TrialState.WAITING]
    assert all(t.state.is_finished() for t in left), [t.state for t in left]


# ---------------------------------------------------------------- concurrency, auth, fuzzing


def test_twenty_concurrent_submissions(queue_server) -> None:
    server = queue_server
    ids: list[str] = []
    errors: list[BaseException] = []

    def submit(i: int, key: str | None) -> None:
        try:
            with _sdk(server) as sdk:
                ids.append(sdk.submit(tiny_spec(name=f"c{i}"), idempotency_key=key).id)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=submit, args=(i, None)) for i in range(20)]
    threads += [threading.Thread(target=submit, args=(99, "one-key")) for _ in range(5)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert len(ids) == 25 and len(set(ids)) == 21  # the five retries share one study
    with _sdk(server) as sdk:
        listed = sdk.studies(limit=100)
    assert len(listed) == 21 and all(s.state == StudyState.QUEUED for s in listed)


def test_bearer_token(queue_server) -> None:
    server = queue_server
    for path in ("/healthz", "/readyz", "/metrics"):
        assert httpx.get(server.url + path).status_code == 200
    assert httpx.get(f"{server.url}/v1/studies").status_code == 401
    wrong = {"Authorization": "Bearer not-the-token-at-all"}
    assert httpx.get(f"{server.url}/v1/studies", headers=wrong).status_code == 401
    right = {"Authorization": f"Bearer {TOKEN}"}
    assert httpx.get(f"{server.url}/v1/studies", headers=right).status_code == 200
    assert TOKEN not in server.log.read_text()


#: what every fuzzed answer must satisfy: no 5xx, and the status code, the content type and the
#: body are the ones the OpenAPI document states (a 409 it does not list fails the run)
FUZZ_CHECKS = (
    "not_a_server_error,status_code_conformance,content_type_conformance,"
    "response_schema_conformance"
)
#: cases per operation and caller: three callers × 25 operations stay near 60 s on 2 cores
FUZZ_EXAMPLES = 10


def _fuzz_callers(server: Server) -> dict[str, str]:
    """Bearer tokens of an admin, a member and a viewer of the project ``fuzz``."""
    admin = {"Authorization": f"Bearer {TOKEN}"}
    r = httpx.post(f"{server.url}/v1/projects", json={"name": "fuzz"}, headers=admin, timeout=30)
    assert r.status_code == 201, r.text
    tokens = {"admin": TOKEN}
    for role in ("member", "viewer"):
        body = {"name": f"fuzz-{role}", "project": "fuzz", "role": role}
        r = httpx.post(f"{server.url}/v1/users", json=body, headers=admin, timeout=30)
        assert r.status_code == 201, r.text
        tokens[role] = r.json()["token"]
    return tokens


def test_openapi_fuzzing_finds_no_server_errors(serve, tmp_path: Path) -> None:
    """Every operation, fuzzed as an admin, a member and a viewer on PostgreSQL (fixed seed):
    no 5xx, and every answer is one the OpenAPI document states (status, content type, body).
    Before the admin routes were bounded, ``PUT /v1/projects/{p}/quota`` answered 500 (an
    INTEGER overflow) or an undocumented 409, and ``POST /v1/projects`` an undocumented 409."""
    need("postgres", pg_unreachable_reason())
    with pg_schema() as url:
        server = serve(database_url=url, backend="none", FEDTUNE_ALLOW_CODE_UPLOAD="1")
        try:
            tokens = _fuzz_callers(server)
            runs = _fuzz_as(server, tmp_path, tokens)
            assert set(runs) == set(tokens)
            for role, (code, stdout) in runs.items():
                _check_fuzz_run(server, role, code, stdout)
            assert " 500 " not in server.log.read_text()
            db = Database(url)  # the zip generator reached the store
            try:
                with db.session(readonly=True) as s:
                    assert s.query(CodePackageRow).count() >= 1
            finally:
                db.dispose()
        finally:
            server.stop()


def _fuzz_as(server: Server, root: Path, tokens: dict[str, str]) -> dict[str, tuple[int, str]]:
    """Run schemathesis on every operation of ``server`` once per caller, calling it with the
    caller's token: ``{role: (exit status, output)}``. One interpreter runs the three ``st``
    runs one after the other (``st_runs.py``: ~21 CPU-s, where three ``st`` processes at once
    took ~30)."""
    # one worker: schemathesis' worker threads can trip CPython 3.11's ast.parse ("AST
    # constructor recursion depth mismatch") while describing strategies — a tool error
    argv = [
        "run",
        f"{server.url}/openapi.json",
        "--checks",
        FUZZ_CHECKS,
        "-H",
        "Authorization: Bearer {token}",
        "--max-examples",
        str(FUZZ_EXAMPLES),
        "--seed",
        "1",
        "--workers",
        "1",
        "--generation-database",
        "none",
        "--no-color",
        # not schemathesis' 10 s: the first POST of a loaded machine may take longer
        "--request-timeout",
        str(FUZZ_REQUEST_TIMEOUT_S),
        "--wait-for-schema",
        "60",
    ]
    runs = {}
    for role, token in tokens.items():
        (root / role).mkdir()
        runs[role] = [str(root / role), token]
    request = root / "st-runs.json"
    request.write_text(json.dumps({"argv": argv, "runs": runs}))
    here = Path(__file__).parent
    # st_hooks registers a generator for POST /v1/code's application/zip body
    env = {
        **os.environ,
        "SCHEMATHESIS_HOOKS": "st_hooks",
        "PYTHONPATH": os.pathsep.join([str(here), os.environ.get("PYTHONPATH", "")]),
    }
    proc = subprocess.Popen(
        [sys.executable, str(here / "st_runs.py"), str(request)],
        cwd=root,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        start_new_session=True,  # its runs with it, if it must be killed
    )
    try:
        stdout, _ = proc.communicate(timeout=1200)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)
    assert proc.returncode == 0, stdout[-4000:]
    codes = json.loads(stdout.splitlines()[-1])
    return {role: (codes[role], (root / role / "st.out").read_text()) for role in runs}


def _check_fuzz_run(server: Server, role: str, code: int, stdout: str) -> None:
    """A schemathesis run (exit status ``code``, output ``stdout``) found nothing and reached
    every operation."""
    assert code == 0, f"as {role}:\n{stdout[-4000:]}"
    # every operation of the spec was fuzzed (the routes of the identity API included)
    schema = httpx.get(f"{server.url}/openapi.json", timeout=30).json()
    verbs = {"get", "put", "post", "delete", "patch", "head", "options"}
    operations = sum(len(verbs & set(item)) for item in schema["paths"].values())
    assert operations > 15 and "passed" in stdout, role
    assert f"{operations}/{operations}" in stdout, stdout[-3000:]
