"""The measured convergence–accuracy trade-off of a study (no MLflow, no Ray).

Large client learning rates γ (or many local steps K) converge fast to a worse point, small ones
slowly to a better point (Charles & Konečný 2021 (arXiv:2103.05032) §4 and App. F;
Charles & Konečný 2020 (arXiv:2007.00878) §7–8; docs/explanation/algorithms.md §8 prediction 8).
From the per-round training-loss curves ℓ_t of a study's trials this module computes, per trial and
for targets τ:

* smoothed curve  s_t = mean of the last ``smooth_window`` recorded ℓ (fewer at the start), so
  one lucky noisy round never counts as "reached";
* rounds to target  R_τ = first recorded round with s_t ≤ τ (∞ when never reached);
* final loss  = mean of ℓ over the last ``last_rounds`` recorded rounds — the papers' selection
  rule (Charles & Konečný 2020 §8.3) — ∞ for a diverged trial or a non-finite value;
* the starting loss ℓ_0 = median of the trials' first recorded ℓ (every trial starts from the
  same model on the same clients), and a **flag** per trial: ``diverged`` (the engine said so),
  ``blown_up`` (final loss ≥ ``blowup`` × ℓ_0: finite but far above the start), ``stopped``
  (ended before the last round by a scheduler; compared on the rounds it reached), or empty;
* default targets τ = ``target_quantiles`` of the *best* smoothed loss of the trials that ran
  to the end unflagged, keeping only those strictly below ℓ_0 (a target at or above the
  starting loss is reached by every trial at once and says nothing);
* the Pareto set of (R_τ, final loss), both minimised, over the unflagged trials that ran to
  the end (a stopped trial's "final" loss is from an earlier round and is not comparable; ∞
  compares above every finite value, so a trial that never reaches τ is on the set only when
  no trial that reaches τ ends as low; equal points are all kept);
* the lower envelope  E(R) = min_trials min_{t ≤ R} s_t  ("best loss reachable within R
  rounds", the running minimum of the smoothed curve, i.e. keeping the best model so far),
  with the trial attaining it and the *regime changes*: rounds where that trial changes. On a
  tie the incumbent keeps the envelope. Diverged and blown-up trials are left out of the
  envelope by default (the papers omit diverging runs); stopped trials count up to the round
  they reached.

JSON (``to_dict``) writes ∞ and NaN as ``null``; CSV rows (``to_csv_rows``) keep ``inf`` floats
(written ``inf``, read back by ``float``). Both list every trial up to :data:`TOP_TRIALS`; a
larger study's files stay bounded: they list :meth:`TradeOff.shown` (the lowest final losses,
the Pareto set, the envelope's trials) and ``trials_total`` counts them all.
"""

from __future__ import annotations

import csv
import itertools
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from fedtune.errors import ConfigError
from fedtune.results import (
    TOP_TRIALS,
    EnvelopePoint,
    RegimeChange,
    TradeOff,
    TrialSummary,
)
from fedtune.trainers.records import Outcome, TrialResult

__all__ = [
    "BLOWUP",
    "FLAG_BLOWN_UP",
    "FLAG_DIVERGED",
    "FLAG_STOPPED",
    "TOP_TRIALS",
    "EnvelopePoint",
    "RegimeChange",
    "TradeOff",
    "TrialCurve",
    "TrialSummary",
    "analyze_tradeoff",
    "lower_envelope",
    "pareto_front",
    "rounds_to_target",
    "smooth",
    "tradeoff_text",
    "write_tradeoff",
]

TrialId = str | int
BLOWUP = 2.0  # final loss ≥ BLOWUP × starting loss: blown up (finite, but far above the start)


