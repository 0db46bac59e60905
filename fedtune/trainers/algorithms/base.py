"""The algorithm contract (FedJAX `federated_algorithm.py`, docs/development/style.md).

An algorithm is ``init(params) -> ServerState`` plus ``apply(state, cohort, ctx) -> (state,
diagnostics)``; ``broadcast(state)`` is the model the sampled clients receive (and on which
their pre-training loss ℓ_t is measured). Server state is an explicit value: parameters, the
server optimizer's state and algorithm extras (e.g. control variates), all tensors, so that a
checkpoint after any round restores the run exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch

from ..runners import Runner
from ..steps import step_mask
from ..tasks.base import InMemoryData, Task

__all__ = ["Algorithm", "Cohort", "RoundContext", "ServerState", "tree_norm"]

Params = dict[str, torch.Tensor]


@dataclass
class ServerState:
    params: Params
    opt_state: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cohort:
    """The round's sampled clients, their batch rows [M, nb, B] and aggregation weights [M].

    ``steps`` [M] (int64) is None when every client runs the algorithm's fixed K; with
    ``train.local_epochs`` it holds τ_i = ⌈E·n_i/B⌉ and ``batches`` is padded to
    [M, K_max + extra, B] (the real steps first, see :mod:`fedtune.trainers.steps`).
    """

    clients: torch.Tensor
    batches: torch.Tensor
    weights: torch.Tensor
    steps: torch.Tensor | None = None

    @property
    def size(self) -> int:
        return int(self.clients.shape[0])

    def k_max(self, fixed: int) -> int:
        """Local-step loop length: ``fixed`` K, or max_i τ_i with heterogeneous steps."""
        return fixed if self.steps is None else int(self.steps.max())

    def step_counts(self, fixed: int) -> torch.Tensor:
        """τ_i of every client [M] (all ``fixed`` when the steps are homogeneous)."""
        if self.steps is not None:
            return self.steps
        return torch.full((self.size,), fixed, dtype=torch.long, device=self.clients.device)

    def mask(self) -> torch.Tensor | None:
        """Bool [M, K_max] of real steps, or None when every client runs K steps."""
        if self.steps is None:
            return None
        return step_mask(self.steps)


@dataclass(frozen=True)
class RoundContext:
    runner: Runner
    loss_of: Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]
    data: InMemoryData  # the round's cohort view: its clients addressed by global index
    task: Task
    client_lr: float
    server_lr: float
    round: int
    seed: int = 0  # the trial seed, for algorithm-side draws (e.g. central batches)


class Algorithm(Protocol):
    name: str

    def num_batches(self) -> int: ...

    def init(self, params: Params) -> ServerState: ...

    def broadcast(self, state: ServerState) -> Params: ...

    def apply(
        self, state: ServerState, cohort: Cohort, ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]: ...


def tree_norm(tree: Params) -> float:
    return float(torch.sqrt(sum((v.double() ** 2).sum() for v in tree.values())))


def weighted_mean(stacked: Params, weights: torch.Tensor) -> Params:
    """Σ_i w_i q_i over the leading (client) axis."""
    out = {}
    for k, v in stacked.items():
        w = weights.to(v.dtype).reshape((-1,) + (1,) * (v.dim() - 1))
        out[k] = (w * v).sum(0)
    return out
