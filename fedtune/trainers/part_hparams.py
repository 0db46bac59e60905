"""The hyperparameter declarations of the built-in parts: the client rule, the server
optimizer and the parts of the extension methods (FedGA/GradAlign, SCAFFOLD, Mixed FL, MaSS).

Each part's module re-exports its declarations (``fedtune.trainers.client.CLIENT_HPARAMS``, …);
they live here, with no import of torch, so that a recipe's metadata (what a study may set, its
types, bounds and default search ranges) is read without the engine: validating a study spec
never imports torch (docs/explanation/architecture.md §1).
"""

from __future__ import annotations

import math

from .hparams import HParam, Space

__all__ = [
    "CLIENT_HPARAMS",
    "GA_HPARAMS",
    "MASS_HPARAMS",
    "MIXED_HPARAMS",
    "SCAFFOLD_HPARAMS",
    "SERVER_HPARAMS",
    "SERVER_OPTS",
]

# -- the client rule (fedtune.trainers.client)
CLIENT_HPARAMS = (
    HParam(
        "client_lr",
        float,
        0.1,
        bounds=(0.0, math.inf),
        space=Space(1e-3, 10.0, log=True, grid="half-decade"),
        doc="γ, client (inner) learning rate",
    ),
    HParam(
        "prox_alpha",
        float,
        0.0,
        bounds=(0.0, math.inf),
        space=Space(1e-3, 10.0, log=True, grid="decade", default=0.1),
        doc="α, FedProx proximal strength (α = 0 is FedAvg)",
    ),
    HParam(
        "theta",
        tuple,
        (),
        bounds=(0.0, math.inf),
        doc="explicit Θ for local_update (weights >= 0, one positive); empty = the preset",
    ),
)

# -- the server optimizer (fedtune.trainers.server_opt)
SERVER_OPTS: tuple[str, ...] = ("sgd", "momentum", "nesterov", "adam", "yogi", "adagrad")
_OPEN_RANGE = (0.0, math.inf)

SERVER_HPARAMS = (
    HParam(
        "server_lr",
        float,
        0.1,
        bounds=_OPEN_RANGE,
        open="low",
        space=Space(1e-3, 10.0, log=True, grid="half-decade"),
        doc="η, server (outer) learning rate (gradient units; η = γ is original FedAvg)",
    ),
    HParam(
        "server_opt",
        str,
        "sgd",
        choices=SERVER_OPTS,
        space=Space(enabled=False),
        doc="server optimizer (a recipe may allow only some)",
    ),
    HParam(
        "server_momentum",
        float,
        0.9,
        bounds=(0.0, 1.0),
        open="high",
        space=Space(0.0, 0.99, grid=(0.0, 0.5, 0.9, 0.99), enabled=False),
        doc="β, heavy-ball / Nesterov coefficient",
    ),
    HParam(
        "nesterov_form",
        str,
        "keras",
        choices=("keras", "theory"),
        space=Space(enabled=False),
        doc="which Nesterov recursion (docs/explanation/algorithms.md §1.4); only with "
        "server_opt nesterov",
    ),
    HParam(
        "server_beta1",
        float,
        0.9,
        bounds=(0.0, 1.0),
        open="high",
        space=Space(0.0, 0.99, grid=(0.0, 0.5, 0.9), enabled=False),
        doc="β₁, first-moment decay (unused by Adagrad)",
    ),
    HParam(
        "server_beta2",
        float,
        0.99,
        bounds=(0.0, 1.0),
        open="high",
        space=Space(0.9, 0.9999, grid=(0.9, 0.99, 0.999), enabled=False),
        doc="β₂, second-moment decay",
    ),
    HParam(
        "server_eps",
        float,
        1e-5,
        bounds=_OPEN_RANGE,
        open="low",
        space=Space(1e-8, 1e-1, log=True, grid="decade", enabled=False),
        doc="ε, adaptivity floor",
    ),
    HParam(
        "server_bias_correction",
        bool,
        False,
        doc="bias-corrected moments m̂, v̂ (off, as in Reddi et al.; "
        "docs/explanation/algorithms.md §9 item 12)",
    ),
)

