"""The recipes of the methods of Dandi et al. 2021 (arXiv:2106.13897),
Augenstein et al. 2022 (arXiv:2205.13655), Qu et al. 2020 (arXiv:2007.05690) and Wang et al.
2020 (arXiv:2007.07481) (:data:`RECIPES`, which the algorithm registry registers when it is
first used).

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

This module holds what a study spec is validated against — each recipe's parameters, defaults,
fixed values, server optimizers, packing and cross-field check — and imports no part of the
engine (nor torch). A recipe's round (``build``) and FedNova's aggregators are
:class:`~fedtune.trainers.plugins.Deferred`: their module is imported when a round is built.

Their method-specific hyperparameters are declared by their parts (``GA_HPARAMS``,
``SCAFFOLD_HPARAMS``, ``MIXED_HPARAMS``, ``MASS_HPARAMS``; :mod:`fedtune.trainers.part_hparams`);
:func:`extension_hparams` lists those declarations.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedtune.errors import ConfigError

from ..hparams import HParam, merge_declarations
from ..part_hparams import GA_HPARAMS, MASS_HPARAMS, MIXED_HPARAMS, SCAFFOLD_HPARAMS
from ..plugins import Deferred
from .recipe import MEMBER_HPARAMS, OWN_ROUND, SERVER_PARAMS, Recipe, local_update_recipe

if TYPE_CHECKING:
    from ..config import TrialConfig

__all__ = ["FEDNOVA_PAPER", "RECIPES", "check_mass_auto", "extension_hparams"]

P002 = "Dandi et al. 2021 (arXiv:2106.13897)"
P003 = "Augenstein et al. 2022 (arXiv:2205.13655)"
P004 = "Qu et al. 2020 (arXiv:2007.05690)"
FEDNOVA_PAPER = "Wang et al. 2020, arXiv:2007.07481 (FedNova)"
_HERE = __name__.rsplit(".", 1)[0]


def _deferred(module: str, name: str) -> Deferred:
    """``name`` of this package's ``module``, imported when first called."""
    return Deferred(f"{_HERE}.{module}", name)


def extension_hparams() -> tuple[HParam, ...]:
    """The declarations of every extension part's hyperparameters."""
    return merge_declarations(GA_HPARAMS, SCAFFOLD_HPARAMS, MIXED_HPARAMS, MASS_HPARAMS)


_AUTO_FIXES = ("client_lr", "mass_gamma", "mass_eta2")


def check_mass_auto(config: TrialConfig) -> None:
    """``mass_auto: true`` takes η₁, η₂, γ from the theorem: setting them, or decaying γ, is an
    error (naming the field) rather than a value silently ignored.

    Args:
        config: The trial configuration of a MaSS recipe.

    Raises:
        ConfigError: ``mass_auto`` with one of η₁, η₂, γ set, or with the decay enabled.
    """
    if not config.hparams.get("mass_auto"):
        return
    for name in _AUTO_FIXES:
        if name in config.hparams_set:
            raise ConfigError(
                f"hparams.{name}",
                "is not used when hparams.mass_auto is true (the theorem fixes η₁, η₂, γ); "
                "remove it or set mass_auto: false",
            )
    if config.decay.enabled:
        raise ConfigError(
            "decay.enabled",
            "LocalUpdateDecay would decay η₁ (client_lr), which hparams.mass_auto fixes "
            "from the theorem; disable one of them",
        )


def _fednova() -> tuple[Recipe, ...]:
    return (
        local_update_recipe(
            "fednova",
            "FedNova: normalized averaging of heterogeneous local work, q = τ_eff Σ p_i q_i/‖a_i‖₁",
            FEDNOVA_PAPER,
            ("client_lr", "prox_alpha", *SERVER_PARAMS),
            aggregator=_deferred("fednova", "normalized_averaging"),
            packed_aggregator=_deferred("fednova", "packed_normalized_averaging"),
            aggregator_hparams=("prox_alpha",),
            packable=True,
            member_hparams=MEMBER_HPARAMS,
        ),
    )


def _gradalign() -> tuple[Recipe, ...]:
    ga_params = ("ga_beta", "ga_form", "ga_full_batch")
    unpacked = (  # why FedGA and GradAlign do not pack (``Recipe.packable``)
        "its round is its own, not the plain LocalUpdate (each client starts displaced by its "
        "gradient-alignment correction, from a pass over the whole cohort)"
    )
    return (
        Recipe(
            "fedga",
            "FedGA: FedAvg whose clients start displaced by −β(ḡ − g_i) (gradient alignment)",
            P002,
            ("client_lr", *ga_params, *SERVER_PARAMS),
            hparams=GA_HPARAMS,
            build=_deferred("gradalign", "build_fedga"),
            round_form=OWN_ROUND,
            packable=unpacked,
        ),
        Recipe(
            "gradalign",
            "GradAlign: x ← x − η mean_i ∇f_i(x − β(ḡ − g_i)) (= GD on f + βr for quadratics)",
            P002,
            ("ga_beta", "ga_full_batch", *SERVER_PARAMS),
            hparams=GA_HPARAMS,
            fixed={"client_lr": 0.0},
            fixed_local_steps=1,
            build=_deferred("gradalign", "build_gradalign"),
            round_form=OWN_ROUND,
            packable=unpacked,
        ),
    )


