"""Predictions 22–36 of docs/explanation/algorithms.md §8 for GradAlign/FedGA/SCAFFOLD
(Dandi et al. 2021 (arXiv:2106.13897)), Mixed FL (Augenstein et al. 2022 (arXiv:2205.13655)) and
FedAvg-MaSS (Qu et al. 2020 (arXiv:2007.05690)). Each test states its pass criterion; measured
numbers are in the comments (2-core CPU, float64)."""

from __future__ import annotations

import copy
import itertools

import numpy as np
import pytest
import torch

from fedtune.extend import Dataset, FederatedData, Task, register_task
from fedtune.trainers import Trainer, build_task, run_trial
from fedtune.trainers.algorithms import RoundContext
from fedtune.trainers.algorithms.dissimilarity import quadratic_alignment
from fedtune.trainers.algorithms.gradalign import local_sgd_fn
from fedtune.trainers.algorithms.mixed import movie_cost_model


def trainer(
    name: str,
    task: dict,
    train: dict,
    hparams: dict | None = None,
    extras: dict | None = None,
    seed: int = 0,
) -> Trainer:
    """A float64 Trainer from a trial config; ``extras`` (the method's own hyperparameters) go
    into ``hparams`` like any other, so the real config path builds the algorithm."""
    cfg = {
        "task": task,
        "algorithm": name,
        "seed": seed,
        "hparams": {**(hparams or {}), **(extras or {})},
        "train": {"eval_every": 10**6, "batch_size": 1, "dtype": "float64", **train},
    }
    return Trainer(cfg)


def param(t: Trainer) -> np.ndarray:
    return next(iter(t.state.params.values())).numpy().copy()


# -- predictions 22–26: GradAlign, FedGA, SCAFFOLD --------------------------------------------
def test_22_gradalign_is_gradient_descent_on_f_plus_beta_r():
    """One GradAlign step = one GD step on f + βr (1e-14); its fixed point argmin(f + βr) has
    smaller r than argmin f."""
    params = {"clients": 5, "dim": 5, "noise": 0.0, "init_scale": 5.0}
    quad = {"name": "quadratic", "seed": 4, **params}
    inst = build_task("quadratic", params, 4).meta["instance"]
    A, c, p, beta = inst.A, inst.c, inst.p, 0.5
    H = np.einsum("i,ijk->jk", p, A)
    b = np.einsum("i,ijk,ik->j", p, A, c)
    D = A - H[None]
    e = np.einsum("ijk,ik->ij", A, c) - b[None]
    H_beta = H + beta * np.einsum("i,ijk,ikl->jl", p, D, D)
    x_beta = np.linalg.solve(H_beta, b + beta * np.einsum("i,ijk,ik->j", p, D, e))
    eta = 1.0 / np.linalg.eigvalsh(H_beta).max()
    t = trainer(
        "gradalign",
        quad,
        {"rounds": 400, "clients_per_round": 5},
        {"server_lr": eta},
        {"ga_beta": beta},
    )
    x0 = param(t)
    t.step()
    _, grad_r = quadratic_alignment(A, c, p, x0)
    np.testing.assert_allclose(
        param(t), x0 - eta * (H @ x0 - b + beta * grad_r), rtol=0, atol=1e-14
    )
    while not t.done:
        t.step()
    assert np.linalg.norm(param(t) - x_beta) < 1e-8 * np.linalg.norm(x0 - x_beta)
    x_star = np.linalg.solve(H, b)
    r_beta, _ = quadratic_alignment(A, c, p, x_beta)
    r_star, _ = quadratic_alignment(A, c, p, x_star)
    assert r_beta < r_star  # measured: 10.89 vs 11.14


