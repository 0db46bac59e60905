"""How a study's row becomes what the API shows of it: its listing entry and its detail.

Split from :mod:`.services` (which reads and changes studies) so that the view of one study —
its progress over its trials, its best trial, its MLflow links and its events — has one owner.
"""

from __future__ import annotations

from collections.abc import Mapping

from . import tickets
from .mlflow_links import mlflow_links
from .models import Study, utcnow
from .paths import study_tracking_uri
from .repository import Repository
from .schemas import BestTrial, Progress, StudyDetail, StudyEvent, StudyOut
from .settings import Settings
from .states import StudyState, TrialState

__all__ = ["study_detail", "study_out"]


def study_out(study: Study) -> StudyOut:
    """The API's view: a study whose driver a queue outside fedtune still holds (a RayJob that
    Kueue has not admitted) is ``queued``, with that queue's reason."""
    if study.state == StudyState.RUNNING and study.queued_reason:
        return StudyOut.from_attributes(study, state=StudyState.QUEUED)
    return StudyOut.from_attributes(study)


def study_detail(settings: Settings, repo: Repository, study: Study) -> StudyDetail:
    """A study's API detail: its row, progress, best trial, MLflow links and events.

    Args:
        settings: The service's settings (the MLflow links).
        repo: The repository of an open session.
        study: The study's row.

    Returns:
        What ``GET /v1/studies/{id}`` answers.
    """
    counts, rounds = repo.trial_progress(study.id)
    return StudyDetail.from_attributes(
        study_out(study),
        spec=study.spec,
        progress=_progress(study, counts, rounds),
        best=_best(repo, study),
        mlflow=mlflow_links(
            settings,
            study_tracking_uri(settings, study.id),
            study.project,
            study.mlflow_experiment_id,
            study.mlflow_run_id,
        ),
        events=_events(repo, study) if study.attempts else [],
    )


def _events(repo: Repository, study: Study) -> list[StudyEvent]:
    """The study's attempts whose start ticket was redeemed twice (:mod:`.tickets`)."""
    return [
        StudyEvent(
            at=event.at,
            kind=tickets.COMPROMISED,
            attempt=event.attempt,
            message=(
                f"the start ticket of attempt {event.attempt} was redeemed a second time: the "
                "attempt was marked compromised and its driver credential revoked"
            ),
        )
        for event in tickets.events(repo.session, study.id)
    ]


def _progress(study: Study, counts: Mapping[TrialState, int], rounds: int) -> Progress:
    """A study's progress: its trials by state and the largest share of a budget it used.

    Args:
        study: The study's row.
        counts: Its trials by state.
        rounds: The configuration-rounds its trials trained.

    Returns:
        The progress the API shows.
    """
    done = counts[TrialState.COMPLETED] + counts[TrialState.PRUNED] + counts[TrialState.FAILED]
    requested = study.trials_requested
    shares = [done / requested if requested else 1.0]
    budget = study.sections.budget
    if budget.configuration_rounds is not None:
        shares.append(rounds / budget.configuration_rounds)
    if budget.time is not None and study.started_at is not None:
        ran = (study.finished_at or utcnow()) - study.started_at
        shares.append(ran.total_seconds() / budget.time)
    return Progress(
        requested=requested,
        finished=done,
        completed=counts[TrialState.COMPLETED],
        pruned=counts[TrialState.PRUNED],
        failed=counts[TrialState.FAILED],
        killed=counts[TrialState.KILLED],
        running=counts[TrialState.RUNNING],
        fraction=min(1.0, max(0.0, *shares)),
        configuration_rounds=rounds,
    )


def _best(repo: Repository, study: Study) -> BestTrial | None:
    """The driver's pick once the study finished; meanwhile the best completed trial so far."""
    if study.best_trial is not None:
        trial = repo.get_trial(study.id, study.best_trial)
        done = trial is not None and trial.state == TrialState.COMPLETED
        params = trial.params if done else {}
        return BestTrial(number=study.best_trial, value=study.best_value, params=params)
    maximise = study.sections.maximise
    trial = None if maximise is None else repo.best_completed(study.id, maximise)
    if trial is None:
        return None
    return BestTrial(number=trial.number, value=trial.value, params=trial.params)
