"""ℓ_i measured by the client's first local step, where the two are one forward pass.

Every round the engine measures each sampled client's loss at the broadcast model before its
local training, ℓ_i = (1/n_i) Σ_{z ∈ D_i} f(x; z) (engine step 2), and the client's first
local step evaluates f(y_0; z) on its first batch S_1, B examples drawn from D_i, at
y_0 = x. Both are functions of the per-example losses f(x; z), z ∈ D_i: one forward pass over
D_i with autograd gives ℓ_i (their mean) and the first step's loss
(1/B) Σ_{s ∈ S_1} f(x; z_s) = Σ_{z ∈ D_i} (c_z / B) f(x; z), c_z the number of times S_1 drew z,
whose gradient is the step's ∇f(x; S_1). The losses are the same as in two passes; the gradient
sums each example's contribution once, weighted by its number of draws, instead of once per
draw: a different floating-point summation order, nothing else.

It pays when D_i is no larger than the batch: the forward and backward pass over D_i then cost
no more than the step's own over S_1, and the separate ℓ_t pass is saved (on the digits CNN at
K = 1, n_i = 14 and B = 20, ℓ_t was 16 % of a sequential round). Where a client has more
examples than B the backward pass over D_i would cost more than the pass it saves, so a round
measures this way only when every sampled client has n_i ≤ B (the cohort's data is padded to
n_max ≤ B rows, the padding repeats the client's last row and is left out of ℓ_i).

Which rules: :class:`~fedtune.trainers.client.ClientRule` first-order ClientUpdate with K ≥ 1,
fixed or masked steps (every client has τ_i ≥ 1, so step 1 is real), whose first gradient is at
y_0 = x, FedProx's α (y_0 − x) computed as in the separate path; on a
:class:`~fedtune.trainers.module_loss.ModuleLoss` (per-example losses). Second-order MAML
differentiates through its inner steps and keeps the separate pass. Declared by the algorithm
(``LocalUpdate.measures_client_losses``); ``tests/unit/test_first_step.py`` checks that the
messages, ℓ_t and the runs equal the separate path's to rounding.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from .client import (
    ClientRule,
    Params,
    eager_message,
    first_order_message,
    has_eager,
    local_grad_fn,
    masked_message,
    with_prox,
)
from .func_grad import grad
from .module_loss import ModuleLoss
from .tasks.base import InMemoryData

__all__ = [
    "ClientData",
    "client_data",
    "client_means",
    "make_measuring_client_fn",
    "measures_in_first_step",
]


def measures_in_first_step(
    rule: ClientRule, loss_of: object, counts: torch.Tensor, batch_size: int
) -> bool:
    """Whether a round's clients measure ℓ_i in their first step (see the module docstring).

    Args:
        rule: The client rule.
        loss_of: The round's loss (a :class:`ModuleLoss` gives per-example losses).
        counts: The sampled clients' numbers of examples ``[M]``.
        batch_size: The batch size B (``full`` batches: the clients' common size).

    Returns:
        True for a first-order rule with K ≥ 1 whose clients each have at most B examples.
    """
    return (
        not rule.second_order
        and int(rule.theta.shape[0]) >= 1
        and isinstance(loss_of, ModuleLoss)
        and int(counts.max()) <= batch_size
    )


@dataclass(frozen=True)
class ClientData:
    """Every sampled client's examples, padded to the largest client's count n_max.

    Args:
        inputs: ``[M, n_max, ...]``; a client's rows past its count repeat its last row.
        targets: ``[M, n_max, ...]``.
        weights: c_z / B, each example's draws by the first batch S_1 over B ``[M, n_max]``
            (0 for the padding).
        counts: The clients' numbers of examples n_i ``[M]``.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    weights: torch.Tensor
    counts: torch.Tensor

    def per_client(self) -> tuple[torch.Tensor, ...]:
        """The client function's arguments, each stacked on the client axis."""
        return self.inputs, self.targets, self.weights


def client_data(
    data: InMemoryData, clients: torch.Tensor, batches: torch.Tensor, dtype: torch.dtype
) -> ClientData:
    """Give the sampled clients' examples and their first batches' draws of each.

    Args:
        data: The round's cohort view, its clients addressed by global index.
        clients: The sampled clients ``[M]``.
        batches: Their batch rows into ``data`` ``[M, nb, B]`` (each client's own rows).
        dtype: The model's floating dtype (of the weights).

    Returns:
        The padded examples, the first batches' draws per example and the counts.
    """
    clients = clients.cpu()
    counts, offsets = data.counts[clients], data.offsets[clients]
    n_max = int(counts.max())
    positions = torch.arange(n_max)[None, :]
    if int(counts.min()) < n_max:  # the padding repeats the client's last row
        positions = torch.minimum(positions, counts[:, None] - 1)
    device = data.inputs.device
    rows = (offsets[:, None] + positions).to(device)
    first = batches[:, 0, :] - offsets.to(batches.device)[:, None]
    draws = torch.zeros(first.shape[0], n_max, dtype=dtype, device=first.device)
    draws.scatter_add_(1, first, torch.ones_like(first, dtype=draws.dtype))
    weights = draws / first.shape[1]
    return ClientData(data.inputs[rows], data.targets[rows], weights, counts.to(device))


def client_means(losses: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """ℓ_i of every client: the mean of its first n_i per-example losses (the padding left out).

    Args:
        losses: The clients' per-example losses ``[M, n_max]``.
        counts: Their numbers of examples ``[M]``.

    Returns:
        ``[M]``.
    """
    if int(counts.min()) < losses.shape[1]:
        valid = torch.arange(losses.shape[1], device=losses.device)[None, :] < counts[:, None]
        losses = torch.where(valid, losses, torch.zeros_like(losses))
    return losses.sum(1) / counts.to(losses.dtype)


def make_measuring_client_fn(
    loss_of: ModuleLoss, rule: ClientRule, masked: bool
) -> Callable[..., tuple[Params, torch.Tensor]]:
    """Build the ClientUpdate that also gives the losses of ℓ_i, from its first step's forward
    pass.

    ``fn(x, lr, xb, yb, [theta, mask,] inputs, targets, weights) -> (message, losses)``:
    ``xb``, ``yb`` are the batches of steps 2…K (``[K − 1, B, ...]``, padded steps with
    ``masked``); step 1's loss is Σ_j weights_j·f(x; inputs_j) over the client's examples
    ``inputs`` (padded, weight 0), ``losses`` their per-example losses at x, whose mean over the
    real ones is ℓ_i (:func:`client_means`). The message is that of
    :func:`~fedtune.trainers.client.make_client_fn` (or the masked form) on the batches
    ``[S_1, *xb]``, up to summation order. With an eager module loss ``fn.eager`` is the same
    for the sequential runner.

    Args:
        loss_of: The model's loss.
        rule: A first-order client rule with K ≥ 1 (:func:`measures_in_first_step`).
        masked: Heterogeneous steps (Θ row and step mask per client).

    Returns:
        The client function.
    """
    if rule.second_order:
        raise ValueError("second-order MAML does not measure ℓ_i in its first step")
    alpha, weights = rule.prox_alpha, [float(t) for t in rule.theta]
    local_grad = local_grad_fn(loss_of)

    def first_loss(y: Params, inputs, targets, w):
        losses = loss_of.per_example(y, inputs, targets)
        return torch.dot(losses, w), losses

    first_grad = grad(first_loss, has_aux=True)

    def fn(x: Params, lr, xb, yb, *rest) -> tuple[Params, torch.Tensor]:
        theta, mask = rest[:2] if masked else (None, None)
        inputs, targets, w = rest[-3:]
        g1, losses = first_grad(x, inputs, targets, w)
        g1 = with_prox(g1, x, x, alpha)  # α (y_0 − x), as the separate path computes it

        def step_grad(k: int, y: Params) -> Params:
            return g1 if k == 0 else local_grad(y, x, xb[k - 1], yb[k - 1], alpha)

        if masked:
            msg = masked_message(step_grad, xb.shape[0] + 1, rule.units, x, lr, theta, mask)
        else:
            msg = first_order_message(step_grad, weights, rule.units, x, lr)
        return msg, losses

    if has_eager(loss_of):
        fn.eager = _eager_measuring(loss_of, rule, weights, masked)  # type: ignore[attr-defined]
    return fn


def _eager_measuring(
    loss: ModuleLoss, rule: ClientRule, weights: list[float], masked: bool
) -> Callable[..., tuple[Params, torch.Tensor]]:
    """The eager twin of :func:`make_measuring_client_fn` (the sequential runner's)."""

    def fn(x: Params, lr, xb, yb, *rest) -> tuple[Params, torch.Tensor]:
        theta, mask = rest[:2] if masked else (weights, None)
        inputs, targets, w = rest[-3:]
        x_leaves = ModuleLoss.leaves([x[n] for n in loss.names])
        g1, losses = loss.grad_and_losses(x_leaves, inputs, targets, w)

        def eager_grad(k: int, y: list[torch.Tensor]) -> Sequence[torch.Tensor]:
            return g1 if k == 0 else loss.grad(ModuleLoss.leaves(y), xb[k - 1], yb[k - 1])

        steps = int(xb.shape[0]) + 1 if masked else len(weights)
        msg = eager_message(loss, rule, x, lr, eager_grad, steps, theta, mask)
        return msg, losses

    return fn
