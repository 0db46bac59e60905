"""One study store, one trade-off, one objective.

A real study driver (``fedtune.service.driver.run_driver`` → ``run_study``: real Ray trials, a
real ``mlflow server``, the service database in SQLite) runs a tiny study; then, from the
outside:

* the REST ``GET /v1/studies/{id}/tradeoff`` body is MLflow's ``tradeoff/tradeoff.json`` byte
  for byte — single- and multi-objective (they used to be computed twice with different
  settings and disagreed for several objectives);
* every finished trial's value is the same number in Optuna, on its MLflow child run (metric
  ``objective``), in the service's trial list and (final loss) in the trade-off file — for
  completed, stopped (ASHA) and diverged trials alike;
* the best trial's run carries ``best_trial = true`` (and only it), the parent points to it, and
  the parent has the trials table.
"""

from __future__ import annotations

import itertools
import json
import math
from pathlib import Path

import optuna
import pytest
from fastapi.testclient import TestClient
from mlflow import MlflowClient

from fedtune.service.api import create_app
from fedtune.service.db import Database
from fedtune.service.driver import run_driver
from fedtune.service.migrate import upgrade_database
from fedtune.service.paths import study_workdir
from fedtune.service.repository import Repository
from fedtune.service.services import ServiceContext, submit_study
from fedtune.service.settings import load_settings
from fedtune.service.states import StudyState

from .conftest import make_quadratic_study

TOKEN = "t" * 32
MAX_FLOAT = 1.7976931348623157e308  # MLflow stores ±∞ as ±max float

# one grid in a fixed order: the first trial sets ASHA's bar at round 4, the next two fall
# below it (stopped), η = 2 diverges
SINGLE = make_quadratic_study(
    "one-single",
    sampler={"name": "grid"},
    scheduler={"name": "asha", "grace_rounds": 4, "reduction_factor": 4},
    search={
        "parameters": {"server_lr": {"type": "categorical", "choices": [0.03, 0.02, 0.015, 2.0]}}
    },
    hparams={"client_lr": 0.05},
    budget={"trials": 4, "max_concurrent": 1},
)
MULTI = make_quadratic_study(
    "one-multi",
    objective={"metrics": ["final_loss", "rounds_to_target"], "target_loss": 3.0, "last_rounds": 3},
    sampler={"name": "random", "seed": 1},
    scheduler={"name": "none"},
    budget={"trials": 3, "max_concurrent": 1},
)


def _run(tmp_path: Path, mlflow_server: str, spec: dict):
    db_url = f"sqlite:///{tmp_path / 'fedtune.db'}"
    db = Database(db_url)
    upgrade_database(db)
    settings = load_settings(
        database_url=db_url,
        workdir=str(tmp_path / "work"),
        backend="none",
        mlflow_tracking_uri=mlflow_server,
        api_token=TOKEN,
    )
    ctx = ServiceContext(db, settings)
    sid = submit_study(ctx, spec)[0].id
    with db.session() as s:
        Repository(s).transition(sid, StudyState.RUNNING, attempts=1)
    assert run_driver(sid, settings, 1) == 0
    with db.session(readonly=True) as s:
        study = Repository(s).require_study(sid)
        assert study.state == StudyState.SUCCEEDED, study.error
        parent = study.mlflow_run_id
    db.dispose()
    return settings, sid, parent


