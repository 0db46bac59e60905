"""What a task is: a federated dataset, a model factory and a per-example loss.

Federated data is an interface, :class:`FederatedData`. The engine asks a store for:

* ``num_clients`` and ``client_sizes`` (n_i, int64 ``[C]`` on the CPU) — cheap metadata that
  is always in memory (hetero local work reads n_i from here);
* ``cohort(clients)`` — the round's clients materialised as an :class:`InMemoryData` *view*:
  its rows are those clients' examples, in the order given, and ``offsets[c]`` / ``counts[c]``
  address client ``c`` by its *global* index, so runners and algorithms gather mini-batches with
  ``view.inputs[rows]`` whatever the store. Only the listed clients are addressable in a view;
  the other clients' offsets point past its last row;
* ``row_chunks(max_rows)`` — the population as consecutive windows of at most ``max_rows`` rows
  (clients in index order) with each row's owner, for the population loss
  f(x) = (1/C) Σ_i (1/n_i) Σ_{j ∈ client i} ℓ(x; ξ_j), so evaluation never holds more than
  ``max_rows`` rows (plus the clients straddling a window edge) at once.

:class:`InMemoryData` is the default (every built-in task and ``from_clients``): all clients'
examples live in one tensor, client ``i`` owning rows ``offsets[i] : offsets[i] + counts[i]``;
its cohort is itself and its one chunk is the whole population, i.e. exactly the computation of
the engine before the interface existed. File-backed stores (:mod:`.lazy`: TFF HDF5, LEAF
JSON) load per cohort, so the memory of a round does not grow with the population.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

__all__ = ["CentralData", "Dataset", "FederatedData", "InMemoryData", "RowChunk", "Task"]

#: per-example loss: (model outputs [B, ...], targets [B, ...]) -> losses [B]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
#: builds a freshly initialised model from a seeded generator
ModelFn = Callable[[torch.Generator], nn.Module]
#: (inputs [R, ...], targets [R, ...], owner [R] global client index) of one population window
RowChunk = tuple[torch.Tensor, torch.Tensor, torch.Tensor]


def cast(t: torch.Tensor, device: torch.device | str, dtype: torch.dtype | None) -> torch.Tensor:
    """Move ``t`` to ``device``; floating tensors also to ``dtype`` (integer ids stay ids)."""
    if dtype is not None and t.is_floating_point():
        return t.to(device=device, dtype=dtype)
    return t.to(device)


@dataclass(frozen=True)
class Dataset:
    """A pooled (non-federated) set of examples, e.g. a test split or central data.

    Args:
        inputs: The examples' inputs ``[N, ...]``.
        targets: Their targets ``[N, ...]``.
    """

    inputs: torch.Tensor
    targets: torch.Tensor

    def __len__(self) -> int:
        return int(self.inputs.shape[0])

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> Dataset:
        """Move the examples to ``device``, floating tensors also to ``dtype``.

        Args:
            device: The device.
            dtype: The floating dtype (None: unchanged); integer ids stay ids.

        Returns:
            The moved dataset.
        """
        return Dataset(cast(self.inputs, device, dtype), cast(self.targets, device, dtype))


class FederatedData(ABC):
    """The interface of a task's clients' examples, in memory or on disk.

    A store implements ``num_clients``, ``client_sizes``, ``cohort``, ``to`` and a
    ``client_ids`` attribute, and yields the same tensors for the same clients; the other
    methods have defaults built on ``cohort``.
    """

    #: rows per population-evaluation window (``None``: the whole population at once)
    eval_chunk_rows: int | None = None
    #: the clients' ids in index order (an attribute or property of each store)
    client_ids: Sequence[str]

    @property
    @abstractmethod
    def num_clients(self) -> int:
        """The number of clients C."""

    @property
    @abstractmethod
    def client_sizes(self) -> torch.Tensor:
        """n_i of every client, int64 ``[C]`` on the CPU (every n_i ≥ 1)."""

    @abstractmethod
    def cohort(self, clients: Sequence[int] | torch.Tensor) -> InMemoryData:
        """Load the listed clients' examples.

        Args:
            clients: Global client indices.

        Returns:
            A view holding those clients' rows, in the order given, addressed by global index.
        """

    @abstractmethod
    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> FederatedData:
        """Give this data with its tensors on ``device`` (floating ones as ``dtype``).

        Args:
            device: The device.
            dtype: The floating dtype (None: unchanged).

        Returns:
            The data; a file-backed store casts each cohort when it loads it.
        """

    @property
    def num_examples(self) -> int:
        """The number of examples of all clients together."""
        return int(self.client_sizes.sum())

    def release(self) -> None:
        """Hand memory freed by reads back to the operating system (called after each window).

        A file-backed store overrides it so that evaluating the population peaks at one
        window's working set; in memory there is nothing to do.
        """
        return None

    def client(self, i: int) -> Dataset:
        """Load one client's examples.

        Args:
            i: The client's global index.

        Returns:
            Its examples.
        """
        return self.cohort([i]).client(i)

    def row_chunks(self, max_rows: int | None) -> Iterator[RowChunk]:
        """Iterate over the population's rows in windows, loading only the clients each overlaps.

        Args:
            max_rows: Rows per window (None: one window).

        Yields:
            ``(inputs, targets, owner)`` of each window; ``owner`` is each row's client index.
        """
        sizes = self.client_sizes
        for a, b, lo, hi, first in _windows(sizes, max_rows):
            view = self.cohort(list(range(lo, hi + 1)))
            start = int(view.offsets[lo]) + first
            owner = torch.repeat_interleave(torch.arange(lo, hi + 1), sizes[lo : hi + 1])
            yield (
                view.inputs[start : start + b - a],
                view.targets[start : start + b - a],
                owner[first : first + b - a],
            )
            del view, owner
            self.release()

    def client_row_chunks(self, clients: torch.Tensor, max_rows: int | None) -> Iterator[RowChunk]:
        """Iterate over the listed clients' rows in windows, loading only the clients each overlaps.

        Args:
            clients: Global client indices; their rows come client after client in this order.
            max_rows: Rows per window (None: one window).

        Yields:
            ``(inputs, targets, owner)`` of each window; ``owner`` is each row's position in
            ``clients``.
        """
        clients = torch.as_tensor(clients, dtype=torch.long)
        sizes = self.client_sizes[clients]
        for a, b, lo, hi, first in _windows(sizes, max_rows):
            view = self.cohort(clients[lo : hi + 1])
            rows = client_rows(view.offsets[clients[lo : hi + 1]], sizes[lo : hi + 1])
            take = rows[first : first + b - a]
            owner = torch.repeat_interleave(torch.arange(lo, hi + 1), sizes[lo : hi + 1])
            yield view.inputs[take], view.targets[take], owner[first : first + b - a]
            del view, rows, take, owner
            self.release()

    @classmethod
    def from_arrays(
        cls,
        inputs: torch.Tensor,
        targets: torch.Tensor,
        counts: torch.Tensor,
        client_ids: Sequence[str] | None = None,
    ) -> InMemoryData:
        """Build an in-memory store from all clients' rows at once.

        Args:
            inputs: Every client's inputs, client after client ``[N, ...]``.
            targets: Their targets ``[N, ...]``.
            counts: Rows per client ``[C]``: client ``i`` owns the next ``counts[i]`` rows.
            client_ids: The clients' ids (None: ``"0"``, ``"1"`` …).

        Returns:
            The store.

        Raises:
            ValueError: A client without examples, or counts that do not add up to the rows.
        """
        counts = torch.as_tensor(counts, dtype=torch.long)
        if counts.ndim != 1 or not len(counts) or int(counts.min()) <= 0:
            raise ValueError("every client needs at least one example")
        if int(counts.sum()) != len(inputs) or len(inputs) != len(targets):
            raise ValueError("client sizes do not add up to the number of rows")
        ids = tuple(client_ids) if client_ids is not None else tuple(map(str, range(len(counts))))
        return InMemoryData(inputs, targets, torch.cumsum(counts, 0) - counts, counts, ids)

    @classmethod
    def from_clients(
        cls,
        clients: Sequence[tuple[torch.Tensor, torch.Tensor]],
        client_ids: Sequence[str] | None = None,
    ) -> InMemoryData:
        """Build an in-memory store from each client's examples.

        Args:
            clients: ``[(inputs_i, targets_i), ...]``, one pair per client.
            client_ids: The clients' ids (None: ``"0"``, ``"1"`` …).

        Returns:
            The store.

        Raises:
            ValueError: No client, or a client without examples.
        """
        if not clients:
            raise ValueError("a federated dataset needs at least one client")
        counts = torch.tensor([len(x) for x, _ in clients], dtype=torch.long)
        if int(counts.min()) <= 0:
            raise ValueError("every client needs at least one example")
        offsets = torch.cumsum(counts, 0) - counts
        ids = tuple(client_ids) if client_ids is not None else tuple(map(str, range(len(clients))))
        return InMemoryData(
            inputs=torch.cat([x for x, _ in clients]),
            targets=torch.cat([y for _, y in clients]),
            offsets=offsets,
            counts=counts,
            client_ids=ids,
        )


def _windows(sizes: torch.Tensor, max_rows: int | None) -> Iterator[tuple[int, int, int, int, int]]:
    """Windows ``[a, b)`` of at most ``max_rows`` of the rows of clients of ``sizes`` laid end to
    end: ``(a, b, lo, hi, first)`` — positions ``lo..hi`` overlap it, and it starts at row
    ``first`` of position ``lo``."""
    ends = torch.cumsum(sizes, 0)
    total = int(ends[-1])
    step = total if max_rows is None else max_rows
    for a in range(0, total, step):
        b = min(a + step, total)
        lo = int(torch.searchsorted(ends, a, right=True))
        hi = int(torch.searchsorted(ends, b - 1, right=True))
        yield a, b, lo, hi, a - int(ends[lo] - sizes[lo])


def client_rows(offsets: torch.Tensor, counts: torch.Tensor) -> torch.Tensor:
    """Row indices ``offsets[j] : offsets[j] + counts[j]`` of every j, concatenated (no Python
    loop over clients)."""
    starts = torch.repeat_interleave(offsets - (torch.cumsum(counts, 0) - counts), counts)
    return starts + torch.arange(int(counts.sum()))


@dataclass(frozen=True)
class InMemoryData(FederatedData):
    """All clients' examples in one tensor (build it with :meth:`FederatedData.from_clients`).

    Args:
        inputs: The rows' inputs.
        targets: The rows' targets.
        offsets: Client ``i``'s first row, int64 ``[C]`` on the CPU.
        counts: Client ``i``'s number of rows, int64 ``[C]`` on the CPU.
        client_ids: The clients' ids in index order.
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    offsets: torch.Tensor  # [C] int64
    counts: torch.Tensor  # [C] int64
    client_ids: Sequence[str]

    @property
    def num_clients(self) -> int:
        return int(self.counts.shape[0])

    @property
    def client_sizes(self) -> torch.Tensor:
        return self.counts

    @property
    def num_examples(self) -> int:
        return int(self.inputs.shape[0])

    def cohort(self, clients: Sequence[int] | torch.Tensor) -> InMemoryData:
        return self

    def row_chunks(self, max_rows: int | None) -> Iterator[RowChunk]:
        owner = torch.repeat_interleave(torch.arange(self.num_clients), self.counts)
        step = self.num_examples if max_rows is None else max_rows
        for a in range(0, self.num_examples, step):
            yield self.inputs[a : a + step], self.targets[a : a + step], owner[a : a + step]

    def client(self, i: int) -> Dataset:
        lo = int(self.offsets[i])
        hi = lo + int(self.counts[i])
        return Dataset(self.inputs[lo:hi], self.targets[lo:hi])

    def pooled(self) -> Dataset:
        return Dataset(self.inputs, self.targets)

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None) -> InMemoryData:
        return InMemoryData(
            cast(self.inputs, device, dtype),
            cast(self.targets, device, dtype),
            self.offsets,
            self.counts,
            self.client_ids,
        )

    @classmethod
    def view(
        cls,
        clients: Sequence[int],
        parts: Sequence[tuple[torch.Tensor, torch.Tensor]],
        sizes: torch.Tensor,
        client_ids: Sequence[str],
    ) -> InMemoryData:
        """A cohort view: ``parts[j]`` holds client ``clients[j]``'s examples (see module doc)."""
        counts = torch.tensor([len(x) for x, _ in parts], dtype=torch.long)
        if not torch.equal(counts, sizes[torch.as_tensor(list(clients), dtype=torch.long)]):
            raise ValueError("cohort parts do not match the store's client sizes")
        offsets = torch.full_like(sizes, int(counts.sum()))
        offsets[torch.as_tensor(list(clients), dtype=torch.long)] = torch.cumsum(counts, 0) - counts
        return cls(
            inputs=torch.cat([x for x, _ in parts]),
            targets=torch.cat([y for _, y in parts]),
            offsets=offsets,
            counts=sizes,
            client_ids=client_ids,
        )


