"""The bookkeeping of a :class:`~fedtune.trainers.packed.PackedTrainer`: a member, a group of
members at one round index between their broadcast and their update, and the row operations
on the stacked state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from .algorithms import Cohort, LocalUpdate
from .config import TrialConfig
from .decay import DecayController
from .records import Outcome, RoundRecord, divergence

Params = dict[str, torch.Tensor]

__all__ = ["Group", "Index", "Member", "member_weights", "pad_steps", "stacked_rows"]


class Index:
    """The index tensor of ``positions`` on each device asked for (built once per device: an
    adaptive server optimizer keeps its step count ``t`` on the CPU beside CUDA state)."""

    def __init__(self, positions: Sequence[int]) -> None:
        self.positions, self._on = list(positions), {}

    def on(self, device: torch.device) -> torch.Tensor:
        if device not in self._on:
            self._on[device] = torch.tensor(self.positions, dtype=torch.long, device=device)
        return self._on[device]


def stacked_rows(tree: Any, positions: Sequence[int]) -> Any:
    """The rows ``positions`` of every stacked tensor of ``tree``, each indexed on its own
    device."""
    index = Index(positions)
    return pytree.tree_map(lambda v: v.index_select(0, index.on(v.device)), tree)


@dataclass
class Member:
    """One configuration of the pack: its parts, its decay state machine and its records."""

    config: TrialConfig
    hparams: Any
    algorithm: LocalUpdate
    local_steps: int
    decay: DecayController
    records: list[RoundRecord] = field(default_factory=list)
    outcome: Outcome | None = None
    reason: str = ""
    initial_loss: float | None = None
    wall: float = 0.0
    examples: int = 0

    @property
    def round(self) -> int:
        return len(self.records)

    @property
    def done(self) -> bool:
        return self.outcome is not None or self.round >= self.config.train.rounds

    def diverges(self, t: int, loss: float) -> bool:
        """Take round ``t``'s client loss ℓ_t; end as ``diverged`` when it is not finite or
        exceeds ``train.divergence_factor`` · |ℓ_1| (the engine's rule).

        Args:
            t: The round (0-based).
            loss: Its client loss ℓ_t.

        Returns:
            Whether the member diverged in this round.
        """
        factor = self.config.train.divergence_factor
        self.initial_loss, why = divergence(loss, self.initial_loss, factor, t)
        if why is None:
            return False
        self.outcome, self.reason = Outcome.DIVERGED, why
        return True


@dataclass
class Group:
    """The members of one round index in a step, between their broadcast and their local
    steps (:meth:`PackedTrainer._open`) and after them (:meth:`PackedTrainer._close`)."""

    t: int
    positions: list[int]  # in the stacked state
    members: list[Member]
    data: Any  # the cohort view
    weights: torch.Tensor  # w_i of the cohort [M]
    params: Params
    opt_state: Any
    consts: dict[str, torch.Tensor]
    x: Params  # the broadcast models [G, …]
    client_loss: list[float]
    client_lr: list[float]  # γ_t of each member this round (its decay scale applied)
    rows: torch.Tensor  # [G, M, K_max, B]
    steps: torch.Tensor  # [G, M]
    thetas: torch.Tensor  # [G, M, K_max]
    cohorts: list[Cohort]


def member_weights(group: Group) -> torch.Tensor:
    """The cohort's weights w_i once per member of ``group``: ``[G, M]``."""
    return group.weights.unsqueeze(0).expand(len(group.members), -1)


def pad_steps(v: torch.Tensor, k_max: int, zero: bool = False) -> torch.Tensor:
    """``[G, M, K, …]`` padded to K_max steps: rows repeat the last batch (real rows, masked),
    Θ rows are 0 (``zero``)."""
    k = v.shape[2]
    if k == k_max:
        return v
    pad = torch.zeros_like(v[:, :, :1]) if zero else v[:, :, -1:]
    return torch.cat([v, pad.expand(*v.shape[:2], k_max - k, *v.shape[3:])], 2)
