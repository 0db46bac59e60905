"""File-backed federated data: client metadata in memory, examples loaded per cohort.

A :class:`LazyFederatedData` keeps only ``client_sizes`` (int64 ``[C]``) and the client ids
(one fixed-width byte string each) in memory — O(C) bytes, ~20 bytes per client — and loads
the examples of the clients the engine asks for: the round's cohort, or one population window
at a time for the evaluation (``eval_chunk_rows`` rows). Subclasses implement ``read(clients)``
(the HDF5 store of :mod:`.tff`, the LEAF JSON store of :mod:`.leaf`); :class:`CallableData`
adapts a plain ``load(i) -> (inputs, targets)`` function, the simplest way for a user task to
keep its clients on disk.

Contract: ``read`` returns, for each listed client in order, exactly ``client_sizes[i]``
examples, the same tensors every time (determinism in the data seed is the builder's job).
``loaded`` counts the clients read so far (instrumentation for tests and benchmarks).
"""

from __future__ import annotations

import copy
import ctypes
from abc import abstractmethod
from collections.abc import Callable, Sequence

import numpy as np
import torch

from .base import FederatedData, InMemoryData

__all__ = ["CallableData", "LazyFederatedData", "release_freed_memory"]

Examples = tuple[torch.Tensor, torch.Tensor]


def release_freed_memory() -> None:
    """Hand the heap memory freed by an index pass back to the operating system.

    An index pass makes and drops millions of small objects (names, decoded texts, per-client
    arrays); glibc keeps the freed pages in its heap, so the process stayed hundreds of MiB
    larger than what it holds (≈ 0.27 KiB per client). ``malloc_trim(0)`` returns them; where
    the C library has no such call (musl, macOS) this does nothing."""
    try:
        libc = ctypes.CDLL(None)
        trim = libc.malloc_trim
    except (OSError, AttributeError):
        return
    trim(0)


class _Ids(Sequence[str]):
    """Client ids stored as one numpy byte-string array (no Python object per client)."""

    def __init__(self, ids: Sequence[str] | np.ndarray) -> None:
        if not isinstance(ids, np.ndarray):
            ids = np.array([i.encode("utf-8") for i in ids], dtype=np.bytes_)
        self._ids = ids

    def __len__(self) -> int:
        return len(self._ids)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [v.decode("utf-8") for v in self._ids[i].tolist()]
        return self._ids[i].decode("utf-8")

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]


class LazyFederatedData(FederatedData):
    """Base of file-backed stores: client sizes in memory, examples loaded per cohort.

    A subclass implements :meth:`read`; it must pickle without open file handles.

    Args:
        sizes: Every client's number of examples ``[C]`` (each at least 1).
        client_ids: The clients' ids in index order.

    Raises:
        ValueError: No client, a client without examples, or not one id per client.
    """

    eval_chunk_rows: int | None = 65536

    def __init__(self, sizes: torch.Tensor | np.ndarray, client_ids: Sequence[str] | np.ndarray):
        sizes = torch.as_tensor(np.asarray(sizes), dtype=torch.long)
        if sizes.ndim != 1 or not len(sizes) or int(sizes.min()) <= 0:
            raise ValueError("a federated dataset needs clients with at least one example each")
        if len(client_ids) != len(sizes):
            raise ValueError("one client id per client size")
        self._sizes = sizes
        self.client_ids = _Ids(client_ids)
        self.device: torch.device | str = "cpu"
        self.dtype: torch.dtype | None = None
        self.loaded = 0

    @abstractmethod
    def read(self, clients: Sequence[int]) -> list[Examples]:
        """Load clients' examples.

        Args:
            clients: Global client indices.

        Returns:
            ``(inputs_i, targets_i)`` of each client, in this order, on the CPU.
        """

    @property
    def num_clients(self) -> int:
        return int(self._sizes.shape[0])

    @property
    def client_sizes(self) -> torch.Tensor:
        return self._sizes

    def cohort(self, clients: Sequence[int] | torch.Tensor) -> InMemoryData:
        ids = [int(c) for c in clients]
        parts = self.read(ids)
        self.loaded += len(ids)
        view = InMemoryData.view(ids, parts, self._sizes, self.client_ids)
        return view.to(self.device, self.dtype)

    def release(self) -> None:
        release_freed_memory()

    def to(self, device: torch.device | str, dtype: torch.dtype | None = None):
        out = copy.copy(self)
        out.device, out.dtype = device, dtype
        return out


class CallableData(LazyFederatedData):
    """A lazy store that loads each client with a function.

    Args:
        sizes: Every client's number of examples ``[C]`` (each at least 1).
        load: ``load(i) -> (inputs_i, targets_i)``; the same ``i`` must give the same tensors.
        client_ids: The clients' ids (None: ``"0"``, ``"1"`` …).

    Raises:
        ValueError: No client, or a client without examples.
    """

    def __init__(
        self,
        sizes: torch.Tensor | np.ndarray | Sequence[int],
        load: Callable[[int], Examples],
        client_ids: Sequence[str] | None = None,
    ) -> None:
        n = len(sizes)
        super().__init__(
            torch.as_tensor(np.asarray(sizes)), client_ids or [str(i) for i in range(n)]
        )
        self._load = load

    def read(self, clients: Sequence[int]) -> list[Examples]:
        """Load clients' examples with ``load``.

        Args:
            clients: Global client indices.

        Returns:
            ``load(i)`` of each client, in this order.
        """
        return [self._load(i) for i in clients]
