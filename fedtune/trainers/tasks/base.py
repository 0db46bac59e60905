"""What a task is: a federated dataset, a model factory and a per-example loss.

All clients' examples live in one tensor; client ``i`` owns rows
``offsets[i] : offsets[i] + counts[i]``. Runners gather mini-batches with global row indices,
which lets the vectorized runner stack a cohort's batches as ``[M, K, B, ...]`` whatever the
clients' sizes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["CentralData", "Dataset", "FederatedData", "Task"]

#: per-example loss: (model outputs [B, ...], targets [B, ...]) -> losses [B]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: builds a freshly initialised model from a seeded generator
ModelFn = Callable[[torch.Generator], nn.Module]


@dataclass(frozen=True)
class Dataset:
    """A pooled (non-federated) set of examples, e.g. a test split or central data."""

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def to(self, device: torch.device | str) -> Dataset:
        return Dataset(self.inputs.to(device), self.targets.to(device))


@dataclass(frozen=True)
class FederatedData:
    """Per-client examples stored contiguously (see module docstring)."""

    inputs: torch.Tensor
    targets: torch.Tensor
    offsets: torch.Tensor  # [C] int64
    counts: torch.Tensor  # [C] int64
    client_ids: tuple[str, ...]

    @classmethod
    def from_clients(
        cls,
        clients: Sequence[tuple[torch.Tensor, torch.Tensor]],
        client_ids: Sequence[str] | None = None,
    ) -> FederatedData:
        if not clients:
            raise ValueError("a federated dataset needs at least one client")
        counts = torch.tensor([len(x) for x, _ in clients], dtype=torch.long)
        if int(counts.min()) <= 0:
            raise ValueError("every client needs at least one example")
        offsets = torch.cumsum(counts, 0) - counts
        ids = tuple(client_ids) if client_ids is not None else tuple(map(str, range(len(clients))))
        return cls(
            inputs=torch.cat([x for x, _ in clients]),
            targets=torch.cat([y for _, y in clients]),
            offsets=offsets,
            counts=counts,
            client_ids=ids,
        )

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def num_examples(self) -> int:
        return int(self.inputs.shape[0])

    def client(self, i: int) -> Dataset:
        lo = int(self.offsets[i])
        hi = lo + int(self.counts[i])
        return Dataset(self.inputs[lo:hi], self.targets[lo:hi])

    def pooled(self) -> Dataset:
        return Dataset(self.inputs, self.targets)

    def to(self, device: torch.device | str) -> FederatedData:
        return FederatedData(
            self.inputs.to(device),
            self.targets.to(device),
            self.offsets.to(device),
            self.counts.to(device),
            self.client_ids,
        )


@dataclass(frozen=True)
class CentralData:
    """Data held by the server for Mixed FL (`003_ede07a1bb30cfed7.txt`) with its loss weight."""

    data: Dataset
    weight: float = 1.0
    loss_fn: LossFn | None = None  # defaults to the task's loss


@dataclass(frozen=True)
class Task:
    """A federated learning problem.

    ``metric_fns`` map a name (``accuracy``) to a per-example metric ``(outputs, targets) -> [B]``;
    ``meta`` holds task facts for theory and reports (the quadratic task's exact ``A``, ``c``).
    """

    name: str
    train: FederatedData
    model_fn: ModelFn
    loss_fn: LossFn
    test: Dataset | None = None
    central: CentralData | None = None
    metric_fns: Mapping[str, LossFn] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
