"""The ``tradeoff`` strategy's theory-guided sweep: which points to run before the sampler's.

:class:`TheorySweep` walks γ = η down a line of half-decade steps from the top of the learning
rates' ranges until the line passes its best point, then refines around that point (±¼ decade,
and K·4 and K/4 with γ·K and η·K, or η·K alone, held). It proposes points and stops nothing: the
:class:`~.stop_rules.IncumbentStopper` that owns it asks it for the next point and tells it each
trial's :class:`~.stop_rules.Observed` outcome. Why this sweep:
``docs/explanation/search-strategies.md``.
"""

from __future__ import annotations

import math
import random
from collections.abc import Sequence
from typing import Any

from fedtune.outcomes import RUNNING, TrialOutcome
from fedtune.search_spaces import ParamType, SearchSpace, default_point

from .stop_rules import Observed, StopReason

__all__ = ["LINE_STEP", "REFINE_STEP", "SWEEP_ATTR", "TheorySweep"]

LINE_STEP = 0.5  # decades between line points (the papers' half-decade grid)
REFINE_STEP = 0.25  # decades around the line's best point
K_FACTOR = 4  # K·4 and K/4 around the default K, γ·K and η·K held fixed
CLIENT_LR, SERVER_LR, LOCAL_STEPS = "hparams.client_lr", "hparams.server_lr", "train.local_steps"
SWEEP_ATTR = "fedtune.sweep"  # Optuna user attribute: the sweep tag of a trial ("line:3", ...)


class TheorySweep:
    """The ``tradeoff`` strategy's γ = η sweep: its proposals from the trials seen so far.

    Args:
        space: The study's search space.
        seed: The sampler's seed (the phase of the line's steps).
        minimize: The objective is minimised.
    """

    def __init__(self, space: SearchSpace, seed: int | None, minimize: bool = True) -> None:
        self.space, self.minimize = space, minimize
        params = {p.path: p for p in space.drawn}
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
        finished = [o for o in line if o.outcome != RUNNING]
        good = [o for o in finished if o.good]
        if not good or not finished:
            return False
        last = finished[-1]
        if last.outcome == TrialOutcome.STOPPED:
            return last.stop == StopReason.WORSE
        best = min(good, key=self._key)
        return last is not best and last.outcome == TrialOutcome.COMPLETED

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
            for kk in sorted(
                {min(int(self.k.high), k0 * K_FACTOR), max(int(self.k.low), k0 // K_FACTOR)},
                reverse=True,
            ):
                if kk != k0:
                    out.append((f"ke:{s:.4f}@{kk}", self.point(s, kk, client=False)))
                    out.append((f"k:{s:.4f}@{kk}", self.point(s, kk)))
        return out
