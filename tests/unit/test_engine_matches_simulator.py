"""The PyTorch engine and the float64 simulator (``trainers/theory/simulate.py``) run the same
stochastic LocalUpdate.

The science tests trust :func:`~fedtune.trainers.theory.simulate` as the reference for
LocalUpdate on quadratics (docs/explanation/algorithms.md §1.3, §3;
Charles & Konečný 2021 (arXiv:2103.05032) §2.1, Charles & Konečný 2020 (arXiv:2007.00878) §2.1).
Here both run mini-batch rounds with partial participation on one instance. The engine draws its
cohorts and batch rows from its seeds; the simulator is fed the same streams through its own seams:
a :class:`ClientPool` that returns the engine's cohort of each round, and a noise source whose
``standard_normal`` returns, for every local step, the mean ξ̄ of the engine's batch rows (the only
stochastic term of the quadratic gradient A_i(y − c_i) + ξ̄) divided by the simulator's noise scale.
The iterates agree to 1e-12 every round; a simulator fed another stream does not.
"""

from __future__ import annotations

from collections import deque

import numpy as np
import pytest

from fedtune.trainers import Trainer
from fedtune.trainers.theory import (
    LocalUpdateConfig,
    simulate,
    theta_from_coeffs,
    theta_last,
    theta_sum,
)

D, CLIENTS, EXAMPLES, M, K, B, ROUNDS = 3, 8, 10, 3, 4, 2, 12
GRAD_NOISE = 1.0  # any value > 0: the stub rescales ξ̄ by the simulator's noise scale


def engine_config(algorithm: str, hparams: dict, **train) -> dict:
    return {
        "task": {
            "name": "quadratic",
            "clients": CLIENTS,
            "dim": D,
            "examples": EXAMPLES,
            "noise": 2.0,
            "L": 4.0,
            "init_scale": 3.0,
            "seed": 11,
        },
        "algorithm": algorithm,
        "train": {
            "rounds": ROUNDS,
            "clients_per_round": M,
            "local_steps": K,
            "batch_size": B,
            "eval_every": 10**6,
            "dtype": "float64",
            **train,
        },
        "hparams": hparams,
        "seed": 5,
    }


class EngineStreams:
    """The engine's cohort and per-step batch noise, replayed to the simulator.

    ``sample`` is the :class:`~fedtune.trainers.theory.simulate.ClientPool` seam (one call per
    round); ``standard_normal`` the noise seam (one call per local step, shape [runs, M, d]).
    """

    def __init__(self, trainer: Trainer, rounds: int) -> None:
        inst = trainer.task.meta["instance"]
        self.A, self.c, self.p, self.dim = inst.A, inst.c, inst.p, inst.dim
        self.cohorts: deque[np.ndarray] = deque()
        self.noise: deque[np.ndarray] = deque()
        scale = GRAD_NOISE / np.sqrt(D * B)
        for t in range(rounds):
            cohort = trainer._cohort(t)
            clients = cohort.clients.cpu()
            rows = trainer._view(clients).inputs[cohort.batches.cpu()].numpy()  # [M, K, B, ·]
            xi_bar = rows[..., D * D + D :].mean(axis=2)  # [M, K, d]
            self.cohorts.append(clients.numpy())
            self.noise.extend(xi_bar[:, k][None] / scale for k in range(xi_bar.shape[1]))
            assert np.abs(xi_bar).max() > 0.1  # the batches really are noisy

    def full(self):
        raise AssertionError("the comparison is with partial participation")

    def sample(self, rng, runs: int, m: int):
        idx = self.cohorts.popleft()
        assert runs == 1 and m == len(idx)
        return self.A[idx][None], self.c[idx][None]

    def standard_normal(self, shape):
        out = self.noise.popleft()
        assert out.shape == tuple(shape)
        return out


def engine_iterates(cfg: dict) -> tuple[Trainer, np.ndarray]:
    trainer = Trainer(cfg)
    xs = [trainer.state.params["x"].numpy().copy()]
    while not trainer.done:
        trainer.step()
        xs.append(trainer.state.params["x"].numpy().copy())
    return trainer, np.stack(xs)


