"""The study's trade-off, computed once with the study's settings (one function for everyone).

:func:`tradeoff_of` analyses a study's curves with the settings its spec document gives —
``objective.last_rounds``, ``train.rounds`` (a trial that ended earlier was stopped),
``tradeoff.targets`` / ``tradeoff.pareto_target`` (default with several objectives:
``objective.target_loss``) — and :func:`tradeoff_text` is the exact JSON text of
``tradeoff.json``. The study driver writes that file and logs it to MLflow
(``fedtune.tuning.driver.study``); the service returns MLflow's file byte for byte once the study has
ended, and while it runs the same function on the trials finished so far, marked provisional
(Charles & Konečný 2021 (arXiv:2103.05032) §4 for the trade-off itself).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..keys import SMOOTH_WINDOW
from .tradeoff import TradeOff, TrialCurve, analyze_tradeoff

if TYPE_CHECKING:
    from ..spec import StoredSpec, StudySpec

__all__ = ["PROVISIONAL_NOTE", "StudyReport", "study_report", "tradeoff_of"]

PROVISIONAL_NOTE = (
    "computed from the trials finished so far; once the study has ended this is MLflow's "
    "tradeoff/tradeoff.json of the study's parent run"
)


def tradeoff_of(
    spec: StudySpec | StoredSpec, curves: Sequence[TrialCurve], provisional: bool = False
) -> TradeOff:
    """The trade-off of ``curves`` with the settings of the study ``spec`` (the driver's
    :class:`~fedtune.tuning.spec.StudySpec`, or the service's typed stored copy)."""
    objective, given = spec.objective, spec.tradeoff
    target = given.pareto_target
    if target is None and objective.is_multi:
        target = objective.target_loss
    rounds = spec.train.rounds
    t = analyze_tradeoff(
        curves,
        targets=given.targets,
        pareto_target=target,
        last_rounds=objective.last_rounds,
        smooth_window=SMOOTH_WINDOW,
        rounds_total=int(rounds) if rounds else None,
        metric="client_loss",
    )
    if provisional:
        from dataclasses import replace

        t = replace(t, notes={**t.notes, "provisional": PROVISIONAL_NOTE})
    return t


@dataclass
class StudyReport:
    """A finished study's trade-off: its files, Pareto rows and lower envelope E(R)."""

    tradeoff: dict[str, Any] | None = None  # tradeoff.json's content (its listed trials)
    pareto: list[dict[str, Any]] = field(default_factory=list)
    envelope: list[tuple[int, float]] = field(default_factory=list)
    files: dict[str, Path] = field(default_factory=dict)
    directory: Path | None = None
    analysis: TradeOff | None = None  # every trial's summary


def study_report(spec: StudySpec, curves: list, directory: Path) -> StudyReport:
    """Analyse a finished study's trials and write its trade-off files.

    Args:
        spec: The study's spec (its objective's last rounds, its rounds, its targets).
        curves: The finished trials' curves.
        directory: Where the files go (``tradeoff/``).

    Returns:
        The report: ``tradeoff.json``'s content, Pareto rows, E(R), the files, every trial's
        summary (``analysis``); empty without curves.
    """
    if not curves:
        return StudyReport()
    from .plots import write_artifacts
    from .theory_link import theory_report

    t = tradeoff_of(spec, curves)
    files = write_artifacts(t, curves, directory, color_by=next(iter(curves[0].params), None))
    k = t.targets.index(t.pareto_target) if t.pareto_target is not None else 0
    pareto = [
        {
            "number": s.trial_id,
            "rounds_to_target": s.rounds_to_target[k],
            "final_loss": s.final_loss,
            "params": dict(s.params),
        }
        for s in map(t.summary_of, t.pareto)
    ]
    envelope = [(p.round, p.loss) for p in t.envelope if math.isfinite(p.loss)]
    named = set(t.shown())  # a large study: its best trials, Pareto set and envelope
    files.update(theory_report(spec, [c for c in curves if c.trial_id in named], directory))
    return StudyReport(t.to_dict(), pareto, envelope, files, directory, t)
