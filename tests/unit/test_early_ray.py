"""``fedtune tune`` starts its embedded Ray before its imports (start-up):
``fedtune.tuning.driver.ray_session.EarlyRay`` holds the study lock, starts Ray in a thread, hands both
to ``run_study``, and never leaves Ray running — after a spec error, a finished study, Ctrl-C.
Timing is measured by ``benchmarks/startup.py``; here only what must hold."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import pytest

from fedtune.errors import ConflictError, RayStartError
from fedtune.tuning.driver import ray_session as rs
from fedtune.tuning.driver.ray_runtime import _candidates, ray_temp_dir

ROOT = Path(__file__).resolve().parents[2]

STUDY = textwrap.dedent(
    """
    name: early
    task: {name: quadratic, clients: 2, dim: 2, examples: 2, seed: 0}
    algorithm: fedavg
    train: {rounds: 2, clients_per_round: 2, local_steps: 1, batch_size: 1, dtype: float64}
    search: {space: fedavg}
    sampler: {name: random, seed: 0}
    scheduler: {name: none}
    objective: {metric: train_loss, last_rounds: 1}
    budget: {trials: 2, max_concurrent: 2}
    """
)
ONE_AT_A_TIME = STUDY.replace("max_concurrent: 2", "max_concurrent: 1")
#: two configurations at once, one per process: Ray's trials (``pack: auto`` would weigh them by
#: cost, and the quadratic's cost puts them in the driver's process)
THROUGH_RAY = STUDY + "resources: {pack: 1}\n"


def test_the_early_ray_module_imports_nothing_heavy() -> None:
    """It is imported before anything else so that Ray starts at once: no torch, no Ray (the
    early thread imports Ray), no Optuna — also through the ``fedtune.tuning`` package."""
    code = (
        "import sys, fedtune.tuning.driver.ray_session, fedtune.tuning.common.timeline\n"
        "print(sorted(m for m in ('torch', 'ray', 'optuna', 'mlflow', 'pydantic') "
        "if m in sys.modules))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        check=True,
    )
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


@contextlib.contextmanager
def _fake_ray(calls: list[str], error: BaseException | None = None):
    @contextlib.contextmanager
    def session(workdir, address, runtime_env=None):
        calls.append("start")
        if error is not None:
            raise error
        try:
            yield False
        finally:
            calls.append("stop")

    yield session


def test_it_holds_the_study_lock_from_begin_to_close(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    with _fake_ray(calls) as session:
        monkeypatch.setattr(rs, "ray_session", session)
        early = rs.EarlyRay.begin(tmp_path / "w")
        assert early is not None and early.ready() is False and calls == ["start"]
        assert early._thread.is_alive()  # Ray's GCS and raylet die with the thread that began them
        with (
            pytest.raises(ConflictError, match=f"pid {os.getpid()}"),
            rs.study_lock(tmp_path / "w"),
        ):
            pass
        assert rs.EarlyRay.begin(tmp_path / "w") is None  # another driver's study: not touched
        early.claim()  # as run_study does
        early.close()
        early.close()  # idempotent
        assert calls == ["start", "stop"]
        with rs.study_lock(tmp_path / "w"):  # released
            pass


def test_stop_ray_waits_for_the_shutdown_and_keeps_the_lock_until_closed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the fit, run_study stops Ray and waits, so that its own thread touches nothing of
    Ray's while Ray shuts down; the lock stays held until the study closes it."""
    import threading

    shutting, release = threading.Event(), threading.Event()

    @contextlib.contextmanager
    def session(workdir, address, runtime_env=None):
        try:
            yield False
        finally:
            shutting.set()
            release.wait(30)  # a shutdown that takes its time

    monkeypatch.setattr(rs, "ray_session", session)
    early = rs.EarlyRay.begin(tmp_path / "w").claim()
    early.ready()
    threading.Timer(0.2, release.set).start()
    early.stop_ray()
    assert shutting.is_set() and release.is_set() and not early._thread.is_alive()
    with pytest.raises(ConflictError), rs.study_lock(tmp_path / "w"):
        pass  # the lock is still the study's
    early.close()
    with rs.study_lock(tmp_path / "w"):
        pass


