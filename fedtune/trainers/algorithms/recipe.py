"""What an algorithm is: a :class:`Recipe` — parts plus defaults — not a class.

Hyperparameters are declared by the parts that read them (:mod:`fedtune.trainers.hparams`):
every recipe carries the client rule's :data:`~fedtune.trainers.client.CLIENT_HPARAMS` and the
server optimizer's :data:`~fedtune.trainers.server_opt.SERVER_HPARAMS`, plus the declarations
of its own parts (``Recipe.hparams``, e.g. FedGA's β). ``params`` names those a user may set
(any other is rejected with the field name), ``defaults`` and ``fixed`` give recipe values; the
recipe's validated hyperparameters are a frozen dataclass made from the declarations
(:attr:`Recipe.hparams_type`). The registry (:mod:`.registry`) holds recipes by name; this module
knows nothing of it, so a module of recipes (:mod:`.local_methods`) need not import the registry.

A recipe is metadata plus callables: this module imports no part of the engine (nor torch), so
reading a recipe — to validate a study spec — does not; :func:`build_local_update` imports the
parts when it builds a round, and the built-in methods' own rounds are
:class:`~fedtune.trainers.plugins.Deferred` (:mod:`.extensions`).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from fedtune.errors import CodeError, ConfigError, as_mapping
from fedtune.suggest import did_you_mean

from ..hparams import HParam, hparams_type, merge_declarations, validate_hparams
from ..part_hparams import CLIENT_HPARAMS, SERVER_HPARAMS, SERVER_OPTS
from ..plugins import caller_location

if TYPE_CHECKING:  # the engine's parts: imported when a round is built, not to read a recipe
    from ..config import TrialConfig
    from ..tasks.base import Task
    from .base import Algorithm
    from .local_update import Aggregator, PackedAggregator

__all__ = [
    "ALL_OPTS",
    "BASE_HPARAMS",
    "LOCAL_UPDATE_ROUND",
    "MEMBER_HPARAMS",
    "OWN_ROUND",
    "SERVER_PARAMS",
    "Recipe",
    "build_local_update",
    "local_update_recipe",
]

SERVER_PARAMS = tuple(h.name for h in SERVER_HPARAMS)
ALL_OPTS = SERVER_OPTS
#: declared by the parts every recipe has (client rule, server optimizer)
BASE_HPARAMS = (*CLIENT_HPARAMS, *SERVER_HPARAMS)
#: the hyperparameters the packed engine itself holds per member (``[P]`` tensors, Θ rows): the
#: client rule's and the server optimizer's scalars (``fedtune.trainers.packed``); a recipe's
#: ``aggregator_hparams`` can differ per member too (its ``packed_aggregator`` reads them)
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


#: a round of the recipe's parts: :class:`LocalUpdate` of its client rule, its aggregator and
#: the server optimizer its hyperparameters name, built by :func:`build_local_update`
LOCAL_UPDATE_ROUND = "local_update"
#: a round the recipe's own ``build`` makes (its server state, aggregator or loop)
OWN_ROUND = "own"
_ROUND_FORMS = (LOCAL_UPDATE_ROUND, OWN_ROUND)


def build_local_update(recipe: Recipe, hp: Any, local_steps: int, task: Task) -> Algorithm:
    """Build the round of a recipe's parts (``round_form`` ``local_update``).

    Args:
        recipe: The recipe: Θ preset, units, second order, aggregator and what it reads.
        hp: The configuration's validated hyperparameters.
        local_steps: K.
        task: The task (unused).

    Returns:
        The :class:`LocalUpdate` of the client rule, the server optimizer and the aggregator.
    """
    from ..client import ClientRule
    from ..server_opt import make_server_opt
    from ..theta import theta_vector
    from .local_update import LocalUpdate, mean_aggregator

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
        build: ``build(recipe, hp, local_steps, task) -> Algorithm`` (None: the round of the
            recipe's parts, :func:`build_local_update`, filled in).
        round_form: What the round is: ``local_update`` (:data:`LOCAL_UPDATE_ROUND`: the
            :class:`LocalUpdate` of the recipe's client rule, aggregator and server optimizer,
            which a ``build`` given beside it promises to return) or ``own``
            (:data:`OWN_ROUND`: whatever ``build`` makes). None: ``own`` when a ``build`` is
            given, else ``local_update``.
        aggregator: The default round's aggregation part (None: the weighted mean), an
            :class:`~.local_update.Aggregator`.
        packed_aggregator: The round's aggregator over a pack's stacked members, a
            :class:`~.local_update.PackedAggregator`: a round with its own aggregator packs
            only with it.
        aggregator_hparams: The hyperparameters the aggregator reads (numbers or booleans the
            recipe declares), passed by keyword: the value to ``aggregator``, every member's
            value as a float64 ``[P]`` tensor to ``packed_aggregator`` (e.g. FedNova's α).
        packable: Whether configurations of the method may share a pack: True, False, or the
            reason it does not (a string the refusal prints). None: derived, True for a
            ``local_update`` round that is first order and whose aggregator is the weighted
            mean or has a ``packed_aggregator``; an ``own`` round packs only when it says
            True (its ``build`` must then return the packed engine's form:
            docs/explanation/packing.md). After construction a bool, the reason in
            :attr:`pack_refusal`.
        member_hparams: The hyperparameters members of one pack may differ in (None: every
            one of :data:`MEMBER_HPARAMS` the recipe declares), of those a pack can hold per
            member (:attr:`pack_holds`); the others are shared.

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
    build: Callable[[Recipe, Any, int, Task], Algorithm] | None = None
    round_form: str | None = None
    aggregator: Aggregator | None = None
    packed_aggregator: PackedAggregator | None = None
    aggregator_hparams: tuple[str, ...] = ()
    packable: bool | str | None = None
    member_hparams: tuple[str, ...] | None = None
    declared: Mapping[str, HParam] = field(init=False, repr=False, compare=False)
    #: why configurations of the method cannot share a pack (None: they can)
    _refusal: str | None = field(init=False, default=None, repr=False, compare=False)

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
        self._declare_round()
        self._declare_packing()

    def _declare_round(self) -> None:
        """Fill in ``round_form`` (and ``build`` for a round of the parts) when not given, and
        check them against each other."""
        own = self.build is not None  # whether a build was given; never which one
        form = self.round_form or (OWN_ROUND if own else LOCAL_UPDATE_ROUND)
        if form not in _ROUND_FORMS:
            raise CodeError(
                "algorithm.round_form",
                f"must be one of {', '.join(_ROUND_FORMS)}, got {form!r}",
                caller_location(),
            )
        if not own and form == OWN_ROUND:
            raise CodeError(
                "algorithm.build",
                "round_form 'own' needs build(recipe, hp, local_steps, task)",
                caller_location(),
            )
        if own and not callable(self.build):
            raise CodeError(
                "algorithm.build",
                f"must be callable (recipe, hp, local_steps, task), got {self.build!r}",
                caller_location(),
            )
        if self.aggregator is not None and form == OWN_ROUND:
            raise CodeError(
                "algorithm.aggregator",
                "give either aggregator or build, not both (a build's round holds its own "
                "aggregator; packed_aggregator is its form over a pack's members)",
                caller_location(),
            )
        object.__setattr__(self, "round_form", form)
        object.__setattr__(self, "build", self.build or build_local_update)

    def _declare_packing(self) -> None:
        """Fill in ``packable`` and ``member_hparams`` when not given, and check them."""
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
        if isinstance(members, str):
            members = (members,)
        for name in members:
            if name not in self.pack_holds:
                raise CodeError(
                    "algorithm.member_hparams",
                    f"{name!r} cannot differ within a pack: {self._not_held(name)}",
                    caller_location(),
                )
        object.__setattr__(self, "member_hparams", tuple(members))
        object.__setattr__(self, "_refusal", self._declared_refusal())
        object.__setattr__(self, "packable", self._refusal is None)

    @property
    def pack_holds(self) -> tuple[str, ...]:
        """The hyperparameters a pack of the method can hold per member: the engine's
        (:data:`MEMBER_HPARAMS`) the recipe declares, and the ``aggregator_hparams`` its
        ``packed_aggregator`` receives as ``[P]`` tensors."""
        engine = tuple(n for n in MEMBER_HPARAMS if n in self.declared)
        if self.packed_aggregator is None:
            return engine
        return engine + tuple(n for n in self.aggregator_hparams if n not in engine)

    def _not_held(self, name: str) -> str:
        """Why a pack cannot hold ``name`` per member."""
        if name not in self.declared:
            return f"no part of algorithm {self.name!r} declares it"
        return (
            f"a pack holds per member only {', '.join(self.pack_holds)} (the client rule's and "
            "the server optimizer's scalars, and the aggregator_hparams that packed_aggregator "
            f"receives as [P] tensors); every other value, {name!r} among them, is built into "
            "the round once for the whole pack"
        )

    def _check_aggregator_hparams(self) -> None:
        """``aggregator_hparams`` name numeric or boolean declarations, read by an aggregator."""
        names = self.aggregator_hparams
        if names and self.aggregator is None and self.packed_aggregator is None:
            raise CodeError(
                "algorithm.aggregator_hparams",
                "names what the aggregator reads, but the recipe has no aggregator (nor a "
                "packed_aggregator)",
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

    def _declared_refusal(self) -> str | None:
        """The refusal the recipe declares (``packable``), checked against its round."""
        said, why = self.packable, self._round_refusal()
        if said is True and why is not None:
            raise CodeError("algorithm.packable", f"cannot be True: {why}", caller_location())
        if isinstance(said, str) and said.strip():
            why = said.strip()
        elif said is False:
            why = why or "it declares packable=False"
        elif said not in (True, None):
            raise CodeError(
                "algorithm.packable",
                f"must be True, False or the reason it does not pack (a string), got {said!r}",
                caller_location(),
            )
        elif said is None and self.round_form == OWN_ROUND:
            why = (
                "its round is its own (build), not the plain LocalUpdate, and it declares no "
                "packed form (packable=True: docs/explanation/packing.md)"
            )
        if why is None:
            return None
        return f"algorithm {self.name!r} does not pack: {why}; one configuration per process"

    def _round_refusal(self) -> str | None:
        """Why the parts of a ``local_update`` round have no packed form, or None."""
        if self.round_form != LOCAL_UPDATE_ROUND:
            return None  # an own round's packed form is its build's: checked when it packs
        if self.aggregator is not None and self.packed_aggregator is None:
            return (
                "it has its own aggregator and no packed_aggregator (its form over stacked members)"
            )
        if self.second_order:
            return "it differentiates through exactly K inner steps, which has no masked form"
        return None

    @property
    def pack_refusal(self) -> str | None:
        """Why configurations of the method cannot share a pack, or None when they can."""
        return self._refusal

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


def local_update_recipe(
    name: str,
    summary: str,
    paper: str,
    params: tuple[str, ...],
    *,
    packable: bool | str = True,
    member_hparams: tuple[str, ...] = MEMBER_HPARAMS,
    **fields: Any,
) -> Recipe:
    """Make a recipe whose round is the plain :class:`LocalUpdate` of its parts, saying so.

    Args:
        name: The algorithm's name.
        summary: One line for ``fedtune algorithms``.
        paper: The paper the method comes from.
        params: The hyperparameters a study may set.
        packable: Whether it packs, or the reason it does not (default: it packs).
        member_hparams: What members of one pack may differ in (default: all the engine holds).
        **fields: The :class:`Recipe`'s other fields, ``build`` and ``round_form`` excepted.

    Returns:
        The recipe, ``round_form`` ``local_update``.
    """
    return Recipe(
        name,
        summary,
        paper,
        params,
        round_form=LOCAL_UPDATE_ROUND,
        packable=packable,
        member_hparams=member_hparams,
        **fields,
    )
