"""Predicted (ρ, Δ) of a configuration agree with what the engine measures on a quadratic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedtune.trainers import Trainer, build_task
from fedtune.tuning.theory_link import predict


def _config(**hp):
    return {
        "task": {"name": "quadratic", "clients": 4, "dim": 3, "noise": 0.0, "L": 5.0, "seed": 3},
        "algorithm": hp.pop("algorithm", "fedavg"),
        "train": {
            "rounds": 60,
            "clients_per_round": 4,
            "local_steps": 4,
            "dtype": "float64",
            "batch_sampling": "full",
            "eval_every": 1,
        },
        "hparams": hp,
    }


def test_gd_server_prediction_matches_measured_contraction_and_limit():
    cfg = _config(client_lr=0.05, server_lr=0.05)
    inst = build_task(
        "quadratic", {k: v for k, v in cfg["task"].items() if k not in ("name", "seed")}, seed=3
    ).meta["instance"]
    pred = predict(cfg, inst)
    assert pred is not None and pred.rho_kind == "configured" and 0 < pred.rho < 1
    assert 0 <= pred.delta <= 1 and pred.kappa <= inst.L / inst.mu + 1e-9
    t = Trainer(cfg)
    x_lim = _limit(cfg, inst)
    dist = []
    while not t.done:
        t.step()
        dist.append(float(np.linalg.norm(t.state.params["x"].numpy() - x_lim)))
    # the limit: full-participation exact-GD LocalUpdate converges to x*(α, γ, Θ), not x*
    assert dist[-1] < 1e-6 * dist[0]
    assert np.linalg.norm(x_lim - inst.x_star()) > 1e3 * dist[-1]
    loss_gap = t.records[-1].train_loss - inst.loss(inst.x_star())
    assert loss_gap == pytest.approx(pred.limit_excess_loss, rel=1e-4)  # dist ~1e-6 remains
    # ‖x_t − x*(α, γ, Θ)‖ contracts by ρ per round
    measured = math.exp(np.polyfit(np.arange(10, 40), np.log(dist[10:40]), 1)[0])
    assert measured == pytest.approx(pred.rho, rel=0.01)


def _limit(cfg, inst):
    from fedtune.trainers.theory import theta_sum
    from fedtune.trainers.theory.surrogate import surrogate_minimizer

    return surrogate_minimizer(inst, 0.0, cfg["hparams"]["client_lr"], theta_sum(4))


def test_no_prediction_outside_the_theory():
    inst = build_task("quadratic", {"clients": 3, "dim": 2}, seed=0).meta["instance"]
    assert predict(_config(algorithm="fedadam", client_lr=0.01), inst) is None
    assert predict(_config(client_lr=10.0, server_lr=0.1), inst) is None  # γ ≥ 1/L
    hb = predict(_config(algorithm="fedavgm", client_lr=0.01, server_lr=0.1), inst)
    assert hb is not None and hb.rho_kind == "tuned"
