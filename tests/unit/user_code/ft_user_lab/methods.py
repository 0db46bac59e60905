"""User task, model and method, registered through the public extension API only."""

from __future__ import annotations

import torch
from torch import nn

from fedtune.extend import (
    ClientRule,
    FederatedData,
    HParam,
    LocalUpdate,
    Space,
    Task,
    build_model,
    make_server_opt,
    register_algorithm,
    register_model,
    register_task,
    weighted_mean,
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


class DampedMean:
    """A user aggregator part: q = ρ Σ_i w_i q_i, with its own hyperparameter ρ."""

    def __init__(self, damping: float) -> None:
        self.damping = damping

    def __call__(self, messages, weights, steps, client_lr):
        q = weighted_mean(messages, weights)
        return {k: self.damping * v for k, v in q.items()}, {"ft_damping": self.damping}


def build_damped(recipe, hp, local_steps, task):
    base = LocalUpdate(recipe.name, ClientRule(torch.ones(local_steps)), make_server_opt(hp))
    return LocalUpdate(recipe.name, base.rule, base.server_opt, DampedMean(hp.ft_damping))


register_algorithm(
    "ft_user_damped",
    summary="user recipe: FedAvg whose aggregator damps the mean by ρ",
    hparams=(
        HParam(
            "ft_damping",
            float,
            0.5,
            bounds=(0.0, 1.0),
            open="low",
            space=Space(0.05, 1.0, log=True, grid=(0.1, 0.5, 1.0)),
            doc="ρ, damping of the averaged message",
        ),
    ),
    build=build_damped,
)
