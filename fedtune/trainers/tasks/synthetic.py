"""LEAF / FedProx ``synthetic(α, β)``: federated multinomial logistic regression.

Generator of Li et al. 2020 (FedProx, §5.1 and its ``generate_synthetic.py``, reused by LEAF;
docs/explanation/architecture.md §2 "Tasks"). For client k = 1..N, with all draws from one
``numpy.random.Generator`` seeded by the task's data seed:

    n_k  = min_examples + ⌊LogNormal(log_mean_examples, log_std_examples)⌋   (capped at max_examples)
    u_k ~ N(0, α²),  B_k ~ N(0, β²)
    W_k ~ N(u_k, 1)^{d×C},  b_k ~ N(u_k, 1)^C,  v_k ~ N(B_k, 1)^d
    x ~ N(v_k, Σ),  Σ = diag(j^{−1.2}), j = 1..d
    y = argmax softmax(W_kᵀ x + b_k)

α controls how much the local models differ, β how much the local inputs differ; α and β are
standard deviations as in the reference code (the paper writes N(0, α)). With ``iid: true`` every
client shares one W, b ~ N(0, 1) and v_k = 0 (α and β are unused). Defaults: d = 60, C = 10,
N = 30, sizes 50 + ⌊LogNormal(4, 2)⌋ as in FedProx. A fraction ``test_fraction`` of each
client's examples is held out and pooled into the test split (LEAF holds out 10 %).

The module also provides the per-example classification loss and metric used by the file
loaders: ``cross_entropy(o, y) = −log softmax(o)[y]`` and ``accuracy(o, y) = [argmax o = y]``.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fedtune.trainers.models import build_model
from fedtune.trainers.typed import from_mapping

from .base import Dataset, InMemoryData, Task
from .losses import accuracy, cross_entropy
from .params import SyntheticParams, check_model

__all__ = [
    "SyntheticParams",
    "accuracy",
    "build_synthetic",
    "check_model",
    "cross_entropy",
    "generate",
    "generate_arrays",
]


def _client_sizes(p: SyntheticParams, rng: np.random.Generator) -> np.ndarray:
    extra = np.floor(rng.lognormal(p.log_mean_examples, p.log_std_examples, p.clients))
    sizes = p.min_examples + extra.astype(np.int64)
    return sizes if p.max_examples is None else np.minimum(sizes, p.max_examples)


def generate(p: SyntheticParams, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each client's ``(x float64 [n_k, d], y int64 [n_k])`` following the module docstring."""
    x, y, sizes = generate_arrays(p, seed)
    cuts = np.cumsum(sizes)[:-1]
    return list(zip(np.split(x, cuts), np.split(y, cuts), strict=True))


def generate_arrays(p: SyntheticParams, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """All clients at once: ``x`` float64 [N, d], ``y`` int64 [N] (client after client) and the
    sizes n_k [C].

    The draws are those of the per-client recipe (client k: W_k, b_k, v_k, then its x, every
    one a standard normal shifted by its mean), taken as one ``standard_normal`` call and cut
    per client, so the data are bit for bit those of a loop over clients; the logits are one
    stacked matmul per group of equal-size clients (the same BLAS call per client)."""
    rng = np.random.default_rng(seed)
    sizes = _client_sizes(p, rng)
    u = rng.normal(0.0, p.alpha, p.clients)
    b_mean = rng.normal(0.0, p.beta, p.clients)
    sd = np.arange(1, p.dim + 1, dtype=np.float64) ** -0.6  # sqrt of Σ_jj = j^{-1.2}
    d, k, n_rows = p.dim, p.classes, int(sizes.sum())
    owner = np.repeat(np.arange(p.clients), sizes)
    if p.iid:
        w = np.broadcast_to(rng.normal(0.0, 1.0, (d, k)), (p.clients, d, k))
        b = np.broadcast_to(rng.normal(0.0, 1.0, k), (p.clients, k))
        v = np.zeros((p.clients, d))
        z = rng.standard_normal((n_rows, d))
    else:
        head = d * k + k + d  # W_k, b_k, v_k of each client, before its x
        block = head + sizes * d
        start = np.cumsum(block) - block
        draws = rng.standard_normal(int(block.sum()))
        own = draws[start[:, None] + np.arange(head)]  # [C, head]
        w = u[:, None, None] + 1.0 * own[:, : d * k].reshape(p.clients, d, k)
        b = u[:, None] + 1.0 * own[:, d * k : d * k + k]
        v = b_mean[:, None] + 1.0 * own[:, d * k + k :]
        first = np.repeat(start + head - (np.cumsum(sizes) - sizes) * d, sizes)
        z = draws[(first + np.arange(n_rows) * d)[:, None] + np.arange(d)]
        del draws, own
    x = v[owner] + sd * z
    y = np.empty(n_rows, dtype=np.int64)
    offsets = np.cumsum(sizes) - sizes
    for n in np.unique(sizes).tolist():
        of = np.flatnonzero(sizes == n)
        rows = (offsets[of][:, None] + np.arange(n)).reshape(-1)
        logits = x[rows].reshape(len(of), n, d) @ w[of] + b[of][:, None, :]
        y[rows] = np.argmax(logits, axis=2).reshape(-1)
    return x, y, sizes


def holdout_mask(sizes: np.ndarray, fraction: float) -> np.ndarray:
    """Rows kept for training: all but the last ⌊fraction·n_k⌋ of every client (each keeps ≥ 1);
    the rest are pooled, in client order, into the test split."""
    n_test = np.minimum((fraction * sizes).astype(np.int64), sizes - 1)
    position = np.arange(int(sizes.sum())) - np.repeat(np.cumsum(sizes) - sizes, sizes)
    return position < np.repeat(sizes - n_test, sizes)


def build_synthetic(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(SyntheticParams, params, "task")
    x, y, sizes = generate_arrays(p, seed)
    keep = holdout_mask(sizes, p.test_fraction)
    inputs, targets = torch.from_numpy(x).to(torch.float32), torch.from_numpy(y)
    mask = torch.from_numpy(keep)
    test = None if keep.all() else Dataset(inputs[~mask], targets[~mask])
    counts = torch.from_numpy(np.add.reduceat(keep.astype(np.int64), np.cumsum(sizes) - sizes))
    ids = [f"client_{k:04d}" for k in range(p.clients)]
    return Task(
        name="synthetic",
        train=InMemoryData.from_arrays(inputs[mask], targets[mask], counts, ids),
        model_fn=functools.partial(build_model, p.model, (p.dim,), p.classes),
        loss_fn=cross_entropy,
        test=test,
        metric_fns={"accuracy": accuracy},
        meta={"alpha": p.alpha, "beta": p.beta, "iid": p.iid, "num_classes": p.classes},
    )
