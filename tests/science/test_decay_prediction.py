"""Prediction #21 of ALGORITHMS.md §8 (`001_2dc7ddae5cbdc81f.txt` §9): LocalUpdateDecay triggers
decays on a plateau and ends near the best constant-γ result without tuning γ.

Setting of §8 #21: a 50-client heterogeneous quadratic, M = 5, Θ_1:10, server GD, start
γ = 0.9/L, Δ = 1e-4, factors 0.1 / 0.9, W = P = C = 20, 3000 rounds, mini-batch gradient noise.
The LocalUpdate rounds are simulated in float64 numpy (vectorised over the cohort) and drive the
engine's own :class:`~fedtune.trainers.decay.DecayController`.
"""

from __future__ import annotations

import numpy as np
import pytest

from fedtune.trainers import DecayConfig
from fedtune.trainers.decay import DecayController
from fedtune.trainers.theory import random_instance

pytestmark = pytest.mark.science

N, M, K, DIM, MU, L = 50, 5, 10, 5, 1.0, 10.0
ETA, ROUNDS, NOISE, LAST = 0.01, 3000, 1.0, 200


def _run(inst, gamma: float, decay: DecayConfig, seed: int) -> tuple[float, int]:
    rng = np.random.default_rng(seed)
    x = np.full(DIM, 5.0)
    ctl = DecayController(decay)
    tail = []
    for t in range(ROUNDS):
        cohort = rng.choice(N, M, replace=False)
        A, c = inst.A[cohort], inst.c[cohort]
        ell = float(inst.client_losses(x)[cohort].mean())  # ℓ_t before local training
        g, eta = gamma * ctl.client_scale, ETA * ctl.server_scale
        y = np.repeat(x[None], M, axis=0)
        msg = np.zeros_like(y)
        for _ in range(K):
            grad = np.einsum("mij,mj->mi", A, y - c) + rng.standard_normal(y.shape) * NOISE
            msg += grad
            y -= g * grad
        x = x - eta * msg.mean(0)
        ctl.observe(ell)
        if t >= ROUNDS - LAST:
            tail.append(inst.loss(x))
    return float(np.mean(tail)), ctl.decays


def test_21_decay_reaches_the_best_constant_client_lr_without_tuning_it():
    inst = random_instance(N, DIM, MU, L, np.random.default_rng(21), radius=3.0)
    off = DecayConfig(enabled=False)
    on = DecayConfig(enabled=True, window=20, patience=20, cooldown=20, threshold=1e-4,
                     client_decay=0.1, server_decay=0.9)  # fmt: skip
    constants = {f: _run(inst, f / L, off, seed=1)[0] for f in (1e-3, 1e-2, 1e-1, 0.5, 0.9)}
    decayed, decays = _run(inst, 0.9 / L, on, seed=1)
    best = min(constants.values())
    assert decays >= 1
    assert decayed <= 1.05 * best, (decayed, constants)
    # and it beats the constant run it started from (γ = 0.9/L plateaus higher)
    assert decayed < constants[0.9]
