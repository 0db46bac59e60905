"""The study spec's search space and its deep validation: against the registries, the
algorithm's recipe and the search space (:meth:`StudySpec.validate_deep`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from fedtune.errors import CodeError, ConfigError
from fedtune.search_spaces import (
    Parameter,
    ParamType,
    SearchSpace,
    combine,
    combine_errors,
    declaration_problem,
    default_space,
    load_space,
    merge,
    resolve_path,
    resolve_values,
)
from fedtune.suggest import did_you_mean
from fedtune.trainers.algorithms.registry import (
    Recipe,
    effective_hparams,
    get_recipe,
    local_epochs_refusal,
    local_steps_of,
)
from fedtune.trainers.config import (
    TrialConfig,
)

from ..choices import can_check_cheaply, check_choice
from ..strategies import SamplerName, SchedulerName
from .sections import MULTI_OBJECTIVE_SAMPLERS

if TYPE_CHECKING:
    from .study import StudySpec

__all__ = ["param_origin", "search_space", "space_or_all_conflicts", "validate_deep"]


def search_space(spec: StudySpec) -> SearchSpace:
    """Resolve the study's search space.

    Returns:
        The base (``search.parameters``, else ``search.space``, else the algorithm's
        default) with ``search.override`` applied.

    Raises:
        ConfigError: A space cannot be loaded or merged, or there is none for the algorithm.
    """
    s = spec.search
    if s.parameters is not None:
        base = merge(
            SearchSpace(f"{spec.name}-inline", ()), s.parameters, field="search.parameters"
        )
    elif s.space:
        base = combine([_load(spec, name, i) for i, name in enumerate(s.space)])
    else:
        found = default_space(spec.algorithm)
        if found is None:
            raise ConfigError(
                "search.space",
                f"no shipped space for algorithm {spec.algorithm!r} and its parts declare "
                "no search space; give search.space or search.parameters",
            )
        base = found
    return merge(base, s.override, field="search.override") if s.override else base


def _load(spec: StudySpec, name: str, index: int) -> SearchSpace:
    try:
        return load_space(name, spec._base_dir)
    except ConfigError as exc:
        if exc.source:  # an error inside the user's space file: keep file + field
            raise
        field = "search.space" if len(spec.search.space or ()) == 1 else f"search.space[{index}]"
        raise ConfigError(field, exc.reason) from None


def param_origin(spec: StudySpec, path: str) -> str:
    """Say where the spec defines a searched parameter (for error messages).

    Args:
        path: The parameter's resolved path, e.g. ``hparams.client_lr``.

    Returns:
        The spec key, e.g. ``search.override.client_lr``, else ``search.space``.
    """
    for key in spec.search.override:
        if resolve_path(key) == path:
            return f"search.override.{key}"
    for key in spec.search.parameters or {}:
        if resolve_path(key) == path:
            return f"search.parameters.{key}"
    return "search.space"


# ------------------------------------------------------------ deep validation


def validate_deep(spec: StudySpec) -> None:
    """Check the spec against the registries, the algorithm's recipe and the search space.

    The base trial configuration must parse and suit the recipe; every searched
    hyperparameter must be one the recipe accepts, inside its declared bounds, not also
    fixed, and every bound or choice must give a valid trial configuration; the sampler
    must suit the objective (CMA-ES: one objective) and the space (grid search: a grid for
    every parameter); round counts must fit ``train.rounds``.

    Raises:
        ConfigError: The first problem (or all conflicts of the space), named by its
            dotted path.
    """
    _check_registered(spec)
    parsed = spec.base_config
    recipe = get_recipe(spec.algorithm)
    _check_recipe(recipe, parsed)
    space = space_or_all_conflicts(spec)
    for p in space.enabled:
        _check_searched(spec, p, recipe)
    _check_values(spec, space, recipe)
    _check_sampler(spec, space)
    rounds = spec.train.rounds
    for field, value in (
        ("objective.last_rounds", spec.objective.last_rounds),
        ("report_every", spec.report_every),
        (
            "scheduler.grace_rounds",
            spec.scheduler.grace_rounds
            if spec.scheduler_name in (SchedulerName.ASHA, SchedulerName.MEDIAN)
            else 1,
        ),
    ):
        if value > rounds:
            raise ConfigError(field, f"{value} exceeds train.rounds = {rounds}")
    _check_pack(spec, parsed)


def _check_pack(spec: StudySpec, parsed: TrialConfig) -> None:
    """An integer ``resources.pack`` must fit ``budget.max_concurrent`` (which counts
    configurations) and an algorithm that packs; ``auto`` falls back by itspec."""
    pack = spec.resources.pack
    if pack == "auto" or pack == 1:
        return
    concurrent = spec.budget.max_concurrent
    if pack > concurrent:
        raise ConfigError(
            "resources.pack",
            f"{pack} configurations per process but budget.max_concurrent = {concurrent} "
            f"(it counts configurations): raise max_concurrent to at least {pack}, or use "
            "pack: auto",
        )
    from fedtune.trainers.packed import pack_refusal

    why = pack_refusal(parsed)
    if why is not None:
        raise ConfigError("resources.pack", f"{why}; use pack: 1 or pack: auto")


def _check_registered(spec: StudySpec) -> None:
    """The task, model and algorithm the study names exist (before Ray starts: an unknown
    model used to fail every trial in turn); with user code, a missing one is a
    ``CodeError`` that says what the code's modules did register."""
    from fedtune.trainers.algorithms.registry import REGISTRY as ALGORITHMS
    from fedtune.trainers.models.registry import REGISTRY as MODELS
    from fedtune.trainers.tasks.registry import REGISTRY as TASKS

    params = spec.task.params
    models = [("task.model", params["model"])] if "model" in params else []
    for key, entry in (spec.search.override or {}).items():  # a searched model
        if resolve_path(key) == "task.model" and entry and entry.choices:
            models += [(f"search.override.{key}.choices", m) for m in entry.choices]
    for field, registry, name in (
        ("task.name", TASKS, spec.task.name),
        ("algorithm", ALGORITHMS, spec.algorithm),
        *((f, MODELS, m) for f, m in models),
    ):
        if not isinstance(name, str):
            continue  # parse_trial_config names the problem
        try:
            registry.get(name)
        except ConfigError as exc:
            if spec.code is None:
                raise
            report = spec.load_code()
            kind = registry.kind
            found = getattr(report, f"{kind}s")
            mods = ", ".join(report.modules)
            files = ", ".join(f for f in report.files.values() if f)
            raise CodeError(
                field,
                f"{kind} {name!r} is not registered: the study's code ({mods}) registered "
                f"{', '.join(found) or 'no ' + kind + 's'}; {exc.reason}",
                files or None,
            ) from None
    from fedtune.trainers.tasks.registry import check_task_params

    check_task_params(spec.task.name, params)  # declared parameters: unknown, out of range


