"""The model's loss as a pure function of a parameter dict, with an eager twin.

:class:`ModuleLoss` is what the engine hands to algorithms as ``loss_of(params, x, y)``: the
mean of ``task.loss_fn(model(x), y)`` with the model's parameters replaced by ``params``; it
composes with ``grad`` and ``vmap``. The parameters are swapped into the module's slots for the
forward pass (:meth:`ModuleLoss.outputs`), which under torch.func's transforms gives what
``torch.func.functional_call`` gives, bit for bit, without its per-call re-parametrisation
(a context manager and a walk over the module's members: about 5 % of a vectorized K=1 round of
the digits linear model); a model without plain slots, or a parameter dict that does not name
every parameter, goes through ``functional_call``.

Its eager twin serves the per-client loop of the sequential runner, where torch.func's
dispatch and ``functional_call``'s re-parametrisation cost more than the model itself
(a profile of the linear model at M=10, K=10 put ~85 % of a step there): :meth:`ModuleLoss.grad`
writes the client's parameter tensors straight into the module's parameter slots, runs the
forward pass, puts the original parameters back and calls ``torch.autograd.grad`` on the
leaves. The forward and backward are the same operators as under ``torch.func.grad``, so the
gradient is bit for bit the same (tests/unit/test_eager_runner.py).

Models whose parameters are not plain slots (``torch.nn.utils.parametrize``) have no eager
twin (:attr:`ModuleLoss.eager`) and keep ``functional_call``. Buffers are not touched: the
built-in models have none, and a model with buffers reads them from the module in both paths.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn
from torch.func import functional_call

__all__ = ["ModuleLoss"]

Params = dict[str, torch.Tensor]


class ModuleLoss:
    """``loss_of(params, x, y)`` for ``module`` and ``loss_fn(outputs, targets) -> [B]``."""

    def __init__(
        self, module: nn.Module, loss_fn: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    ) -> None:
        self.module = module
        self.loss_fn = loss_fn
        names = [n for n, _ in module.named_parameters()]
        self.names: tuple[str, ...] = tuple(names)
        self._name_set = frozenset(names)
        # every slot a parameter lives in (tied weights: several) and the index of its tensor
        index = {id(p): i for i, (_, p) in enumerate(module.named_parameters())}
        self._slots: list[tuple[nn.Module, str, int]] = []
        for name, p in module.named_parameters(remove_duplicate=False):
            owner, _, attr = name.rpartition(".")
            self._slots.append((module.get_submodule(owner), attr, index[id(p)]))
        self.eager = not any(
            getattr(m, "parametrizations", None) is not None for m in module.modules()
        )

    # -- functional (torch.func) ------------------------------------------------------------
    def per_example(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(self.forward(params, x), y)

    def __call__(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.per_example(params, x, y).mean()

    # -- eager ------------------------------------------------------------------------------
    def outputs(self, tensors: Sequence[torch.Tensor], x: torch.Tensor) -> torch.Tensor:
        """``module(x)`` with ``tensors`` (ordered as :attr:`names`) in the parameter slots;
        the module's own parameters are put back afterwards."""
        slots = self._slots
        saved = [m._parameters[a] for m, a, _ in slots]
        try:
            for m, a, i in slots:
                m._parameters[a] = tensors[i]  # a plain tensor in the slot, as stateless did
            return self.module(x)
        finally:
            for (m, a, _), p in zip(slots, saved, strict=True):
                m._parameters[a] = p

    def grad(
        self, leaves: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        """∇ of the mean loss at ``leaves`` (ordered as :attr:`names`, requiring grad: see
        :meth:`leaves`), by eager autograd."""
        if not torch.is_grad_enabled():
            with torch.enable_grad():
                return self.grad(leaves, x, y)
        loss = self.loss_fn(self.outputs(leaves, x), y).mean()
        return torch.autograd.grad(loss, leaves)

    def grad_and_losses(
        self, leaves: Sequence[torch.Tensor], x: torch.Tensor, y: torch.Tensor, w: torch.Tensor
    ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """∇ at ``leaves`` of the weighted loss Σ_j w_j·loss_j over the examples of ``x``, and
        the per-example losses (detached), from one forward pass.

        Args:
            leaves: The parameters, ordered as :attr:`names`, requiring grad (:meth:`leaves`).
            x: Inputs ``[n, ...]``.
            y: Targets ``[n, ...]``.
            w: The examples' weights ``[n]``.

        Returns:
            The gradient of ``losses · w`` and ``losses [n]``.
        """
        if not torch.is_grad_enabled():
            with torch.enable_grad():
                return self.grad_and_losses(leaves, x, y, w)
        losses = self.loss_fn(self.outputs(leaves, x), y)
        grads = torch.autograd.grad(torch.dot(losses, w), leaves)
        return grads, losses.detach()

    def forward(self, params: Params, x: torch.Tensor) -> torch.Tensor:
        """``module(x)`` at ``params``: the slot swap of :meth:`outputs` where the model has
        plain parameter slots and ``params`` names each parameter, else ``functional_call``.

        Both put ``params`` in the module's place and run the same forward, so they give the
        same values, inside torch.func's transforms (the client functions) as outside (the
        evaluations: ℓ_t, population and test loss, test metrics); the slot swap skips
        ``functional_call``'s re-parametrisation (a context manager and a walk over the
        module's members per call).
        """
        if not self.eager or params.keys() != self._name_set:
            return functional_call(self.module, params, (x,))
        return self.outputs([params[n] for n in self.names], x)

    def evaluate(self, params: Params, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Per-example losses at ``params`` outside torch.func (:meth:`forward`)."""
        return self.loss_fn(self.forward(params, x), y)

    @staticmethod
    def leaves(tensors: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        return [t.detach().requires_grad_() for t in tensors]
