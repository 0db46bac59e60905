"""Budgets in compute end to end: ``budget.configuration_rounds`` and ``budget.time``.

Real local Ray and Optuna's RDB storage, as ``test_tuning_study.py``. A study with a budget in
configuration-rounds never trains more than it, packed or not, and leaves less than one
configuration's rounds unspent; stopping configurations early buys more of them; a resumed
study counts what its earlier sessions trained.
"""

from __future__ import annotations

import io

import optuna
import pytest

from fedtune.tuning.driver.study import run_study
from fedtune.tuning.spec import StudySpec

ROUNDS = 12  # the quadratic study's train.rounds


def _trained(result) -> list[int]:
    """Rounds each finished trial of the study trained: its ``rounds`` user attribute, or for a
    trial the time budget interrupted (recorded without one), its last reported round."""
    study = optuna.load_study(study_name=result.name, storage=result.storage_url)
    assert not [t for t in study.trials if t.state == optuna.trial.TrialState.RUNNING]
    return [
        t.user_attrs.get("rounds", max(t.intermediate_values, default=0))
        for t in study.trials
        if t.state.is_finished()
    ]


@pytest.mark.parametrize(
    ("scheduler", "resources", "concurrent"),
    [
        ({"name": "none"}, {"pack": 1}, 2),
        ({"name": "asha", "grace_rounds": 2, "reduction_factor": 2}, {"pack": 1}, 2),
        ({"name": "asha", "grace_rounds": 2, "reduction_factor": 2}, {"pack": 4}, 4),
    ],
    ids=["unpacked", "unpacked-asha", "packed-asha"],
)
def test_configuration_rounds_are_never_exceeded_and_spent(
    tmp_path, ray_local, quadratic_study, scheduler, resources, concurrent
):
    budget = 5 * ROUNDS + ROUNDS // 2  # 66: five whole configurations and half of one
    raw = quadratic_study(
        "rounds-budget",
        sampler={"name": "random", "seed": 1},
        scheduler=scheduler,
        budget={"configuration_rounds": budget, "max_concurrent": concurrent},
        resources=resources,
    )
    spec = StudySpec.from_dict(raw)
    assert spec.budget.trials is None  # a budget in compute: no limit in trials
    progress = io.StringIO()
    result = run_study(spec, tmp_path / "study", progress=progress)

    trained = _trained(result)
    assert budget - ROUNDS < sum(trained) <= budget, trained
    assert result.configuration_rounds == sum(trained)
    assert result.target_trials is None and result.finished == len(trained)
    if scheduler["name"] == "none":  # every configuration runs to the end: exactly five fit
        assert trained == [ROUNDS] * 5
    else:  # stopped configurations gave back what they did not train: more of them ran
        assert len(trained) > 5 and min(trained) < ROUNDS, trained
    if resources["pack"] > 1:
        assert result.packing.startswith("4 configurations per trial process")
    lines = progress.getvalue().splitlines()
    assert f"{sum(trained)}/{budget} configuration-rounds" in lines[-1], lines[-1]


def test_a_resumed_study_counts_what_earlier_sessions_trained(tmp_path, ray_local, quadratic_study):
    def spec(budget: int) -> StudySpec:
        raw = quadratic_study(
            "rounds-resume",
            sampler={"name": "random", "seed": 2},
            scheduler={"name": "none"},
            budget={"configuration_rounds": budget, "max_concurrent": 1},
        )
        return StudySpec.from_dict(raw)

    first = run_study(spec(ROUNDS), tmp_path / "study")
    assert _trained(first) == [ROUNDS]
    again = run_study(spec(ROUNDS), tmp_path / "study")  # spent: nothing more runs
    assert again.ran == 0 and _trained(again) == [ROUNDS]
    more = run_study(spec(2 * ROUNDS + 5), tmp_path / "study")  # room for one more
    assert more.ran == 1 and _trained(more) == [ROUNDS] * 2
    assert more.configuration_rounds == 2 * ROUNDS


def test_time_budget_with_no_trial_count_runs_until_the_time_is_spent(
    tmp_path, ray_local, quadratic_study
):
    """``budget.time`` alone: as many trials as fit, then what runs is stopped."""
    raw = quadratic_study(
        "time-budget",
        sampler={"name": "random", "seed": 0},
        scheduler={"name": "none"},
        budget={"time": "2s", "max_concurrent": 1},
    )
    spec = StudySpec.from_dict(raw)
    assert (spec.budget.trials, spec.budget.time) == (None, 2.0)
    progress = io.StringIO()
    result = run_study(spec, tmp_path / "study", progress=progress)
    # how many trials fit depends on the machine's load; with no limit in trials only the time
    # ends the fit (a study that ignored it would not end), and not before it is spent
    assert result.timings["tuning_s"] >= 2, result.timings
    assert result.target_trials is None
    _trained(result)  # nothing left running
    assert "of 0:02" in progress.getvalue()