@pytest.mark.parametrize("spec", [SINGLE, MULTI], ids=["single", "multi"])
def test_rest_tradeoff_is_mlflow_tradeoff_byte_for_byte(tmp_path, ray_local, mlflow_server, spec):
    settings, sid, parent = _run(tmp_path, mlflow_server, spec)
    client = MlflowClient(mlflow_server)
    stored = Path(client.download_artifacts(parent, "tradeoff/tradeoff.json", str(tmp_path)))
    app = create_app(settings, backend=None, schedule=False)
    with TestClient(app, headers={"Authorization": f"Bearer {TOKEN}"}) as api:
        r = api.get(f"/v1/studies/{sid}/tradeoff")
        api_trials = {t["number"]: t for t in api.get(f"/v1/studies/{sid}/trials").json()}
    assert r.status_code == 200 and r.headers["content-type"] == "application/json"
    assert r.content == stored.read_bytes()
    body = json.loads(r.content)
    assert "provisional" not in body["notes"]
    if spec is MULTI:
        assert body["pareto_target"] == 3.0

    # one value per trial: Optuna = MLflow `objective` = service = trade-off final loss
    study = optuna.load_study(
        study_name=spec["name"], storage=f"sqlite:///{study_workdir(settings, sid) / 'optuna.db'}"
    )
    runs = {
        int(r.data.tags["optuna_trial_number"]): r
        for r in client.search_runs(
            [client.get_run(parent).info.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'"
        )
    }
    summaries = {t["trial_id"]: t for t in body["trials"]}
    outcomes = set()
    for t in study.get_trials(
        states=[optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED]
    ):
        outcome = t.user_attrs["outcome"]
        outcomes.add(outcome)
        logged = runs[t.number].data.metrics["objective"]
        value = t.values[0]  # the objective (single) / final_loss (multi)
        if math.isinf(value):
            assert outcome == "diverged" and logged == MAX_FLOAT
            assert summaries[t.number]["flag"] == "diverged"
            continue
        assert logged == pytest.approx(value, rel=1e-12), (t.number, outcome)
        assert api_trials[t.number]["value"] == pytest.approx(value, rel=1e-12)
        # the objective is the mean ℓ over the last rounds reached
        assert summaries[t.number]["final_loss"] == pytest.approx(value, rel=1e-12)
    if spec is SINGLE:
        assert {"completed", "stopped", "diverged"} <= outcomes
        assert all(
            summaries[n]["flag"] == "stopped"
            for n, t in ((t.number, t) for t in study.trials)
            if t.user_attrs.get("outcome") == "stopped"
        )
        assert not set(body["pareto"]) & {n for n, s in summaries.items() if s["flag"]}

    # the best trial is marked, and only it; the parent points to it; the trials table
    best = [n for n, run in runs.items() if run.data.tags.get("best_trial") == "true"]
    parent_run = client.get_run(parent)
    assert len(best) == 1 and parent_run.data.tags["best_trial"] == str(best[0])
    assert parent_run.data.tags["best_run_id"] == runs[best[0]].info.run_id
    table = json.loads(
        Path(client.download_artifacts(parent, "trials_table.json", str(tmp_path))).read_text()
    )
    assert sorted(row[0] for row in table["data"]) == sorted(runs)
    assert {"number", "outcome", "objective", "rounds", "rounds_to_target"} <= set(table["columns"])


DECAYING = make_quadratic_study(
    "one-resume",
    decay={"enabled": True, "window": 1, "patience": 1, "cooldown": 2, "threshold": 1e9},
    sampler={"name": "random", "seed": 3},
    scheduler={"name": "none"},
    budget={"trials": 2, "max_concurrent": 1},
)  # threshold 1e9: no round "improves", so a rate decays every few rounds


def _history(client: MlflowClient, run_id: str, key: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in client.get_metric_history(run_id, key))


def test_resume_and_extension_add_no_duplicate_parent_metrics(tmp_path, ray_local, mlflow_server):
    from fedtune.tuning.driver.study import run_study
    from fedtune.tuning.spec import StudySpec

    spec = StudySpec.from_dict(DECAYING)
    first = run_study(spec, tmp_path / "s", tracking_uri=mlflow_server)
    client = MlflowClient(mlflow_server)
    parent = first.parent_run_id
    envelope = _history(client, parent, "envelope_loss")
    assert len(envelope) == len({s for s, _ in envelope}) == 12  # one point per round

    again = run_study(spec, tmp_path / "s", tracking_uri=mlflow_server)  # nothing left to run
    assert again.ran == 0 and again.parent_run_id == parent
    assert _history(client, parent, "envelope_loss") == envelope
    assert _history(client, parent, "n_trials") == [(2, 2.0)]

    more = run_study(spec, tmp_path / "s", tracking_uri=mlflow_server, trials=3)
    assert more.ran == 1
    assert _history(client, parent, "n_trials") == [(2, 2.0), (3, 3.0)]
    stored = json.loads(
        Path(client.download_artifacts(parent, "tradeoff/tradeoff.json", str(tmp_path))).read_text()
    )
    latest = {}
    for m in sorted(client.get_metric_history(parent, "envelope_loss"), key=lambda m: m.timestamp):
        latest[m.step] = m.value
    assert latest == {p["round"]: p["loss"] for p in stored["envelope"]}
    steps = [s for s, _ in _history(client, parent, "envelope_loss")]
    assert all(steps.count(s) <= 2 for s in set(steps))  # a new point only where E(R) changed

    # the best-trial marks follow the extension
    runs = {
        int(r.data.tags["optuna_trial_number"]): r
        for r in client.search_runs([more.experiment_id], f"tags.`mlflow.parentRunId` = '{parent}'")
    }
    marked = [n for n, r in runs.items() if r.data.tags.get("best_trial") == "true"]
    assert marked == [more.best["number"]]
    assert client.get_run(parent).data.tags["best_trial"] == str(more.best["number"])

    # decay is visible per trial: count and rounds, consistent with the logged client_lr
    study = optuna.load_study(study_name=spec.name, storage=more.storage_url)
    for t in study.trials:
        run = runs[t.number]
        rounds = t.user_attrs["decay_rounds"]
        assert rounds and t.user_attrs["decays"] == len(rounds)
        assert run.data.params["decay_rounds"] == ",".join(map(str, rounds))
        assert run.data.metrics["decays"] == len(rounds)
        lr = _history(client, run.info.run_id, "client_lr")
        drops = [s - 1 for (_, a), (s, b) in itertools.pairwise(lr) if b < a]
        assert drops == [r for r in rounds if r < 12]  # a decay takes effect the next round
