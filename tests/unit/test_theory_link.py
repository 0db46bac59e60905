"""Predicted (ρ, Δ) of a configuration agree with what the engine measures on a quadratic."""

from __future__ import annotations

import math

import numpy as np
import pytest

from fedtune.trainers import Trainer, build_task, parse_trial_config
from fedtune.tuning.analysis.theory_link import predict


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
    pred = predict(parse_trial_config(cfg), inst)
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
    assert predict(parse_trial_config(_config(algorithm="fedadam", client_lr=0.01)), inst) is None
    assert (
        predict(parse_trial_config(_config(client_lr=10.0, server_lr=0.1)), inst) is None
    )  # γ ≥ 1/L
    hb = predict(
        parse_trial_config(_config(algorithm="fedavgm", client_lr=0.01, server_lr=0.1)), inst
    )
    assert hb is not None and hb.rho_kind == "tuned"


def _issue13_instance():
    task = {"clients": 6, "dim": 4, "mu": 1.0, "L": 10.0}
    return build_task("quadratic", task, seed=0).meta["instance"]


def _trial(algorithm, K, **hp):
    return {
        "task": {"name": "quadratic", "clients": 6, "dim": 4, "mu": 1.0, "L": 10.0, "seed": 0},
        "algorithm": algorithm,
        "train": {"rounds": 5, "clients_per_round": 6, "local_steps": K, "dtype": "float64"},
        "hparams": hp,
    }


def test_delta_uses_lemma5_for_theta_K_beyond_theorem4():
    """``fomaml`` (Θ_K), K = 10, γ = 0.05 ≥ 1/(KL) = 0.01: App. D.1 prescribes
    Lemma 5, Δ = (√b − √a)/(√b + √a) with b, a the extreme eigenvalues of the Q_i; eq. 17 gave
    −0.2848 here (κ = 32.27 > κ₀ = 10)."""
    inst = _issue13_instance()
    pred = predict(parse_trial_config(_trial("fomaml", 10, client_lr=0.05, server_lr=0.1)), inst)
    assert pred is not None
    # independently: Q_i = (I − γ A_i)^(K−1) as matrices, extreme eigenvalues over all clients
    q = np.concatenate(
        [np.linalg.eigvalsh(np.linalg.matrix_power(np.eye(4) - 0.05 * A, 9)) for A in inst.A]
    )
    b, a = q.max(), q.min()
    expected = (math.sqrt(b) - math.sqrt(a)) / (math.sqrt(b) + math.sqrt(a))
    assert pred.delta == pytest.approx(expected, rel=1e-10)
    assert pred.delta == pytest.approx(0.8945, abs=5e-5)
    assert pred.delta_form == "lemma5"
    assert pred.kappa > inst.L / inst.mu  # where eq. 17 would have been negative
    # inside Theorem 4 (γ < 1/(KL)) the same method keeps eq. 17
    inside = predict(parse_trial_config(_trial("fomaml", 10, client_lr=0.009, server_lr=0.1)), inst)
    assert inside.delta_form == "eq17"
    kappa0 = inst.L / inst.mu
    want = (math.sqrt(kappa0) - math.sqrt(inside.kappa)) / (
        math.sqrt(kappa0) + math.sqrt(inside.kappa)
    )
    assert inside.delta == pytest.approx(want, rel=1e-10)


def test_delta_in_unit_interval_for_every_predicted_configuration():
    """Δ ∈ [0, 1] (eq. 17 / Lemma 5 definitions) for every configuration that gets a prediction."""
    forms = []
    for seed, clients in ((0, 6), (1, 3), (2, 1)):
        task = {"clients": clients, "dim": 4, "mu": 1.0, "L": 10.0}
        inst = build_task("quadratic", task, seed=seed).meta["instance"]
        for algorithm in ("fedavg", "fomaml", "fedprox", "local_update", "fedavgm", "reptile"):
            for K in (1, 2, 3, 10, 50, 300):
                for alpha in (0.0, 0.5, 5.0):
                    for frac in (0.01, 0.3, 0.9, 0.999):
                        gamma = frac / (inst.L + alpha)
                        hp = {"client_lr": gamma, "server_lr": 0.1}
                        if algorithm in ("fedprox", "local_update"):
                            hp["prox_alpha"] = alpha
                        elif alpha:
                            continue
                        cfg = _trial(algorithm, K, **hp)
                        cfg["task"].update(task, seed=seed)
                        pred = predict(parse_trial_config(cfg), inst)
                        if pred is None:
                            continue
                        assert 0.0 <= pred.delta <= 1.0, (algorithm, K, alpha, gamma, pred)
                        forms.append(pred.delta_form)
    assert forms.count("lemma5") >= 20 and forms.count("eq17") >= 200, len(forms)