def test_23_sgd_minus_gd_over_orderings_is_the_alignment_gradient():
    """E_order[x_SGD − x_GD] = −(Kα²/2)∇r_A + O(α³): relative error shrinks ∝ α."""
    rng = np.random.default_rng(23)
    K, d = 4, 5
    A = np.stack(
        [
            (lambda q: q @ np.diag(rng.uniform(1, 4, d)) @ q.T)(
                np.linalg.qr(rng.standard_normal((d, d)))[0]
            )
            for _ in range(K)
        ]
    )
    c = rng.standard_normal((K, d))
    x0 = rng.standard_normal(d)
    errors = []
    for alpha in (1e-2, 1e-3):
        sgd = []
        for order in itertools.permutations(range(K)):
            x = x0.copy()
            for a in order:
                x = x - alpha * A[a] @ (x - c[a])
            sgd.append(x)
        x = x0.copy()
        for _ in range(K):
            x = x - alpha * np.einsum("ijk,ik->j", A, x[None] - c) / K
        _, grad_r = quadratic_alignment(A, c, np.full(K, 1 / K), x0)
        predicted = -(K * alpha**2 / 2) * grad_r
        errors.append(np.linalg.norm(np.mean(sgd, 0) - x - predicted) / np.linalg.norm(predicted))
    assert errors[0] < 0.1  # measured 4.3e-2 and 4.3e-3
    assert 7 < errors[0] / errors[1] < 13  # ∝ α (ratio 10)


def _one_round(name: str, alpha: float, K: int, extras: dict | None = None):
    quad = {
        "name": "quadratic",
        "clients": 5,
        "dim": 5,
        "noise": 0.0,
        "L": 4.0,
        "seed": 0,
        "init_scale": 3.0,
    }
    hp = {"server_lr": alpha} if name == "gradalign" else {"client_lr": alpha, "server_lr": alpha}
    t = trainer(name, quad, {"rounds": 1, "clients_per_round": 5, "local_steps": K}, hp, extras)
    x0 = param(t)
    t.step()
    return x0, param(t), t.task.meta["instance"]


def test_24_fedga_and_scaffold_shift_fedavg_along_grad_r():
    """x_FedGA − x_FedAvg ≈ −αβK∇r and x_SCAFFOLD − x_FedAvg ≈ −α²K(K−1)/2 ∇r: relative error
    ∝ α at K = 5 (measured 9.6 %→0.99 % and 4.9 %→0.50 %), exact at K = 1."""
    beta, errs = 0.5, {"fedga": [], "scaffold_ga": []}
    for K in (1, 5):
        for alpha in (1e-2, 1e-3):
            x0, x_avg, inst = _one_round("fedavg", alpha, K)
            _, x_ga, _ = _one_round("fedga", alpha, K, {"ga_beta": beta})
            _, x_sc, _ = _one_round("scaffold_ga", alpha, K)
            _, grad_r = quadratic_alignment(inst.A, inst.c, inst.p, x0)
            pred_ga, pred_sc = -alpha * beta * K * grad_r, -(alpha**2) * K * (K - 1) / 2 * grad_r
            err_ga = np.linalg.norm(x_ga - x_avg - pred_ga) / np.linalg.norm(pred_ga)
            if K == 1:
                assert err_ga < 1e-10
                assert np.abs(x_sc - x_avg).max() < 1e-15
                continue
            errs["fedga"].append(err_ga)
            errs["scaffold_ga"].append(
                np.linalg.norm(x_sc - x_avg - pred_sc) / np.linalg.norm(pred_sc)
            )
    for name, (big, small) in errs.items():
        assert big < 0.15, name
        assert 7 < big / small < 13, name


