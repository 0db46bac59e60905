"""Equivalences of docs/explanation/algorithms.md §1.5/§1.6 and predictions 1, 2, 19, 20 of
§8."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import vmap

from fedtune.trainers import Trainer
from fedtune.trainers.client import ClientRule, make_client_fn
from fedtune.trainers.models.basic import QuadraticModel
from fedtune.trainers.sampling import batch_indices
from fedtune.trainers.tasks import FederatedData, Task
from tests.conftest import quadratic_config


def run(cfg) -> Trainer:
    trainer = Trainer(cfg)
    while not trainer.done:
        trainer.step()
    return trainer


def assert_same_run(
    a: Trainer, b: Trainer, rtol=1e-12, atol=1e-12, keys=("client_loss", "train_loss")
):
    assert len(a.records) == len(b.records)
    for ra, rb in zip(a.records, b.records, strict=True):
        da, db = ra.as_dict(), rb.as_dict()
        for key in keys:
            if key in da:
                assert da[key] == pytest.approx(db[key], rel=rtol, abs=atol), key
    for k in a.state.params:
        torch.testing.assert_close(a.state.params[k], b.state.params[k], rtol=rtol, atol=atol)


def test_fedprox_alpha_zero_is_fedavg():
    a = run(
        quadratic_config(
            "fedprox", hparams={"client_lr": 0.05, "server_lr": 0.1, "prox_alpha": 0.0}
        )
    )
    b = run(quadratic_config("fedavg", hparams={"client_lr": 0.05, "server_lr": 0.1}))
    assert_same_run(a, b, rtol=0, atol=0)


def test_fedprox_alpha_positive_differs():
    a = run(
        quadratic_config(
            "fedprox", hparams={"client_lr": 0.05, "server_lr": 0.1, "prox_alpha": 1.0}
        )
    )
    b = run(quadratic_config("fedavg", hparams={"client_lr": 0.05, "server_lr": 0.1}))
    assert a.records[-1].client_loss != b.records[-1].client_loss


@pytest.mark.parametrize("client_lr", [0.0, 0.05, 0.2])
def test_one_local_step_is_fedsgd_and_minibatch_sgd(client_lr):
    one = {"train": {"local_steps": 1}}
    a = run(quadratic_config("fedavg", hparams={"client_lr": client_lr, "server_lr": 0.1}, **one))
    b = run(quadratic_config("fedsgd", hparams={"server_lr": 0.1}, **one))
    c = run(quadratic_config("minibatch_sgd", hparams={"server_lr": 0.1}, **one))
    assert_same_run(a, b, rtol=0, atol=0)
    assert_same_run(b, c, rtol=0, atol=0)


def test_zero_client_lr_is_fedsgd():  # prediction 19, first half
    a = run(quadratic_config("fedavg", hparams={"client_lr": 0.0, "server_lr": 0.1}))
    b = run(quadratic_config("fedsgd", hparams={"server_lr": 0.1}))
    assert_same_run(a, b, rtol=0, atol=0)
    assert b.records[-1].client_loss < b.records[0].client_loss  # FedSGD makes progress


def test_model_delta_with_zero_client_lr_makes_no_progress():  # prediction 19
    t = run(quadratic_config("fedavg_delta", hparams={"client_lr": 0.0, "server_lr": 1.0}))
    first = Trainer(quadratic_config("fedavg_delta", hparams={"client_lr": 0.0})).state.params
    for k in first:
        assert torch.equal(first[k], t.state.params[k])
    assert len(t.records) == 4 and all(r.update_norm == 0 for r in t.records)
    # no progress: the population loss of every evaluation (rounds 1, 2, 4) is the first one
    train = [r.train_loss for r in t.records if r.train_loss is not None]
    assert len(train) == 3 and train == [train[0]] * 3
    # round 1 sees x_0 in both runs; the client losses vary only because the cohorts do
    moving = run(quadratic_config("fedavg_delta", hparams={"client_lr": 0.05, "server_lr": 1.0}))
    assert t.records[0].client_loss == moving.records[0].client_loss
    assert len({r.client_loss for r in t.records}) > 1
    assert moving.records[-1].train_loss < train[0]  # with γ > 0 the same setting does progress


@pytest.mark.parametrize("gamma", [0.01, 0.1])
def test_original_fedavg_is_localupdate_with_tied_rates(gamma):  # prediction 19
    a = run(quadratic_config("fedavg_vanilla", hparams={"client_lr": gamma}))
    b = run(quadratic_config("fedavg", hparams={"client_lr": gamma, "server_lr": gamma}))
    assert_same_run(a, b)


def test_model_delta_server_lr_is_product():  # prediction 19, last part
    gamma, eta_delta = 0.05, 0.7
    a = run(quadratic_config("fedavg_delta", hparams={"client_lr": gamma, "server_lr": eta_delta}))
    b = run(
        quadratic_config("fedavg", hparams={"client_lr": gamma, "server_lr": eta_delta * gamma})
    )
    assert_same_run(a, b)


def test_lookahead_matches_direct_implementation():  # prediction 20
    gamma, alpha_la, K, rounds = 0.05, 0.5, 4, 5
    cfg = quadratic_config(
        "lookahead",
        hparams={"client_lr": gamma, "server_lr": alpha_la * gamma},
        task={"clients": 1},
        train={"clients_per_round": 1, "local_steps": K, "rounds": rounds},
    )
    t = run(cfg)
    # direct Lookahead: K fast SGD steps from the slow weights, slow ← slow + α(fast − slow)
    tr = Trainer(cfg)
    slow = tr.state.params["x"].clone()
    data = tr.data
    for r in range(rounds):
        rows = batch_indices(cfg["seed"], r, 0, 0, int(data.counts[0]), K, 2, "with_replacement")
        fast = slow.clone()
        for k in range(K):
            g = torch.func.grad(
                lambda x, b=rows[k]: tr.loss_of({"x": x}, data.inputs[b], data.targets[b])
            )(fast)
            fast = fast - gamma * g
        slow = slow + alpha_la * (fast - slow)
    torch.testing.assert_close(t.state.params["x"], slow, rtol=1e-12, atol=1e-12)


def _full_batch_cfg(name, **hp):
    return quadratic_config(
        name, hparams=hp, task={"noise": 0.0}, train={"batch_sampling": "full", "local_steps": 3}
    )


def test_maml_equals_theta_2k_plus_1_with_exact_gd():  # prediction 2 (GD half)
    K = 3
    maml = run(_full_batch_cfg("maml", client_lr=0.05, server_lr=0.1))
    theta = [0.0] * (2 * K) + [1.0]
    lu = run(
        quadratic_config(
            "local_update",
            hparams={"client_lr": 0.05, "server_lr": 0.1, "theta": theta},
            task={"noise": 0.0},
            train={"batch_sampling": "full", "local_steps": 2 * K + 1},
        )
    )
    assert_same_run(maml, lu, rtol=1e-12, atol=1e-13)


def _per_example_quadratic_task(A_z: np.ndarray, c_z: np.ndarray) -> Task:
    d = A_z.shape[1]
    rows = np.concatenate([A_z.reshape(len(A_z), -1), c_z, np.zeros_like(c_z)], axis=1)
    data = FederatedData.from_clients([(torch.from_numpy(rows), torch.zeros(len(rows)))])
    return Task("q", data, lambda g: QuadraticModel(d).double(), lambda out, y: out)


def test_maml_with_sgd_inner_steps_is_biased():  # prediction 2 (SGD half)
    rng = np.random.default_rng(0)
    n, d, gamma = 6, 2, 0.3
    a = rng.standard_normal((n, d)) * 1.5
    A_z = np.einsum("ni,nj->nij", a, a) + 0.1 * np.eye(d)
    c_z = rng.standard_normal((n, d))
    task = _per_example_quadratic_task(A_z, c_z)
    model = task.model_fn(None)
    loss_of = lambda p, x, y: task.loss_fn(torch.func.functional_call(model, p, (x,)), y).mean()  # noqa: E731
    x = {"x": torch.tensor([1.0, -2.0], dtype=torch.float64)}
    lr = torch.tensor(gamma, dtype=torch.float64)
    maml = make_client_fn(loss_of, ClientRule(theta=torch.ones(1), second_order=True))
    # exact expectation over independent single-example batches (all n² pairs)
    idx = torch.cartesian_prod(torch.arange(n), torch.arange(n)).reshape(n * n, 2, 1)
    inputs = task.train.inputs
    msgs = vmap(maml, in_dims=(None, None, 0, 0))(x, lr, inputs[idx], torch.zeros(n * n, 2, 1))
    expected_maml = msgs["x"].mean(0)
    A = A_z.mean(0)
    c = np.linalg.solve(A, np.einsum("nij,nj->i", A_z, c_z) / n)
    M = np.eye(d) - gamma * A
    theta3 = M @ M @ A @ (x["x"].numpy() - c)
    gap = np.linalg.norm(expected_maml.numpy() - theta3) / np.linalg.norm(theta3)
    assert gap > 0.05, gap  # visibly biased
    # ... while with exact GD (the full batch at every step) it matches Θ_3 exactly
    full = inputs.unsqueeze(0).expand(2, n, -1)
    exact = maml(x, lr, full, torch.zeros(2, n))
    np.testing.assert_allclose(exact["x"].numpy(), theta3, rtol=1e-12)


def test_expected_client_message_is_surrogate_gradient():  # prediction 1
    rng = np.random.default_rng(3)
    d, n, B, K, alpha, gamma = 5, 40, 4, 6, 0.3, 0.05
    q, _ = np.linalg.qr(rng.standard_normal((d, d)))
    A = (q * rng.uniform(1, 4, d)) @ q.T
    c = rng.standard_normal(d)
    xi = rng.standard_normal((n, d)) * 2.0
    xi -= xi.mean(0)
    rows = np.concatenate([np.tile(A.reshape(1, -1), (n, 1)), np.tile(c, (n, 1)), xi], axis=1)
    task_inputs = torch.from_numpy(rows)
    model = QuadraticModel(d).double()
    loss_of = lambda p, x, y: torch.func.functional_call(model, p, (x,)).mean()  # noqa: E731
    theta = torch.from_numpy(rng.uniform(0, 1, K))
    fn = make_client_fn(loss_of, ClientRule(theta=theta, prox_alpha=alpha))
    x = {"x": torch.from_numpy(rng.standard_normal(d))}
    lr = torch.tensor(gamma, dtype=torch.float64)
    total, runs, chunk = torch.zeros(d, dtype=torch.float64), 200_000, 20_000
    gen = torch.Generator().manual_seed(0)
    for _ in range(runs // chunk):
        idx = torch.randint(0, n, (chunk, K, B), generator=gen)
        total += vmap(fn, in_dims=(None, None, 0, 0))(
            x, lr, task_inputs[idx], torch.zeros(chunk, K, B)
        )["x"].sum(0)
    mean = (total / runs).numpy()
    step = np.eye(d) - gamma * (A + alpha * np.eye(d))
    Q = sum(float(theta[k]) * np.linalg.matrix_power(step, k) for k in range(K))
    expected = Q @ A @ (x["x"].numpy() - c)
    rel = np.linalg.norm(mean - expected) / np.linalg.norm(expected)
    assert rel < 0.01, rel
