"""Heterogeneous local work: per-client step counts, padded batches and step masks.

With ``train.local_epochs`` E (instead of a fixed ``train.local_steps`` K) client i of a round
runs τ_i = ⌈E·n_i/B⌉ local steps over its own n_i examples (batch size B; the remark of
docs/explanation/algorithms.md §1.3, Charles & Konečný 2020 (arXiv:2007.00878) §2.1, "a fixed number
of local epochs E could be used instead"). The vectorized runner needs one shape for the whole
cohort, so a round's batch rows are padded to ``[M, K_max + extra, B]`` (K_max = max_i τ_i;
``extra`` = the batches an algorithm draws besides its local steps, e.g. FedGA's mini-batch g_i(x),
laid out after the K_max step columns) and a boolean step mask ``[M, K_max]`` marks the real steps.
A masked step is an exact no-op: client functions select the old value with ``torch.where`` (never
multiply by 0, which would let a NaN through or flip the sign of a zero), so the padded vectorized
run equals the sequential run bit for bit and equals running τ_i unpadded steps.

Determinism: client i's rows are ``batch_indices(trial seed, round, i, …, τ_i + extra, B)``, a
function of (trial seed, round, client id) only; padded columns repeat the client's last real
batch (real rows, so a masked gradient is finite), which keeps every row index inside the client.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from fedtune.errors import ConfigError

from .sampling import cohort_batch_indices

__all__ = [
    "epoch_steps",
    "pad_steps",
    "padded_batches",
    "step_mask",
    "step_summary",
    "theta_rows",
    "where_step",
]


def epoch_steps(counts: torch.Tensor, epochs: float, batch_size: int) -> torch.Tensor:
    """τ_i = ⌈E·n_i/B⌉ for every client (int64, ≥ 1), computed exactly.

    E is read as the decimal it was written as (``Fraction(repr(E))``), so E = 0.1, n = 30,
    B = 3 gives exactly 1 step, not the 2 a float product 0.1·30/3 = 1.0000000000000002 gives.
    """
    if not (math.isfinite(epochs) and epochs > 0):
        raise ConfigError("train.local_epochs", f"must be a finite number > 0, got {epochs!r}")
    e = Fraction(repr(float(epochs)))
    steps = [max(1, math.ceil(e * int(n) / batch_size)) for n in counts.tolist()]
    return torch.tensor(steps, dtype=torch.long)


def pad_steps(rows: torch.Tensor, steps: int, k_max: int) -> torch.Tensor:
    """Rows ``[steps + extra, B]`` of one client -> ``[k_max + extra, B]``.

    The ``steps`` local-step batches come first, then ``k_max − steps`` copies of the last of
    them (masked), then the ``extra`` batches.
    """
    local, extra = rows[:steps], rows[steps:]
    pad = local[-1:].expand(k_max - steps, *local.shape[1:])
    return torch.cat([local, pad, extra], 0)


def step_mask(steps: torch.Tensor, k_max: int | None = None) -> torch.Tensor:
    """Bool ``[M, K_max]``: ``mask[i, k] = k < τ_i``."""
    k_max = int(steps.max()) if k_max is None else k_max
    return torch.arange(k_max, device=steps.device).unsqueeze(0) < steps.unsqueeze(1)


def theta_rows(preset: str, steps: torch.Tensor, k_max: int, dtype=torch.float64) -> torch.Tensor:
    """Per-client Θ ``[M, K_max]`` for τ_i steps: ``sum`` Θ_{1:τ_i}, ``last`` Θ_{τ_i}.

    Zero beyond τ_i (those steps are masked anyway). Explicit Θ vectors have a fixed K(Θ) and
    no per-client form; the registry rejects them with ``local_epochs``.
    """
    mask = step_mask(steps, k_max)
    if preset == "sum":
        return mask.to(dtype)
    if preset == "last":
        return (torch.arange(k_max, device=steps.device) == (steps - 1).unsqueeze(1)).to(dtype)
    raise ConfigError("train.local_epochs", f"Θ preset {preset!r} needs a fixed local_steps")


def where_step(m: torch.Tensor, new: dict, old: dict) -> dict:
    """``new`` where step mask ``m`` (a 0-dim bool, per client under vmap) is set, else ``old``.

    The exact no-op of a masked step: the old tensors are returned bit for bit.
    """
    return {k: torch.where(m, new[k], old[k]) for k in old}


def step_summary(steps: torch.Tensor) -> dict[str, float]:
    """Round-record entries: min/max/mean local steps of the cohort."""
    s = steps.to(torch.float64)
    return {
        "steps_min": float(s.min()),
        "steps_max": float(s.max()),
        "steps_mean": float(s.mean()),
    }


def padded_batches(
    trial_seed: int,
    round_idx: int,
    clients: torch.Tensor,
    offsets: torch.Tensor,
    counts: torch.Tensor,
    steps: torch.Tensor,
    extra: int,
    batch_size: int,
    mode: str,
) -> torch.Tensor:
    """Batch rows ``[M, K_max + extra, B]`` of a cohort whose client i runs ``steps[i]`` steps.

    ``offsets``/``counts`` are the cohort clients' own (aligned with ``clients``). Client i's
    draws are those of :func:`~fedtune.trainers.sampling.batch_indices` for τ_i + extra batches
    (so a client's batches do not depend on the other clients of the round), padded by
    :func:`pad_steps`.
    """
    k_max = int(steps.max())
    # client i's τ_i + extra batches are a prefix of its stream's K_max + extra batches
    rows = cohort_batch_indices(
        trial_seed, round_idx, clients, offsets, counts, k_max + extra, batch_size, mode
    )
    return rows.gather(1, _padded_steps(steps, k_max, extra)[:, :, None].expand_as(rows))


def _padded_steps(steps: torch.Tensor, k_max: int, extra: int) -> torch.Tensor:
    """[M, K_max + extra]: which of a client's drawn batches fills each padded slot — what
    :func:`pad_steps` does to each client: its τ_i batches, the last of them repeated up to
    K_max, then its ``extra`` batches (drawn right after its τ_i)."""
    j = torch.arange(k_max + extra).unsqueeze(0)
    tau = steps.to(torch.long).unsqueeze(1)
    return torch.where(j < tau, j, torch.where(j < k_max, tau - 1, tau + (j - k_max)))
