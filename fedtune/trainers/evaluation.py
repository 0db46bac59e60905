"""Loss evaluation at a fixed model: per-client losses, population loss, test metrics.

All functions run under ``torch.no_grad`` in chunks of ``batch_size`` rows. The population
training loss is f(x) = (1/N) Σ_i f_i(x) with f_i the mean loss over client i's examples (𝒫
uniform over clients, as in the papers).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch

from .tasks.base import Dataset, FederatedData

__all__ = ["client_mean_losses", "dataset_metrics", "population_loss"]

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
    """[M] mean loss of each listed client on *all* its examples."""
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


@torch.no_grad()
def population_loss(fn: PerExample, params, data: FederatedData, batch_size: int) -> float:
    losses = _per_example(fn, params, data.inputs, data.targets, batch_size)
    owner = torch.repeat_interleave(
        torch.arange(data.num_clients, device=losses.device), data.counts.to(losses.device)
    )
    sums = torch.zeros(data.num_clients, dtype=losses.dtype, device=losses.device)
    sums.index_add_(0, owner, losses)
    return float((sums / data.counts.to(losses.device, losses.dtype)).mean())


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
