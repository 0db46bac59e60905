"""Start-up paths of a study: the MLflow store template, the light driver
imports and the start-up timeline. Timing is measured by
``benchmarks/startup.py``, never asserted here."""

from __future__ import annotations

import contextlib
import json
import os
import sqlite3
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from fedtune.tuning.common import timeline
from fedtune.tuning.mlflow import sqlite_template
from fedtune.tuning.mlflow.sqlite_template import seed_sqlite_store, template_path
from tests.fresh_imports import imported_after
from tests.shared_tracking import shared_tracking

ROOT = Path(__file__).resolve().parents[2]


def _rows(db: Path, sql: str) -> list[tuple]:
    with contextlib.closing(sqlite3.connect(db)) as con:
        return con.execute(sql).fetchall()


def _schema(db: Path) -> list[tuple]:
    """Tables and indexes with their definitions' clauses as a set: MLflow's own migrations
    write a table's CHECK constraints in a varying order (two MLflow-made stores differ)."""
    rows = _rows(db, "SELECT type, name, sql FROM sqlite_master ORDER BY type, name")
    return [
        (kind, name, sorted(ln.strip().rstrip(",") for ln in (sql or "").splitlines()))
        for kind, name, sql in rows
    ]


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An empty cache of fedtune's own (the tests of the MLflow store template build theirs)."""
    path = tmp_path / "cache"
    monkeypatch.setenv("FEDTUNE_CACHE_DIR", str(path))
    monkeypatch.chdir(tmp_path)
    return path


