"""Compare studies: several methods (or settings) on one task, from their stored trade-offs.

Pure computation (no MLflow, no files): the inputs are, per study, its spec document and its
``tradeoff.json`` (a :class:`fedtune.results.TradeOff`), optionally the rows of its
``theory.json`` (predicted (ρ, Δ) on a quadratic task, :mod:`fedtune.tuning.analysis.theory_link`). The
answer, a :class:`Comparison`, holds for every study:

* its **lower envelope** E(R): the best smoothed loss any of its trials reached within R rounds
  (the study's own ``envelope``);
* its **budget curve**: the lowest final loss among its trials against the total number of
  rounds the study had spent when that trial ended (trials in the order of their numbers): the
  best objective reached within r rounds of *total* budget;
* its **Pareto set** of (rounds to target, final loss), with the target it used;
* its **predicted trade-off** (ρ, Δ) where the theory applies (Charles & Konečný 2021,
  "Convergence and accuracy trade-offs in federated learning and meta-learning",
  arXiv:2103.05032), none elsewhere;
* a **table at matched budgets**: each study's best configuration and its final loss within the
  same number of trials (the smallest study's) and within the same total rounds (the smallest
  total), beside the whole study's best.

Studies are comparable when they share the task (its name), the data (the task's other
settings: clients, split, seed…) and the objective (metric or metrics, direction, last rounds
averaged); :func:`compare` refuses others (``ConfigError`` naming each difference) unless
``force``. The value compared is the trade-off's final loss (mean training loss over the
objective's last rounds: the selection rule of Charles & Konečný 2020, "On the outsized
importance of learning rates in local update methods", arXiv:2007.00878, §8.3).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fedtune.errors import ConfigError
from fedtune.results import (
    BUDGET_ROUNDS,
    BUDGET_TRIALS,
    BUDGET_WHOLE,
    Comparison,
    MatchedRow,
    StudyLine,
    TradeOff,
    TrialSummary,
    loss,
)

from .tradeoff import write_json_csv

if TYPE_CHECKING:
    from ..spec import StoredSpec

__all__ = [
    "BUDGET_ROUNDS",
    "BUDGET_TRIALS",
    "BUDGET_WHOLE",
    "Comparison",
    "MatchedRow",
    "RunRef",
    "StudyInput",
    "StudyLine",
    "budget_curve",
    "compare",
    "differences",
    "write_comparison",
]


@dataclass(frozen=True)
class RunRef:
    """Where a study's parent run is in MLflow."""

    tracking_uri: str
    experiment_id: str
    run_id: str


@dataclass(frozen=True)
class StudyInput:
    """What :func:`compare` reads of one study.

    Args:
        label: How the user named it: a service study id or a local workdir.
        document: The study's spec document (``StudySpec.to_dict()`` or the service's copy).
        tradeoff: Its trade-off (the content of ``tradeoff.json`` is read into one).
        theory: The rows of its ``theory.json`` (None: no prediction applies).
        run: Its parent run in MLflow, if known.
    """

    label: str
    document: Mapping[str, Any]
    tradeoff: TradeOff
    theory: Sequence[Mapping[str, Any]] | None = None
    run: RunRef | None = None

    def __post_init__(self) -> None:
        if isinstance(self.tradeoff, Mapping):  # a decoded tradeoff.json
            object.__setattr__(self, "tradeoff", TradeOff.from_json(self.tradeoff))
        from ..spec import StoredSpec

        object.__setattr__(self, "spec", StoredSpec.model_validate(self.document))

    #: the document's typed summary (task, objective, name, algorithm), parsed once
    spec: StoredSpec = field(init=False, repr=False, compare=False)


def write_comparison(c: Comparison, directory: str | Path, stem: str = "comparison") -> dict:
    """Write ``<stem>.json`` and ``<stem>.csv`` (the matched-budget table).

    Args:
        c: The comparison.
        directory: Where (created if missing).
        stem: The files' stem.

    Returns:
        The paths, by kind (``json``, ``csv``).
    """
    text = json.dumps(c.to_json(), indent=2, allow_nan=False, default=str)
    return write_json_csv(directory, stem, text, c.table_rows(), "budget")


def _objective(spec: StoredSpec) -> dict[str, Any]:
    o = spec.objective
    return {
        "metric": str(o.single_metric) if not o.is_multi else None,
        "metrics": [str(m) for m in o.metrics] if o.metrics else None,
        "mode": None if o.mode is None else str(o.mode),
        "last_rounds": o.last_rounds,
    }