@dataclass(frozen=True)
class CentralData:
    """Data the server holds and trains on, for Mixed FL.

    Mixed FL: Augenstein et al. 2022 (arXiv:2205.13655).

    Args:
        data: The server's examples.
        weight: The weight of its loss.
        loss_fn: Its per-example loss (None: the task's).
    """

    data: Dataset
    weight: float = 1.0
    loss_fn: LossFn | None = None  # defaults to the task's loss


@dataclass(frozen=True)
class Task:
    """A federated learning problem: the clients' data, a model factory and a loss.

    Args:
        name: The task's name.
        train: The clients' examples.
        model_fn: ``model_fn(generator) -> nn.Module``, parameters drawn from ``generator``
            only (e.g. with :func:`build_model`).
        loss_fn: ``loss_fn(outputs [B, ...], targets [B, ...]) -> [B]``, per-example losses.
        test: A pooled test split (None: none).
        central: Data the server holds, for Mixed FL (None: none).
        metric_fns: Per-example metrics by name (``accuracy``), like ``loss_fn``.
        meta: Task facts for theory and reports (the quadratic task's exact ``A``, ``c``).
    """

    name: str
    train: FederatedData
    model_fn: ModelFn
    loss_fn: LossFn
    test: Dataset | None = None
    central: CentralData | None = None
    metric_fns: Mapping[str, LossFn] = field(default_factory=dict)
    meta: Mapping[str, Any] = field(default_factory=dict)
