"""FedNova (Wang et al. 2020, normalized averaging) on top of heterogeneous local work."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from fedtune.trainers import Trainer
from fedtune.trainers.algorithms.fednova import normalized_averaging, step_weight_norms
from tests.conftest import quadratic_config


def run(cfg) -> Trainer:
    trainer = Trainer(cfg)
    while not trainer.done:
        trainer.step()
    return trainer


def _epochs(cfg: dict, epochs: float) -> dict:
    cfg["train"] = {k: v for k, v in cfg["train"].items() if k != "local_steps"}
    cfg["train"]["local_epochs"] = epochs
    return cfg


SERVERS = [
    {"server_opt": "sgd"},
    {"server_opt": "momentum", "server_momentum": 0.9},
    {"server_opt": "nesterov", "server_momentum": 0.9},
    {"server_opt": "adam"},
]


@pytest.mark.parametrize("server", SERVERS, ids=lambda s: s["server_opt"])
@pytest.mark.parametrize("mode", ["local_steps", "local_epochs"])
def test_equal_steps_fednova_equals_fedavg(server, mode):
    """τ_i = τ for every client ⇒ τ_eff Σ p_i q_i/τ = Σ p_i q_i: the same run (to 1e-12)."""
    hp = {"client_lr": 0.05, "server_lr": 0.05, **server}
    runs = {}
    for alg in ("fedavg", "fednova"):
        cfg = quadratic_config(alg, hparams=hp, train={"rounds": 6, "weighting": "examples"})
        runs[alg] = run(_epochs(cfg, 0.75) if mode == "local_epochs" else cfg)  # τ = 3 = K
    a, n = runs["fedavg"], runs["fednova"]
    for ra, rn in zip(a.records, n.records, strict=True):
        assert rn.extra["fednova_tau_eff"] == pytest.approx(3.0, rel=1e-15)
        assert rn.client_loss == pytest.approx(ra.client_loss, rel=1e-12, abs=1e-12)
        assert rn.update_norm == pytest.approx(ra.update_norm, rel=1e-12, abs=1e-12)
    for k in a.state.params:
        torch.testing.assert_close(n.state.params[k], a.state.params[k], rtol=1e-12, atol=1e-12)
    assert not torch.equal(
        a.state.params["x"], Trainer(quadratic_config("fedavg")).state.params["x"]
    )


def test_equal_steps_fednova_with_prox_equals_fedprox():
    hp = {"client_lr": 0.05, "server_lr": 0.05, "prox_alpha": 0.5}
    a = run(quadratic_config("fedprox", hparams=hp))
    n = run(quadratic_config("fednova", hparams=hp))
    torch.testing.assert_close(n.state.params["x"], a.state.params["x"], rtol=1e-12, atol=1e-12)


def test_unequal_steps_fednova_differs_from_fedavg():
    hp = {"client_lr": 0.05, "server_lr": 0.05}
    task = {"examples": 2, "examples_max": 12}
    out = {}
    for alg in ("fedavg", "fednova"):
        out[alg] = run(_epochs(quadratic_config(alg, hparams=hp, task=task), 1.0))
    diff = (out["fedavg"].state.params["x"] - out["fednova"].state.params["x"]).abs().max()
    assert diff > 1e-3


def test_normalizers():
    steps = torch.tensor([1, 3, 6])
    assert step_weight_norms(steps, 0.1, 0.0).tolist() == [1.0, 3.0, 6.0]
    rho = 1 - 0.1 * 0.5  # proximal: ‖a_i‖₁ = Σ_{j<τ_i} (1 − γα)^j
    expected = [sum(rho**j for j in range(t)) for t in (1, 3, 6)]
    torch.testing.assert_close(
        step_weight_norms(steps, 0.1, 0.5), torch.tensor(expected, dtype=torch.float64)
    )
    msgs = {"x": torch.tensor([[3.0], [12.0]], dtype=torch.float64)}  # τ = 1, 4
    w = torch.tensor([0.25, 0.75], dtype=torch.float64)
    q, diag = normalized_averaging(msgs, w, torch.tensor([1, 4]), 0.1)
    tau_eff = 0.25 * 1 + 0.75 * 4
    assert diag["fednova_tau_eff"] == tau_eff
    assert float(q["x"]) == pytest.approx(tau_eff * (0.25 * 3.0 / 1 + 0.75 * 12.0 / 4))


# -- the fixed point: FedNova reaches F's minimiser, FedAvg a τ-weighted surrogate's ----------

GAMMA = 0.005


def _quadratic(alg: str, gamma: float, eta: float, rounds: int) -> dict:
    """5 deterministic quadratic clients (noise 0: every step is an exact GD step) with
    n_i in [2, 24], B = 4, E = 1 ⇒ τ_i = ⌈n_i/4⌉ differ; full participation, p_i = n_i/n."""
    return {
        "task": {
            "name": "quadratic",
            "clients": 5,
            "dim": 3,
            "examples": 2,
            "examples_max": 24,
            "noise": 0.0,
            "L": 4.0,
            "mu": 1.0,
            "seed": 3,
        },
        "algorithm": alg,
        "train": {
            "rounds": rounds,
            "clients_per_round": 5,
            "local_epochs": 1.0,
            "batch_size": 4,
            "eval_every": 1000,
            "dtype": "float64",
            "weighting": "examples",
        },
        "hparams": {"client_lr": gamma, "server_lr": eta},
        "seed": 0,
    }


def _theory(trainer: Trainer, gamma: float):
    """Closed forms: local GD gives q_i = P_i (x − c_i), P_i = (I − (I − γA_i)^τ_i)/γ."""
    inst = trainer.task.meta["instance"]
    A, c = inst.A, inst.c
    n = trainer.data.counts.numpy()
    p, tau = n / n.sum(), np.ceil(n / 4).astype(int)
    eye = np.eye(A.shape[1])
    P = [(eye - np.linalg.matrix_power(eye - gamma * A[i], tau[i])) / gamma for i in range(len(p))]

    def solve(w, M):
        return np.linalg.solve(
            sum(wi * m for wi, m in zip(w, M, strict=True)),
            sum(wi * m @ ci for wi, m, ci in zip(w, M, c, strict=True)),
        )

    tau_eff = float(p @ tau)
    return {
        "tau": tau,
        "x_star": solve(p, A),  # minimiser of F = Σ p_i f_i
        "x_tilde": solve(p * tau, A),  # of FedAvg's surrogate Σ p_i τ_i f_i (paper Thm 1)
        "fedavg": solve(p, P),
        "fednova": solve(p / tau, P),
        "H": {
            "fedavg": sum(pi * m for pi, m in zip(p, P, strict=True)),
            "fednova": tau_eff * sum(pi / t * m for pi, m, t in zip(p, P, tau, strict=True)),
        },
    }


def _limit(alg: str, gamma: float) -> tuple[np.ndarray, dict]:
    theory = _theory(Trainer(_quadratic(alg, gamma, 1.0, 1)), gamma)
    lam = np.linalg.eigvals(theory["H"][alg]).real
    trainer = run(_quadratic(alg, gamma, 2.0 / (lam.max() + lam.min()), 80))
    return trainer.state.params["x"].numpy(), theory


def test_fednova_fixed_point_is_the_minimiser_fedavg_is_biased():
    x_avg, th = _limit("fedavg", GAMMA)
    x_nova, _ = _limit("fednova", GAMMA)
    assert len(set(th["tau"].tolist())) >= 3  # really heterogeneous local work
    # the engine's limits are the closed-form fixed points
    np.testing.assert_allclose(x_avg, th["fedavg"], rtol=0, atol=1e-10)
    np.testing.assert_allclose(x_nova, th["fednova"], rtol=0, atol=1e-10)
    gap = np.linalg.norm(th["x_tilde"] - th["x_star"])  # the objective inconsistency
    bias_avg = np.linalg.norm(x_avg - th["x_star"])
    bias_nova = np.linalg.norm(x_nova - th["x_star"])
    assert gap > 0.03
    # FedAvg sits at the τ-weighted surrogate's minimiser (paper Thm 1), far from x*
    assert bias_avg > 0.9 * gap
    assert np.linalg.norm(x_avg - th["x_tilde"]) < 0.1 * gap
    # FedNova is within O(γ) of x* (the γ-drift every local method has), 10× closer than FedAvg
    assert bias_nova < 0.1 * bias_avg
    x_nova_half, th_half = _limit("fednova", GAMMA / 2)
    bias_half = np.linalg.norm(x_nova_half - th_half["x_star"])
    assert 0.4 * bias_nova < bias_half < 0.6 * bias_nova  # → 0 as γ → 0; FedAvg's does not
    bias_avg_half = np.linalg.norm(_limit("fedavg", GAMMA / 2)[0] - th_half["x_star"])
    assert bias_avg_half > 0.9 * bias_avg
