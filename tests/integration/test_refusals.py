"""A study whose task cannot be built is refused before anything else starts.

``fedtune tune`` on a user's package that is broken in the way only a trial would see: a task
builder that raises, a model whose outputs do not fit the task's labels. The driver builds the
task once (the preflight, begun first) while the stores, MLflow and Ray start; its error ends
the study as soon as it is known: Ray's start is stopped (``fedtune.tuning.driver.ray_thread``),
the stores and MLflow store not yet begun are not begun, a parent run made meanwhile ends
FAILED. Checked here on the order of the driver's timeline marks
(``fedtune.tuning.common.timeline``), never on times, and on what is left: no trial, no run
but a failed one, no process of the driver's session and none of its Ray's temp dir. The times
are ``benchmarks/refusal.py``'s.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import pytest

from fedtune.tuning.driver.ray_runtime import _candidates

BIN = Path(sys.executable).parent

#: a builder that raises once the driver's Ray has begun to start (so the refusal meets a Ray
#: start under way), and a task whose model's outputs do not fit its labels
TASKS = textwrap.dedent(
    """
    import json, os, time

    import torch
    from torch import nn

    from fedtune.extend import FederatedData, Task, register_task


    def _ray_is_starting():
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            with open(os.environ["FEDTUNE_TIMELINE"]) as fh:
                if any(json.loads(line)["phase"] == "ray_start" for line in fh):
                    return
            time.sleep(0.02)


    @register_task("brk_raise")
    def build(params, seed):
        if params.get("wait_for_ray"):
            _ray_is_starting()
        raise OSError("the data share is not mounted")


    def _loss(outputs, targets):
        logp = torch.log_softmax(outputs, -1)
        return -logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


    @register_task("brk_shape")
    def shape(params, seed):
        g = torch.Generator().manual_seed(seed)
        clients = [
            (torch.randn(8, 4, generator=g), torch.randint(0, 3, (8, 2), generator=g))
            for _ in range(4)
        ]
        return Task(
            name="brk_shape",
            train=FederatedData.from_clients(clients),
            model_fn=lambda gen: nn.Linear(4, 3),
            loss_fn=_loss,
        )
    """
)


def _study(task: dict, *, code: bool, max_concurrent: int) -> str:
    doc = {
        "name": "refused",
        "task": task,
        "algorithm": "fedavg",
        "train": {"rounds": 2, "clients_per_round": 2, "local_steps": 1, "batch_size": 4},
        "search": {"space": "fedavg"},
        "sampler": {"name": "random", "seed": 0},
        "scheduler": {"name": "none"},
        "objective": {"metric": "train_loss", "last_rounds": 1},
        "budget": {"trials": 4, "max_concurrent": max_concurrent},
    }
    if max_concurrent > 1:  # one configuration per process: Ray's trials, as without a cost
        doc["resources"] = {"pack": 1}
    if code:
        doc["code"] = {"path": "./lab", "modules": ["brk.tasks"]}
    return json.dumps(doc)


@pytest.fixture
def short_dir() -> Path:
    """A folder with a short path: the study's Ray keeps its temp dir inside the workdir
    (``ray_runtime.RAY_TEMP_MAX``), where the test looks for its processes afterwards."""
    path = Path(tempfile.mkdtemp(prefix="ft-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def _package(root: Path, *, installed: bool) -> dict[str, str]:
    """The user's package ``brk``: under ``lab/`` (a study's ``code:``) or installed (an
    entry point of a distribution on the path). Returns the environment to run with."""
    where = root / ("site" if installed else "lab")
    (where / "brk").mkdir(parents=True)
    (where / "brk" / "__init__.py").write_text("")
    (where / "brk" / "tasks.py").write_text(TASKS)
    env = {**os.environ, "FEDTUNE_TIMELINE": str(root / "timeline.jsonl")}
    env.pop("RAY_ADDRESS", None)
    if installed:
        info = where / "brk-0.1.dist-info"
        info.mkdir()
        (info / "METADATA").write_text("Metadata-Version: 2.1\nName: brk\nVersion: 0.1\n")
        (info / "entry_points.txt").write_text("[fedtune.tasks]\nbrk = brk.tasks\n")
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(where), env.get("PYTHONPATH")]))
    return env


def _session(sid: int) -> list[str]:
    """The command lines of the live processes of session ``sid`` (the driver's process tree:
    Ray's processes stay in the session of the driver that started them)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[3]) == sid and fields[0] not in ("Z", "X"):
                with contextlib.suppress(OSError):
                    found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
    return found


def _refuse(root: Path, env: dict[str, str], study: str) -> tuple[list[str], str]:
    """Run ``fedtune tune`` (exit 2 expected); return the timeline's phases, in order, and
    its one error line; check that nothing of the study is left running or recorded."""
    (root / "study.yaml").write_text(study)
    with subprocess.Popen(
        [str(BIN / "fedtune"), "tune", "study.yaml", "--workdir", "w"],
        cwd=root,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # its own session: the process tree the test looks at after
    ) as run:
        out, err = run.communicate(timeout=600)
    assert run.returncode == 2, out[-2000:] + err[-3000:]
    errors = [line for line in err.splitlines() if line.startswith("fedtune: error:")]
    assert len(errors) == 1 and "Traceback" not in err, err[-3000:]
    # what the driver began ends with it (multiprocessing's resource tracker, for one, ends
    # when it reads the driver's end of its pipe closed: waited for, up to a minute)
    deadline = time.monotonic() + 60
    while _session(run.pid) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert _session(run.pid) == []
    temp = root / "w" / "ray"
    assert dict(_candidates((str(temp), os.path.realpath(temp)))) == {}
    rows = [json.loads(line) for line in (root / "timeline.jsonl").read_text().splitlines()]
    phases = [r["phase"] for r in sorted(rows, key=lambda r: r["t"])]
    assert "preflight_failed" in phases
    # nothing of the fit: Ray was not handed over, no trial started
    assert not {"ray_started", "in_process", "session_ready", "fit", "trial_entered"} & set(phases)
    storage = root / "w" / "optuna.db"
    if storage.exists():  # the stores may have been opening: no trial was ever asked for
        with sqlite3.connect(storage) as db:
            assert db.execute("select count(*) from trials").fetchone() == (0,)
    store = root / "w" / "mlflow.db"
    if store.exists():  # no run, or one that ended FAILED
        with sqlite3.connect(store) as db:
            statuses = {s for (s,) in db.execute("select status from runs")}
        assert statuses <= {"FAILED"}, statuses
    return phases, errors[0]


def test_a_builder_that_raises_stops_the_ray_that_is_starting(short_dir: Path) -> None:
    """``code:`` (Ray started by the driver, with the code in its ``runtime_env``): the builder
    raises once Ray's start has begun; the start is stopped there, never comes up, and the
    error names the field, the exception and the user's file:line."""
    env = _package(short_dir, installed=False)
    study = _study({"name": "brk_raise", "wait_for_ray": True}, code=True, max_concurrent=2)
    phases, error = _refuse(short_dir, env, study)
    assert "task.name" in error and "OSError: the data share is not mounted" in error
    assert f"{short_dir / 'lab' / 'brk' / 'tasks.py'}:" in error
    order = [p for p in phases if p in ("ray_start", "preflight_failed", "ray_start_stopped")]
    assert order == ["ray_start", "preflight_failed", "ray_start_stopped"], phases
    assert "ray_ready" not in phases
    assert phases.index("ray_start_stopped") < phases.index("ray_stopped")


def test_a_model_that_does_not_fit_the_labels_is_refused_while_the_early_ray_starts(
    short_dir: Path,
) -> None:
    """An installed package (entry points): ``fedtune tune`` began Ray before it read the spec.
    The refusal does not wait for that Ray: its start is stopped if it is still starting, and
    a Ray that had come up first is shut down."""
    env = _package(short_dir, installed=True)
    phases, error = _refuse(
        short_dir, env, _study({"name": "brk_shape"}, code=False, max_concurrent=2)
    )
    assert "task.model" in error and "do not fit" in error
    assert phases[0] == "cli" and phases.index("early_ray") < phases.index("preflight_failed")
    if "early_ray_ready" in phases:  # Ray had come up before the task was built
        assert phases.index("early_ray_ready") < phases.index("preflight_failed")
    else:
        assert phases.index("preflight_failed") < phases.index("ray_start_stopped")
    assert phases.index("preflight_failed") < phases.index("ray_stopped")


def test_a_study_in_the_drivers_process_is_refused_without_ray_or_a_run(short_dir: Path) -> None:
    """One configuration at a time: no Ray at all, and the MLflow store's process closed."""
    env = _package(short_dir, installed=False)
    phases, error = _refuse(
        short_dir, env, _study({"name": "brk_raise"}, code=True, max_concurrent=1)
    )
    assert "OSError: the data share is not mounted" in error
    assert not [p for p in phases if "ray" in p], phases
