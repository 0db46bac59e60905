"""Per-round metrics reach MLflow through one background thread (``fedtune.tuning.mlflow.round_log``):
results of many trials are coalesced into few ``log_batch`` requests, the queue is bounded,
and nothing queued is lost when a trial ends, the study ends or the driver is interrupted.

Against a real MLflow store (a SQLite file; the study test a real ``mlflow server``)."""

from __future__ import annotations

import json
import subprocess
import sys
import threading

import pytest
from mlflow import MlflowClient

from fedtune.tuning import StudySpec
from fedtune.tuning.mlflow.round_log import RoundLog
from fedtune.tuning.mlflow.tracking import StudyTracker, round_metrics

from .conftest import REPO


def _rows(first: int, last: int) -> list[dict]:
    return [
        {"round": r, "client_loss": 1.0 / r, "objective": 2.0 / r} for r in range(first, last + 1)
    ]


class _Spy:
    """Counts ``log_batch`` requests that carry per-round metrics (key ``client_loss``)."""

    def __init__(self, client: MlflowClient) -> None:
        self.client, self.round_requests = client, 0
        self.real = client.log_batch

    def log_batch(self, run_id, metrics=(), **kwargs):
        if any(m.key == "client_loss" for m in metrics):
            self.round_requests += 1
        return self.real(run_id, metrics=metrics, **kwargs)


def _tracker(tmp_path, monkeypatch) -> tuple[StudyTracker, _Spy, str]:
    tracker = StudyTracker(f"sqlite:///{tmp_path / 'mlflow.db'}", "rounds")
    spy = _Spy(tracker.client)
    monkeypatch.setattr(tracker.client, "log_batch", spy.log_batch)
    parent = tracker.client.create_run(tracker.experiment_id).info.run_id
    return tracker, spy, parent


def test_results_of_many_trials_are_coalesced_and_none_is_lost_at_a_trials_end(
    tmp_path, monkeypatch
) -> None:
    tracker, spy, parent = _tracker(tmp_path, monkeypatch)
    tracker.rounds.linger = 60.0  # the thread never sends by itself: only the flushes below
    runs = [tracker.start_trial(parent, n, {"x": n}, {}) for n in range(4)]
    for r in range(1, 26):  # 25 results of one round each, per trial (report_every = 1)
        for run_id in runs:
            tracker.log_rounds(run_id, _rows(r, r))
    assert spy.round_requests == 0  # queued, not one request per result (the old code: 100)
    for run_id in runs:
        tracker.end_trial(run_id, "FINISHED", {"outcome": "completed"})
    assert spy.round_requests == 4  # one per trial: its 25 rounds in one log_batch
    for run_id in runs:
        steps = [m.step for m in tracker.client.get_metric_history(run_id, "client_loss")]
        assert sorted(steps) == list(range(1, 26))
        assert tracker.client.get_run(run_id).info.status == "FINISHED"
    tracker.finish_study(parent, {}, "FINISHED")
    assert tracker.rounds._thread is None  # stopped with the study


def test_the_thread_sends_on_its_own_and_reconcile_waits_for_it(tmp_path, monkeypatch) -> None:
    tracker, _, parent = _tracker(tmp_path, monkeypatch)
    tracker.rounds.linger = 0.05
    runs = [tracker.start_trial(parent, n, {}, {}) for n in range(3)]  # sent concurrently
    for r in range(1, 1501):  # 3000 metrics per run: more than one log_batch's 1000 entities
        for run_id in runs:
            tracker.log_rounds(run_id, _rows(r, r))
    closed = tracker.reconcile(parent, {})  # Ctrl-C / resume: the open runs end KILLED
    assert sorted(closed) == sorted(runs)
    for run_id in runs:
        history = tracker.client.get_metric_history(run_id, "objective")
        assert sorted(m.step for m in history) == list(range(1, 1501))
        assert tracker.client.get_run(run_id).info.status == "KILLED"
    tracker.finish_study(parent, {}, "KILLED")
    assert tracker.rounds._pool is None


class _Gate:
    """A client whose ``log_batch`` waits for ``open`` (a slow or stuck tracking server)."""

    def __init__(self, client: MlflowClient, fail: int = 0) -> None:
        self.client, self.open, self.fail = client, threading.Event(), fail

    def log_batch(self, run_id, metrics=()):
        self.open.wait()
        if self.fail:
            self.fail -= 1
            raise ConnectionError("tracking server unreachable")
        self.client.log_batch(run_id, metrics=metrics)


