"""The data the phases of :func:`~.study.run_study` hand each other: the plan, the open stores
and tracking, what the runtime started, what the fit leaves to the finalize phase, and what
the study produced (:class:`StudyResult`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.wire_base import finite_or_none

from ..optuna import search as og
from ..optuna.store import StudyStore
from ..spec import StudySpec
from .failures import all_failed
from .placement import THROUGH_RAY, Placement
from .startup import Deferred

if TYPE_CHECKING:
    from ..mlflow.tracker import Tracker

__all__ = ["Fitted", "Runtime", "Stores", "StudyPlan", "StudyResult", "Tracking"]


@dataclass(frozen=True)
class StudyPlan:
    """One invocation of a study, as decided before anything starts (the phases' context).

    Args:
        spec: The study, its tracking URI without credentials (the plan is the driver's; what
            Tune, Optuna and MLflow record gets this spec).
        workdir: Its directory (resolved).
        space: Its search space.
        target: The number of finished trials it is to have (None: no limit in trials).
        stored: Its Optuna storage exists (a resume or an extension, not a new study).
        tracking_uri: The MLflow store given by the caller, else the spec's, with its
            credentials (None: ``MLFLOW_TRACKING_URI``, else the workdir's).
        ray_address: The Ray cluster to connect to (None: the caller's or an embedded Ray).
        t0: ``time.perf_counter()`` when :func:`.study.run_study` began.
        placement: Where its trials run: in the driver's process, without Ray
            (:mod:`.in_process`), or through Ray (:func:`.placement.place`, the one choice).
        run_user: Whom its MLflow runs name as their user (``mlflow.user``): the member who
            submitted it to a service (None: no user is recorded). A name, never a login.
    """

    spec: StudySpec
    workdir: Path
    space: Any
    target: int | None
    stored: bool
    tracking_uri: str | None
    ray_address: str | None
    t0: float
    placement: Placement = THROUGH_RAY
    run_user: str | None = None

    @property
    def in_process(self) -> bool:
        """Whether its trials run in the driver's process, without Ray."""
        return self.placement.in_process


@dataclass(frozen=True)
class Stores:
    """The study's Optuna storage, open and reconciled.

    Args:
        store: fedtune's view of the storage.
        study: The Optuna study.
        fixed: What reconciling it found (finished and interrupted trials).
        remaining: The trials still to run (target − finished; None: no limit in trials).
    """

    store: StudyStore
    study: Any
    fixed: og.Reconciled
    remaining: int | None


@dataclass(frozen=True)
class Tracking:
    """The study's MLflow store and parent run, open.

    Args:
        tracker: The MLflow store.
        parent: The parent run's id.
    """

    tracker: Tracker
    parent: str


@dataclass(frozen=True)
class Runtime:
    """What :func:`.study._start_runtime` started.

    Args:
        stores: The Optuna storage.
        tracking: The MLflow store, opening in a thread until the first trial starts.
        shipped: The study's code reaches the trials through the job's ``runtime_env``.
    """

    stores: Stores
    tracking: Deferred[Tracking]
    shipped: bool


@dataclass(frozen=True)
class Fitted:
    """What :func:`.fit.fit` leaves to :func:`.ending.finalize`.

    Args:
        stores: The Optuna storage.
        tracking: The MLflow store and parent run.
        first_start: ``time.perf_counter()`` when the first trial started (None: none ran).
        fit_s: Seconds the fit took.
        packing: How the fit packed configurations into trial processes (None: nothing ran).
    """

    stores: Stores
    tracking: Tracking
    first_start: float | None = None
    fit_s: float = 0.0
    packing: str | None = None


@dataclass
class StudyResult:
    """What a study produced: its records, counts, best configuration and trade-off.

    Attributes:
        name: The study's name.
        workdir: Its directory.
        storage_url: The Optuna storage.
        tracking_uri: The MLflow store, without credentials.
        experiment_id: The MLflow experiment.
        parent_run_id: The study's parent MLflow run.
        target_trials: The number of finished trials it aimed at (None: no limit in trials, a
            budget in compute ended it).
        configuration_rounds: Rounds trained by all its finished trials, in every session.
        finished: Trials finished in total.
        ran: Trials this invocation finished.
        counts: Trials by state.
        best: The best trial: its number, configuration and objective values (None: none).
        pareto: The Pareto set of the trade-off.
        tradeoff: The measured trade-off (None: none could be measured).
        artifacts: The trade-off report's files (plots, JSON, CSV) by name.
        interrupted: Trials a previous driver left running, marked interrupted and re-run.
        timings: Seconds spent starting, tuning, finalizing and in total.
        stop_reasons: Stopped trials by reason (``worse``, ``rung``, ``asha`` …).
        first_error: ``trial N: <error>`` of the first failed trial, if any.
        failure: Why there is no best configuration (None: there is one); a study with a
            failure ends failed.
        packing: How this invocation packed configurations into trial processes
            (:mod:`.packing.plan`; None: it ran none).
    """

    name: str
    workdir: str
    storage_url: str
    tracking_uri: str  # without credentials (``fedtune tune --json`` prints it)
    experiment_id: str
    parent_run_id: str
    target_trials: int | None
    configuration_rounds: int
    finished: int
    ran: int
    counts: dict[str, int]
    best: dict[str, Any] | None
    pareto: list[dict[str, Any]]
    tradeoff: dict[str, Any] | None
    artifacts: dict[str, str]
    interrupted: list[int] = field(default_factory=list)
    timings: dict[str, float] = field(default_factory=dict)
    #: stopped trials by reason (``optuna.search.stop_reasons``: ``worse``, ``rung``, ``asha`` …)
    stop_reasons: dict[str, int] = field(default_factory=dict)
    #: ``trial N: <error>`` of the first failed trial (``failures.first_error``), if any
    first_error: str | None = None
    #: why there is no best configuration (``failures.no_best_reason``); None when there is one.
    #: The one rule: a study with a failure ends failed (CLI exit 1, service state ``failed``)
    failure: str | None = None
    packing: str | None = None

    @property
    def all_failed(self) -> bool:
        """Trials finished and every one of them failed (the study did not succeed)."""
        return all_failed(self.counts)

    @property
    def commands(self) -> dict[str, str]:
        """Commands that open the study's records.

        Returns:
            The MLflow UI command and page, and the Optuna dashboard command.
        """
        from ..mlflow.client import executable, ui_command
        from ..mlflow.urls import ui_url

        return {
            "mlflow_ui": ui_command(self.tracking_uri),
            "mlflow_page": ui_url(self.tracking_uri, self.experiment_id),
            "optuna_dashboard": f"{executable('optuna-dashboard')} {self.storage_url}",
        }

    def to_dict(self) -> dict[str, Any]:
        """Give the result as JSON-ready data.

        Returns:
            Its fields and :attr:`commands`; ±∞ and NaN (a diverged value, a never-reached
            target) become None.
        """
        return finite_or_none({**self.__dict__, "commands": self.commands})
