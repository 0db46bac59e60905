"""Search strategies with their own stop rule: ``tradeoff`` (issue 14 req. 5), ``tpe_guard`` (the
default of a new study since issue 23) and ``hyperband``.

``tpe_guard`` = TPE + :meth:`StopRule.guard` (no sweep): on the search suite
(``benchmarks/search_efficiency.py``, seven tasks) ``tradeoff``'s γ = η sweep and 1 % stop
margin lost to plain TPE on tasks whose best has η ≠ γ (LEAF synthetic: η = 10 γ), so the
default keeps TPE's proposals and stops only what cannot be the selection rule's pick. Below:
``tradeoff`` as built for issue 14.

Why: with a fixed budget of rounds, a large learning rate converges fast to a worse point and
a small one converges slowly to a better point (`001_2dc7ddae5cbdc81f.txt` §§3–8, ALGORITHMS.md
§8 prediction 8). Early stopping that compares trials on an early rung (ASHA) therefore keeps the
large, fast-starting rates and stops exactly the small ones the selection rule picks in the end.
This strategy has three parts, all driven by the papers' selection rule — the mean of the
objective over the last ``objective.last_rounds`` rounds, never a raw last value:

1. **Theory-guided sweep** (:class:`TheorySweep`). The quadratic theory says the surrogate a
   client optimises depends on γ through γ·K·λ and the server's progress per round on
   η·φ_K(γ) ≈ η·K (φ_{K,λ}(γ) = (1 − (1 − γλ)^K)/γ, ALGORITHMS.md §3.9): both rates scale as
   1/K, and along η = γ (original FedAvg, §1.6) one coordinate s = log₁₀ γ sets both the speed
   and the bias. The sweep walks that line from the top of the range downwards in steps of
   half a decade (the papers' grid spacing) with a phase drawn from the sampler's seed:
   diverging steps cost a few rounds each, and the walk ends once the results get worse again.
   It then probes a quarter decade on either side of the best step and, when K is searched,
   K·4 and K/4 with η·K held fixed (the server's progress per round when γ·K·λ is small),
   with γ kept and with γ·K held too. Every other parameter stays at its default.
2. **Selection-rule stopping against the incumbent** (:class:`StopRule`). A trial is stopped
   when its selection-rule value is worse than the incumbent's (the best completed trial) *at
   the same round* by more than ``margin`` **and** its own value, extrapolated linearly at the
   rate it improved over the last window up to the final round, is still worse than the
   incumbent's final value by more than ``margin``. Comparing at equal rounds cancels the
   client-sampling noise both trials share (the fairness protocol); the optimistic
   extrapolation protects a small learning rate that starts slowly but is still improving
   fast, which a raw comparison on an early rung (ASHA) stops. A sweep trial that has already flattened out in the first half of
   its rounds is stopped too ("plateau"), while a smaller step remains: by the trade-off, a
   smaller step reaches a lower floor within the same horizon.
3. **TPE** for the remaining trials, with the sweep's trials in its history.

The searcher (:class:`~.optuna_glue.FedtuneSearch`) asks :meth:`TradeoffState.propose` for the
next point before sampling, and the scheduler (:class:`TradeoffScheduler`, the only
early-stopping authority of such a study) asks :meth:`TradeoffState.decide`; both run in the
driver and share one :class:`TradeoffState`.
"""

from __future__ import annotations

import dataclasses
import enum
import math
import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import optuna

from fedtune.search_spaces import ParamType, SearchSpace, default_point

__all__ = [
    "LINE_STEP",
    "REFINE_STEP",
    "Observed",
    "PrunerStop",
    "StopReason",
    "StopRule",
    "TheorySweep",
    "TradeoffState",
    "relative_gap",
    "stopper_for",
]

LINE_STEP = 0.5  # decades between line points (the papers' half-decade grid)
REFINE_STEP = 0.25  # decades around the line's best point
K_FACTOR = 4  # K·4 and K/4 around the default K, γ·K and η·K held fixed
CLIENT_LR, SERVER_LR, LOCAL_STEPS = "hparams.client_lr", "hparams.server_lr", "train.local_steps"
SWEEP_ATTR = "fedtune.sweep"  # Optuna user attribute: the sweep tag of a trial ("line:3", ...)