def test_25_fedga_forms_and_equal_hessian_equivalences():
    """Alg. 2 ≡ Alg. 3 (same batches, Σ w_i v_i = 0); FedGA(K=1) ≡ GradAlign; equal client
    Hessians ⇒ FedGA ≡ SCAFFOLD-GA ≡ FedAvg — all to 1e-12 over 15 stochastic rounds."""
    quad = {"name": "quadratic", "clients": 12, "dim": 6, "noise": 1.0, "examples": 20, "seed": 5}
    train = {"rounds": 15, "clients_per_round": 4, "local_steps": 5, "batch_size": 3}
    hp = {"client_lr": 0.03, "server_lr": 0.05}

    def final(name, task=quad, extras=None, **kw):
        t = trainer(
            name, task, {**train, **kw}, hp if name != "gradalign" else {"server_lr": 0.05}, extras
        )
        while not t.done:
            t.step()
        return param(t)

    once = final("fedga", extras={"ga_beta": 0.4})
    np.testing.assert_allclose(
        final("fedga", extras={"ga_beta": 0.4, "ga_form": "every_step"}), once, atol=1e-12
    )
    np.testing.assert_allclose(
        final("fedga", extras={"ga_beta": 0.4}, local_steps=1),
        final("gradalign", extras={"ga_beta": 0.4}, local_steps=1),
        atol=1e-12,
    )
    shared = {
        "name": "mixed_quadratic",
        "clients": 12,
        "dim": 6,
        "noise": 1.0,
        "examples": 20,
        "iid": False,
        "shared_hessian": True,
        "heterogeneity": 2.0,
        "seed": 5,
    }
    fedavg = final("fedavg", shared)
    assert np.abs(fedavg - final("fedavg")).max() > 1e-3  # the instances differ
    np.testing.assert_allclose(final("fedga", shared, {"ga_beta": 0.4}), fedavg, atol=1e-12)
    np.testing.assert_allclose(final("scaffold_ga", shared), fedavg, atol=1e-12)
    assert (
        np.abs(once - final("fedavg")).max() > 1e-3
    )  # with different Hessians FedGA is not FedAvg


