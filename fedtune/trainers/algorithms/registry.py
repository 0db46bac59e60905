"""Algorithm registry: every method is a *recipe* — parts plus defaults — not a class.

ALGORITHMS.md §1.5 table (`000_4bdc3753d62a87e2.txt` Table 1, `001_2dc7ddae5cbdc81f.txt` §2.1):

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

Hyperparameters are declared by the parts that read them (:mod:`fedtune.trainers.hparams`):
every recipe carries the client rule's :data:`~fedtune.trainers.client.CLIENT_HPARAMS` and the
server optimizer's :data:`~fedtune.trainers.server_opt.SERVER_HPARAMS`, plus the declarations
of its own parts (``Recipe.hparams``, e.g. FedGA's β). ``params`` names those a user may set
(any other is rejected with the field name), ``defaults`` and ``fixed`` give recipe values; the
recipe's validated hyperparameters are a frozen dataclass made from the declarations
(:attr:`Recipe.hparams_type`). Other modules add methods with :func:`register`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from fedtune.errors import CodeError, ConfigError

from ..client import CLIENT_HPARAMS, ClientRule
from ..config import TrialConfig
from ..hparams import HParam, hparams_type, merge_declarations, validate_hparams
from ..plugins import Origin, Registry, caller_location
from ..server_opt import SERVER_HPARAMS, SERVER_OPTS, make_server_opt
from ..tasks.base import Task
from ..theta import theta_vector
from .base import Algorithm
from .local_update import LocalUpdate

__all__ = [
    "Recipe",
    "algorithm_origin",
    "algorithms",
    "get_recipe",
    "local_epochs_refusal",
    "register",
    "resolve",
]

SERVER_PARAMS = tuple(h.name for h in SERVER_HPARAMS)
ALL_OPTS = SERVER_OPTS
#: declared by the parts every recipe has (client rule, server optimizer)
BASE_HPARAMS = (*CLIENT_HPARAMS, *SERVER_HPARAMS)


def _build_local_update(recipe: Recipe, hp: Any, local_steps: int, task: Task) -> Algorithm:
    rule = ClientRule(
        theta=theta_vector(recipe.theta, local_steps, hp.theta),
        prox_alpha=hp.prox_alpha,
        second_order=recipe.second_order,
        units=recipe.units,
        preset=recipe.theta,
    )
    return LocalUpdate(recipe.name, rule, make_server_opt(hp))


@dataclass(frozen=True)
class Recipe:
    """An algorithm: its parts, the hyperparameters a user may set (``params``) and recipe
    values (``defaults`` < user < ``fixed``). ``hparams`` declares the hyperparameters of the
    method's own parts beyond the client rule and server optimizer (see module docstring)."""

    name: str
    summary: str
    paper: str
    params: tuple[str, ...]
    hparams: tuple[HParam, ...] = ()
    theta: str = "sum"
    defaults: Mapping[str, Any] = field(default_factory=dict)
    fixed: Mapping[str, Any] = field(default_factory=dict)
    server_opts: tuple[str, ...] = ALL_OPTS
    second_order: bool = False
    units: str = "gradient"
    default_local_steps: int = 10
    fixed_local_steps: int | None = None
    max_clients_per_round: int | None = None
    needs_central: bool = False  # the task must hold central (server) data, e.g. Mixed FL
    # cross-field rules of the method (e.g. mass_auto excludes client_lr); raises ConfigError
    check: Callable[[TrialConfig], None] | None = None
    fixed_k_reason: str = ""  # why the method needs one K for all clients (rejects local_epochs)
    build: Callable[[Recipe, Any, int, Task], Algorithm] = _build_local_update
    hparams_type: type = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            declared = merge_declarations(BASE_HPARAMS, self.hparams)
            names = {h.name for h in declared}
            for what, keys in (("params", self.params), ("defaults", self.defaults),
                               ("fixed", self.fixed)):  # fmt: skip
                for key in keys:
                    if key not in names:
                        raise ConfigError(
                            f"hparams.{key}",
                            f"recipe {self.name!r} names {key!r} in {what}, but no part "
                            "declares it (declare it with HParam(...) in hparams=)",
                        )
            values = {**self.defaults, **self.fixed}
            cls = hparams_type(f"{self.name}_hparams", declared, values)
            validate_hparams(cls, values)
        except CodeError:
            raise
        except ConfigError as exc:
            raise CodeError(exc.field, exc.reason, caller_location()) from None
        object.__setattr__(self, "hparams_type", cls)

    @property
    def declared(self) -> dict[str, HParam]:
        """Every hyperparameter of the recipe's parts, by name (settable ones: ``params``)."""
        return dict(self.hparams_type.declared)

    def given_hparams(self, raw: Any) -> dict[str, Any]:
        """Validate the user's ``hparams:`` mapping: only ``params``, each typed and within its
        declared bounds (``ConfigError`` at ``hparams.<name>``); returns the coerced values."""
        if raw is None:
            return {}
        if not isinstance(raw, Mapping):
            raise ConfigError("hparams", f"must be a mapping, got {type(raw).__name__}")
        for key in sorted(raw):
            if key not in self.params:
                raise ConfigError(
                    f"hparams.{key}",
                    f"not a parameter of algorithm {self.name!r} "
                    f"(its parameters: {', '.join(self.params) or 'none'})",
                )
        hp = validate_hparams(self.hparams_type, raw)
        return {k: getattr(hp, k) for k in raw}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "summary": self.summary,
            "paper": self.paper,
            "params": list(self.params),
            "defaults": dict(self.defaults),
            "fixed": dict(self.fixed),
            "server_opts": list(self.server_opts),
        }