def _scaffold() -> tuple[Recipe, ...]:
    return (
        Recipe(
            "scaffold_ga",
            "SCAFFOLD as analysed in 002: fresh controls ḡ − g_i from an extra round",
            P002,
            ("client_lr", "ga_full_batch", *SERVER_PARAMS),
            hparams=GA_HPARAMS,
            build=_deferred("scaffold", "build_scaffold_ga"),
            round_form=OWN_ROUND,
            packable="its round is its own, not the plain LocalUpdate (fresh control variates "
            "from an extra pass over the cohort)",
        ),
        Recipe(
            "scaffold",
            "original SCAFFOLD: per-client control variates kept across rounds (option 1/2)",
            P002,
            ("client_lr", "scaffold_option", *SERVER_PARAMS),
            hparams=SCAFFOLD_HPARAMS,
            build=_deferred("scaffold", "build_scaffold"),
            round_form=OWN_ROUND,
            packable="its round is its own, not the plain LocalUpdate (per-client control "
            "variates kept in its server state across rounds)",
        ),
    )


def _mass() -> tuple[Recipe, ...]:
    common = ("client_lr", "mass_gamma", "mass_grad_point", "mass_auto")
    rows = (  # name, parameters, round, fixed mass_form, summary
        (
            "fedavg_mass",
            (*common, "mass_eta2", "mass_form"),
            "build_mass",
            None,
            "FedAvg with local MaSS (form 2: v-update with u_t, only w averaged)",
        ),
        (
            "fedavg_mass_literal",
            (*common, "mass_eta2"),
            "build_mass",
            "form1_literal",
            "FedAvg-MaSS with the note's literal (w, u) sync rule (may diverge; for comparison)",
        ),
        (
            "fedavg_nesterov",
            (*common, "mass_form"),
            "build_nesterov",
            None,
            "FedAvg with local Nesterov momentum (MaSS with η₂ = 0)",
        ),
    )
    return tuple(
        Recipe(
            name,
            summary,
            P004,
            params,
            MASS_HPARAMS,
            fixed={"server_lr": 1.0, **({"mass_form": form} if form else {})},
            server_opts=("sgd",),
            units="delta",
            default_local_steps=5,
            build=_deferred("mass", round_),
            round_form=OWN_ROUND,
            packable="its round is its own, not the plain LocalUpdate (local MaSS momentum "
            "with its own averaging of the client state)",
            check=check_mass_auto,
        )
        for name, params, round_, form, summary in rows
    )


def _mixed() -> tuple[Recipe, ...]:
    mixed = ("client_lr", *SERVER_PARAMS)
    central = ("central_lr", "merge_lr", "central_steps", "central_batch_size")
    rows = (  # name, parameters, round, summary
        (
            "mixed_pt",
            mixed + central,
            "build_pt",
            "Mixed FL Parallel Training: FedAvg round + K central steps",
        ),
        (
            "mixed_gt1",
            (*mixed, "central_batch_size"),
            "build_gt1",
            "Mixed FL 1-way Gradient Transfer",
        ),
        (
            "mixed_gt2",
            (*mixed, *central, "mixed_gt2_init"),
            "build_gt2",
            "Mixed FL 2-way Gradient Transfer",
        ),
        (
            "mixed_fl",
            (*mixed, *central, "mixed_gt2_init", "mixed_variant"),
            "build_any",
            "Mixed FL with the variant (pt, gt1, gt2) as a hyperparameter",
        ),
    )
    return tuple(
        Recipe(
            name,
            summary,
            P003,
            params,
            MIXED_HPARAMS,
            defaults={"server_lr": 1.0},
            server_opts=("sgd", "momentum", "adam", "yogi", "adagrad"),
            units="delta",
            needs_central=True,
            build=_deferred("mixed", round_),
            round_form=OWN_ROUND,
            packable="its round is its own, not the plain LocalUpdate (steps on the server's "
            "central data beside the clients')",
            fixed_k_reason=(
                "the central branch runs K_c = K steps on |B_c| = K·S·B (1-w GT) by default and "
                "2-w GT's g̃_f divides by K (Augenstein et al. 2022 Alg. 1-2 assume one K)"
            ),
        )
        for name, params, round_, summary in rows
    )


#: the extension methods, in the order they have always been listed
RECIPES: tuple[Recipe, ...] = (*_fednova(), *_gradalign(), *_scaffold(), *_mass(), *_mixed())