def _data(spec: StoredSpec) -> dict[str, Any]:
    task = spec.task
    return {} if task is None else {"seed": task.seed, **task.params}


def differences(specs: Sequence[StoredSpec], keys: Sequence[str]) -> list[str]:
    """What makes studies not comparable: a different task, data or objective.

    Args:
        specs: The studies' specs (:attr:`StudyInput.spec`).
        keys: Their names in the messages, aligned with ``specs``.

    Returns:
        One line per difference (empty: comparable).
    """
    out = []
    if len(specs) < 2:
        return out
    checks = [
        ("task", [None if s.task is None else s.task.name for s in specs]),
        ("data", [_data(s) for s in specs]),
        ("objective", [_objective(s) for s in specs]),
    ]
    for what, values in checks:
        if any(v != values[0] for v in values[1:]):
            shown = "; ".join(f"{k}: {_short(v)}" for k, v in zip(keys, values, strict=True))
            out.append(f"different {what} ({shown})")
    return out


def _short(value: Any) -> str:
    if isinstance(value, Mapping):
        return ", ".join(f"{k}={v}" for k, v in value.items() if v is not None) or "-"
    return str(value)


def _trials(tradeoff: TradeOff) -> list[TrialSummary]:
    """The listed trials in the order they were numbered (ran)."""

    def order(t: TrialSummary) -> Any:
        tid = t.trial_id
        return (0, tid) if isinstance(tid, int) else (1, str(tid))

    return sorted(tradeoff.trials, key=order)


def budget_curve(tradeoff: TradeOff) -> list[tuple[int, float]]:
    """Lowest final loss against total rounds spent, trials taken in the order they ran.

    Args:
        tradeoff: A study's trade-off.

    Returns:
        ``(rounds spent so far, best final loss so far)`` after each trial (∞ until one trial
        has a finite final loss).
    """
    spent, best, out = 0, math.inf, []
    for t in _trials(tradeoff):
        spent += int(t.last_round or 0)
        best = min(best, loss(t.final_loss))
        out.append((spent, best))
    return out


def _best_within(
    trials: list[TrialSummary], *, max_trials: int | None = None, max_rounds: int | None = None
) -> tuple[TrialSummary | None, int, int]:
    best: TrialSummary | None = None
    used, spent = 0, 0
    for t in trials:
        rounds = int(t.last_round or 0)
        if max_trials is not None and used >= max_trials:
            break
        if max_rounds is not None and spent + rounds > max_rounds:
            break
        used, spent = used + 1, spent + rounds
        if math.isfinite(loss(t.final_loss)) and (
            best is None or loss(t.final_loss) < loss(best.final_loss)
        ):
            best = t
    return best, used, spent


def _row(
    budget: str, amount: int, key: str, found: TrialSummary | None, used: int, spent: int
) -> MatchedRow | None:
    if found is None:
        return None
    return MatchedRow(
        budget=budget,
        amount=amount,
        key=key,
        trial_id=found.trial_id,
        final_loss=loss(found.final_loss),
        params=dict(found.params),
        trials_used=used,
        rounds_used=spent,
    )


def _keys(inputs: Sequence[StudyInput]) -> list[str]:
    names = [i.spec.name or i.label for i in inputs]
    out = []
    for i, name in enumerate(names):
        out.append(name if names.count(name) == 1 else f"{name}#{i + 1}")
    return out


def _pareto(tradeoff: TradeOff) -> list[dict[str, Any]]:
    target, targets = tradeoff.pareto_target, list(tradeoff.targets)
    k = targets.index(target) if target in targets else None
    by_id = {t.trial_id: t for t in tradeoff.trials}
    out = []
    for tid in tradeoff.pareto:
        t = by_id.get(tid)
        if t is None:
            continue
        rtt = t.rounds_to_target
        out.append(
            {
                "trial_id": tid,
                "rounds_to_target": loss(rtt[k]) if k is not None and k < len(rtt) else math.inf,
                "final_loss": loss(t.final_loss),
                "params": dict(t.params),
            }
        )
    return out