@dataclass(frozen=True)
class TrialCurve:
    """One trial's loss curve: recorded rounds (increasing, ≥ 0) and ℓ at each (NaN -> ∞)."""

    trial_id: TrialId
    params: Mapping[str, Any]
    rounds: Sequence[int]
    losses: Sequence[float]
    outcome: Outcome | str = Outcome.COMPLETED

    def __post_init__(self) -> None:
        rounds = tuple(int(r) for r in self.rounds)
        losses = tuple(float(v) if math.isfinite(float(v)) else math.inf for v in self.losses)
        where = f"curves[{self.trial_id}]"
        if len(rounds) != len(losses):
            raise ConfigError(f"{where}.losses", "needs one loss per round")
        if any(b <= a for a, b in itertools.pairwise(rounds)) or (rounds and rounds[0] < 0):
            raise ConfigError(f"{where}.rounds", "must be non-negative and strictly increasing")
        if self.outcome not in tuple(Outcome):
            raise ConfigError(f"{where}.outcome", f"must be one of {', '.join(Outcome)}")
        object.__setattr__(self, "rounds", rounds)
        object.__setattr__(self, "losses", losses)
        object.__setattr__(self, "outcome", Outcome(self.outcome))
        object.__setattr__(self, "params", dict(self.params))

    @classmethod
    def from_result(
        cls,
        trial_id: TrialId,
        result: TrialResult,
        params: Mapping[str, Any] | None = None,
        metric: str = "client_loss",
    ) -> TrialCurve:
        """From a trainer result; ``params`` default to the result config's hparams."""
        points = result.curve(metric)
        params = dict(result.config.get("hparams", {})) if params is None else params
        return cls(trial_id, params, [r for r, _ in points], [v for _, v in points], result.outcome)

    def final_loss(self, last_rounds: int) -> float:
        tail = self.losses[-last_rounds:]
        if self.outcome == Outcome.DIVERGED or not tail:
            return math.inf
        return float(np.mean(tail))  # inf if any value in the tail is inf


#: flags of :class:`TrialSummary` (empty: a trial that ran to the end and is compared fully)
FLAG_DIVERGED, FLAG_STOPPED = Outcome.DIVERGED.value, Outcome.STOPPED.value
FLAG_BLOWN_UP = "blown_up"


def smooth(losses: Sequence[float], window: int) -> np.ndarray:
    """Trailing mean over ``window`` recorded values (expanding at the start; inf stays inf)."""
    x = np.asarray(losses, dtype=float)
    if window <= 1 or x.size == 0:
        return x.copy()
    finite = np.where(np.isfinite(x), x, 0.0)
    bad = (~np.isfinite(x)).astype(int)
    csum, cbad = np.concatenate([[0.0], np.cumsum(finite)]), np.concatenate([[0], np.cumsum(bad)])
    idx = np.arange(x.size)
    lo = np.maximum(idx + 1 - window, 0)
    out = (csum[idx + 1] - csum[lo]) / (idx + 1 - lo)
    out[(cbad[idx + 1] - cbad[lo]) > 0] = np.inf
    return out


def rounds_to_target(rounds: Sequence[int], smoothed: np.ndarray, target: float) -> float:
    """First recorded round whose smoothed loss is ≤ ``target``; ``inf`` if none."""
    hit = np.flatnonzero(np.asarray(smoothed) <= target)
    return float(rounds[hit[0]]) if hit.size else math.inf


def pareto_front(points: Sequence[tuple[float, float]]) -> list[int]:
    """Indices of the non-dominated points (both coordinates minimised; equal points kept).

    q dominates p iff q ≤ p in both coordinates and q < p in at least one; ∞ is larger than
    every finite value. Points with a NaN coordinate are never on the front.
    """
    pts = np.asarray(points, dtype=float).reshape(-1, 2)
    ok = ~np.isnan(pts).any(axis=1)
    le = (pts[:, None, :] <= pts[None, :, :]).all(axis=2)  # le[q, p]: q ≤ p everywhere
    lt = (pts[:, None, :] < pts[None, :, :]).any(axis=2)
    dominated = ((le & lt) & ok[:, None]).any(axis=0)
    return [i for i in range(len(pts)) if ok[i] and not dominated[i]]


