"""What an algorithm is: a :class:`Recipe` — parts plus defaults — not a class.

Hyperparameters are declared by the parts that read them (:mod:`fedtune.trainers.hparams`):
every recipe carries the client rule's :data:`~fedtune.trainers.client.CLIENT_HPARAMS` and the
server optimizer's :data:`~fedtune.trainers.server_opt.SERVER_HPARAMS`, plus the declarations
of its own parts (``Recipe.hparams``, e.g. FedGA's β). ``params`` names those a user may set
(any other is rejected with the field name), ``defaults`` and ``fixed`` give recipe values; the
recipe's validated hyperparameters are a frozen dataclass made from the declarations
(:attr:`Recipe.hparams_type`). The registry (:mod:`.registry`) holds recipes by name; this module
knows nothing of it, so a module of recipes (:mod:`.local_methods`) need not import the registry.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedtune.errors import CodeError, ConfigError, as_mapping
from fedtune.suggest import did_you_mean

from ..client import CLIENT_HPARAMS, ClientRule
from ..hparams import HParam, hparams_type, merge_declarations, validate_hparams
from ..plugins import caller_location
from ..server_opt import SERVER_HPARAMS, SERVER_OPTS, make_server_opt
from ..tasks.base import Task
from ..theta import theta_vector
from .base import Algorithm
from .local_update import Aggregator, LocalUpdate, PackedAggregator, mean_aggregator

if TYPE_CHECKING:
    from ..config import TrialConfig

__all__ = ["ALL_OPTS", "BASE_HPARAMS", "MEMBER_HPARAMS", "SERVER_PARAMS", "Recipe"]

SERVER_PARAMS = tuple(h.name for h in SERVER_HPARAMS)
ALL_OPTS = SERVER_OPTS
#: declared by the parts every recipe has (client rule, server optimizer)
BASE_HPARAMS = (*CLIENT_HPARAMS, *SERVER_HPARAMS)
#: the hyperparameters a pack can hold per member (``[P]`` tensors, Θ rows): the client
#: rule's and the server optimizer's scalars (``fedtune.trainers.packed``)
MEMBER_HPARAMS = (
    "client_lr",
    "server_lr",
    "prox_alpha",
    "theta",
    "server_momentum",
    "server_beta1",
    "server_beta2",
    "server_eps",
)


def _build_local_update(recipe: Recipe, hp: Any, local_steps: int, task: Task) -> Algorithm:
    rule = ClientRule(
        theta=theta_vector(recipe.theta, local_steps, hp.theta),
        prox_alpha=hp.prox_alpha,
        second_order=recipe.second_order,
        units=recipe.units,
        preset=recipe.theta,
    )
    aggregator = recipe.aggregator or mean_aggregator
    if recipe.aggregator_hparams:  # the method's own hyperparameters, bound by keyword
        aggregator = functools.partial(
            aggregator, **{name: getattr(hp, name) for name in recipe.aggregator_hparams}
        )
    return LocalUpdate(recipe.name, rule, make_server_opt(hp), aggregator)


@dataclass(frozen=True)
class Recipe:
    """An algorithm: its parts, the hyperparameters a user may set and the recipe's values.

    Hyperparameter values resolve as ``defaults`` < the user's ``hparams:`` < ``fixed``.

    Args:
        name: The algorithm's name.
        summary: One line for ``fedtune algorithms``.
        paper: The paper the method comes from.
        params: The hyperparameters a study may set.
        hparams: Declarations of the method's own parts' hyperparameters, beyond the client
            rule's and the server optimizer's.
        theta: The Θ preset weighting the local steps' gradients (``sum`` …).
        defaults: Recipe values a study may override.
        fixed: Recipe values a study may not set.
        server_opts: The server optimizers the method accepts.
        second_order: Differentiate through the local steps (MAML).
        units: The client message's units: ``gradient`` or ``delta`` (the model change).
        default_local_steps: K when the study gives none.
        fixed_local_steps: The only K the method runs (None: any).
        max_clients_per_round: The most clients per round it supports (None: no limit).
        needs_central: The task must hold central (server) data, e.g. Mixed FL.
        check: Cross-field rules on a trial configuration, raising ``ConfigError``.
        fixed_k_reason: Why the method needs one K for all clients (refuses
            ``train.local_epochs``).
        build: ``build(recipe, hp, local_steps, task) -> Algorithm`` (default: a
            :class:`LocalUpdate` of the client rule, the server optimizer and ``aggregator``).
        aggregator: The default round's aggregation part (None: the weighted mean), an
            :class:`~.local_update.Aggregator`.
        packed_aggregator: ``aggregator`` over a pack's stacked members, a
            :class:`~.local_update.PackedAggregator`: a recipe with its own aggregator packs
            only with it.
        aggregator_hparams: The hyperparameters ``aggregator`` reads (numbers or booleans the
            recipe declares), passed by keyword: the value to ``aggregator``, every member's
            value as a float64 ``[P]`` tensor to ``packed_aggregator`` (e.g. FedNova's α).
        packable: Whether configurations of the method may share a pack (None: derived; the
            default round with the weighted mean or a ``packed_aggregator``, first order).
        member_hparams: The hyperparameters members of one pack may differ in (None: every
            one of :data:`MEMBER_HPARAMS` the recipe declares); the others are shared.

    Raises:
        CodeError: A name in ``params``, ``defaults`` or ``fixed`` that no part declares, or
            a recipe value outside its declaration.
    """

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
    aggregator: Aggregator | None = None
    packed_aggregator: PackedAggregator | None = None
    aggregator_hparams: tuple[str, ...] = ()
    packable: bool | None = None
    member_hparams: tuple[str, ...] | None = None
    declared: Mapping[str, HParam] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        """Every name the recipe uses is declared by a part, every recipe value is valid
        (``CodeError`` at the registering line otherwise)."""
        declared = {h.name: h for h in merge_declarations(BASE_HPARAMS, self.hparams)}
        object.__setattr__(self, "declared", declared)
        for what, keys in (
            ("params", self.params),
            ("defaults", self.defaults),
            ("fixed", self.fixed),
        ):
            for key in keys:
                if key not in declared:
                    raise CodeError(
                        f"hparams.{key}",
                        f"recipe {self.name!r} names {key!r} in {what}, but no part declares "
                        "it (declare it with HParam(...) in hparams=)",
                        caller_location(),
                    )
                problem = what != "params" and declared[key].value_problem(keys[key])
                if problem:
                    raise CodeError(
                        f"hparams.{key}", f"{what} of {self.name!r}: {problem}", caller_location()
                    )
        self._declare_packing()

    def _declare_packing(self) -> None:
        """Fill in ``packable`` and ``member_hparams`` when not given, and check them."""
        default_round = self.build is _build_local_update
        if self.aggregator is not None and not default_round:
            raise CodeError(
                "algorithm.aggregator",
                "give either aggregator or build, not both",
                caller_location(),
            )
        for name in ("aggregator", "packed_aggregator"):
            part = getattr(self, name)
            if part is not None and not callable(part):
                raise CodeError(
                    f"algorithm.{name}",
                    f"must be callable (messages, weights, steps, client_lr), got {part!r}",
                    caller_location(),
                )
        self._check_aggregator_hparams()
        members = self.member_hparams
        if members is None:
            members = tuple(n for n in MEMBER_HPARAMS if n in self.declared)
        for name in members:
            if name not in MEMBER_HPARAMS or name not in self.declared:
                raise CodeError(
                    "algorithm.member_hparams",
                    f"{name!r} cannot differ within a pack: a pack holds per member only "
                    f"{', '.join(n for n in MEMBER_HPARAMS if n in self.declared)}",
                    caller_location(),
                )
        object.__setattr__(self, "member_hparams", tuple(members))
        if self.packable is None:
            object.__setattr__(self, "packable", self._round_refusal() is None)
        elif self.packable and self._round_refusal() is not None:
            raise CodeError("algorithm.packable", str(self._round_refusal()), caller_location())

    def _check_aggregator_hparams(self) -> None:
        """``aggregator_hparams`` name numeric or boolean declarations, read by an aggregator."""
        names = self.aggregator_hparams
        if names and self.aggregator is None:
            raise CodeError(
                "algorithm.aggregator_hparams",
                "names what the aggregator reads, but the recipe has no aggregator",
                caller_location(),
            )
        for name in names:
            declared = self.declared.get(name)
            if declared is None or declared.type not in (float, int, bool) or declared.nullable:
                raise CodeError(
                    "algorithm.aggregator_hparams",
                    f"{name!r} must be a declared float, int or bool hyperparameter (not "
                    "nullable): a pack hands its members' values to packed_aggregator as one "
                    "float64 tensor",
                    caller_location(),
                )

    def _round_refusal(self) -> str | None:
        """Why the method's round has no packed form, or None."""
        if self.build is not _build_local_update:
            return (
                f"algorithm {self.name!r} is not a plain LocalUpdate (its own server state, "
                "aggregator or round): one configuration per process"
            )
        if self.aggregator is not None and self.packed_aggregator is None:
            return (
                f"algorithm {self.name!r} has its own aggregator and no packed_aggregator "
                "(its form over stacked members): one configuration per process"
            )
        if self.second_order:
            return (
                f"algorithm {self.name!r} differentiates through exactly K inner steps, which "
                "has no masked form: one configuration per process"
            )
        return None

    @property
    def pack_refusal(self) -> str | None:
        """Why configurations of the method cannot share a pack, or None when they can."""
        why = self._round_refusal()
        if why is None and not self.packable:
            why = f"algorithm {self.name!r} declares packable=False: one configuration per process"
        return why

    @property
    def hparams_type(self) -> type:
        """The frozen dataclass of the recipe's validated hyperparameters, built on first use.

        One field per declaration; its default is the recipe's value, else the declared one.
        """
        cls = self.__dict__.get("_hparams_type")
        if cls is None:
            values = {**self.defaults, **self.fixed}
            cls = hparams_type(f"{self.name}_hparams", tuple(self.declared.values()), values)
            object.__setattr__(self, "_hparams_type", cls)
        return cls

    def given_hparams(self, raw: Any) -> dict[str, Any]:
        """Validate a study's ``hparams:`` mapping against the recipe.

        Args:
            raw: The mapping (None: empty).

        Returns:
            The given values, coerced to their declared types.

        Raises:
            ConfigError: Not a mapping, a name not in ``params``, or a value of the wrong
                type or out of its declared bounds (at ``hparams.<name>``).
        """
        if raw is None:
            return {}
        for key in sorted(as_mapping(raw, "hparams")):
            if key not in self.params:
                raise ConfigError(
                    f"hparams.{key}",
                    f"not a parameter of algorithm {self.name!r}"
                    f"{did_you_mean(key, self.params)} "
                    f"(its parameters: {', '.join(self.params) or 'none'})",
                )
        hp = validate_hparams(self.hparams_type, raw)
        return {k: getattr(hp, k) for k in raw}

    def describe(self) -> dict[str, Any]:
        """Describe the recipe for listings such as ``GET /v1/algorithms``.

        Returns:
            Its name, summary, paper, params, defaults, fixed values and server optimizers.
        """
        return {
            "name": self.name,
            "summary": self.summary,
            "paper": self.paper,
            "params": list(self.params),
            "defaults": dict(self.defaults),
            "fixed": dict(self.fixed),
            "server_opts": list(self.server_opts),
        }
