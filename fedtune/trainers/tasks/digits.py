"""scikit-learn's bundled handwritten digits (8×8, 10 classes, 1,797 images), federated.

The examples are split into a pooled test set (``test_fraction``) and ``clients`` training
clients. Each client draws a label prior q_i ~ Dirichlet(concentration·p) with p the global
label distribution (Hsu et al. 2019) and takes its examples class by class according to q_i
from what is left; small concentrations give very non-IID clients. Pixels are scaled to [0, 1].
Models: ``mlp`` (default), ``cnn`` (small CNN on [1, 8, 8]) or ``linear``.

The images are read from scikit-learn's own file, as ``sklearn.datasets.load_digits`` reads it,
without importing scikit-learn (:func:`load_digits`).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch

from ..models import build_model
from ..typed import from_mapping
from .base import Dataset, FederatedData, Task
from .losses import accuracy, cross_entropy
from .params import DigitsParams

__all__ = ["dirichlet_split", "load_digits"]


def dirichlet_split(
    labels: np.ndarray,
    clients: int,
    concentration: float,
    rng: np.random.Generator,
    sizes: list[int] | None = None,
) -> list[np.ndarray]:
    """Indices of each client's examples; label priors ~ Dir(c·p); equal client sizes unless
    ``sizes`` are given."""
    classes = np.unique(labels)
    pools = {k: list(rng.permutation(np.flatnonzero(labels == k))) for k in classes}
    prior = np.array([len(pools[k]) for k in classes], dtype=float) / len(labels)
    sizes = sizes or [len(labels) // clients] * clients
    out = []
    for size in sizes:
        q = rng.dirichlet(concentration * prior * len(classes))
        take: list[int] = []
        while len(take) < size:
            avail = np.array([len(pools[k]) > 0 for k in classes], dtype=float)
            w = q * avail
            w = w / w.sum() if w.sum() > 0 else avail / avail.sum()
            k = classes[rng.choice(len(classes), p=w)]
            take.append(pools[k].pop())
        out.append(np.array(take))
    return out


def _sizes(p: DigitsParams, seed: int, n: int) -> list[int] | None:
    """Quantity skew: n_i = 1 + ⌊s_i (n − C)⌋ with shares s ~ Dir(size_skew·1) drawn from the
    data seed (a stream of its own); None = equal sizes ⌊n/C⌋."""
    if p.size_skew is None:
        return None
    shares = np.random.default_rng([0xD2, seed]).dirichlet([p.size_skew] * p.clients)
    return (1 + np.floor(shares * (n - p.clients)).astype(np.int64)).tolist()


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits: ``(data [1797, 64] float64, target [1797] int)``.

    The values ``sklearn.datasets.load_digits()`` gives as ``.data`` and ``.target``, read from
    the same file (``sklearn/datasets/data/digits.csv.gz``) the same way (``numpy.loadtxt``, the
    last column the label), without importing scikit-learn (the cost this saves every process
    that builds the task: docs/development/testing.md). ``load_digits`` itself if the file is
    not where scikit-learn keeps it.

    Returns:
        The pixels (0–16) and the labels (0–9).
    """
    spec = importlib.util.find_spec("sklearn")  # finds the package without running it
    roots = spec.submodule_search_locations if spec is not None else None
    path = Path(roots[0], "datasets", "data", "digits.csv.gz") if roots else None
    if path is None or not path.is_file():
        from sklearn.datasets import load_digits as sklearn_load_digits

        bunch = sklearn_load_digits()
        return bunch.data, bunch.target
    data = np.loadtxt(path, delimiter=",")  # numpy reads the .gz itself
    return data[:, :-1], data[:, -1].astype(int, copy=False)


def build(params: Mapping[str, Any], seed: int) -> Task:
    p = from_mapping(DigitsParams, params, "task")
    data, target = load_digits()
    x = (data / 16.0).astype(np.float32).reshape(-1, 1, 8, 8)
    y = target.astype(np.int64)
    rng = np.random.default_rng([0xD1, seed])
    order = rng.permutation(len(y))
    n_test = round(p.test_fraction * len(y))
    test_idx, train_idx = order[:n_test], order[n_test:]
    n_train = len(train_idx)
    parts = dirichlet_split(y[train_idx], p.clients, p.dirichlet, rng, _sizes(p, seed, n_train))
    clients = [
        (torch.from_numpy(x[train_idx[ix]]), torch.from_numpy(y[train_idx[ix]])) for ix in parts
    ]
    test = Dataset(torch.from_numpy(x[test_idx]), torch.from_numpy(y[test_idx]))
    return Task(
        name="digits",
        train=FederatedData.from_clients(clients),
        test=test,
        model_fn=lambda gen: build_model(p.model, (1, 8, 8), 10, gen),
        loss_fn=cross_entropy,
        metric_fns={"accuracy": accuracy},
        meta={"classes": 10},
    )