def simulated_iterates(cfg: dict, sim: LocalUpdateConfig, streams_from=None) -> np.ndarray:
    fresh = Trainer(cfg)  # the same seeds: the same x₀, cohorts and batches as the engine run
    streams = EngineStreams(streams_from or fresh, ROUNDS)
    x0 = fresh.state.params["x"].numpy()
    res = simulate(streams, sim, x0, ROUNDS, rng=streams, record_every=1)
    assert not streams.cohorts and not streams.noise  # every draw was consumed, no more
    return res.iterates[:, 0]


GAMMA, ETA = 0.07, 0.1
CASES = {
    "fedavg": ({"client_lr": GAMMA, "server_lr": ETA}, {"theta": theta_sum(K)}),
    "fedprox": (
        {"client_lr": GAMMA, "server_lr": ETA, "prox_alpha": 0.8},
        {"theta": theta_sum(K), "prox_alpha": 0.8},
    ),
    "fomaml": ({"client_lr": GAMMA, "server_lr": ETA}, {"theta": theta_last(K)}),
    "local_update": (
        {"client_lr": GAMMA, "server_lr": ETA, "theta": [0.5, 0.0, 2.0, 1.0]},
        {"theta": theta_from_coeffs([0.5, 0.0, 2.0, 1.0])},
    ),
    "fedavgm": (
        {"client_lr": GAMMA, "server_lr": 0.04, "server_momentum": 0.6},
        {"theta": theta_sum(K), "server_opt": "heavy_ball", "server_momentum": 0.6},
    ),
    "fedavgm-nesterov-keras": (
        {
            "client_lr": GAMMA,
            "server_lr": 0.04,
            "server_momentum": 0.6,
            "server_opt": "nesterov",
            "nesterov_form": "keras",
        },
        {
            "theta": theta_sum(K),
            "server_opt": "nesterov",
            "server_momentum": 0.6,
            "nesterov_form": "keras",
        },
    ),
    "fedavgm-nesterov-theory": (
        {
            "client_lr": GAMMA,
            "server_lr": 0.04,
            "server_momentum": 0.6,
            "server_opt": "nesterov",
            "nesterov_form": "theory",
        },
        {
            "theta": theta_sum(K),
            "server_opt": "nesterov",
            "server_momentum": 0.6,
            "nesterov_form": "theory",
        },
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_minibatch_partial_participation_rounds_match_the_simulator(case):
    hparams, sim_kw = CASES[case]
    cfg = engine_config(case.split("-")[0], hparams)
    trainer, engine = engine_iterates(cfg)
    sim = LocalUpdateConfig(
        client_lr=hparams["client_lr"],
        server_lr=hparams["server_lr"],
        clients_per_round=M,
        batch_size=B,
        grad_noise=GRAD_NOISE,
        **sim_kw,
    )
    simulated = simulated_iterates(cfg, sim)
    assert engine.shape == simulated.shape == (ROUNDS + 1, D)
    np.testing.assert_allclose(engine, simulated, rtol=0, atol=1e-12)
    moved = np.linalg.norm(engine[1:] - engine[:-1], axis=1)
    assert moved.min() > 1e-3  # every round did something
    # the cohorts really are partial and change between rounds
    cohorts = {tuple(sorted(trainer._cohort(t).clients.tolist())) for t in range(ROUNDS)}
    assert len(cohorts) > 1 and all(len(c) == M < CLIENTS for c in cohorts)


def test_another_stream_gives_another_trajectory():
    """The agreement is not vacuous: the simulator fed a different seed's cohorts and batches
    leaves the engine's trajectory by far more than the tolerance."""
    hparams, sim_kw = CASES["fedavg"]
    cfg = engine_config("fedavg", hparams)
    _, engine = engine_iterates(cfg)
    other = Trainer({**cfg, "seed": 6})
    sim = LocalUpdateConfig(
        client_lr=GAMMA,
        server_lr=ETA,
        clients_per_round=M,
        batch_size=B,
        grad_noise=GRAD_NOISE,
        **sim_kw,
    )
    simulated = simulated_iterates(cfg, sim, streams_from=other)
    np.testing.assert_allclose(engine[0], simulated[0], rtol=0, atol=0)
    assert np.abs(engine[-1] - simulated[-1]).max() > 1e-3
