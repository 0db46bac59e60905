"""Gradient statistics across clients: the alignment regulariser and Mixed-FL dissimilarity.

* Alignment regulariser of Dandi et al. 2021 (arXiv:2106.13897) §3
  (docs/explanation/algorithms.md §4.1), over the sampled clients with aggregation weights w_i
  (Σ w_i = 1) and ḡ = Σ_i w_i g_i::

      r(x) = ½ Σ_i w_i ‖g_i(x) − ḡ(x)‖²        ∇r(x) = Σ_i w_i ∇²f_i(x) (g_i(x) − ḡ(x))

  (with uniform weights this is the paper's (1/2n) Σ_i ‖∇f_i − ∇f‖²). The mean dissimilarity
  Σ_i w_i ‖g_i − ḡ‖ is the quantity plotted in its App. B.8.
* Sampled dissimilarity of Augenstein et al. 2022 (arXiv:2205.13655) eq. 7
  (docs/explanation/algorithms.md §5.7), with ∇̃f_f = Σ_i w_i g_i(x) (weights folded into the
  losses, f = f_f + f_c) and ∇̃f = ∇̃f_f + ∇̃f_c::

      G̃² = ‖∇̃f_f‖²/w_f + ‖∇̃f_c‖²/w_c − ‖∇̃f‖²      B̃² = (‖∇̃f_f‖²/w_f + ‖∇̃f_c‖²/w_c) / ‖∇̃f‖²

:func:`cohort_gradients` computes the g_i(x) of a cohort at one point, from each client's full
local data or from one of its drawn mini-batches. :func:`quadratic_alignment` gives r and ∇r in
closed form for quadratic clients f_i(x) = ½ (x − c_i)ᵀ A_i (x − c_i) (numpy, float64).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch

from ..func_grad import grad
from ..runners import Runner
from ..tasks.base import InMemoryData
from .base import Cohort, weighted_mean

__all__ = [
    "alignment_regulariser",
    "cohort_gradients",
    "deviations",
    "gradient_dissimilarity",
    "mixed_dissimilarity",
    "quadratic_alignment",
]

Params = dict[str, torch.Tensor]
LossOf = Callable[[Params, torch.Tensor, torch.Tensor], torch.Tensor]


def _shared_grad(loss_of: LossOf) -> Callable[..., Params]:
    gradient = grad(loss_of)

    def fn(x: Params, xb: torch.Tensor, yb: torch.Tensor) -> Params:
        return gradient(x, xb, yb)

    return fn


def cohort_gradients(
    runner: Runner,
    loss_of: LossOf,
    data: InMemoryData,
    x: Params,
    cohort: Cohort,
    *,
    full_batch: bool,
    batch_index: int = 0,
) -> Params:
    """Stacked g_i(x) [M, ...] of the cohort's clients.

    ``full_batch``: the gradient of each client's mean loss over *all* its examples (vectorized
    through ``runner`` when the clients hold equally many examples, else one client at a time);
    otherwise the gradient on the client's drawn mini-batch ``cohort.batches[:, batch_index]``.
    """
    fn = _shared_grad(loss_of)
    if not full_batch:
        rows = cohort.batches[:, batch_index]
        return runner.map(fn, (x,), (data.inputs[rows], data.targets[rows]))
    clients = cohort.clients.tolist()
    counts = [int(data.counts[c]) for c in clients]
    starts = [int(data.offsets[c]) for c in clients]
    if len(set(counts)) == 1:
        rows = torch.stack([torch.arange(s, s + counts[0]) for s in starts]).to(data.inputs.device)
        return runner.map(fn, (x,), (data.inputs[rows], data.targets[rows]))
    outs = [
        fn(x, data.inputs[s : s + n], data.targets[s : s + n])
        for s, n in zip(starts, counts, strict=True)
    ]
    return {k: torch.stack([o[k] for o in outs]) for k in x}


def deviations(grads: Params, weights: torch.Tensor) -> tuple[Params, Params]:
    """(ḡ, g_i − ḡ) with ḡ = Σ_i w_i g_i; the deviations average to zero under the weights."""
    mean = weighted_mean(grads, weights)
    return mean, {k: grads[k] - mean[k].unsqueeze(0) for k in grads}


def _sq_norms(stacked: Params) -> torch.Tensor:
    return sum((v.double().reshape(v.shape[0], -1) ** 2).sum(1) for v in stacked.values())


def alignment_regulariser(grads: Params, weights: torch.Tensor) -> float:
    """r = ½ Σ_i w_i ‖g_i − ḡ‖² over the stacked client gradients."""
    _, dev = deviations(grads, weights)
    return float(0.5 * (weights.double() * _sq_norms(dev)).sum())


def gradient_dissimilarity(grads: Params, weights: torch.Tensor) -> float:
    """Σ_i w_i ‖g_i − ḡ‖ (the ‖∇f − ∇f_i‖ curves of Dandi et al. 2021 App. B.8)."""
    _, dev = deviations(grads, weights)
    return float((weights.double() * _sq_norms(dev).sqrt()).sum())


def mixed_dissimilarity(
    grad_f: Params, grad_c: Params, w_f: float, w_c: float
) -> tuple[float, float]:
    """(G̃², B̃²) of Augenstein et al. 2022 eq. 7 from the (weighted) federated and central
    gradients at one point; B̃² is NaN when ∇̃f = 0."""
    nf = sum(float((v.double() ** 2).sum()) for v in grad_f.values())
    nc = sum(float((v.double() ** 2).sum()) for v in grad_c.values())
    total = sum(float(((grad_f[k] + grad_c[k]).double() ** 2).sum()) for k in grad_f)
    spread = nf / w_f + nc / w_c
    return spread - total, (spread / total if total > 0 else math.nan)


def quadratic_alignment(
    A: np.ndarray, c: np.ndarray, p: np.ndarray, x: np.ndarray
) -> tuple[float, np.ndarray]:
    """(r(x), ∇r(x)) for quadratic clients: g_i = A_i (x − c_i), ∇r = Σ_i p_i A_i (g_i − ḡ)."""
    g = np.einsum("ijk,ik->ij", A, x[None, :] - c)
    dev = g - p @ g
    r = 0.5 * float(p @ np.einsum("ij,ij->i", dev, dev))
    return r, np.einsum("i,ijk,ik->j", p, A, dev)
