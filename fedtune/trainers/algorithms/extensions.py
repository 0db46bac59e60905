"""Registers the methods of `002_db1681a79c495f30.txt`, `003_ede07a1bb30cfed7.txt` and
`004_eaa0443f89ef694f.txt` (imported by the algorithm registry when present).

=====================  ==================================================================
name                   method (module)
=====================  ==================================================================
gradalign              GradAlign, K = 1 (:mod:`.gradalign`)
fedga                  FedGA, Alg. 2 (``ga_form: once``) or Alg. 3 (``every_step``)
scaffold_ga            SCAFFOLD as analysed in 002 (fresh controls; :mod:`.scaffold`)
scaffold               original stateful SCAFFOLD (per-client controls, option 1/2)
mixed_pt / _gt1 / _gt2 Mixed FL: Parallel Training, 1-way / 2-way Gradient Transfer (:mod:`.mixed`)
mixed_fl               Mixed FL with ``mixed_variant`` as a hyperparameter
fedavg_mass            FedAvg with MaSS, form 2 (:mod:`.mass`)
fedavg_mass_literal    FedAvg with MaSS, the note's literal form 1 sync rule
fedavg_nesterov        FedAvg with local Nesterov momentum (MaSS with η₂ = 0)
fednova                FedNova, normalized averaging of heterogeneous local work (:mod:`.fednova`)
=====================  ==================================================================

Their method-specific hyperparameters live in small frozen dataclasses (one per module); until
:class:`~fedtune.trainers.config.HParams` has these fields, each build function reads them with
:func:`~.gradalign.extra_hparams` (``getattr`` with the dataclass default).
:func:`extension_hparams` lists (name, type, default, meaning) for all of them.
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any

from . import fednova  # noqa: F401  (registers fednova)
from .gradalign import GradAlignParams, extra_hparams
from .mass import MassParams
from .mixed import MixedParams
from .scaffold import ScaffoldParams

__all__ = ["EXTENSION_PARAMS", "extension_hparams", "extra_hparams"]

EXTENSION_PARAMS = (GradAlignParams, ScaffoldParams, MixedParams, MassParams)

_MEANING = {
    "ga_beta": "β: displacement step of GradAlign/FedGA (regularisation strength of r), >= 0",
    "ga_form": "FedGA form: 'once' (Alg. 2, displace the start) or 'every_step' (Alg. 3)",
    "ga_full_batch": "g_i(x) for displacement/controls from the full local data (else one extra mini-batch)",
    "scaffold_option": "SCAFFOLD control update: 2 = from the local steps, 1 = full local gradient at x",
    "central_lr": "η_c, central (server-data) step size; null = client_lr·server_lr",
    "merge_lr": "η_m, merge step on Δ_c + Δ_f (PT, 2-w GT), > 0",
    "central_steps": "K_c, central steps per round (PT, 2-w GT); null = local_steps",
    "central_batch_size": "|B_c|; null = S·B (PT, 2-w GT) or K·S·B (1-w GT); 0 = whole central set",
    "mixed_variant": "Mixed FL variant for recipe mixed_fl: pt, gt1 or gt2",
    "mixed_gt2_init": "2-w GT initial augmenting gradients: zero or fresh (gradients at x⁰)",
    "mass_eta2": "η₂, MaSS compensation step (0 = Nesterov), >= 0",
    "mass_gamma": "γ, MaSS/Nesterov momentum in [0, 1)",
    "mass_form": "form2 (default), form1 (same with corrected sync) or form1_literal",
    "mass_grad_point": "where the stochastic gradient is taken: u (look-ahead, default) or w",
    "mass_auto": "use the theorem's η₁, η₂, γ from the task's data constants (linear regression)",
}


def extension_hparams() -> list[tuple[str, Any, Any, str]]:
    """(name, type, default, meaning) of every extension hyperparameter."""
    rows = []
    for cls in EXTENSION_PARAMS:
        hints = typing.get_type_hints(cls)
        rows += [
            (f.name, hints[f.name], f.default, _MEANING[f.name]) for f in dataclasses.fields(cls)
        ]
    return rows