def space_or_all_conflicts(spec: StudySpec) -> SearchSpace:
    """The space; a narrowed space's conflicts — with its own ranges, defaults and grids,
    and with values the base configuration fixes — are reported all at once."""
    fixed = []
    for key in spec.search.override:
        path = resolve_path(key) if isinstance(key, str) else None
        if path is None or spec.search.override[key] is None:
            continue
        section, name = path.split(".", 1)
        if name in spec.given(section):
            fixed.append(
                ConfigError(
                    f"{section}.{name}",
                    f"is also searched (search.override.{key}); set it in "
                    "one place (remove it here, or from the search with null)",
                )
            )
    try:
        space = spec.search_space()
    except ConfigError as exc:
        raise combine_errors([exc, *fixed], "search.override" if fixed else None) from None
    if fixed:
        raise combine_errors(fixed)
    return space


def _check_searched(spec: StudySpec, p: Parameter, recipe: Recipe) -> None:
    origin = spec.param_origin(p.path)
    section, key = p.path.split(".", 1)
    if section == "hparams" and key not in recipe.params:
        accepted = ", ".join(recipe.params) or "none"
        raise ConfigError(
            origin,
            f"algorithm {recipe.name!r} has no hyperparameter {key!r}"
            f"{did_you_mean(key, recipe.params)} (it accepts: {accepted})",
        )
    if section == "hparams" and (problem := declaration_problem(p, recipe.declared[key])):
        raise ConfigError(origin, problem)
    if p.path == "train.local_steps" and recipe.fixed_local_steps is not None:
        raise ConfigError(origin, f"algorithm {recipe.name!r} fixes local_steps")
    if p.path == "train.local_epochs" and (why := local_epochs_refusal(recipe)):
        raise ConfigError(origin, f"algorithm {recipe.name!r} needs a fixed local_steps: {why}")
    if key in spec.given(section):
        raise ConfigError(
            f"{section}.{key}",
            f"is also searched ({origin}); set it in one "
            "place (remove it here, or from the search with null)",
        )
    if section == "decay" and not spec.decay.enabled:
        raise ConfigError(origin, f"searches {p.path} but decay.enabled is not true")


