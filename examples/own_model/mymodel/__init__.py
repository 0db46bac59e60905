"""A model and a task of your own, registered through fedtune's public extension API."""

import numpy as np
import torch
from torch import nn

from fedtune.extend import (
    ConfigError,
    Dataset,
    FederatedData,
    Task,
    build_model,
    register_model,
    register_task,
)


@register_model("tiny_mlp")
def tiny_mlp(input_shape, num_outputs):
    # a pure function of (parameters, inputs): no dropout, no BatchNorm (clients are vmapped)
    return nn.Sequential(nn.Linear(input_shape[0], 16), nn.Tanh(), nn.Linear(16, num_outputs))


def cross_entropy(outputs, targets):  # per-example losses: [B, C] x [B] -> [B]
    return nn.functional.cross_entropy(outputs, targets, reduction="none")


def accuracy(outputs, targets):  # per-example 0/1, like the loss
    return (outputs.argmax(-1) == targets).to(outputs.dtype)


@register_task("breast_cancer", "scikit-learn's breast cancer data, clients sorted by label")
def breast_cancer(params, seed):  # params: the study's task: keys; seed: the data seed
    from sklearn.datasets import load_breast_cancer

    if unknown := sorted(set(params) - {"clients", "model"}):
        raise ConfigError(f"task.{unknown[0]}", "unknown key (known: clients, model)")
    clients, model = params.get("clients", 10), params.get("model", "tiny_mlp")
    if not isinstance(clients, int) or not 2 <= clients <= 50:
        raise ConfigError("task.clients", f"must be a whole number in [2, 50], got {clients!r}")
    x, y = load_breast_cancer(return_X_y=True)  # 569 tumours, 30 features, 2 classes
    x = ((x - x.mean(0)) / x.std(0)).astype(np.float32)
    order = np.random.default_rng(seed).permutation(len(y))
    test, train = order[:100], order[100:]
    train = train[np.argsort(y[train], kind="stable")]  # label skew: most clients see one class
    rows = np.array_split(train, clients)
    parts = [(torch.from_numpy(x[i]), torch.from_numpy(y[i])) for i in rows]
    return Task(
        name="breast_cancer",
        train=FederatedData.from_clients(parts),
        test=Dataset(torch.from_numpy(x[test]), torch.from_numpy(y[test])),
        model_fn=lambda gen: build_model(model, (30,), 2, gen),
        loss_fn=cross_entropy,
        metric_fns={"accuracy": accuracy},
    )
