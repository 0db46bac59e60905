"""The client side of LocalUpdate: K local steps and the Θ-weighted message.

ClientUpdate (docs/explanation/algorithms.md §1.3; Charles & Konečný 2021 (arXiv:2103.05032) §2.1,
Charles & Konečný 2020 (arXiv:2007.00878) §2.1)::

    y ← x;  msg ← 0
    for k = 1 … K(Θ):
        g_k ← ∇ f(y; S_k) + α (y − x)     # mini-batch gradient + proximal pull to the broadcast x
        msg ← msg + θ_k g_k
        y ← y − γ g_k                     # the last update is skipped (never used)
    return msg                            # Σ_k θ_k g_k — gradient units, NOT the model delta

With ``units="delta"`` the message is γ·msg = x − y_K for Θ_{1:K}: the model-delta averaging of
original FedAvg (App. A of Charles & Konečný 2021 / Charles & Konečný 2020).

Second-order MAML (Charles & Konečný 2021 Thm 2, docs/explanation/algorithms.md §3.12): K inner SGD
steps on batches S_1…S_K, then the message is the exact gradient (through the inner steps, by
autodiff, for any model) of the loss on batch S_{K+1} at the adapted point:
∇_x f(U_K(x); S_{K+1}).

Client functions are pure ``fn(x, lr, xb, yb) -> message`` so a runner can vmap them. When
``loss_of`` is a :class:`~fedtune.trainers.module_loss.ModuleLoss` with an eager twin, the
first-order functions carry ``fn.eager``: the same ClientUpdate for one client, with eager
autograd on the module instead of torch.func (the sequential runner calls it; same operators in
the same order, so the same bits — tests/unit/test_eager_runner.py).

Heterogeneous local work (``train.local_epochs``, :mod:`fedtune.trainers.steps`):
:func:`make_masked_client_fn` gives ``fn(x, lr, xb, yb, theta, mask) -> message`` over K_max
padded steps with the client's own Θ row (Θ_{1:τ_i} or Θ_{τ_i}) and step mask; a masked step
leaves y and msg bit for bit unchanged, so the message equals that of τ_i unpadded steps.

The client rule is a part: :data:`CLIENT_HPARAMS` declares γ, α and Θ
(:mod:`fedtune.trainers.hparams`; defined in :mod:`fedtune.trainers.part_hparams`, which a spec's
validation reads without torch).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch.func import vmap

from .func_grad import grad
from .module_loss import ModuleLoss
from .part_hparams import CLIENT_HPARAMS
from .steps import where_step

__all__ = [
    "CLIENT_HPARAMS",
    "ClientRule",
    "make_client_fn",
    "make_masked_client_fn",
    "make_packed_client_fn",
]


Params = dict[str, torch.Tensor]
LossOf = Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]


@dataclass(frozen=True)
class ClientRule:
    """How a client turns its batches into a message (ClientUpdate).

    From y ← x, K(Θ) steps g_k ← ∇f(y; S_k) + α (y − x), y ← y − γ g_k give the message
    Σ_k θ_k g_k (Charles & Konečný 2021 (arXiv:2103.05032) §2.1).

    Args:
        theta: The step weights Θ ``[K(Θ)]``.
        prox_alpha: The proximal weight α (FedProx).
        second_order: Differentiate through the inner steps (MAML).
        units: ``gradient`` (Σ_k θ_k g_k) or ``delta`` (γ times it: the model change).
        preset: The Θ preset, for per-client Θ rows with heterogeneous steps.
    """

    theta: torch.Tensor  # [K(Θ)]
    prox_alpha: float = 0.0
    second_order: bool = False  # MAML: differentiate through the inner steps
    units: str = "gradient"  # or "delta"
    preset: str = "sum"  # the Θ preset (per-client Θ rows with heterogeneous steps)

    @property
    def num_batches(self) -> int:
        """Batches a client draws per round: K(Θ), one more for second-order MAML."""
        return int(self.theta.shape[0]) + (1 if self.second_order else 0)


def _axpy(a: Params, s, b: Params) -> Params:
    return {k: a[k] + s * b[k] for k in a}


def with_prox(g: Params, y: Params, x: Params, alpha) -> Params:
    """g + α (y − x); α a float (0: no proximal term, g itself) or a tensor (applied)."""
    if torch.is_tensor(alpha) or alpha:
        return {n: g[n] + alpha * (y[n] - x[n]) for n in g}
    return g


def local_grad_fn(loss_of: LossOf) -> Callable[..., Params]:
    """g = ∇f(y; batch) + α (y − x) (:func:`with_prox`)."""
    gradient = grad(loss_of)

    def local_grad(y: Params, x: Params, xk, yk, alpha) -> Params:
        return with_prox(gradient(y, xk, yk), y, x, alpha)

    return local_grad


#: ``step_grad(k, y) -> g_k``: step k's local gradient at the client's point y (the proximal
#: term included); the ClientUpdate loops below take their gradients from one
StepGrad = Callable[[int, Params], Params]


def masked_message(
    step_grad: StepGrad, steps: int, units: str, x: Params, lr, theta, mask
) -> Params:
    """The masked first-order ClientUpdate of one client (see :func:`make_masked_client_fn`)."""
    y = x
    msg = {n: torch.zeros_like(v) for n, v in x.items()}
    for k in range(steps):
        g = step_grad(k, y)
        if mask is None:  # every step is real (packed trials of equal K)
            msg, y = _axpy(msg, theta[k], g), _axpy(y, -lr, g)
            continue
        msg = where_step(mask[k], _axpy(msg, theta[k], g), msg)
        y = where_step(mask[k], _axpy(y, -lr, g), y)
    if units == "delta":
        return {n: lr * msg[n] for n in msg}
    return msg


def _gather(data: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``data[rows]`` for a 2-D ``rows`` [N, B], as one ``index_select`` (on a CPU faster than
    advanced indexing for wide rows such as the quadratic's 440 columns)."""
    return data.index_select(0, rows.reshape(-1)).view(*rows.shape, *data.shape[1:])


