"""``GET /v1/studies/{id}``'s best trial is picked in SQL now (one row back instead of every
completed trial): the same choice as before — completed, scored, not diverged; the lowest
value (the highest for ``test_accuracy``), the lowest trial number among equals; once the driver
stored its pick, that trial's parameters only if it completed. On SQLite and PostgreSQL."""

from __future__ import annotations

import pytest

from fedtune.service.access import Principal
from fedtune.service.errors import StudyNotFoundError
from fedtune.service.models import Study
from fedtune.service.repository import Repository
from fedtune.service.services import ServiceContext, get_study, read_study
from fedtune.service.states import StudyState, TrialState

TRIALS = [  # number, state, value, outcome
    (0, TrialState.COMPLETED, 0.2, "diverged"),
    (1, TrialState.COMPLETED, 0.7, "completed"),
    (2, TrialState.PRUNED, 0.1, "stopped"),
    (3, TrialState.COMPLETED, 0.5, None),
    (4, TrialState.COMPLETED, 0.5, "completed"),
    (5, TrialState.COMPLETED, None, "completed"),
    (6, TrialState.COMPLETED, 0.9, "completed"),
]


def _study(database, metric: str, best_trial: int | None = None) -> ServiceContext:
    with database.session() as s:
        repo = Repository(s)
        repo.add_study(
            Study(
                id="0123456789ab",
                name="s",
                state=StudyState.RUNNING,
                spec={"objective": {"metric": metric}},
                algorithm="fedavg",
                task="quadratic",
                trials_requested=7,
                attempts=1,
                project="default",
                best_trial=best_trial,
                best_value=None,
            )
        )
        for number, state, value, outcome in TRIALS:
            repo.start_trial("0123456789ab", number, {"n": number})
            repo.finish_trial("0123456789ab", number, state, value, outcome)
    return database


@pytest.mark.parametrize(("metric", "best"), [("train_loss", 3), ("test_accuracy", 6)])
def test_the_best_trial_is_the_same_pick(database, make_settings, metric, best) -> None:
    ctx = ServiceContext(_study(database, metric), make_settings(database_url=database.url))
    detail = get_study(ctx, "0123456789ab")
    assert detail.best is not None and detail.best.number == best
    assert detail.best.params == {"n": best}
    assert detail.progress.completed == 6 and detail.progress.pruned == 1


def test_a_stored_pick_shows_parameters_of_completed_trials_only(database, make_settings) -> None:
    ctx = ServiceContext(
        _study(database, "train_loss", best_trial=2), make_settings(database_url=database.url)
    )
    best = get_study(ctx, "0123456789ab").best
    assert best is not None and best.number == 2 and best.params == {}  # trial 2 was pruned


def test_read_study_checks_access_in_the_same_transaction(database, make_settings) -> None:
    ctx = ServiceContext(_study(database, "train_loss"), make_settings(database_url=database.url))
    member = Principal("mia", roles={"default": "viewer"})
    assert read_study(ctx, member, "0123456789ab").id == "0123456789ab"
    with pytest.raises(StudyNotFoundError):
        read_study(ctx, Principal("otto", roles={"other": "member"}), "0123456789ab")
