"""``nova_medclip``: FedNova with median-norm clipping and server momentum — a method built
from fedtune's parts (client rule, aggregator, server optimizer), not a copied training loop.

Client i runs τ_i local SGD steps from the broadcast model x_t (with ``train.local_epochs``
τ_i = ⌈E·n_i/B⌉, so clients of different sizes do different amounts of work) and sends, in
fedtune's gradient units, q_i = (x_t − y_{i,τ_i}) / γ = Σ_k ∇f_i(y_{i,k}; batch k).
The server, with the cohort's aggregation weights p_i (``train.weighting``):

    d_i   = q_i / τ_i                          normalized update (FedNova, Wang et al. 2020,
                                               arXiv:2007.07481, eq. 9, plain SGD clients)
    c     = median_i ‖d_i‖                     the cohort's median update norm
    d̃_i  = d_i · min(1, c / ‖d_i‖)            clip every update to the median norm
    τ_eff = Σ_i p_i τ_i
    q     = τ_eff · Σ_i p_i d̃_i
    v ← β v + q ;  x_{t+1} = x_t − η v          server heavy-ball momentum (FedAvgM,
                                               Charles & Konečný 2021 (arXiv:2103.05032) §5;
                                               Nesterov or plain SGD with ``server_opt``)

Normalizing by τ_i removes FedNova's "objective inconsistency" (clients that ran more steps do
not pull the model towards their own optimum); clipping at the median bounds how far any one
client — a small client with a single class, say — can move the model in a round, with no
threshold to tune (adaptive clipping at the 0.5 quantile, cf. Andrew et al. 2021,
arXiv:1905.03871). When every client ran the same τ steps and no update is longer than the
median — always so with one client per round — it is exactly FedAvgM.

Hyperparameters: γ ``client_lr``, η ``server_lr``, β ``server_momentum``, ``server_opt``
(``momentum`` default, ``nesterov``, ``sgd``), ``nesterov_form``. Round diagnostics:
``medclip_bound`` (c) and ``medclip_clipped`` (how many clients were clipped).

Everything here is order-independent over the cohort and runs after the clients' (vectorized)
local steps, so fedtune's contract checks — determinism in the seeds, independence of client
order, vectorized ≡ sequential — hold as for the built-in methods.
"""

from __future__ import annotations

import torch

from fedtune.extend import register_algorithm, weighted_mean

__all__ = ["MedianClippedNova"]


class MedianClippedNova:
    """Aggregator part: ``(messages [M, ...], weights [M], steps τ [M], client_lr) -> q``."""

    def __call__(
        self,
        messages: dict[str, torch.Tensor],
        weights: torch.Tensor,
        steps: torch.Tensor,
        client_lr: float,
    ) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
        tau = steps.to(device=weights.device, dtype=torch.float64)
        p = weights.to(torch.float64)
        squares = sum(
            v.to(torch.float64).reshape(v.shape[0], -1).pow(2).sum(1) for v in messages.values()
        )
        norms = torch.sqrt(squares) / tau  # ‖d_i‖
        bound = torch.quantile(norms, 0.5)  # median (mean of the middle two for even M)
        scale = torch.where(norms > bound, bound / norms, torch.ones_like(norms))
        tau_eff = (p * tau).sum()
        coef = p * tau_eff * scale / tau  # q = Σ_i coef_i q_i
        q = weighted_mean(messages, coef.to(weights.dtype))
        return q, {"medclip_bound": float(bound), "medclip_clipped": float((scale < 1).sum())}


register_algorithm(
    "nova_medclip",
    summary="FedNova normalized averaging, updates clipped to the cohort's median norm, "
    "server momentum",
    paper="fedlab (examples/byo); FedNova: Wang et al. 2020, arXiv:2007.07481",
    params=("client_lr", "server_lr", "server_opt", "server_momentum", "nesterov_form"),
    defaults={"server_opt": "momentum", "server_momentum": 0.9},
    server_opts=("momentum", "nesterov", "sgd"),
    aggregator=MedianClippedNova(),
)