def lower_envelope(
    curves: Sequence[TrialCurve], grid: Iterable[int], smooth_window: int
) -> tuple[list[EnvelopePoint], list[RegimeChange]]:
    """E(R) = min over curves of the running minimum of the smoothed curve up to round R."""
    grid = np.asarray(sorted(set(int(r) for r in grid)), dtype=int)
    best = np.full((len(curves), grid.size), np.inf)
    for i, c in enumerate(curves):
        if not c.rounds:
            continue
        running = np.minimum.accumulate(smooth(c.losses, smooth_window))
        pos = np.searchsorted(np.asarray(c.rounds), grid, side="right") - 1
        best[i, pos >= 0] = running[pos[pos >= 0]]
    points: list[EnvelopePoint] = []
    changes: list[RegimeChange] = []
    holder: int | None = None
    for j, r in enumerate(grid):
        column = best[:, j]
        low = float(column.min()) if column.size else math.inf
        if not math.isfinite(low):
            points.append(EnvelopePoint(round=int(r), loss=math.inf, trial_id=None))
            continue
        if holder is None or column[holder] > low:
            new = int(np.flatnonzero(column == low)[0])
            if holder is not None:
                changes.append(
                    RegimeChange(
                        round=int(r),
                        from_trial=curves[holder].trial_id,
                        to_trial=curves[new].trial_id,
                        loss=low,
                    )
                )
            holder = new
        points.append(EnvelopePoint(round=int(r), loss=low, trial_id=curves[holder].trial_id))
    return points, changes


def tradeoff_text(t: TradeOff, top: int | None = TOP_TRIALS) -> str:
    """The exact text of ``tradeoff.json`` (∞/NaN as null): :meth:`TradeOff.report`'s JSON."""
    return json.dumps(t.to_dict(top), indent=2, allow_nan=False)


def write_tradeoff(t: TradeOff, directory: str | Path, stem: str = "tradeoff") -> dict[str, Path]:
    """Write ``<stem>.json`` and ``<stem>.csv`` into ``directory``.

    Args:
        t: The trade-off.
        directory: Where (created if missing).
        stem: The files' stem.

    Returns:
        The paths, by kind (``json``, ``csv``).
    """
    return write_json_csv(directory, stem, tradeoff_text(t), t.to_csv_rows(), "trial_id")


