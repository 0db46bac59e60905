"""LEAF / FedProx ``synthetic(α, β)``: federated multinomial logistic regression.

Generator of Li et al. 2020 (FedProx, §5.1 and its ``generate_synthetic.py``, reused by LEAF;
ARCHITECTURE.md §2 "Tasks"). For client k = 1..N, with all draws from one
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
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from fedtune.trainers.models import build_model, model_names
from fedtune.trainers.typed import check, from_mapping

from .base import Dataset, FederatedData, Task
from .losses import accuracy, cross_entropy
from .registry import register_task

__all__ = ["SyntheticParams", "accuracy", "build_synthetic", "check_model", "cross_entropy"]


def check_model(model: str, path: str) -> None:
    """ConfigError at ``<path>.model`` unless ``model`` is a registered model."""
    known = model_names()
    check(model in known, f"{path}.model", f"unknown model {model!r} (known: {', '.join(known)})")


@dataclass(frozen=True)
class SyntheticParams:
    clients: int = 30
    alpha: float = 1.0
    beta: float = 1.0
    dim: int = 60
    classes: int = 10
    iid: bool = False
    min_examples: int = 50
    log_mean_examples: float = 4.0
    log_std_examples: float = 2.0
    max_examples: int | None = None
    test_fraction: float = 0.1
    model: str = "linear"

    def validate(self, path: str) -> None:
        p = f"{path}." if path else ""
        check(self.clients >= 1, f"{p}clients", "must be at least 1")
        check(self.alpha >= 0, f"{p}alpha", "must be non-negative")
        check(self.beta >= 0, f"{p}beta", "must be non-negative")
        check(self.dim >= 1, f"{p}dim", "must be at least 1")
        check(self.classes >= 2, f"{p}classes", "must be at least 2")
        check(self.min_examples >= 1, f"{p}min_examples", "must be at least 1")
        check(self.log_std_examples >= 0, f"{p}log_std_examples", "must be non-negative")
        check(
            self.max_examples is None or self.max_examples >= self.min_examples,
            f"{p}max_examples",
            "must be at least min_examples",
        )
        check(0 <= self.test_fraction < 1, f"{p}test_fraction", "must be in [0, 1)")
        check_model(self.model, path)


def _client_sizes(p: SyntheticParams, rng: np.random.Generator) -> np.ndarray:
    extra = np.floor(rng.lognormal(p.log_mean_examples, p.log_std_examples, p.clients))
    sizes = p.min_examples + extra.astype(np.int64)
    return sizes if p.max_examples is None else np.minimum(sizes, p.max_examples)


def generate(p: SyntheticParams, seed: int) -> list[tuple[np.ndarray, np.ndarray]]:
    """Each client's ``(x float64 [n_k, d], y int64 [n_k])`` following the module docstring."""
    rng = np.random.default_rng(seed)
    sizes = _client_sizes(p, rng)
    u = rng.normal(0.0, p.alpha, p.clients)
    b_mean = rng.normal(0.0, p.beta, p.clients)
    sd = np.arange(1, p.dim + 1, dtype=np.float64) ** -0.6  # sqrt of Σ_jj = j^{-1.2}
    if p.iid:
        w_shared = rng.normal(0.0, 1.0, (p.dim, p.classes))
        b_shared = rng.normal(0.0, 1.0, p.classes)
    clients = []
    for k in range(p.clients):
        if p.iid:
            w, b, v = w_shared, b_shared, np.zeros(p.dim)
        else:
            w = rng.normal(u[k], 1.0, (p.dim, p.classes))
            b = rng.normal(u[k], 1.0, p.classes)
            v = rng.normal(b_mean[k], 1.0, p.dim)
        x = v + sd * rng.standard_normal((int(sizes[k]), p.dim))
        y = np.argmax(x @ w + b, axis=1).astype(np.int64)
        clients.append((x, y))
    return clients


def split_holdout(
    clients: list[tuple[torch.Tensor, torch.Tensor]], fraction: float
) -> tuple[list[tuple[torch.Tensor, torch.Tensor]], Dataset | None]:
    """Hold out the last ⌊fraction·n_k⌋ examples of every client (each keeps ≥ 1 for training)
    and pool them into one test set (``None`` when nothing is held out)."""
    train, test_x, test_y = [], [], []
    for x, y in clients:
        n_test = min(int(fraction * len(x)), len(x) - 1)
        cut = len(x) - n_test
        train.append((x[:cut], y[:cut]))
        test_x.append(x[cut:])
        test_y.append(y[cut:])
    if sum(len(t) for t in test_y) == 0:
        return train, None
    return train, Dataset(torch.cat(test_x), torch.cat(test_y))


@register_task("synthetic", "LEAF/FedProx synthetic(α, β) multinomial logistic regression")
def build_synthetic(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(SyntheticParams, params, "task")
    data = [
        (torch.from_numpy(x).to(torch.float32), torch.from_numpy(y)) for x, y in generate(p, seed)
    ]
    train, test = split_holdout(data, p.test_fraction)
    return Task(
        name="synthetic",
        train=FederatedData.from_clients(train, [f"client_{k:04d}" for k in range(p.clients)]),
        model_fn=functools.partial(build_model, p.model, (p.dim,), p.classes),
        loss_fn=cross_entropy,
        test=test,
        metric_fns={"accuracy": accuracy},
        meta={"alpha": p.alpha, "beta": p.beta, "iid": p.iid, "num_classes": p.classes},
    )
