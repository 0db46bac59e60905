"""Registers the methods of Dandi et al. 2021 (arXiv:2106.13897),
Augenstein et al. 2022 (arXiv:2205.13655) and Qu et al. 2020 (arXiv:2007.05690) (imported by the
algorithm registry when present).

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

Their method-specific hyperparameters are declared by their parts (``GA_HPARAMS``,
``SCAFFOLD_HPARAMS``, ``MIXED_HPARAMS``, ``MASS_HPARAMS``; :mod:`fedtune.trainers.hparams`);
:func:`extension_hparams` lists those declarations.
"""

from __future__ import annotations

from ..hparams import HParam, merge_declarations
from . import fednova  # noqa: F401  (registers fednova)
from .gradalign import GA_HPARAMS
from .mass import MASS_HPARAMS
from .mixed import MIXED_HPARAMS
from .scaffold import SCAFFOLD_HPARAMS

__all__ = ["extension_hparams"]


def extension_hparams() -> tuple[HParam, ...]:
    """The declarations of every extension part's hyperparameters."""
    return merge_declarations(GA_HPARAMS, SCAFFOLD_HPARAMS, MIXED_HPARAMS, MASS_HPARAMS)
