"""Optuna side of a study: RDB storage, samplers, directions, budget, resume, read-back.

**Storage is the source of truth.** The study lives in an Optuna RDB storage (by default
``sqlite:///<workdir>/optuna.db``), created with ``load_if_exists`` so ``optuna.load_study`` and
``optuna-dashboard`` can open it at any time and a finished trial survives any crash of the
driver. Only the driver process writes to it (workers never touch Optuna).

**What the sampler is told** about each trial: :class:`~.searcher.FedtuneSearch`, the Ray Tune
searcher that asks and tells this storage's study.

User attributes: ``outcome`` (completed, diverged, stopped, failed, interrupted, cancelled: a
queued trial dropped when the service cancelled the study, see ``failures.py``), ``rounds``,
``reason``, ``mlflow_run_id``, ``decays``/``decay_rounds``; system attribute ``fedtune:curve``
holds ℓ_t per round — all written and read through :class:`~.store.StudyStore`.

**Resume** (:func:`reconcile`): a driver killed with ``kill -9`` leaves its in-flight trials
``RUNNING`` forever. At start-up (one driver per study: ``study.py`` holds a lock) every such
trial is marked ``FAIL`` with ``outcome = interrupted`` and its parameters are re-enqueued
(``user_attrs.requeue_of``), so the next ``ask`` re-runs exactly those points; interrupted trials
do not count towards the budget (:func:`count_finished`). Optuna's heartbeat +
``RetryFailedTrialCallback`` does the same inside ``study.optimize``, which Ray's ask/tell loop
does not use. The sampler's seed is offset by the number of trials already in the storage, so a
resumed TPE/random sampler does not replay its first draws.
"""

from __future__ import annotations

import importlib.util
import math
import warnings
from dataclasses import dataclass
from typing import Any

import optuna
from optuna.storages import RDBStorage
from optuna.trial import TrialState

from fedtune.errors import ConfigError
from fedtune.outcomes import TrialOutcome, mlflow_status
from fedtune.redact import scrub
from fedtune.search_spaces import SearchSpace, enqueue, grid_points, resolve_values

from ..analysis.tradeoff import TrialCurve
from ..spec import DEFAULT_TRIALS, Mode, MultiMetric, SamplerName, StudySpec
from ..trials.stop_rules import Observed
from ..trials.sweep import SWEEP_ATTR
from .budget import RoundBudget, rounds_spent
from .store import CURVE_ATTR, StudyStore, make_storage, outcome_of, storage_url

__all__ = [
    "CURVE_ATTR",
    "Reconciled",
    "best_trial",
    "count_finished",
    "directions",
    "enqueue_grid",
    "make_sampler",
    "make_storage",
    "open_study",
    "planned_trials",
    "reconcile",
    "round_budget",
    "rounds_trained",
    "run_statuses",
    "storage_url",
    "study_counts",
    "study_curves",
    "sweep_history",
    "target_trials",
]

_ATTR_FINGERPRINT = "fedtune.space_fingerprint"
_ATTR_DIRECTIONS = "fedtune.directions"


def directions(spec: StudySpec) -> list[str]:
    return ["maximize" if m == Mode.MAX else "minimize" for m in spec.objective.directions]


def _metric_names(spec: StudySpec) -> list[str]:
    obj = spec.objective
    return [str(m) for m in obj.metrics] if obj.metrics else [str(obj.single_metric)]


def open_study(spec: StudySpec, storage: RDBStorage, space: SearchSpace) -> optuna.Study:
    """Create or load the study; a loaded one must have the same space and directions."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        study = optuna.create_study(
            storage=storage,
            study_name=spec.name,
            directions=directions(spec),
            load_if_exists=True,
        )
    attrs = study.user_attrs
    wanted = {_ATTR_FINGERPRINT: space.fingerprint(), _ATTR_DIRECTIONS: directions(spec)}
    if not attrs:
        for key, value in wanted.items():
            study.set_user_attr(key, value)
        study.set_user_attr("fedtune.spec", scrub(spec.to_dict()))  # no URI credentials
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            study.set_metric_names(_metric_names(spec))
        return study
    stored = [d.name.lower() for d in study.directions]
    if stored != directions(spec) or attrs.get(_ATTR_DIRECTIONS) != directions(spec):
        raise ConfigError(
            "objective",
            f"study {spec.name!r} exists in this storage with directions {stored}; "
            "use another study name or workdir",
        )
    if attrs.get(_ATTR_FINGERPRINT) != space.fingerprint():
        raise ConfigError(
            "search",
            f"study {spec.name!r} exists with a different search space (fingerprint "
            f"{attrs.get(_ATTR_FINGERPRINT)} vs {space.fingerprint()}); "
            "use another study name or workdir",
        )
    return study


def target_trials(spec: StudySpec, space: SearchSpace, trials: int | None) -> int | None:
    """Total trials wanted: ``--trials`` or the budget (None: no limit in trials, a budget in
    compute ends the study); a grid has at most its point count."""
    total = trials if trials is not None else spec.budget.trials
    if total is not None and total < 1:
        raise ConfigError("budget.trials", f"must be >= 1, got {total}")
    if spec.sampler_name == SamplerName.GRID:
        points = len(grid_points(space))
        total = points if total is None else min(total, points)
    return total


def round_budget(spec: StudySpec, study: optuna.Study) -> RoundBudget | None:
    """The study's ``budget.configuration_rounds`` as a :class:`~.budget.RoundBudget`, less
    what its ended trials trained (None: no such budget)."""
    limit = spec.budget.configuration_rounds
    if limit is None:
        return None
    return RoundBudget(limit, spec.train.rounds, rounds_trained(study))


def rounds_trained(study: optuna.Study) -> int:
    """Configuration-rounds the study's ended trials trained (:func:`~.budget.rounds_spent`)."""
    return rounds_spent(study.get_trials(deepcopy=False, states=_FINISHED))