class StopReason(enum.StrEnum):
    """Why the stop rule stopped a trial (Optuna user attribute ``stop_rule``)."""

    WORSE = "worse"
    PLATEAU = "plateau"
    RUNG = "rung"  # not in the top 1/factor of the values at a rung's round (successive halving)


WORSE, PLATEAU, RUNG = StopReason.WORSE, StopReason.PLATEAU, StopReason.RUNG


def relative_gap(value: float, reference: float, minimize: bool = True) -> float:
    """How much worse ``value`` is than ``reference`` (0 = equal, 0.01 = 1 % worse)."""
    if not math.isfinite(value):
        return math.inf
    worse, better = (value, reference) if minimize else (reference, value)
    scale = max(abs(better), 1e-12)
    return (worse - better) / scale


# -- stopping -------------------------------------------------------------------------------
@dataclass(frozen=True)
class StopRule:
    """Decisions on selection-rule curves (``curve[t-1]`` = objective after round t)."""

    rounds: int  # T, the rounds of a complete trial
    window: int  # rounds over which the own rate / the plateau is measured
    grace: int  # no "worse" decision before this round
    margin: float = 0.01
    plateau_tol: float = 0.05
    minimize: bool = True
    at_round_margin: float | None = None  # gap at the same round that counts (None: margin)

    @classmethod
    def for_study(cls, rounds: int, last_rounds: int, minimize: bool = True) -> StopRule:
        """Window T/6 (at most N, at least 2); grace T/3: a non-convex model's curve starts
        flat and then drops, so an early own rate says little (measured on the digits MLP:
        with grace = window = T/6 TPE's trials were all stopped at round 5)."""
        window = max(2, min(last_rounds, rounds // 6))
        return cls(rounds=rounds, window=window, grace=max(window, rounds // 3), minimize=minimize)

    @classmethod
    def guard(cls, rounds: int, last_rounds: int, minimize: bool = True) -> StopRule:
        """``tpe_guard``'s rule: the same equal-round test, but a trial must be *twice* as bad
        as the incumbent was at the same round (relative gap > 1) and, improving at its current
        rate until the last round, still end worse than the incumbent's final value. Such a
        trial (blown up, oscillating, or far behind and flattening) cannot be the selection
        rule's pick; a slow starter that is still improving is never stopped."""
        rule = cls.for_study(rounds, last_rounds, minimize)
        return dataclasses.replace(rule, at_round_margin=1.0)

    def gap(self, curve: Sequence[float], incumbent: Sequence[float], t: int) -> float:
        return relative_gap(curve[t - 1], incumbent[min(t, len(incumbent)) - 1], self.minimize)

    def worse(self, curve: Sequence[float], incumbent: Sequence[float] | None) -> bool:
        """Worse than the incumbent at this round, and even its own current rate of
        improvement, kept up to the last round, would not bring it within ``margin`` of the
        incumbent's final value."""
        t = len(curve)
        if not incumbent or t < self.grace:
            return False
        at_round = self.margin if self.at_round_margin is None else self.at_round_margin
        if self.gap(curve, incumbent, t) <= at_round:
            return False
        now, before = curve[t - 1], curve[t - self.window]
        rate = (before - now) / (self.window - 1) if math.isfinite(before) else 0.0
        rate = rate if self.minimize else -rate
        projected = now - max(0.0, rate) * (self.rounds - t) * (1 if self.minimize else -1)
        return relative_gap(projected, incumbent[-1], self.minimize) > self.margin

    def raw_worse(self, curve: Sequence[float], incumbent: Sequence[float] | None) -> bool:
        """The comparison an early rung makes: this round's value only (for contrast in tests)."""
        t = len(curve)
        return bool(incumbent) and t >= self.window and self.gap(curve, incumbent, t) > self.margin

    def plateaued(self, curve: Sequence[float]) -> bool:
        """Flat over the last window within the first half of the rounds (step too large)."""
        t = len(curve)
        if t < 2 * self.window or t > self.rounds // 2:
            return False
        improvement = relative_gap(curve[t - self.window - 1], curve[t - 1], self.minimize)
        return improvement < self.plateau_tol

    def decide(
        self, curve: Sequence[float], incumbent: Sequence[float] | None, line: bool
    ) -> StopReason | None:
        """``worse``, ``plateau`` (only for a line trial with a smaller step left) or None."""
        if self.worse(curve, incumbent):
            return WORSE
        if line and self.plateaued(curve):
            return PLATEAU
        return None


# -- the sweep ------------------------------------------------------------------------------
@dataclass(frozen=True)
class Observed:
    """One trial as the sweep sees it: its tag, outcome and selection-rule value."""

    tag: str
    outcome: str  # completed | diverged | stopped | failed | running
    value: float | None = None
    stop: str | None = None  # a StopReason when stopped by the rule

    @property
    def good(self) -> bool:
        return self.outcome == "completed" and self.value is not None and math.isfinite(self.value)


class TheorySweep:
    """Proposals of part 1 (module docstring), from the tags and outcomes seen so far."""

    def __init__(self, space: SearchSpace, seed: int | None, minimize: bool = True) -> None:
        self.space, self.minimize = space, minimize
        params = {p.path: p for p in space.enabled if not p.tied}
        self.lrs = [
            params[path]
            for path in (CLIENT_LR, SERVER_LR)
            if path in params and params[path].type == ParamType.FLOAT and params[path].log
        ]
        self.k = params.get(LOCAL_STEPS)
        self.base = {k: v for k, v in default_point(space).items() if k in params}
        phase = random.Random(seed).uniform(0.0, LINE_STEP)
        self.top = min((math.log10(p.high) for p in self.lrs), default=0.0) - phase
        self.bottom = max((math.log10(p.low) for p in self.lrs), default=0.0)

    @property
    def active(self) -> bool:
        return bool(self.lrs)

    def line(self, i: int) -> float:
        return self.top - i * LINE_STEP

    def point(self, s: float, k: int | None = None, client: bool = True) -> dict[str, Any]:
        """γ = η = 10^s at the default K; at another ``k`` η is scaled by K₀/k (η·K, the
        server's progress per round, held) and, with ``client``, γ too (γ·K held)."""
        out = dict(self.base)
        scale = 1.0
        if k is not None and self.k is not None:
            out[LOCAL_STEPS] = k
            scale = int(self.base[LOCAL_STEPS]) / k
        for p in self.lrs:
            factor = scale if (p.path == SERVER_LR or client) else 1.0
            out[p.path] = min(float(p.high), max(float(p.low), 10.0**s * factor))
        return out

    def propose(self, seen: Sequence[Observed]) -> tuple[str, dict[str, Any]] | None:
        """The next (tag, point), or None when the sweep is over (TPE from then on)."""
        if not self.active:
            return None
        tags = {o.tag for o in seen}
        line = [o for o in seen if o.tag.startswith("line:")]
        i = len(line)
        if not self._line_done(line) and self.line(i) >= self.bottom - 1e-9:
            return f"line:{i}", self.point(self.line(i))
        best = self._best(seen)
        if best is None:
            return None
        for tag, point in self._around(*self._coords(best.tag)):
            if tag not in tags:
                return tag, point
        return None

    def _line_done(self, line: Sequence[Observed]) -> bool:
        """The line passed its best: a good trial, and the latest finished one is worse."""
        finished = [o for o in line if o.outcome != "running"]
        good = [o for o in finished if o.good]
        if not good or not finished:
            return False
        last = finished[-1]
        if last.outcome == "stopped":
            return last.stop == WORSE
        best = min(good, key=self._key)
        return last is not best and last.outcome == "completed"

    def _key(self, o: Observed) -> float:
        return o.value if self.minimize else -o.value

    def _best(self, seen: Sequence[Observed]) -> Observed | None:
        good = [o for o in seen if o.good]
        return min(good, key=self._key) if good else None

    def _coords(self, tag: str) -> tuple[float, int | None, bool]:
        """(s, K or None, γ scaled with K) of a tag: ``line:i`` or ``near|k|ke:s[@K]``."""
        kind, _, rest = tag.partition(":")
        if kind == "line":
            return self.line(int(rest)), None, True
        s, _, k = rest.partition("@")
        return float(s), int(k) if k else None, kind != "ke"

    def _around(self, s: float, k: int | None, client: bool) -> list[tuple[str, dict[str, Any]]]:
        out = []
        for ds in (-REFINE_STEP, REFINE_STEP):
            if self.bottom - 1e-9 <= s + ds <= self.top + LINE_STEP:
                kind = "near" if client else "ke"
                tag = f"{kind}:{s + ds:.4f}" + (f"@{k}" if k else "")
                out.append((tag, self.point(s + ds, k, client)))
        if self.k is not None and k is None:
            k0 = int(self.base[LOCAL_STEPS])
            for kk in sorted({min(int(self.k.high), k0 * K_FACTOR),
                              max(int(self.k.low), k0 // K_FACTOR)}, reverse=True):  # fmt: skip
                if kk != k0:
                    out.append((f"ke:{s:.4f}@{kk}", self.point(s, kk, client=False)))
                    out.append((f"k:{s:.4f}@{kk}", self.point(s, kk)))
        return out


# -- the state the searcher and the scheduler share -----------------------------------------
@dataclass
class TradeoffState:
    """Curves, incumbent and sweep of one study invocation (driver side)."""

    sweep: TheorySweep | None  # None: no sweep (``tpe_guard``: the stop rule only)
    rule: StopRule
    tags: dict[int, str] = field(default_factory=dict)  # trial number -> sweep tag
    curves: dict[int, list[float]] = field(default_factory=dict)  # number -> objective curve
    stops: dict[int, StopReason] = field(default_factory=dict)  # number -> why it stopped
    finished: dict[int, Observed] = field(default_factory=dict)
    incumbent: tuple[float, list[float]] | None = None

    def propose(self) -> tuple[str, dict[str, Any]] | None:
        if self.sweep is None:
            return None
        seen = [self.finished.get(n, Observed(tag, "running")) for n, tag in self.tags.items()]
        return self.sweep.propose(seen)

    def started(self, number: int, tag: str | None) -> None:
        if tag:
            self.tags[number] = tag

    def observe(self, number: int, rows: Sequence[float]) -> StopReason | None:
        """Append this trial's new objective values; the stop decision (None: continue)."""
        curve = self.curves.setdefault(number, [])
        curve.extend(rows)
        if not curve or number in self.stops:
            return self.stops.get(number)
        incumbent = self.incumbent[1] if self.incumbent else None
        line = self.tags.get(number, "").startswith("line:") and self._smaller_step_left(number)
        reason = self.rule.decide(curve, incumbent, line)
        if reason:
            self.stops[number] = reason
        return reason

    def _smaller_step_left(self, number: int) -> bool:
        i = int(self.tags[number].split(":")[1])
        return self.sweep.line(i + 1) >= self.sweep.bottom - 1e-9

    def complete(self, number: int, outcome: str, value: float | None) -> None:
        tag = self.tags.get(number)
        observed = Observed(tag or "", outcome, value, self.stops.get(number))
        if tag:
            self.finished[number] = observed
        if not observed.good:
            return
        if self.incumbent is None or relative_gap(value, self.incumbent[0], self.rule.minimize) < 0:
            self.incumbent = (value, list(self.curves.get(number, [])))

    def seed_history(self, rows: Mapping[int, tuple[str | None, Observed | None]]) -> None:
        """Trials of an earlier invocation (a resumed study): tags and outcomes, no curves."""
        for number, (tag, observed) in rows.items():
            if tag:
                self.tags[number] = tag
            if tag and observed is not None:
                self.finished[number] = observed


# -- successive halving / Hyperband over rounds ---------------------------------------------
class PrunerStop:
    """Stopping by an Optuna pruner over rounds (``hyperband``: Optuna's ``HyperbandPruner``;
    Li et al., JMLR 18(185), 2018), fed the selection-rule value after every round.

    Successive halving compares trials *on the same round*: at a rung r_k = r_0·η^k a trial goes
    on only if its value at round r_k is in the top 1/η of the values every trial of its bracket
    had at round r_k. Hyperband runs several such brackets with different first rungs r_0, so a
    configuration that starts slowly (a small γ, the one the trade-off favours in the end) is
    also compared only late, in the bracket whose first rung is the last round.

    The pruner decides on a private in-memory mirror of the study (named like the study, trial
    numbers aligned, so the bracket of trial n is the one Optuna assigns to it): the same
    decisions in ``run_study`` (driven by :class:`~.tradeoff_scheduler.TradeoffScheduler`) and
    in the in-process benchmark. Same interface as :class:`TradeoffState` (``propose`` is None).
    """

    def __init__(self, pruner: optuna.pruners.BasePruner, name: str, minimize: bool = True):
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        self.mirror = optuna.create_study(
            study_name=name, direction="minimize" if minimize else "maximize", pruner=pruner,
            sampler=optuna.samplers.RandomSampler(seed=0),
        )  # fmt: skip
        self.trials: list[optuna.Trial] = []
        self.curves: dict[int, list[float]] = {}
        self.stops: dict[int, StopReason] = {}
        self.finished: dict[int, str] = {}

    @classmethod
    def hyperband(cls, name: str, rounds: int, grace: int, factor: float, minimize: bool = True):
        """First rung r_0 = clamp(T/9, 1, grace) (three brackets at factor 3), last rung T."""
        r0 = max(1, min(grace, rounds // 9))
        pruner = optuna.pruners.HyperbandPruner(
            min_resource=r0, max_resource=rounds, reduction_factor=max(2, int(factor))
        )
        return cls(pruner, name, minimize)

    def _trial(self, number: int) -> optuna.Trial:
        while len(self.trials) <= number:
            self.trials.append(self.mirror.ask())
        return self.trials[number]

    def propose(self) -> None:
        """No proposals: the study's sampler picks every point."""
        return None

    def started(self, number: int, tag: str | None = None) -> None:
        self._trial(number)

    def observe(self, number: int, rows: Sequence[float]) -> StopReason | None:
        """Append this trial's new objective values (one per round); RUNG once pruned."""
        if number in self.stops:
            return self.stops[number]
        trial, curve = self._trial(number), self.curves.setdefault(number, [])
        for value in rows:
            curve.append(float(value))
            if math.isfinite(value):
                trial.report(float(value), len(curve))
                if trial.should_prune():
                    self.stops[number] = RUNG
                    return RUNG
        return None

    def complete(self, number: int, outcome: str, value: float | None) -> None:
        if number in self.finished:
            return
        trial, state = self._trial(number), optuna.trial.TrialState
        self.finished[number] = outcome
        if outcome == "completed" and value is not None and math.isfinite(value):
            self.mirror.tell(trial, value)
        else:
            self.mirror.tell(trial, state=state.PRUNED if outcome == "stopped" else state.FAIL)


def stopper_for(spec: Any, space: SearchSpace, rounds: int) -> TradeoffState | PrunerStop | None:
    """The stop rule a study's strategy runs in the driver (None: a Ray Tune scheduler's or
    none): ``tradeoff`` → :class:`TradeoffState` (sweep + stop rule), ``tpe_guard`` → a
    :class:`TradeoffState` without a sweep and with :meth:`StopRule.guard`, ``hyperband`` →
    :class:`PrunerStop`."""
    from .spec import Mode, Strategy

    minimize = spec.objective.directions[0] == Mode.MIN
    if spec.strategy == Strategy.TRADEOFF:
        return TradeoffState(
            TheorySweep(space, spec.sampler.seed, minimize),
            StopRule.for_study(rounds, spec.objective.last_rounds, minimize),
        )
    if spec.strategy == Strategy.TPE_GUARD:
        return TradeoffState(None, StopRule.guard(rounds, spec.objective.last_rounds, minimize))
    if spec.strategy == Strategy.HYPERBAND:
        s = spec.scheduler
        return PrunerStop.hyperband(spec.name, rounds, s.grace_rounds, s.reduction_factor, minimize)
    return None
