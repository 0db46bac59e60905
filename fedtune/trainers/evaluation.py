"""Loss evaluation at a fixed model: per-client losses, population loss, test metrics.

All functions run under ``torch.no_grad`` in chunks of ``batch_size`` rows. The population
training loss is f(x) = (1/N) Σ_i f_i(x) with f_i the mean loss over client i's examples (𝒫
uniform over clients, as in the papers). It walks the population through
:meth:`~fedtune.trainers.tasks.base.FederatedData.row_chunks` (windows of ``chunk_rows`` rows,
a multiple of ``batch_size``), so a file-backed store never materialises all clients at once;
per-client sums accumulate row by row in index order, hence the result does not depend on the
window size.

``train.eval_population`` (:class:`~fedtune.trainers.config.TrainConfig`) chooses what an
evaluation round measures: ``full`` is f(x) above; ``sample`` is the unbiased estimate
f̂(x) = (1/S) Σ_{i ∈ E_t} f_i(x) over S clients E_t drawn uniformly without replacement by
:func:`evaluation_clients` from the *data* seed and the round only (a stream of its own, apart
from the cohort's), so every hyperparameter setting of a study is evaluated on the same clients
— the fairness protocol of Charles & Konečný 2020 (arXiv:2007.00878) §8 that the cohort sampling
follows; ``off`` measures nothing. The sample is read in the same bounded row windows
(:meth:`~fedtune.trainers.tasks.base.FederatedData.client_row_chunks`), so its cost is O(S)
rows, not O(population).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import torch

from .tasks.base import Dataset, FederatedData, client_rows

__all__ = [
    "chunk_rows",
    "client_mean_losses",
    "dataset_means",
    "dataset_metrics",
    "evaluation_clients",
    "evaluation_population",
    "members_evaluation",
    "population_loss",
    "population_losses",
]

_EVAL_STREAM = 0xE7

PerExample = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


@torch.no_grad()
def _per_example(fn: PerExample, params, inputs, targets, batch_size: int) -> torch.Tensor:
    """``fn`` batch by batch, written into one preallocated output. (A list of per-batch
    results concatenated at the end leaves a small live tensor after every batch's freed
    temporaries; once glibc's dynamic mmap threshold has risen, those pin each batch's heap
    pages and a 65,536-row window grew the process by ≈ 0.5 GiB.)"""
    n = inputs.shape[0]
    out: torch.Tensor | None = None
    for i in range(0, n, batch_size):
        losses = fn(params, inputs[i : i + batch_size], targets[i : i + batch_size])
        if out is None:
            out = losses.new_empty((n, *losses.shape[1:]))
        out[i : i + len(losses)] = losses
        del losses
    return out if out is not None else torch.zeros(0)


@torch.no_grad()
def client_mean_losses(
    fn: PerExample, params, data: FederatedData, clients: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """[M] mean loss of each listed client on *all* its examples (``data`` holds them: the
    round's cohort view, addressed by global client index)."""
    counts = data.counts[clients]
    rows = client_rows(data.offsets[clients], counts).to(data.inputs.device)
    seg = torch.repeat_interleave(torch.arange(len(counts)), counts)
    losses = _per_example(fn, params, data.inputs[rows], data.targets[rows], batch_size)
    seg = seg.to(losses.device)
    sums = losses.new_zeros((len(counts), *losses.shape[1:])).index_add_(0, seg, losses)
    return sums / _column(counts.to(losses.dtype).to(losses.device), sums)


def _column(sizes: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``sizes [n]`` shaped to divide ``like [n, ...]`` row by row (``fn`` may give one loss
    per example and per packed configuration, ``[B, P]``)."""
    return sizes.reshape((-1,) + (1,) * (like.dim() - 1))


def evaluation_clients(
    data_seed: int, round_idx: int, num_clients: int, size: int
) -> torch.Tensor | None:
    """E_t: ``size`` clients drawn uniformly without replacement from (data seed, round) only,
    sorted; ``None`` (every client) when ``size`` ≥ the population."""
    if size >= num_clients:
        return None
    rng = np.random.default_rng([_EVAL_STREAM, data_seed, round_idx])
    return torch.from_numpy(np.sort(rng.choice(num_clients, size=size, replace=False)))


def evaluation_population(
    train: Any, data_seed: int, round_idx: int, num_clients: int
) -> tuple[torch.Tensor | None, int] | None:
    """The clients an evaluation round measures, as ``train.eval_population`` says.

    Args:
        train: The trial's training configuration.
        data_seed: The data seed.
        round_idx: The round (0-based).
        num_clients: The population's size.

    Returns:
        None when it measures none (``off``); else the clients (None: every one, ``full`` or a
        sample as large as the population) and how many they are.
    """
    if train.eval_population == "off":
        return None
    clients = None
    if train.eval_population == "sample":
        assert train.eval_clients is not None  # validated
        clients = evaluation_clients(data_seed, round_idx, num_clients, train.eval_clients)
    return clients, num_clients if clients is None else len(clients)


def chunk_rows(data: FederatedData, batch_size: int) -> int | None:
    """The store's evaluation window rounded down to whole batches (at least one batch)."""
    rows = data.eval_chunk_rows
    return None if rows is None else max(1, rows // batch_size) * batch_size


@torch.no_grad()
def population_loss(
    fn: PerExample,
    params,
    data: FederatedData,
    batch_size: int,
    clients: torch.Tensor | None = None,
) -> float:
    """f(x) = mean over clients of f_i(x) — over every client, or over the listed ``clients``
    (global indices, each once), read in windows of :func:`chunk_rows` rows."""
    return float(population_losses(fn, params, data, batch_size, clients))


@torch.no_grad()
def population_losses(
    fn: PerExample,
    params,
    data: FederatedData,
    batch_size: int,
    clients: torch.Tensor | None = None,
) -> torch.Tensor:
    """:func:`population_loss` as a tensor: 0-dim for ``fn`` giving ``[B]``, ``[P]`` for ``fn``
    giving ``[B, P]`` (one loss per example and per packed configuration)."""
    if clients is None:
        sizes = data.client_sizes
        chunks = data.row_chunks(chunk_rows(data, batch_size))
    else:
        sizes = data.client_sizes[clients]
        chunks = data.client_row_chunks(clients, chunk_rows(data, batch_size))
    sums: torch.Tensor | None = None
    for inputs, targets, owner in chunks:
        losses = _per_example(fn, params, inputs, targets, batch_size)
        if sums is None:
            sums = losses.new_zeros((len(sizes), *losses.shape[1:]))
        sums.index_add_(0, owner.to(losses.device), losses)
        del inputs, targets, owner, losses  # one window at a time
    assert sums is not None  # every store has at least one example
    return (sums / _column(sizes.to(sums.device, sums.dtype), sums)).mean(0)


@torch.no_grad()
def dataset_metrics(
    fn: PerExample, metric_fns: Mapping[str, PerExample], params, data: Dataset, batch_size: int
) -> dict[str, float]:
    return {k: float(v) for k, v in dataset_means(fn, metric_fns, params, data, batch_size).items()}


@torch.no_grad()
def dataset_means(
    fn: PerExample, metric_fns: Mapping[str, PerExample], params, data: Dataset, batch_size: int
) -> dict[str, torch.Tensor]:
    """:func:`dataset_metrics` as tensors: 0-dim, or ``[P]`` for functions giving ``[B, P]``."""
    out = {"loss": _per_example(fn, params, data.inputs, data.targets, batch_size).mean(0)}
    for name, metric in metric_fns.items():
        out[name] = _per_example(metric, params, data.inputs, data.targets, batch_size).mean(0)
    return out


def members_evaluation(
    packed_loss: Callable[..., torch.Tensor],
    metrics: Mapping[str, Callable[..., torch.Tensor]],
    params: dict[str, torch.Tensor],
    which: list[int],
    data: FederatedData,
    test: Dataset | None,
    train: Any,
    t: int,
    seed: int,
) -> dict[int, tuple[float | None, dict[str, float], float]]:
    """An evaluation round of a pack's members: each one's population loss (as
    ``train.eval_population`` says), test metrics and the number of clients evaluated, as the
    engine's ``Trainer`` gives them for one.

    Args:
        packed_loss: The per-example loss vmapped over members (``[N, P]``).
        metrics: The test metrics, each vmapped over members.
        params: The members' models, stacked ``[P, …]``.
        which: The positions in ``params`` to evaluate.
        data: The training data.
        test: The test data, if any.
        train: The members' training configuration (its evaluation settings are the pack's).
        t: The round (0-based).
        seed: The data seed (the sampled evaluation clients come from it and ``t``).

    Returns:
        ``{position: (population loss or None, test metrics, clients evaluated)}``.
    """
    if len(which) < next(iter(params.values())).shape[0]:
        index = torch.tensor(which, dtype=torch.long, device=next(iter(params.values())).device)
        params = {k: v.index_select(0, index) for k, v in params.items()}
    bs = train.eval_batch_size
    losses, evaluated = None, 0
    population = evaluation_population(train, seed, t, data.num_clients)
    if population is not None:
        clients, evaluated = population
        losses = population_losses(packed_loss, params, data, bs, clients).tolist()
    means: dict[str, list[float]] = {}
    if test is not None:
        means = {
            k: v.tolist() for k, v in dataset_means(packed_loss, metrics, params, test, bs).items()
        }
    return {
        g: (
            None if losses is None else losses[j],
            {k: v[j] for k, v in means.items()},
            float(evaluated),
        )
        for j, g in enumerate(which)
    }