def write_json_csv(
    directory: str | Path, stem: str, text: str, rows: list[dict[str, Any]], first: str
) -> dict[str, Path]:
    """Write a document as ``<stem>.json`` and its table as ``<stem>.csv``.

    Args:
        directory: Where (created if missing).
        stem: The files' stem.
        text: The JSON document.
        rows: The table's rows (their keys are the columns).
        first: The one column of an empty table's header.

    Returns:
        The paths, by kind (``json``, ``csv``).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"json": out / f"{stem}.json", "csv": out / f"{stem}.csv"}
    paths["json"].write_text(text)
    with paths["csv"].open("w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]) if rows else [first])
        writer.writeheader()
        writer.writerows(rows)
    return paths


def analyze_tradeoff(
    curves: Sequence[TrialCurve],
    *,
    targets: Sequence[float] | None = None,
    target_quantiles: Sequence[float] = (0.1, 0.5, 0.9),
    pareto_target: float | None = None,
    last_rounds: int = 10,
    smooth_window: int = 5,
    grid: Iterable[int] | None = None,
    include_diverged: bool = False,
    blowup: float = BLOWUP,
    rounds_total: int | None = None,
    metric: str = "client_loss",
) -> TradeOff:
    """Rounds-to-target, final losses, flags, Pareto set and lower envelope of ``curves``.

    ``targets`` default to the ``target_quantiles`` of the best smoothed losses of the trials
    that ran to the end unflagged, below the starting loss (module docstring);
    ``pareto_target`` (the τ of the Pareto set) defaults to the median target. A trial is
    ``stopped`` when its outcome says so or it ended before ``rounds_total`` (default: the last
    round any trial reached). ``grid`` (rounds R of the envelope) defaults to every recorded
    round.
    """
    if last_rounds < 1 or smooth_window < 1:
        raise ConfigError("last_rounds" if last_rounds < 1 else "smooth_window", "must be >= 1")
    if not blowup > 1:
        raise ConfigError("blowup", f"must be > 1, got {blowup}")
    start_loss = _start_loss(curves)
    if rounds_total is None:
        rounds_total = max((c.rounds[-1] for c in curves if c.rounds), default=0)
    finals = [c.final_loss(last_rounds) for c in curves]
    flags = [
        _flag(c, f, start_loss, blowup, rounds_total) for c, f in zip(curves, finals, strict=True)
    ]
    given = targets is not None
    if targets is None:
        targets = _default_targets(curves, flags, start_loss, smooth_window, target_quantiles)
    targets = sorted({float(t) for t in targets})
    if pareto_target is None and targets:
        pareto_target = targets[(len(targets) - 1) // 2]
    if pareto_target is not None and pareto_target not in targets:
        targets = sorted([*targets, float(pareto_target)])
    summaries = [
        _summarize(c, f, flag, targets, smooth_window)
        for c, f, flag in zip(curves, finals, flags, strict=True)
    ]
    pareto: tuple[TrialId, ...] = ()
    if pareto_target is not None:
        k = targets.index(pareto_target)
        cand = [t for t in summaries if t.comparable and math.isfinite(t.final_loss)]
        pts = [(t.rounds_to_target[k], t.final_loss) for t in cand]
        pareto = tuple(cand[i].trial_id for i in sorted(pareto_front(pts), key=lambda i: pts[i]))
    bad = (FLAG_DIVERGED, FLAG_BLOWN_UP)
    kept = [c for c, f in zip(curves, flags, strict=True) if include_diverged or f not in bad]
    grid = sorted({r for c in kept for r in c.rounds}) if grid is None else grid
    envelope, changes = lower_envelope(kept, grid, smooth_window)
    which = "included" if include_diverged else "excluded"
    notes = {
        "envelope": f"running minimum of the smoothed curve; diverged and blown-up trials {which}",
        "targets": "given by the study"
        if given
        else f"quantiles {list(target_quantiles)} of the best smoothed loss of the trials that ran "
        "to the end unflagged, strictly below the starting loss",
        "flags": f"diverged: the engine stopped it; blown_up: final loss >= {blowup:g} x start "
        "loss; stopped: ended before the last round (compared on the rounds it reached, never "
        "on the Pareto set)",
    }
    return TradeOff(
        metric=metric,
        start_loss=start_loss,
        targets=list(targets),
        pareto_target=pareto_target,
        last_rounds=last_rounds,
        smooth_window=smooth_window,
        trials=summaries,
        trials_total=len(summaries),
        pareto=list(pareto),
        envelope=envelope,
        regime_changes=changes,
        notes=notes,
    )


def _start_loss(curves: Sequence[TrialCurve]) -> float:
    first = [c.losses[0] for c in curves if c.losses and math.isfinite(c.losses[0])]
    return float(np.median(first)) if first else math.nan


def _flag(c: TrialCurve, final: float, start: float, blowup: float, rounds_total: int) -> str:
    if c.outcome == Outcome.DIVERGED or (c.losses and not math.isfinite(final)):
        return FLAG_DIVERGED
    if math.isfinite(start) and final >= blowup * abs(start):
        return FLAG_BLOWN_UP
    if c.outcome == Outcome.STOPPED or not c.rounds or c.rounds[-1] < rounds_total:
        return FLAG_STOPPED
    return ""


def _default_targets(curves, flags, start, window, quantiles) -> list[float]:
    best = [
        float(smooth(c.losses, window).min())
        for c, f in zip(curves, flags, strict=True)
        if not f and c.losses
    ]
    best = [b for b in best if math.isfinite(b)]
    if not best:
        return []
    found = [float(np.quantile(best, q)) for q in quantiles]
    return [t for t in found if not math.isfinite(start) or t < start]


def _summarize(
    c: TrialCurve, final: float, flag: str, targets: Sequence[float], window: int
) -> TrialSummary:
    s = smooth(c.losses, window)
    rtt = tuple(rounds_to_target(c.rounds, s, t) for t in targets)
    best = float(s.min()) if s.size else math.inf
    last = c.rounds[-1] if c.rounds else 0
    return TrialSummary(
        trial_id=c.trial_id,
        params=dict(c.params),
        outcome=c.outcome,
        last_round=last,
        final_loss=final,
        best_loss=best,
        rounds_to_target=list(rtt),
        flag=flag,
    )