@pytest.fixture(scope="module")
def _built_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A cache holding the MLflow store template, built once for the module."""
    path = tmp_path_factory.mktemp("built") / "cache"
    assert seed_sqlite_store(f"sqlite:///{path.parent / 'mlflow.db'}", cache=path)
    return path


@pytest.fixture
def warm_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, _built_cache: Path) -> Path:
    """The module's cache with the template built, as a user's cache holds it after their first
    study: for the tests of a study's start, whose every new MLflow store would otherwise build
    its own template (MLflow's migrations, about 1.1 CPU-s each), which the template's own tests
    check with :func:`cache`."""
    monkeypatch.setenv("FEDTUNE_CACHE_DIR", str(_built_cache))
    monkeypatch.chdir(tmp_path)
    return _built_cache


def test_seeded_store_is_the_store_mlflow_creates(tmp_path: Path, cache: Path) -> None:
    from mlflow import MlflowClient

    made = tmp_path / "made.db"
    MlflowClient(tracking_uri=f"sqlite:///{made}").search_experiments()
    seeded = tmp_path / "w" / "mlflow.db"
    before = int(time.time() * 1000)
    assert seed_sqlite_store(f"sqlite:///{seeded}")
    assert template_path().is_file() and template_path().parent == cache
    assert _schema(seeded) == _schema(made)
    version = "SELECT version_num FROM alembic_version"
    assert _rows(seeded, version) == _rows(made, version)
    cols = "SELECT experiment_id, name, artifact_location, lifecycle_stage FROM experiments"
    assert _rows(seeded, cols) == _rows(made, cols)  # Default: <cwd>/mlruns/0 as MLflow sets it
    (created,) = _rows(seeded, "SELECT creation_time FROM experiments WHERE experiment_id = 0")
    assert created[0] >= before
    client = MlflowClient(tracking_uri=f"sqlite:///{seeded}")  # MLflow accepts it as is
    exp = client.create_experiment("e")
    run = client.create_run(exp)
    client.log_metric(run.info.run_id, "m", 1.0)
    assert client.get_run(run.info.run_id).data.metrics == {"m": 1.0}


def test_seed_keeps_an_existing_store_and_ignores_other_stores(tmp_path: Path, cache: Path) -> None:
    existing = tmp_path / "mine.db"
    existing.write_bytes(b"not touched")
    assert not seed_sqlite_store(f"sqlite:///{existing}")
    assert existing.read_bytes() == b"not touched"
    for uri in ("sqlite:///:memory:", "postgresql://u@h/db", "http://127.0.0.1:5000", "mlruns"):
        assert not seed_sqlite_store(uri)
    assert not cache.exists()  # nothing built for them


def test_unwritable_cache_leaves_the_store_to_mlflow(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedtune.tuning.mlflow.tracking import StudyTracker

    blocker = tmp_path / "file"
    blocker.write_text("")
    monkeypatch.setenv("FEDTUNE_CACHE_DIR", str(blocker / "cache"))  # below a file: OSError
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    assert not seed_sqlite_store(uri)
    tracker = StudyTracker(uri, "exp")  # MLflow migrates the new store itself
    assert tracker.client.get_experiment(tracker.experiment_id).name == "exp"


def test_study_tracker_starts_a_new_store_from_the_template(tmp_path: Path, cache: Path) -> None:
    from fedtune.tuning.mlflow.tracking import StudyTracker

    first = StudyTracker(f"sqlite:///{tmp_path / 'a.db'}", "exp")
    assert template_path().is_file()  # built once, by MLflow
    stamp = template_path().stat().st_mtime_ns
    second = StudyTracker(f"sqlite:///{tmp_path / 'b.db'}", "exp")
    assert template_path().stat().st_mtime_ns == stamp  # reused, not rebuilt
    assert first.experiment_id == second.experiment_id == "1"


def test_cache_dir_precedence(tmp_path: Path) -> None:
    home = Path.home() / ".cache" / "fedtune"
    assert sqlite_template.cache_dir({}) == home
    assert sqlite_template.cache_dir({"XDG_CACHE_HOME": "/x"}) == Path("/x/fedtune")
    env = {"XDG_CACHE_HOME": "/x", "FEDTUNE_CACHE_DIR": str(tmp_path)}
    assert sqlite_template.cache_dir(env) == tmp_path


#: the driver's and a trial's imports (what a trial process and the driver load at first)
_DRIVER_IMPORTS = "import fedtune.tuning.driver.study, fedtune.tuning.trials.trainable"


def _open_stores_code(workdir: Path) -> str:
    """Open a new study's stores (the MLflow store, its parent run) in ``workdir``."""
    return textwrap.dedent(
        f"""
        import time
        from pathlib import Path
        from fedtune.tuning.spec import StudySpec
        from fedtune.tuning.driver.study import _open_stores, _open_tracking, _prepare
        spec = StudySpec.from_dict({{
            "name": "lazy-plots", "algorithm": "fedavg", "search": {{"space": "fedavg"}},
            "task": {{"name": "quadratic", "clients": 1, "dim": 1, "examples": 1}},
            "train": {{"rounds": 1, "clients_per_round": 1, "local_steps": 1, "batch_size": 1}},
            "objective": {{"metric": "train_loss", "last_rounds": 1}}, "budget": {{"trials": 1}}}})
        workdir = Path({str(workdir)!r})
        workdir.mkdir()
        uri = f"sqlite:///{{workdir / 'mlflow.db'}}"
        plan, _ = _prepare(spec, workdir, None, time.perf_counter(), tracking_uri=uri)
        assert _open_tracking(_open_stores(plan), plan).parent
        """
    )


#: what Ray loads in a trial's worker before the trial itself: Ray Tune's function trainable
#: (the module of the trial's actor class, ``ImplicitFunc``; Ray's own imports: pandas, pyarrow)
_RAY_TUNE_WORKER = "import ray.tune.trainable.function_trainable"


def _trial_unpickle_code() -> str:
    """Unpickle a trial as its Ray worker does: ``with_parameters`` ships ``train_pack`` by
    reference and the study by value (here a ``functools.partial`` in Ray's cloudpickle)."""
    import base64
    import functools

    from ray import cloudpickle

    from fedtune.tuning.trials.trainable import train_pack

    trial = functools.partial(train_pack, spec=tiny_spec("trial"), box=None)
    blob = base64.b64encode(cloudpickle.dumps(trial)).decode()
    return textwrap.dedent(
        f"""
        import base64, pickle
        trial = pickle.loads(base64.b64decode({blob!r}))
        assert trial.keywords["spec"].name == "trial" and callable(trial)
        """
    )


@pytest.fixture(scope="module")
def imports_probe(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """One fresh interpreter, its modules (whole names) after each step: Ray Tune's worker
    imports (``tune``), a trial unpickled as its worker does (``trial``), the driver's and a
    trial's imports (``driver``), then opening a new study's stores (``stores``, which needs
    those imports first anyway)."""
    workdir = tmp_path_factory.mktemp("imports") / "w"
    steps = (_RAY_TUNE_WORKER, _trial_unpickle_code(), _DRIVER_IMPORTS, _open_stores_code(workdir))
    names = ("tune", "trial", "driver", "stores")
    return dict(zip(names, imported_after(*steps, full=True), strict=True))


#: what a trial process never needs: the driver's stores and searcher, the figures, SciPy and
#: scikit-learn (the digits task reads its own copy of the data)
_NOT_IN_A_TRIAL = {"mlflow", "optuna", "matplotlib", "sklearn", "scipy", "sqlalchemy", "alembic"}
#: fedtune's parts that only the driver, the service or the command line use
_DRIVER_PARTS = (
    "fedtune.tuning.driver",
    "fedtune.tuning.mlflow",
    "fedtune.tuning.optuna",
    "fedtune.tuning.analysis",
    "fedtune.service",
    "fedtune.cli",
)


def test_a_trial_process_adds_only_the_engine_to_ray_tune(imports_probe) -> None:
    """A Ray Tune trial's worker loads Ray Tune itself first (its actor class); unpickling the
    trial then adds fedtune's engine and spec, torch and pydantic, and nothing of the driver:
    no MLflow, Optuna, matplotlib, SciPy or scikit-learn, no driver or service module
    (docs/explanation/architecture.md, *What a trial process imports*)."""
    tune, trial = imports_probe["tune"], imports_probe["trial"]
    added = trial - tune
    assert "fedtune.tuning.trials.trainable" in added and "torch" in added
    assert not trial & _NOT_IN_A_TRIAL
    assert not [m for m in trial if m.startswith(_DRIVER_PARTS)]
    third_party = {m.split(".")[0] for m in added} - sys.stdlib_module_names
    assert third_party <= {"fedtune", "torch", "torchgen", "pydantic"}


def test_driver_and_trial_imports_leave_mlflow_and_matplotlib_out(imports_probe) -> None:
    """The driver imports MLflow in a thread while Ray starts; a trial process needs neither
    MLflow nor matplotlib (figures are drawn by the driver at the end)."""
    loaded = imports_probe["driver"]
    assert "ray" in loaded and "optuna" in loaded
    assert "mlflow" not in loaded
    assert "matplotlib" not in loaded
    from fedtune.tuning import write_artifacts  # the lazy names still resolve

    assert callable(write_artifacts)


def test_timeline_marks_only_when_asked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "timeline.jsonl"
    monkeypatch.delenv(timeline.ENV, raising=False)
    timeline.mark("off")
    assert not path.exists() and not timeline.enabled()
    monkeypatch.setenv(timeline.ENV, str(path))
    assert timeline.enabled()
    timeline.mark("a")
    timeline.mark("b", 12.5)
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["phase"] for r in rows] == ["a", "b"]
    assert rows[1]["t"] == 12.5 and rows[0]["pid"] == os.getpid()
    started = timeline.process_start()
    assert started is not None and started <= time.time()


def _without_ray(monkeypatch: pytest.MonkeyPatch, calls: list[str]) -> None:
    """run_study with Ray and the fit replaced: records where the stores were opened."""
    import threading

    from fedtune.tuning.driver import study

    real_open = study._open_stores

    def open_(*args, **kwargs):
        calls.append(f"optuna:{threading.current_thread().name}")
        return real_open(*args, **kwargs)

    @contextlib.contextmanager
    def ray_session(*args, **kwargs):
        calls.append("ray")
        yield False

    monkeypatch.setattr(study, "_open_stores", open_)
    monkeypatch.setattr(study, "_ray_session", ray_session)
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 2.0})
    monkeypatch.setattr(
        study,
        "_fit",
        lambda plan, runtime, progress, sinks: study.Fitted(
            runtime.stores, runtime.tracking.result()
        ),
    )


