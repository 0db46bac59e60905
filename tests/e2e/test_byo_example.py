"""Bring your own code, end to end: the example project
``examples/byo`` (package ``fedlab``: a wine task, a residual MLP and the ``nova_medclip``
method) tuned without editing fedtune —

* locally: ``fedtune tune examples/byo/study.yaml`` in a subprocess started from another
  directory; the Optuna storage and the MLflow runs name the user's task and algorithm, and the
  rounds carry the user aggregator's own diagnostics;
* through a real ``fedtune serve`` (uvicorn subprocess, local backend) on SQLite and on
  PostgreSQL, the code uploaded by the SDK / ``fedtune submit --code``;
* ``kill -9`` of the service (and its driver) mid-study: the restarted service re-dispatches,
  the new driver finds the uploaded package in the database (its extracted copy was removed)
  and the study ends with exactly the requested trials;
* bad user code that only shows at run time — a task builder that raises, a model whose output
  has the wrong shape — ends the study ``failed`` with the reason, never ``succeeded``;
* the RayJob manifest of a study with the example's uploaded code validates against KubeRay's
  RayJob CRD.

The example package is never importable in this test process (checked around every test): it
reaches fedtune only through ``code:`` sections, subprocesses and uploads.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from fedtune.client import Client
from fedtune.code_package import pack
from fedtune.service.states import StudyState, TrialState
from tests.needs import need
from tests.service.helpers import Server, pg_schema, pg_unreachable_reason

from .test_service_e2e import (
    POLL_S,
    TOKEN,
    _driver_ref,
    _kill_drivers,
    _mlflow_runs,
    _same_process,
    _until,
    serve,
    service_env,
)

__all__ = ["serve"]  # the fixture, re-exported for pytest

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "byo"
STUDY = EXAMPLE / "study.yaml"
CODE = {"FEDTUNE_ALLOW_CODE_UPLOAD": "1"}


#: the roots of the module's code-upload services started so far (:func:`code_server`)
_CODE_STARTED: set[Path] = set()


@pytest.fixture(scope="module")
def code_root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The SQLite store and workdir of the module's code-upload service (:func:`code_server`)."""
    return tmp_path_factory.mktemp("byo")


@pytest.fixture(scope="module")
def code_server(code_root: Path) -> Iterator[Server]:
    """A service with code upload (SQLite, local backend), shared by the tests that submit the
    example's code to it: a study that resumes after a kill -9, one that succeeds, and refusals
    that leave no study (each refusal test counts the studies before and after its own
    submissions). Those tests come after the ones that start services and studies of their own,
    so that it starts only then and is not idle through their studies (pytest stops it at the
    module's end); the kill -9 test, the first of them, starts it as the restart of the service
    it killed on the same store (one service's start less)."""
    _CODE_STARTED.add(code_root)
    env = service_env(code_root, "local", FEDTUNE_MAX_CONCURRENT_STUDIES="1", **CODE)
    server = Server(env, code_root / "serve.log")
    server.env.pop("MLFLOW_TRACKING_URI", None)
    try:
        yield server.start()
    finally:
        server.stop()
        _kill_drivers(env["FEDTUNE_DATABASE_URL"])


@pytest.fixture(autouse=True)
def _example_stays_out_of_this_process() -> Iterator[None]:
    assert importlib.util.find_spec("fedlab") is None, "fedlab must not be importable here"
    yield
    assert "fedlab" not in sys.modules and importlib.util.find_spec("fedlab") is None


def _env(cwd: Path) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    return env


def _cli(args: list[str], cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "fedtune.cli", *args],
        cwd=cwd,
        env=_env(cwd),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


