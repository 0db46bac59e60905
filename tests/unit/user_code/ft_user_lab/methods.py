"""User task, model and method, registered through the public extension API only."""

from __future__ import annotations

import torch
from torch import nn

from fedtune.extend import (
    FederatedData,
    Task,
    build_model,
    register_algorithm,
    register_model,
    register_task,
)


@register_model("ft_user_affine")
def affine(input_shape, num_outputs):
    return nn.Linear(input_shape[0], num_outputs)


@register_task("ft_user_blobs", "two Gaussian blobs per client, shifted per client")
def blobs(params, seed):
    clients = int(params.get("clients", 6))
    gen = torch.Generator().manual_seed(seed)
    data = []
    for i in range(clients):
        x = torch.randn(12 + i, 3, generator=gen, dtype=torch.float64) + 0.3 * i
        y = (x.sum(1) > 0.9 * i).long()
        data.append((x, y))

    def model_fn(generator):
        return build_model("ft_user_affine", (3,), 2, generator)

    def loss_fn(out, y):
        return nn.functional.cross_entropy(out, y, reduction="none")

    return Task("ft_user_blobs", FederatedData.from_clients(data), model_fn, loss_fn)


register_algorithm(
    "ft_user_fomaml_delta",
    summary="user recipe: gradient at the K-th iterate, sent as a model delta",
    params=("client_lr", "server_lr", "server_opt", "server_momentum"),
    theta="last",
    units="delta",
    defaults={"server_lr": 1.0},
)
