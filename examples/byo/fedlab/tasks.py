"""``fedlab_wine``: scikit-learn's wine recognition data (178 wines, 13 chemical features,
3 cultivars; bundled with scikit-learn, nothing is downloaded) as a federated task.

Split, all from the data seed ``seed`` (the task builder's contract: same seed, same tensors):

1. a permutation of the 178 wines; the first ``test_fraction`` form the pooled test split;
2. the features are standardised with the *training* rows' mean and standard deviation;
3. label skew: for every class c, shares s_c ~ Dirichlet(``alpha``·1) over the ``clients``
   decide how many of class c's training wines each client gets (small ``alpha`` → each
   client sees mostly one cultivar); a client left empty takes one wine from the largest client.

Clients therefore differ in both their label mix and their size n_i, so with
``train.local_epochs`` they run different numbers of local steps ⌈E·n_i/B⌉ — the setting
FedNova and :mod:`fedlab.methods` are for.

Parameters (``task:`` keys of a study): ``clients`` (2 … 40, default 8), ``alpha`` (> 0,
default 0.5), ``test_fraction`` (0 < f < 0.9, default 0.25), ``model`` (a registered model,
default ``fedlab_resmlp``). Errors name the key: ``task.alpha: must be > 0, got 0``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from fedtune.extend import ConfigError, Dataset, FederatedData, Task, build_model, register_task

from . import models  # noqa: F401  (registers fedlab_resmlp, the default model)
from .wine_data import wine_arrays

__all__ = ["label_skew_split", "wine"]

_DEFAULTS = {"clients": 8, "alpha": 0.5, "test_fraction": 0.25, "model": "fedlab_resmlp"}


def _params(params: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(params) - set(_DEFAULTS))
    if unknown:
        raise ConfigError(f"task.{unknown[0]}", f"unknown key (known: {', '.join(_DEFAULTS)})")
    p = {**_DEFAULTS, **params}
    if isinstance(p["clients"], bool) or not isinstance(p["clients"], int):
        raise ConfigError("task.clients", f"must be a whole number, got {p['clients']!r}")
    if not 2 <= p["clients"] <= 40:
        raise ConfigError("task.clients", f"must be in [2, 40], got {p['clients']}")
    for key, low, high in (("alpha", 0.0, float("inf")), ("test_fraction", 0.0, 0.9)):
        value = p[key]
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"task.{key}", f"must be a number, got {value!r}")
        if not low < value < high:
            bound = f"> {low:g}" if high == float("inf") else f"in ({low:g}, {high:g})"
            raise ConfigError(f"task.{key}", f"must be {bound}, got {value}")
    return p


def label_skew_split(
    labels: np.ndarray, clients: int, alpha: float, rng: np.random.Generator
) -> list[np.ndarray]:
    """Row indices of each client: per class, Dirichlet(alpha) shares over the clients."""
    parts: list[list[int]] = [[] for _ in range(clients)]
    for c in np.unique(labels):
        rows = rng.permutation(np.flatnonzero(labels == c))
        shares = rng.dirichlet(np.full(clients, alpha))
        cuts = np.round(np.cumsum(shares)[:-1] * len(rows)).astype(int)
        for i, chunk in enumerate(np.split(rows, cuts)):
            parts[i].extend(chunk.tolist())
    for i in range(clients):  # nobody empty: borrow one row from the largest client
        if not parts[i]:
            donor = max(range(clients), key=lambda j: (len(parts[j]), -j))
            parts[i].append(parts[donor].pop())
    return [np.sort(np.asarray(p, dtype=np.int64)) for p in parts]


@register_task("fedlab_wine", "scikit-learn wine data over label-skewed clients (fedlab)")
def wine(params: Mapping[str, Any], seed: int) -> Task:
    p = _params(params)
    data, target = wine_arrays()  # load_wine()'s arrays, without importing scikit-learn
    x = data.astype(np.float64)
    y = target.astype(np.int64)
    rng = np.random.default_rng([0xF1AB, seed])
    order = rng.permutation(len(y))
    n_test = round(p["test_fraction"] * len(y))
    test_idx, train_idx = order[:n_test], order[n_test:]
    mean, std = x[train_idx].mean(0), x[train_idx].std(0)
    x = ((x - mean) / np.where(std > 0, std, 1.0)).astype(np.float32)
    parts = label_skew_split(y[train_idx], p["clients"], float(p["alpha"]), rng)
    clients = [
        (torch.from_numpy(x[train_idx[ix]]), torch.from_numpy(y[train_idx[ix]])) for ix in parts
    ]
    test = Dataset(torch.from_numpy(x[test_idx]), torch.from_numpy(y[test_idx]))
    classes = int(y.max()) + 1
    features = int(x.shape[1])
    model = str(p["model"])
    return Task(
        name="fedlab_wine",
        train=FederatedData.from_clients(clients),
        test=test,
        model_fn=lambda gen: build_model(model, (features,), classes, gen),
        loss_fn=cross_entropy,
        metric_fns={"accuracy": accuracy},
        meta={"classes": classes},
    )


def cross_entropy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example −log softmax(outputs)[y], ``[B, C] × [B] -> [B]`` (vmappable)."""
    logp = torch.log_softmax(outputs, dim=-1)
    return -logp.gather(-1, targets.long().unsqueeze(-1)).squeeze(-1)


def accuracy(outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Per-example 0/1 accuracy of the arg-max prediction."""
    return (outputs.argmax(-1) == targets.long()).to(outputs.dtype)
