"""LocalUpdateDecay: automatic client/server learning-rate decay on loss plateaus.

`001_2dc7ddae5cbdc81f.txt` §9, Algorithms 3–4 with the three practical refinements
(ALGORITHMS.md §2). Every round each sampled client reports the loss of the *broadcast* model on
its data before local training; ℓ_t is their mean. With window W, patience P, cooldown C and
threshold Δ:

    ℓ̂_t = (1/W) Σ_{j<W} ℓ_{t−j}
    plateau_t  ⇔  ℓ̂_t > min_{j<t} ℓ̂_j − Δ
    counter ← counter + 1 if plateau_t else 0
    if counter ≥ P:  γ ← a_client·γ,  η ← a_server·η,  counter ← 0,  cooldown ← C

Under-specified details resolved as ALGORITHMS.md §2.5 recommends:

* no test until W losses exist, nor before any earlier ℓ̂ exists (min over ∅);
* a cooldown of C rounds also at the start of training; no test and no counting during cooldown;
* the running minimum is global (not reset after a decay) unless ``reset_min_after_decay``;
* the counter resets at each decay;
* the round's update uses the current rates; a decay applies from the next round;
* with an adaptive ServerOpt the decay multiplies its learning rate.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from .config import DecayConfig

__all__ = ["DecayController"]


@dataclass
class DecayController:
    """Tracks ℓ_t and returns the multipliers of γ and η in force for the next round."""

    config: DecayConfig
    client_scale: float = 1.0
    server_scale: float = 1.0
    history: deque[float] = field(default_factory=deque)
    best: float | None = None
    counter: int = 0
    cooldown_left: int = -1  # -1: not started (start-up cooldown applied on first observe)
    decays: int = 0

    def observe(self, loss: float) -> bool:
        """Record round loss ℓ_t; return True when a decay was triggered (effective next round)."""
        cfg = self.config
        if not cfg.enabled:
            return False
        if self.cooldown_left < 0:
            self.cooldown_left = cfg.cooldown
        self.history.append(float(loss))
        while len(self.history) > cfg.window:
            self.history.popleft()
        if len(self.history) < cfg.window:
            self._tick_cooldown()
            return False
        smoothed = sum(self.history) / cfg.window
        decayed = False
        if self.cooldown_left == 0 and self.best is not None:
            if smoothed > self.best - cfg.threshold:
                self.counter += 1
            else:
                self.counter = 0
            if self.counter >= cfg.patience:
                decayed = self._decay()
        self.best = smoothed if self.best is None else min(self.best, smoothed)
        if decayed and cfg.reset_min_after_decay:
            self.best = None
        if not decayed:
            self._tick_cooldown()
        return decayed

    def _tick_cooldown(self) -> None:
        if self.cooldown_left > 0:
            self.cooldown_left -= 1

    def _decay(self) -> bool:
        self.client_scale *= self.config.client_decay
        self.server_scale *= self.config.server_decay
        self.counter = 0
        self.cooldown_left = self.config.cooldown
        self.decays += 1
        return True

    def state_dict(self) -> dict[str, Any]:
        return {
            "client_scale": self.client_scale,
            "server_scale": self.server_scale,
            "history": list(self.history),
            "best": self.best,
            "counter": self.counter,
            "cooldown_left": self.cooldown_left,
            "decays": self.decays,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.client_scale = float(state["client_scale"])
        self.server_scale = float(state["server_scale"])
        self.history = deque(float(v) for v in state["history"])
        self.best = None if state["best"] is None else float(state["best"])
        self.counter = int(state["counter"])
        self.cooldown_left = int(state["cooldown_left"])
        self.decays = int(state["decays"])
