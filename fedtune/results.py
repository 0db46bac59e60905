"""The results fedtune computes, typed once for the engine, the files, the API and the SDK.

A :class:`TradeOff` (:func:`fedtune.tuning.analysis.tradeoff.analyze_tradeoff`) is what a study's
``tradeoff/tradeoff.json`` holds and what ``GET /v1/studies/{id}/tradeoff`` answers; a
:class:`Comparison` (:func:`fedtune.tuning.analysis.compare.compare`) is ``comparison.json`` and the
answer of ``/v1/compare``. The engine builds them, the service returns them and the SDK reads
them back with :meth:`~fedtune.wire_base.WireModel.from_json`: one class each, so the three
never drift. In memory a loss that was never reached is ``inf``; on the wire it is ``null``,
read back as ``inf`` where a number is compared (:func:`loss`).

Pure Python, like :mod:`fedtune.wire_models`: the light install imports it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from .wire_base import WireModel, described, finite_or_none
from .wire_models import RecordedRun

__all__ = [
    "BUDGET_ROUNDS",
    "BUDGET_TRIALS",
    "BUDGET_WHOLE",
    "TOP_TRIALS",
    "Comparison",
    "EnvelopePoint",
    "MatchedRow",
    "RegimeChange",
    "StudyLine",
    "TradeOff",
    "TrialSummary",
    "loss",
]

#: trials named in the files and figures of a large study (:meth:`TradeOff.shown`): the
#: ``TOP_TRIALS`` lowest final losses plus the Pareto set and the envelope's trials
TOP_TRIALS = 50


def loss(value: float | None) -> float:
    """A loss as a number: ``null`` (never reached, diverged) is ``inf``."""
    return math.inf if value is None else float(value)


def _with_params(
    rows: Iterable[tuple[dict[str, Any], Mapping[str, Any]]],
) -> list[dict[str, Any]]:
    """Table rows with a ``param.<name>`` column for every parameter any row has.

    Args:
        rows: Each row's columns and its configuration's parameters.

    Returns:
        The rows, each with every parameter column (blank where it has none).
    """
    rows = list(rows)
    keys = sorted({k for _, params in rows for k in params})
    return [{**row, **{f"param.{k}": params.get(k, "") for k in keys}} for row, params in rows]


class _Strict(WireModel):
    """An answer whose ∞ and NaN are written ``null`` (strict JSON)."""

    __slots__ = ()

    def to_json(self) -> dict[str, Any]:
        """This result as strict JSON (∞ and NaN as null), :attr:`extra` included."""
        return finite_or_none(super().to_json())


# ---------------------------------------------------------------- the trade-off of a study


@dataclass(frozen=True, kw_only=True)
class TrialSummary(_Strict):
    """One trial of a trade-off: its final and best loss and rounds to each target."""

    trial_id: Any
    params: dict[str, Any]
    outcome: str = described("how it ended: completed, diverged or stopped")
    last_round: int
    final_loss: float | None = described(
        "mean loss over the objective's last rounds (null: diverged or not finite)"
    )
    best_loss: float | None = described("lowest point of its smoothed curve")
    rounds_to_target: list[float | None] = field(
        metadata={"description": "first round at or below each target (null: never)"}
    )
    flag: str = described("'' (compared fully), diverged, blown_up or stopped", "")

    @property
    def comparable(self) -> bool:
        """Ran to the end without diverging or blowing up: on the final-loss front if best."""
        return not self.flag


@dataclass(frozen=True, kw_only=True)
class EnvelopePoint(_Strict):
    """The lower envelope at one round: the best smoothed loss within it, and whose."""

    round: int
    loss: float | None
    trial_id: Any = None


@dataclass(frozen=True, kw_only=True)
class RegimeChange(_Strict):
    """A round where another trial takes the lower envelope."""

    round: int
    from_trial: str | int  # trial ids, as ``TrialSummary.trial_id``
    to_trial: str | int
    loss: float


@dataclass(frozen=True, kw_only=True)
class TradeOff(_Strict):
    """The measured convergence–accuracy trade-off of a study
    (:func:`fedtune.tuning.analysis.tradeoff.analyze_tradeoff`; ``tradeoff.json``, ∞ as null)."""

    metric: str = described("the record field the curves are", "client_loss")
    start_loss: float | None = described("ℓ_0: the median first recorded loss", None)
    targets: list[float]
    pareto_target: float | None
    last_rounds: int
    smooth_window: int
    trials: list[TrialSummary]
    trials_total: int | None = described("the study's trials; ``trials`` may list fewer", None)
    pareto: list[Any] = field(
        metadata={"description": "trial ids of the Pareto set, by increasing rounds to target"}
    )
    envelope: list[EnvelopePoint]
    regime_changes: list[RegimeChange]
    notes: dict[str, str]

    def summary_of(self, trial_id: Any) -> TrialSummary:
        """The summary of trial ``trial_id``."""
        return next(t for t in self.trials if t.trial_id == trial_id)

    def shown(self, top: int | None = TOP_TRIALS) -> tuple[Any, ...]:
        """The trials the study's files and figures list, in study order (bounded at any
        number of trials): every trial when there are at most ``top`` (or ``top`` is None),
        else the ``top`` lowest final losses, the Pareto set and the trials that hold the
        envelope. The others are counted (``trials_total``), not listed."""
        if top is None or len(self.trials) <= top:
            return tuple(t.trial_id for t in self.trials)
        finite = [t for t in self.trials if math.isfinite(loss(t.final_loss))]
        keep = {t.trial_id for t in sorted(finite, key=lambda t: loss(t.final_loss))[:top]}
        keep |= set(self.pareto) | {p.trial_id for p in self.envelope if p.trial_id is not None}
        return tuple(t.trial_id for t in self.trials if t.trial_id in keep)

    def best_final(self) -> TrialSummary | None:
        """The trial the papers' selection rule picks (lowest final loss), if any is finite."""
        finite = [t for t in self.trials if math.isfinite(loss(t.final_loss))]
        return min(finite, key=lambda t: loss(t.final_loss)) if finite else None

    def report(self, top: int | None = TOP_TRIALS) -> TradeOff:
        """This trade-off as its files and the API list it: :meth:`shown` ``(top)`` of the
        ``trials_total`` trials (every one with ``top`` None; a note says which when cut)."""
        keep = set(self.shown(top))
        listed = [t for t in self.trials if t.trial_id in keep]
        total = self.trials_total if self.trials_total is not None else len(self.trials)
        notes = dict(self.notes)
        if len(listed) < len(self.trials):
            notes["trials"] = (
                f"{len(listed)} of {len(self.trials)} trials listed: the {top} lowest final "
                "losses, the Pareto set and the envelope's trials (every trial: the study's "
                "Optuna storage and MLflow child runs)"
            )
        return replace(self, trials=listed, trials_total=total, notes=notes)

    def to_dict(self, top: int | None = TOP_TRIALS) -> dict[str, Any]:
        """The JSON of :meth:`report` ``(top)``: the content of ``tradeoff.json``."""
        return self.report(top).to_json()

    def to_csv_rows(self, top: int | None = TOP_TRIALS) -> list[dict[str, Any]]:
        """One row per listed trial (:meth:`shown`): id, outcome, rounds, final/best loss,
        on_pareto, R_τ, params (``inf`` kept, as CSV writes it)."""
        rows = []
        for t in self.report(top).trials:
            row: dict[str, Any] = {
                "trial_id": t.trial_id,
                "outcome": str(t.outcome),
                "last_round": t.last_round,
                "final_loss": t.final_loss,
                "best_loss": t.best_loss,
                "flag": t.flag,
                "on_pareto": t.trial_id in self.pareto,
            }
            for target, r in zip(self.targets, t.rounds_to_target, strict=True):
                row[f"rounds_to_{target:.4g}"] = r
            rows.append((row, t.params))
        return _with_params(rows)


