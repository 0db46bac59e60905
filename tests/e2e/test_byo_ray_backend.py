"""Bring your own code through the service's ``ray`` backend (Ray Jobs): a real
uvicorn ``fedtune serve`` with ``FEDTUNE_BACKEND=ray`` submits each study's driver to a real
multi-node Ray cluster started here (:class:`tests.service.ray_cluster.LocalRayCluster`: a head
with no CPUs, as the Helm chart's, and one worker node ``w`` with two), and the example project
``examples/byo`` (package ``fedlab``) is uploaded by the SDK.

* the study succeeds with the user's task, model and method: the driver, a Ray job on the head,
  unpacked the package from the service database into the head's ``FEDTUNE_WORKDIR`` (empty
  before; its log says so), the trials on the worker node imported it from Ray's
  ``runtime_env`` (``py_modules``, unpacked by that node's runtime-env agent), and the service,
  Optuna and MLflow agree on the trials;
* code that the service's import check accepts but the cluster cannot import (a dependency the
  API machine has and the Ray cluster lacks) ends the study ``failed`` with the import error.

The uploaded package wins over an older ``fedlab`` installed on the cluster (on the PYTHONPATH of
every cluster process, as in an image built earlier): the study runs the code of its
``code_sha256``. The example is on no ``sys.path`` of this process or the service.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import shutil
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from fedtune.client import Client
from fedtune.code_package import pack
from fedtune.service.states import StudyState, TrialState
from tests.integration.conftest import mlflow_server_process
from tests.mlflow_rest import child_runs, get_run, mlflow_api
from tests.service.helpers import Server, tiny_spec
from tests.service.ray_cluster import BACKEND_MODULES, LocalRayCluster, session_pids

from .test_service_e2e import TOKEN

pytestmark = [pytest.mark.integration, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "examples" / "byo"
STUDY = EXAMPLE / "study.yaml"
#: a module the service's machine has and the Ray cluster lacks (see the failure test)
ONLY_ON_THE_API = "wine_cellar_stats"
#: the round diagnostic of the older fedlab installed on the cluster (see ``_installed_copy``)
INSTALLED_MARK = "installed_copy_ran"
#: the example study's trials: one trial process on the worker node shows all that is asserted
#: of them (the user's code from the runtime_env; the service, Optuna and MLflow agree)
EXAMPLE_TRIALS = 1
#: the service's scheduler tick and the test's status polls (seconds): the product's default tick,
#: not ``FAST``'s 0.5 s (``tests/e2e/test_service_e2e.py``): a tick of the ``ray`` backend asks
#: the head's dashboard for each running study's job status and each poll is an API call, for
#: minutes with two studies running; nothing here waits on a tick's latency
POLL_S = 1.0
#: a driver's heartbeat (an API call, a row written): every 2 s, not ``FAST``'s 1 s; nothing here
#: stops or re-dispatches a driver, which is what a heartbeat tells it
HEARTBEAT_S = 2.0
#: a database URL in the environment of the cluster's processes, which no driver may see
HEAD_DATABASE_URL = "postgresql://fedtune:head-database-password@127.0.0.1:9/fedtune"


@dataclass
class World:
    root: Path
    cluster: LocalRayCluster
    server: Server
    head_workdir: Path  # FEDTUNE_WORKDIR of the cluster's processes (the driver's)

    def logs(self, study_id: str, attempt: int = 1) -> str:
        """The log of the study's driver (a Ray job), from the Jobs API as
        ``JobSubmissionClient.get_job_logs`` reads it (``GET /api/jobs/<id>/logs``), without
        importing Ray into this process (0.4 CPU-s, and a version check per client)."""
        from fedtune.service.backends.ray_jobs import submission_id

        token = self.cluster.client_env["RAY_AUTH_TOKEN"]
        url = f"{self.cluster.address}/api/jobs/{submission_id(study_id, attempt)}/logs"
        reply = httpx.get(url, headers={"Authorization": f"Bearer {token}"}, timeout=30)
        assert reply.status_code == 200, (reply.status_code, reply.text[:2000])
        return reply.json()["logs"]


@pytest.fixture(autouse=True)
def _example_stays_out_of_this_process() -> Iterator[None]:
    assert importlib.util.find_spec("fedlab") is None, "fedlab must not be importable here"
    yield
    assert "fedlab" not in sys.modules and importlib.util.find_spec("fedlab") is None


def _installed_copy(site: Path) -> Path:
    """An older ``fedlab`` installed on the cluster (as in an image built earlier): the same
    names, plus a round diagnostic :data:`INSTALLED_MARK` that the uploaded code lacks."""
    shutil.copytree(
        EXAMPLE / "fedlab", site / "fedlab", ignore=shutil.ignore_patterns("__pycache__")
    )
    methods = site / "fedlab" / "methods.py"
    old = '{"medclip_bound": float(bound),'
    assert old in methods.read_text()
    methods.write_text(methods.read_text().replace(old, f'{{"{INSTALLED_MARK}": 1.0, ' + old[1:]))
    return site


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    root: Path = tmp_path_factory.mktemp("byo-ray")
    url = f"sqlite:///{root / 'fedtune.db'}"  # the service's alone: the head's drivers use the API
    head_workdir = root / "head"
    api_only = root / "api-site"  # on the service's PYTHONPATH only
    api_only.mkdir()
    (api_only / f"{ONLY_ON_THE_API}.py").write_text("MEDIAN = 0.5\n")
    installed = _installed_copy(root / "cluster-site")  # on the cluster's PYTHONPATH only
    # the cluster's processes carry the driver's settings and a database URL (as a head given
    # the service's would): drivers report to the service's API with their study's credential
    # (FEDTUNE_DRIVER_URL, set below) and never read it, and a sandboxed driver never sees it;
    # one MLflow server that the service reads too (the chart's)
    stack = contextlib.ExitStack()
    _, mlflow = stack.enter_context(
        mlflow_server_process(
            f"sqlite:///{root / 'mlflow.db'}", root / "mlflow.log", artifacts=str(root / "art")
        )
    )
    env = {
        "FEDTUNE_WORKDIR": str(head_workdir),
        "FEDTUNE_DATABASE_URL": HEAD_DATABASE_URL,
        "MLFLOW_TRACKING_URI": mlflow,
        "OMP_NUM_THREADS": "1",
        "PYTHONPATH": os.pathsep.join([str(REPO), str(installed)]),
    }
    cluster = LocalRayCluster(env, head_cpus=0, lean=True, dashboard_modules=BACKEND_MODULES)
    server: Server | None = None
    try:
        cluster.start()
        cluster.add_node("w", num_cpus=2)
        server = Server(
            {
                "FEDTUNE_DATABASE_URL": url,
                "FEDTUNE_WORKDIR": str(root / "api"),  # not the head's: nothing shared on disk
                "FEDTUNE_BACKEND": "ray",
                "RAY_ADDRESS": cluster.address,
                "RAY_AUTH_TOKEN": cluster.client_env["RAY_AUTH_TOKEN"],
                "FEDTUNE_API_TOKEN": TOKEN,
                "FEDTUNE_ALLOW_CODE_UPLOAD": "1",
                "FEDTUNE_MAX_CONCURRENT_STUDIES": "2",
                "MLFLOW_TRACKING_URI": mlflow,
                "PYTHONPATH": os.pathsep.join([str(REPO), str(api_only)]),
                "FEDTUNE_SCHEDULER_INTERVAL_S": str(POLL_S),
                "FEDTUNE_HEARTBEAT_S": str(HEARTBEAT_S),
            },
            root / "serve.log",
        )
        server.env["FEDTUNE_DRIVER_URL"] = server.url  # where the head's drivers report
        server.start()
        yield World(root, cluster, server, head_workdir)
    finally:
        if server is not None:
            server.stop()
        sessions = cluster.sessions
        cluster.stop()
        stack.close()
        assert not [p for s in sessions for p in session_pids(s)], "cluster processes survived"


def _small(**changes) -> dict:
    """The example's study file with fewer trials and rounds, its code named by ``code=``."""
    spec = yaml.safe_load(STUDY.read_text())
    spec["code"] = {"modules": spec["code"]["modules"]}
    for key, value in changes.items():
        spec[key] = {**spec[key], **value} if isinstance(value, dict) else value
    return spec


