"""docs/explanation/algorithms.md §8 predictions 15–18: distance bounds, message variance,
learning-rate decay.

Sources: Charles & Konečný 2021 (arXiv:2103.05032) Lemmas 5, 6, 12, Thm 4, App. C.2;
Charles & Konečný 2020 (arXiv:2007.00878) Thms 16, 17, 21, 26, 27, 29, Cors 20, 22, Lemma 23,
Fig. 3.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fedtune.trainers.theory import (
    LocalUpdateConfig,
    QuadraticInstance,
    Thm27Schedule,
    Thm29Schedule,
    bound_cor20,
    bound_cor22,
    bound_lemma5,
    bound_thm4,
    bound_thm16,
    bound_thm17,
    bound_thm21,
    client_messages,
    distortion_matrices,
    heterogeneity,
    log_kappa_closed_form,
    log_q_extremes,
    message_variance_bound,
    random_instance,
    simulate,
    surrogate_gap,
    surrogate_minimizer,
    theta_from_coeffs,
    theta_last,
    theta_sum,
)


def _instances(rng, count=12):
    for _ in range(count):
        n, d = int(rng.integers(2, 9)), int(rng.integers(1, 7))
        mu, L = 1.0, float(rng.uniform(2, 50))
        yield random_instance(
            n,
            d,
            mu,
            L,
            rng,
            radius=float(rng.uniform(0.5, 3)),
            heterogeneity=float(rng.uniform(0.2, 1)),
        )


def test_15_lemma5_and_theorem4_never_violated():
    rng = np.random.default_rng(15)
    checked = 0
    for inst in _instances(rng, 20):
        C, mu, L, dim = float(np.linalg.norm(inst.c, axis=1).max()), inst.mu, inst.L, inst.dim
        for alpha in (0.0, 0.5):
            for K in (2, 5, 40):
                for theta, gamma in (
                    (theta_sum(K), 0.9 / (L + alpha)),
                    (theta_last(K), 0.9 / (K * L + alpha)),
                    (theta_last(K), 0.9 / (L + alpha)),
                ):
                    gap = surrogate_gap(inst, alpha, gamma, theta)
                    log_b, log_a = log_q_extremes(inst, alpha, gamma, theta)
                    assert gap <= bound_lemma5(C, log_b, log_a, dim) + 1e-12
                    b_over_a = np.exp(log_b - log_a)
                    assert gap <= 2 * C * (1 - 1 / b_over_a) + 1e-12  # intermediate 2C(b−a)/b
                    if theta.family == "sum" or gamma < 1 / (K * L + alpha):  # Thm 4 / Lemma 6
                        lk = log_kappa_closed_form(mu, L, alpha, gamma, theta.family, K)
                        assert gap <= bound_thm4(C, np.log(L / mu), lk) + 1e-12
                        Q = distortion_matrices(inst.A, alpha, gamma, theta)
                        assert np.all(
                            np.linalg.cond(Q) <= np.exp(np.log(L / mu) - lk) * (1 + 1e-10)
                        )
                    checked += 1
    assert checked == 20 * 2 * 3 * 3


def test_15_one_dimensional_tight_instance_approaches_2C():
    """A = (4, 1), c = (1, −1), γ = 1/8, Θ_K, p = 0.999, K = 200: gap → 8p/(3p+1) ≈ 2C = 2."""
    p = 0.999
    inst = QuadraticInstance(
        np.array([[[4.0]], [[1.0]]]), np.array([[1.0], [-1.0]]), np.array([p, 1 - p])
    )
    gap = surrogate_gap(inst, 0.0, 1 / 8, theta_last(200))
    assert gap == pytest.approx(8 * p / (3 * p + 1), abs=1e-9)
    assert 1.999 < gap <= bound_lemma5(1.0, *log_q_extremes(inst, 0.0, 1 / 8, theta_last(200)), 1)


def test_16_distance_bounds_of_001_never_violated():
    rng = np.random.default_rng(16)
    checked = 0
    for inst in _instances(rng, 15):
        mu, L = inst.mu, inst.L
        s_A, s_c = heterogeneity(inst)
        for K in (2, 5, 20):
            gammas = np.array([0.01, 0.1, 0.4, 0.9]) / L
            for g in gammas:
                gap = surrogate_gap(inst, 0.0, g, theta_sum(K))
                assert gap <= bound_thm17(mu, L, s_A, s_c, g, K) + 1e-12
                theta = theta_from_coeffs(rng.uniform(0, 1, K))
                assert (
                    surrogate_gap(inst, 0.0, g, theta)
                    <= bound_thm16(mu, L, s_A, s_c, g, theta) + 1e-12
                )
                checked += 2
            for g1, g2 in itertools.pairwise(gammas):
                x1 = surrogate_minimizer(inst, 0.0, g1, theta_sum(K))
                x2 = surrogate_minimizer(inst, 0.0, g2, theta_sum(K))
                dist = np.linalg.norm(x1 - x2)
                assert dist <= bound_thm21(mu, L, s_c, g1, g2, K) + 1e-12
                assert dist <= bound_cor22(mu, L, s_c, g1, g2) + 1e-12
                checked += 2
            for eps in (0.01, 0.3, 0.99 * (1 - np.exp(-K))):
                g = np.log(1 / (1 - eps)) / (K * L)
                if g < 1 / L:
                    gap = surrogate_gap(inst, 0.0, g, theta_sum(K))
                    assert gap <= bound_cor20(mu, L, s_A, s_c, eps, g, K) + 1e-12
                    checked += 1
    assert checked > 500


def test_17_message_variance_bound_and_norm_monotone_in_gamma():
    """Lemma 23: E‖q − E[q | clients]‖² ≤ KG²/(MB), equality at γ = 0.

    The lemma's proof bounds the mini-batch-noise part for fixed sampled clients; client sampling
    adds E_i‖∇f̃_i − ∇f̃‖²/M on heterogeneous data, which G does not bound — so the sampled
    clients are held fixed here. Exact noise variance: Σ_{i,j} ‖(I − γA_i)^{K−j}‖_F² G²/(d B M²).
    """
    rng = np.random.default_rng(17)
    inst = random_instance(3, 4, 1.0, 10.0, rng)
    K, G, B, M, draws = 6, 2.0, 4, 3, 40_000
    x = rng.standard_normal(4)
    bound = message_variance_bound(K, G, M, B)
    variances = []
    for gamma in (0.0, 0.1 / inst.L, 0.5 / inst.L, 0.9 / inst.L):
        coeffs, noise = theta_sum(K).coeffs, G / np.sqrt(inst.dim * B)
        mean = client_messages(inst.A, inst.c, x[None], 0.0, gamma, coeffs, 0.0, None).mean(axis=1)
        q = client_messages(
            inst.A, inst.c, np.broadcast_to(x, (draws, 4)), 0.0, gamma, coeffs, noise, rng
        ).mean(axis=1)
        var = float(np.mean(np.sum((q - mean) ** 2, axis=1)))
        M_pow = [
            np.linalg.matrix_power(np.eye(4) - gamma * A, K - j)
            for A in inst.A
            for j in range(1, K + 1)
        ]
        exact = sum(np.sum(m**2) for m in M_pow) * noise**2 / M**2
        assert var == pytest.approx(exact, rel=0.03)
        assert exact <= bound * (1 + 1e-12)
        variances.append(var)
    assert variances[0] == pytest.approx(bound, rel=0.03)
    assert np.all(np.diff(variances) < 0)
    # ‖q‖ decreases as γ grows (γ < 1/L): single client, no noise, several points x
    one = random_instance(1, 5, 1.0, 10.0, rng)
    gammas = np.linspace(0, 0.99 / one.L, 60)
    for xx in rng.standard_normal((5, 5)):
        norms = [
            np.linalg.norm(client_messages(one.A, one.c, xx[None], 0.0, g, np.ones(8), 0.0, None))
            for g in gammas
        ]
        assert np.all(np.diff(norms) < 0)


def test_18_constant_gamma_plateaus_decaying_rates_reach_x_star():
    """Heterogeneous quadratic, Θ_{1:5}, M = 3 of 10 clients, G = 1, 64 vectorised runs.

    Decaying run: Theorem 29 schedules. Constant-γ run: γ = 0.5/L with the Theorem 27 server
    schedule, which converges to x*_γ (not x*). Reduced from 2·10⁴ to 8000 rounds.
    """
    rng = np.random.default_rng(7)
    inst = random_instance(10, 5, 1.0, 10.0, rng)
    mu, L, K, x_star, T = inst.mu, inst.L, 5, inst.x_star(), 8000
    gamma = 0.5 / L
    plateau = np.linalg.norm(surrogate_minimizer(inst, 0.0, gamma, theta_sum(K)) - x_star)
    runs = {}
    for name, sched in (
        ("decay", Thm29Schedule(mu, L, K)),
        ("const", Thm27Schedule(mu, L, K, gamma)),
    ):
        cfg = LocalUpdateConfig(
            theta_sum(K), 0.0, 1.0, clients_per_round=3, grad_noise=1.0, schedule=sched
        )
        res = simulate(
            inst, cfg, np.zeros(5), T, np.random.default_rng(8), runs=64, record_every=500
        )
        runs[name] = (res.recorded_rounds, ((res.iterates - x_star) ** 2).sum(-1).mean(-1))
    t, err = runs["decay"]
    late = t >= 1000
    slope = np.polyfit(np.log(t[late] + Thm29Schedule(mu, L, K).b), np.log(err[late]), 1)[0]
    assert -1.6 < slope < -0.6  # E‖x_t − x*‖² keeps falling ~1/t
    assert err[-1] < 0.1 * plateau**2
    # Theorem 29's bound (2ν + 16σ_c²κ²)/(b + t), t counted from 1
    _, s_c = heterogeneity(inst)
    sched = Thm29Schedule(mu, L, K)
    g1 = sched.rates(1)[0]
    x1_gap = np.linalg.norm(surrogate_minimizer(inst, 0.0, g1, theta_sum(K)))
    nu_ = max(18 / (mu**2 * K * 3 * 1), (sched.b + 1) * x1_gap**2)
    assert np.all(err <= (2 * nu_ + 16 * s_c**2 * (L / mu) ** 2) / (sched.b + t + 1))
    _, err_c = runs["const"]
    assert err_c[-1] == pytest.approx(plateau**2, rel=0.2)  # plateau at ‖x*_γ − x*‖
    assert np.all(err_c[late] > 0.5 * plateau**2)