# ---------------------------------------------------------------- comparisons of studies


BUDGET_TRIALS, BUDGET_ROUNDS, BUDGET_WHOLE = "equal trials", "equal total rounds", "whole study"


@dataclass(frozen=True, kw_only=True)
class StudyLine(_Strict):
    """One compared study, in brief."""

    key: str = described("unique within the comparison: the study's name (with #n when repeated)")
    label: str = described("how the user named it: a service study id or a local workdir")
    name: str
    algorithm: str
    task: str
    trials_total: int
    trials_listed: int = described("trials its trade-off lists (the best, Pareto and envelope's)")
    rounds_spent: int
    start_loss: float | None
    pareto_target: float | None
    run_id: str | None = None
    experiment_id: str | None = None
    tracking_uri: str | None = None


@dataclass(frozen=True, kw_only=True)
class MatchedRow(_Strict):
    """A study's best configuration within one budget."""

    budget: str = described("equal trials, equal total rounds or whole study")
    amount: int = described("trials (equal trials) or total rounds (the others)")
    key: str
    trial_id: Any
    final_loss: float | None
    params: dict[str, Any]
    trials_used: int
    rounds_used: int


def _points(value: list) -> list[tuple[int, float]]:
    """``[[round, loss|null], ...]`` → ``[(round, loss|∞), ...]``."""
    return [(int(r), loss(x)) for r, x in value]


