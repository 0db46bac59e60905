"""Studies on a real multi-node Ray cluster on this machine ("Multi-node Ray,
for real").

The module starts one cluster (:class:`tests.service.ray_cluster.LocalRayCluster`): a head with
no CPUs (as the Helm chart's head, ``num-cpus: 0``: no trial lands there) and two worker nodes
``a`` and ``b`` with one CPU and one *logical* GPU each, every node ``ray start``-ed in its own
session, lean (``lean=True``: no log or autoscaler monitor, which nothing here reads, and minimal
dashboard agents on the worker nodes; the head's dashboard serves only the Jobs and state APIs,
:data:`~tests.service.ray_cluster.BACKEND_MODULES`); the last
test kills ``b`` mid-study. The user code is a copy of ``tests/unit/user_code/ft_user_lab`` in a
temporary folder that is on no process's ``sys.path``: the driver imports it from the study's
``code.path``; the trials get it from Ray (``runtime_env`` ``py_modules``). Its task
``ft_user_probe`` writes, from inside each trial, what Ray says about where it runs (node id, the
node's resources, GPU ids, the module's file), so placement is asserted from Ray's own reports,
not from host names.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import sqlite3
import subprocess
import sys
import urllib.request
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import optuna
import pytest
import yaml

from tests.service.helpers import tiny_spec, until
from tests.service.ray_cluster import BACKEND_MODULES, LocalRayCluster, session_pids

pytestmark = pytest.mark.slow

USER_CODE = Path(__file__).resolve().parents[1] / "unit" / "user_code" / "ft_user_lab"
FEDTUNE = str(Path(sys.executable).parent / "fedtune")
NO_CUDA_LINE = "CUDA is not available in this trial's process"


#: a GPU's device nodes (NVIDIA's, AMD's), without which no process here has CUDA
GPU_DEVICES = ("/dev/nvidiactl", "/dev/kfd")


def _cuda_available() -> bool:
    """``torch.cuda.is_available()`` in this process, asked only where a GPU's device node
    exists: elsewhere CUDA cannot be, and importing torch costs pytest's process a second.

    Returns:
        Whether this process has CUDA.
    """
    if not any(Path(device).exists() for device in GPU_DEVICES):
        return False
    import torch

    return torch.cuda.is_available()


class World:
    def __init__(self, root: Path, cluster: LocalRayCluster) -> None:
        self.root, self.cluster = root, cluster
        self.lab = root / "lab"  # the code's import root, on nobody's sys.path

    def study(self, name: str, **extra: Any) -> dict[str, Any]:
        probe = self.root / f"probe-{name}"
        probe.mkdir()
        doc = {
            "name": name,
            "code": {"path": "./lab", "modules": ["ft_user_lab.probe"]},
            "task": {"name": "ft_user_probe", "clients": 4, "probe_dir": str(probe)},
            "algorithm": "fedavg",
            "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 1, "batch_size": 4},
            "objective": {"last_rounds": 1},
            "scheduler": {"name": "none"},
            "sampler": {"name": "random", "seed": 0},
            "budget": {"trials": 2, "max_concurrent": 2},
            "resources": {"cpu": 1},
        }
        for key, value in extra.items():
            doc[key] = {**doc[key], **value} if isinstance(value, dict) else value
        return doc

    def command(self, doc: dict[str, Any]) -> tuple[list[str], dict[str, str], Path]:
        """``fedtune tune`` of ``doc`` on the cluster: its argv, its environment, its workdir."""
        path = self.root / f"{doc['name']}.yaml"
        path.write_text(yaml.safe_dump(doc))
        workdir = self.root / f"w-{doc['name']}"
        argv = [
            FEDTUNE,
            "tune",
            str(path),
            "--workdir",
            str(workdir),
            "--json",
            "--ray-address",
            self.cluster.gcs_address,
        ]
        env = {k: v for k, v in self.cluster.env.items() if k != "MLFLOW_TRACKING_URI"}
        return argv, env, workdir

    def tune(self, doc: dict[str, Any], timeout: float = 420) -> Run:
        argv, env, workdir = self.command(doc)
        proc = subprocess.run(
            argv, env=env, cwd=self.root, capture_output=True, text=True, timeout=timeout
        )
        return Run(doc, workdir, proc, Path(doc["task"]["probe_dir"]))

    def nodes(self) -> dict[str, str]:
        """``{node id: name}`` from Ray's state API (``head`` or the ``ft_node_<name>``)."""
        rows = self.state("nodes")
        names = {}
        for row in rows:
            custom = [r[len("ft_node_") :] for r in row["resources_total"] if r.startswith("ft_")]
            names[row["node_id"]] = "head" if row["is_head_node"] else (custom or ["?"])[0]
        return names

    def state(self, kind: str, **filters: str) -> list[dict[str, Any]]:
        query = "&".join(
            f"filter_keys={k}&filter_predicates=%3D&filter_values={v}" for k, v in filters.items()
        )
        url = f"{self.cluster.address}/api/v0/{kind}?detail=1&limit=10000&{query}"
        token = self.cluster.client_env["RAY_AUTH_TOKEN"]
        request = urllib.request.Request(url, headers={"Authorization": f"Bearer {token}"})
        with urllib.request.urlopen(request, timeout=60) as resp:
            return json.load(resp)["data"]["result"]["result"]