def _load_extensions() -> None:
    import importlib

    for mod in ("fedtune.trainers.algorithms.extensions",):
        try:
            importlib.import_module(mod)
        except ModuleNotFoundError as exc:
            if exc.name != mod:
                raise


REGISTRY: Registry[Recipe] = Registry("algorithm", "algorithm", _load_extensions)


def register(recipe: Recipe) -> Recipe:
    """Register ``recipe`` (built-ins and user code alike; see :mod:`fedtune.trainers.plugins`)."""
    REGISTRY.add(recipe.name, recipe)
    return recipe


def algorithms() -> dict[str, Recipe]:
    return REGISTRY.all()


def get_recipe(name: str) -> Recipe:
    return REGISTRY.get(name)


def algorithm_origin(name: str) -> Origin:
    return REGISTRY.origin(name)


def effective_hparams(recipe: Recipe, config: TrialConfig) -> Any:
    """Recipe defaults < user values < recipe-fixed values, validated against the parts'
    declarations (an instance of ``recipe.hparams_type``); unknown-to-recipe keys are errors."""
    given = recipe.given_hparams(config.hparams)
    if recipe.check is not None:
        recipe.check(config)
    hp = validate_hparams(recipe.hparams_type, {**recipe.defaults, **given, **recipe.fixed})
    if hp.server_opt not in recipe.server_opts:
        raise ConfigError(
            "hparams.server_opt",
            f"algorithm {recipe.name!r} supports {', '.join(recipe.server_opts)}, got {hp.server_opt!r}",
        )
    return hp


def local_steps_of(recipe: Recipe, config: TrialConfig) -> int:
    """K of the run. With ``train.local_epochs`` the clients run ⌈E·n_i/B⌉ steps each round
    (see ``steps.py``) and K is only the nominal size the parts are built with (the recipe's
    default); methods whose definition needs one fixed K reject local_epochs here."""
    if config.train.local_epochs is not None:
        _check_local_epochs(recipe, config)
        return recipe.default_local_steps
    given = config.train.local_steps
    if recipe.fixed_local_steps is not None:
        if given is not None and given != recipe.fixed_local_steps:
            raise ConfigError(
                "train.local_steps",
                f"algorithm {recipe.name!r} uses exactly {recipe.fixed_local_steps} local step(s)",
            )
        return recipe.fixed_local_steps
    return recipe.default_local_steps if given is None else given


def local_epochs_refusal(recipe: Recipe, theta: tuple[float, ...] = ()) -> str:
    """Why ``recipe`` (with an explicit Θ ``theta``) cannot run ``train.local_epochs``; ""
    when it can."""
    if recipe.fixed_local_steps is not None:
        return f"it runs exactly {recipe.fixed_local_steps} local step(s)"
    if theta:
        return "an explicit hparams.theta fixes K(Θ) = its length"
    return recipe.fixed_k_reason


def _check_local_epochs(recipe: Recipe, config: TrialConfig) -> None:
    theta = config.hparams.get("theta", ())
    reason = local_epochs_refusal(recipe, theta)
    if reason:
        raise ConfigError(
            "train.local_epochs",
            f"algorithm {recipe.name!r} needs a fixed train.local_steps: {reason}",
        )