#: a child that imports the CLI and the engine's registries once, then runs each verb in a fork
#: of itself (``fedtune.cli.main(argv)``, the console script's entry point): each verb starts
#: from what a new ``fedtune`` process holds once imported, none sees what another loaded (user
#: code, entry points), and each writes its exit code, stdout and stderr as JSON into a file of
#: its own (not the child's stdout, which output that bypassed the redirection would spoil)
_VERBS = """
import contextlib, io, json, os, sys, traceback

import fedtune.trainers.algorithms.registry
import fedtune.trainers.models.registry
import fedtune.trainers.tasks.registry
from fedtune.cli import main

verbs, results = json.loads(sys.argv[1]), sys.argv[2]
for i, argv in enumerate(verbs):
    pid = os.fork()
    if pid == 0:
        out, err = io.StringIO(), io.StringIO()
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
            except Exception:  # as a process of its own: the traceback, exit 1
                traceback.print_exc()
                code = 1
        with open(f"{results}.{i}", "w") as f:
            json.dump([code, out.getvalue(), err.getvalue()], f)
        os._exit(0)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, (argv, status)
"""


def _cli_verbs(
    verbs: list[list[str]], cwd: Path, env: dict[str, str] | None = None
) -> list[subprocess.CompletedProcess]:
    """Run the CLI's listing verbs from one child process, each in a fork of it (:data:`_VERBS`).

    Each verb's own process would import the engine (torch, the registries) again: two
    listings from one child cost about 2.8 CPU-s where two processes cost about 5.6. The
    example stays out of this process either way.

    Args:
        verbs: the arguments after ``fedtune`` of each verb.
        cwd: the child's working directory.
        env: its environment (None: :func:`_env`'s).

    Returns:
        One result per verb: its exit code, stdout and stderr.
    """
    results = cwd / "verbs.json"
    child = subprocess.run(
        [sys.executable, "-c", _VERBS, json.dumps(verbs), str(results)],
        cwd=cwd,
        env=env or _env(cwd),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert child.returncode == 0, child.stdout[-2000:] + child.stderr[-3000:]
    return [
        subprocess.CompletedProcess(argv, code, out, err)
        for i, argv in enumerate(verbs)
        for code, out, err in [json.loads(Path(f"{results}.{i}").read_text())]
    ]


def _spec(**changes) -> dict:
    """The example's study file as a dict (code.path made absolute), with ``changes``."""
    spec = yaml.safe_load(STUDY.read_text())
    spec["code"] = {**spec["code"], "path": str(EXAMPLE)}
    for key, value in changes.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) else value
    return spec


def _lab_copy(root: Path, file: str, old: str, new: str) -> Path:
    """A copy of the example project with one edit in ``fedlab/<file>``."""
    lab = root / "lab"
    shutil.copytree(EXAMPLE, lab, ignore=shutil.ignore_patterns("__pycache__"))
    path = lab / "fedlab" / file
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))
    return lab


# ---------------------------------------------------------------- listing and tuning locally


def test_the_cli_lists_the_user_entries_with_their_origin(tmp_path: Path) -> None:
    tasks, algorithms = _cli_verbs(
        [["tasks", "--study", str(STUDY)], ["algorithms", "--study", str(STUDY)]], tmp_path
    )
    assert tasks.returncode == 0, tasks.stderr
    line = next(ln for ln in tasks.stdout.splitlines() if ln.startswith("fedlab_wine"))
    assert f"code {EXAMPLE}" in line
    assert algorithms.returncode == 0, algorithms.stderr
    line = next(ln for ln in algorithms.stdout.splitlines() if ln.startswith("nova_medclip"))
    assert f"code {EXAMPLE}" in line and "median" in line


