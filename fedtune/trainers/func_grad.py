"""``torch.func.grad`` without importing ``torch._dynamo``: the engine's gradient transform.

Every local step of a client function differentiates the loss with a ``grad`` transform
(:mod:`fedtune.trainers.client` and the algorithms' client functions, vmapped by the runner).
``torch.func.grad`` computes the gradient with ``torch.autograd.grad`` inside
``torch._dynamo.compiled_autograd._disable()`` (torch 2.13,
``torch/_functorch/eager_transforms.py::_autograd_grad``), and naming ``torch._dynamo`` imports
the whole compiler package: about 1 CPU-second (0.92–1.01 s with the engine imported) of every
training process that evaluates a gradient under vmap, for a context manager that switches off a compiled-autograd compiler
which only ``torch._dynamo`` can switch on.

:func:`grad` is that transform taken step for step, with the same functorch calls in the same
order (a grad level, the arguments wrapped at it, the differentiated ones made to require
grad, ``torch.autograd.grad`` with ``create_graph=True`` and ``allow_unused=True``, zeros for
an unused input, the results unwrapped), minus the context manager: the same operators, so
the same bits (``tests/unit/test_func_grad.py`` checks it against ``torch.func.grad``, nested
and under vmap). Where ``torch._dynamo`` is already loaded (a user's code compiled something,
so compiled autograd may be on), or torch no longer has the functorch helpers it uses, it is
``torch.func.grad`` itself.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._pytree import tree_flatten, tree_map_, tree_unflatten

try:  # the functorch helpers torch.func.grad is built of (torch 2.13)
    from torch._functorch.eager_transforms import (
        _create_differentiable,
        _slice_argnums,
        _undo_create_differentiable,
        _wrap_all_tensors,
        grad_increment_nesting,
    )
except ImportError:  # another torch: torch.func.grad as it is
    grad_increment_nesting = None

__all__ = ["grad"]


def grad(func: Callable[..., Any], argnums: int | tuple[int, ...] = 0, has_aux: bool = False):
    """The gradient of a scalar ``func`` with respect to its ``argnums`` arguments.

    ``torch.func.grad``'s transform, bit for bit, without importing ``torch._dynamo`` (see the
    module docstring); it nests and composes with ``vmap`` as ``torch.func.grad`` does.

    Args:
        func: A function returning a scalar tensor (``(scalar, aux)`` with ``has_aux``).
        argnums: The argument, or arguments, to differentiate with respect to.
        has_aux: ``func`` returns ``(output, aux)``; the gradient comes with ``aux``.

    Returns:
        ``fn(*args, **kwargs) -> gradient`` (``(gradient, aux)`` with ``has_aux``), the
        gradient shaped as the differentiated arguments.
    """
    transform = torch.func.grad(func, argnums, has_aux)
    if grad_increment_nesting is None:
        return transform

    def wrapper(*args: Any, **kwargs: Any) -> Any:
        if "torch._dynamo" in sys.modules:  # compiled autograd may be on: torch's own transform
            return transform(*args, **kwargs)
        return _grad(func, argnums, has_aux, args, kwargs)

    return wrapper


def _grad(func, argnums, has_aux: bool, args: tuple, kwargs: dict) -> Any:
    """``torch._functorch.eager_transforms.grad_impl`` without ``compiled_autograd._disable``."""
    # like torch.func.grad, the transform ignores an enclosing no_grad
    with grad_increment_nesting() as level, torch.enable_grad():
        args = _wrap_all_tensors(args, level)
        kwargs = _wrap_all_tensors(kwargs, level)
        diff_args = _slice_argnums(args, argnums, as_tuple=False)
        tree_map_(lambda t: _create_differentiable(t, level), diff_args)
        output = func(*args, **kwargs)
        if has_aux:
            if not (isinstance(output, tuple) and len(output) == 2):
                raise RuntimeError("grad(f)(*args): with has_aux, f must return (output, aux)")
            output, aux = output
        if not isinstance(output, torch.Tensor) or output.dim() != 0:
            raise RuntimeError("grad(f)(*args): f must return a scalar tensor")
        flat_diff_args, spec = tree_flatten(diff_args)
        flat_grads = _autograd_grad(output, flat_diff_args)
        gradient = _undo_create_differentiable(tree_unflatten(flat_grads, spec), level)
        if has_aux:
            return gradient, _undo_create_differentiable(aux, level)
        return gradient


def _autograd_grad(output: torch.Tensor, inputs: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    """∂output/∂inputs, zeros for an input the output does not depend on (functorch's
    ``_autograd_grad`` for one scalar output, ``create_graph`` so that grads nest)."""
    if not output.requires_grad:
        return tuple(torch.zeros_like(t) for t in inputs)
    grads = torch.autograd.grad(
        output, inputs, retain_graph=False, create_graph=True, allow_unused=True
    )
    return tuple(
        torch.zeros_like(t) if g is None else g for g, t in zip(grads, inputs, strict=True)
    )