# -- the FedGA/GradAlign alignment (fedtune.trainers.algorithms.gradalign)
GA_HPARAMS = (
    HParam(
        "ga_beta",
        float,
        0.1,
        bounds=(0.0, math.inf),
        space=Space(
            1e-3, 10.0, log=True, grid=(0.01, 0.025, 0.05, 0.1, 0.5, 1.0, 1.5, 2.5, 3.5, 5.0)
        ),
        doc="β: displacement step of GradAlign/FedGA (regularisation strength of r)",
    ),
    HParam(
        "ga_form",
        str,
        "once",
        choices=("once", "every_step"),
        space=Space(enabled=False),
        doc="FedGA form: 'once' (Alg. 2, displace the start) or 'every_step' (Alg. 3)",
    ),
    HParam(
        "ga_full_batch",
        bool,
        True,
        doc="g_i(x) for displacement/controls from the full local data (else one extra mini-batch)",
    ),
)

# -- the SCAFFOLD (fedtune.trainers.algorithms.scaffold)
SCAFFOLD_HPARAMS = (
    HParam(
        "scaffold_option",
        int,
        2,
        choices=(1, 2),
        space=Space(enabled=False),
        doc="SCAFFOLD control update: 2 = from the local steps, 1 = full local gradient at x",
    ),
)

# -- the Mixed FL (fedtune.trainers.algorithms.mixed)
_POSITIVE = (0.0, math.inf)
MIXED_HPARAMS = (
    HParam(
        "central_lr",
        float,
        None,
        bounds=_POSITIVE,
        nullable=True,
        space=Space(1e-3, 10.0, log=True, grid="half-decade", enabled=False),
        doc="η_c, central (server-data) step size; null = client_lr·server_lr",
    ),
    HParam(
        "merge_lr",
        float,
        1.0,
        bounds=_POSITIVE,
        open="low",
        space=Space(0.1, 2.0, grid=(0.5, 1.0), enabled=False),
        doc="η_m, merge step on Δ_c + Δ_f (PT, 2-w GT)",
    ),
    HParam(
        "central_steps",
        int,
        None,
        bounds=(1, math.inf),
        nullable=True,
        space=Space(1, 50, log=True, grid=(1, 2, 5, 10, 20), enabled=False),
        doc="K_c, central steps per round (PT, 2-w GT); null = local_steps",
    ),
    HParam(
        "central_batch_size",
        int,
        None,
        bounds=(0, math.inf),
        nullable=True,
        doc="|B_c|; null = S·B (PT, 2-w GT) or K·S·B (1-w GT); 0 = whole central set",
    ),
    HParam(
        "mixed_variant",
        str,
        "pt",
        choices=("pt", "gt1", "gt2"),
        space=Space(),
        doc="Mixed FL variant for recipe mixed_fl: pt, gt1 or gt2",
    ),
    HParam(
        "mixed_gt2_init",
        str,
        "zero",
        choices=("zero", "fresh"),
        space=Space(enabled=False),
        doc="2-w GT initial augmenting gradients: zero or fresh (gradients at x⁰)",
    ),
)

# -- the FedAvg-MaSS (fedtune.trainers.algorithms.mass)
MASS_HPARAMS = (
    HParam(
        "mass_eta2",
        float,
        0.01,
        bounds=(0.0, math.inf),
        space=Space(0.0, 0.1, grid=(0.0, 0.0001, 0.001, 0.01), default=0.001),
        doc="η₂, MaSS compensation step (0 = Nesterov)",
    ),
    HParam(
        "mass_gamma",
        float,
        0.9,
        bounds=(0.0, 1.0),
        open="high",
        space=Space(0.0, 0.99, grid=(0.0, 0.5, 0.9, 0.99)),
        doc="γ, MaSS/Nesterov momentum",
    ),
    HParam(
        "mass_form",
        str,
        "form2",
        choices=("form2", "form1", "form1_literal"),
        space=Space(choices=("form2", "form1"), enabled=False),
        doc="form2 (default), form1 (same with corrected sync) or form1_literal",
    ),
    HParam(
        "mass_grad_point",
        str,
        "u",
        choices=("u", "w"),
        space=Space(enabled=False),
        doc="where the stochastic gradient is taken: u (look-ahead, default) or w",
    ),
    HParam(
        "mass_auto",
        bool,
        False,
        doc="use the theorem's η₁, η₂, γ from the task's data constants (linear regression)",
    ),
)