def test_unclaimed_it_leaves_no_workdir_behind(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Closed before run_study took it (the spec failed validation): the lock file and the
    directories it made go; a directory that existed before, or holds more, stays."""
    calls: list[str] = []
    with _fake_ray(calls) as session:
        monkeypatch.setattr(rs, "ray_session", session)
        rs.EarlyRay.begin(tmp_path / "runs" / "study").close()
        assert not (tmp_path / "runs").exists() and calls == ["start", "stop"]
        (tmp_path / "old").mkdir()
        rs.EarlyRay.begin(tmp_path / "old").close()
        assert (tmp_path / "old").is_dir() and not (tmp_path / "old" / ".lock").exists()


def test_a_failed_start_is_raised_where_ray_is_needed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    error = RayStartError("Ray did not start (embedded) after 3 attempt(s): boom")
    with _fake_ray(calls, error) as session:
        monkeypatch.setattr(rs, "ray_session", session)
        early = rs.EarlyRay.begin(tmp_path / "w").claim()
        with pytest.raises(RayStartError, match="boom"):
            early.ready()
        early.close()
        with rs.study_lock(tmp_path / "w"):
            pass


def _args(study: Path, **kw) -> argparse.Namespace:
    base = {
        "study_file": str(study),
        "set": None,
        "workdir": None,
        "trials": None,
        "ray_address": None,
        "ray": False,
    }
    return argparse.Namespace(**(base | kw))


@pytest.mark.parametrize(
    ("text", "kw", "stored", "env", "begins", "tracker"),
    [
        (THROUGH_RAY, {}, False, {}, True, False),  # a new study: Ray at once
        (THROUGH_RAY, {}, True, {}, False, False),  # stored: it may be finished and need no Ray
        (THROUGH_RAY, {"trials": 4}, True, {}, True, False),  # extended: it will run trials
        (THROUGH_RAY, {"ray_address": "10.0.0.1:6379"}, False, {}, False, False),  # a cluster's
        (THROUGH_RAY, {}, False, {"RAY_ADDRESS": "10.0.0.1:6379"}, False, False),
        (THROUGH_RAY + "code: {path: ./lab, modules: [lab]}\n", {}, False, {}, False, False),
        ("name: [unclosed\n", {}, False, {}, False, False),  # the usual path reports the error
        # one configuration at a time on the CPU: its trials run in the driver, no Ray at all,
        # and its MLflow store's process starts at once, unless the study is stored and run
        # again as it is (finished, it needs no MLflow: its summary only)
        (ONE_AT_A_TIME, {}, False, {}, False, True),
        (ONE_AT_A_TIME, {}, True, {}, False, False),
        (ONE_AT_A_TIME, {"trials": 4}, True, {}, False, True),  # extended: it will run trials
        (ONE_AT_A_TIME + "code: {path: ./lab, modules: [lab]}\n", {}, False, {}, False, True),
        (ONE_AT_A_TIME, {"ray": True}, False, {}, True, False),
        (ONE_AT_A_TIME, {"ray_address": "10.0.0.1:6379"}, False, {}, False, False),
        (STUDY + "resources: {gpu: 0.5}\n", {}, False, {}, True, False),
        (STUDY + "resources: {pack: 2}\n", {}, False, {}, False, True),  # one pack of all
        # several at once with pack auto: weighed by cost once the engine is imported; the
        # prefetch counts them as the driver's (no Ray) and the driver puts a Ray choice right
        (STUDY, {}, False, {}, False, True),
        (STUDY + "resources: {pack: auto}\n", {}, False, {}, False, True),
        (STUDY, {"ray": True}, False, {}, True, False),
    ],
)
def test_when_the_cli_starts_ray_early(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text, kw, stored, env, begins, tracker
) -> None:
    from fedtune.cli import tune
    from fedtune.tuning.mlflow import process

    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    study = tmp_path / "study.yaml"
    study.write_text(text)
    if stored:
        (tmp_path / "runs" / "early").mkdir(parents=True)
        (tmp_path / "runs" / "early" / "optuna.db").touch()
    begun: list[Path] = []
    monkeypatch.setattr(rs.EarlyRay, "begin", classmethod(lambda cls, w: begun.append(w) or w))
    monkeypatch.setattr(process, "TrackerProcess", lambda: "tracker process")
    early, tracking = tune._early_start(_args(study, **kw))
    assert begun == ([tmp_path / "runs" / "early"] if begins else []) and early == (
        begun[0] if begins else None
    )
    assert tracking == ("tracker process" if tracker else None)


def _ray_processes(workdir: Path) -> list[int]:
    return [pid for pid, _ in _candidates((str(ray_temp_dir(workdir.resolve())),))]


def _tune(
    tmp_path: Path, study: Path, workdir: Path, timeline: Path
) -> subprocess.CompletedProcess:
    env = {
        **os.environ,
        "FEDTUNE_TIMELINE": str(timeline),
        "FEDTUNE_CACHE_DIR": str(tmp_path / "c"),
    }
    env.pop("RAY_ADDRESS", None)
    cmd = [
        sys.executable,
        "-m",
        "fedtune.cli",
        "tune",
        str(study),
        "--workdir",
        str(workdir),
        "--json",
    ]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=600)


@pytest.fixture(scope="module")
def cli_runs(tmp_path_factory) -> Iterator[dict[str, Future]]:
    """The module's two real ``fedtune tune`` runs, started together: a study, and a spec error.
    Each has its own directory, workdir and Ray and nothing reads another's, so they run at once;
    each test waits for its own (its directory, workdir, timeline and process)."""
    texts = {"study": THROUGH_RAY, "spec_error": THROUGH_RAY.replace("rounds: 2", "rounds: -2")}

    def launch(name: str) -> tuple[Path, Path, subprocess.CompletedProcess, float]:
        root = tmp_path_factory.mktemp(name)
        study, workdir, timeline = root / "study.yaml", root / "w", root / "t.jsonl"
        study.write_text(texts[name])
        started = time.monotonic()
        run = _tune(root, study, workdir, timeline)
        return workdir, timeline, run, time.monotonic() - started

    with ThreadPoolExecutor(max_workers=len(texts)) as pool:
        yield {name: pool.submit(launch, name) for name in texts}


def test_a_study_runs_on_the_ray_started_before_the_spec_was_read(cli_runs) -> None:
    workdir, timeline, run, _ = cli_runs["study"].result()
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["finished"] == 2 and result["best"] is not None
    marks = {}
    for line in timeline.read_text().splitlines():
        row = json.loads(line)
        marks.setdefault(row["phase"], row["t"])
    # Ray's start overlaps the driver's reading of the spec, its imports and its stores' opening;
    # the spec (validated without torch) and the driver's module (the engine is imported only
    # when trials remain) are often ready before the early thread has imported Ray and marked
    # its start, which run_study then waits for instead of starting a Ray of its own
    assert marks["cli"] < marks["spec_loaded"] < marks["driver_imported"]
    assert marks["cli"] < marks["early_ray"] < marks["ray_started"]
    assert marks["early_ray_ready"] <= marks["ray_started"]  # run_study used that Ray
    assert marks["trial_entered"] > marks["early_ray_ready"]
    # Ray has shut down before the report is written, and is gone when the process has ended
    # (which skips the module teardown, not Ray's clean-up)
    assert marks["fit_done"] < marks["ray_stopped"] < marks["finalize"]
    assert not ray_temp_dir(workdir.resolve()).exists() and _ray_processes(workdir) == []
    assert "SIGTERM handler" not in run.stderr  # Ray's note about its thread stays quiet


def test_a_spec_error_is_one_line_at_once_and_leaves_no_ray(cli_runs) -> None:
    workdir, timeline, run, seconds = cli_runs["spec_error"].result()
    assert run.returncode == 2, run.stderr[-3000:]
    lines = run.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("fedtune: error:") and "train.rounds" in lines[0]
    # Ray's start had been begun, and was stopped (the spec, validated without torch, is
    # refused before the early thread has imported Ray, which then starts nothing):
    assert '"ray_stopped"' in timeline.read_text()
    assert _ray_processes(workdir) == []
    assert not workdir.exists()  # nothing of the study is left, as without the early start
    assert seconds < 600