def resolve(config: TrialConfig, task: Task) -> tuple[Algorithm, Any, int]:
    """Validate ``config`` against its algorithm's recipe and build the algorithm."""
    recipe = get_recipe(config.algorithm)
    hp = effective_hparams(recipe, config)
    steps = local_steps_of(recipe, config)
    if (
        recipe.max_clients_per_round
        and config.train.clients_per_round > recipe.max_clients_per_round
    ):
        raise ConfigError(
            "train.clients_per_round",
            f"algorithm {recipe.name!r} allows at most {recipe.max_clients_per_round}",
        )
    if recipe.needs_central and task.central is None:
        raise ConfigError(
            "task", f"algorithm {recipe.name!r} needs a task with central data (e.g. mixed_labels)"
        )
    return recipe.build(recipe, hp, steps, task), hp, steps


_CLIENT = ("client_lr",)
_P000 = "000_4bdc3753d62a87e2.txt"
_P001 = "001_2dc7ddae5cbdc81f.txt"

for _recipe in (
    Recipe(
        "minibatch_sgd",
        "distributed mini-batch SGD: one gradient per client (Θ_1)",
        _P000,
        SERVER_PARAMS,
        theta="one",
        fixed={"client_lr": 0.0},
        fixed_local_steps=1,
    ),
    Recipe(
        "fedsgd",
        "FedSGD: K gradients at the broadcast point (γ = 0, Θ_1:K)",
        _P000,
        SERVER_PARAMS,
        fixed={"client_lr": 0.0},
    ),
    Recipe(
        "fedavg",
        "generalised FedAvg: K local SGD steps, decoupled γ and η (Θ_1:K)",
        _P001,
        _CLIENT + SERVER_PARAMS,
    ),
    Recipe(
        "fedavg_vanilla",
        "original FedAvg: average of client models (η = γ tied)",
        _P001,
        _CLIENT,
        units="delta",
        fixed={"server_lr": 1.0},
        server_opts=("sgd",),
    ),
    Recipe(
        "fedavg_delta",
        "model-delta averaging with server lr η_Δ (= LocalUpdate with η_Δ·γ)",
        _P001,
        _CLIENT + SERVER_PARAMS,
        units="delta",
        defaults={"server_lr": 1.0},
    ),
    Recipe(
        "reptile",
        "Reptile: FedAvg read as meta-learning (Θ_1:K, separate η)",
        _P000,
        _CLIENT + SERVER_PARAMS,
    ),
    Recipe(
        "fedprox",
        "FedProx: local objective f_i(y) + (α/2)‖y − x_t‖² (Θ_1:K)",
        _P000,
        ("client_lr", "prox_alpha", *SERVER_PARAMS),
        defaults={"prox_alpha": 0.1},
    ),
    Recipe(
        "lookahead",
        "Lookahead: one client, K fast steps, slow step η = α_LA·γ",
        _P000,
        ("client_lr", "server_lr"),
        server_opts=("sgd",),
        max_clients_per_round=1,
    ),
    Recipe(
        "local_update",
        "LocalUpdate with an explicit coefficient vector Θ",
        _P000,
        ("client_lr", "prox_alpha", "theta", *SERVER_PARAMS),
    ),
    Recipe(
        "fomaml",
        "first-order MAML: gradient at the K-th local iterate (Θ_K)",
        _P000,
        _CLIENT + SERVER_PARAMS,
        theta="last",
    ),
    Recipe(
        "maml",
        "MAML: K inner steps, exact second-order meta-gradient by autodiff",
        _P000,
        _CLIENT + SERVER_PARAMS,
        second_order=True,
        fixed_k_reason="its meta-gradient differentiates through exactly K inner steps "
        "(≡ Θ_{2K+1}, 000_4bdc3753d62a87e2.txt Thm 2)",
    ),
    Recipe(
        "fedavgm",
        "FedAvg with server momentum β (heavy-ball or Nesterov)",
        _P000,
        _CLIENT + SERVER_PARAMS,
        defaults={"server_opt": "momentum"},
        server_opts=("momentum", "nesterov"),
    ),
    Recipe(
        "fedadam",
        "FedAdam: Adam on the server",
        _P001,
        _CLIENT + SERVER_PARAMS,
        defaults={"server_opt": "adam", "server_lr": 0.01},
        server_opts=("adam",),
    ),
    Recipe(
        "fedyogi",
        "FedYogi: Yogi on the server (β₁ 0.9, β₂ 0.99, ε 1e-5)",
        _P001,
        _CLIENT + SERVER_PARAMS,
        defaults={"server_opt": "yogi", "server_lr": 0.01},
        server_opts=("yogi",),
    ),
    Recipe(
        "fedadagrad",
        "FedAdagrad: Adagrad on the server",
        _P001,
        _CLIENT + SERVER_PARAMS,
        defaults={"server_opt": "adagrad", "server_lr": 0.01},
        server_opts=("adagrad",),
    ),
):
    register(_recipe)