def test_installed_the_entry_points_register_it(tmp_path: Path) -> None:
    """``pip install`` route: the project's own pyproject.toml builds a wheel whose entry points
    register the task, model and method without a ``code:`` section."""
    import zipfile

    src = tmp_path / "src"
    shutil.copytree(EXAMPLE, src, ignore=shutil.ignore_patterns("__pycache__"))
    built = subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path / "dist"),
            str(src),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = (tmp_path / "dist").glob("fedlab-0.1.0-*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    env = {**_env(tmp_path), "PYTHONPATH": os.pathsep.join([str(site), str(REPO)])}
    verbs = (("tasks", "fedlab_wine"), ("algorithms", "nova_medclip"))
    lists = _cli_verbs([[verb] for verb, _ in verbs], tmp_path, env)
    for (_, name), listed in zip(verbs, lists, strict=True):
        assert listed.returncode == 0, listed.stderr
        line = next(ln for ln in listed.stdout.splitlines() if ln.startswith(name + " "))
        assert "entry point fedlab==0.1.0" in line


def test_tuned_locally_from_another_directory(tmp_path: Path) -> None:
    import optuna
    from mlflow.tracking import MlflowClient

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    # the example's file as it is, at the smallest budget that shows it: two trials, run at once
    run = _cli(
        ["tune", str(STUDY), "--workdir", "run", "--json", "--set", "budget.trials=2"], elsewhere
    )
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["finished"] == 2 and result["counts"]["completed"] == 2

    storage = f"sqlite:///{elsewhere / 'run' / 'optuna.db'}"
    study = optuna.load_study(study_name="byo-wine-nova-medclip", storage=storage)
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 2 and len(study.trials) == 2
    searched = {"hparams.client_lr", "hparams.server_lr", "hparams.server_momentum"}
    assert all(set(t.params) == searched for t in done)

    client = MlflowClient(tracking_uri=result["tracking_uri"])
    children = client.search_runs(
        [result["experiment_id"]],
        filter_string=f"tags.`mlflow.parentRunId` = '{result['parent_run_id']}'",
    )
    assert len(children) == 2
    for child in children:
        assert child.data.tags["algorithm"] == "nova_medclip"
        assert child.data.tags["task"] == "fedlab_wine"
        assert child.info.status == "FINISHED"
        # the user's aggregator ran: its own round diagnostics are in the curve
        history = client.get_metric_history(child.info.run_id, "medclip_bound")
        assert [m.step for m in history] == list(range(1, 16))
        steps = client.get_metric_history(child.info.run_id, "steps_max")
        assert steps and max(m.value for m in steps) > 1  # local_epochs: unequal work


# ---------------------------------------------------------------- through the service


def test_through_the_service_on_postgresql_with_the_cli(serve, tmp_path: Path) -> None:
    need("postgres", pg_unreachable_reason())
    with pg_schema() as url:
        server = serve(database_url=url, **CODE)
        try:
            spec = tmp_path / "study.yaml"  # a study file without a path: --code names it
            # one trial: this test's point is ``--code`` and PostgreSQL; the service's driver
            # runs it through Ray all the same, and two at once are the SQLite study's
            small = _spec(budget={"trials": 1, "max_concurrent": 1})
            small["code"] = {"modules": small["code"]["modules"]}
            spec.write_text(yaml.safe_dump(small))
            run = _cli(
                [
                    "submit",
                    str(spec),
                    "--code",
                    str(EXAMPLE),
                    "--wait",
                    "--url",
                    server.url,
                    "--token",
                    TOKEN,
                    "--json",
                ],
                tmp_path,
            )
            assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
            with Client(server.url, token=TOKEN, timeout=30) as sdk:
                studies = sdk.studies(limit=5)
                assert len(studies) == 1
                final = sdk.study(studies[0].id).status()
                assert final.state == StudyState.SUCCEEDED, final.error
                assert final.code_sha256 == pack(EXAMPLE).sha256
                assert final.progress.completed == 1 and final.task == "fedlab_wine"
                trials = sdk.study(final.id).trials()
                assert [t.state for t in trials] == [TrialState.COMPLETED]
        finally:
            server.stop()


def test_kill_9_mid_study_the_redispatched_driver_finds_the_code(
    code_root: Path, request: pytest.FixtureRequest
) -> None:
    """Killed mid-study, the service restarts on the same store (the module's
    :func:`code_server`, which this test starts): its new driver finds the code."""
    assert code_root not in _CODE_STARTED, "this test comes before code_server's first start"
    url = f"sqlite:///{code_root / 'fedtune.db'}"
    env = service_env(code_root, "local", FEDTUNE_MAX_CONCURRENT_STUDIES="1", **CODE)
    first = Server(env, code_root / "serve-killed.log")
    first.env.pop("MLFLOW_TRACKING_URI", None)
    first.start(timeout=120)
    try:
        # three trials, one at a time: as soon as the service counts a finished one, the
        # driver's process group (the driver and its embedded Ray) is stopped, so that no more
        # can end before the service and the driver are killed. 40 rounds take about a second,
        # so the next trial may also have ended by then (a CI-form run saw both of two end
        # first): the third is what keeps the study mid-way whichever the stop finds
        spec = _spec(train={"rounds": 40}, budget={"trials": 3, "max_concurrent": 1})
        with Client(first.url, token=TOKEN, timeout=30) as sdk:
            study = sdk.submit(spec)
            ref = _until(lambda: "pid" in (r := _driver_ref(url, study.id)) and r, 300, "a driver")
            assert _same_process(ref)
            _until(lambda: study.status().progress.completed >= 1, 300, "a finished trial", 0.1)
            os.killpg(ref["pid"], signal.SIGSTOP)
            mid = study.status()
            kept = [t for t in study.trials() if t.state == TrialState.COMPLETED]
        sha = mid.code_sha256
        assert mid.state == StudyState.RUNNING, mid  # killed mid-study: a trial left to run
        done = mid.progress.completed
        assert 1 <= done < 3 and (mid.progress.finished, len(kept)) == (done, done), mid
        first.kill9()
        with contextlib.suppress(OSError):
            os.killpg(ref["pid"], signal.SIGKILL)  # the driver and its embedded Ray
    except BaseException:
        first.stop()
        _kill_drivers(url)
        raise
    extracted = code_root / "work" / "code" / sha
    if ref.get("sandboxed"):  # it unpacked the code in its sandbox's private workdir
        assert not extracted.exists()
    else:
        assert (extracted / "fedlab" / "methods.py").is_file()  # where the first driver read it
        shutil.rmtree(extracted)  # a fresh machine: only the database still has the code

    second = request.getfixturevalue("code_server")  # the restart, on the same store
    with Client(second.url, token=TOKEN, timeout=30) as sdk:
        final = sdk.study(study.id).wait(progress=False, timeout=400, poll_s=POLL_S)
        assert final.state == StudyState.SUCCEEDED, final.error
        assert final.attempts == 2
        trials = sdk.study(study.id).trials()
    # fetched again from the database, by the service for a sandboxed driver
    assert ref.get("sandboxed") or (extracted / "fedlab" / "methods.py").is_file()
    numbers = [t.number for t in trials]
    assert len(numbers) == len(set(numbers))
    completed = [t for t in trials if t.state == TrialState.COMPLETED]
    assert len(completed) == 3 and final.progress.completed == 3
    # finished before the kill, kept as they were: the restart ran the rest
    assert all(trial in completed for trial in kept)
    assert all(t.state in (TrialState.COMPLETED, TrialState.KILLED) for t in trials)


def _small_study_file(tmp_path: Path) -> Path:
    """The example's study file at the smallest budget that shows it (two trials, run at
    once), in another folder: its ``code.path`` relative to that folder, as a user's is."""
    spec = yaml.safe_load(STUDY.read_text())
    spec["code"] = {**spec["code"], "path": os.path.relpath(EXAMPLE, tmp_path)}
    spec["budget"] = {**spec["budget"], "trials": 2, "max_concurrent": 2}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def _submitted_study_succeeds(server, tmp_path: Path) -> None:
    with Client(server.url, token=TOKEN, timeout=30) as sdk:
        study = sdk.submit(str(_small_study_file(tmp_path)))  # its code: {path} is uploaded
        final = study.wait(progress=False, timeout=400, poll_s=POLL_S)
        assert final.state == StudyState.SUCCEEDED, final.error
        assert (final.task, final.algorithm) == ("fedlab_wine", "nova_medclip")
        assert final.code_sha256 == pack(EXAMPLE).sha256
        assert final.spec["code"] == {
            "modules": ["fedlab.models", "fedlab.tasks", "fedlab.methods"]
        }
        trials = study.trials()
        assert len(trials) == 2 and all(t.state == TrialState.COMPLETED for t in trials)
        curve = study.curve(trials[0].number)
        assert [p.round for p in curve] == list(range(1, 16))
        assert all("medclip_bound" in p.metrics for p in curve)
        parent, children = _mlflow_runs(final, server)
        assert parent.info.status == "FINISHED" and len(children) == 2
        assert {r.data.tags["algorithm"] for r in children} == {"nova_medclip"}


def test_through_the_service_on_sqlite(code_server, tmp_path: Path) -> None:
    from fedtune.errors import ConfigError

    server = code_server
    with Client(server.url, token=TOKEN, timeout=30) as sdk:
        before = len(sdk.studies(limit=100))
    _submitted_study_succeeds(server, tmp_path)
    # a hyperparameter of the user's method declared without bounds: refused, no study
    spec = _spec()
    spec["search"]["parameters"]["server_momentum"] = {"type": "float", "default": 0.9}
    with Client(server.url, token=TOKEN, timeout=30) as sdk:
        with pytest.raises(ConfigError) as err:
            sdk.submit({**spec, "code": {"modules": spec["code"]["modules"]}}, code=EXAMPLE)
        assert err.value.field == "search.parameters.server_momentum.low"
        assert "is required" in str(err.value)
        assert len(sdk.studies(limit=100)) == before + 1
        # a part of the user's method declaring its own hyperparameter without bounds: the
        # service's import check refuses it (422) naming the module and the file:line
        lab = _lab_copy(
            tmp_path / "nobounds",
            "methods.py",
            "from fedtune.extend import register_algorithm, weighted_mean\n",
            "from fedtune.extend import HParam, register_algorithm, weighted_mean\n",
        )
        methods = lab / "fedlab" / "methods.py"
        text = methods.read_text().replace(
            "    aggregator=MedianClippedNova(),\n",
            "    aggregator=MedianClippedNova(),\n"
            "    hparams=(HParam('medclip_quantile', float, 0.5),),\n",
        )
        methods.write_text(text)
        line = text.splitlines().index("    hparams=(HParam('medclip_quantile', float, 0.5),),") + 1
        spec = _spec(name="nobounds")
        with pytest.raises(ConfigError) as err:
            sdk.submit({**spec, "code": {"modules": spec["code"]["modules"]}}, code=lab)
        assert err.value.field == "code.modules[2]"
        message = str(err.value)
        assert "medclip_quantile" in message and "without bounds" in message
        assert f"fedlab/methods.py:{line}" in message, message
        assert len(sdk.studies(limit=100)) == before + 1


# ---------------------------------------------------------------- bad code, at run time

RUNTIME_BAD = {
    # the task builder raises when a trial builds the task (import and registration are fine)
    "builder-raises": (
        "tasks.py",
        "    p = _params(params)\n",
        "    p = _params(params)\n    raise OSError('wine cellar flooded')\n",
        ["task.name", "fedlab_wine", "OSError: wine cellar flooded", "fedlab/tasks.py:"],
    ),
    # the model forgets the class dimension: logits [B] instead of [B, classes]
    "wrong-output-shape": (
        "models.py",
        "        return self.out(h)\n",
        "        return self.out(h).sum(-1)\n",
        ["task.model", "outputs of shape [2]", "targets of shape [2]", "'fedlab_wine'"],
    ),
}


def test_errors_only_a_trial_would_see_are_refused_at_submission(code_server, tmp_path) -> None:
    """The service's code check builds the task and model once, so a builder
    that raises or a model whose outputs do not fit the loss is a 422 naming the field and
    ``fedlab/tasks.py:N`` as the package names it — not a study whose every trial fails after
    Ray started (as it was: ``failed`` with "all 1 trials failed; …")."""
    from fedtune.errors import ConfigError

    one_trial = {"budget": {"trials": 1, "max_concurrent": 1}, "train": {"rounds": 5}}
    with Client(code_server.url, token=TOKEN, timeout=30) as sdk:
        before = sdk.studies(limit=100)
        for kind, (file, old, new, words) in RUNTIME_BAD.items():
            lab = _lab_copy(tmp_path / kind, file, old, new)
            spec = _spec(name=f"bad-{kind}", **one_trial)
            with pytest.raises(ConfigError) as err:
                sdk.submit({**spec, "code": {"modules": spec["code"]["modules"]}}, code=lab)
            assert err.value.field == words[0], (kind, err.value)
            for word in words[1:]:
                assert word in str(err.value), (kind, str(err.value))
            assert "code-check-" not in str(err.value)  # no deleted scratch directory
        assert sdk.studies(limit=100) == before  # no study was made


def test_each_bad_kind_of_code_is_refused_by_one_check() -> None:
    """Bad code is refused before a study exists, by the upload's checks or by the code check
    at submission, never left to a trial: the upload refuses the kinds of
    ``tests.service.code_fixtures.BAD`` (``tests/service/test_code_upload.py``, with a missing
    registration, a zip over the limit and a zip escaping its root); the code check the kinds
    of :data:`RUNTIME_BAD` (above); a hyperparameter declared without bounds is refused in
    ``tests/unit/test_hparams.py`` and, through the service, in
    ``test_through_the_service_on_sqlite`` above."""
    from tests.service.code_fixtures import BAD

    assert {"syntax", "import"} <= set(BAD)  # what only an import of the package can find
    assert not set(BAD) & set(RUNTIME_BAD)  # each kind has one check, so one test
    for file, old, _new, _words in RUNTIME_BAD.values():  # each edit still applies, once
        assert (EXAMPLE / "fedlab" / file).read_text().count(old) == 1, file


# ---------------------------------------------------------------- Kubernetes (manifest level)


def test_the_rayjob_of_a_study_with_the_example_code_validates_against_the_crd(
    tmp_path: Path, monkeypatch
) -> None:
    """The kubernetes backend launches a study with the example's uploaded code (the
    scheduler's LaunchRequest carries its digest) against a fake API server that, like a real
    one with KubeRay installed, refuses objects its CRD schema rejects; the stored RayJob
    validates against the CRD and ships the package as the job's ``py_modules``."""
    import jsonschema

    from fedtune.service.backends.base import LaunchRequest
    from fedtune.service.backends.kubernetes import KubernetesBackend
    from fedtune.service.code_url import code_token, code_url_key
    from fedtune.service.settings import load_settings
    from tests.service.k8s_fake import CRD, FakeKubeApi, rayjob_schema

    need("crds", None if CRD.exists() else f"KubeRay CRD {CRD} is not available")
    settings = load_settings(
        database_url=f"sqlite:///{tmp_path / 'fedtune.db'}",
        workdir=str(tmp_path / "work"),
        backend="kubernetes",
        k8s_namespace="ml",
        k8s_image="registry.example.com/fedtune:0.1.0",
        public_url="http://fedtune.ml:8000",
        allow_code_upload=True,
    )
    sha = pack(EXAMPLE).sha256
    sid = "0a1b2c3d4e5f"
    with FakeKubeApi() as cluster:
        monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
        monkeypatch.setenv("KUBECONFIG", str(cluster.kubeconfig(tmp_path)))
        backend = KubernetesBackend(settings)
        try:
            ref = backend.launch(LaunchRequest(sid, 1, code_sha256=sha))
        finally:
            backend.close()
        manifest = cluster.objects[("ml", ref["name"])]
    jsonschema.Draft7Validator(rayjob_schema()).validate(manifest)
    runtime_env = yaml.safe_load(manifest["spec"]["runtimeEnvYAML"])
    token = code_token(code_url_key(settings), sid, sha)
    url = f"http://fedtune.ml:8000/v1/studies/{sid}/code.zip?token={token}"
    assert runtime_env == {"py_modules": [url]}
    from ray._common.runtime_env_package import PY_MODULES, validate_package_extension

    validate_package_extension("/v1/studies/x/code.zip", PY_MODULES)  # Ray accepts the URL form