def _predictions(theory: Sequence[Mapping[str, Any]] | None) -> list[dict[str, Any]]:
    rows = []
    for r in theory or []:
        rho, delta = r.get("rho_predicted"), r.get("delta_predicted")
        if rho is None or delta is None:
            continue
        rows.append(
            {
                "trial_id": r.get("trial"),
                "rho_predicted": float(rho),
                "delta_predicted": float(delta),
                "rho_measured": None if r.get("rho_measured") is None else r["rho_measured"],
                "final_loss": r.get("final_loss"),
            }
        )
    return sorted(rows, key=lambda r: (r["rho_predicted"], r["delta_predicted"]))


def compare(inputs: Sequence[StudyInput], force: bool = False) -> Comparison:
    """Compare studies (module docstring).

    Args:
        inputs: Two or more studies.
        force: Compare them even when their task, data or objective differ.

    Returns:
        The comparison (``comparable`` False and the differences listed when forced).

    Raises:
        ConfigError: Fewer than two studies, or studies that are not comparable and no
            ``force``.
    """
    if len(inputs) < 2:
        raise ConfigError("studies", f"name at least two studies to compare, got {len(inputs)}")
    keys = _keys(inputs)
    diffs = differences([i.spec for i in inputs], keys)
    if diffs and not force:
        raise ConfigError(
            "studies",
            "not comparable: " + "; ".join(diffs) + " (force the comparison to see it anyway)",
        )
    ordered = [_trials(i.tradeoff) for i in inputs]
    lines = []
    for key, i, trials in zip(keys, inputs, ordered, strict=True):
        lines.append(
            StudyLine(
                key=key,
                label=i.label,
                name=i.spec.name or i.label,
                algorithm=i.spec.algorithm or "",
                task="" if i.spec.task is None else i.spec.task.name,
                trials_total=int(i.tradeoff.trials_total or len(trials)),
                trials_listed=len(trials),
                rounds_spent=sum(int(t.last_round or 0) for t in trials),
                start_loss=i.tradeoff.start_loss,
                pareto_target=i.tradeoff.pareto_target,
                run_id=i.run.run_id if i.run else None,
                experiment_id=i.run.experiment_id if i.run else None,
                tracking_uri=i.run.tracking_uri if i.run else None,
            )
        )
    n_trials = min(len(t) for t in ordered)
    n_rounds = min(line.rounds_spent for line in lines)
    matched: list[MatchedRow] = []
    for budget, amount, limit in (
        (BUDGET_TRIALS, n_trials, {"max_trials": n_trials}),
        (BUDGET_ROUNDS, n_rounds, {"max_rounds": n_rounds}),
        (BUDGET_WHOLE, 0, {}),
    ):
        for key, trials in zip(keys, ordered, strict=True):
            found, used, spent = _best_within(trials, **limit)
            row = _row(budget, amount or spent, key, found, used, spent)
            if row is not None:
                matched.append(row)
    envelopes = {
        k: [
            (int(p.round), loss(p.loss))
            for p in i.tradeoff.envelope
            if p.loss is not None and math.isfinite(p.loss)
        ]
        for k, i in zip(keys, inputs, strict=True)
    }
    notes = {
        "value": "final loss: mean training loss over the objective's last rounds (lower is "
        "better)",
        "budget": "trials counted in the order they ran; a trial's rounds are the rounds it "
        "reached (a stopped trial spends fewer)",
    }
    targets = {line.pareto_target for line in lines}
    if len(targets) > 1:
        notes["pareto"] = (
            "each study's Pareto set uses its own target loss ("
            + ", ".join(f"{s.key}: {_short(s.pareto_target)}" for s in lines)
            + "); give the studies one tradeoff.pareto_target to compare rounds to one target"
        )
    cut = [s.key for s in lines if s.trials_listed < s.trials_total]
    if cut:
        notes["trials"] = (
            f"{', '.join(cut)}: the trade-off lists only some trials (the best ones, the "
            "Pareto set, the envelope's); matched budgets count those"
        )
    if diffs:
        notes["comparable"] = "forced: " + "; ".join(diffs)
    return Comparison(
        studies=lines,
        comparable=not diffs,
        differences=list(diffs),
        forced=bool(diffs) and force,
        envelopes=envelopes,
        budget_curves={k: budget_curve(i.tradeoff) for k, i in zip(keys, inputs, strict=True)},
        pareto={k: _pareto(i.tradeoff) for k, i in zip(keys, inputs, strict=True)},
        predictions={k: _predictions(i.theory) for k, i in zip(keys, inputs, strict=True)},
        matched=matched,
        notes=notes,
    )