def _check_values(spec: StudySpec, space: SearchSpace, recipe: Recipe) -> None:
    """Every bound and choice, with the other parameters at their defaults, must be valid.

    Bounds and the first choice are checked on a whole trial configuration; every other
    choice gets the cheap check of :func:`check_choice` (the field's declared type and range,
    then the recipe), so validation does not rebuild a configuration per choice. A choice
    that other parameters tie to or are conditioned on changes them too: such a parameter's
    choices are all checked on whole configurations (their number is bounded by the
    service's ``FEDTUNE_MAX_CHOICES``).
    """
    paths = set(space.paths)
    for p in space.enabled:
        if p.tied:
            continue
        values = p.choices if p.type == ParamType.CATEGORICAL else (p.low, p.high)
        cheap = (
            p.type == ParamType.CATEGORICAL
            and can_check_cheaply(p.path)
            and not _drives_others(space, p)
        )
        base = None
        for i, v in enumerate(values):
            try:
                if cheap and i > 0:
                    _check_recipe(recipe, check_choice(base, p.path, v))
                else:
                    point = resolve_values(space, {p.path: v})
                    base = spec.trial(point)
                    _check_recipe(recipe, base)
            except ConfigError as exc:
                field = spec.param_origin(exc.field) if exc.field in paths else exc.field
                raise ConfigError(field, f"with {p.name} = {v!r}: {exc.reason}") from None


def _check_sampler(spec: StudySpec, space: SearchSpace) -> None:
    name = spec.sampler_name
    if spec.objective.is_multi and name not in MULTI_OBJECTIVE_SAMPLERS:
        allowed = ", ".join(sorted(MULTI_OBJECTIVE_SAMPLERS))
        raise ConfigError(
            "sampler.name",
            f"{name} optimises a single objective; with objective.metrics use one of {allowed}",
        )
    if name != SamplerName.GRID:
        return
    for p in space.enabled:
        if not p.tied and p.grid_values() is None:
            raise ConfigError(
                f"{spec.param_origin(p.path)}.grid",
                f"the grid sampler needs a grid for {p.name}: give `grid: half-decade`, "
                "`grid: decade` or a list of values",
            )


def _drives_others(space: SearchSpace, p: Parameter) -> bool:
    """Whether another parameter is tied to ``p`` or conditioned on it."""
    return any(q.path != p.path and p.path in q.depends_on for q in space.parameters)


def _check_recipe(recipe: Recipe, parsed: TrialConfig) -> None:
    effective_hparams(recipe, parsed)
    local_steps_of(recipe, parsed)