class Run:
    def __init__(self, doc, workdir: Path, proc: subprocess.CompletedProcess, probe: Path):
        self.doc, self.workdir, self.proc, self.probe = doc, workdir, proc, probe

    @property
    def log(self) -> str:
        return (self.proc.stdout + self.proc.stderr)[-4000:]

    def records(self) -> list[dict[str, Any]]:
        return [json.loads(p.read_text()) for p in sorted(self.probe.glob("*.json"))]

    def trials(self) -> list[optuna.trial.FrozenTrial]:
        storage = f"sqlite:///{self.workdir / 'optuna.db'}"
        return optuna.load_study(study_name=self.doc["name"], storage=storage).trials

    def mlflow_runs(self) -> dict[int, MlflowRun]:
        """The study's trial runs in its ``mlflow.db``, by trial number: the active runs of its
        experiment that carry ``optuna_trial_number``, as ``MlflowClient.search_runs`` lists them
        (read with ``sqlite3``: an ``MlflowClient`` costs pytest's process a second of imports
        and most of another per store it opens)."""
        with contextlib.closing(sqlite3.connect(self.workdir / "mlflow.db")) as db:
            [(experiment,)] = db.execute(
                "SELECT experiment_id FROM experiments WHERE name = ? AND lifecycle_stage = ?",
                (self.doc["name"], "active"),
            ).fetchall()
            runs = dict(
                db.execute(
                    "SELECT run_uuid, status FROM runs WHERE experiment_id = ?"
                    " AND lifecycle_stage = ?",
                    (experiment, "active"),
                ).fetchall()
            )
            tags: dict[str, dict[str, str]] = {run: {} for run in runs}
            for run, key, value in db.execute("SELECT run_uuid, key, value FROM tags"):
                if run in tags:
                    tags[run][key] = value
        return {
            int(tags[run]["optuna_trial_number"]): MlflowRun(status, tags[run])
            for run, status in runs.items()
            if "optuna_trial_number" in tags[run]
        }


@dataclass(frozen=True)
class MlflowRun:
    """A run as MLflow's store holds it: its status (``FINISHED``, ``FAILED``, ...), its tags."""

    status: str
    tags: dict[str, str]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory):
    root: Path = tmp_path_factory.mktemp("multinode")
    (root / "lab").mkdir()
    shutil.copytree(
        USER_CODE, root / "lab" / "ft_user_lab", ignore=shutil.ignore_patterns("__pycache__")
    )
    url = f"sqlite:///{root / 'fedtune.db'}"
    # every process of the cluster has the ray backend driver's settings (the chart: envFrom)
    cluster = LocalRayCluster(
        {"FEDTUNE_DATABASE_URL": url, "FEDTUNE_WORKDIR": str(root / "svc")},
        head_cpus=0,
        lean=True,
        dashboard_modules=BACKEND_MODULES,
    )
    sessions: list[int] = []
    try:
        cluster.start()
        for name in ("a", "b"):
            cluster.add_node(name, num_cpus=1, num_gpus=1)
        sessions = cluster.sessions
        yield World(root, cluster)
    finally:
        sessions = sessions or cluster.sessions
        cluster.stop()
        assert not [p for s in sessions for p in session_pids(s)], "cluster processes survived"


def test_the_user_code_is_on_no_process_path(world: World) -> None:
    assert importlib.util.find_spec("ft_user_lab") is None
    for pid in world.cluster.pids + [p for n in world.cluster.nodes for p in n.pids]:
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        assert not [e for e in environ if str(world.lab).encode() in e], pid


@pytest.fixture(scope="module")
def packed(world: World) -> Run:
    """Four trials of ``gpu: 0.5`` that must all be running at once to finish (probe_meet)."""
    doc = world.study(
        "packed",
        budget={"trials": 4, "max_concurrent": 4},
        resources={"cpu": 0.5, "gpu": 0.5},
        train={"device": "cpu"},  # logical GPUs: a scheduling reservation only
    )
    doc["task"]["probe_meet"] = 4
    return world.tune(doc)


