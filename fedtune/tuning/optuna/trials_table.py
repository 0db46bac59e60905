"""The table of a study's trials that MLflow shows (``trials_table.json`` of the parent run).

One row per finished trial: number, rank (1 = best objective), outcome, parameters, objective,
rounds reached, rounds to the Pareto target, flag, on the Pareto set, decays. A study of more
than ``top`` trials lists its ``top`` best objectives, its Pareto set and its best trial, so the
table stays bounded at any number of trials.
"""

from __future__ import annotations

import math
from typing import Any

from ..analysis.tradeoff import TOP_TRIALS, TradeOff
from .store import StudyStore, outcome_of

__all__ = ["trials_table"]


def trials_table(
    store: StudyStore,
    analysis: TradeOff | None,
    space: Any,
    minimize: bool = True,
    best: int | None = None,
    top: int = TOP_TRIALS,
) -> tuple[dict[str, list], str]:
    """The MLflow table ``trials_table.json`` and a line saying what it lists: one row per
    finished trial — number, rank (1 = best objective), outcome, params, objective, rounds
    reached, rounds to the Pareto target, flag, on the Pareto set, decays — for every trial of
    a study of at most ``top``; beyond, the ``top`` best objectives, the Pareto set and the
    best trial ``best`` (bounded at any number of trials)."""
    from fedtune.search_spaces import resolve_values

    summaries = {s.trial_id: s for s in analysis.trials} if analysis is not None else {}
    pareto = set(analysis.pareto) if analysis is not None else set()
    k = None
    if analysis is not None and analysis.pareto_target is not None:
        k = analysis.targets.index(analysis.pareto_target)
    trials = [t for t in store.trials() if t.state.is_finished()]

    def objective(t: Any) -> float | None:
        value = t.values[0] if t.values else None
        return value if value is not None and math.isfinite(value) else None

    valued = [t for t in trials if objective(t) is not None]
    ranked = sorted(valued, key=lambda t: (objective(t) * (1 if minimize else -1), t.number))
    rank = {t.number: i for i, t in enumerate(ranked, 1)}
    listed = trials
    note = f"all {len(trials)} finished trials"
    if len(trials) > top:
        keep = {t.number for t in ranked[:top]} | pareto | ({best} if best is not None else set())
        listed = [t for t in trials if t.number in keep]
        note = (
            f"{len(listed)} of {len(trials)} finished trials: the {top} best objectives, "
            "the Pareto set and the best trial"
        )
    keys = sorted({p for t in listed for p in t.params})
    cols: dict[str, list] = {
        c: []
        for c in (
            "number",
            "rank",
            "outcome",
            "objective",
            "rounds",
            "rounds_to_target",
            "flag",
            "on_pareto",
            "decays",
        )
    }
    cols.update({f"param.{p}": [] for p in keys})
    for t in sorted(listed, key=lambda t: t.number):
        summary = summaries.get(t.number)
        rtt = summary.rounds_to_target[k] if summary is not None and k is not None else None
        cols["number"].append(t.number)
        cols["rank"].append(rank.get(t.number))
        cols["outcome"].append(outcome_of(t))
        cols["objective"].append(objective(t))
        cols["rounds"].append(t.user_attrs.get("rounds"))
        cols["rounds_to_target"].append(rtt if rtt is not None and math.isfinite(rtt) else None)
        cols["flag"].append(summary.flag if summary is not None else "")
        cols["on_pareto"].append(t.number in pareto)
        cols["decays"].append(t.user_attrs.get("decays"))
        params = resolve_values(space, t.params) if t.params else {}
        for p in keys:
            value = params.get(p)
            cols[f"param.{p}"].append(value if value is None else str(value))
    return cols, note