def tiny_doc(name: str = "tiny", **top: object) -> dict:
    """A one-round study of two trials on a one-client quadratic, as a document, with ``top``
    replacing its top-level sections."""
    return {
        "name": name,
        "algorithm": "fedavg",
        "task": {"name": "quadratic", "clients": 1, "dim": 1, "examples": 1, "seed": 0},
        "train": {"rounds": 1, "clients_per_round": 1, "local_steps": 1, "batch_size": 1},
        "search": {"space": "fedavg"},
        "sampler": {"name": "random", "seed": 0},
        "scheduler": {"name": "none"},
        "budget": {"trials": 2},
        "objective": {"metric": "train_loss", "last_rounds": 1},
        **top,
    }


def tiny_spec(name: str = "tiny"):
    """:func:`tiny_doc`'s study (for the study's phases)."""
    from fedtune.tuning.spec import StudySpec

    return StudySpec.from_dict(tiny_doc(name))


def test_a_new_study_opens_its_stores_while_ray_starts(
    tmp_path: Path, warm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedtune.tuning.driver.study import run_study

    calls: list[str] = []
    _without_ray(monkeypatch, calls)
    workdir = tmp_path / "study"
    result = run_study(tiny_spec(), workdir)
    # a thread, not the driver (the first thread builds the task: the preflight begins first)
    assert calls[0].startswith("optuna:fedtune-stores_") and "ray" in calls
    assert (workdir / "optuna.db").is_file() and (workdir / "mlflow.db").is_file()
    assert result.parent_run_id and result.target_trials == 2
    calls.clear()
    run_study(tiny_spec(), workdir)  # stored: opened first, Ray only if trials remain
    assert calls == ["optuna:MainThread", "ray"]


@pytest.fixture
def mlflow_process() -> Iterator[dict]:
    """``run_study``'s arguments for one study MLflow process the runs of a test share
    (:func:`tests.shared_tracking.shared_tracking`)."""
    with shared_tracking() as shared:
        yield shared


def test_a_finished_study_run_again_places_draws_and_logs_nothing(
    tmp_path: Path, warm_cache: Path, mlflow_process: dict, monkeypatch
) -> None:
    """A re-run with no trial left weighs no placement (the cost's probe builds the task); one
    whose last end recorded what an end would record now draws and logs nothing (no figure
    drawn again, nothing sent to MLflow) and imports neither PyTorch, matplotlib nor MLflow.
    Other trials draw and log again; a study whose MLflow store is gone takes the full end."""
    from mlflow import MlflowClient

    from fedtune.tuning.driver import ending, study

    workdir = tmp_path / "study"
    shared = mlflow_process
    first = study.run_study(tiny_spec(), workdir, in_process=True, **shared)
    assert first.finished == 2
    figures = sorted((workdir / "tradeoff").glob("*.png"))
    assert {"curves.png", "pareto.png", "envelope.png"} <= {p.name for p in figures}
    drawn = {p.name: p.stat().st_mtime_ns for p in figures}
    client = MlflowClient(first.tracking_uri)
    ended = client.get_run(first.parent_run_id).info
    placed: list[int | None] = []
    real_place = study.place

    def place(spec, **kwargs):
        placed.append(kwargs["target"])
        return real_place(spec, **kwargs)

    monkeypatch.setattr(study, "place", place)
    again = study.run_study(tiny_spec(), workdir, in_process=True)
    assert (again.finished, again.ran, placed) == (2, 0, [])
    assert {p.name: p.stat().st_mtime_ns for p in figures} == drawn  # not drawn again
    now = client.get_run(first.parent_run_id).info  # not reopened, not ended again
    assert (now.status, now.end_time) == ("FINISHED", ended.end_time)
    same = {"ran", "timings", "packing"}  # what this invocation did, not what the study holds
    assert {k: v for k, v in again.to_dict().items() if k not in same} == {
        k: v for k, v in first.to_dict().items() if k not in same
    }
    run_again = textwrap.dedent(
        f"""
        from fedtune.tuning.driver.study import run_study
        from fedtune.tuning.spec import StudySpec
        result = run_study(StudySpec.from_dict({tiny_doc()!r}), {str(workdir)!r}, in_process=True)
        assert (result.ran, result.parent_run_id) == (0, {first.parent_run_id!r})
        """
    )
    (loaded,) = imported_after(run_again)
    assert not {"torch", "matplotlib", "mlflow"} & loaded, loaded
    plan, opened = study._prepare(tiny_spec(), workdir.resolve(), None, time.perf_counter())
    assert ending.ended(plan, opened) is not None
    (workdir / "mlflow.db").rename(tmp_path / "away.db")
    assert ending.ended(plan, opened) is None  # its MLflow store is gone: a full end
    (tmp_path / "away.db").rename(workdir / "mlflow.db")
    more = study.run_study(tiny_spec(), workdir, trials=3, in_process=True, **shared)
    assert (more.finished, more.ran, placed) == (3, 1, [3])  # a trial left: placed once
    assert all(drawn[p.name] != p.stat().st_mtime_ns for p in figures)  # drawn again
    assert client.get_run(first.parent_run_id).data.metrics["n_trials"] == 3.0


def test_a_bad_budget_fails_before_ray_starts(
    tmp_path: Path, cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from fedtune.errors import ConfigError
    from fedtune.tuning.driver.study import run_study

    calls: list[str] = []
    _without_ray(monkeypatch, calls)
    with pytest.raises(ConfigError, match=r"budget\.trials"):
        run_study(tiny_spec(), tmp_path / "study", trials=0)
    assert calls == []  # neither Ray nor the stores


def test_the_parent_run_opened_while_ray_started_ends_failed_when_ray_fails(
    tmp_path: Path, warm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from fedtune.errors import ConfigError
    from fedtune.tuning.driver import study

    calls: list[str] = []
    _without_ray(monkeypatch, calls)
    monkeypatch.setattr("ray.cluster_resources", lambda: {"CPU": 0.0})  # no CPU at all
    workdir = tmp_path / "study"
    with pytest.raises(ConfigError, match=r"resources\.cpu"):
        study.run_study(tiny_spec(), workdir)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    runs = client.search_runs([experiment.experiment_id])
    assert [(r.info.run_name, r.info.status) for r in runs] == [("tiny", "FAILED")]


def test_ctrl_c_while_ray_starts_kills_the_parent_run(
    tmp_path: Path, warm_cache: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mlflow import MlflowClient

    from fedtune.tuning.driver import study

    calls: list[str] = []
    _without_ray(monkeypatch, calls)

    def interrupted() -> dict:
        raise KeyboardInterrupt

    monkeypatch.setattr("ray.cluster_resources", interrupted)
    workdir = tmp_path / "study"
    with pytest.raises(KeyboardInterrupt):
        study.run_study(tiny_spec(), workdir)
    client = MlflowClient(f"sqlite:///{workdir / 'mlflow.db'}")
    (experiment,) = [e for e in client.search_experiments() if e.name != "Default"]
    runs = client.search_runs([experiment.experiment_id])
    assert [r.info.status for r in runs] == ["KILLED"]


def test_opening_the_stores_leaves_matplotlib_to_the_first_trial(imports_probe) -> None:
    """The stores' thread (MLflow store, parent run) runs while Ray and the
    first trial's worker start, on the same CPUs; the figures' matplotlib (~0.6 s of CPU) is
    imported once the first trial runs instead (``startup.import_soon``), not there."""
    loaded = imports_probe["stores"]
    assert "mlflow" in loaded and "matplotlib" not in loaded


def _tune_code(workdir: Path, **top: object) -> str:
    """``fedtune tune`` in this process on :func:`tiny_doc`'s study (two clients, four rounds)
    with ``top`` replacing its top-level sections; it must train its trials here and exit 0."""
    spec = tiny_doc(
        "no-ray",
        **{
            "task": {"name": "quadratic", "clients": 2, "dim": 1, "examples": 2, "seed": 0},
            "train": {"rounds": 4, "clients_per_round": 1, "local_steps": 1, "batch_size": 1},
            "budget": {"trials": 2, "max_concurrent": 1},
            **top,
        },
    )
    return textwrap.dedent(
        f"""
        import contextlib, io, json
        from pathlib import Path
        from fedtune.cli import main
        workdir = Path({str(workdir)!r})
        workdir.mkdir(parents=True)
        (workdir / "study.json").write_text(json.dumps({spec!r}))
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            code = main(["tune", str(workdir / "study.json"), "--workdir", str(workdir / "w")])
        assert code == 0, out.getvalue()
        assert "in the driver's process (no Ray)" in out.getvalue(), out.getvalue()
        """
    )


def test_a_study_in_the_drivers_process_never_imports_ray(tmp_path: Path, warm_cache: Path) -> None:
    """``fedtune tune`` of a study whose trials run in its own process imports no Ray at all
    (``import ray`` and Ray Tune: about 0.95 CPU-s a process): its searcher, scheduler and
    callbacks subclass Ray-free bases (``fedtune.tuning.tune_hooks``) and only the Ray path
    wraps them in Ray Tune's classes (docs/explanation/architecture.md, *Trials in the driver's
    process*). One configuration at a time, then a pack of two that ASHA stops members of."""
    one, packed = imported_after(
        _tune_code(tmp_path / "one"),
        _tune_code(
            tmp_path / "packed",
            scheduler={"name": "asha", "grace_rounds": 1, "reduction_factor": 2},
            budget={"trials": 4, "max_concurrent": 2},
            resources={"pack": 2},
        ),
        full=True,
    )
    for loaded in (one, packed):
        assert "fedtune.tuning.driver.in_process" in loaded and "torch" in loaded
        assert not [m for m in loaded if m == "ray" or m.startswith("ray.")]
        assert "fedtune.tuning.driver.ray_adapters" not in loaded
    assert "fedtune.tuning.packing.box" in packed


#: validate built-in studies as ``fedtune tune`` and the service do: the example study (digits,
#: fedavgm, a shipped space), a synthetic task whose model is checked, an extension method with
#: a cross-field check (MaSS) and a refusal that lists every registered model
_VALIDATE_SPECS = textwrap.dedent(
    """
    from fedtune.errors import ConfigError
    from fedtune.tuning.spec import StudySpec
    example = StudySpec.from_file({example!r})
    assert example.algorithm == "fedavgm" and "server_momentum" in example.search_space()
    base = {{
        "name": "lite", "train": {{"rounds": 1, "clients_per_round": 1, "batch_size": 1}},
        "objective": {{"metric": "train_loss", "last_rounds": 1}}, "budget": {{"trials": 1}}}}
    synthetic = {{"name": "synthetic", "model": "mlp", "clients": 2}}
    StudySpec.from_dict({{**base, "task": synthetic, "algorithm": "fedga"}}).search_space()
    linreg = {{"name": "linreg_interp", "clients": 2}}
    mass = {{**base, "task": linreg, "algorithm": "fedavg_mass"}}
    StudySpec.from_dict(mass).search_space()
    for bad, field, words in (
        ({{**mass, "hparams": {{"mass_auto": True, "client_lr": 0.1}}}}, "hparams.client_lr",
         "mass_auto is true"),
        ({{**base, "task": {{**synthetic, "model": "nope"}}, "algorithm": "fedavg"}},
         "task.model", "resnet18_gn"),
    ):
        try:
            StudySpec.from_dict(bad)
        except ConfigError as exc:
            assert exc.field == field and words in str(exc), exc
        else:
            raise AssertionError(bad)
    """
)

#: what ``fedtune serve`` does before its first answer: import the app, validate its warm-up spec
_SERVICE_START = textwrap.dedent(
    """
    import fedtune.service.api.app
    from fedtune.service.specs import accept_spec
    from fedtune.service.warmup import WARM_SPEC
    assert accept_spec(dict(WARM_SPEC))
    """
)

#: building what was validated imports the implementations (their modules and torch) then
_BUILD = textwrap.dedent(
    """
    from fedtune.trainers import algorithms, build_task, tasks
    task = build_task("quadratic", {"clients": 2, "dim": 2, "examples": 2}, seed=0)
    assert task.train.num_clients == 2
    assert callable(algorithms) and callable(tasks)  # the functions, not their subpackages
    """
)


#: what the study's MLflow process (``TrackerProcess``) imports
_TRACKER = "import fedtune.tuning.mlflow.tracking"


@pytest.fixture(scope="module")
def torchless_probe() -> dict[str, set[str]]:
    """One fresh interpreter, its top-level packages after each step: validating specs
    (``validated``), the service's start (``started``), the MLflow process's imports
    (``tracker``), then building a task (``built``, the first step that may import torch)."""
    example = str(ROOT / "fedtune" / "examples" / "quickstart.yaml")
    steps = (_VALIDATE_SPECS.format(example=example), _SERVICE_START, _TRACKER, _BUILD)
    names = ("validated", "started", "tracker", "built")
    return dict(zip(names, imported_after(*steps), strict=True))


def test_the_tracker_process_imports_mlflow_without_torch(torchless_probe) -> None:
    """The study's MLflow process (``TrackerProcess``) never trains: what it imports
    (``fedtune.tuning.mlflow.tracking``) loads MLflow but not torch, whose import costs it
    about 1.3 CPU-s more for two metric names (``fedtune.round_keys``). (It runs after the
    steps of :func:`test_validating_a_spec_and_starting_the_service_leave_torch_out`, which
    import no torch either, in the same interpreter.)"""
    loaded = torchless_probe["tracker"]
    assert "mlflow" in loaded
    assert "torch" not in loaded


def test_validating_a_spec_and_starting_the_service_leave_torch_out(torchless_probe) -> None:
    """A process that only validates a study spec — ``fedtune serve`` (its warm-up and every
    submission), ``fedtune tune`` or ``fedtune train`` refusing a spec — reads the registries'
    metadata (names, parameters, defaults, checks) and never imports torch (about 1.2 CPU-s) or
    the engine; the implementations are imported when something is built."""
    validated, started, built = (torchless_probe[k] for k in ("validated", "started", "built"))
    assert "pydantic" in validated and "fedtune" in validated
    for loaded in (validated, started):
        assert "torch" not in loaded
        assert not loaded & {"ray", "mlflow", "optuna", "matplotlib", "sklearn", "scipy"}
    assert "fastapi" in started
    assert "torch" in built


def test_the_engine_names_resolve_lazily_and_stay_consistent() -> None:
    """``fedtune.trainers.algorithms`` and ``.tasks`` are subpackages and, in the package, the
    listing functions; importing a submodule of either later does not replace the function."""
    import importlib

    algorithm_parts = importlib.import_module("fedtune.trainers.algorithms.base")
    task_parts = importlib.import_module("fedtune.trainers.tasks.base")
    from fedtune import trainers
    from fedtune.trainers import Trainer, algorithms, tasks
    from fedtune.trainers.algorithms import LocalUpdate, weighted_mean
    from fedtune.trainers.algorithms.local_update import LocalUpdate as Defined
    from fedtune.trainers.tasks import Task

    assert callable(algorithms) and "fedavg" in algorithms()
    assert callable(tasks) and "quadratic" in tasks()
    assert trainers.algorithms is algorithms and trainers.tasks is tasks
    assert trainers.Trainer is Trainer and Trainer.__module__ == "fedtune.trainers.engine"
    assert LocalUpdate is Defined
    assert weighted_mean is algorithm_parts.weighted_mean and Task is task_parts.Task


def test_a_deferred_implementation_is_imported_when_first_called() -> None:
    """A built-in model's factory in the registry is a ``Deferred``: named by its module,
    pickled by that name, and the function itself once called."""
    import pickle

    from fedtune.trainers.models.registry import REGISTRY
    from fedtune.trainers.plugins import Deferred

    factory = REGISTRY.get("mlp")
    assert isinstance(factory, Deferred)
    assert (factory.__module__, factory.__name__) == ("fedtune.trainers.models.basic", "mlp")
    again = pickle.loads(pickle.dumps(factory))
    assert again == factory and hash(again) == hash(factory) and again is not factory
    model = factory((4,), 3)  # 4 → 128 → 128 → 3, with biases
    assert (
        sum(p.numel() for p in model.parameters()) == 4 * 128 + 128 + 128 * 128 + 128 + 128 * 3 + 3
    )
    assert factory.resolve() is sys.modules["fedtune.trainers.models.basic"].mlp
    assert Deferred("fedtune.trainers.models.basic", "mlp") != Deferred(
        "fedtune.trainers.models.basic", "cnn"
    )


def test_a_servers_seeded_store_is_what_mlflow_db_upgrade_makes(
    tmp_path: Path, cache: Path
) -> None:
    """``fedtune mlflow-server``'s new SQLite store (``default_experiment=False``): every table
    and row as ``mlflow db upgrade`` leaves a new store, no ``Default`` experiment (the server
    makes it with its own artifact root), from a template a study made."""
    from mlflow.db import upgrade

    made = tmp_path / "upgraded.db"
    upgrade.main([f"sqlite:///{made}"], standalone_mode=False)
    seeded = tmp_path / "s" / "mlflow.db"
    assert not seed_sqlite_store(f"sqlite:///{seeded}", default_experiment=False)
    assert not template_path().exists() and not seeded.exists()  # a server builds none
    assert seed_sqlite_store(f"sqlite:///{tmp_path / 'study.db'}")  # a study builds it
    assert seed_sqlite_store(f"sqlite:///{seeded}", default_experiment=False)
    assert _schema(seeded) == _schema(made)
    tables = [name for kind, name, _ in _schema(made) if kind == "table"]
    assert "experiments" in tables and "alembic_version" in tables
    for table in tables:
        every = f'SELECT * FROM "{table}" ORDER BY 1'
        assert _rows(seeded, every) == _rows(made, every), table
    assert _rows(seeded, "SELECT count(*) FROM experiments") == [(0,)]
