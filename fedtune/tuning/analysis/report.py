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

from collections.abc import Mapping, Sequence
from typing import Any

from ..keys import SMOOTH_WINDOW
from .tradeoff import TradeOff, TrialCurve, analyze_tradeoff

__all__ = ["PROVISIONAL_NOTE", "tradeoff_of"]

PROVISIONAL_NOTE = (
    "computed from the trials finished so far; once the study has ended this is MLflow's "
    "tradeoff/tradeoff.json of the study's parent run"
)


def tradeoff_of(
    document: Mapping[str, Any], curves: Sequence[TrialCurve], provisional: bool = False
) -> TradeOff:
    """The trade-off of ``curves`` with the settings of the spec ``document`` (a
    ``StudySpec.to_dict()`` or the service's stored spec)."""
    objective = document.get("objective") or {}
    given = document.get("tradeoff") or {}
    target = given.get("pareto_target")
    if target is None and objective.get("metrics"):
        target = objective.get("target_loss")
    rounds = (document.get("train") or {}).get("rounds")
    t = analyze_tradeoff(
        curves,
        targets=given.get("targets"),
        pareto_target=target,
        last_rounds=int(objective.get("last_rounds") or 10),
        smooth_window=SMOOTH_WINDOW,
        rounds_total=int(rounds) if rounds else None,
        metric="client_loss",
    )
    if provisional:
        from dataclasses import replace

        t = replace(t, notes={**t.notes, "provisional": PROVISIONAL_NOTE})
    return t
