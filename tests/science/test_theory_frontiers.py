"""docs/explanation/algorithms.md §8 predictions 12–14: FedProx and MAML (ρ, Δ) frontiers vs
FedAvg.

Source: Charles & Konečný 2021 (arXiv:2103.05032) §5 (Figs 3–5), App. D.1; the cusp location is
docs/explanation/algorithms.md §3.11 **[DERIVED]**. "Lies on the FedAvg curve" is checked two ways:
(a) an α = 0 FedAvg setting (real-valued K found by root finding) attains exactly the same (ρ, Δ);
(b) the point is within interpolation error of the independently computed FedAvg K-sweep.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy.optimize import brentq

from fedtune.trainers.theory import (
    delta_eq17,
    frontier,
    log_int_grid,
    log_kappa_closed_form,
    maml_cusp,
    rate_from_log_kappa,
    universal_delta,
)

MU, L = 1.0, 10.0
LOG_K0 = np.log(L / MU)
KS = log_int_grid(1, 10**6, 400)


def _fedavg_match(log_kappa: float, gamma: float) -> float:
    """Real K ≥ 1 with log κ_FedAvg(α=0, γ, K) = log_kappa (κ_FedAvg decreases from κ₀ to 1)."""
    if log_kappa >= LOG_K0 - 1e-13:
        return 1.0

    def gap(log_k):
        return float(log_kappa_closed_form(MU, L, 0.0, gamma, "sum", np.exp(log_k))) - log_kappa

    return float(np.exp(brentq(gap, 0.0, np.log(1e9), xtol=1e-14, rtol=1e-14)))


def _assert_on_fedavg_curve(curve, gamma_fedavg: float, opt: str) -> None:
    for lk, rho, delta in zip(curve.log_kappa, curve.rho, curve.delta, strict=True):
        K_match = _fedavg_match(float(lk), gamma_fedavg)
        lk_avg = log_kappa_closed_form(MU, L, 0.0, gamma_fedavg, "sum", K_match)
        assert rate_from_log_kappa(lk_avg, opt) == pytest.approx(rho, abs=1e-10)
        assert delta_eq17(lk_avg, LOG_K0) == pytest.approx(delta, abs=1e-10)
    ref = frontier(
        MU, L, 0, "sum", "K", log_int_grid(1, 10**7, 4000), gamma=gamma_fedavg, server_opt=opt
    )
    order = np.argsort(ref.rho)
    interp = np.interp(curve.rho, ref.rho[order], ref.delta[order])
    assert np.max(np.abs(interp - curve.delta)) < 2e-3


@pytest.mark.parametrize("alpha", [0.5, 1.0, 5.0])
def test_12_fedprox_frontier_is_a_subset_of_fedavg(alpha):
    prox = frontier(MU, L, alpha, "sum", "K", KS, gamma="half-L")
    _assert_on_fedavg_curve(prox, 0.5 / L, "gd")
    k_min = (L / MU) * (MU + alpha) / (L + alpha)
    assert prox.kappa.min() == pytest.approx(k_min, rel=1e-9)
    assert prox.kappa.min() == pytest.approx({0.5: 1.43, 1.0: 1.82, 5.0: 4.0}[alpha], abs=5e-3)
    # FedProx cannot reach the one-shot-averaging end ρ → 0 that FedAvg reaches
    fedavg = frontier(MU, L, 0.0, "sum", "K", KS, gamma="half-L")
    assert fedavg.rho.min() < 1e-12 < 0.1 * prox.rho.min()


@pytest.mark.parametrize("opt", ["gd", "nesterov", "heavy_ball"])
def test_13_analytic_maml_frontier_is_a_subset_of_fedavg(opt):
    """Θ_K with γ = 1/(2LK) (so γ < 1/(KL)); FedAvg Θ_{1:K} with γ = 0.001 (Fig. 4)."""
    maml = frontier(MU, L, 0, "last", "K", KS, gamma="half-KL", server_opt=opt)
    _assert_on_fedavg_curve(maml, 0.001, opt)
    fedavg = frontier(MU, L, 0, "sum", "K", KS, gamma=0.001, server_opt=opt)
    assert maml.rho[0] == pytest.approx(fedavg.rho[0], abs=1e-15)  # identical at K = 1
    assert maml.delta[0] == pytest.approx(0.0, abs=1e-15)
    assert maml.rho.min() > fedavg.rho.min() + 0.1  # but MAML covers only part of the arc


def test_14_simulated_maml_cusp():
    """γ = 0.001, L = 10, d = 100, Δ from Lemma 5 (§3.11)."""
    k_c = maml_cusp(MU, L, 0.0, 0.001)
    assert k_c == pytest.approx(255.4, abs=0.05)
    sim = frontier(
        MU, L, 0, "last", "K", np.arange(100, 1001), gamma=0.001, simulated=True, dim=100
    )
    i = int(np.argmin(sim.log_kappa))  # the cusp: ρ turns back while Δ keeps growing
    assert abs(sim.K[i] - k_c) < 3
    assert np.all(np.diff(sim.delta) > 0)
    assert sim.delta[i] == pytest.approx((np.sqrt(10) - 1) / (np.sqrt(10) + 1), abs=1e-3)
    assert sim.rho[i] == pytest.approx(0.30, abs=5e-3)


def test_14_simulated_maml_coincides_then_moves_away():
    grid = log_int_grid(1, 10**6, 300)
    sim = frontier(MU, L, 0, "last", "K", grid, gamma=0.001, simulated=True, dim=100)
    assert np.all((sim.delta >= 0) & (sim.delta <= 1))
    excess = sim.delta - universal_delta(sim.rho, LOG_K0, "gd")  # distance above the FedAvg curve
    small = sim.K <= 100  # K ≲ 1/(γL)
    assert np.max(np.abs(excess[small])) < 1e-12
    moved = (sim.K >= 150) & (sim.rho < 1 - 1e-9)
    assert moved.sum() > 10 and np.all(excess[moved] > 0.01)
    # eq. (17) instead of Lemma 5 would give Δ < 0 once κ > κ₀ ([AMBIGUITY] of §3.11)
    assert np.min(delta_eq17(sim.log_kappa, LOG_K0)) < 0


def test_14_small_dimension_is_noisy_large_dimension_is_stable():
    """Between 1/(γL) = 100 and beyond the cusp ρ depends on interior eigenvalues of A."""
    Ks = [150, 200, 300, 400]
    spread = {}
    for d in (5, 100):
        rhos = [
            frontier(MU, L, 0, "last", "K", Ks, gamma=0.001, simulated=True, dim=d, seed=s).rho
            for s in range(20)
        ]
        spread[d] = np.std(rhos, axis=0)
    assert np.all(spread[5] > 1e-3) and np.all(spread[5] > 50 * spread[100])