def test_a_full_queue_blocks_the_caller_instead_of_growing(tmp_path) -> None:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("q")).info.run_id
    gate = _Gate(client)
    log = RoundLog(gate, linger=0.0, max_pending=6)
    metrics = round_metrics(_rows(1, 3), 0)  # 6 metrics: the queue is full
    log.add(run_id, metrics)
    more = threading.Thread(target=log.add, args=(run_id, round_metrics(_rows(4, 6), 0)))
    more.start()
    more.join(1.0)
    # the flusher took the first batch (room again) or not: either way the queue holds at most
    # max_pending metrics, and a caller past the bound waits for the server
    assert log._count <= 6
    gate.open.set()
    more.join(30)
    assert not more.is_alive()
    log.close()
    assert sorted(m.step for m in client.get_metric_history(run_id, "client_loss")) == [
        1,
        2,
        3,
        4,
        5,
        6,
    ]


def test_a_failed_request_is_raised_in_the_driver_and_its_rounds_kept(tmp_path) -> None:
    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    gate = _Gate(client, fail=2)
    gate.open.set()
    log = RoundLog(gate, linger=60.0)
    log.RETRIES, log.RETRY_S = 1, 0.01
    log.add(run_id, round_metrics(_rows(1, 4), 0))
    with pytest.raises(ConnectionError):
        log.flush()  # failed twice: tried again once, then raised
    assert gate.fail == 0
    log.flush()  # the server is back: the same rounds are sent again
    assert sorted(m.step for m in client.get_metric_history(run_id, "client_loss")) == [1, 2, 3, 4]
    log.close()


def test_an_interrupted_study_keeps_every_round_its_driver_received(
    tmp_path, mlflow_server, quadratic_study
) -> None:
    """Ctrl-C after some results: every round the driver got is in MLflow (runs KILLED). The
    study runs as a process of its own (:mod:`tests.integration.interrupted_study` says why)."""
    doc = quadratic_study(
        "ctrl-c", scheduler={"name": "none"}, budget={"trials": 4, "max_concurrent": 2}
    )
    spec_json, out = tmp_path / "spec.json", tmp_path / "seen.json"
    spec_json.write_text(json.dumps(doc))
    argv = [
        sys.executable,
        "-m",
        "tests.integration.interrupted_study",
        str(spec_json),
        mlflow_server,
        str(tmp_path / "w"),
        str(out),
    ]
    proc = subprocess.run(argv, cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    seen = {int(n): set(rounds) for n, rounds in json.loads(out.read_text()).items()}
    spec = StudySpec.from_dict(doc)
    client = MlflowClient(mlflow_server)
    experiment = client.get_experiment_by_name(spec.experiment).experiment_id
    runs = {
        int(r.data.tags["optuna_trial_number"]): r
        for r in client.search_runs([experiment], "tags.study = 'ctrl-c'")
        if "optuna_trial_number" in r.data.tags
    }
    assert seen and set(seen) <= set(runs)
    for number, rounds in seen.items():
        stored = {m.step for m in client.get_metric_history(runs[number].info.run_id, "objective")}
        assert rounds <= stored
        assert runs[number].info.status in ("KILLED", "FINISHED")


def test_an_ended_study_whose_rounds_cannot_be_stored_says_so(
    tmp_path, caplog, monkeypatch
) -> None:
    """``_end_failed`` (Ctrl-C, a failed study): a child run that cannot be closed does not
    keep the parent run open, and the metrics left unstored are named on stderr, not hidden."""
    from types import SimpleNamespace

    from fedtune.tuning.driver import study as study_module

    client = MlflowClient(f"sqlite:///{tmp_path / 'mlflow.db'}")
    run_id = client.create_run(client.create_experiment("e")).info.run_id
    gate = _Gate(client, fail=10**6)  # the server never comes back
    gate.open.set()
    rounds = RoundLog(gate, linger=60.0)
    rounds.RETRIES, rounds.RETRY_S = 0, 0.01
    rounds.add(run_id, round_metrics(_rows(1, 3), 0))
    finished = []

    class Tracker:
        def unsent(self) -> int:
            return rounds.unsent

        def reconcile(self, parent, statuses):
            rounds.flush()

        def finish_study(self, parent, metrics, status):
            finished.append((parent, status))

    tracker = Tracker()
    stores = SimpleNamespace(result=lambda: SimpleNamespace(study=None, store=None))
    tracking = SimpleNamespace(result=lambda: SimpleNamespace(tracker=tracker, parent="p"))
    monkeypatch.setattr(study_module.og, "run_statuses", lambda study: {})
    monkeypatch.setattr(study_module.og, "reconcile", lambda study, store: None)
    with caplog.at_level("WARNING", logger=study_module.__name__):
        study_module._end_failed(stores, tracking, KeyboardInterrupt())
    assert finished == [("p", "KILLED")]
    assert rounds.unsent == 6  # 3 rounds of client_loss and objective, kept queued
    assert "6 metrics of its rounds are not stored" in caplog.text
    assert "tracking server unreachable" in caplog.text
