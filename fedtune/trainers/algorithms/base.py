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
from typing import Any, Protocol, runtime_checkable

import torch

from ..runners import Runner
from ..steps import step_mask
from ..tasks.base import InMemoryData, Task

__all__ = [
    "Algorithm",
    "Cohort",
    "MeasuringAlgorithm",
    "RoundContext",
    "ServerState",
    "members_weighted_mean",
    "tree_norm",
]

Params = dict[str, torch.Tensor]


@dataclass
class ServerState:
    """The server's whole state between rounds, all tensors (what a checkpoint holds).

    Args:
        params: The model's parameters by name.
        opt_state: The server optimizer's state.
        extra: The algorithm's own state (e.g. control variates).
    """

    params: Params
    opt_state: dict[str, Any]
    extra: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Cohort:
    """The round's sampled clients, their batches and aggregation weights.

    Args:
        clients: Global indices of the M sampled clients ``[M]``.
        batches: Each client's batch rows ``[M, nb, B]``; with heterogeneous steps padded to
            ``[M, K_max + extra, B]``, the real steps first.
        weights: Aggregation weights ``[M]``.
        steps: Local steps τ_i = ⌈E·n_i/B⌉ per client, int64 ``[M]`` (None: every client
            runs the algorithm's fixed K).
    """

    clients: torch.Tensor
    batches: torch.Tensor
    weights: torch.Tensor
    steps: torch.Tensor | None = None

    @property
    def size(self) -> int:
        """The number of sampled clients M."""
        return int(self.clients.shape[0])

    def k_max(self, fixed: int) -> int:
        """Give the local-step loop's length.

        Args:
            fixed: The algorithm's K.

        Returns:
            ``fixed``, or max_i τ_i with heterogeneous steps.
        """
        return fixed if self.steps is None else int(self.steps.max())

    def step_counts(self, fixed: int) -> torch.Tensor:
        """Give every client's number of local steps τ_i.

        Args:
            fixed: The algorithm's K.

        Returns:
            int64 ``[M]``, all ``fixed`` when the steps are homogeneous.
        """
        if self.steps is not None:
            return self.steps
        return torch.full((self.size,), fixed, dtype=torch.long, device=self.clients.device)

    def mask(self) -> torch.Tensor | None:
        """Mark each client's real (not padding) steps.

        Returns:
            Bool ``[M, K_max]``, or None when every client runs K steps.
        """
        if self.steps is None:
            return None
        return step_mask(self.steps)


@dataclass(frozen=True)
class RoundContext:
    """What an algorithm's ``apply`` needs of the round besides the state and the cohort.

    Args:
        runner: Runs the client function over the cohort.
        loss_of: ``loss_of(params, x, y) -> [B]``, the model's per-example loss.
        data: The round's cohort view, its clients addressed by global index.
        task: The task.
        client_lr: The client learning rate γ_t in force.
        server_lr: The server learning rate η_t in force.
        round: The round's index t, from 0.
        seed: The trial seed, for algorithm-side draws (e.g. central batches).
    """

    runner: Runner
    loss_of: Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]
    data: InMemoryData  # the round's cohort view: its clients addressed by global index
    task: Task
    client_lr: float
    server_lr: float
    round: int
    seed: int = 0  # the trial seed, for algorithm-side draws (e.g. central batches)


class Algorithm(Protocol):
    """The contract of an algorithm: an initial server state and one round's update."""

    name: str

    def num_batches(self) -> int:
        """Batches each client draws per round (K)."""
        ...

    def init(self, params: Params) -> ServerState:
        """Make the initial server state from the model's initial parameters."""
        ...

    def broadcast(self, state: ServerState) -> Params:
        """Give the model the sampled clients receive (their loss ℓ_t is measured on it)."""
        ...

    def apply(
        self, state: ServerState, cohort: Cohort, ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float]]:
        """Run one round.

        Args:
            state: The server state.
            cohort: The round's clients, batches and weights.
            ctx: The round's runner, data, rates and index.

        Returns:
            The new state and the round's diagnostics (``update_norm`` at least).
        """
        ...


@runtime_checkable
class MeasuringAlgorithm(Protocol):
    """An algorithm whose clients can give their loss ℓ_i at the broadcast model from their
    first local step, where that step is at the broadcast model and one forward pass serves
    both (:mod:`fedtune.trainers.first_step`); the engine then skips its separate ℓ_t pass."""

    def measures_client_losses(self, cohort: Cohort, ctx: RoundContext) -> bool:
        """Whether :meth:`apply_measuring` may run this round (its rule and its clients)."""
        ...

    def apply_measuring(
        self, state: ServerState, cohort: Cohort, ctx: RoundContext
    ) -> tuple[ServerState, dict[str, float], torch.Tensor]:
        """Run one round as ``apply`` does; also give the clients' losses ℓ_i ``[M]``."""
        ...


def tree_norm(tree: Params) -> float:
    """Compute the Euclidean norm of a parameter tree, in float64.

    Args:
        tree: Tensors by name.

    Returns:
        sqrt(Σ ‖v‖²) over the tensors.
    """
    return float(torch.sqrt(sum((v.double() ** 2).sum() for v in tree.values())))


def members_weighted_mean(stacked: Params, weights: torch.Tensor) -> Params:
    """:func:`weighted_mean` of each member of a pack: Σ_i w_{p,i} q_{p,i}.

    Args:
        stacked: Tensors by name, stacked ``[P, M, ...]`` (members, then clients).
        weights: The weights ``[P, M]``, or ``[M]`` shared by every member.

    Returns:
        The weighted sums by name, ``[P, ...]``.
    """
    out = {}
    for k, v in stacked.items():
        w = weights.to(v.dtype)
        w = w.reshape(*([1] * (2 - w.dim())), *w.shape, *([1] * (v.dim() - 2)))
        out[k] = (w * v).sum(1)
    return out


def weighted_mean(stacked: Params, weights: torch.Tensor) -> Params:
    """Average stacked client tensors with weights: Σ_i w_i q_i.

    Args:
        stacked: Tensors by name, stacked on a leading client axis ``[M, ...]``.
        weights: The weights w_i ``[M]``.

    Returns:
        The weighted sums by name.
    """
    out = {}
    for k, v in stacked.items():
        w = weights.to(v.dtype).reshape((-1,) + (1,) * (v.dim() - 1))
        out[k] = (w * v).sum(0)
    return out
