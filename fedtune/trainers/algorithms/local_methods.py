"""The plain local-update methods: one :class:`~.local_update.LocalUpdate` with different
client rules and server optimizers (:data:`RECIPES`, which the algorithm registry registers when
it is first used).

docs/explanation/algorithms.md §1.5 table (Charles & Konečný 2021 (arXiv:2103.05032) Table 1,
Charles & Konečný 2020 (arXiv:2007.00878) §2.1):

=================  ======  =========================================  =====================
name               Θ       client rule                                 server optimizer
=================  ======  =========================================  =====================
minibatch_sgd      Θ_1     one gradient (K = 1), γ irrelevant          SGD (any ServerOpt)
fedsgd             Θ_1:K   γ = 0: K gradients at x_t                   any
fedavg / reptile   Θ_1:K   K SGD steps, γ and η decoupled              SGD (any)
fedavg_vanilla     Θ_1:K   model-delta message, η ≡ 1 (i.e. η = γ)     SGD
fedavg_delta       Θ_1:K   model-delta message, server lr η_Δ          any
fedprox            Θ_1:K   + proximal α(y − x_t)                       any
lookahead          Θ_1:K   one client (|𝒫| = 1); η = α_LA·γ            SGD
local_update       any Θ   explicit ``hparams.theta``, α               any
fomaml             Θ_K     K − 1 adaptation steps, gradient at y_K     any
maml               —       K inner steps, exact 2nd-order gradient     any
fedavgm            Θ_1:K                                               heavy-ball / Nesterov β
fedadam/yogi/adagrad Θ_1:K                                             Adam / Yogi / Adagrad
=================  ======  =========================================  =====================
"""

from __future__ import annotations

from .recipe import SERVER_PARAMS, Recipe, local_update_recipe

__all__ = ["RECIPES"]

_CLIENT = ("client_lr",)
_P000 = "Charles & Konečný 2021 (arXiv:2103.05032)"
_P001 = "Charles & Konečný 2020 (arXiv:2007.00878)"

RECIPES: tuple[Recipe, ...] = (
    local_update_recipe(
        "minibatch_sgd",
        "distributed mini-batch SGD: one gradient per client (Θ_1)",
        _P000,
        SERVER_PARAMS,
        theta="one",
        fixed={"client_lr": 0.0},
        fixed_local_steps=1,
    ),
    local_update_recipe(
        "fedsgd",
        "FedSGD: K gradients at the broadcast point (γ = 0, Θ_1:K)",
        _P000,
        SERVER_PARAMS,
        fixed={"client_lr": 0.0},
    ),
    local_update_recipe(
        "fedavg",
        "generalised FedAvg: K local SGD steps, decoupled γ and η (Θ_1:K)",
        _P001,
        _CLIENT + SERVER_PARAMS,
    ),
    local_update_recipe(
        "fedavg_vanilla",
        "original FedAvg: average of client models (η = γ tied)",
        _P001,
        _CLIENT,
        units="delta",
        fixed={"server_lr": 1.0},
        server_opts=("sgd",),
    ),
    local_update_recipe(
        "fedavg_delta",
        "model-delta averaging with server lr η_Δ (= LocalUpdate with η_Δ·γ)",
        _P001,
        _CLIENT + SERVER_PARAMS,
        units="delta",
        defaults={"server_lr": 1.0},
    ),
    local_update_recipe(
        "reptile",
        "Reptile: FedAvg read as meta-learning (Θ_1:K, separate η)",
        _P000,
        _CLIENT + SERVER_PARAMS,
    ),
    local_update_recipe(
        "fedprox",
        "FedProx: local objective f_i(y) + (α/2)‖y − x_t‖² (Θ_1:K)",
        _P000,
        ("client_lr", "prox_alpha", *SERVER_PARAMS),
        defaults={"prox_alpha": 0.1},
    ),
    local_update_recipe(
        "lookahead",
        "Lookahead: one client, K fast steps, slow step η = α_LA·γ",
        _P000,
        ("client_lr", "server_lr"),
        server_opts=("sgd",),
        max_clients_per_round=1,
    ),
    local_update_recipe(
        "local_update",
        "LocalUpdate with an explicit coefficient vector Θ",
        _P000,
        ("client_lr", "prox_alpha", "theta", *SERVER_PARAMS),
    ),
    local_update_recipe(
        "fomaml",
        "first-order MAML: gradient at the K-th local iterate (Θ_K)",
        _P000,
        _CLIENT + SERVER_PARAMS,
        theta="last",
    ),
    local_update_recipe(
        "maml",
        "MAML: K inner steps, exact second-order meta-gradient by autodiff",
        _P000,
        _CLIENT + SERVER_PARAMS,
        second_order=True,
        packable="its meta-gradient differentiates through exactly K inner steps, which has no "
        "masked form",
        fixed_k_reason="its meta-gradient differentiates through exactly K inner steps "
        "(≡ Θ_{2K+1}, Charles & Konečný 2021 Thm 2)",
    ),
    local_update_recipe(
        "fedavgm",
        "FedAvg with server momentum β (heavy-ball or Nesterov)",
        _P000,
        _CLIENT + SERVER_PARAMS,
        defaults={"server_opt": "momentum"},
        server_opts=("momentum", "nesterov"),
    ),
    local_update_recipe(
        "fedadam",
        "FedAdam: Adam on the server",
        _P001,
        _CLIENT + SERVER_PARAMS,
        defaults={"server_opt": "adam", "server_lr": 0.01},
        server_opts=("adam",),
    ),
    local_update_recipe(
        "fedyogi",
        "FedYogi: Yogi on the server (β₁ 0.9, β₂ 0.99, ε 1e-5)",
        _P001,
        _CLIENT + SERVER_PARAMS,
        defaults={"server_opt": "yogi", "server_lr": 0.01},
        server_opts=("yogi",),
    ),
    local_update_recipe(
        "fedadagrad",
        "FedAdagrad: Adagrad on the server",
        _P001,
        _CLIENT + SERVER_PARAMS,
        defaults={"server_opt": "adagrad", "server_lr": 0.01},
        server_opts=("adagrad",),
    ),
)