def _blobs(iid: bool, seed: int, clients=10, classes=10, dim=10, per_client=100):
    """Gaussian blobs, IID split or one class per client; a test split of 200 per class."""
    rng = np.random.default_rng(seed)
    means = rng.standard_normal((classes, dim)) * 1.5
    y = np.repeat(np.arange(classes), clients * per_client // classes)
    x = means[y] + rng.standard_normal((len(y), dim))
    yt = np.repeat(np.arange(classes), 200)
    xt = means[yt] + rng.standard_normal((len(yt), dim))
    parts = np.array_split(
        rng.permutation(len(y)) if iid else np.argsort(y, kind="stable"), clients
    )
    clients_data = [(torch.from_numpy(x[q]), torch.from_numpy(y[q])) for q in parts]
    return clients_data, Dataset(torch.from_numpy(xt), torch.from_numpy(yt))


def _softmax_model(input_shape, num_outputs) -> torch.nn.Module:
    """Softmax regression started at zero (as in the paper's convex experiments)."""
    model = torch.nn.Linear(input_shape[-1], num_outputs)
    torch.nn.init.zeros_(model.weight)
    torch.nn.init.zeros_(model.bias)
    return model


def _cross_entropy(outputs, targets):
    """−log softmax(o)[y] by ``gather``, as fedtune's own classification loss: under ``vmap``
    ``F.cross_entropy`` runs torch's Python decomposition of ``nll_loss`` (a third of the
    sweep's CPU); the sweep's numbers are the same, bit for bit."""
    return -torch.log_softmax(outputs, -1).gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def _build_blobs(params, seed: int) -> Task:
    clients, test = _blobs(bool(params.get("iid", True)), seed)
    return Task(
        "science_blobs",
        FederatedData.from_clients(clients),
        model_fn=lambda gen: _softmax_model((10,), 10),
        loss_fn=_cross_entropy,
        test=test,
    )


BETAS = (0.0, 0.3, 3.0)


def _fedga_blobs(iid: bool, beta: float) -> tuple[float, float]:
    """FedGA Alg. 2 (``ga_form: once``, full-data displacement, model averaging: server SGD with
    η = α) on all 10 clients, K = 10, B = 20, α = 0.1, 50 rounds. Returns the test loss and the
    engine's ``grad_dissimilarity`` Σ_i w_i ‖∇f_i − ∇f‖ at the last round's broadcast point."""
    t = trainer(
        "fedga",
        {"name": "science_blobs", "iid": iid, "seed": 0},
        {"rounds": 50, "clients_per_round": 10, "local_steps": 10, "batch_size": 20},
        {"client_lr": 0.1, "server_lr": 0.1, "ga_beta": beta},
    )
    while not t.done:
        t.step()
    assert t.outcome == "completed"
    return t.records[-1].test["loss"], t.records[-1].extra["grad_dissimilarity"]


@pytest.fixture(scope="module")
def blob_sweep():
    """Through fedtune's Trainer: the blobs task registered with the extension API (as a user's
    module would), FedGA configured by its hparams."""
    register_task("science_blobs", "Gaussian blobs, IID or one class per client")(_build_blobs)
    return {iid: [_fedga_blobs(iid, b) for b in BETAS] for iid in (True, False)}


def test_26_fedga_reduces_gradient_dissimilarity(blob_sweep):
    """‖∇f − ∇f_i‖ after 50 rounds is lower for FedGA (every β > 0) than for FedAvg (β = 0) and
    falls with β, IID and one-class-per-client (measured β = 0 / 0.3 / 3: IID 0.140 / 0.139 /
    0.130, one class per client 0.766 / 0.591 / 0.344)."""
    for iid, rows in blob_sweep.items():
        dis = [d for _, d in rows]
        assert all(d < dis[0] for d in dis[1:]), iid
        assert dis == sorted(dis, reverse=True), iid
    het = [d for _, d in blob_sweep[False]]
    assert het[-1] < 0.6 * het[0]  # the heterogeneous split is where FedGA aligns most


def test_26_heterogeneous_optimal_beta_is_not_smaller_here(blob_sweep):
    """Prediction 26 expects a smaller optimal β for heterogeneous clients; measured false on this
    convex toy (docs/explanation/algorithms.md §8 prediction 26 is qualitative), so the measured
    ordering is asserted: softmax regression, 10 blobs, K = 10, 50 rounds, β ∈ {0, 0.3, 3}; test
    loss IID 0.1810 / 0.1805 / 0.1759, one class per client 0.2341 / 0.1947 / 0.1740 — both optima
    at the largest β, and the gain from β is far larger with heterogeneous clients
    (−26 % vs −3 %)."""
    losses = {iid: [loss for loss, _ in rows] for iid, rows in blob_sweep.items()}
    best = {iid: BETAS[int(np.argmin(v))] for iid, v in losses.items()}
    assert best[False] == best[True] == 3.0
    assert losses[True] == pytest.approx([0.1810, 0.1805, 0.1759], abs=2e-4)
    assert losses[False] == pytest.approx([0.2341, 0.1947, 0.1740], abs=2e-4)
    gain = {iid: 1 - v[-1] / v[0] for iid, v in losses.items()}
    assert gain[False] > 5 * gain[True]


# -- predictions 27–34: Mixed FL ----------------------------------------------------------
def _mixed(name, task: dict, train: dict, lr: float, extras=None, seed=0) -> Trainer:
    base = {"name": "mixed_quadratic", "dim": 5, "L": 4.0, "seed": 0, "init_scale": 3.0}
    return trainer(name, {**base, **task}, train, {"client_lr": lr}, extras, seed)


def test_27_parallel_training_equals_one_way_transfer_at_k1():
    """K = 1: PT ≡ 1-w GT (η_m = 1, η_c = η·η_s, same central batch) to 1e-12 over 20 rounds
    with client and central noise; the two differ at K = 2."""
    task = {"clients": 10, "noise": 1.0, "central_noise": 1.0, "central_examples": 50}
    for K, same in ((1, True), (2, False)):
        train = {"rounds": 20, "clients_per_round": 10, "local_steps": K, "batch_size": 2}
        pt, gt = _mixed("mixed_pt", task, train, 0.05), _mixed("mixed_gt1", task, train, 0.05)
        for t in (pt, gt):
            while not t.done:
                t.step()
        assert np.allclose(param(pt), param(gt), rtol=0, atol=1e-12) is same


def _rounds_to(name, distance, eps=1e-4, rounds=100, extras=None, whole=True):
    """The first round within ``eps`` of x* (None: not in ``rounds``) and the largest G̃² over
    rounds 10 to the end; ``whole`` False stops at that round (G̃² then None: not measured)."""
    t = _mixed(
        name,
        {"clients": 10, "central_distance": distance},
        {"rounds": rounds, "clients_per_round": 10, "local_steps": 10},
        0.01,
        extras,
    )
    x_star = t.task.meta["x_star"]
    start, hit, g2 = np.linalg.norm(param(t) - x_star), None, []
    while not t.done:
        g2.append(t.step().extra["mixed_G2"])
        if hit is None and np.linalg.norm(param(t) - x_star) < eps * start:
            hit = len(g2)
            if not whole:
                return hit, None
    return hit, max(g2[9:])


def test_28_parallel_training_is_slowed_by_dissimilarity():
    """K = S = 10, deterministic IID clients: with distant minimisers (large G̃) PT does not reach
    ε = 1e-4 in 100 rounds while both GT variants do; with a shared minimiser all three reach it
    within 15 % of each other (measured: GT 64/62 rounds, all three 62–63 with a shared
    minimiser; max G̃² over rounds 10–100: 5.3 vs 0.13)."""
    hits, g2 = {}, {}
    for distance in (3.0, 0.0):
        for name in ("mixed_pt", "mixed_gt1", "mixed_gt2"):
            extras = {"merge_lr": 0.5} if name == "mixed_gt2" else None
            whole = name == "mixed_pt"  # only PT's G̃² is asserted: GT runs stop at their hit
            hits[name, distance], g2[name, distance] = _rounds_to(
                name, distance, extras=extras, whole=whole
            )
    assert hits["mixed_pt", 3.0] is None
    assert hits["mixed_gt1", 3.0] is not None and hits["mixed_gt2", 3.0] is not None
    near = [hits[n, 0.0] for n in ("mixed_pt", "mixed_gt1", "mixed_gt2")]
    assert None not in near and max(near) - min(near) <= 0.15 * min(near)
    assert g2["mixed_pt", 3.0] > 20 * g2["mixed_pt", 0.0]


def _floor(name, batch, K=4, rounds=300, extras=None) -> float:
    """Mean ‖x_t − x*‖² over the last 3/4 of the rounds; noise only in the central gradients."""
    t = _mixed(
        name,
        {"clients": 2, "dim": 3, "central_noise": 5.0, "central_examples": 200, "init_scale": 0.0},
        {"rounds": rounds, "clients_per_round": 2, "local_steps": K},
        0.03,
        {"central_batch_size": batch, **(extras or {})},
    )
    errs = []
    while not t.done:
        t.step()
        errs.append(float(np.sum((param(t) - t.task.meta["x_star"]) ** 2)))
    return float(np.mean(errs[rounds // 4 :]))


def test_29_one_way_transfer_pays_central_noise_times_k():
    """Same |𝓑_c| = S·B: the 1-w GT error floor is ≈ K× PT's (and 2-w GT's, η_m = ½);
    |𝓑_c| = K·S·B for 1-w GT equalises them (measured K = 4: 1-w/PT 3.1, 1-w/2-w 3.5,
    1-w with K·S·B / PT 0.90)."""
    K, b = 4, 2
    pt = _floor("mixed_pt", b, K)
    gt2 = _floor("mixed_gt2", b, K, extras={"merge_lr": 0.5})
    gt1 = _floor("mixed_gt1", b, K)
    gt1_big = _floor("mixed_gt1", K * b, K)
    assert K / 2 < gt1 / pt < 2 * K
    assert K / 2 < gt1 / gt2 < 2 * K
    assert 0.5 < gt1_big / pt < 2


def _excess(t: Trainer) -> float:
    m, x = t.task.meta, param(t)

    def f(z):
        d = z[None] - m["c"]
        fed = 0.5 * np.einsum("ij,ijk,ik->i", d, m["A"], d).mean()
        dc = z - m["c_c"]
        return 0.5 * fed + 0.5 * 0.5 * dc @ m["A_c"] @ dc

    return float(f(x) - f(m["x_star"]))


@pytest.mark.parametrize("name", ["mixed_pt", "mixed_gt1", "mixed_gt2"])
def test_30_lower_lr_with_more_steps_never_hurts(name):
    """(η, K) ∈ {(0.1, 1), (0.05, 2), (0.025, 4)}: the excess loss averaged over rounds 50–100
    does not increase along the sequence (measured PT 6.1e-3 → 2.3e-3 → 1.3e-3, 1-w GT
    6.1e-3 → 2.2e-3 → 1.3e-3, 2-w GT (η_m = 1) 1.3e-2 → 4.6e-3 → 2.7e-3)."""
    losses = []
    for lr, K in ((0.1, 1), (0.05, 2), (0.025, 4)):
        t = _mixed(
            name,
            {
                "clients": 5,
                "dim": 3,
                "noise": 2.0,
                "iid": False,
                "heterogeneity": 1.0,
                "init_scale": 0.0,
            },
            {"rounds": 100, "clients_per_round": 5, "local_steps": K},
            lr,
        )
        vals = []
        while not t.done:
            t.step()
            vals.append(_excess(t))
        losses.append(np.mean(vals[50:]))
    assert losses[0] >= losses[1] >= losses[2]


def _threshold(name: str, K: int = 5, seed: int = 0) -> float:
    """Smallest client lr (η_c = η, η_s = η_m = 1) at which the deterministic round map — affine
    in (x, g̃_c, g̃_f) — has spectral radius > 1, by bisection."""
    t = _mixed(
        name,
        {"clients": 3, "dim": 2, "L": 10.0, "central_distance": 1.0, "seed": seed},
        {"rounds": 1, "clients_per_round": 3, "local_steps": K},
        0.01,
    )
    cohort, d = t._cohort(0), 2
    keys = ("gt_central", "gt_federated") if name == "mixed_gt2" else ()

    def radius(lr):
        ctx = RoundContext(t.runner, t.loss_of, t.data, t.task, lr, 1.0, 0)

        def F(s):
            state = copy.deepcopy(t.state)
            state.params = {"x": torch.tensor(s[:d])}
            for j, k in enumerate(keys):
                state.extra[k] = {"x": torch.tensor(s[d * (j + 1) : d * (j + 2)])}
            new, _ = t.algorithm.apply(state, cohort, ctx)
            return np.concatenate(
                [new.params["x"].numpy()] + [new.extra[k]["x"].numpy() for k in keys]
            )

        n = d * (1 + len(keys))
        f0 = F(np.zeros(n))
        J = np.stack([F(np.eye(n)[j]) - f0 for j in range(n)], 1)
        return float(np.abs(np.linalg.eigvals(J)).max())

    lo, hi = 1e-3, 2.0
    assert radius(lo) < 1 < radius(hi)
    for _ in range(20):
        mid = np.sqrt(lo * hi)
        lo, hi = (mid, hi) if radius(mid) < 1 else (lo, mid)
    return hi


@pytest.fixture(scope="module")
def thresholds():
    return {n: _threshold(n) for n in ("mixed_pt", "mixed_gt1", "mixed_gt2")}


def test_31_two_way_transfer_diverges_before_parallel_training(thresholds):
    """threshold(2-w GT) < threshold(PT) (measured K = 5: 0.042 vs 0.30)."""
    assert thresholds["mixed_gt2"] < thresholds["mixed_pt"]


def test_31_one_way_transfer_diverges_before_parallel_training_on_quadratics(thresholds):
    """The other half of prediction 31 (PT diverges no later than 1-w GT) is measured false here, so
    the measured ordering is what is asserted: 1-w GT applies one central gradient K times (an
    explicit step of size ηK on f_c), so it diverges at η ≈ O(1/(K·L_c)) while PT's K separate
    central steps stay stable up to η ≈ 2/(w_c·L). Measured K = 5, L = 10, seed 0: thresholds
    2-w GT 0.042 < 1-w GT 0.095 < PT 0.30 (seeds 0–3, K ∈ {2, 5, 10}: PT ≥ 1-w in all 12)."""
    pt, gt1, gt2 = (thresholds[n] for n in ("mixed_pt", "mixed_gt1", "mixed_gt2"))
    assert gt2 < gt1 < pt
    assert pt > 2 * gt1  # not a tie within the bisection's resolution (ratio measured 3.2)
    assert (pt, gt1, gt2) == pytest.approx((0.30, 0.095, 0.042), rel=0.05)


def test_32_two_way_upload_trick_recovers_the_client_gradient():
    """With client SGD, −Σ_i Δ_i/(η Σ_i K_i) − g̃_c equals the K_i-weighted mean client gradient
    (1e-12); 2-w GT's stored g̃_f is that quantity and g̃_c = −Δ_c/(η_c K_c) − g̃_f."""
    t = _mixed(
        "mixed_gt2",
        {"clients": 4, "noise": 1.0},
        {"rounds": 2, "clients_per_round": 4, "local_steps": 3, "batch_size": 2},
        0.05,
    )
    t.step()  # non-zero augmenting gradients from round 1
    g_c, g_f = (t.state.extra[k]["x"].clone() for k in ("gt_central", "gt_federated"))
    x, cohort, K, lr = t.state.params, t._cohort(1), 3, 0.05
    fed_loss = lambda p, a, b: 0.5 * t.loss_of(p, a, b)  # noqa: E731 - w_f = 0.5
    out = t.runner.map(
        local_sgd_fn(fed_loss, K),
        (x, torch.tensor(lr, dtype=torch.float64), {"corr": {"x": g_c}}),
        (t.data.inputs[cohort.batches], t.data.targets[cohort.batches], {}),
    )
    recovered = -out["delta"]["x"].sum(0) / (lr * K * cohort.size) - g_c
    recorded = out["graw"]["x"].sum(0) / (K * cohort.size)
    torch.testing.assert_close(recovered, recorded, rtol=1e-12, atol=1e-12)
    t.step()  # the algorithm's own update of g̃_f uses the same clients and batches
    torch.testing.assert_close(t.state.extra["gt_federated"]["x"], recorded, rtol=1e-12, atol=1e-12)
    m = t.task.meta  # central path in closed form (no central noise): x_c ← x_c − η_c (∇f_c + g̃_f)
    xc = x["x"].numpy().copy()
    for _ in range(K):
        xc = xc - lr * (0.5 * m["A_c"] @ (xc - m["c_c"]) + g_f.numpy())
    np.testing.assert_allclose(
        t.state.extra["gt_central"]["x"].numpy(),
        -(xc - x["x"].numpy()) / (lr * K) - g_f.numpy(),
        rtol=0,
        atol=1e-12,
    )


def test_33_mixed_methods_reach_the_oracle_on_label_shift():
    """Clients hold only label 1, the server only label 0: PT, 1-w and 2-w GT reach the oracle's
    balanced test accuracy (± 2 %), FedAvg on the client data stays at ≈ 50 % (measured ≈ 0.836
    for all mixed methods and the oracle, 0.50 for FL only)."""
    train = {
        "rounds": 30,
        "clients_per_round": 10,
        "local_steps": 5,
        "batch_size": 10,
        "eval_every": 30,
    }

    def accuracy(algorithm, task=None, hparams=None):
        cfg = {
            "task": task or {"name": "mixed_labels"},
            "algorithm": algorithm,
            "train": train,
            "hparams": hparams or {"client_lr": 0.5},
        }
        return run_trial(cfg).records[-1].test["accuracy"]

    fed = {"client_lr": 0.5, "server_lr": 0.5}
    oracle = accuracy("fedavg", {"name": "mixed_labels", "oracle": True}, fed)
    assert oracle > 0.8
    for name in ("mixed_pt", "mixed_gt1", "mixed_gt2"):
        assert abs(accuracy(name) - oracle) < 0.02, name
    assert abs(accuracy("fedavg", hparams=fed) - 0.5) < 0.02


def test_34_movie_cost_model_reproduces_the_reported_numbers():
    """d = 16, N = 3954, n = 160, |𝓑| = 16: 494 → 20 / 30 KiB, 125.16 → 0.025 Mflop (99.98 %)."""
    cost = movie_cost_model(vocab=3954, dim=16, local_items=160, batch=16)
    assert cost["client_flop"] == 24_864
    assert round(cost["baseline_flop"] / 1e6, 2) == 125.16
    assert round(cost["client_flop"] / 1e6, 3) == 0.025
    assert round(100 * cost["compute_saving"], 2) == 99.98
    assert round(cost["baseline_kib"]) == 494 and cost["pt_kib"] == 20 and cost["gt_kib"] == 30
    assert 1 - cost["gt_kib"] / cost["baseline_kib"] >= 0.939


# -- predictions 35–36: FedAvg-MaSS ---------------------------------------------------------
def _linreg(name: str, extras=None, hparams=None, rounds=400, **task):
    t = trainer(
        name,
        {"name": "linreg_interp", "seed": 0, **task},
        {
            "rounds": rounds,
            "clients_per_round": task.get("clients", 10),
            "local_steps": 5,
            "batch_size": 2,
        },
        hparams,
        extras,
    )
    w_star, errs = t.task.meta["w_star"], []
    while not t.done:
        if t.step() is None:
            break
        errs.append(float(np.sum((param(t) - w_star) ** 2)))
    return t, np.array(errs)


@pytest.fixture(scope="module")
def mass_runs():
    mass, e_mass = _linreg("fedavg_mass", {"mass_auto": True})
    eta = mass.records[-1].extra["mass_eta1"]
    _, e_sgd = _linreg("fedavg", hparams={"client_lr": eta, "server_lr": eta})
    nesterov, _ = _linreg("fedavg_nesterov", {"mass_auto": True})
    literal, _ = _linreg("fedavg_mass_literal", {"mass_auto": True})
    return {"mass": e_mass, "sgd": e_sgd, "nesterov": nesterov, "literal": literal}


def test_35_mass_accelerates_fedavg_on_interpolating_regression(mass_runs):
    """N = 10, d = 20, n_k = 50, m = 2, E = 5, theorem's hyperparameters from the worst device,
    2000 steps: log‖w̄ − w*‖² ≈ linear, MaSS far below FedAvg-SGD (η = 1/L_m) and Nesterov
    (η₂ = 0) diverges (measured 5.9e-29 vs 5.2e-17; Nesterov diverged after 51 rounds)."""
    e_mass, e_sgd = mass_runs["mass"], mass_runs["sgd"]
    assert len(e_mass) == 400 and e_mass[-1] < 1e-24 and e_mass[-1] < 1e-6 * e_sgd[-1]
    t = np.arange(len(e_mass))
    logs = np.log(e_mass)
    fit = np.polyfit(t, logs, 1)
    r2 = 1 - np.sum((logs - np.polyval(fit, t)) ** 2) / np.sum((logs - logs.mean()) ** 2)
    assert fit[0] < 0 and r2 > 0.95
    assert mass_runs["nesterov"].outcome == "diverged"


def test_36_mass_forms_agree_between_communications_and_not_at_them(mass_runs):
    """Single device (no averaging): form 1 (literal and corrected) ≡ form 2 to 1e-13 relative;
    in the setup of prediction 35 the literal form 1 diverges while form 2 converges."""
    finals = [
        param(_linreg("fedavg_mass", {"mass_auto": True, "mass_form": f}, rounds=40, clients=1)[0])
        for f in ("form2", "form1", "form1_literal")
    ]
    for other in finals[1:]:
        np.testing.assert_allclose(other, finals[0], rtol=1e-13, atol=1e-14)
    assert mass_runs["literal"].outcome == "diverged"
    assert mass_runs["mass"][-1] < 1e-24
