"""Coefficient vectors Θ that turn a client's local gradients into its message.

The client message is q_i = Σ_k θ_k g_k (docs/explanation/algorithms.md §1.2–1.3;
Charles & Konečný 2021 (arXiv:2103.05032) §2.1, Charles & Konečný 2020 (arXiv:2007.00878) §2.1).
Presets:

* ``sum``  Θ_{1:K} = (1, …, 1)        FedAvg, Reptile, FedProx, FedSGD, Lookahead
* ``last`` Θ_K = (0, …, 0, 1)         FOMAML (K − 1 adaptation steps, gradient at the K-th iterate)
* ``one``  Θ_1 = (1)                  mini-batch SGD

K(Θ) = max{k : θ_k > 0} local gradients are evaluated; MAML with K inner steps equals Θ_{2K+1}
(= ``last`` with 2K + 1 steps) in expectation on quadratics (§3.12).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from fedtune.errors import ConfigError

__all__ = ["PRESETS", "theta_vector"]

PRESETS = ("sum", "last", "one")


def theta_vector(
    preset: str, local_steps: int, explicit: Sequence[float] = (), dtype=torch.float64
) -> torch.Tensor:
    """Θ as a tensor of length K(Θ) (trailing zeros removed)."""
    if explicit:
        values = list(explicit)
        while values and values[-1] == 0:
            values.pop()
        if not values:
            raise ConfigError("hparams.theta", "needs at least one positive weight")
        return torch.tensor(values, dtype=dtype)
    if preset == "sum":
        return torch.ones(local_steps, dtype=dtype)
    if preset == "last":
        theta = torch.zeros(local_steps, dtype=dtype)
        theta[-1] = 1.0
        return theta
    if preset == "one":
        return torch.ones(1, dtype=dtype)
    raise ConfigError("hparams.theta", f"unknown preset {preset!r} (known: {', '.join(PRESETS)})")
