"""The study store: one interface to a study's record in its Optuna RDB storage.

Everything that reads or writes a study's trials goes through :class:`StudyStore` — the study
driver (:mod:`.study`, :mod:`fedtune.tuning.optuna.search`), the MLflow adapter's callers and the service
(``fedtune.service.optuna_sync``) — so attribute names (``fedtune:curve``, ``mlflow_run_id``,
``outcome``, …) live here only, and only Optuna's *public* storage API is used (trial ids
come from ``get_trial_id_from_study_id_trial_number``, never from private attributes).

Per trial: user attributes ``outcome``, ``rounds``, ``reason``, ``mlflow_run_id``,
``decays``/``decay_rounds`` and the system attribute ``fedtune:curve`` (ℓ_t per round). Per
study: ``mlflow_parent_run_id`` and ``mlflow_parent_experiment`` (that run and its experiment's
id, as a pair: what the service's driver reports without importing MLflow) and the system
attribute ``fedtune:finalized`` (the digest of what the study's last end recorded). The
trade-off is computed once from :meth:`StudyStore.curves` by
``fedtune.tuning.analysis.report.study_report`` and kept, byte for byte, as MLflow's
``tradeoff/tradeoff.json`` (the service returns that file).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from optuna.storages import RDBStorage
from optuna.trial import FrozenTrial, TrialState

from fedtune.outcomes import TrialOutcome, from_optuna_state, optuna_state

from ..analysis.tradeoff import TrialCurve
from ..common.sqlite_commits import fast_commits_for

__all__ = ["CURVE_ATTR", "PARENT_ATTR", "RUN_ATTR", "StudyStore", "TrialRecord", "storage_url"]

CURVE_ATTR = "fedtune:curve"
RUN_ATTR = "mlflow_run_id"
PARENT_ATTR = "mlflow_parent_run_id"
#: ``[parent run id, experiment id]``: the experiment of the parent run named with it
PARENT_EXPERIMENT_ATTR = "mlflow_parent_experiment"
OUTCOME_ATTR = "outcome"
#: study system attribute: the digest of what the study's last end recorded in MLflow (the
#: driver's ``ending.finalize``); a re-run that would record the same logs nothing
FINALIZED_ATTR = "fedtune:finalized"


def storage_url(workdir: str | Path) -> str:
    return f"sqlite:///{Path(workdir).resolve() / 'optuna.db'}"


def make_storage(url: str) -> RDBStorage:
    """RDB storage; SQLite waits up to 30 s for a lock (a dashboard may be reading).

    A local SQLite file commits in WAL mode with ``synchronous=NORMAL`` (:mod:`.sqlite_commits`).
    """
    fast_commits_for(url)
    kwargs = {"connect_args": {"timeout": 30}} if url.startswith("sqlite") else {}
    return RDBStorage(url, engine_kwargs=kwargs)


def outcome_of(t: FrozenTrial) -> str:
    """completed, diverged, stopped, failed or interrupted."""
    return t.user_attrs.get(OUTCOME_ATTR) or from_optuna_state(t.state.name)


@dataclass(frozen=True)
class TrialRecord:
    """What the service needs of one trial (plain values)."""

    number: int
    state: str  # Optuna's state name: COMPLETE, PRUNED, FAIL, RUNNING, WAITING
    params: dict[str, Any]
    value: float | None
    outcome: str | None
    run_id: str | None
    curve: dict[str, list]


class StudyStore:
    """One study (by name) in one Optuna RDB storage."""

    def __init__(self, storage: RDBStorage, name: str) -> None:
        self.storage, self.name = storage, name
        self._study_id: int | None = None

    @classmethod
    def at(cls, workdir: str | Path, name: str) -> StudyStore:
        return cls(make_storage(storage_url(workdir)), name)

    @classmethod
    def existing(cls, workdir: str | Path, name: str) -> StudyStore | None:
        """The store of an existing study under ``workdir`` (read side), else None."""
        if not (Path(workdir) / "optuna.db").is_file():
            return None
        store = cls.at(workdir, name)
        try:
            store.study_id  # noqa: B018 — raises KeyError when the study is not there
        except KeyError:
            return None
        return store

    @property
    def study_id(self) -> int:
        if self._study_id is None:
            self._study_id = self.storage.get_study_id_from_name(self.name)
        return self._study_id

    def trial_id(self, number: int) -> int:
        return self.storage.get_trial_id_from_study_id_trial_number(self.study_id, number)

    # -- writing ------------------------------------------------------------------------
    def set_trial_attrs(self, number: int, **attrs: Any) -> None:
        tid = self.trial_id(number)
        for key, value in attrs.items():
            self.storage.set_trial_user_attr(tid, key, value)

    def set_curve(self, number: int, rounds: list[int], losses: list[float]) -> None:
        curve = {"rounds": rounds, "loss": [v if math.isfinite(v) else None for v in losses]}
        self.storage.set_trial_system_attr(self.trial_id(number), CURVE_ATTR, curve)

    def set_run_id(self, number: int, run_id: str) -> None:
        self.set_trial_attrs(number, **{RUN_ATTR: run_id})

    def mark_interrupted(self, number: int) -> None:
        """A trial left RUNNING by a dead driver: FAIL with outcome ``interrupted``."""
        self._fail_with(number, TrialOutcome.INTERRUPTED)

    def mark_cancelled(self, number: int) -> None:
        """A queued (WAITING) trial of a cancelled study: FAIL with outcome ``cancelled``."""
        self._fail_with(number, TrialOutcome.CANCELLED)

    def _fail_with(self, number: int, outcome: str) -> None:
        tid = self.trial_id(number)
        self.storage.set_trial_user_attr(tid, OUTCOME_ATTR, outcome)
        self.storage.set_trial_state_values(tid, TrialState[optuna_state(outcome)])

    def set_finalized(self, key: str) -> None:
        """Record what the study's last end wrote to MLflow (a digest: :attr:`FINALIZED_ATTR`).

        Args:
            key: The digest.
        """
        self.storage.set_study_system_attr(self.study_id, FINALIZED_ATTR, key)

    def finalized(self) -> str | None:
        """The digest :meth:`set_finalized` recorded last (None: the study never ended)."""
        return self.storage.get_study_system_attrs(self.study_id).get(FINALIZED_ATTR)

    def set_parent_run_id(self, run_id: str, experiment_id: str | None = None) -> None:
        """Record the study's MLflow parent run (and, when given, its experiment's id)."""
        if experiment_id is not None:  # first: a reader that sees the run finds its experiment
            pair = [run_id, str(experiment_id)]
            self.storage.set_study_user_attr(self.study_id, PARENT_EXPERIMENT_ATTR, pair)
        self.storage.set_study_user_attr(self.study_id, PARENT_ATTR, run_id)

    # -- reading ------------------------------------------------------------------------
    def trials(self, states: tuple[TrialState, ...] | None = None) -> list[FrozenTrial]:
        return self.storage.get_all_trials(self.study_id, deepcopy=False, states=states)

    def parent_run_id(self) -> str | None:
        return self.storage.get_study_user_attrs(self.study_id).get(PARENT_ATTR)

    def parent_run(self) -> tuple[str | None, str | None]:
        """The parent run's id and its experiment's id (None: not recorded with that run, as
        by a driver of an older version)."""
        attrs = self.storage.get_study_user_attrs(self.study_id)
        run_id, pair = attrs.get(PARENT_ATTR), attrs.get(PARENT_EXPERIMENT_ATTR)
        paired = isinstance(pair, list) and len(pair) == 2 and run_id and pair[0] == run_id
        return run_id, (str(pair[1]) if paired else None)

    def run_id_of(self, number: int) -> str | None:
        return self.storage.get_trial_user_attrs(self.trial_id(number)).get(RUN_ATTR)

    def records(self) -> Iterator[TrialRecord]:
        for t in self.trials():
            value = t.values[0] if t.values else None
            yield TrialRecord(
                t.number,
                t.state.name,
                dict(t.params),
                value,
                t.user_attrs.get(OUTCOME_ATTR),
                t.user_attrs.get(RUN_ATTR),
                t.system_attrs.get(CURVE_ATTR) or {},
            )

    def curves(self, resolve: Any = None) -> list[TrialCurve]:
        """ℓ_t curves of the completed, diverged and stopped trials (for the trade-off);
        ``resolve(params)`` maps stored params to the space's resolved values."""
        out = []
        for t in self.trials((TrialState.COMPLETE, TrialState.PRUNED)):
            curve = t.system_attrs.get(CURVE_ATTR)
            if curve is None:
                continue
            losses = [math.inf if v is None else v for v in curve["loss"]]
            params = resolve(t.params) if resolve is not None else dict(t.params)
            out.append(TrialCurve(t.number, params, curve["rounds"], losses, outcome_of(t)))
        return out