def _lab_needing_a_dependency(root: Path) -> tuple[Path, int]:
    """A copy of the example whose ``fedlab/tasks.py`` imports :data:`ONLY_ON_THE_API`; the
    project and the line of that import."""
    lab = root / "lab-needs-a-dependency"
    shutil.copytree(EXAMPLE, lab, ignore=shutil.ignore_patterns("__pycache__"))
    tasks = lab / "fedlab" / "tasks.py"
    text, anchor = tasks.read_text(), "from __future__ import annotations\n"
    assert anchor in text
    statement = f"import {ONLY_ON_THE_API}  # noqa: F401"
    tasks.write_text(text.replace(anchor, f"{anchor}\n{statement}\n"))
    return lab, tasks.read_text().splitlines().index(statement) + 1


@dataclass
class Submitted:
    id: str
    final: Any  # StudyStatus
    trials: list[Any]
    logs: str  # the driver's Ray job log


@pytest.fixture(scope="module")
def studies(world: World) -> dict[str, Submitted]:
    """Both studies, submitted together (two drivers on the head at once) and waited for."""
    sha = pack(EXAMPLE).sha256
    assert not (world.head_workdir / "code" / sha).exists()  # nothing on the head beforehand
    lab, _ = _lab_needing_a_dependency(world.root)
    with Client(world.server.url, token=TOKEN, timeout=30) as sdk:
        handles = {
            "example": sdk.submit(
                _small(
                    budget={"trials": EXAMPLE_TRIALS, "max_concurrent": EXAMPLE_TRIALS},
                    train={"rounds": 4, "eval_every": 2},
                    objective={"last_rounds": 2},
                ),
                code=EXAMPLE,
            ),
            "needs-a-dependency": sdk.submit(
                _small(name="needs-a-dependency", budget={"trials": 1}), code=lab
            ),
        }
        done = {}
        for key, study in handles.items():
            final = study.wait(progress=False, timeout=400, poll_s=POLL_S)
            done[key] = Submitted(study.id, final, study.trials(), world.logs(study.id))
    return done