def planned_trials(spec: StudySpec, target: int | None) -> int:
    """The trials a sampler plans for (its random start-up, NSGA-II's population).

    Args:
        spec: The study.
        target: :func:`target_trials`.

    Returns:
        ``target``; without one, the configurations ``budget.configuration_rounds`` holds at
        ``train.rounds`` each (more run when some stop early), else ``DEFAULT_TRIALS``.
    """
    if target is not None:
        return target
    rounds = spec.budget.configuration_rounds
    if rounds is not None:
        return max(1, rounds // spec.train.rounds)
    return DEFAULT_TRIALS


_NEVER_ENDED = (TrialOutcome.INTERRUPTED, TrialOutcome.CANCELLED)  # re-run, or dropped by a cancel


def _interrupted(t: optuna.trial.FrozenTrial) -> bool:
    """Stopped before its end: interrupted (re-run) or dropped from the queue by a cancel."""
    return t.user_attrs.get("outcome") in _NEVER_ENDED


def count_finished(study: optuna.Study) -> int:
    """Trials that count towards the budget: finished, except interrupted ones (re-run)."""
    return sum(
        1 for t in study.get_trials(deepcopy=False) if t.state.is_finished() and not _interrupted(t)
    )


@dataclass(frozen=True)
class Reconciled:
    finished: int
    interrupted: tuple[int, ...]  # trial numbers marked FAIL (interrupted) in this call
    requeued: int  # WAITING trials that the next asks will run


def reconcile(study: optuna.Study, store: StudyStore) -> Reconciled:
    """Mark orphaned RUNNING trials FAIL (interrupted) and re-enqueue their parameters."""
    trials = study.get_trials(deepcopy=False)
    queued_for = {t.user_attrs.get("requeue_of") for t in trials if t.state == TrialState.WAITING}
    orphans = [t for t in trials if t.state == TrialState.RUNNING]
    for t in orphans:
        if t.number not in queued_for and t.params:
            study.enqueue_trial(dict(t.params), user_attrs={"requeue_of": t.number})
        store.mark_interrupted(t.number)
    waiting = sum(1 for t in study.get_trials(deepcopy=False) if t.state == TrialState.WAITING)
    return Reconciled(count_finished(study), tuple(t.number for t in orphans), waiting)


def run_statuses(study: optuna.Study) -> dict[str, str]:
    """MLflow status each finished trial's child run must have (interrupted ones: KILLED)."""
    out = {}
    for t in study.get_trials(deepcopy=False):
        run_id = t.user_attrs.get("mlflow_run_id")
        if run_id and t.state.is_finished() and not _interrupted(t):
            out[run_id] = mlflow_status(outcome_of(t))
    return out


def enqueue_grid(study: optuna.Study, space: SearchSpace) -> None:
    """Queue every grid point once (only into an empty study: a resume keeps the queue)."""
    if study.get_trials(deepcopy=False):
        return
    for point in grid_points(space):
        enqueue(study, space, point)


def make_sampler(spec: StudySpec, target: int, offset: int = 0) -> optuna.samplers.BaseSampler:
    """The spec's sampler, seeded with ``sampler.seed + offset`` (offset = trials so far).

    TPE uses ``n_startup_trials = clamp(target // 3, 3, 10)`` random trials (Optuna's default of
    10 would make a 12-trial study pure random search), multivariate + group (conditional
    spaces) and the constant liar (concurrent trials). NSGA-II's population is
    ``clamp(target // 2, 4, 50)``. ``grid`` enumerates the enqueued grid points; its fallback
    sampler is random.
    """
    name = spec.sampler_name
    seed = None if spec.sampler.seed is None else spec.sampler.seed + offset
    samplers = optuna.samplers
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ExperimentalWarning for multivariate/group
        if name == SamplerName.TPE:
            startup = max(3, min(10, target // 3))
            return samplers.TPESampler(
                seed=seed,
                n_startup_trials=startup,
                multivariate=True,
                group=True,
                constant_liar=True,
            )
        if name in (SamplerName.RANDOM, SamplerName.GRID):
            return samplers.RandomSampler(seed=seed)
        if name == SamplerName.NSGA2:
            return samplers.NSGAIISampler(seed=seed, population_size=max(4, min(50, target // 2)))
        if name == SamplerName.GP:
            return samplers.GPSampler(seed=seed, n_startup_trials=max(3, min(10, target // 3)))
        if importlib.util.find_spec("cmaes") is None:
            raise ConfigError("sampler.name", "cmaes needs the `cmaes` package (pip install cmaes)")
        return samplers.CmaEsSampler(seed=seed, n_startup_trials=max(3, min(10, target // 3)))


def sweep_history(study: optuna.Study) -> dict[int, tuple[str | None, Observed | None]]:
    """Tags and outcomes of an earlier invocation's proposed trials (for ``Stopper.resume``)."""
    out: dict[int, tuple[str | None, Observed | None]] = {}
    for t in study.get_trials(deepcopy=False):
        tag = t.user_attrs.get(SWEEP_ATTR)
        if tag is None or not t.state.is_finished() or _interrupted(t):
            continue
        outcome = outcome_of(t)
        value = t.values[0] if outcome == TrialOutcome.COMPLETED and t.values else None
        out[t.number] = (tag, Observed(tag, outcome, value, t.user_attrs.get("stop_rule")))
    return out


# -- reading a study back (the storage alone; used at the end and for the progress line) ----
_FINISHED = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def study_counts(study: optuna.Study) -> dict[str, int]:
    """Finished trials by outcome; ``trials`` = those counting towards the budget."""
    shown = [o.value for o in TrialOutcome if o != TrialOutcome.CANCELLED]  # cancelled: if any
    counts = dict.fromkeys(("trials", *shown), 0)
    for t in study.get_trials(deepcopy=False, states=_FINISHED):
        outcome = outcome_of(t)
        counts[outcome] = counts.get(outcome, 0) + 1
        counts["trials"] += outcome not in _NEVER_ENDED
    return counts


def stop_reasons(study: optuna.Study, scheduler: str | None) -> dict[str, int]:
    """Stopped trials by why they were stopped: the stop rule's reason (Optuna user attribute
    ``stop_rule``: ``worse``, ``plateau``, ``rung``, ``median``), else (trials that Ray Tune's
    own schedulers stopped, before every stop had a reason) the study's ``scheduler``."""
    reasons: dict[str, int] = {}
    for t in study.get_trials(deepcopy=False, states=_FINISHED):
        if outcome_of(t) == TrialOutcome.STOPPED:
            why = str(t.user_attrs.get("stop_rule") or scheduler or "scheduler")
            reasons[why] = reasons.get(why, 0) + 1
    return dict(sorted(reasons.items(), key=lambda kv: (-kv[1], kv[0])))


def study_curves(store: StudyStore, space: SearchSpace) -> list[TrialCurve]:
    """ℓ_t curves of the completed, diverged and stopped trials (for the trade-off)."""
    return store.curves(lambda params: resolve_values(space, params))


def best_trial(spec: StudySpec, study: optuna.Study, space: SearchSpace) -> dict[str, Any] | None:
    """The best completed trial: by the objective, or (several objectives) the lowest final
    loss on Optuna's Pareto front, ties broken by the other objectives."""
    obj = spec.objective
    names = [str(m) for m in obj.metrics] if obj.metrics else [str(obj.single_metric)]
    done = [
        t
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        if outcome_of(t) == TrialOutcome.COMPLETED and math.isfinite(t.values[0])
    ]
    if not done:
        return None
    if obj.is_multi:
        first = names.index(str(MultiMetric.FINAL_LOSS))
        best = min(done, key=lambda t: (t.values[first], *t.values))
        value = best.values[first]
    else:
        sign = -1.0 if obj.directions[0] == Mode.MAX else 1.0
        best = min(done, key=lambda t: (sign * t.values[0], t.number))
        value = best.values[0]
    params = resolve_values(space, best.params)
    return {
        "number": best.number,
        "value": value,
        "values": dict(zip(names, best.values, strict=True)),
        "params": params,
        "config": spec.trial(params).to_dict(),
    }