def make_packed_client_fn(loss_of: LossOf, units: str) -> Callable[..., Params]:
    """Build the ClientUpdate of N independent (configuration, client) pairs at once.

    ``fn(x [N, …], lr [N], alpha [N] | None, rows [N, K_max, B], inputs, targets,
    theta [N, K_max], mask [N, K_max] | None, dense=False) -> message [N, …]``: each pair runs
    the masked first-order ClientUpdate of :func:`make_masked_client_fn` from its own start
    ``x`` with its own rate γ and proximal weight α: g_k ← ∇f(y; S_k) + α (y − x),
    msg ← msg + θ_k g_k, y ← y − γ g_k on its unmasked steps (Charles & Konečný 2021
    (arXiv:2103.05032) §2.1);
    ``alpha`` None: no proximal term, ``mask`` None: every step is real. Step k's batches are
    gathered as ``inputs[rows[:, k]]``. A step that only some pairs have (``mask`` a prefix of
    K_max per pair) is computed for those pairs alone, their states written back in place;
    with ``dense`` it is computed for every pair and ``torch.where`` keeps the others' states,
    so that the call reads nothing back to the host and runs the same kernels whatever the mask
    (a CUDA graph can record it: :mod:`~fedtune.trainers.pack_graph`).

    The pairs' losses are vmapped and their gradients are taken with one ordinary backward pass
    of their sum: no pair's loss depends on another's parameters, so each pair's gradient is
    its own. Packed trials (:mod:`fedtune.trainers.packed`) use it with N = members × clients;
    against ``vmap(vmap(grad(loss)))`` each operation goes through one vmap level and no grad
    transform (docs/explanation/packing.md, "Memory and speed").

    Args:
        loss_of: The model's loss ``loss_of(params, x, y)`` (a mean over the batch).
        units: ``gradient`` or ``delta`` (the message times γ).

    Returns:
        The client function.
    """
    losses = vmap(loss_of, randomness="different")

    def grad_of(y: Params, rows_k: torch.Tensor, inputs, targets) -> Params:
        with torch.enable_grad():
            leaves = {n: v.detach().requires_grad_() for n, v in y.items()}
            total = losses(leaves, _gather(inputs, rows_k), _gather(targets, rows_k)).sum()
            grads = torch.autograd.grad(total, list(leaves.values()))
        return dict(zip(leaves, grads, strict=True))

    def fn(x: Params, lr, alpha, rows, inputs, targets, theta, mask, dense=False) -> Params:
        def per_pair(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
            return v.view(-1, *([1] * (like.dim() - 1)))

        y, msg = x, {}
        # pairs with a k-th step, per k (one read for the whole call: no host sync per step)
        counts = None if mask is None or dense else mask.sum(0).tolist()
        last = rows.shape[1] - 1  # its y is never read: only the message is returned
        for k in range(rows.shape[1]):
            if counts is not None and k > 0 and counts[k] < mask.shape[0]:
                if counts[k] == 0:  # no pair has more steps (a mask is a prefix of K)
                    break
                live = mask[:, k].nonzero().squeeze(1)
                # only the pairs with a k-th step compute it (a pack of members of different
                # K, or clients of different τ_i): the others' work would be masked out
                ys = {n: v.index_select(0, live) for n, v in y.items()}
                g = grad_of(ys, rows[live, k], inputs, targets)
                if alpha is not None:
                    a = alpha[live]
                    g = {n: g[n] + per_pair(a, g[n]) * (ys[n] - x[n][live]) for n in g}
                th, step = theta[live, k], -lr[live]
                for n in g:
                    old = msg[n].index_select(0, live)
                    msg[n].index_copy_(0, live, old + per_pair(th, g[n]) * g[n])
                    if k < last:
                        y[n].index_copy_(0, live, ys[n] + per_pair(step, g[n]) * g[n])
                continue
            g = grad_of(y, rows[:, k], inputs, targets)
            if alpha is not None:
                g = {n: g[n] + per_pair(alpha, g[n]) * (y[n] - x[n]) for n in g}
            if mask is None:  # every step is real (packed trials of equal K): in place
                if k == 0:
                    # the state takes the gradients' memory layout (a batched weight's gradient
                    # comes transposed): the element-wise updates then read every operand in
                    # order (mixed layouts made the digits MLP's pack of 64 about 1.7x slower
                    # on a CPU). Step 0 writes θ_0 g and x − γ g straight into it.
                    msg = {
                        n: torch.mul(per_pair(theta[:, 0], g[n]), g[n], out=torch.empty_like(g[n]))
                        for n in g
                    }
                    if k < last:
                        y = {
                            n: torch.addcmul(
                                y[n], per_pair(-lr, g[n]), g[n], out=torch.empty_like(g[n])
                            )
                            for n in g
                        }
                    continue
                for n in g:
                    msg[n].addcmul_(per_pair(theta[:, k], g[n]), g[n])
                    if k < last:
                        y[n].addcmul_(per_pair(-lr, g[n]), g[n])
                continue
            if k == 0:
                msg = {n: torch.zeros_like(g[n]) for n in g}
                y = {n: torch.empty_like(g[n]).copy_(y[n]) for n in g}
            new_msg = {n: msg[n] + per_pair(theta[:, k], g[n]) * g[n] for n in g}
            # the last step's y is never read (as on the paths above)
            new_y = y if k == last else {n: y[n] + per_pair(-lr, g[n]) * g[n] for n in g}
            if counts is not None and counts[k] == mask.shape[0]:  # no pair to mask at step k
                msg, y = new_msg, new_y
                continue
            # dense, or step 0 with pairs that have no step at all (a later partial step is the
            # live path)
            msg = {n: torch.where(per_pair(mask[:, k], g[n]), new_msg[n], msg[n]) for n in g}
            if k < last:
                y = {n: torch.where(per_pair(mask[:, k], g[n]), new_y[n], y[n]) for n in g}
        if units == "delta":
            return {n: per_pair(lr, msg[n]) * msg[n] for n in msg}
        return msg

    return fn


def make_masked_client_fn(loss_of: LossOf, rule: ClientRule) -> Callable[..., Params]:
    """Build ``fn(x, lr, xb [K_max, B, ...], yb, theta [K_max], mask [K_max]) -> message``.

    The first-order ClientUpdate over the steps with ``mask[k]`` set (the first τ_i), with the
    client's own Θ row; masked steps are exact no-ops (``torch.where``).
    """
    if rule.second_order:
        raise ValueError("second-order MAML needs a fixed K (no masked form)")
    local_grad = local_grad_fn(loss_of)
    alpha = rule.prox_alpha

    def fn(x: Params, lr, xb, yb, theta, mask) -> Params:
        def step_grad(k: int, y: Params) -> Params:
            return local_grad(y, x, xb[k], yb[k], alpha)

        return masked_message(step_grad, xb.shape[0], rule.units, x, lr, theta, mask)

    if has_eager(loss_of):
        fn.eager = _eager_client(loss_of, rule, masked=True)  # type: ignore[attr-defined]
    return fn


def first_order_message(
    step_grad: StepGrad, weights: list[float], units: str, x: Params, lr
) -> Params:
    """The first-order ClientUpdate of one client with fixed Θ (see :func:`make_client_fn`)."""
    y = x
    msg: Params | None = None  # 0 until the first θ_k ≠ 0
    last = len(weights) - 1
    for k, theta_k in enumerate(weights):
        g = step_grad(k, y)
        if theta_k and msg is None:
            # 0 + θ_k·g written as θ_k·g + 0 (the same bits: IEEE addition commutes, and
            # + 0 turns a −0 into +0 as 0 + (−0) does); θ_k = 1 multiplies exactly
            msg = {n: (v if theta_k == 1.0 else theta_k * v) + 0.0 for n, v in g.items()}
        elif theta_k:
            msg = _axpy(msg, theta_k, g)
        if k < last:
            y = _axpy(y, -lr, g)
    if msg is None:  # every θ_k = 0
        msg = {n: torch.zeros_like(v) for n, v in x.items()}
    if units == "delta":
        return {n: lr * msg[n] for n in msg}
    return msg


def make_client_fn(loss_of: LossOf, rule: ClientRule) -> Callable[..., Params]:
    """Build ``fn(x, lr, xb [nb, B, ...], yb [nb, B, ...]) -> message`` for ``rule``."""
    alpha = rule.prox_alpha
    weights = [float(t) for t in rule.theta]
    local_grad = local_grad_fn(loss_of)

    def first_order(x: Params, lr, xb, yb) -> Params:
        def step_grad(k: int, y: Params) -> Params:
            return local_grad(y, x, xb[k], yb[k], alpha)

        return first_order_message(step_grad, weights, rule.units, x, lr)

    def maml(x: Params, lr, xb, yb) -> Params:
        inner_steps = len(weights)

        def adapted_loss(x0: Params):
            y = x0
            for k in range(inner_steps):
                y = _axpy(y, -lr, local_grad(y, x0, xb[k], yb[k], alpha))
            return loss_of(y, xb[inner_steps], yb[inner_steps])

        return grad(adapted_loss)(x)

    if rule.second_order:
        return maml
    if has_eager(loss_of):
        first_order.eager = _eager_client(loss_of, rule, masked=False)  # type: ignore[attr-defined]
    return first_order


def _is_one(theta_k) -> bool:
    return not torch.is_tensor(theta_k) and theta_k == 1.0


def has_eager(loss_of: LossOf) -> bool:
    return isinstance(loss_of, ModuleLoss) and loss_of.eager


#: ``eager_grad(k, y) -> ∇f(y; S_k)``: step k's mini-batch gradient at the client's point y (its
#: tensors in the module's parameter order), without the proximal term
EagerGrad = Callable[[int, list[torch.Tensor]], Sequence[torch.Tensor]]


def _eager_client(loss: ModuleLoss, rule: ClientRule, masked: bool) -> Callable[..., Params]:
    """One client's first-order ClientUpdate with eager autograd (see the module docstring)."""
    fixed = [float(t) for t in rule.theta]

    def fn(x: Params, lr, xb, yb, theta=None, mask=None) -> Params:
        def eager_grad(k: int, y: list[torch.Tensor]) -> Sequence[torch.Tensor]:
            return loss.grad(ModuleLoss.leaves(y), xb[k], yb[k])

        steps = int(xb.shape[0]) if masked else len(fixed)
        return eager_message(loss, rule, x, lr, eager_grad, steps, theta if masked else fixed, mask)

    return fn


def eager_message(
    loss: ModuleLoss,
    rule: ClientRule,
    x: Params,
    lr,
    eager_grad: EagerGrad,
    steps: int,
    theta,
    mask=None,
) -> Params:
    """The first-order ClientUpdate of one client over ``steps`` steps, eagerly.

    ``theta`` is Θ as a list of floats (fixed steps, ``mask`` None) or the client's Θ row with
    its step mask (masked steps). Every arithmetic step is the expression of the functional form (``_axpy``: a + s·b, with
    the same s), so the message is bit for bit the same; a masked step (``mask[k]`` unset, the
    steps after τ_i) is skipped, which is what ``where_step`` makes of it.
    """
    names = loss.names
    if x.keys() != frozenset(names):
        raise KeyError("parameters do not match the module's")
    alpha = rule.prox_alpha
    masked = mask is not None
    x_leaves = [x[n] for n in names]
    y = x_leaves
    msg = [torch.zeros_like(v) for v in x_leaves]
    neg_lr = -lr if masked or steps > 1 else None  # one step: y is never updated
    for k in range(steps):
        if masked and not bool(mask[k]):
            break  # the real steps come first: the rest are exact no-ops
        g = eager_grad(k, y)
        if alpha:
            g = [gi + alpha * (yi - xi) for gi, yi, xi in zip(g, y, x_leaves, strict=True)]
        theta_k = theta[k]
        if masked or theta_k:
            # m + θ_k·g; θ_k = 1 multiplies exactly, so it is left out
            torch._foreach_add_(msg, g if _is_one(theta_k) else torch._foreach_mul(g, theta_k))
        if masked or k < steps - 1:
            step = torch._foreach_mul(g, neg_lr)
            if y is x_leaves:
                y = torch._foreach_add(y, step)  # the broadcast x is never written
            else:
                torch._foreach_add_(y, step)
    if rule.units == "delta":
        msg = torch._foreach_mul(msg, lr)
    out = dict(zip(names, msg, strict=True))
    return out if tuple(x) == names else {n: out[n] for n in x}
