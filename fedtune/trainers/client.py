"""The client side of LocalUpdate: K local steps and the Θ-weighted message.

ClientUpdate (ALGORITHMS.md §1.3; `000_4bdc3753d62a87e2.txt` §2.1, `001_2dc7ddae5cbdc81f.txt` §2.1)::

    y ← x;  msg ← 0
    for k = 1 … K(Θ):
        g_k ← ∇ f(y; S_k) + α (y − x)     # mini-batch gradient + proximal pull to the broadcast x
        msg ← msg + θ_k g_k
        y ← y − γ g_k                     # the last update is skipped (never used)
    return msg                            # Σ_k θ_k g_k — gradient units, NOT the model delta

With ``units="delta"`` the message is γ·msg = x − y_K for Θ_{1:K}: the model-delta averaging of
original FedAvg (App. A of `000_4bdc3753d62a87e2.txt` / `001_2dc7ddae5cbdc81f.txt`).

Second-order MAML (`000_4bdc3753d62a87e2.txt` Thm 2, ALGORITHMS.md §3.12): K inner SGD steps
on batches S_1…S_K, then the message is the exact gradient (through the inner steps, by
autodiff, for any model) of the loss on batch S_{K+1} at the adapted point:
∇_x f(U_K(x); S_{K+1}).

Client functions are pure ``fn(x, lr, xb, yb) -> message`` so a runner can vmap them.

Heterogeneous local work (``train.local_epochs``, :mod:`fedtune.trainers.steps`):
:func:`make_masked_client_fn` gives ``fn(x, lr, xb, yb, theta, mask) -> message`` over K_max
padded steps with the client's own Θ row (Θ_{1:τ_i} or Θ_{τ_i}) and step mask; a masked step
leaves y and msg bit for bit unchanged, so the message equals that of τ_i unpadded steps.

The client rule is a part: :data:`CLIENT_HPARAMS` declares γ, α and Θ
(:mod:`fedtune.trainers.hparams`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.func import grad

from .hparams import HParam, Space
from .steps import where_step

__all__ = ["CLIENT_HPARAMS", "ClientRule", "make_client_fn", "make_masked_client_fn"]

CLIENT_HPARAMS = (
    HParam(
        "client_lr", float, 0.1, bounds=(0.0, math.inf),
        space=Space(1e-3, 10.0, log=True, grid="half-decade"),
        doc="γ, client (inner) learning rate",
    ),
    HParam(
        "prox_alpha", float, 0.0, bounds=(0.0, math.inf),
        space=Space(1e-3, 10.0, log=True, grid="decade", default=0.1),
        doc="α, FedProx proximal strength (α = 0 is FedAvg)",
    ),
    HParam(
        "theta", tuple, (), bounds=(0.0, math.inf),
        doc="explicit Θ for local_update (weights >= 0, one positive); empty = the preset",
    ),
)  # fmt: skip

Params = dict[str, torch.Tensor]
LossOf = Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ClientRule:
    """How a client turns its batches into a message."""

    theta: torch.Tensor  # [K(Θ)]
    prox_alpha: float = 0.0
    second_order: bool = False  # MAML: differentiate through the inner steps
    units: str = "gradient"  # or "delta"
    preset: str = "sum"  # the Θ preset (per-client Θ rows with heterogeneous steps)

    @property
    def num_batches(self) -> int:
        return int(self.theta.shape[0]) + (1 if self.second_order else 0)


def _axpy(a: Params, s, b: Params) -> Params:
    return {k: a[k] + s * b[k] for k in a}


def _local_grad_fn(loss_of: LossOf, alpha: float) -> Callable[..., Params]:
    """g = ∇f(y; batch) + α (y − x)."""
    gradient = grad(loss_of)

    def local_grad(y: Params, x: Params, xk, yk) -> Params:
        g = gradient(y, xk, yk)
        if alpha:
            g = {n: g[n] + alpha * (y[n] - x[n]) for n in g}
        return g

    return local_grad


def make_masked_client_fn(loss_of: LossOf, rule: ClientRule) -> Callable[..., Params]:
    """Build ``fn(x, lr, xb [K_max, B, ...], yb, theta [K_max], mask [K_max]) -> message``.

    The first-order ClientUpdate over the steps with ``mask[k]`` set (the first τ_i), with the
    client's own Θ row; masked steps are exact no-ops (``torch.where``).
    """
    if rule.second_order:
        raise ValueError("second-order MAML needs a fixed K (no masked form)")
    local_grad = _local_grad_fn(loss_of, rule.prox_alpha)

    def fn(x: Params, lr, xb, yb, theta, mask) -> Params:
        y = x
        msg = {n: torch.zeros_like(v) for n, v in x.items()}
        for k in range(xb.shape[0]):
            g = local_grad(y, x, xb[k], yb[k])
            msg = where_step(mask[k], _axpy(msg, theta[k], g), msg)
            y = where_step(mask[k], _axpy(y, -lr, g), y)
        if rule.units == "delta":
            return {n: lr * msg[n] for n in msg}
        return msg

    return fn


def make_client_fn(loss_of: LossOf, rule: ClientRule) -> Callable[..., Params]:
    """Build ``fn(x, lr, xb [nb, B, ...], yb [nb, B, ...]) -> message`` for ``rule``."""
    alpha = rule.prox_alpha
    weights = [float(t) for t in rule.theta]
    local_grad = _local_grad_fn(loss_of, alpha)

    def first_order(x: Params, lr, xb, yb) -> Params:
        y = x
        msg = {n: torch.zeros_like(v) for n, v in x.items()}
        last = len(weights) - 1
        for k, theta_k in enumerate(weights):
            g = local_grad(y, x, xb[k], yb[k])
            if theta_k:
                msg = _axpy(msg, theta_k, g)
            if k < last:
                y = _axpy(y, -lr, g)
        if rule.units == "delta":
            return {n: lr * msg[n] for n in msg}
        return msg

    def maml(x: Params, lr, xb, yb) -> Params:
        inner_steps = len(weights)

        def adapted_loss(x0: Params):
            y = x0
            for k in range(inner_steps):
                y = _axpy(y, -lr, local_grad(y, x0, xb[k], yb[k]))
            return loss_of(y, xb[inner_steps], yb[inner_steps])

        return grad(adapted_loss)(x)

    return maml if rule.second_order else first_order
