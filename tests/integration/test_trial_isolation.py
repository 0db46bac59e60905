"""Trials that share a reused Ray actor (``reuse_actors=True``: no new process per trial, which
keeps the per-trial overhead small) stay isolated: the same configuration gives the same
curve, bit for bit, before and after another configuration ran in the same process."""

from __future__ import annotations

import optuna
from ray import tune

from fedtune.tuning.driver.study import run_study
from fedtune.tuning.optuna import search as og
from fedtune.tuning.spec import StudySpec

A = {"hparams.client_lr": 0.05, "hparams.server_lr": 0.1}
B = {"hparams.client_lr": 0.09, "hparams.server_lr": 0.19}


class _Pids(tune.Callback):
    """The process each trial reported from (Tune adds ``pid`` to every result)."""

    def __init__(self) -> None:
        self.pids: dict[int, int] = {}

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.pids[int(trial.config["fedtune.trial"])] = int(result["pid"])


def test_a_reused_actor_leaks_nothing_between_trials(tmp_path, ray_local, quadratic_study):
    spec = StudySpec.from_dict(
        quadratic_study(
            "isolation",
            sampler={"name": "random", "seed": 0},
            scheduler={"name": "none"},
            budget={"trials": 3, "max_concurrent": 1},
        )
    )
    workdir = tmp_path / "study"
    workdir.mkdir()
    study = og.open_study(spec, og.make_storage(og.storage_url(workdir)), spec.search_space())
    for params in (A, B, A):  # A, then B in the same process, then A again
        study.enqueue_trial(dict(params))
    pids = _Pids()
    result = run_study(
        spec, workdir, tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}", sinks=[pids]
    )
    assert result.counts["completed"] == 3
    stored = optuna.load_study(study_name=spec.name, storage=result.storage_url)
    trials = {t.number: t for t in stored.trials}
    assert [trials[n].params for n in (0, 1, 2)] == [A, B, A]
    assert len(set(pids.pids.values())) == 1  # one actor ran all three
    curve = {n: trials[n].system_attrs[og.CURVE_ATTR] for n in (0, 1, 2)}
    assert curve[0] == curve[2]  # bit for bit: nothing of B (or of A's first run) leaked
    assert curve[0] != curve[1]
    assert trials[0].values == trials[2].values