def test_trials_run_on_worker_nodes_with_code_from_the_runtime_env(
    world: World, packed: Run
) -> None:
    assert packed.proc.returncode == 0, packed.log
    result = json.loads(packed.proc.stdout)
    assert result["counts"]["completed"] == 4, packed.log
    records = packed.records()
    assert len(records) == 4
    names = world.nodes()
    assert {names[r["node_id"]] for r in records} == {"a", "b"}  # never the head
    head = next(i for i, n in names.items() if n == "head")
    assert all(r["node_id"] != head for r in records)
    for r in records:
        node = next(n for n in world.cluster.nodes if n.name == names[r["node_id"]])
        # the module was unpacked by that node's runtime-env agent, inside its own temp dir
        assert r["module_file"].startswith(str(node.temp_dir)), r["module_file"]
        assert "runtime_resources" in r["module_file"]
        assert not any(str(world.lab) in p for p in r["sys_path"]), r["sys_path"]
    for node in world.cluster.nodes:  # whose dashboard agent is a minimal one: no modules
        log = node.temp_dir / "session_latest" / "logs" / "dashboard_agent.log"
        assert "Loaded 0 modules." in log.read_text(), node.name


def test_a_packed_study_holds_resources_per_process_and_records_each_configuration(
    world: World,
) -> None:
    doc = world.study(
        "configpacks",
        budget={"trials": 4, "max_concurrent": 4},
        resources={"cpu": 0.5, "gpu": 0.5, "pack": 2},
        train={"device": "cpu"},  # logical GPUs: a scheduling reservation only
    )
    doc["task"]["probe_meet"] = 2  # both processes must hold their resources at the same time
    run = world.tune(doc)
    assert run.proc.returncode == 0, run.log
    assert json.loads(run.proc.stdout)["counts"]["completed"] == 4, run.log
    records = run.records()  # one per trial process: the pack builds its task once
    assert len(records) == 2 and len({r["pid"] for r in records}) == 2
    names = world.nodes()
    assert all(names[r["node_id"]] in ("a", "b") and r["gpu_ids"] == ["0"] for r in records)
    trials = run.trials()
    packs = Counter(t.user_attrs["pack"] for t in trials)
    assert sorted(packs.values()) == [2, 2], packs
    assert sorted(run.mlflow_runs()) == sorted(t.number for t in trials)


def test_half_gpu_trials_pack_two_per_gpu_and_spread_over_nodes(world: World, packed: Run) -> None:
    assert packed.proc.returncode == 0, packed.log
    records = packed.records()  # all four met: they held their resources at the same time
    assert len(records) == 4
    per_node = Counter(r["node_id"] for r in records)
    assert sorted(per_node.values()) == [2, 2]
    for node_id in per_node:
        gpus = {tuple(r["gpu_ids"]) for r in records if r["node_id"] == node_id}
        assert gpus == {("0",)}, gpus  # both trials of the node share its one GPU
    assert len({r["pid"] for r in records}) == 4


@pytest.mark.skipif(_cuda_available(), reason="needs nodes whose processes lack CUDA")
def test_a_gpu_trial_without_cuda_fails_fast_and_the_study_goes_on(world: World) -> None:
    doc = world.study("nocuda", resources={"cpu": 1, "gpu": 0.5})
    run = world.tune(doc)
    assert run.proc.returncode == 1, run.log  # the study ended; no trial completed
    assert json.loads(run.proc.stdout)["counts"]["failed"] == 2
    trials = run.trials()
    assert [t.state for t in trials] == [optuna.trial.TrialState.FAIL] * 2
    assert all(t.user_attrs["outcome"] == "failed" for t in trials)
    assert all(t.user_attrs.get("rounds", 0) == 0 for t in trials)  # no round ran on CPU
    assert run.records() == []  # failed before the task was built
    runs = run.mlflow_runs()
    assert sorted(runs) == [t.number for t in trials]
    for r in runs.values():
        assert r.status == "FAILED"
        error = r.tags["error"]
        assert NO_CUDA_LINE in error and "resources.gpu=0.5" in error and "\n" not in error


