"""Loss evaluation at a fixed model: per-client losses, population loss, test metrics.

All functions run under ``torch.no_grad`` in chunks of ``batch_size`` rows. The population
training loss is f(x) = (1/N) Σ_i f_i(x) with f_i the mean loss over client i's examples (𝒫
uniform over clients, as in the papers). It walks the population through
:meth:`~fedtune.trainers.tasks.base.FederatedData.row_chunks` (windows of ``chunk_rows`` rows,
a multiple of ``batch_size``), so a file-backed store never materialises all clients at once;
per-client sums accumulate row by row in index order, hence the result does not depend on the
window size.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from .tasks.base import Dataset, FederatedData

__all__ = ["chunk_rows", "client_mean_losses", "dataset_metrics", "population_loss"]

PerExample = Callable[[dict[str, torch.Tensor], torch.Tensor, torch.Tensor], torch.Tensor]


@torch.no_grad()
def _per_example(fn: PerExample, params, inputs, targets, batch_size: int) -> torch.Tensor:
    outs = [
        fn(params, inputs[i : i + batch_size], targets[i : i + batch_size])
        for i in range(0, inputs.shape[0], batch_size)
    ]
    return torch.cat(outs) if outs else torch.zeros(0)


@torch.no_grad()
def client_mean_losses(
    fn: PerExample, params, data: FederatedData, clients: torch.Tensor, batch_size: int
) -> torch.Tensor:
    """[M] mean loss of each listed client on *all* its examples (``data`` holds them: the
    round's cohort view, addressed by global client index)."""
    spans = [(int(data.offsets[c]), int(data.counts[c])) for c in clients.tolist()]
    rows = torch.cat([torch.arange(lo, lo + n) for lo, n in spans]).to(data.inputs.device)
    seg = torch.cat([torch.full((n,), j, dtype=torch.long) for j, (_, n) in enumerate(spans)])
    losses = _per_example(fn, params, data.inputs[rows], data.targets[rows], batch_size)
    seg = seg.to(losses.device)
    sums = torch.zeros(len(spans), dtype=losses.dtype, device=losses.device).index_add_(
        0, seg, losses
    )
    counts = torch.tensor([n for _, n in spans], dtype=losses.dtype, device=losses.device)
    return sums / counts


def chunk_rows(data: FederatedData, batch_size: int) -> int | None:
    """The store's evaluation window rounded down to whole batches (at least one batch)."""
    rows = data.eval_chunk_rows
    return None if rows is None else max(1, rows // batch_size) * batch_size


@torch.no_grad()
def population_loss(fn: PerExample, params, data: FederatedData, batch_size: int) -> float:
    sums: torch.Tensor | None = None
    for inputs, targets, owner in data.row_chunks(chunk_rows(data, batch_size)):
        losses = _per_example(fn, params, inputs, targets, batch_size)
        if sums is None:
            sums = torch.zeros(data.num_clients, dtype=losses.dtype, device=losses.device)
        sums.index_add_(0, owner.to(losses.device), losses)
    assert sums is not None  # every store has at least one example
    return float((sums / data.client_sizes.to(sums.device, sums.dtype)).mean())


@torch.no_grad()
def dataset_metrics(
    fn: PerExample, metric_fns: Mapping[str, PerExample], params, data: Dataset, batch_size: int
) -> dict[str, float]:
    out = {"loss": float(_per_example(fn, params, data.inputs, data.targets, batch_size).mean())}
    for name, metric in metric_fns.items():
        out[name] = float(
            _per_example(metric, params, data.inputs, data.targets, batch_size).mean()
        )
    return out