@dataclass(frozen=True, kw_only=True)
class Comparison(_Strict):
    """Studies compared on one task: lower envelopes, budget curves, Pareto sets, predictions,
    matched budgets (``fedtune.tuning.analysis.compare.compare``; on the wire ∞ is null)."""

    studies: list[StudyLine]
    comparable: bool
    differences: list[str]
    forced: bool
    envelopes: dict[str, list[tuple[int, float | None]]] = field(
        metadata={
            "description": "per study: (rounds R, best smoothed loss of any trial within R rounds)"
        }
    )
    budget_curves: dict[str, list[tuple[int, float | None]]] = field(
        metadata={
            "description": "per study: (total rounds spent, lowest final loss of the trials "
            "ended by then)"
        }
    )
    pareto: dict[str, list[dict[str, Any]]]
    predictions: dict[str, list[dict[str, Any]]]
    matched: list[MatchedRow]
    notes: dict[str, str]
    mlflow: RecordedRun | None = field(
        default=None,
        metadata={"description": "the comparison's MLflow run (POST: recorded; GET: null)"},
    )

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Comparison:
        """Build a comparison from its JSON (null losses read back as ∞).

        Args:
            data: A ``comparison.json`` document or the service's answer.

        Returns:
            The comparison, unknown keys kept in :attr:`extra`.
        """
        data = dict(data)
        for key in ("envelopes", "budget_curves"):
            data[key] = {k: _points(v) for k, v in (data.get(key) or {}).items()}
        return super().from_json(data)

    def study_keys(self) -> list[str]:
        """The studies' keys, in the order given."""
        return [s.key for s in self.studies]

    def best_at(self, budget: str) -> dict[str, MatchedRow]:
        """The matched-budget rows of one budget, by study key.

        Args:
            budget: ``BUDGET_TRIALS``, ``BUDGET_ROUNDS`` or ``BUDGET_WHOLE``.

        Returns:
            Each study's row (a study with no finite final loss has none).
        """
        return {r.key: r for r in self.matched if r.budget == budget}

    def winner(self, budget: str = BUDGET_WHOLE) -> str | None:
        """The key of the study with the lowest final loss at ``budget`` (None: no finite one).

        Args:
            budget: One of the budgets of :attr:`matched`.

        Returns:
            The study's key, or None.
        """
        rows = [r for r in self.best_at(budget).values() if r.final_loss is not None]
        return min(rows, key=lambda r: r.final_loss).key if rows else None

    def table_rows(self) -> list[dict[str, Any]]:
        """The matched-budget table, one row per (budget, study): the CSV's rows."""
        return _with_params(
            (
                {
                    "budget": r.budget,
                    "amount": r.amount,
                    "study": r.key,
                    "trial": r.trial_id,
                    "final_loss": r.final_loss,
                    "trials_used": r.trials_used,
                    "rounds_used": r.rounds_used,
                },
                r.params,
            )
            for r in self.matched
        )
