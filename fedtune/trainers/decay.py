"""LocalUpdateDecay: automatic client/server learning-rate decay on loss plateaus.

Charles & Konečný 2020 (arXiv:2007.00878) §9, Algorithms 3–4 with the three practical refinements
(docs/explanation/algorithms.md §2). Every round each sampled client reports the loss of the
*broadcast* model on its data before local training; ℓ_t is their mean. Two semantics
(``decay.semantics``):

``paper`` (default) — the paper's text, eq. 25. With window W, patience P, cooldown C and
threshold Δ (``mode: max`` runs the same rule on −ℓ_t)::

    ℓ̂_t = (1/W) Σ_{j<W} ℓ_{t−j}
    plateau_t  ⇔  ℓ̂_t > min_{j<t} ℓ̂_j − Δ          (running minimum of every ℓ̂, strict >)
    counter ← counter + 1 if plateau_t else 0
    if plateau_t and counter ≥ P:  γ ← max(a_client·γ, min_lr),  η ← max(a_server·η, min_lr),
                                   counter ← 0,  no test for the next C full rounds

  Under-specified details resolved as docs/explanation/algorithms.md §2.5 recommends: no test until
  W losses exist, nor before any earlier ℓ̂ exists (min over ∅); a cooldown of C rounds also at the
  start of training; the running minimum is global unless ``reset_min_after_decay``; the counter
  resets at each decay. ``patience: 0`` decays at the first plateau, like ``patience: 1``.

``reference`` — the TensorFlow Federated research code the paper's experiments ran
(google-research/federated, ``adaptive_lr_decay/callbacks.py`` ``ReduceLROnPlateau.update`` and
``create_reduce_lr_on_plateau``; ``adaptive_fed_avg.py`` feeds both callbacks the same
before-training loss each round). One such state machine per rate (γ and η), each::

    window ← window[1:] + [ℓ_t]     (length W, initially W × +inf; × 0.0 in ``mode: max``)
    m ← mean(window)                 (+inf until W losses exist)
    if cooldown > 0:  cooldown ← cooldown − 1,  wait ← 0
    if m < best − Δ  (max: m > best + Δ):  best ← m,  wait ← 0     (Keras-style ``best``,
                                              initially +inf; 0.0 in ``mode: max``)
    elif cooldown ≤ 0:
        wait ← wait + 1
        if wait ≥ P and rate > min_lr:  rate ← max(a·rate, min_lr),  cooldown ← C,  wait ← 0

  Consequences (each pinned by a test in ``tests/unit/test_decay.py``): ``best`` only moves by
  more than Δ, so a loss falling by less than Δ/round slowly enough never decays; a cooldown
  blocks C − 1 rounds (the C-th round already counts); ``m = best − Δ`` exactly is no
  improvement, so it counts towards a decay; with C < W the +inf-padded window can count
  (and decay) before W losses exist; ``patience: 0`` acts as 1; a rate at ``min_lr`` stops
  decaying (its machine keeps counting) while the other rate may still decay. The initial
  cooldown is C. Averages are float64 here (float32 in TensorFlow).

In both, the round's update uses the current rates and a decay applies from the next round; with
an adaptive ServerOpt the decay multiplies its learning rate.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from fedtune.errors import ConfigError

from .config import DecayConfig

__all__ = ["DecayController"]


@dataclass
class _PlateauTrack:
    """One ``ReduceLROnPlateau`` of the reference code (``semantics: reference``)."""

    scale: float
    window: list[float]
    best: float
    wait: int = 0
    cooldown_counter: int = 0

    def update(self, cfg: DecayConfig, loss: float, base: float, factor: float) -> bool:
        """Feed ℓ_t; return True when this rate decayed (reference ``update``)."""
        self.window = [*self.window[1:], loss]
        average = math.fsum(self.window) / len(self.window)  # +inf while padded (min mode)
        if self.cooldown_counter > 0:
            self.cooldown_counter -= 1
            self.wait = 0
        if _improves(cfg, average, self.best):
            self.best = average
            self.wait = 0
            return False
        if self.cooldown_counter > 0:
            return False
        self.wait += 1
        if self.wait < cfg.patience or base * self.scale <= cfg.min_lr:
            return False
        self.scale = max(self.scale * factor, cfg.min_lr / base)
        self.cooldown_counter = cfg.cooldown
        self.wait = 0
        return True

    def state_dict(self) -> dict[str, Any]:
        return {
            "scale": self.scale,
            "window": list(self.window),
            "best": self.best,
            "wait": self.wait,
            "cooldown_counter": self.cooldown_counter,
        }

    @classmethod
    def from_state(cls, state: dict[str, Any]) -> _PlateauTrack:
        return cls(
            float(state["scale"]),
            [float(v) for v in state["window"]],
            float(state["best"]),
            int(state["wait"]),
            int(state["cooldown_counter"]),
        )


def _improves(cfg: DecayConfig, value: float, best: float) -> bool:
    if cfg.mode == "min":
        return value < best - cfg.threshold
    return value > best + cfg.threshold


def _new_track(cfg: DecayConfig) -> _PlateauTrack:
    pad = math.inf if cfg.mode == "min" else 0.0
    return _PlateauTrack(1.0, [pad] * cfg.window, pad, 0, cfg.cooldown)


@dataclass
class DecayController:
    """Tracks ℓ_t and the multipliers of γ and η in force for the next round.

    ``base_rates`` are the configured (γ, η); they only matter for ``decay.min_lr``, which
    bounds the rates themselves (as the reference's single ``--min_lr`` flag does).
    """

    config: DecayConfig
    base_rates: tuple[float, float] = (1.0, 1.0)
    client_scale: float = 1.0
    server_scale: float = 1.0
    history: deque[float] = field(default_factory=deque)
    best: float | None = None
    counter: int = 0
    cooldown_left: int = -1  # -1: not started (start-up cooldown applied on first observe)
    decays: int = 0
    tracks: tuple[_PlateauTrack, _PlateauTrack] | None = None  # reference: (client, server)

    def __post_init__(self) -> None:
        cfg = self.config
        if cfg.enabled and cfg.min_lr > 0:
            for name, rate in zip(("client_lr", "server_lr"), self.base_rates, strict=True):
                if 0 < rate < cfg.min_lr:
                    raise ConfigError(
                        "decay.min_lr", f"{cfg.min_lr:g} is above hparams.{name} = {rate:g}"
                    )
        if cfg.semantics == "reference" and self.tracks is None:
            self.tracks = (_new_track(cfg), _new_track(cfg))

    def observe(self, loss: float) -> bool:
        """Record round loss ℓ_t; return True when a rate decayed (effective next round)."""
        if not self.config.enabled:
            return False
        if self.config.semantics == "reference":
            return self._observe_reference(float(loss))
        return self._observe_paper(float(loss))

    # -- reference (TFF adaptive_lr_decay) ------------------------------------------------
    def _observe_reference(self, loss: float) -> bool:
        cfg = self.config
        assert self.tracks is not None
        client, server = self.tracks
        changed = [
            client.update(cfg, loss, self.base_rates[0], cfg.client_decay),
            server.update(cfg, loss, self.base_rates[1], cfg.server_decay),
        ]
        self.client_scale, self.server_scale = client.scale, server.scale
        if any(changed):
            self.decays += 1
        return any(changed)

    # -- paper (001 eq. 25) -----------------------------------------------------------------
    def _observe_paper(self, loss: float) -> bool:
        cfg = self.config
        if self.cooldown_left < 0:
            self.cooldown_left = cfg.cooldown
        self.history.append(loss if cfg.mode == "min" else -loss)
        while len(self.history) > cfg.window:
            self.history.popleft()
        if len(self.history) < cfg.window:
            self._tick_cooldown()
            return False
        smoothed = sum(self.history) / cfg.window
        decayed = False
        if self.cooldown_left == 0 and self.best is not None:
            plateau = smoothed > self.best - cfg.threshold
            self.counter = self.counter + 1 if plateau else 0
            if plateau and self.counter >= cfg.patience:
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
        cfg = self.config
        scales = [self.client_scale, self.server_scale]
        factors = (cfg.client_decay, cfg.server_decay)
        changed = False
        for i, (base, factor) in enumerate(zip(self.base_rates, factors, strict=True)):
            if base * scales[i] > cfg.min_lr:
                scales[i] = max(scales[i] * factor, cfg.min_lr / base)
                changed = True
        if not changed:  # both rates at min_lr: nothing to decay, keep counting
            return False
        self.client_scale, self.server_scale = scales
        self.counter = 0
        self.cooldown_left = cfg.cooldown
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
            "tracks": None if self.tracks is None else [t.state_dict() for t in self.tracks],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.client_scale = float(state["client_scale"])
        self.server_scale = float(state["server_scale"])
        self.history = deque(float(v) for v in state["history"])
        self.best = None if state["best"] is None else float(state["best"])
        self.counter = int(state["counter"])
        self.cooldown_left = int(state["cooldown_left"])
        self.decays = int(state["decays"])
        tracks = state.get("tracks")
        if tracks is not None:
            client, server = (_PlateauTrack.from_state(t) for t in tracks)
            self.tracks = (client, server)
