"""Runners decide how the sampled clients execute (FedJAX `for_each_client`,
docs/development/style.md).

A runner maps a pure client function over the cohort::

    runner.map(fn, shared=(x, lr), per_client=(xb, yb)) -> outputs stacked on a leading M axis

* :class:`SequentialRunner` — the reference: a Python loop over clients. A client function
  with an eager twin (``fn.eager``, :mod:`fedtune.trainers.client`) runs that: the same
  arithmetic with eager autograd on the module, without torch.func's per-step dispatch.
* :class:`VectorizedRunner` — ``torch.func.vmap`` over the cohort (parameters shared, batches
  stacked ``[M, K, B, ...]``). It must give the same numbers as the sequential runner; a model
  that cannot be vmapped (e.g. an op without a batching rule) falls back to the sequential runner
  once, with the reason logged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import torch
from torch.utils import _pytree as pytree

__all__ = ["Runner", "SequentialRunner", "VectorizedRunner", "choose_runner", "make_runner"]

log = logging.getLogger("fedtune.trainers")


class Runner:
    """Base of the runners: how a pure client function runs over the cohort."""

    name = "runner"

    def map(self, fn: Callable[..., Any], shared: tuple, per_client: tuple) -> Any:
        """Run ``fn(*shared, *per_client[i])`` for every client ``i`` of the cohort.

        Args:
            fn: A pure client function.
            shared: Arguments every client gets (e.g. the broadcast model, the rate).
            per_client: Arguments stacked on a leading client axis ``M`` (e.g. batches).

        Returns:
            The outputs, stacked on a leading ``M`` axis.
        """
        raise NotImplementedError


class SequentialRunner(Runner):
    """The reference runner: a Python loop over the clients (``fn.eager`` when it has one)."""

    name = "sequential"

    def map(self, fn, shared, per_client):
        fn = getattr(fn, "eager", fn)
        leaves, spec = pytree.tree_flatten(per_client)
        # client i's arguments: row i of every leaf (``unbind`` gives the views ``a[i]`` gives)
        rows = [leaf.unbind(0) if torch.is_tensor(leaf) else leaf for leaf in leaves]
        flat = type(per_client) is tuple and all(map(torch.is_tensor, per_client))
        outs = []
        for i in range(leaves[0].shape[0]):
            if flat:  # a tuple of tensors: no tree to rebuild per client
                args = tuple(r[i] for r in rows)
            else:
                args = pytree.tree_unflatten([r[i] for r in rows], spec)
            outs.append(fn(*shared, *args))
        return _stack(outs)


def _stack(outs: list) -> Any:
    """The clients' outputs stacked on a leading client axis (``torch.stack`` per leaf)."""
    first = outs[0]
    if type(first) is dict and all(
        type(o) is dict and o.keys() == first.keys() and all(map(torch.is_tensor, o.values()))
        for o in outs
    ):  # the usual message, a dict of tensors: no tree walk
        return {k: torch.stack([o[k] for o in outs]) for k in first}
    if torch.is_tensor(first) and all(map(torch.is_tensor, outs)):
        return torch.stack(outs)
    if type(first) is tuple and all(type(o) is tuple and len(o) == len(first) for o in outs):
        # e.g. (message, losses): each part stacked as above
        return tuple(_stack([o[i] for o in outs]) for i in range(len(first)))
    return pytree.tree_map(lambda *xs: torch.stack(xs), *outs)


class VectorizedRunner(Runner):
    """``torch.func.vmap`` over the cohort; falls back to the sequential runner once, for good."""

    name = "vectorized"

    def __init__(self) -> None:
        self.fallback: SequentialRunner | None = None
        self.fallback_reason: str | None = None

    def map(self, fn, shared, per_client):
        if self.fallback is not None:
            return self.fallback.map(fn, shared, per_client)
        in_dims = (None,) * len(shared) + (0,) * len(per_client)
        try:
            return torch.func.vmap(fn, in_dims=in_dims, randomness="different")(
                *shared, *per_client
            )
        except (RuntimeError, NotImplementedError, ValueError) as exc:
            self.fallback_reason = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
            log.warning("vectorized runner unavailable, using sequential: %s", self.fallback_reason)
            self.fallback = SequentialRunner()
            return self.fallback.map(fn, shared, per_client)

    @property
    def effective_name(self) -> str:
        """``vectorized``, or ``sequential(fallback)`` once it has fallen back."""
        return "sequential(fallback)" if self.fallback is not None else self.name


#: ``runner: auto`` on a CPU: models with at least this many parameters run sequentially
AUTO_SEQUENTIAL_MIN_PARAMS = 1_000_000


def choose_runner(
    kind: str, num_params: int, device: torch.device, clients: int, steps: int | None
) -> str:
    """Resolve ``train.runner`` to ``vectorized`` or ``sequential``.

    ``auto`` is a fixed rule, never a timing: sequential on a CPU for one client per round or
    a model of at least :data:`AUTO_SEQUENTIAL_MIN_PARAMS` parameters, vectorized otherwise.

    Args:
        kind: ``auto``, ``vectorized`` or ``sequential``.
        num_params: The model's number of parameters.
        device: The device the trial runs on.
        clients: Clients per round.
        steps: Local steps per client (unused by the rule).

    Returns:
        ``vectorized`` or ``sequential``.
    """
    if kind != "auto":
        return kind
    if device.type == "cpu" and (clients <= 1 or num_params >= AUTO_SEQUENTIAL_MIN_PARAMS):
        return "sequential"
    return "vectorized"


def make_runner(kind: str) -> Runner:
    """Make the runner of a resolved kind (resolve ``auto`` with :func:`choose_runner` first).

    Args:
        kind: ``sequential``; anything else gives the vectorized runner.

    Returns:
        The runner.
    """
    if kind == "sequential":
        return SequentialRunner()
    return VectorizedRunner()