def test_the_uploaded_example_is_tuned_by_a_ray_job(
    world: World, studies: dict[str, Submitted]
) -> None:
    import optuna

    study = studies["example"]
    final, trials, logs = study.final, study.trials, study.logs
    sha = pack(EXAMPLE).sha256
    assert final.state == StudyState.SUCCEEDED, (final.error, logs[-3000:])
    assert (final.task, final.algorithm) == ("fedlab_wine", "nova_medclip")
    assert final.code_sha256 == sha
    assert final.spec["code"] == {"modules": ["fedlab.models", "fedlab.tasks", "fedlab.methods"]}
    assert [t.state for t in trials] == [TrialState.COMPLETED] * EXAMPLE_TRIALS
    assert final.progress.completed == EXAMPLE_TRIALS
    with Client(world.server.url, token=TOKEN, timeout=30) as sdk:
        curve = sdk.study(study.id).curve(trials[0].number)
    assert [p.round for p in curve] == list(range(1, 5))
    assert all("medclip_bound" in p.metrics for p in curve)  # the user's aggregator ran
    assert not [p for p in curve if INSTALLED_MARK in p.metrics]  # the uploaded one, not
    # the older fedlab installed on the cluster: the package of the study's code_sha256 wins

    # the driver (a Ray job on the head, no database URL in its environment) fetched the
    # package from the service with its study's credential and unpacked it
    unpacked = world.head_workdir / "code" / sha
    assert f"code package {sha} unpacked from the service to {unpacked}" in logs, logs[-3000:]
    assert (unpacked / "fedlab" / "methods.py").read_bytes() == (
        EXAMPLE / "fedlab" / "methods.py"
    ).read_bytes()
    # the trials ran on the worker node, with the code its runtime-env agent unpacked
    [node] = world.cluster.nodes
    shipped = list(node.temp_dir.glob("session_*/runtime_resources/py_modules_files/*/fedlab"))
    assert shipped and (shipped[0] / "methods.py").is_file(), list(node.temp_dir.rglob("fedlab"))

    # Optuna (in the head's workdir) and MLflow agree with the service
    storage = f"sqlite:///{world.head_workdir / 'studies' / study.id / 'optuna.db'}"
    optuna_study = optuna.load_study(study_name=final.name, storage=storage)
    done = [t for t in optuna_study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == len(optuna_study.trials) == EXAMPLE_TRIALS
    assert sorted(t.number for t in done) == sorted(t.number for t in trials)
    searched = {"hparams.client_lr", "hparams.server_lr", "hparams.server_momentum"}
    assert all(set(t.params) == searched for t in done)  # the user's method's hyperparameters
    assert final.mlflow.tracking_uri == world.server.env["MLFLOW_TRACKING_URI"]
    with mlflow_api(final.mlflow.tracking_uri) as api:
        parent = get_run(api, final.mlflow.run_id)
        children = child_runs(api, parent, final.mlflow.run_id)
    assert parent.status == "FINISHED" and len(children) == EXAMPLE_TRIALS
    for child in children:
        assert child.status == "FINISHED"
        assert "medclip_bound" in child.metrics and INSTALLED_MARK not in child.metrics
        assert (child.tags["task"], child.tags["algorithm"]) == (
            "fedlab_wine",
            "nova_medclip",
        )


def test_code_the_cluster_cannot_import_fails_the_study_with_the_reason(
    world: World, studies: dict[str, Submitted]
) -> None:
    """The service's import check runs where the service runs; the cluster may lack a
    dependency the API machine has. The driver's import of the uploaded code fails on the head:
    the study ends ``failed`` with the import error, never ``succeeded`` and never re-queued."""
    study = studies["needs-a-dependency"]
    final = study.final
    _, line = _lab_needing_a_dependency(world.root / "again")
    assert final.state == StudyState.FAILED, (final.state, study.logs[-3000:])
    assert final.error.startswith(
        "the study's code failed to load on the driver's machine: code.modules[1]: "
        "importing 'fedlab.tasks' failed: "
    ), final.error  # not "invalid stored spec": the spec is fine, the cluster lacks a module
    assert f"No module named '{ONLY_ON_THE_API}'" in final.error, final.error
    assert final.error in study.logs  # the Ray job's log says why, too
    assert f"fedlab/tasks.py:{line}" in final.error, final.error
    assert final.attempts == 1 and study.trials == []


def test_a_hostile_driver_on_the_shared_head_finds_no_secret_or_file(world: World) -> None:
    """A study whose code, imported by its driver on the head (a Ray job), looks around: the
    driver ran it in a sandbox, which holds no process of the head, no database URL and no
    other study's file; what it writes stays in the sandbox."""
    from fedtune.sandbox import sandbox_missing
    from tests.needs import need

    from .test_hostile_code import DRIVER_PACKAGE, PROBE

    need("bwrap", sandbox_missing())
    other = world.head_workdir / "studies" / "0123456789ab"  # another study's folder
    other.mkdir(parents=True, exist_ok=True)
    (other / "optuna.db").write_text("another study's storage")
    (world.head_workdir / "secret.txt").write_text("the head's own file")
    service_db = world.server.env["FEDTUNE_DATABASE_URL"].removeprefix("sqlite:///")
    probe = PROBE.format(
        names=["FEDTUNE_DATABASE_URL", "FEDTUNE_API_TOKEN", "FEDTUNE_CODE_URL_KEY"],
        readable=[str(other / "optuna.db"), str(world.head_workdir / "secret.txt"), service_db],
        ports=[],
        writable=[str(world.head_workdir / "planted.txt"), str(other / "planted.txt")],
    )
    lab = world.root / "hostile-lab"
    (lab / "user_lab").mkdir(parents=True)
    (lab / "user_lab" / "__init__.py").write_text("")
    (lab / "user_lab" / "tasks.py").write_text(DRIVER_PACKAGE.format(probe=probe))
    # the check (no driver URL) imports it and finds no error: the driver's import probes
    spec = tiny_spec(name="hostile-on-the-head", trials=1, code={"modules": ["user_lab.tasks"]})
    with Client(world.server.url, token=TOKEN, timeout=30) as sdk:
        study = sdk.submit(spec, code=lab)
        final = study.wait(progress=False, timeout=400, poll_s=POLL_S)
    logs = world.logs(study.id)
    assert final.state == StudyState.FAILED, (final.state, logs[-3000:])
    assert "driver:" in final.error, final.error  # the driver imported it, and refused to go on
    assert "runs its uploaded code in a sandbox" in logs, logs[-3000:]
    found = json.loads(final.error.split("FINDINGS", 1)[1].split("END", 1)[0])
    assert found["leaks"] == {}, found["leaks"]  # no database URL: not in its environment
    assert set(found["pids"]) <= set(range(1, 8)), found["pids"]  # no process of the head
    assert found["read"] == []
    assert HEAD_DATABASE_URL not in logs and HEAD_DATABASE_URL not in final.error
    assert not (world.head_workdir / "planted.txt").exists()
    assert not (other / "planted.txt").exists()