def test_the_ray_backend_runs_the_driver_on_the_head_and_trials_on_workers(world: World) -> None:
    from fedtune.service.backends.base import DriverStatus
    from fedtune.service.backends.ray_jobs import RayJobsBackend
    from fedtune.service.db import Database
    from fedtune.service.migrate import upgrade_database
    from fedtune.service.repository import Repository
    from fedtune.service.scheduler import Scheduler
    from fedtune.service.services import ServiceContext, submit_study
    from fedtune.service.settings import load_settings
    from fedtune.service.states import StudyState, TrialState

    cluster = world.cluster
    url = cluster.env["FEDTUNE_DATABASE_URL"]
    db = Database(url)
    try:
        upgrade_database(db)
        settings = load_settings(
            database_url=url,
            workdir=cluster.env["FEDTUNE_WORKDIR"],
            backend="ray",
            ray_address=cluster.address,
            max_concurrent_studies=1,
            ray_auth_token=cluster.client_env["RAY_AUTH_TOKEN"],
        )
        ctx = ServiceContext(db, settings)
        backend = RayJobsBackend(settings)
        # one trial: a trial process on a worker node is all this asserts of them
        spec = tiny_spec(name="via-ray-backend", trials=1, rounds=3)
        sid = submit_study(ctx, spec)[0].id
        assert Scheduler(db, backend, settings).tick().dispatched == [sid]
        with db.session(readonly=True) as s:
            ref = Repository(s).require_study(sid).driver_ref
        done = (DriverStatus.PENDING, DriverStatus.RUNNING)
        # each poll is a Ray Jobs API call, answered by the head's dashboard: once a second
        final = until(lambda: (st := backend.poll(ref)) not in done and st, 300, every=1.0)
        jobs = backend._jobs()
        assert final == DriverStatus.SUCCEEDED, jobs.get_job_logs(ref["submission_id"])[-3000:]
        with db.session(readonly=True) as s:
            repo = Repository(s)
            assert repo.require_study(sid).state == StudyState.SUCCEEDED
            assert [t.state for t in repo.list_trials(sid)] == [TrialState.COMPLETED]
        info = jobs.get_job_info(ref["submission_id"])
    finally:
        db.dispose()
    names = world.nodes()
    assert names[info.driver_node_id] == "head"  # where Ray puts a job without entrypoint resources
    actors = world.state("actors", job_id=info.job_id)
    trial_nodes = [names[a["node_id"]] for a in actors if "ImplicitFunc" in a["class_name"]]
    assert trial_nodes and set(trial_nodes) <= {"a", "b"}, actors


def test_killing_a_worker_node_mid_study_loses_no_trial(world: World) -> None:
    # the module's last test (its tests run in file order, on one worker: the module's group),
    # so the victim is worker node b, not a node started for it (a raylet, two agents and a
    # ``ray start`` more)
    [victim] = [n for n in world.cluster.nodes if n.name == "b"]
    # three trials, two at a time: one on a, one parked on b; then one more on a after the loss.
    # The first two must meet (probe_meet): a's first trial waits for the record of a second
    # one, which only b can hold then, so a cannot run all three one after another
    doc = world.study("killed", budget={"trials": 3, "max_concurrent": 2})
    doc["task"]["probe_hold_on"] = victim.resource
    doc["task"]["probe_meet"] = 2
    argv, env, workdir = world.command(doc)
    with (world.root / "killed.out").open("w") as out, (world.root / "killed.err").open("w") as err:
        driver = subprocess.Popen(argv, env=env, cwd=world.root, stdout=out, stderr=err)
    probe = Path(doc["task"]["probe_dir"])
    try:
        # two trials on two one-CPU nodes: one of them is parked on the victim
        assert until(lambda: list(probe.glob("holding-*")), 300), "no trial reached the victim"
        victim.kill()
        assert driver.wait(timeout=420) == 0, (world.root / "killed.err").read_text()[-3000:]
    finally:
        if driver.poll() is None:
            driver.kill()
    run = Run(doc, workdir, subprocess.CompletedProcess(argv, 0, "", ""), probe)
    trials = run.trials()
    assert all(t.state.is_finished() for t in trials), trials  # none stuck RUNNING
    states = Counter(t.state.name for t in trials)
    # the parked trial is recorded as failed (Tune: max_failures=0), the others completed
    assert states == {"COMPLETE": 2, "FAIL": 1}, states
    [lost] = [t for t in trials if t.state.name == "FAIL"]
    assert lost.user_attrs["outcome"] == "failed"
    held = [r for r in run.records() if victim.resource in r["node_resources"]]
    assert held, "no trial ran on the victim"
    runs = run.mlflow_runs()
    assert sorted(runs) == sorted(t.number for t in trials)
    status = {"COMPLETE": "FINISHED", "FAIL": "FAILED", "PRUNED": "FINISHED"}
    for t in trials:
        assert runs[t.number].status == status[t.state.name], (t.number, t.state)
    assert "RUNNING" not in {r.status for r in runs.values()}
    # e.g. "The actor … is unavailable: … Socket closed": the reason is the lost node's actor
    assert "actor" in runs[lost.number].tags.get("error", "").lower()
